"""Code a user names by where it lives: ``FILE.py:NAME``, ``package.module:NAME``, or an installed
package's entry point. ``py:`` models (``bamctl.backends.module``) and positional-encoding plugins
(``bamctl.positional``) are found here.

A file is imported as a module of its own, named by its path and bytes, so an edited file is
imported afresh and two files of one name never meet in ``sys.modules``. What is found carries
where it was found and the digest of the file that defines it: what it computes is part of the
identity of whatever it produced.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bamctl.errors import BamctlError, did_you_mean
from bamctl.fingerprints import digest, file_digest


@dataclass(frozen=True)
class Found:
    """An object found by reference, with where it came from."""

    value: Any
    where: str  # how to find it again: "/abs/path/my_pe.py:Sandwich", "my_pkg.pe:Sandwich"
    source: Path | None  # the file that defines it (None: not a Python file)

    @property
    def source_text(self) -> str | None:
        return None if self.source is None else self.source.read_text()


def file_digest_or_none(path: Path | None) -> str | None:
    return None if path is None else file_digest(path)


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def import_file(path: Path, who: str):
    """``path`` imported as a module of its own (``who`` names it in errors)."""
    name = f"bamctl_user_{digest([str(path), file_digest(path)])}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)  # its own imports of files beside it
    try:
        spec.loader.exec_module(module)
    except BaseException as err:
        del sys.modules[name]
        if isinstance(err, KeyboardInterrupt):
            raise
        raise BamctlError(f"{who}: importing {path.name} raised {one_line(err)}") from None
    finally:
        sys.path.remove(folder)
    return module


def source_of(target: str, who: str) -> Path | None:
    """The file a target names (a module's is found without importing it)."""
    if is_file_target(target):
        path = Path(target).expanduser()
        if not path.is_file():
            raise BamctlError(f"{who}: file {target} does not exist")
        return path.resolve()
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as err:
        raise BamctlError(f"{who}: cannot find module {target}: {err}") from None
    if spec is None:
        raise BamctlError(f"{who}: no module named {target} (a file path ends in .py)")
    return Path(spec.origin).resolve() if spec.origin and spec.origin.endswith(".py") else None


def load(target: str, name: str, who: str) -> Found:
    """``name`` from ``target``, a ``.py`` file or an importable module."""
    source = source_of(target, who)
    if is_file_target(target):
        namespace = import_file(source, who)
        where = f"{source}:{name}"
    else:
        try:
            namespace = importlib.import_module(target)
        except Exception as err:
            raise BamctlError(f"{who}: importing {target} raised {one_line(err)}") from None
        where = f"{target}:{name}"
    value = getattr(namespace, name, None)
    if value is None:
        names = [n for n in vars(namespace) if not n.startswith("_")]
        raise BamctlError(f"{who}: {target} defines no {name!r}{did_you_mean(name, names)}")
    defined_in = _defining_file(value) or source
    return Found(value, where, defined_in)


def _defining_file(value) -> Path | None:
    try:
        path = inspect.getsourcefile(value)
    except TypeError:
        return None
    return Path(path).resolve() if path and Path(path).is_file() else None


def entry_points(group: str) -> dict:
    """The installed entry points of ``group``, by name."""
    from importlib.metadata import entry_points as installed

    return {point.name: point for point in installed(group=group)}


def load_entry_point(group: str, name: str, who: str) -> Found:
    point = entry_points(group)[name]
    try:
        value = point.load()
    except Exception as err:
        dist = getattr(point, "dist", None)
        package = f" (package {dist.name} {dist.version})" if dist is not None else ""
        raise BamctlError(f"{who}: entry point {name} = {point.value}{package} raised {one_line(err)} on import") from None
    return Found(value, point.value, _defining_file(value))
