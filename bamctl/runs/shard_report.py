"""What a shard of ``bamctl submit`` hands ``submit`` for the sweep's one table, instead of printing its own.

A shard covers the keys of the whole sweep (every shard plans all of them) and knows each
model's identity only once it has loaded it; ``submit`` merges what its shards wrote and
prints the table from the stored rows, on the machine it runs on, without loading a model.
"""

from __future__ import annotations


def to_json(covered: set, names_by_identity: dict[tuple, list[str]], versions: set) -> dict:
    return {
        "covered": sorted(list(key) for key in covered),
        "names_by_identity": [[list(identity), names] for identity, names in names_by_identity.items()],
        "versions": sorted(versions),
    }


def merged(reports: list[dict]) -> tuple[set, dict[tuple, list[str]], set]:
    """The union of the shards' reports: covered keys, model identities with their names, compute versions."""
    covered, names_by_identity, versions = set(), {}, set()
    for report in reports:
        covered |= {tuple(key) for key in report["covered"]}
        for identity, names in report["names_by_identity"]:
            names_by_identity.setdefault(tuple(identity), names)
        versions |= set(report["versions"])
    return covered, names_by_identity, versions
