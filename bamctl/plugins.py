"""Code a user names by where it lives: ``FILE.py:NAME``, ``package.module:NAME``, or an installed
package's entry point. ``py:`` models (``bamctl.backends.module``) and positional-encoding plugins
(``bamctl.positional``) are found here.

A file is imported as a module of its own, named by its content (``bamctl.local_code``: the file
and every module it imports from its own folder), so an edited file or helper is imported afresh.
Each file is imported in a namespace of its own: the modules it imports from its folder
(``helper``, ``layers``) are its own, so two files that each import a sibling ``helper.py`` each
run their own helper in one process. What is found carries where it was found and the content of
the code that defines it: what it computes is part of the identity of whatever it produced.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bamctl.errors import BamctlError, did_you_mean
from bamctl.fingerprints import digest, file_digest
from bamctl.local_code import LocalCode, is_installed, local_code


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


USER_CODE_FAILS = (Exception, SystemExit)  # what code a user brought may raise that is its failure, not a Ctrl-C


@dataclass
class UserNamespace:
    """The modules one file imported from its own folder, kept out of ``sys.modules`` between uses."""

    code: LocalCode
    modules: dict = field(default_factory=dict)

    @contextmanager
    def active(self):
        """Its folder first on ``sys.path`` and its own sibling modules in ``sys.modules`` (another
        file's of the same names hidden meanwhile); afterwards, what it imported from its folder is
        taken back out, so the next file's ``import helper`` finds its own."""
        tops = {name.split(".")[0] for name in self.code.modules}
        before = set(sys.modules)
        hidden = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] in tops}
        sys.modules.update(self.modules)
        folder = str(self.code.root)
        sys.path.insert(0, folder)
        try:
            yield
        finally:
            sys.path.remove(folder)
            for name in list(sys.modules):
                if name.split(".")[0] in tops or (name not in before and _file_under(sys.modules[name], self.code.root)):
                    self.modules[name] = sys.modules.pop(name)
            sys.modules.update(hidden)


def _file_under(module, folder: Path) -> bool:
    origin = getattr(module, "__file__", None)
    return bool(origin) and not module.__name__.startswith("bamctl") and folder in Path(origin).resolve().parents


_NAMESPACES: dict[str, UserNamespace] = {}  # module name (bamctl_user_<digest>) -> its namespace


def import_file(path: Path, who: str):
    """``path`` imported as a module of its own (``who`` names it in errors), in its own namespace."""
    code = local_code(path)
    name = f"bamctl_user_{digest([code.digest, sorted(code.files)])}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    namespace = UserNamespace(code)
    sys.modules[name] = module
    try:
        with namespace.active():
            spec.loader.exec_module(module)
    except BaseException as err:
        del sys.modules[name]
        if isinstance(err, KeyboardInterrupt):
            raise
        raise BamctlError(f"{who}: importing {path.name} raised {one_line(err)}") from None
    _NAMESPACES[name] = namespace
    return module


@contextmanager
def running(value):
    """Around a call into code found here (a ``py:`` builder): the namespace of the file that
    defines it, so an import the call makes finds that file's siblings."""
    namespace = _NAMESPACES.get(getattr(value, "__module__", None) or "")
    if namespace is None:
        yield
        return
    with namespace.active():
        yield


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


def locate_module(target: str) -> Path | None:
    """The file of module ``target`` (``package.module``), found on ``sys.path`` without importing
    anything: ``importlib.util.find_spec`` would run the parent packages' ``__init__`` first."""
    from importlib.machinery import PathFinder

    search, spec = None, None
    for part in target.split("."):
        spec = PathFinder.find_spec(part, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and origin.endswith(".py") else None


def local_code_of(target: str) -> LocalCode | None:
    """The user's own code a target names (a ``.py`` file, or a module found on the path, as an
    editable install's or a PYTHONPATH package's), with the helpers it imports; None for code of the
    standard library or an installed distribution, or a target that names no file."""
    file = Path(target).expanduser().resolve() if is_file_target(target) else locate_module(target)
    return None if file is None or not file.is_file() or is_installed(file) else local_code(file)


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
