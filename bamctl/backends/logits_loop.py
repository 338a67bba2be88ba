"""The loop a back-end runs over a model that gives logits: ``hf:`` models and plain PyTorch modules.

A sequence goes in chunks of ``chunk_size`` tokens through the model's own cache (or in one
forward where the model has none), and only the rows a request asks for are kept. On that
one loop the three request kinds are answered: teacher-forced continuations, per-token NLLs
and greedy generation without a cache. A back-end built on it says how one chunk is run
(``_forward``) and what a fresh cache is (``_new_cache``); the length policy (``lengths``) and
what goes in front of a request (``shaper``) are ``hf_common``'s.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from bamctl.backends.base import ContinuationScore
from bamctl.backends.hf_common import LengthPolicy, ShapedBackend
from bamctl.errors import BamctlError


class LogitsLoopBackend(ShapedBackend):
    """A back-end whose model maps token ids to logits, run chunk by chunk."""

    lengths: LengthPolicy
    chunk_size: int
    chunked: bool  # whether the model keeps a cache between chunks; without one, a sequence is one forward
    run_device: torch.device  # where the model and its inputs live

    @abstractmethod
    def _forward(self, ids: torch.Tensor, cache, rows: list[int] | None, **inputs):
        """Logits (B, len(rows), V), float32, for local ``rows`` of this chunk of ``ids`` (B, T), and
        the cache after it; ``rows`` None: none are needed (the chunk only fills the cache)."""

    def _append_greedy(self, next_ids: torch.Tensor, out: list[list[int]], done: list[bool], max_new_tokens: int,
                       stopped) -> bool:
        """Append each unfinished row's next token; a row ends after EOS (kept), a stop string or
        ``max_new_tokens``. Whether every row has ended."""
        for b, token in enumerate(next_ids.tolist()):
            if not done[b]:
                out[b].append(int(token))
                done[b] = (token in self.stop_ids or len(out[b]) == max_new_tokens
                           or (stopped[b] is not None and stopped[b](out[b])))
        return all(done)

    @abstractmethod
    def _new_cache(self, batch: int, longest: int):
        """An empty cache for ``batch`` sequences of up to ``longest`` tokens (None without one)."""

    def _stream(self, batch: list[list[int]], rows_for: Callable[[int, int, int], list[int]], on_logits) -> None:
        """Run the sequences of ``batch`` side by side in chunks; ``on_logits(b, start, rows, logits)``
        where ``rows_for(b, start, stop)`` asks for local rows of sequence b.

        Unequal sequences are right-padded: attention is causal, so no real token sees the
        padding after it, and no mask is needed (the model takes its own causal path, as for
        one sequence); rows of padding are never asked for.
        """
        longest = max(len(ids) for ids in batch)
        tokens = torch.zeros(len(batch), longest, dtype=torch.long)
        for b, ids in enumerate(batch):
            tokens[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        tokens = tokens.to(self.run_device)
        cache = self._new_cache(len(batch), longest)
        step = self.chunk_size if self.chunked else longest
        for start in range(0, longest, step):
            stop = min(start + step, longest)
            wanted = [rows_for(b, start, min(stop, len(ids))) if start < len(ids) else [] for b, ids in enumerate(batch)]
            union = sorted({r for rows in wanted for r in rows})
            logits, cache = self._forward(tokens[:, start:stop], cache, union or None)
            for b, rows in enumerate(wanted):
                if rows:
                    on_logits(b, start, rows, logits[b, [union.index(r) for r in rows]])

    def _logits_at(self, batch: list[list[int]], positions: list[list[int]]) -> list[torch.Tensor]:
        found: list[dict[int, torch.Tensor]] = [{} for _ in batch]

        def rows_for(b, start, stop):
            return [p - start for p in positions[b] if start <= p < stop]

        def keep(b, start, rows, logits):
            for r, row in zip(rows, logits):
                found[b][start + r] = row

        self._stream(batch, rows_for, keep)
        return [torch.stack([rows[p] for p in asked]) for rows, asked in zip(found, positions)]

    @torch.inference_mode()
    def score_continuations(self, requests) -> list[ContinuationScore]:
        prefix = self.shaper.prefix
        fed = [self.lengths.fit(prefix, list(prompt), list(target)) for prompt, target in requests]
        # the row predicting each target: the first at len(fed) - len(targets)
        positions = [list(range(len(ids) - len(target), len(ids))) for ids, (_, target) in zip(fed, requests)]
        try:
            found = self._logits_at(fed, positions)
        except BamctlError as err:
            answer = max(len(target) - 1 for _, target in requests)  # fed after the prompt: all but the last
            raise self._length_fit_error(fed, [len(prompt) for prompt, _ in requests], answer, err) from None
        answers = []
        for logits, (_, target_ids) in zip(found, requests):
            logprobs = torch.log_softmax(logits, dim=-1)
            target = torch.tensor(list(target_ids), dtype=torch.long, device=logprobs.device)
            chosen = logprobs.gather(1, target[:, None])
            answers.append(ContinuationScore(
                predicted_ids=logprobs.argmax(-1).tolist(),
                logprobs=chosen[:, 0].tolist(),
                ranks=((logprobs > chosen).sum(-1) + 1).tolist(),
            ))
        return answers

    def _length_fit_error(self, fed: list[list[int]], asked: list[int], answer: int, err: BamctlError) -> BamctlError:
        """Where a model runs a bounded number of positions (a learned position table of N rows, as
        nanoGPT's block_size), a length past them, or one the answer's tokens take past them (a prompt
        of exactly N), fails in its forward without saying why. The longest sequence it runs is
        found by running one (a bisection over its prefixes, on this error's path only), and the
        error then says what was fed and the longest ``--lengths`` that fits. ``asked``: each
        sequence's --lengths tokens; ``answer``: the answer's tokens fed after them. A failure at
        every length is left as it was."""
        ids = max(fed, key=len)

        def runs(n: int) -> str | None:
            """None where the model runs the first n tokens, else what its failure said."""
            try:
                self._logits_at([ids[:n]], [[n - 1]])
            except BamctlError as failure:
                return str(failure)
            return None

        if runs(1) is not None:
            return err
        good, bad, said = 1, len(ids), str(err)  # runs at good, not at bad
        while bad - good > 1:
            middle = (good + bad) // 2
            failure = runs(middle)
            good, bad, said = (middle, bad, said) if failure is None else (good, middle, failure)
        overhead = max(len(sequence) - length for sequence, length in zip(fed, asked))  # a BOS, the answer
        length = len(ids) - overhead
        added = [f"{overhead - answer} BOS before the prompt" if overhead > answer else "",
                 f"{answer} of the answer after it (all but its last token, which is only predicted)" if answer else ""]
        added_text = f", with {' and '.join(filter(None, added))}" if overhead else ""
        fits = good - overhead
        return BamctlError(
            f"{self.info.name} runs at most {good:,} tokens (on {bad:,}: {said.split(' raised ', 1)[-1]}); --lengths "
            f"{length:,} feeds {len(ids):,}{added_text}; "
            + (f"the longest --lengths that fits is {fits:,}" if fits > 0 else "no --lengths fits"))

    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]):
        return self.score_continuations([(prompt_ids, target_ids)])[0]

    def _generate_uncached(self, ids: list[int], max_new_tokens: int, stopped=None) -> list[int]:
        out: list[int] = []
        while True:
            next_id = int(self._logits_at([ids + out], [[len(ids) + len(out) - 1]])[0][-1].argmax())
            out.append(next_id)
            if next_id in self.stop_ids or len(out) == max_new_tokens or (stopped is not None and stopped(out)):
                return out

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        return self.generate_many([prompt_ids], max_new_tokens)[0]

    @torch.inference_mode()
    def token_nlls(self, requests) -> list[torch.Tensor]:
        """Per (ids, score_from): NLL (float32, CPU) of ids[t] for t in [score_from, len(ids)); a BOS,
        if the model takes one, goes in front but is neither scored nor counted. With nothing in
        front, token 0 is not predicted: NaN."""
        for ids, score_from in requests:
            if not 0 <= score_from <= len(ids):
                raise ValueError(f"score_from must be in [0, {len(ids)}], got {score_from}")
        fulls, firsts, padded = [], [], []
        for ids, score_from in requests:
            full = self.lengths.fit_prefix(self.shaper.prefix, list(ids))
            prefix = len(full) - len(ids)
            unpredicted = score_from == 0 and not prefix and bool(ids)  # token 0 with nothing before it
            fulls.append(full)
            firsts.append(prefix + max(score_from, 1 if unpredicted else 0))  # first scored index in `full`
            padded.append(unpredicted)
        pieces: list[list[torch.Tensor]] = [[] for _ in requests]
        streamed = [b for b, full in enumerate(fulls) if len(full) > 1]

        def rows_for(i, start, stop):  # row r predicts full[start + r + 1]
            full, first = fulls[streamed[i]], firsts[streamed[i]]
            return list(range(max(first - 1 - start, 0), min(stop, len(full) - 1) - start))

        def score(i, start, rows, logits):
            full = fulls[streamed[i]]
            wanted = torch.tensor(full[start + rows[0] + 1 : start + rows[-1] + 2], dtype=torch.long, device=logits.device)
            pieces[streamed[i]].append(F.cross_entropy(logits, wanted, reduction="none").cpu())

        if streamed:
            try:
                self._stream([fulls[b] for b in streamed], rows_for, score)
            except BamctlError as err:
                raise self._length_fit_error([fulls[b] for b in streamed], [len(requests[b][0]) for b in streamed],
                                             0, err) from None
        answers = []
        for b in range(len(requests)):
            nll = torch.cat(pieces[b]) if pieces[b] else torch.zeros(0)
            answers.append(F.pad(nll, (1, 0), value=float("nan")) if padded[b] else nll)
        return answers

    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor:
        return self.token_nlls([(ids, score_from)])[0]
