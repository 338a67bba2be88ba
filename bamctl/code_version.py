"""Compute versions: the fingerprint of the code and libraries that turn a request into a number.

A result row is reused only when the code that would compute it again is the code that did.
The code is found, not listed: starting from a back-end's module (and the module that reads
an answer's score), every bamctl module it imports, directly or through others, lazily inside
a function or at the top, is part of it, as is the C++ source beside a module that compiles
one (``csrc/``). A module added to the engine tomorrow is then covered without anyone
remembering to name it.

What moves a compute version, and what does not:

- Python is hashed as its syntax tree with docstrings removed: an edit to anything that runs
  moves it (an expression, a constant, a default, a new import); a comment, a docstring, a
  blank line or a reflowed statement does not;
- C++ is hashed without its comments and with white space collapsed;
- the installed versions of the libraries a back-end computes with (torch, and tiktoken and
  sentencepiece, which decode generations; transformers and tokenizers for ``hf:``; vLLM for
  ``vllm:``) are part of it;
- the modules in ``UNCOUNTED`` are left out: they cannot change a number.

The code is the code this process runs, not what is on disk when the version is asked for:
``record_imports`` (installed by ``import bamctl``) has every bamctl module compiled from the
bytes it reads, and keeps them; a version hashes those bytes. A module the version covers but
this process has not imported yet is read from disk then, and its import must find the same
bytes, else it stops with one line: a ``git pull`` or an edit beside a running sweep can no
longer label rows with a version that names other code. C++ sources are kept the same way
(``native_source``): the bytes a version hashes are the bytes the kernel is compiled from.

This module imports nothing of bamctl's but errors: every layer may use it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import re
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

LENGTH = 16  # hex digits kept, as for content fingerprints

# Modules that no number depends on: the package's version string (a release changes nothing
# that is computed by itself; ``bamctl.version`` holds it and the checkpoint code imports it),
# error messages and atomic file writes.
UNCOUNTED = frozenset({"bamctl", "bamctl.version", "bamctl.errors", "bamctl.files"})
NATIVE_SOURCES = "csrc"  # a module's folder holding C++ it compiles (bamctl/engine/csrc)


PACKAGE = "bamctl"
_RAN: dict[str, bytes] = {}  # module -> the source bytes this process compiled it from
_PROMISED: dict[str, bytes] = {}  # module -> the bytes a version hashed before the module was imported
_NATIVE: dict[Path, bytes] = {}  # C++ file -> its bytes when this process first read it (version or build)


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    """Compiles a bamctl module from the bytes it keeps (no bytecode cache: a .pyc could hold
    code of other bytes than the ones read, were the file edited in between)."""

    def get_code(self, fullname: str):
        source = self.get_data(self.path)
        promised = _PROMISED.get(fullname)
        if promised is not None and promised != source:
            from bamctl.errors import BamctlError

            raise BamctlError(f"{self.path} changed on disk after this process fingerprinted the code it runs "
                              f"(its compute version); run the command again")
        _RAN[fullname] = source
        return self.source_to_code(source, self.path)


class _RecordingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = _RecordingLoader(fullname, spec.origin)
        return spec


def record_imports() -> None:
    """From now on, every bamctl module is compiled from bytes this module keeps. The modules
    already imported (the package's own ``__init__`` and this one) are read now."""
    if any(isinstance(finder, _RecordingFinder) for finder in sys.meta_path):
        return
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if (name == PACKAGE or name.startswith(PACKAGE + ".")) and origin and origin.endswith(".py"):
            _RAN.setdefault(name, Path(origin).read_bytes())
    sys.meta_path.insert(0, _RecordingFinder())


def module_source(name: str) -> bytes:
    """The source of module ``name`` as this process runs it: the bytes it was compiled from, or,
    not yet imported, the file's bytes now, which its import must then find again."""
    if name in _RAN:
        return _RAN[name]
    if name in _PROMISED:  # hashed already: the bytes its import will be held to, whatever the file holds now
        return _PROMISED[name]
    data = _source_path(name).read_bytes()
    if name.startswith(PACKAGE + "."):
        _PROMISED.setdefault(name, data)
    return data


def compute_version(roots: Iterable[str], libraries: Iterable[str] = ()) -> str:
    """The compute version of the code reached from the modules ``roots`` and of the installed
    ``libraries`` (distribution names)."""
    modules = code_closure(tuple(sorted(set(roots))))
    parts = [[name, module_digest(name)] for name in modules]
    sources = sorted({source for name in modules for source in native_sources(name)})
    parts += [[source.relative_to(_package_root()).as_posix(), source_digest(str(source))] for source in sources]
    parts += [[name, installed_version(name)] for name in sorted(set(libraries))]
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:LENGTH]


@lru_cache(maxsize=None)
def code_closure(roots: tuple[str, ...]) -> tuple[str, ...]:
    """Every bamctl module ``roots`` import, directly or through each other, ``roots`` included,
    sorted; the ``UNCOUNTED`` ones left out. ``from bamctl.a.b import x`` reaches ``bamctl.a.b``;
    ``from bamctl.a import x`` reaches the package ``bamctl.a`` (its ``__init__``), whose own
    imports are then followed."""
    seen: set[str] = set()
    todo = [name for name in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(sorted(_bamctl_imports(name) - seen))
    return tuple(sorted(seen - UNCOUNTED))


def _source_path(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise ValueError(f"no Python source for module {name!r}")
    return Path(spec.origin)


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is not a package
        return False


@lru_cache(maxsize=None)
def _bamctl_imports(name: str) -> frozenset[str]:
    """The bamctl modules that module ``name`` imports, as written (every statement, lazy ones too)."""
    path = _source_path(name)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(module_source(name).decode("utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            candidates = [f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base for alias in node.names]
        else:
            continue
        for candidate in candidates:
            if candidate.split(".")[0] != "bamctl":
                continue
            while candidate and not _is_module(candidate):  # `import bamctl.a.b as c` names a module; a name in one does not
                candidate = candidate.rpartition(".")[0]
            if candidate:
                found.add(candidate)
    found.discard(name)
    return frozenset(found)


@lru_cache(maxsize=None)
def module_digest(name: str) -> str:
    """The fingerprint of a module's syntax tree without docstrings (comments are not in the tree)."""
    tree = ast.parse(module_source(name).decode("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and _has_docstring(node):
            node.body = node.body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree, include_attributes=False).encode()).hexdigest()[:LENGTH]


def _has_docstring(node) -> bool:
    first = node.body[0] if node.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def native_sources(name: str) -> list[Path]:
    """The C++ files a module compiles: those in a ``csrc`` folder beside it."""
    folder = _source_path(name).parent / NATIVE_SOURCES
    return sorted(folder.glob("*.cpp")) + sorted(folder.glob("*.h")) if folder.is_dir() else []


def native_source(path: Path) -> bytes:
    """The bytes of C++ file ``path`` as this process computes with them: read once, kept, so
    the compute version and the kernel built from the file see the same source whatever
    happens to the file in between."""
    path = Path(path).resolve()
    if path not in _NATIVE:
        _NATIVE[path] = path.read_bytes()
    return _NATIVE[path]


def source_digest(path: str) -> str:
    """The fingerprint of a C or C++ file as this process keeps it (``native_source``)."""
    return cpp_digest(native_source(Path(path)).decode("utf-8"))


def cpp_digest(text: str) -> str:
    """The fingerprint of C or C++ text without its comments, white space collapsed."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:LENGTH]


def installed_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def _package_root() -> Path:
    return _source_path("bamctl").parent.parent
