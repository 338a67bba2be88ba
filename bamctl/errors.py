"""Errors a user can cause and fix: the CLI prints them as one line and exits 2."""


class BamctlError(Exception):
    """Bad input or a broken file; the message is meant for the user, as is."""


def did_you_mean(name: str, known, cutoff: float = 0.6) -> str:
    """The tail of an 'unknown X' message: close matches of ``name``, else every known name."""
    import difflib

    known = [str(k) for k in known]
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=cutoff)
    return f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"


def flags_as_keywords(text: str, renamed: dict[str, str] | None = None) -> str:
    """A command-line line in keyword words: ``--chunk-size`` -> ``chunk_size``, or what ``renamed``
    names a flag (``{"--seed": "seeds"}``), for the Python API and lm-eval's ``model_args``."""
    import re

    renamed = renamed or {}
    return re.sub(r"(?<![\w-])--[a-z][a-z-]*", lambda m: renamed.get(m.group(0), m.group(0)[2:].replace("-", "_")), text)
