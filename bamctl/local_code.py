"""A user's own code as content: a file, and every module it imports from its own tree.

A ``py:`` model or a PE plugin computes with the file it is named by and with whatever that file
imports beside it (a ``helper.py``, a ``layers/`` package). Its identity is the bytes of every one
of those files, each named by its path relative to the named file's folder, so that a copy of the
tree elsewhere is the same code and an edited helper is other code. Imports that resolve outside
the tree (the standard library, installed packages) are not the user's code: they are listed as
the distributions they come from, whose versions the compute version records.

The imports are read from the syntax tree, not by importing: what a file would run is known, and
its digest checked, before any of it runs. Every ``import`` statement counts, lazy and conditional
ones too (a few files more than one run needs is the safe side). A module named by a string at run
time (``importlib.import_module(name)``) is not seen.
"""

from __future__ import annotations

import ast
import site
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bamctl.fingerprints import digest, file_digest

NAMED = ""  # the key of the named file itself: its own name is not part of what it computes


@dataclass(frozen=True)
class LocalCode:
    """A file's local import closure: ``files`` maps each file's path relative to ``root`` (the
    named file under ``NAMED``) to its digest; ``modules`` are the module names the files are
    imported under (``helper``, ``layers.attention``); ``libraries`` the distributions imported
    from outside the tree."""

    root: Path
    named: Path
    files: dict[str, str]
    modules: tuple[str, ...]
    libraries: tuple[str, ...]

    @property
    def digest(self) -> str:
        """What the code computes: the named file's digest alone when it imports nothing of the tree
        (so a one-file plugin keeps the identity it had before helpers counted), else every file's."""
        if set(self.files) == {NAMED}:
            return self.files[NAMED]
        return digest(self.files)

    def located(self) -> list[tuple[Path, str]]:
        """(where the file is, its digest) for each file."""
        return [(self.named if key == NAMED else self.root / key, self.files[key]) for key in sorted(self.files)]

    def paths(self) -> list[Path]:
        return [path for path, _ in self.located()]

    def describe(self) -> str:
        """The files, for a message: ``model.py`` or ``model.py (and helper.py, layers/__init__.py)``."""
        others = sorted(key for key in self.files if key != NAMED)
        return self.named.name + (f" (and {', '.join(others)})" if others else "")


def local_code(path: Path) -> LocalCode:
    """The closure of ``path``: the files its imports reach in its own folder, transitively."""
    named = Path(path).resolve()
    root = named.parent
    files = {NAMED: file_digest(named)}
    modules: set[str] = set()
    libraries: set[str] = set()
    todo = [named]
    seen = {named}
    while todo:
        current = todo.pop()
        for name, level in _imports(current):
            found = _resolve(name, level, current, root)
            if found is None:
                if level == 0:
                    library = _distribution(name.split(".")[0])
                    if library:
                        libraries.add(library)
                continue
            module, reached = found
            modules.add(module)
            for file in reached:
                if file not in seen:
                    seen.add(file)
                    todo.append(file)
                    files[file.relative_to(root).as_posix()] = file_digest(file)
    return LocalCode(root, named, files, tuple(sorted(modules)), tuple(sorted(libraries)))


def code_of_files(paths) -> dict[str, str]:
    """Several defining files (a module's classes, its step function) with their local closures, as
    one mapping from path to digest: paths relative to the folder all of them share, so a copy of the
    tree elsewhere gives the same mapping. Installed files (site-packages, the standard library) are
    left out: the versions of their distributions are recorded instead (``installed_libraries``)."""
    closures = [local_code(Path(p)) for p in paths if not is_installed(Path(p))]
    every = {file for closure in closures for file in closure.paths()}
    if not every:
        return {}
    base = _common_folder(every)
    return {file.relative_to(base).as_posix(): file_digest(file) for file in sorted(every)}


def installed_libraries(paths) -> tuple[str, ...]:
    """The distributions that the defining files import from outside their trees, and those that
    installed defining files belong to."""
    found: set[str] = set()
    for path in map(Path, paths):
        if is_installed(path):
            library = _distribution_of_file(path)
            if library:
                found.add(library)
        else:
            found.update(local_code(path).libraries)
    return tuple(sorted(found))


def is_installed(path: Path) -> bool:
    """A file of the standard library or of an installed (non-editable) distribution."""
    resolved = Path(path).resolve()
    return any(folder in resolved.parents for folder in _installed_folders())


@lru_cache(maxsize=1)
def _installed_folders() -> tuple[Path, ...]:
    folders = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if sysconfig.get_paths().get(key):
            folders.add(Path(sysconfig.get_paths()[key]).resolve())
    for folder in [*getattr(site, "getsitepackages", lambda: [])(), site.getusersitepackages()]:
        folders.add(Path(folder).resolve())
    return tuple(folders)


def _common_folder(paths) -> Path:
    parts = [p.parent.parts for p in paths]
    common = []
    for items in zip(*parts):
        if len(set(items)) != 1:
            break
        common.append(items[0])
    return Path(*common)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(dotted name, relative level) of every import statement in ``path``; ``from a import b``
    gives both ``a.b`` (b may be a module) and ``a``."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return []  # importing it will say what is wrong, in one line
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found += [(f"{base}.{alias.name}" if base else alias.name, node.level) for alias in node.names if alias.name != "*"]
            if base:
                found.append((base, node.level))
    return found


def _resolve(name: str, level: int, importer: Path, root: Path) -> tuple[str, list[Path]] | None:
    """The files importing ``name`` runs from the tree (its packages' ``__init__`` files and the
    module), and the module's dotted name; None where it is not in the tree."""
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        if root not in (base, *base.parents):
            return None
        prefix = base.relative_to(root).parts
    else:
        base, prefix = root, ()
    parts = [p for p in name.split(".") if p]
    files: list[Path] = []
    folder = base
    for index, part in enumerate(parts):
        package, module = folder / part / "__init__.py", folder / f"{part}.py"
        if package.is_file():
            files.append(package)
            folder = folder / part
        elif module.is_file() and index == len(parts) - 1:
            files.append(module)
        elif (folder / part).is_dir() and index < len(parts) - 1:
            folder = folder / part  # a namespace package: no __init__ to run
            continue
        else:
            break
    if not files:
        return None
    dotted = ".".join([*prefix, *parts[: len(files)]])
    return dotted, [f.resolve() for f in files]


@lru_cache(maxsize=None)
def _distribution(top_level: str) -> str | None:
    """The installed distribution that gives module ``top_level`` (None: the standard library, or
    nothing installed gives it)."""
    if top_level in sys.stdlib_module_names or top_level in sys.builtin_module_names:
        return None
    names = _packages().get(top_level)
    return sorted(names)[0] if names else None


@lru_cache(maxsize=1)
def _packages() -> dict:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _distribution_of_file(path: Path) -> str | None:
    resolved = Path(path).resolve()
    for folder in _installed_folders():
        if folder in resolved.parents:
            top = resolved.relative_to(folder).parts[0].removesuffix(".py")
            return _distribution(top)
    return None
