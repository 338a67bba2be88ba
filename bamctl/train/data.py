"""Training batches as a pure function of (recipe, step): no loader state to save or lose.

A batch row is either a passkey prompt at the training length (the tasks module's own
generator, at seeds disjoint from evaluation; its length varies, unscored filler pads the row) or a window of language-model text. Which
one, the key depth and the window start all follow from (seed, step, row), so a resumed
run sees exactly the batches an uninterrupted run would.

Text comes from the shipped training corpus (``bamctl/data/tasks/texts/train``, disjoint from the
perplexity and essay corpora) or from ``--data DIR``: ``*.txt`` files (tokenised here,
joined by the end-of-text token), ``*.npy`` token arrays, or ``*.bin`` uint16 shards
(raw, or llm.c's format with a 256-int32 header).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples, get_task
from bamctl.tasks.passkey import FILLER, key_tokens, passkey_pieces
from bamctl.tasks.sample import sample_rng
from bamctl.tokenizer import Tokenizer
from bamctl.train.recipe import Recipe
from bamctl.vocab import VocabSubset

IGNORE = -100  # target id the loss skips: tokens outside the model's subset
# Passkey rows: bamctl's exact-length, digit-by-digit form, named rather than left to `auto`
# (which would pick the authors' form, of another length and without key positions, for a
# tokenizer that writes one token per digit).
TRAINING_PROTOCOL = "exact"
LLMC_MAGIC = 20240520  # llm.c token shards: int32 header [magic, version, n_tokens, ...] of 256 ints
LLMC_HEADER_INTS = 256


class TokenShards:
    """Token arrays (tokenizer ids) a window of ``n`` tokens is drawn from, uniformly over start positions."""

    def __init__(self, arrays: list[np.ndarray], name: str):
        self.arrays = [a for a in arrays if len(a)]
        self.name = name
        if not self.arrays:
            raise BamctlError(f"no tokens in {name}")

    def __len__(self) -> int:
        return sum(len(a) for a in self.arrays)

    def window(self, n: int, u: float) -> np.ndarray:
        """The window whose start is the ``u``-quantile (u in [0, 1)) of all valid starts."""
        starts = [max(len(a) - n + 1, 0) for a in self.arrays]
        total = sum(starts)
        if total == 0:
            raise BamctlError(f"{self.name} holds no run of {n} tokens; every shard is shorter than the training length + 1")
        k = min(int(u * total), total - 1)
        bounds = np.cumsum(starts)
        shard = bisect.bisect_right(bounds, k)
        offset = k - (bounds[shard - 1] if shard else 0)
        return np.asarray(self.arrays[shard][offset : offset + n], dtype=np.int64)

    def head(self, limit: int) -> np.ndarray:
        """Up to ``limit`` tokens from the start of the shards, for counting frequencies."""
        out, left = [], limit
        for a in self.arrays:
            if left <= 0:
                break
            out.append(np.asarray(a[:left], dtype=np.int64))
            left -= len(out[-1])
        return np.concatenate(out)


@lru_cache(maxsize=4)
def shipped_text_tokens(tokenizer: Tokenizer, corpus: str = "train") -> TokenShards:
    from bamctl.tasks.texts import shipped_corpus

    ids = np.asarray(tokenizer.encode(shipped_corpus(corpus).text), dtype=np.int32)
    return TokenShards([ids], f"shipped corpus {corpus!r}")


@lru_cache(maxsize=4)
def filler_tokens(tokenizer: Tokenizer, corpus: str) -> TokenShards:
    """A shipped corpus as passkey filler: digits removed (the key stays the only number),
    whitespace collapsed to single spaces (as the protocol's filler), one leading space."""
    from bamctl.tasks.texts import shipped_corpus

    text = " ".join(re.sub(r"[0-9]", "", shipped_corpus(corpus).text).split())
    ids = np.asarray(tokenizer.encode(" " + text), dtype=np.int32)
    return TokenShards([ids], f"filler corpus {corpus!r}")


def passkey_filler(recipe: Recipe, tokenizer: Tokenizer) -> TokenShards | None:
    """The recipe's training filler corpus; None: the protocol's repeated sentences."""
    corpus = recipe.data.passkey_filler
    return None if corpus == "protocol" else filler_tokens(tokenizer, corpus)


def _read_bin(path: Path) -> np.ndarray:
    header = np.fromfile(path, dtype=np.int32, count=LLMC_HEADER_INTS)
    if len(header) == LLMC_HEADER_INTS and header[0] == LLMC_MAGIC:
        return np.memmap(path, dtype=np.uint16, mode="r", offset=LLMC_HEADER_INTS * 4, shape=(int(header[2]),))
    return np.memmap(path, dtype=np.uint16, mode="r")


def directory_tokens(folder: Path, tokenizer: Tokenizer) -> TokenShards:
    """Every ``*.txt``, ``*.npy`` and ``*.bin`` file under ``folder``, in sorted order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BamctlError(f"--data {folder} is not a directory")
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".txt", ".npy", ".bin") and p.is_file())
    if not files:
        raise BamctlError(f"--data {folder} holds no .txt, .npy or .bin files")
    arrays = []
    for path in files:
        try:
            if path.suffix == ".txt":
                ids = tokenizer.encode(path.read_text(encoding="utf-8"))
                if tokenizer.eos_id is not None:
                    ids.append(tokenizer.eos_id)
                arrays.append(np.asarray(ids, dtype=np.int32))
            elif path.suffix == ".npy":
                arrays.append(np.load(path, mmap_mode="r").reshape(-1))
            else:
                arrays.append(_read_bin(path))
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise BamctlError(f"cannot read training data {path}: {err}") from None
    shards = TokenShards(arrays, f"--data {folder}")
    largest = max(int(np.max(a[: 1 << 20])) for a in shards.arrays)
    if largest >= tokenizer.vocab_size:
        raise BamctlError(f"--data {folder} holds token id {largest}, beyond the {tokenizer.name} vocabulary")
    return shards


def text_tokens(recipe: Recipe, tokenizer: Tokenizer, data_dir: Path | None) -> TokenShards | None:
    """The recipe's text source; ``--data`` replaces the shipped corpus for any recipe with text."""
    source = recipe.data.text
    if source == "none":
        if data_dir is not None:
            raise BamctlError(f"recipe {recipe.name!r} is retrieval-only ([data] text = 'none'); --data does not apply")
        return None
    if data_dir is not None:
        return directory_tokens(data_dir, tokenizer)
    if source == "data-dir":
        raise BamctlError(f"recipe {recipe.name!r} reads its text from a folder: pass --data DIR")
    return shipped_text_tokens(tokenizer, source)


def is_passkey_row(global_row: int, fraction: float) -> bool:
    """Row ``g`` is a passkey prompt when floor((g + 1) f) steps up: exactly f of any run of rows, evenly spread."""
    return int((global_row + 1) * fraction) > int(global_row * fraction)


@lru_cache(maxsize=4)
def passkey_answer_length(tokenizer: Tokenizer) -> int:
    """Tokens of a training answer (GPT-2: one per digit; other tokenizers may add a space token)."""
    digits = get_task("passkey", TRAINING_PROTOCOL).args.get("key_digits", 5)
    return len(key_tokens(tokenizer, "1" * digits))


def passkey_row(tokenizer: Tokenizer, length: int, seed: int, depth: float) -> tuple[list[int], list[int]]:
    """A passkey prompt plus its answer digits: exactly ``length`` tokenizer ids, and the
    indices of every key digit in them (both copies in the needle, then the answer)."""
    answer = passkey_answer_length(tokenizer)
    sample = next(generate_samples("passkey", [length - answer], 1, seed, tokenizer, depths=[depth], protocol=TRAINING_PROTOCOL))
    ids = sample.input_ids + sample.target_ids
    if len(ids) != length:
        raise BamctlError(f"passkey training row has {len(ids)} tokens, expected {length}")
    starts = [*sample.meta["key_positions"], len(sample.input_ids)]
    return ids, [start + i for start in starts for i in range(len(sample.target_ids))]


@lru_cache(maxsize=4)
def passkey_min_length(tokenizer: Tokenizer) -> int:
    """Tokens of the shortest passkey prompt plus answer (no filler at all)."""
    pieces = passkey_pieces(tokenizer, "12345", " ")
    return len(pieces.task) + len(pieces.needle) + len(pieces.question) + len(key_tokens(tokenizer, "12345"))


def passkey_corpus_row(
    tokenizer: Tokenizer, length: int, seed: int, depth: float, filler: TokenShards, u: float
) -> tuple[list[int], list[int]]:
    """As :func:`passkey_row`, with the protocol's pieces around running text from ``filler``
    (the window at quantile ``u``) instead of its repeated sentences; the needle goes at
    ``depth`` of the filler, at token level."""
    digits = get_task("passkey", TRAINING_PROTOCOL).args.get("key_digits", 5)
    key = str(sample_rng(seed, "train-passkey-corpus").randint(10 ** (digits - 1), 10**digits - 1))
    pieces = passkey_pieces(tokenizer, key, " ")
    answer = key_tokens(tokenizer, key)
    count = length - len(pieces.task) - len(pieces.needle) - len(pieces.question) - len(answer)
    if count < 0:
        raise BamctlError(f"passkey training row of {length} tokens is too short")
    window = filler.window(count, u).tolist() if count else []
    before = min(int(round(depth * count)), count)
    ids = pieces.task + window[:before] + pieces.needle + window[before:] + pieces.question + answer
    needle_at = len(pieces.task) + before
    starts = [needle_at + offset for offset in pieces.key_at] + [length - len(answer)]
    return ids, [start + i for start in starts for i in range(len(answer))]


def passkey_padded_row(
    tokenizer: Tokenizer, n: int, seed: int, rng, *, min_length: int = 0, filler: TokenShards | None = None,
    longest_fraction: float = 0.0, depth: float | None = None, needle_first: bool = False,
) -> tuple[list[int], list[int], int]:
    """A row of ``n`` tokens: a passkey prompt + answer of random length in [shortest, n], then
    filler that no loss sees. Returns (ids, key digit indices, prompt + answer length).
    ``min_length`` raises the shortest length drawn (0: the shortest prompt possible);
    ``filler``: running text around the needle instead of the protocol's sentences; ``depth``:
    the needle's depth instead of the uniform draw (``rng`` draws it all the same, so the
    row's other draws do not move); ``needle_first``: the prompt at depth 0 with the needle
    moved before the instruction (:func:`open_with_needle`).

    The answer must not always sit at the row's end: a model trained so learns where the
    answer is by position, and fails on a prompt only 4 tokens longer (measured with RoPE).
    """
    shortest = min(max(passkey_min_length(tokenizer), min_length), n)
    length = rng.randint(shortest, n)
    if longest_fraction and rng.random() < longest_fraction:
        length = n
    uniform = rng.random()
    depth = 0.0 if needle_first else uniform if depth is None else depth
    if filler is None:
        ids, key_at = passkey_row(tokenizer, length, seed, depth)
    else:
        ids, key_at = passkey_corpus_row(tokenizer, length, seed, depth, filler, rng.random())
    if needle_first:
        ids, key_at = open_with_needle(tokenizer, ids, key_at)
    pad = tokenizer.encode(" " + FILLER)
    ids = ids + (pad * (1 + (n - length) // max(len(pad), 1)))[: n - length]
    return ids, key_at, length


def end_depth(seed: int, global_row: int, fraction: float) -> float | None:
    """The needle's depth when row ``global_row`` is one of the ``fraction`` of passkey rows with
    the needle at an end of the filler: 0.0 (after the instruction) or 1.0 (after the filler's last
    sentence break), half each; None: the row draws its depth uniformly. A stream of its own, so the rest of the row
    is the row a recipe without it draws; fraction 0 draws nothing."""
    if not fraction:
        return None
    rng = sample_rng(seed, "train-depth-ends", global_row)
    if rng.random() >= fraction:
        return None
    return 0.0 if rng.random() < 0.5 else 1.0


def open_with_needle(tokenizer: Tokenizer, ids: list[int], key_at: list[int]) -> tuple[list[int], list[int]]:
    """A row whose needle directly follows the instruction (depth 0), with the two swapped: the
    row opens with the needle, the instruction follows, the rest stays. Returns (ids, key digit
    indices); the same length, key and answer positions."""
    digits = len(key_at) // 3
    key = tokenizer.decode([ids[i] for i in key_at[-digits:]]).strip()
    pieces = passkey_pieces(tokenizer, key, " ")
    task, needle = len(pieces.task), len(pieces.needle)
    if list(ids[:task]) != pieces.task or list(ids[task : task + needle]) != pieces.needle:
        raise BamctlError("passkey_needle_first: the row does not open with the instruction and the needle")
    moved = pieces.needle + pieces.task + list(ids[task + needle :])
    return moved, [start + i for start in pieces.key_at for i in range(digits)] + list(key_at[-digits:])


def needle_first(seed: int, global_row: int, fraction: float) -> bool:
    """Whether passkey row ``global_row`` is one of the ``fraction`` of rows that open with the
    needle. A stream of its own, so the rest of the row is the row a recipe without it draws;
    fraction 0 draws nothing."""
    if not fraction:
        return False
    return sample_rng(seed, "train-needle-first", global_row).random() < fraction


@dataclass
class BatchMaker:
    """``batch(step, micro)`` -> (inputs, targets), both (B, T) model ids (tokenizer ids where
    ``model_ids`` is False); pure in its arguments."""

    recipe: Recipe
    tokenizer: Tokenizer
    text: TokenShards | None
    subset: VocabSubset | None
    filler: TokenShards | None = None  # training passkey filler corpus; None: the protocol's
    # False: inputs and targets in the tokenizer's ids (a user's module has a row for each), the
    # targets the subset has no row for still unscored, so every model of a recipe is scored alike
    model_ids: bool = True

    def row_tokens(self) -> int:
        """Tokens of every row: inputs and the shifted targets (train_length + 1), or the longest
        prompt plus its answer when the recipe sets ``passkey_max_prompt``."""
        longest_prompt = self.recipe.data.passkey_max_prompt
        if longest_prompt:
            return longest_prompt + passkey_answer_length(self.tokenizer)
        return self.recipe.model.train_length + 1

    def row(self, step: int, micro: int, row: int) -> tuple[list[int] | np.ndarray, str, list[int] | None]:
        """(tokenizer ids, "passkey" or "text", indices of the ids the loss scores; None: all)."""
        t = self.recipe.train
        global_row = (step * t.grad_accum + micro) * t.batch_size + row
        rng = sample_rng(t.seed, "train-row", global_row)
        d = self.recipe.data
        n = self.row_tokens()
        if self.text is None or is_passkey_row(global_row, d.passkey_fraction):
            seed = d.passkey_seed_offset + global_row
            # Protocol filler for the rows outside the corpus-filler fraction, drawn per row.
            corpus = self.filler is not None and sample_rng(t.seed, "train-filler", global_row).random() < d.passkey_filler_fraction
            ids, key_at, used = passkey_padded_row(
                self.tokenizer, n, seed, rng, min_length=d.passkey_min_length, filler=self.filler if corpus else None,
                longest_fraction=d.passkey_longest_fraction, depth=end_depth(t.seed, global_row, d.passkey_depth_ends),
                needle_first=needle_first(t.seed, global_row, d.passkey_needle_first),
            )
            if d.passkey_loss == "key":
                return ids, "passkey", key_at
            if d.passkey_loss == "answer":
                return ids, "passkey", key_at[-(len(key_at) // 3) :]
            return ids, "passkey", list(range(1, used))
        return self.text.window(n, rng.random()), "text", None

    def batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.row(step, micro, r) for r in range(self.recipe.train.batch_size)]
        tokens = torch.as_tensor(np.stack([np.asarray(r[0], dtype=np.int64) for r in rows]))  # (B, T+1)
        ids = tokens if self.subset is None else self.subset.to_model(tokens)
        targets = ids[:, 1:].clone()  # (B, T)
        if self.subset is not None:
            targets[targets == self.subset.unk] = IGNORE
        for b, (_, _, scored) in enumerate(rows):
            if scored is not None:
                keep = torch.zeros(targets.shape[1], dtype=torch.bool)
                keep[torch.tensor(scored) - 1] = True  # target t is token t + 1
                targets[b, ~keep] = IGNORE
        if not self.model_ids:
            return tokens[:, :-1], torch.where(targets == IGNORE, IGNORE, tokens[:, 1:])
        return ids[:, :-1], targets
