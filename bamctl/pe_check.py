"""A PE's self-check: what its author would otherwise learn only from wrong numbers.

``bamctl pe check PLUGIN`` builds the PE into a tiny model (random weights: every check is of the
PE's code, not of training) and runs each check below once; each says pass or fail with its
figure. ``bamctl new`` and ``bamctl train`` run the quick ones first (``QUICK``), so a plugin that
leaks the future never trains.

- ``hooks``: what it gives meets the protocol's shapes and dtypes (a distance table
  ``(H, D + 1)`` float of finite values; a query-position bias ``(H, Tq, Tk)``);
- ``causal``: no information flows from a later token: a token changed at position t leaves the
  prediction of every token before t unchanged, on the streaming engine and in one forward;
- ``table prefix``: the table a long run asks for begins with the table a short run asks for
  (the engine asks each layer once for the longest distance and indexes it);
- ``chunked = whole``: the streaming engine, in chunks through its KV cache on the path ``auto``
  picks, gives one dense forward's token log-probabilities;
- ``finite far out``: at 64x the training length (the table, and a forward where ``--full``) every
  value is finite;
- ``block skipping``: what the certified bound may assume of it (information, always passes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bamctl.errors import BamctlError

CHUNK = 64  # the engine's chunk in the checks: several chunks per sequence
TOLERANCE = 1e-4  # nats per token: the engine's paths agree with dense to float32 rounding, well within this
FAR = 64  # times the training length: where "finite far out" looks


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    figure: str


def run_checks(pe: str, *, train_length: int = 64, full: bool = True, seed: int = 0) -> list[Check]:
    """Every check of PE ``pe`` (a zoo name or a plugin reference, ``-ssmax`` allowed), built into a
    micro model trained at ``train_length``; ``full=False``: the quick ones (``bamctl new``, ``train``)."""
    from bamctl.checkpoint import new_random_model
    from bamctl.model import ModelConfig

    model = new_random_model(ModelConfig.from_preset("micro", pe, train_length=train_length), seed).eval()
    checks = [_hooks(model, full), _table_prefix(model)]
    length = 4 * train_length
    ids = torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(seed))
    checks += [_causal(model, ids), _chunked(model, ids)]
    if full:
        checks.append(_far(model))
    checks.append(_skipping(model))
    return [check for check in checks if check is not None]


def failures(checks: list[Check]) -> list[Check]:
    return [check for check in checks if not check.passed]


def require_passing(pe: str, train_length: int) -> None:
    """The quick checks, before ``new`` or ``train`` writes anything; one line on the first failure."""
    from bamctl.pe_plugins import parse_pe_name
    from bamctl.positional import PE_REGISTRY

    base, _ = parse_pe_name(pe)
    if base in PE_REGISTRY:
        return  # the zoo's are checked by the suite (tests/test_pe_check.py), not on every run
    failed = failures(run_checks(pe, train_length=min(train_length, 64), full=False))
    if failed:
        raise BamctlError(f"positional encoding {pe} fails its check {failed[0].name!r}: {failed[0].figure} "
                          f"(bamctl pe check {pe} runs them all)")


# -- the checks ---------------------------------------------------------------------------------------


def _prior(model):
    return model.layers[0].attention.prior


def _hooks(model, full: bool) -> Check:
    from bamctl.positional import check_distance_table

    prior, heads, length = _prior(model), model.config.n_heads, model.config.train_length
    said = []
    try:
        if callable(getattr(prior, "distance_table", None)):
            far = FAR * length if full else 4 * length
            with torch.no_grad():
                check_distance_table(prior.distance_table(far), heads, far, "distance_table")
            said.append(f"distance_table({far:,}) ({heads}, {far + 1:,}) float, finite")
        if getattr(prior, "query_dependent", False):
            q, k = torch.arange(3, 8), torch.arange(0, 8)
            with torch.no_grad():
                bias = prior.bias(q, k)
            if not (isinstance(bias, torch.Tensor) and tuple(bias.shape) == (heads, 5, 8) and bias.is_floating_point()):
                got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
                return Check("hooks", False, f"bias(q_positions (5,), k_positions (8,)) gave {got}, not ({heads}, 5, 8) float")
            said.append(f"bias (H, Tq, Tk) = ({heads}, 5, 8) float")
    except BamctlError as err:
        return Check("hooks", False, str(err))
    hooks = [h for h in ("embed", "transform_qk", "transform_qk_after_cache", "position_ids", "content_bias",
                         "content_scan", "pair_bias", "score_mod") if callable(getattr(prior, h, None))]
    if hooks:
        said.append(", ".join(hooks) + " (held by the checks below)")
    return Check("hooks", True, "; ".join(said) or "no hook: the causal mask alone")


def _table_prefix(model) -> Check | None:
    prior = _prior(model)
    if not callable(getattr(prior, "distance_table", None)):
        return None
    short = model.config.train_length
    with torch.no_grad():
        a, b = prior.distance_table(short), prior.distance_table(4 * short)
    gap = float((b[:, : short + 1] - a).abs().max())
    return Check("table prefix", gap == 0.0, f"distance_table({4 * short})[:, :{short + 1}] - distance_table({short}): "
                 f"max |diff| {gap:.3g}")


def _dense_nll(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids[None])[0, :-1].float(), -1)
    return -logprobs.gather(1, ids[1:, None])[:, 0]


def _engine(model):
    from bamctl.engine.stream import StreamingEngine

    return StreamingEngine(model, device="cpu", dtype="float32", chunk_size=CHUNK)


def _causal(model, ids: torch.Tensor) -> Check:
    t = len(ids) // 2 + 3  # mid-chunk, so the changed token shares a chunk with earlier queries
    changed = ids.clone()
    changed[t] = (changed[t] + 1) % model.config.vocab_size
    engine = _engine(model)
    worst = 0.0
    for nll in (_dense_nll, lambda m, x: engine.token_nll(x.tolist())):
        before, after = nll(model, ids), nll(model, changed)
        # NLL index p scores token p + 1 from tokens 0..p: those with p + 1 < t never saw token t
        worst = max(worst, float((before[: t - 1] - after[: t - 1]).abs().max()))
    return Check("causal", worst == 0.0, f"token {t} changed: predictions before it moved by at most {worst:.3g} nats "
                 f"(one forward and the {engine.attention} path in chunks of {CHUNK})")


def _chunked(model, ids: torch.Tensor) -> Check:
    engine = _engine(model)
    streamed = engine.token_nll(ids.tolist())
    whole = _dense_nll(model, ids)
    gap = float((torch.as_tensor(streamed)[-whole.shape[0]:].float() - whole).abs().max())
    return Check("chunked = whole", gap <= TOLERANCE, f"{engine.attention} in chunks of {CHUNK} against one dense "
                 f"forward over {len(ids)} tokens: max |diff| {gap:.3g} nats per token (at most {TOLERANCE:g})")


def _far(model) -> Check:
    length = FAR * model.config.train_length
    ids = torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(1))
    engine = _engine(model)
    nll = torch.as_tensor(engine.token_nll(ids.tolist()))
    finite = bool(torch.isfinite(nll).all())
    return Check("finite far out", finite, f"{length:,} tokens ({FAR}x the training length) on {engine.attention}: "
                 f"{'every' if finite else 'not every'} log-probability finite")


def _skipping(model) -> Check:
    from bamctl.attention_math import depends_on_content

    prior = _prior(model)
    if getattr(prior, "query_dependent", False) or depends_on_content(prior):
        what = "none: the bias depends on more than the distance, so every key is read"
    elif callable(getattr(prior, "distance_table", None)):
        what = ("a key block's bias lies within the table's range over the block's distances (no monotonicity "
                "assumed); blocks whose bound is negligible against a row's largest logit are left out")
    else:
        what = "none: no bias, no block is far enough below the diagonal to leave out"
    return Check("block skipping", True, what)
