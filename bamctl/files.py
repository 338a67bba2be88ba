"""Writing a file so that readers see the old one or the new one, never half of it."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Callable

from bamctl.errors import BamctlError


def atomic_write(target: Path, write: Callable[[str], object], mode: int = 0o644, *, make_parents: bool = False) -> None:
    """Call ``write(temp_path)`` on a temporary file beside ``target``, then rename it over
    ``target`` (atomic on POSIX). A failure or interruption leaves ``target`` as it was
    and removes the temporary file. A place that cannot be written (no such folder, no
    permission, a full disk) is one BamctlError naming ``target``; ``make_parents`` creates
    its folders first."""
    target = Path(target)
    try:
        if make_parents:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as err:
        raise cannot_write(target, err) from err
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # mkstemp makes 0600; checkpoints and outputs are meant to be shared
        os.replace(tmp, target)
    except OSError as err:
        if err.filename not in (None, tmp, str(target)):
            raise  # another file's error, raised inside write(): not ours to rename
        raise cannot_write(target, err) from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cannot_write(target: Path, err: OSError, what: str = "") -> BamctlError:
    """The one line for a file that cannot be written (``what``: "plot to " names its kind)."""
    return BamctlError(f"cannot write {what}{target}: {err.strerror or err}")


def check_writable(target: Path, what: str = "") -> None:
    """Refuse now a file that a command would only come to write after its work (a plot after
    a sweep): its nearest existing folder must take a file. Probed by creating and removing
    one there, since permission bits do not tell (root, read-only mounts, /proc); nothing is
    left behind and no folder is made."""
    target = Path(target)
    try:
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        folder = target.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{folder} is not a folder")
        with tempfile.TemporaryFile(dir=folder, prefix=f".{target.name}."):
            pass
    except OSError as err:
        raise cannot_write(target, err, what) from err
