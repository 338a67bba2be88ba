"""Consent to run code that a model names: no code runs that the user did not name.

A checkpoint may name code of its own: a PE plugin's file, found where the checkpoint says. Opening
it would run that code, so bamctl does so only with the user's consent, asked the same way
everywhere: ``--trust-remote-code`` on the command line, ``trust_remote_code=True`` in the API,
``trust_remote_code=True`` in lm-eval's ``model_args`` (transformers' name for the same decision
about an ``hf:`` folder's ``auto_map`` code). Without it the run stops in one line naming the file
and the flag, before anything of it is imported.

Code the user names themselves (``--pe my_pe.py:Class``, ``py:model.py:build``) needs no flag:
naming it is the consent. A consent is remembered by the digest of each file it covers, never by
folder or name, in ``BAMCTL_TRUSTED_CODE`` (default ``~/.config/bamctl/trusted-code.json``): a
checkpoint one trained oneself, or opened once with the flag, opens again without it, and a file
changed since asks again. Saving a checkpoint remembers its code, which the process just ran.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from bamctl.errors import BamctlError
from bamctl.files import atomic_write
from bamctl.local_code import LocalCode

TRUST_FILE_ENV = "BAMCTL_TRUSTED_CODE"
FLAG = "--trust-remote-code"
HOW = f"{FLAG} (API: trust_remote_code=True; lm-eval: model_args trust_remote_code=True)"

_ASKED: ContextVar[bool] = ContextVar("bamctl_trust_remote_code", default=False)
_NAMED: set[str] = set()  # file digests of code the user named in this process


def trust_file() -> Path:
    given = os.environ.get(TRUST_FILE_ENV)
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join("~", ".config")
    return Path(config).expanduser() / "bamctl" / "trusted-code.json"


@contextmanager
def trusting(asked: bool):
    """Within it, code a model names runs where ``asked`` (the flag) says so."""
    token = _ASKED.set(bool(asked) or _ASKED.get())
    try:
        yield
    finally:
        _ASKED.reset(token)


def named(code: LocalCode) -> None:
    """The user named this code: it may run in this process, and a checkpoint of it may load."""
    _NAMED.update(code.files.values())


def remembered() -> dict[str, str]:
    """File digest -> the path it was first consented at (for people reading the file)."""
    path = trust_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as err:
        raise BamctlError(f"{path} (remembered consents to run code) cannot be read: {err}; fix or delete it") from None
    files = data.get("files") if isinstance(data, dict) else None
    return dict(files) if isinstance(files, dict) else {}


def remember(code: LocalCode) -> None:
    """Remember consent to each of ``code``'s files by digest."""
    known = remembered()
    new = {file_digest: str(path) for path, file_digest in code.located() if file_digest not in known}
    if not new:
        return
    path = trust_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"files": {**known, **new}}, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def require(code: LocalCode, who: str) -> None:
    """Let ``code`` run when the user named it, consented to these bytes before, or asks now;
    else stop in one line naming the file and the flag."""
    digests = set(code.files.values())
    if digests <= _NAMED or digests <= _NAMED | set(remembered()):
        return
    if _ASKED.get():
        remember(code)
        return
    raise BamctlError(f"{who} is code in {code.root / code.named.name}"
                      f"{'' if len(code.files) == 1 else f' (with {len(code.files) - 1} file(s) it imports)'} that this "
                      f"model names, not you; bamctl runs it only if you trust it: add {HOW}")


def require_asked(who: str, what: str) -> None:
    """Let a model run a function of an installed module it names (no file of its own, so no digest
    to check or remember) only when the user asks now; else stop in one line naming it and the flag."""
    if not _ASKED.get():
        raise BamctlError(f"{who} calls {what}, an installed module's function that this model names, not you; "
                          f"bamctl calls it only if you trust it: add {HOW}")
