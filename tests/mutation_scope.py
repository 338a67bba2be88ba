"""Fixture scopes that hold under mutmut (scripts/mutation.sh, docs/testing.md).

mutmut counts a test as reaching a function only when that function runs inside the test. A fixture
shared by a module's tests runs in the first of them, and a result cached by bamctl is computed in
the first test that asks: every later test would be left out of the mutants it checks. Under mutmut
each test therefore builds its own fixtures (this scope) and starts with bamctl's caches empty
(tests/conftest.py).
"""

import json
import os
from pathlib import Path


def mutating() -> bool:
    """Whether mutmut runs this test. Read when asked, not at import: mutmut imports the tests once in
    a server process (its forkserver's warm-up collects them) and sets ``MUTANT_UNDER_TEST`` only in
    the child it forks for each mutant, which collects again and so asks again."""
    return "MUTANT_UNDER_TEST" in os.environ


def mutation_durations() -> dict[str, float]:
    """Seconds per test id from mutmut's first pass (``mutants/mutmut-stats.json``; mutmut runs the
    tests from ``mutants/``); empty before that pass or outside a run."""
    try:
        return json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return {}


def shared_unless_mutating(fixture_name, config) -> str:
    """The scope of a fixture that runs bamctl's code: one per module, but one per test under mutmut."""
    return "function" if mutating() else "module"


class Built(dict):
    """Values made on first use by ``make(key)``, then kept: a test builds only what it reads, which
    keeps a per-test fixture (under mutmut) from building every sample for every test."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        self[key] = value = self.make(key)
        return value
