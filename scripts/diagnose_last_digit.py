"""Why bam-ssmax misses a key's last digit at long context: where each head looks while it copies it.

    python scripts/diagnose_last_digit.py scan --rows results/certify-512 --length 64k --depth 0
    python scripts/diagnose_last_digit.py sweep --keys 41932,30842 --lengths 1k..64k --depth 0

Every miss of step 32's certification plan (19 prompts) is a wrong last digit, the first four
right. This script measures, for the query that predicts the fifth digit (the prompt and the
first four digits fed teacher-forced), the attention weight each layer's heads put on each of the
key's five digit tokens, both copies of the key summed. One JSON line per prompt:

- ``scan``: every prompt of a stored plan at one length and depth (its seeds and sample count read
  from the rows in ``--rows``), with the row's own expected and predicted key beside the weights:
  does the head that copies the key slip off the fifth digit on the prompts that missed, and only
  there?
- ``sweep``: the given keys, each placed at the same depth in prompts of every length in
  ``--lengths`` (the same filler stream, seed 0's slot otherwise), with the teacher-forced
  prediction and the log-probability of the right and of the chosen fifth digit: at which length
  the slip begins. With ``--logits``, also the parts of each head's logit at the fourth and the
  fifth digit of both copies: the scaled dot product q·k/√d (content), the prior's bias b(i - j),
  and SSMax's factor s·log(i + 1), so that the part that moves with length is named. With ``--parts
  L.H``, head L.H's content gap (digit 5 minus digit 4, first copy) split over the parts of the
  residual stream its query is read from: the embedding and each head and feed-forward below it.
  With ``--hold-ssmax L.H``, head L.H's SSMax factor stops growing past the training length (an
  intervention: does the drift follow the factor's growth?).

The seeds read by ``scan`` are the certification's, spent by step 32 (read once, then diagnosed);
no later claim may be made on them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time

import torch

import bamctl.attention_math as attention_math
from bamctl.catalog import resolve_model
from bamctl.engine.stream import StreamingEngine
from bamctl.lengths import parse_lengths
from bamctl.results.store import ResultStore
from bamctl.tasks import plan_samples
from bamctl.tasks.passkey import exact_length_prompt, key_tokens
from bamctl.tasks.sample import SampleSlot
from bamctl.tokenizer import get_tokenizer

KEY_DIGITS = 5


def digit_weights(engine: StreamingEngine, input_ids: list[int], answer_ids: list[int], key_positions: list[int],
                  written: list | None = None) -> list:
    """Per layer and head, the weight the query predicting the last digit puts on each digit
    (both copies of the key summed), rounded for reading. ``written``, if given, receives per
    layer and head the weights on the four digits the answer has written, first to fourth."""
    weights = engine.last_query_attention(list(input_ids) + list(answer_ids[: KEY_DIGITS - 1]))
    if written is not None:
        written.extend([[round(float(x), 4) for x in w[h, -(KEY_DIGITS - 1):]] for h in range(w.shape[0])] for w in weights)
    return [[[round(sum(float(w[h, p + d]) for p in key_positions), 4) for d in range(KEY_DIGITS)]
             for h in range(w.shape[0])] for w in weights]


@contextlib.contextmanager
def attention_seen(record):
    """While open, every call of ``attention_weights`` (the engine's ``last_query_attention`` makes
    one per layer, in layer order) first hands its ``q, k, inputs`` to ``record``."""
    weights_of = attention_math.attention_weights

    def recording(q, k, inputs):
        record(q, k, inputs)
        return weights_of(q, k, inputs)

    attention_math.attention_weights = recording
    try:
        yield
    finally:
        attention_math.attention_weights = weights_of


@contextlib.contextmanager
def logit_parts(found: list, positions: list[int]):
    """While open, every layer's attention also appends, per head, the last query's content score,
    prior bias and SSMax factor at ``positions``."""

    def record(q, k, inputs):
        at = torch.tensor(positions)
        last = inputs.q_start + q.shape[2] - 1
        scores = torch.einsum("hd,hpd->hp", q[0, :, -1].float(), k[0][:, at].float()) / math.sqrt(q.shape[-1])
        bias = inputs.bias_for(torch.tensor([last]), at)[:, 0] if inputs.bias_for is not None else torch.zeros_like(scores)
        factor = (attention_math.ssmax_factor(inputs, q.shape[2], q.device)[:, -1] if inputs.ssmax_scale is not None
                  else torch.ones(scores.shape[0]))
        found.append([{"content": [round(float(x), 3) for x in scores[h]], "prior": [round(float(x), 3) for x in bias[h]],
                       "factor": round(float(factor[h]), 3), "scope": inputs.ssmax_scope} for h in range(scores.shape[0])])

    with attention_seen(record):
        yield found


@contextlib.contextmanager
def query_parts(model, layer: int, head: int, positions: tuple[int, int]):
    """While open, the last query of ``layer``'s ``head`` is split over what the residual stream
    it is built from holds: the token embedding, each head and feed-forward of the layers below.
    The layer's RMSNorm is linear in the stream but for one factor, 1/rms, the same for every
    part; so the content logit at ``positions`` (digit 5, digit 4) splits into a sum of one term
    per part (part·g through W_q, dotted with the key difference, over √d), times that factor.
    Yields a dict filled by the next call: {"terms": {part: nats before 1/rms}, "inv_rms": ...,
    "gap": the sum times 1/rms, which equals the content gap the kernel scored}."""
    found: dict = {}
    parts: dict[str, torch.Tensor] = {}
    handles = []
    head_dim = model.config.head_dim
    rows = slice(head * head_dim, (head + 1) * head_dim)

    def keep(name):
        return lambda module, inputs, output: parts.__setitem__(name, output[0, -1].float())

    def heads_of(l):
        wo = model.layers[l].attention.wo.weight.detach().float()

        def split(module, inputs):
            y = inputs[0][0, -1].float()
            for h in range(model.config.n_heads):
                cols = slice(h * head_dim, (h + 1) * head_dim)
                parts[f"head {l}.{h}"] = wo[:, cols] @ y[cols]
        return split

    def stream(module, inputs):
        parts["stream"] = inputs[0][0, -1].float()

    handles.append(model.tok_embeddings.register_forward_hook(
        lambda m, i, o: parts.__setitem__("embedding", o[0, -1].float() * model.config.embedding_scale)))
    for l in range(layer):
        handles.append(model.layers[l].attention.wo.register_forward_pre_hook(heads_of(l)))
        handles.append(model.layers[l].feed_forward.register_forward_hook(keep(f"ffn {l}")))
    handles.append(model.layers[layer].attention_norm.register_forward_pre_hook(stream))
    differences = []  # per call; the last query's forward makes the last n_layers of them

    def record(q, k, inputs):
        differences.append((k[0, head, positions[0]] - k[0, head, positions[1]]).float())

    try:
        with attention_seen(record):
            yield found
    finally:
        for handle in handles:
            handle.remove()
    norm = model.layers[layer].attention_norm
    wq = model.layers[layer].attention.wq.weight.detach().float()[rows]
    stream_row = parts.pop("stream")
    difference = differences[len(differences) - model.config.n_layers + layer]
    inv_rms = float(torch.rsqrt(stream_row.pow(2).mean() + norm.eps))
    scale = math.sqrt(head_dim)
    terms = {name: float(wq @ (norm.weight.detach().float() * part) @ difference) / scale for name, part in parts.items()}
    found.update(terms={name: round(v, 3) for name, v in terms.items()}, inv_rms=round(inv_rms, 5),
                 gap=round(sum(terms.values()) * inv_rms, 3),
                 unexplained=round(float((stream_row - sum(parts.values())).norm() / stream_row.norm()), 6))


def scan(engine, tokenizer, args) -> None:
    (length,) = parse_lengths(args.length)
    frame = ResultStore(args.rows).read()
    frame = frame[frame["length"] == length]
    rows = {(r["draw"], r["depth"]): r for r in frame.to_dict("records")}
    seeds = sorted(int(seed) for seed in frame["seed"].unique())
    samples = 1 + int(frame["sample"].max())
    plan = plan_samples("passkey", [length], samples, seeds, tokenizer, [args.depth], protocol="exact")
    for sample in plan.samples():
        row = rows[(sample.draw, args.depth)]
        start = time.perf_counter()
        weights = digit_weights(engine, sample.input_ids, sample.answer_ids, sample.meta["key_positions"])
        print(json.dumps({"length": length, "depth": args.depth, "draw": sample.draw, "expected": row["expected"],
                          "predicted": row["predicted"], "weights": weights,
                          "seconds": round(time.perf_counter() - start, 1)}), flush=True)


@contextlib.contextmanager
def ssmax_held(model, head: str):
    """While open, head ``L.H``'s SSMax factor s·log(i + 1) stops growing at the training length:
    every query past it gets the factor of the query at the training length; queries within it,
    and every other head, keep theirs. The keys of the prompt's first positions (where the key sits
    at depth 0) are thus computed as without the hold."""
    import bamctl.engine.attention, bamctl.engine.flex, bamctl.engine.fused, bamctl.engine.native

    layer, h = (int(x) for x in head.split("."))
    scale, bias = model.layers[layer].attention.ssmax_scale, model.layers[layer].attention.ssmax_bias
    if scale is None:
        raise SystemExit(f"layer {layer} has no SSMax factor to hold")
    limit = float(model.config.train_length)
    factor_of = attention_math.ssmax_factor
    users = [attention_math, bamctl.engine.attention, bamctl.engine.flex, bamctl.engine.fused, bamctl.engine.native]

    def held(inputs, n_queries, device):
        factor = factor_of(inputs, n_queries, device)
        if inputs.ssmax_scale is scale:
            positions = torch.arange(inputs.q_start, inputs.q_start + n_queries, device=device, dtype=torch.float32)
            factor = factor.clone()
            factor[h] = scale[h].float() * torch.log(positions.clamp(max=limit) + 1.0) + (0 if bias is None else bias[h].float())
        return factor

    for module in users:
        module.ssmax_factor = held
    try:
        yield
    finally:
        for module in users:
            module.ssmax_factor = factor_of


def sweep(engine, tokenizer, args) -> None:
    for key in args.keys.split(","):
        for length in parse_lengths(args.lengths):
            slot = SampleSlot(task="passkey", protocol="exact", scoring="teacher_forced", metric="exact_match",
                              max_new_tokens=0, length=length, depth=args.depth, seed=0, index=0)
            built = exact_length_prompt(slot, tokenizer, key, " ")
            answer = key_tokens(tokenizer, key)
            with ssmax_held(engine.model, args.hold_ssmax) if args.hold_ssmax else contextlib.nullcontext():
                sweep_one(engine, tokenizer, args, key, length, built, answer)


def sweep_one(engine, tokenizer, args, key, length, built, answer) -> None:
    start = time.perf_counter()
    predicted, logprobs = engine.score_continuation(built["input_ids"], answer)
    keys = built["meta"]["key_positions"]
    parts: list = []
    written: list = []
    with logit_parts(parts, [p + d for p in keys for d in (KEY_DIGITS - 2, KEY_DIGITS - 1)]) if args.logits \
            else contextlib.nullcontext():
        weights = digit_weights(engine, built["input_ids"], answer, keys, written)
    extra = {"logits_at": "digit 4, digit 5 of copy 1; of copy 2", "logits": parts} if args.logits else {}
    extra["written_weights"] = written  # on the answer's four digits written so far: the local heads
    if args.parts:
        layer, head = (int(x) for x in args.parts.split("."))
        with query_parts(engine.model, layer, head, (keys[0] + KEY_DIGITS - 1, keys[0] + KEY_DIGITS - 2)) as split:
            engine.last_query_attention(list(built["input_ids"]) + list(answer[: KEY_DIGITS - 1]))
        extra["query_parts"] = {"head": args.parts, "gap": "digit 5 minus digit 4, copy 1", **split}
    print(json.dumps({"length": length, "depth": args.depth, "key": key,
                      "predicted": tokenizer.decode(predicted), "last_digit_logprob": round(logprobs[-1], 4),
                      "weights": weights, **extra, "seconds": round(time.perf_counter() - start, 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["scan", "sweep"])
    parser.add_argument("--model", default="bam-ssmax")
    parser.add_argument("--rows", help="scan: the stored plan's rows")
    parser.add_argument("--length", default="64k", help="scan: the length read")
    parser.add_argument("--depth", type=float, default=0.0)
    parser.add_argument("--keys", help="sweep: the keys, comma-separated")
    parser.add_argument("--lengths", default="1k..64k", help="sweep: the lengths")
    parser.add_argument("--logits", action="store_true", help="sweep: also each head's logit parts at digits 4 and 5")
    parser.add_argument("--hold-ssmax", metavar="LAYER.HEAD",
                        help="sweep: that head's SSMax factor stops growing at the training length (an intervention)")
    parser.add_argument("--parts", metavar="LAYER.HEAD",
                        help="sweep: that head's content gap (digit 5 minus digit 4) split over the parts of its query")
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint = resolve_model(args.model)
    tokenizer = get_tokenizer(checkpoint.model.config.tokenizer)
    engine = StreamingEngine(checkpoint.model, device="cpu", dtype="float32")
    (scan if args.mode == "scan" else sweep)(engine, tokenizer, args)


if __name__ == "__main__":
    main()
