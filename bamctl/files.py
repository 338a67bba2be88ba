"""Writing a file so that readers see the old one or the new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(target: Path, write: Callable[[str], object], mode: int = 0o644) -> None:
    """Call ``write(temp_path)`` on a temporary file beside ``target``, then rename it over
    ``target`` (atomic on POSIX). A failure or interruption leaves ``target`` as it was
    and removes the temporary file."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # mkstemp makes 0600; checkpoints and outputs are meant to be shared
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
