"""Tokenizers, offline: a registry of names, each built from files on this disk.

The GPT-2 byte-pair ranks ship inside the package (``bamctl/assets/gpt2.tiktoken``,
MIT, from the ``openai-whisper`` source package; identical to tiktoken's
``r50k_base``). We read and verify the file ourselves rather than going through
``tiktoken.get_encoding``, which would try to download it.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable, Protocol, Sequence

from bamctl.errors import BamctlError, did_you_mean
from bamctl.fingerprints import digest

ASSETS = Path(__file__).parent / "assets"
GPT2_RANKS = ASSETS / "gpt2.tiktoken"
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# tiktoken's r50k_base split pattern, verbatim.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_EOT = "<|endoftext|>"


class Tokenizer(Protocol):
    """What tasks and engines need from a tokenizer; nothing more."""

    name: str
    vocab_size: int
    eos_id: int | None
    fingerprint: str  # identifies the tokenizer by what it does (vocabulary, merges, rules), not its path

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class TiktokenTokenizer:
    """A tiktoken ``Encoding`` behind the :class:`Tokenizer` protocol.

    Special-token strings inside text are encoded as plain text: a haystack that
    happens to contain ``<|endoftext|>`` must not end a document early.
    """

    name: str
    encoding: object  # tiktoken.Encoding; typed loosely so tiktoken imports lazily
    eos_id: int | None
    fingerprint: str = ""

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))


def read_bpe_ranks(path: Path, sha256: str) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` rank file (``base64-token rank`` per line) after checking its hash."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BamctlError(
            f"tokenizer rank file {path} cannot be read ({err.strerror}); reinstall bamctl"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise BamctlError(
            f"tokenizer rank file {path} is corrupt (SHA-256 {digest[:12]}…, expected "
            f"{sha256[:12]}…); reinstall bamctl"
        )
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def gpt2_tokenizer(ranks_path: Path = GPT2_RANKS) -> TiktokenTokenizer:
    import tiktoken

    ranks = read_bpe_ranks(ranks_path, GPT2_SHA256)
    encoding = tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={GPT2_EOT: len(ranks)},
        explicit_n_vocab=len(ranks) + 1,
    )
    return TiktokenTokenizer(name="gpt2", encoding=encoding, eos_id=len(ranks), fingerprint=GPT2_FINGERPRINT)


# What rows have always keyed the shipped GPT-2 vocabulary on (its rank file's SHA-256, pattern, EOT).
GPT2_FINGERPRINT = digest({"kind": "tiktoken", "ranks": GPT2_SHA256, "pattern": GPT2_PATTERN, "special": [GPT2_EOT]})


def tiktoken_fingerprint(encoding) -> str:
    """A tiktoken ``Encoding`` by what it does: every id's bytes, the split pattern and the special
    tokens (what ``encode_ordinary`` and ``decode`` depend on), not its name or how it was reached.
    An encoding that does what the shipped GPT-2 does has GPT-2's fingerprint, so a user's model
    built with it (from the shipped ranks, or bamctl's own ``gpt2_tokenizer().encoding``) sees the
    very prompts the shipped references see, and lands in their tables."""
    content = tiktoken_content(encoding)
    return GPT2_FINGERPRINT if content == _gpt2_content() else content


def tiktoken_content(encoding) -> str:
    """The digest of an encoding's every rank, split pattern and special tokens."""
    ranks = hashlib.sha256()
    for rank in range(encoding.n_vocab):  # each id's bytes, in id order (a gap in the ids hashes as one)
        try:
            token = encoding.decode_single_token_bytes(rank)
        except KeyError:
            token = b""
        ranks.update(len(token).to_bytes(4, "little") + token)
    specials = dict(sorted(getattr(encoding, "_special_tokens", {}).items()))
    return digest({"kind": "tiktoken", "ranks": ranks.hexdigest(), "pattern": getattr(encoding, "_pat_str", None),
                   "special": specials, "n_vocab": encoding.n_vocab})


@cache
def _gpt2_content() -> str:
    return tiktoken_content(gpt2_tokenizer().encoding)


# name -> factory, for tokenizers bamctl ships. Tokenizers read from a path are not registered
# (bamctl.backends.hf_tokenizer.resolve_tokenizer loads them afresh).
TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {"gpt2": gpt2_tokenizer}


@cache
def get_tokenizer(name: str) -> Tokenizer:
    """The tokenizer registered as ``name``; one instance per process."""
    try:
        factory = TOKENIZERS[name]
    except KeyError:
        raise BamctlError(f"unknown tokenizer {name!r}{did_you_mean(name, TOKENIZERS)}") from None
    return factory()
