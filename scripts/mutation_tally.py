"""The mutation run's tally per module, from what mutmut left in mutants/ (scripts/mutation.sh).

A survivor listed in scripts/mutation_equivalent.toml, with the reason it cannot change any output,
counts as equivalent, not as a survivor. The score is killed / (killed + survived): timeouts count
as killed (the mutant made a test loop), and so does a test process the mutant got killed
(SIGKILL, a segfault); mutants no selected test reaches count as survivors, and
modules whose mutants have not run say so.

    python scripts/mutation_tally.py            # the table docs/testing.md shows
    python scripts/mutation_tally.py --list     # and every survivor, by name, to kill or explain
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.toml"

# a failing test, an error, a timeout, or the test process killed (SIGKILL after the CPU time limit
# or on exhausted memory, or a segfault: mutmut says "segfault" for both signals)
KILLED = {1, 3, 36, -24, 24, 152, 255, 37, -9, -11}
SURVIVED = {0, 5, 33}  # every selected test passed, or none reaches the mutant


def modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return config["only_mutate"]


def equivalents() -> dict[str, str]:
    """Mutant name -> why it cannot change any output."""
    if not EQUIVALENT.is_file():
        return {}
    return {name: entry["reason"] for name, entry in tomllib.loads(EQUIVALENT.read_text()).items()}


def tally(path: str, equivalent: dict[str, str]) -> tuple[Counter, list[str]]:
    meta = MUTANTS / f"{path}.meta"
    counts: Counter = Counter()
    survivors: list[str] = []
    if not meta.is_file():
        return counts, survivors
    for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
        plain = name.replace("\u01c1", ".")
        if code is None:
            counts["not run"] += 1
        elif code in KILLED:
            counts["killed"] += 1
        elif plain in equivalent or name in equivalent:
            counts["equivalent"] += 1
        elif code in SURVIVED:
            counts["survived"] += 1
            survivors.append(name)
        else:
            counts["other"] += 1
            survivors.append(f"{name} (exit {code})")
    return counts, survivors


def main() -> None:
    listing = "--list" in sys.argv
    equivalent = equivalents()
    print("| module | mutants | killed | survived | equivalent | not run | score |")
    print("|---|---|---|---|---|---|---|")
    every: list[str] = []
    for path in modules():
        counts, survivors = tally(path, equivalent)
        every += survivors
        total = sum(counts.values())
        decided = counts["killed"] + counts["survived"] + counts["other"]
        if not total or counts["not run"] == total:
            score = "not measured"
        else:
            score = f"{100 * counts['killed'] / decided:.1f}%" if decided else "n/a"
            if counts["not run"]:
                score += " (partial)"
        print(f"| `{path}` | {total} | {counts['killed']} | {counts['survived'] + counts['other']} "
              f"| {counts['equivalent']} | {counts['not run']} | {score} |")
    if listing:
        print()
        print("\n".join(every))


if __name__ == "__main__":
    main()
