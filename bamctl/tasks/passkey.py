"""Passkey retrieval: a 5-digit key hidden in repeated filler, at an exact token length.

Two protocols, chosen by the variant's ``join`` argument (``bamctl/data/tasks/passkey.toml``):

* ``authors`` (BAM paper, default): the pieces are tokenised separately and the
  token lists concatenated, as the authors' code does with a SentencePiece
  tokenizer. SentencePiece starts every piece with a word boundary; with a
  byte-level BPE we reproduce that with a leading space on every piece after the
  first. Scored by teacher forcing over the key's digits.
* ``landmark`` (Landmark Attention's original): the same pieces on separate lines;
  the model generates and the first integer of its answer is compared.

Exact length: the filler is a stream of repeated filler units, cut at the token
level, so the prompt has exactly the requested number of tokens.

Digits: byte-level BPEs merge digit runs (" 12345" is two GPT-2 tokens, split
differently for different keys). The key is therefore encoded one digit at a
time wherever it appears: the first digit with its leading space, then each
further digit alone. Teacher forcing then has one answer position per digit
with any such tokenizer, and ``decode(input_ids)`` is still the prompt text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from bamctl.errors import BamctlError
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tokenizer import Tokenizer

TASK_LINE = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize them. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


def key_tokens(tokenizer: Tokenizer, key: str, lead: str = " ") -> list[int]:
    """``lead + key`` tokenised digit by digit: ``[" 1", "2", "3", "4", "5"]`` for GPT-2."""
    ids = list(tokenizer.encode(lead + key[0]))
    for digit in key[1:]:
        ids.extend(tokenizer.encode(digit))
    return ids


@dataclass(frozen=True)
class FillerStream:
    """Filler units repeated as tokens; ``head`` is the first unit, ``unit`` every later one."""

    head: tuple[int, ...]
    unit: tuple[int, ...]
    head_breaks: tuple[int, ...]  # token offsets inside `head` where a sentence ends
    unit_breaks: tuple[int, ...]

    def tokens(self, count: int) -> list[int]:
        """The first ``count`` tokens of the stream (the last unit may be cut mid-sentence)."""
        if count <= len(self.head):
            return list(self.head[:count])
        repeats, rest = divmod(count - len(self.head), len(self.unit))
        return list(self.head) + list(self.unit) * repeats + list(self.unit[:rest])

    def sentence_break_near(self, target: float, limit: int) -> int:
        """The sentence boundary (token offset, 0 included) closest to ``target``, not past ``limit``."""
        candidates = [0]
        candidates += [b for b in self.head_breaks if b <= limit]
        if limit > len(self.head):
            # Only the unit repetitions around `target` can hold the nearest boundary.
            reps = max(0, int((target - len(self.head)) // len(self.unit)))
            for rep in (reps - 1, reps, reps + 1):
                if rep < 0:
                    continue
                base = len(self.head) + rep * len(self.unit)
                candidates += [base + b for b in self.unit_breaks if base + b <= limit]
        return min(candidates, key=lambda b: (abs(b - target), b))


def _sentence_breaks(tokenizer: Tokenizer, ids: tuple[int, ...]) -> tuple[int, ...]:
    breaks, text = [], ""
    for i, token in enumerate(ids):
        text += tokenizer.decode([token])
        if text.rstrip().endswith((".", "?", "!")):
            breaks.append(i + 1)
    return tuple(breaks)


@lru_cache(maxsize=16)
def _filler_stream(tokenizer: Tokenizer, lead: str) -> FillerStream:
    head = tuple(tokenizer.encode(lead + FILLER))
    unit = tuple(tokenizer.encode(" " + FILLER))
    return FillerStream(head, unit, _sentence_breaks(tokenizer, head), _sentence_breaks(tokenizer, unit))


@dataclass(frozen=True)
class PasskeyPieces:
    """The fixed parts of a prompt around the filler, as tokens."""

    task: list[int]  # task line plus the separator before the filler
    needle: list[int]  # separator, needle, separator
    question: list[int]  # separator and question
    key_at: list[int]  # offsets inside `needle` where each copy of the key starts


def passkey_pieces(tokenizer: Tokenizer, key: str, join: str) -> PasskeyPieces:
    """Tokenise each piece on its own; ``join`` is ``" "`` (authors) or ``"\\n"`` (landmark)."""
    before, middle, after = NEEDLE.split("{key}")
    needle = list(tokenizer.encode(join + before.rstrip(" ")))
    key_at = [len(needle)]
    needle += key_tokens(tokenizer, key) + list(tokenizer.encode(middle.rstrip(" ")))
    key_at.append(len(needle))
    needle += key_tokens(tokenizer, key) + list(tokenizer.encode(after))
    if join == "\n":
        needle += list(tokenizer.encode("\n"))
        return PasskeyPieces(list(tokenizer.encode(TASK_LINE + "\n")), needle, list(tokenizer.encode("\n" + QUESTION)), key_at)
    return PasskeyPieces(list(tokenizer.encode(TASK_LINE)), needle, list(tokenizer.encode(join + QUESTION)), key_at)


def passkey_key(slot: SampleSlot, key_digits: int) -> str:
    """The key of a slot: it depends on (seed, task, protocol, length, index) only, so the
    same index at different depths carries the same key and depth sweeps are paired."""
    rng = sample_rng(slot.seed, slot.task, slot.protocol, slot.length, slot.index)
    return str(rng.randint(10 ** (key_digits - 1), 10**key_digits - 1))


def passkey_sample(*, slot: SampleSlot, tokenizer: Tokenizer, join: str, key_digits: int = 5) -> Sample:
    """One passkey prompt of exactly ``slot.length`` tokens with the key at ``slot.depth`` of the filler."""
    key = passkey_key(slot, key_digits)
    pieces = passkey_pieces(tokenizer, key, join)
    fixed = len(pieces.task) + len(pieces.needle) + len(pieces.question)
    filler_count = slot.length - fixed
    if filler_count < 0:
        raise BamctlError(f"length {slot.length} is too short for a passkey prompt; the minimum is {fixed} tokens")
    # Authors: every piece after the first starts with a space; landmark: a new line does it.
    stream = _filler_stream(tokenizer, " " if join == " " else "")
    before = stream.sentence_break_near(slot.depth * filler_count, filler_count)
    input_ids = pieces.task + stream.tokens(before) + pieces.needle + stream.tokens(filler_count - before) + pieces.question
    needle_at = len(pieces.task) + before
    return slot.sample(
        input_ids=input_ids,
        prompt=tokenizer.decode(input_ids),
        answers=[key],
        needle_positions=[needle_at],
        needle_depth=round(before / filler_count, 6) if filler_count else 0.0,
        target_ids=key_tokens(tokenizer, key) if slot.scoring == "teacher_forced" else [],
        meta={
            "key": key,
            "key_positions": [needle_at + offset for offset in pieces.key_at],
            "filler_tokens": filler_count,
            "filler_before": before,
        },
    )


def passkey_digit_hits(predicted_ids: list[int], sample: Sample) -> tuple[bool, list[bool]]:
    """Teacher-forced result: (all digits right, per-digit correctness).

    ``predicted_ids`` are the argmax tokens at the positions that predict each of
    ``sample.target_ids`` (the model fed ``input_ids + target_ids``).
    """
    targets = sample.target_ids
    hits = [i < len(predicted_ids) and predicted_ids[i] == target for i, target in enumerate(targets)]
    return (bool(hits) and all(hits) and len(predicted_ids) == len(targets), hits)

