"""Where the shipped task data lives, and reading it: corpora, word lists, task specs.

The data travels inside the package, in ``bamctl/data/tasks/`` (plain files: TOML
specs, texts, word lists), so an installed wheel has it too. ``BAMCTL_TASKS_DIR``
points elsewhere (a user's copy, a test fixture).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from bamctl.errors import BamctlError

TASKS_DIR_ENV = "BAMCTL_TASKS_DIR"
SHIPPED_TASKS = Path(__file__).resolve().parents[1] / "data" / "tasks"  # bamctl/tasks/texts.py -> bamctl/data/tasks


def tasks_dir() -> Path:
    """The folder holding ``*.toml`` variant specs, ``texts/`` and ``words/``."""
    override = os.environ.get(TASKS_DIR_ENV)
    folder = Path(override) if override else SHIPPED_TASKS
    if not folder.is_dir():
        where = f"{TASKS_DIR_ENV}={override}" if override else str(folder)
        raise BamctlError(
            f"task data folder not found ({where}); reinstall bamctl or set {TASKS_DIR_ENV}"
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
    """A corpus listed in ``bamctl/data/tasks/texts/corpora.toml`` (``essays``, ``ppl``, ``train``)."""
    root = tasks_dir() / "texts"
    manifest = read_toml(root / "corpora.toml")
    if name not in manifest:
        raise BamctlError(f"unknown corpus {name!r}; shipped: {', '.join(manifest)}")
    files = tuple(manifest[name]["files"])
    text = "\n\n".join(read_text(root / file).strip() for file in files)
    return Corpus(name=name, text=text, files=files)


def corpus_files(name: str) -> list[Path]:
    """The files a shipped corpus is made of, in order (what its fingerprint hashes)."""
    root = tasks_dir() / "texts"
    manifest = read_toml(root / "corpora.toml")
    if name not in manifest:
        raise BamctlError(f"unknown corpus {name!r}; shipped: {', '.join(manifest)}")
    return [root / "corpora.toml", *(root / file for file in manifest[name]["files"])]


def word_files() -> list[Path]:
    """RULER's NIAH word lists: the adjective and noun lists of the ``wonderwords`` package."""
    return [_wonderwords_asset("adjectivelist.txt"), _wonderwords_asset("nounlist.txt")]


def common_word_files() -> list[Path]:
    """RULER's common-words lists: wonderwords' nouns, adjectives and verbs."""
    return [_wonderwords_asset(name) for name in ("nounlist.txt", "adjectivelist.txt", "verblist.txt")]


def _wonderwords_asset(name: str) -> Path:
    from importlib.resources import files

    return Path(str(files("wonderwords") / "assets" / name))


def file_corpus(path: Path) -> Corpus:
    text = read_text(path)
    if not text.strip():
        raise BamctlError(f"corpus file {path} is empty")
    return Corpus(name=str(path), text=text, files=(str(path),))


@cache
def ruler_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """RULER's ``words`` keys are ``adjective-noun`` over every pair of wonderwords' lists (6,171,620
    with wonderwords 3.0.1): the distinct adjectives and nouns, each sorted."""
    adjectives, nouns = (tuple(sorted({line.rstrip() for line in read_text(path).splitlines()} - {""})) for path in word_files())
    return adjectives, nouns


@cache
def common_words() -> tuple[str, ...]:
    """RULER's common-words vocabulary: ``sorted(set(nouns + adjectives + verbs))`` of wonderwords'
    lists, each line right-stripped as wonderwords reads it (8,166 words with wonderwords 3.0.1)."""
    return tuple(sorted({line.rstrip() for path in common_word_files() for line in read_text(path).splitlines()}))
