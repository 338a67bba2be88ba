"""Passkey retrieval: a 5-digit key hidden in repeated filler.

Three protocols (``bamctl/data/tasks/passkey.toml``), two prompt forms:

* ``authors`` (the BAM authors' evaluator, token for token): the task line, ``n_prefix``
  filler units, the info line, ``n - n_prefix`` units and the question, each tokenised
  alone without special tokens and concatenated; ``n`` whole units fill the length
  ``L`` as far as they go, so the prompt is usually a little shorter than ``L`` (its
  achieved length is recorded). The answer fed after the prompt is ``" " + key``
  tokenised alone; every answer token but the first is scored. It needs a tokenizer
  that encodes ``" " + key`` as one leading token and one token per digit
  (SentencePiece vocabularies such as Mistral's); GPT-2 merges digits and cannot.
* ``exact`` (bamctl's adaptation to byte-level BPEs such as GPT-2's): the same pieces,
  each after the first led by a space, the key encoded one digit at a time (the first
  digit with its leading space), and the filler cut at the token level so the prompt
  has exactly ``L`` tokens, the key placed at a sentence end; the key's digit tokens
  are the answer, all scored.
* ``landmark`` (Landmark Attention's original): the exact form's pieces on separate
  lines; the model generates and the first integer of its answer is compared.

``auto`` (the default) is ``authors`` where the tokenizer can run its scoring, else ``exact``.
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


def passkey_key(slot: SampleSlot, key_digits: int, keys: str) -> str:
    """The key of a slot, from the key stream ``keys`` (a TOML argument): it depends on
    (seed, length, index) only, so the same index at different depths carries the same key
    and depth sweeps are paired; protocols sharing a stream share their keys."""
    rng = sample_rng(slot.seed, slot.task, keys, slot.length, slot.index)
    return str(rng.randint(10 ** (key_digits - 1), 10**key_digits - 1))


def exact_length_prompt(slot: SampleSlot, tokenizer: Tokenizer, key: str, join: str) -> dict:
    """bamctl's exact-length form (``exact``, ``landmark``): exactly ``slot.length`` tokens."""
    pieces = passkey_pieces(tokenizer, key, join)
    fixed = len(pieces.task) + len(pieces.needle) + len(pieces.question)
    filler_count = slot.length - fixed
    if filler_count < 0:
        raise BamctlError(f"length {slot.length} is too short for a passkey prompt; the minimum is {fixed} tokens")
    # Exact: every piece after the first starts with a space; landmark: a new line does it.
    stream = _filler_stream(tokenizer, " " if join == " " else "")
    before = stream.sentence_break_near(slot.depth * filler_count, filler_count)
    input_ids = pieces.task + stream.tokens(before) + pieces.needle + stream.tokens(filler_count - before) + pieces.question
    needle_at = len(pieces.task) + before
    digits = key_tokens(tokenizer, key) if slot.scoring == "teacher_forced" else []
    return dict(
        input_ids=input_ids,
        needle_at=needle_at,
        needle_depth=round(before / filler_count, 6) if filler_count else 0.0,
        answer_ids=digits,
        target_ids=digits,
        meta={"key_positions": [needle_at + offset for offset in pieces.key_at], "filler_tokens": filler_count, "filler_before": before},
    )


def authors_prompt(slot: SampleSlot, tokenizer: Tokenizer, key: str, key_digits: int) -> dict:
    """The BAM authors' form: whole filler units, the needle after ``n_prefix`` of them."""
    task, unit, question = (tokenizer.encode(text) for text in (TASK_LINE, FILLER, QUESTION))
    longest_info = tokenizer.encode(NEEDLE.format(key="9" * key_digits))
    n = max(0, (slot.length - len(task) - len(longest_info) - len(question)) // len(unit))
    n_prefix = units_before_needle(n, slot.depth, slot.depth_grid)
    info = tokenizer.encode(NEEDLE.format(key=key))
    input_ids = task + unit * n_prefix + info + unit * (n - n_prefix) + question
    answer = tokenizer.encode(" " + key)
    needle_at = len(task) + n_prefix * len(unit)
    return dict(
        input_ids=input_ids,
        needle_at=needle_at,
        needle_depth=round(n_prefix / n, 6) if n else 0.0,
        answer_ids=answer,
        target_ids=answer[1:],
        meta={"filler_units": n, "units_before": n_prefix},
    )


def units_before_needle(n: int, depth: float, grid: tuple[int, int] | None) -> int:
    """How many of ``n`` filler units precede the needle. For depth ``i`` of ``k`` evenly spaced
    depths, the authors' ``torch.linspace(0, n, k).long()[i]``; for any other depth, ``floor(depth * n)``."""
    if grid is None:
        return min(n, int(depth * n))
    index, steps = grid
    return linspace_point(n, index, steps)


def linspace_point(end: int, index: int, steps: int) -> int:
    """``torch.linspace(0, end, steps)[index].long()``, in float32 as ATen computes it: the first
    half counts up from 0 by the step, the second half down from ``end``; ``.long()`` truncates.

    ATen's x86 kernels (AVX2 and AVX-512, what torch runs on any x86 CPU since 2013) fuse the second
    half's ``end - step * k`` into one multiply-add, rounded once. The product of a 24-bit step and a
    count below 2^29, and its difference with the float32 ``end``, are exact in float64, so one
    rounding to float32 gives the fused result. Rounding the product first, as two float32
    operations do, moves the middle one of an odd number of depths by one unit for some ``end``
    (15 depths, ``end`` = 2: torch gives 0, two roundings 1)."""
    import numpy as np

    if steps == 1:
        return 0
    f32 = np.float32
    step = f32(end) / f32(steps - 1)
    if index < steps // 2:
        value = step * f32(index)
    else:
        value = f32(np.float64(f32(end)) - np.float64(step) * np.float64(steps - index - 1))
    return int(value)


def authors_scoring(tokenizer: Tokenizer, key_digits: int) -> str | None:
    """Why ``tokenizer`` cannot run the authors' scoring (None if it can): ``" " + key`` must be
    one leading token, then one token per digit."""
    for key in ("9" * key_digits, "1" + "0" * (key_digits - 1), "12345678901234"[:key_digits]):
        answer = tokenizer.encode(" " + key)
        if len(answer) != key_digits + 1 or [tokenizer.decode([t]) for t in answer[1:]] != list(key):
            return (
                f"--protocol authors scores one token per digit of ' ' + key, but {tokenizer.name} encodes "
                f"' {key}' as {len(answer)} tokens; use --protocol exact (bamctl's digit-by-digit form) or auto"
            )
    return None


def passkey_sample(
    *, slot: SampleSlot, tokenizer: Tokenizer, form: str, keys: str, join: str = " ", key_digits: int = 5
) -> Sample:
    """One passkey prompt of ``slot.length`` tokens (``exact_length``) or at most that (``authors``),
    with the key at ``slot.depth`` of the filler."""
    key = passkey_key(slot, key_digits, keys)
    if form == "authors":
        built = authors_prompt(slot, tokenizer, key, key_digits)
    elif form == "exact_length":
        built = exact_length_prompt(slot, tokenizer, key, join)
    else:
        raise BamctlError(f"unknown passkey form {form!r}; use authors or exact_length")
    return slot.sample(
        input_ids=built["input_ids"],
        prompt=tokenizer.decode(built["input_ids"]),
        answers=[key],
        needle_positions=[built["needle_at"]],
        needle_depth=built["needle_depth"],
        answer_ids=built["answer_ids"],
        target_ids=built["target_ids"],
        meta={"key": key, **built["meta"]},
    )


def passkey_digit_hits(predicted_ids: list[int], sample: Sample) -> tuple[bool, list[bool]]:
    """Teacher-forced result: (all digits right, per-digit correctness).

    ``predicted_ids`` are the argmax tokens at the positions that predict each of
    ``sample.target_ids`` (the model fed ``input_ids + answer_ids``).
    """
    targets = sample.target_ids
    hits = [i < len(predicted_ids) and predicted_ids[i] == target for i, target in enumerate(targets)]
    return (bool(hits) and all(hits) and len(predicted_ids) == len(targets), hits)

