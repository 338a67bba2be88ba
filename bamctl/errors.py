"""Errors a user can cause and fix: the CLI prints them as one line and exits 2."""


class BamctlError(Exception):
    """Bad input or a broken file; the message is meant for the user, as is."""


def did_you_mean(name: str, known, cutoff: float = 0.6) -> str:
    """The tail of an 'unknown X' message: close matches of ``name``, else every known name."""
    import difflib

    known = [str(k) for k in known]
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=cutoff)
    return f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
