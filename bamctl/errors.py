"""Errors a user can cause and fix: the CLI prints them as one line and exits 2."""


class BamctlError(Exception):
    """Bad input or a broken file; the message is meant for the user, as is."""
