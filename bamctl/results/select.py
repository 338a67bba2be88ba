"""Choosing rows the way a user asks: by task, model, protocol and a pandas query."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from bamctl.errors import BamctlError, did_you_mean

MIN_HASH_PREFIX = 6  # shorter strings are names, never hash prefixes ("a" must not match half the hashes)


def select_rows(
    frame: pd.DataFrame,
    *,
    task: str | Iterable[str] | None = None,
    model: str | Iterable[str] | None = None,
    protocol: str | Iterable[str] | None = None,
    where: str | None = None,
    strict: bool = False,
) -> pd.DataFrame:
    """Rows matching every filter given. A model matches by name or by a prefix (6+ characters) of its hash.

    With `strict`, a name that is in no row is a BamctlError listing close matches (on the
    command line a typo should not look like an empty result). `where` is a `DataFrame.query` string, e.g. "length >= 4096 and
    depth < 0.5", and a bad one is a BamctlError too.
    """
    for column, wanted in (("task", task), ("protocol", protocol)):
        if wanted is not None:
            names = _as_list(wanted)
            if strict:
                _check_known(column, names, frame[column].unique())
            frame = frame[frame[column].isin(names)]
    if model is not None:
        names = _as_list(model)
        mask = pd.Series(False, index=frame.index)
        for name in names:
            hit = frame["model"] == name
            if len(name) >= MIN_HASH_PREFIX:
                hit |= frame["model_hash"].str.startswith(name)
            if strict and not hit.any():
                _check_known("model", [name], frame["model"].unique())
            mask |= hit
        frame = frame[mask]
    if where:
        frame = _query(frame, where)
    return frame.reset_index(drop=True)


def _query(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    try:
        mask = frame.eval(where)
    except (SyntaxError, NameError, KeyError, ValueError, TypeError, AttributeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BamctlError(
            f"bad --where expression {where!r}: {reason[:160]} (a pandas query over the columns in docs/SCHEMA.md)"
        ) from err
    if not (isinstance(mask, pd.Series) and pd.api.types.is_bool_dtype(mask.dtype)):
        raise BamctlError(f"bad --where expression {where!r}: it must be a condition on rows, e.g. \"length >= 4096\"")
    return frame[mask.fillna(False).astype(bool)]


def _as_list(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _check_known(column: str, names: list[str], known: Iterable[str]) -> None:
    known = sorted(str(k) for k in known)
    for name in names:
        if name not in known:
            hint = did_you_mean(name, known) if known else "; none stored"
            raise BamctlError(f"no results for {column} {name!r}{hint}")
