"""Where the shipped task data lives, and reading it: corpora, word lists, variant specs.

The data sits in the repository's top-level ``tasks/`` folder, not inside the
package: it is data a reader should find next to the code, not behind an import.
``BAMCTL_TASKS_DIR`` points elsewhere (an installed copy, a test fixture).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from bamctl.errors import BamctlError

TASKS_DIR_ENV = "BAMCTL_TASKS_DIR"
# bamctl/tasks/texts.py -> repository root -> tasks/
_REPO_TASKS = Path(__file__).resolve().parents[2] / "tasks"


def tasks_dir() -> Path:
    """The folder holding ``*.toml`` variant specs, ``texts/`` and ``words/``."""
    override = os.environ.get(TASKS_DIR_ENV)
    folder = Path(override) if override else _REPO_TASKS
    if not folder.is_dir():
        where = f"{TASKS_DIR_ENV}={override}" if override else str(folder)
        raise BamctlError(
            f"task data folder not found ({where}); run from a bamctl checkout or set {TASKS_DIR_ENV}"
        )
    return folder


def read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as err:
        raise BamctlError(f"cannot read {path} ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise BamctlError(f"{path} is not valid TOML: {err}") from None


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise BamctlError(f"cannot read {path} ({err.strerror})") from None
    except UnicodeDecodeError:
        raise BamctlError(f"{path} is not UTF-8 text") from None


@dataclass(frozen=True)
class Corpus:
    """A named body of text: a shipped corpus or a user's file."""

    name: str
    text: str
    files: tuple[str, ...]


@cache
def shipped_corpus(name: str) -> Corpus:
    """A corpus listed in ``tasks/texts/corpora.toml`` (``essays``, ``ppl``, ``train``)."""
    root = tasks_dir() / "texts"
    manifest = read_toml(root / "corpora.toml")
    if name not in manifest:
        raise BamctlError(f"unknown corpus {name!r}; shipped: {', '.join(manifest)}")
    files = tuple(manifest[name]["files"])
    text = "\n\n".join(read_text(root / file).strip() for file in files)
    return Corpus(name=name, text=text, files=files)


def file_corpus(path: Path) -> Corpus:
    text = read_text(path)
    if not text.strip():
        raise BamctlError(f"corpus file {path} is empty")
    return Corpus(name=str(path), text=text, files=(str(path),))


@cache
def word_pairs() -> tuple[str, ...]:
    """RULER's ``words`` keys: every adjective-noun pair, sorted (``"bold-lantern"``)."""
    folder = tasks_dir() / "words"
    adjectives = read_text(folder / "adjectives.txt").split()
    nouns = read_text(folder / "nouns.txt").split()
    return tuple(sorted({f"{adjective}-{noun}" for adjective in adjectives for noun in nouns}))
