"""docs/testing.md's table of mutation scores against what the repository configures: one row per
module mutmut mutates, each row's counts adding up to its mutants and to its score, and its
equivalent mutants those written down with a reason in scripts/mutation_equivalent.toml."""

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `(bamctl/[^`]+\.py)` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| \**(\d+\.\d)%")


def _rows() -> dict[str, tuple[int, ...]]:
    rows: dict[str, tuple[int, ...]] = {}
    for line in (REPO / "docs" / "testing.md").read_text().splitlines():
        if match := ROW.match(line):
            path, *counts, score = match.groups()
            assert path not in rows, f"two rows for {path}"
            rows[path] = (*map(int, counts), round(float(score) * 10))
    return rows


def test_the_table_has_one_row_per_mutated_module():
    configured = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    assert sorted(_rows()) == sorted(configured)


def test_each_rows_counts_add_up_to_its_mutants_and_its_score():
    for path, (mutants, killed, survived, equivalent, not_run, permille) in _rows().items():
        assert killed + survived + equivalent + not_run == mutants, path
        assert round(1000 * killed / (killed + survived)) == permille, path


def test_each_rows_equivalents_are_those_written_down_with_a_reason():
    """A mutant listed as equivalent that a run kills is counted killed (scripts/mutation_tally.py):
    the list would then be wrong about it, and the row's two counts would part."""
    written = tomllib.loads((REPO / "scripts" / "mutation_equivalent.toml").read_text())
    assert all(entry["reason"].strip() for entry in written.values())
    for path, (_, _, _, equivalent, _, _) in _rows().items():
        module = path.removesuffix(".py").replace("/", ".") + "."
        assert sum(name.startswith(module) for name in written) == equivalent, path
