"""The command line's option groups as the library's request groups.

``SAMPLES`` and ``PROMPT`` (``bamctl.cli.options``) carry the fields of
``bamctl.runs.requests.Sampling`` and ``PromptChoices``; ``generate`` and every run command
turn them into one ``AskedRequests`` here, so ``generate`` writes what a run feeds and a
command line asks what the same ``bamctl.evaluate`` call asks.
"""

from __future__ import annotations

from dataclasses import fields


def asked_requests(names: list[str], samples, prompt):
    """``AskedRequests`` for the tasks ``names`` from a command's option groups (checked when made)."""
    from bamctl.runs.requests import AskedRequests, PromptChoices, Sampling

    return AskedRequests(names, _as(Sampling, samples), _as(PromptChoices, prompt))


def _as(kind: type, group):
    return kind(**{f.name: getattr(group, f.name) for f in fields(kind)})
