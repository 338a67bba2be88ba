"""The wider PE zoo: Kerple, T5's buckets and RoPE scaled at inference, against values worked out here."""

from __future__ import annotations

import math

import pytest
import torch

from bamctl.errors import BamctlError
from bamctl.positional import KerplePrior, RopeScaling, T5Prior, rope_attention_factor, rope_inverse_frequencies, t5_bucket


def test_t5_buckets_by_hand():
    # exact below 16; then 16 + floor(log(d/16) / log(128/16) * 16), at most 31
    expected = {0: 0, 1: 1, 15: 15, 16: 16, 17: 16, 32: 21, 64: 26, 100: 30, 127: 31, 128: 31, 10_000: 31}
    got = t5_bucket(torch.tensor(list(expected)))
    assert got.tolist() == list(expected.values())


def test_t5_and_kerple_tables():
    t5 = T5Prior(2)
    with torch.no_grad():
        t5.bucket_bias.copy_(torch.arange(64, dtype=torch.float32).view(2, 32))
    table = t5.distance_table(200)
    assert table[1, 0] == 32 and table[1, 17] == 48 and table[0, 200] == 31
    kerple = KerplePrior(2)
    with torch.no_grad():
        kerple.log_r1.copy_(torch.tensor([0.0, math.log(2.0)]))
        kerple.log_r2.copy_(torch.tensor([math.log(0.5), 0.0]))
    table = kerple.distance_table(10)
    assert table[0, 10].item() == pytest.approx(-math.log(1 + 0.5 * 10))
    assert table[1, 3].item() == pytest.approx(-2 * math.log(1 + 3))


def test_linear_and_ntk_by_hand():
    base_freq = 1.0 / 10000.0 ** (torch.arange(0, 64, 2).float() / 64)
    linear = rope_inverse_frequencies(64, 10000.0, RopeScaling("linear", 4.0, 128))
    assert torch.allclose(linear, base_freq / 4)
    ntk = rope_inverse_frequencies(64, 10000.0, RopeScaling("ntk", 4.0, 128))
    assert torch.allclose(ntk, 1.0 / (10000.0 * 4.0 ** (64 / 62)) ** (torch.arange(0, 64, 2).float() / 64))
    assert rope_attention_factor(RopeScaling("ntk", 4.0, 128)) == 1.0


def test_yarn_ramp_at_chosen_dimensions():
    # d = 64, base 10000, trained at 128, factor 8:
    # correction dim(r) = 64 ln(128 / (2 pi r)) / (2 ln 10000)
    # r = 32 (fast): 64 * ln(0.6366) / 18.42 = -1.57 -> floor -2 -> clamped to 0
    # r = 1 (slow): 64 * ln(20.37) / 18.42 = 10.47 -> ceil 11
    low, high = 0, 11
    freq = rope_inverse_frequencies(64, 10000.0, RopeScaling("yarn", 8.0, 128))
    base_freq = 1.0 / 10000.0 ** (torch.arange(0, 64, 2).float() / 64)
    for i in (0, 3, 5, 11, 20, 31):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep the frequency, 1: interpolate
        expected = base_freq[i] / 8 * ramp + base_freq[i] * (1 - ramp)
        assert freq[i].item() == pytest.approx(expected.item(), rel=1e-6), i
    assert rope_attention_factor(RopeScaling("yarn", 8.0, 128)) == pytest.approx(0.1 * math.log(8) + 1)


@pytest.mark.parametrize("base, factor, original", [
    (10000.0, 8.0, 128),  # the ramp inside the head: low 0, high 11
    (10.0, 4.0, 1000),  # the slow end past the head: high capped at d - 1 (63), low 22
    (100.0, 4.0, 2_000_000),  # both ends at d - 1: low == high, transformers' 0.001
    (10000.0, 2.0, 6),  # both ends at 0: low == high == 0
])
def test_yarn_equals_transformers(base, factor, original):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=1024, rope_theta=base,
        rope_scaling={"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original},
    )
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = rope_inverse_frequencies(64, base, RopeScaling("yarn", factor, original))
    assert torch.allclose(ours, theirs.float(), rtol=1e-6)
    assert attention_factor == pytest.approx(rope_attention_factor(RopeScaling("yarn", factor, original)))


def test_scaling_is_refused_for_non_rope_models_and_bad_factors():
    from bamctl.backends import RunOptions, open_backend

    with pytest.raises(BamctlError, match="applies to RoPE models"):
        open_backend("bam", RunOptions(rope_scaling="yarn", rope_factor=4.0))
    with pytest.raises(BamctlError, match="go together"):
        open_backend("rope", RunOptions(rope_scaling="yarn"))
    with pytest.raises(BamctlError, match="at least 1"):
        RopeScaling("linear", 0.5, 128)


def test_a_scaled_rope_model_is_another_model_in_the_rows(tmp_path, capsys):
    import json

    from bamctl.cli import main
    from bamctl.results.store import ResultStore

    with pytest.raises(SystemExit) as done:
        main(["compare", "rope", "rope@yarn:4", "--lengths", "256", "--samples", "1", "--dir", str(tmp_path / "r"), "--quiet", "--json"])
    assert done.value.code == 0
    (summary,) = json.loads(capsys.readouterr().out)["summaries"]
    assert summary["models"] == ["rope", "rope@yarn:4"]  # one table: the same prompts
    rows = ResultStore(tmp_path / "r").read()
    assert set(rows["rope_scaling"].fillna("")) == {"", "yarn:4"} and rows["model_hash"].nunique() == 2


def _xpos_model(seed=0):
    from bamctl.checkpoint import new_random_model
    from bamctl.model import ModelConfig

    return new_random_model(ModelConfig.from_preset("micro", "xpos", vocab_size=101), seed)


def test_xpos_is_rotary_with_the_papers_decay():
    """Dense forward against xPos written from the paper: q_i R(i) ζ^(i/γ), k_j R(j) ζ^(-j/γ)."""
    from bamctl.positional import apply_rotary, rotary_angles

    model = _xpos_model()
    attention = model.layers[0].attention
    T, H, Dh = 20, attention.n_heads, attention.head_dim
    x = model.layers[0].attention_norm(model.tok_embeddings(torch.arange(T)[None] % 101))
    q = attention.wq(x).view(1, T, H, Dh).transpose(1, 2)
    k = attention.wk(x).view(1, T, H, Dh).transpose(1, 2)
    v = attention.wv(x).view(1, T, H, Dh).transpose(1, 2)
    cos, sin = rotary_angles(torch.arange(T), Dh, model.config.rope_base)
    zeta = ((torch.arange(0, Dh, 2).float() / Dh + 0.4) / 1.4).repeat_interleave(2)
    positions = torch.arange(T).float()[:, None]
    q = apply_rotary(q, cos, sin) * zeta ** (positions / 512)
    k = apply_rotary(k, cos, sin) * zeta ** (-positions / 512)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(Dh) + torch.triu(torch.full((T, T), float("-inf")), 1)
    expected = attention.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, T, -1))
    from bamctl.model import ForwardState

    where = model.positions(0, T)
    got = attention(x, where, ForwardState())
    assert torch.allclose(got, expected, atol=1e-5)


@torch.inference_mode()
def test_xpos_never_overflows_at_long_positions():
    from bamctl.engine.cache import KVCache
    from bamctl.model import ForwardState

    model = _xpos_model(1)
    cfg = model.config
    start = 60_000  # unshifted, ζ^(-j/512) of the earliest pair would be 0.29^-117: inf in float32
    cache = KVCache(cfg.n_layers, 1, cfg.n_heads, start + 128, cfg.head_dim, torch.float32, "cpu")
    for layer in range(cfg.n_layers):
        cache.keys[layer].normal_()
        cache.values[layer].normal_()
    hidden = model.hidden(torch.arange(64)[None] % 101, start, ForwardState(cache=cache))
    assert torch.isfinite(hidden).all()


def test_fire_is_an_mlp_of_the_log_distance_over_the_log_query_position():
    from bamctl.positional import FIREPrior

    torch.manual_seed(0)
    fire = FIREPrior(4, train_length=64)
    with torch.no_grad():
        for p in fire.mlp.parameters():
            p.normal_()
        fire.log_c.fill_(math.log(0.3))
    q, k = torch.arange(0, 300), torch.arange(0, 300)
    c, L = 0.3, 64.0
    d = (q[:, None] - k[None, :]).clamp(min=0).float()
    x = torch.log(c * d + 1) / torch.log(c * torch.maximum(torch.tensor(L), q.float()) + 1)[:, None]
    hidden = torch.relu(x[..., None] * fire.mlp[0].weight[:, 0] + fire.mlp[0].bias)
    expected = (hidden @ fire.mlp[2].weight.T + fire.mlp[2].bias).permute(2, 0, 1)  # written out, not the module
    with torch.no_grad():
        exact = fire.bias(q, k)  # the piecewise-linear evaluation
    assert torch.allclose(exact, expected, atol=1e-5)
    assert torch.allclose(fire.bias(q, k), expected, atol=1e-5)  # with gradients: the MLP itself
    # Past L the same distance reads another bias at another query position: not a 1-D table.
    assert not torch.allclose(exact[:, 100, 90], exact[:, 290, 280])
    assert torch.allclose(exact[:, 30, 20], exact[:, 50, 40])  # below L: the distance alone


def _fire(heads: int, train_length: int, seed: int, breaks_inside: bool = False):
    """A FIRE prior with random weights (c = 0.3). ``breaks_inside``: every hidden unit switches
    on or off inside x in (0, 1), some at the same x, so a row crosses all 33 pieces."""
    from bamctl.positional import FIREPrior

    generator = torch.Generator().manual_seed(seed)
    fire = FIREPrior(heads, train_length=train_length)
    with torch.no_grad():
        for p in fire.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
        fire.log_c.fill_(math.log(0.3))
        if breaks_inside:
            breaks = torch.rand(FIREPrior.HIDDEN, generator=generator)
            breaks[6], breaks[8:10] = breaks[5], breaks[7]  # repeated breakpoints: empty pieces
            fire.mlp[0].bias.copy_(-breaks * fire.mlp[0].weight[:, 0])
            fire.mlp[2].weight.mul_(3)  # biases spanning several logits
    return fire


FIRE_SHAPES = [  # (keys, queries): queries at q_start = keys - queries, L = 64
    (50, 50),  # every query at or below L at first, then past it
    (700, 700),  # a whole prompt, three query blocks of 256
    (900, 300),  # a later chunk: every normaliser ψ(i) differs
    (513, 1),  # one decoding step, one key past a key block
    (2000, 1000),  # four key blocks, the last query block partial
]
FIRE_CASES = [(None, "logits"), ("ssmax", "logits"), ("ssmax", "content")]


@pytest.mark.parametrize("breaks_inside", [False, True])
@pytest.mark.parametrize("keys,queries", FIRE_SHAPES)
@pytest.mark.parametrize("ssmax,scope", FIRE_CASES)
@torch.inference_mode()
def test_native_fire_equals_the_dense_reference(keys, queries, ssmax, scope, breaks_inside):
    from bamctl.engine import native
    from bamctl.attention_math import AttentionInputs, dense_attention

    built, why = native.native_available()
    if not built:
        pytest.skip(f"the C++ kernel did not build here: {why}")
    heads, head_dim = 3, 16
    fire = _fire(heads, 64, keys + queries, breaks_inside)
    generator = torch.Generator().manual_seed(keys * queries)
    k, v = (torch.randn(2, heads, keys, head_dim, generator=generator) for _ in range(2))
    q = torch.randn(2, heads, queries, head_dim, generator=generator)
    if breaks_inside:
        q.zero_()  # no content: the output is softmax(bias) . v, so a key on the wrong piece shows
    inputs = AttentionInputs(
        q_start=keys - queries,
        bias_table=None,
        ssmax_scale=torch.rand(heads, generator=generator) + 0.5 if ssmax else None,
        ssmax_scope=scope,
        query_prior=fire,
    )
    got, expected = native.native_attention(q, k, v, inputs), dense_attention(q, k, v, inputs)
    assert got.dtype == torch.float32
    assert torch.allclose(got, expected, atol=1e-4, rtol=0), (got - expected).abs().max()


def test_auto_runs_fire_on_the_native_kernel_else_blockwise(monkeypatch):
    from bamctl.checkpoint import new_random_model
    from bamctl.engine import stream
    from bamctl.engine.stream import StreamingEngine
    from bamctl.model import ModelConfig

    model = new_random_model(ModelConfig.from_preset("micro", "fire-ssmax", vocab_size=101), 0)
    built, _ = stream.native_available()
    assert StreamingEngine(model, device="cpu", attention="auto").attention == ("native" if built else "blockwise")
    with pytest.raises(BamctlError, match="depends on the query position too"):
        StreamingEngine(model, device="cpu", attention="fused")
    monkeypatch.setattr(stream, "native_available", lambda: (False, "g++: command not found"))
    assert StreamingEngine(model, device="cpu", attention="auto").attention == "blockwise"


def test_embedding_scale_multiplies_the_token_embeddings_before_the_sinusoids_are_added():
    # Vaswani et al. (2017, section 3.4): embeddings times sqrt(d_model), then the sinusoids.
    from bamctl.checkpoint import new_random_model
    from bamctl.model import ModelConfig

    plain = ModelConfig.from_preset("micro", "sinusoidal", vocab_size=50, train_length=32, embedding_scale=1.0)
    scaled = ModelConfig.from_preset("micro", "sinusoidal", vocab_size=50, train_length=32, embedding_scale=8.0)
    model, reference = new_random_model(scaled, seed=0), new_random_model(plain, seed=0)
    with torch.no_grad():
        reference.tok_embeddings.weight.mul_(8.0)  # the same model, with the factor folded into the table
    tokens = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(tokens), reference(tokens), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(model(tokens), new_random_model(plain, seed=0)(tokens), atol=1e-3)


def test_a_new_sinusoidal_model_scales_its_embeddings_by_sqrt_dim_as_its_paper():
    import math

    from bamctl.model import ModelConfig

    assert ModelConfig.from_preset("tiny", "sinusoidal").embedding_scale == math.sqrt(128)
    assert ModelConfig.from_preset("micro", "sinusoidal", dim=32).embedding_scale == math.sqrt(32)
    assert ModelConfig.from_preset("micro", "sinusoidal", embedding_scale=2.0).embedding_scale == 2.0
    for pe in ("nope", "rope", "alibi", "bam-ssmax", "t5"):
        assert ModelConfig.from_preset("tiny", pe).embedding_scale == 1.0
    # a checkpoint saved before the field existed was trained without the factor
    saved = ModelConfig.from_preset("tiny", "sinusoidal").to_dict()
    del saved["embedding_scale"]
    assert ModelConfig.from_dict(saved).embedding_scale == 1.0


def test_embedding_scale_must_be_positive():
    from bamctl.model import ModelConfig

    with pytest.raises(BamctlError, match="embedding_scale"):
        ModelConfig.from_preset("micro", "sinusoidal", embedding_scale=0.0)


def _example_pe(file: str, name: str):
    """A class of examples/positional/FILE, imported from its file as a plugin is."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "positional" / file
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


# What the engine asks of a PE before it picks a path: does it add to the logits at all
# (gives_bias), is it a scan over key blocks nearest first (scans_content), pair by pair
# (pairs_content), and must each tile of scores be shown to it (depends_on_content).
PE_KINDS = {
    ("rope.py", "RoPE"): (False, False, False, False),  # rotates q and k; adds nothing
    ("alibi.py", "ALiBi"): (True, False, False, False),  # a table by distance
    ("sandwich.py", "Sandwich"): (True, False, False, False),
    ("cope.py", "CoPE"): (True, True, False, True),  # counts gates from the nearest key outwards
    ("cable.py", "Cable"): (True, False, True, True),  # a pair_bias reading q and k
    ("forgetting.py", "ForgettingGate"): (True, False, True, True),
    ("score_mods.py", "GymALiBi"): (True, False, True, True),  # a FlexAttention score_mod may read anything
}


@pytest.mark.parametrize("where", list(PE_KINDS), ids=lambda where: where[1])
def test_what_kind_of_prior_each_example_pe_is(where):
    from bamctl.attention_math import depends_on_content, gives_bias, pairs_content, scans_content

    if where[0] == "score_mods.py":
        pytest.importorskip("attn_gym", reason="attn-gym not installed (the dev extra)")
    pe = _example_pe(*where)
    assert (gives_bias(pe), scans_content(pe), pairs_content(pe), depends_on_content(pe)) == PE_KINDS[where]


def test_the_zoos_biases_are_its_distance_and_query_priors():
    """Of the zoo, the PEs that add to the logits are the distance priors and FIRE (by query
    position); the rotations and the input embeddings add nothing, and none reads content."""
    from bamctl.attention_math import depends_on_content, gives_bias, scans_content
    from bamctl.positional import PE_REGISTRY

    adds = {name for name, spec in PE_REGISTRY.items() if gives_bias(spec.module)}
    assert adds == {"alibi", "kerple", "t5", "fire", "bam"}
    assert {name for name, spec in PE_REGISTRY.items() if spec.gives_bias} == adds
    assert not any(scans_content(spec.module) or depends_on_content(spec.module) for spec in PE_REGISTRY.values())


@pytest.mark.parametrize("flags, adds", [
    ({"query_dependent": True}, True),
    ({"content_dependent": True}, True),
    ({"distance_table": lambda self, n: None}, True),
    ({"score_mod": lambda self, *args: args[0]}, True),
    ({"query_dependent": False, "content_dependent": False}, False),
    ({"distance_table": "not a hook"}, False),
    ({"content_scan": "not a hook", "content_dependent": True}, True),
])
def test_a_prior_gives_a_bias_by_any_one_of_its_hooks(flags, adds):
    from bamctl.attention_math import gives_bias, scans_content

    pe = type("PE", (), flags)
    assert gives_bias(pe) is adds
    assert scans_content(pe) is False  # only a callable content_scan is a scan (CoPE's, above)


def test_bamctl_models_lists_every_zoo_pe_with_what_it_is(capsys, monkeypatch):
    """`bamctl models` is where a user finds the names --pe takes: one row per zoo PE, its name
    beside its own one-line description, in the zoo's order (``_zoo`` builds the registry)."""
    import re

    from bamctl.checkpoint import new_random_model
    from bamctl.cli import main
    from bamctl.model import ModelConfig
    from bamctl.positional import _zoo

    monkeypatch.setenv("COLUMNS", "250")
    with pytest.raises(SystemExit) as exited:
        main(["models"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "bamctl new --pe NAME; NAME-ssmax adds Scalable-Softmax" in out
    listed = re.findall(r"^│ (\S+)\s+│ (.+?)\s+│$", out.split("positional encodings (bamctl new --pe")[1], re.M)
    assert listed == [(name, spec.summary) for name, spec in _zoo().items()]
    assert all(spec.name == name and spec.summary for name, spec in _zoo().items())
    for name, spec in _zoo().items():  # and the class a model named by it builds in each layer
        assert type(new_random_model(ModelConfig.from_preset("micro", name), 0).layers[0].attention.prior) is spec.module


def test_each_prior_describes_its_parameters_per_head():
    """What `bamctl inspect` prints per head, from parameters set here and worked out by hand."""
    from bamctl.positional import ALiBiPrior, FIREPrior, GGDPrior

    assert ALiBiPrior(8).describe()["slope"].tolist() == [2.0 ** -(h + 1) for h in range(8)]
    kerple = KerplePrior(2)
    with torch.no_grad():
        kerple.log_r1.copy_(torch.tensor([0.0, math.log(2.0)]))
        kerple.log_r2.copy_(torch.tensor([math.log(0.5), math.log(3.0)]))
    shown = kerple.describe()
    assert shown.keys() == {"r1", "r2"}
    assert shown["r1"].tolist() == pytest.approx([1.0, 2.0]) and shown["r2"].tolist() == pytest.approx([0.5, 3.0])
    t5 = T5Prior(2)
    with torch.no_grad():
        t5.bucket_bias.copy_(torch.arange(64, dtype=torch.float32).view(2, 32))
    shown = t5.describe()
    assert list(shown) == ["b(0)", "b(16)", "b(128+)"]  # the exact, first log-spaced and last (farthest) buckets
    assert [v.tolist() for v in shown.values()] == [[0, 32], [16, 48], [31, 63]]
    fire = FIREPrior(3, train_length=64)
    with torch.no_grad():
        fire.threshold.fill_(-50.0)  # L enters as |L|
    shown = fire.describe()
    assert shown["c"].tolist() == pytest.approx([0.1] * 3) and shown["L"].tolist() == [50.0] * 3
    bam = GGDPrior(3, train_mu=True)
    with torch.no_grad():
        bam.theta_alpha.copy_(torch.tensor([math.log(2.0), 0.5, 0.3]))
        bam.theta_beta.copy_(torch.tensor([1.0, 2.0, 0.0]))
        bam.theta_mu.copy_(torch.tensor([0.0, math.log(2.0), -math.log(2.0)]))
    shown = bam.describe()
    assert list(shown) == ["alpha", "beta", "mu", "scale"]
    # alpha = exp(-theta_alpha / beta): ALiBi slope 2 is alpha 1/2; beta = 0 (flat) is alpha inf
    assert shown["alpha"].tolist() == pytest.approx([0.5, math.exp(-0.25), math.inf])
    assert shown["beta"].tolist() == [1.0, 2.0, 0.0]
    assert shown["mu"].tolist() == pytest.approx([0.0, 1.5, -1.5])  # e^theta - e^-theta
    assert shown["scale"].tolist() == pytest.approx([2.0, math.exp(0.5), math.exp(0.3)])


def test_xpos_scale_by_hand():
    """ζ_k = (2k/d + 0.4) / 1.4 per rotary pair, both channels of a pair alike, raised to offset / 512."""
    from bamctl.positional import xpos_scale

    zeta = [2 / 7, 13 / 28, 9 / 14, 23 / 28]  # d = 8: pairs 0, 2, 4, 6
    scale = xpos_scale(torch.tensor([0, 512, -1024, 256]), 8)
    assert scale.dtype == torch.float32 and scale.shape == (4, 8)
    for row, power in zip(scale.tolist(), [0, 1, -2, 0.5]):
        assert row == pytest.approx([z**power for z in zeta for _ in range(2)], rel=1e-6)


def test_rope_scaling_refuses_an_unknown_kind_and_a_factor_below_one():
    assert RopeScaling("linear", 1.0, 128).label == "linear:1" and RopeScaling("yarn", 1.5, 128).label == "yarn:1.5"
    with pytest.raises(BamctlError, match=r"unknown RoPE scaling 'dynamic'; use one of linear, ntk, yarn$"):
        RopeScaling("dynamic", 2.0, 128)
    with pytest.raises(BamctlError, match=r"^--rope-factor must be at least 1, not 0.5$"):
        RopeScaling("ntk", 0.5, 128)


def test_fires_kernel_form_is_the_line_of_every_distance_and_each_querys_norm():
    """What the native kernel reads: ψ(d) for d = 0..max_distance (no more), ψ(max(L, i)) per query."""
    fire = _fire(3, 64, seed=4)
    queries = torch.tensor([10, 64, 200])
    form = fire.kernel_form(queries, 250)
    assert torch.equal(form.line, fire.psi(torch.arange(251)))
    assert torch.equal(form.query_norm, fire.psi(torch.tensor([64, 64, 200])))


def test_sinusoids_by_hand_in_both_layouts():
    """sin on even channels, cos on odd ones; Vaswani's pair shares base^(-2k/d), the authors' layout
    gives channel c its own base^(-c/d). Defaults: Vaswani's, base 10000."""
    from bamctl.positional import sinusoidal_encoding

    positions, dim = [0, 1, 7, 1000], 6
    for base, layout in ((10000.0, "vaswani"), (100.0, "vaswani"), (10000.0, "bam"), (100.0, "bam")):
        exponent = (lambda c: c - c % 2) if layout == "vaswani" else (lambda c: c)
        expected = [[(math.sin if c % 2 == 0 else math.cos)(p * base ** (-exponent(c) / dim)) for c in range(dim)]
                    for p in positions]
        got = sinusoidal_encoding(torch.tensor(positions), dim, base, layout)
        assert got.dtype == torch.float32 and torch.allclose(got, torch.tensor(expected), atol=2e-4), (base, layout)
    assert torch.equal(sinusoidal_encoding(torch.tensor(positions), dim), sinusoidal_encoding(torch.tensor(positions), dim, 10000.0, "vaswani"))
    with pytest.raises(BamctlError, match=r"unknown sinusoidal layout 'authors'; use one of vaswani, bam$"):
        sinusoidal_encoding(torch.tensor(positions), dim, layout="authors")


def test_the_sinusoidal_pe_adds_its_layouts_encoding_in_the_embeddings_dtype():
    from bamctl.model import ModelConfig
    from bamctl.positional import Sinusoidal, sinusoidal_encoding

    config = ModelConfig.from_preset("micro", "sinusoidal", sinusoidal_layout="bam", sinusoidal_base=500.0)
    h, positions = torch.randn(2, 5, config.dim).bfloat16(), torch.arange(40, 45)
    embedded = Sinusoidal(config).embed(h, positions)
    assert embedded.dtype == torch.bfloat16
    assert torch.equal(embedded, h + sinusoidal_encoding(positions, config.dim, 500.0, "bam").bfloat16())


def test_pe_label_adds_the_ssmax_suffix_only_with_ssmax():
    from bamctl.positional import pe_label

    assert pe_label("bam", True) == "bam-ssmax" and pe_label("rope", False) == "rope"


@pytest.mark.parametrize("start, queries", [(300, 11), (777, 1)])
def test_xpos_decays_each_channel_by_the_distance_whatever_the_chunks_first_query(start, queries):
    """After the cache, q'_i · k'_j per channel is q_i k_j ζ_c^((i - j)/512): a later chunk (its own
    reference position) and one decoding step (a single query) as well as the first chunk."""
    from bamctl.model import ModelConfig
    from bamctl.positional import XPos

    xpos = XPos(ModelConfig.from_preset("micro", "xpos"))
    Dh = xpos.head_dim
    generator = torch.Generator().manual_seed(start)
    q, k = torch.randn(1, 2, queries, Dh, generator=generator), torch.randn(1, 2, start + queries, Dh, generator=generator)
    q_positions, k_positions = torch.arange(start, start + queries), torch.arange(start + queries)
    q2, k2 = xpos.transform_qk_after_cache(q, k, q_positions, k_positions)
    zeta = ((torch.arange(0, Dh, 2).float() / Dh + 0.4) / 1.4).repeat_interleave(2)  # (Dh,)
    distance = (q_positions[:, None] - k_positions[None, :]).float()  # (Tq, Tk)
    expected = q[..., :, None, :] * k[..., None, :, :] * zeta ** (distance[..., None] / 512)
    assert torch.allclose(q2[..., :, None, :] * k2[..., None, :, :], expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("weights", ["breaks_inside", "a_flat_unit_and_a_unit_weight", "all_flat"])
def test_fires_pieces_are_its_mlp_below_between_and_past_every_breakpoint(weights):
    """The piecewise evaluation (no gradients) against the MLP written out, for x from below the first
    breakpoint (x = 0: the diagonal) to past the last: breakpoints packed in (0, 1), a hidden unit of
    weight 0 (a constant, no breakpoint) beside one of weight exactly 1, and no breakpoint at all."""
    fire = _fire(3, 64, seed=9, breaks_inside=True)
    with torch.no_grad():
        if weights == "a_flat_unit_and_a_unit_weight":
            fire.mlp[0].weight[:2, 0] = torch.tensor([0.0, 1.0])
            fire.mlp[0].bias[:2] = torch.tensor([0.7, -0.5])
        elif weights == "all_flat":
            fire.mlp[0].weight.zero_()
    x = torch.linspace(0, 1.2, 601)[:, None]  # (Tq, Tk) = (601, 1)
    first, second = fire.mlp[0], fire.mlp[2]
    expected = (torch.relu(x[..., None] * first.weight[:, 0] + first.bias) @ second.weight.T + second.bias).permute(2, 0, 1)
    breaks, slopes, offsets = fire.piecewise()
    segment = torch.bucketize(x, breaks)
    got = slopes[:, segment] * x[None] + offsets[:, segment]
    assert torch.allclose(got, expected.detach(), atol=1e-5)
    assert len(breaks) == {"breaks_inside": 32, "a_flat_unit_and_a_unit_weight": 31, "all_flat": 0}[weights]


def test_alibi_slopes_by_the_papers_rule_for_any_head_count():
    """A power of two n: 2^(-8/n), its square, ... (ALiBi's geometric sequence); otherwise the
    largest power of two below n, then every other slope of twice that many heads."""
    from bamctl.positional import alibi_slopes

    assert alibi_slopes(8) == [2.0 ** -(h + 1) for h in range(8)]
    assert alibi_slopes(4) == [2.0 ** -(2 * (h + 1)) for h in range(4)]
    assert alibi_slopes(6) == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    assert alibi_slopes(12) == pytest.approx([2.0 ** -(h + 1) for h in range(8)] + [2.0 ** -(h + 0.5) for h in (0, 1, 2, 3)])


@pytest.mark.parametrize("form", ["released", "scaled_distance"])
def test_the_ggd_prior_by_hand_in_both_forms(form):
    """bias(d) = -(|d - mu| + eps)^beta e^alpha (released) or -(|(d - mu) e^alpha| + eps)^beta, from
    theta set here: beta 1, 2, 0.5, 0 and -8 (whose power at d = mu would overflow: capped at -e^80)."""
    from bamctl.positional import GGD_EPS, LOG_BIAS_CAP, GGDPrior

    prior = GGDPrior(5, train_mu=True, form=form)
    alpha, beta, theta_mu = [0.5, -1.0, 0.2, 0.3, 0.0], [1.0, 2.0, 0.5, 0.0, -8.0], [0.0, 0.0, math.log(2.0), 0.0, 0.0]
    with torch.no_grad():
        prior.theta_alpha.copy_(torch.tensor(alpha))
        prior.theta_beta.copy_(torch.tensor(beta))
        prior.theta_mu.copy_(torch.tensor(theta_mu))
    table = prior.distance_table(9)
    assert table.shape == (5, 10) and table.dtype == torch.float32
    for h in range(5):
        mu = math.exp(theta_mu[h]) - math.exp(-theta_mu[h])  # 1.5 for head 2: the authors' offset j - i = -d
        for d in range(10):
            shifted = -d - mu
            if form == "released":
                log_magnitude = beta[h] * math.log(abs(shifted) + GGD_EPS) + alpha[h]
            else:
                log_magnitude = beta[h] * math.log(abs(shifted * math.exp(alpha[h])) + GGD_EPS)
            expected = -math.exp(min(log_magnitude, LOG_BIAS_CAP))
            assert table[h, d].item() == pytest.approx(expected, rel=1e-5), (h, d)
    assert table[4, 0].item() == pytest.approx(-math.exp(80.0), rel=1e-5)  # capped, finite


def test_the_ggd_priors_inits_and_refusals():
    from bamctl.model import ModelConfig
    from bamctl.positional import GGDPrior, alibi_slopes

    flat = GGDPrior(4)
    assert flat.theta_alpha.tolist() == [0.0] * 4 and flat.theta_beta.tolist() == [0.0] * 4 and flat.form == "released"
    assert flat.theta_mu.tolist() == [0.0] * 4 and not flat.theta_mu.requires_grad and flat.theta_beta.requires_grad
    assert GGDPrior(4, train_mu=True).theta_mu.requires_grad
    alibi = GGDPrior(4, init="alibi")
    assert torch.allclose(alibi.theta_alpha.exp(), torch.tensor(alibi_slopes(4))) and alibi.theta_beta.tolist() == [1.0] * 4
    linear = GGDPrior(4, init="alibi-linear")
    assert torch.allclose(linear.theta_alpha.exp(), torch.tensor(alibi_slopes(4)))
    assert linear.theta_beta.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    config = ModelConfig.from_preset("micro", "bam", bam_init="alibi-linear", bam_train_mu=True, bam_prior_form="scaled_distance")
    built = GGDPrior.from_config(config)
    assert built.form == "scaled_distance" and built.theta_mu.requires_grad and built.theta_beta.shape == (config.n_heads,)
    assert built.theta_beta[-1].item() == 1.0 and built.theta_beta[0].item() == 0.0
    with pytest.raises(BamctlError, match=r"^unknown BAM prior form 'paper'; use one of released, scaled_distance$"):
        GGDPrior(4, form="paper")
    with pytest.raises(BamctlError, match=r"^unknown BAM init 'rope'; use 'flat', 'alibi' or 'alibi-linear'$"):
        GGDPrior(4, init="rope")


def test_rotary_by_hand():
    """Pairs (0, 1), (2, 3), ... rotated by p·base^(-2k/d), as Meta's Llama code does; YaRN multiplies
    cos and sin by 0.1 ln(factor) + 1; the input's dtype comes back."""
    from bamctl.positional import apply_rotary, rotary_angles

    positions, base, Dh = torch.tensor([0, 3, 1000]), 100.0, 4
    cos, sin = rotary_angles(positions, Dh, base)
    angles = [[p * base ** (-2 * k / Dh) for k in range(Dh // 2)] for p in (0, 3, 1000)]
    assert torch.allclose(cos, torch.tensor(angles).cos()) and torch.allclose(sin, torch.tensor(angles).sin())
    yarn = RopeScaling("yarn", 4.0, 64)
    scaled_cos, scaled_sin = rotary_angles(positions, Dh, base, yarn)
    factor = 0.1 * math.log(4.0) + 1
    scaled = positions.float()[:, None] * rope_inverse_frequencies(Dh, base, yarn)[None, :]
    assert torch.allclose(scaled_cos, scaled.cos() * factor) and torch.allclose(scaled_sin, scaled.sin() * factor)
    x = torch.tensor([[[[1.0, 2.0, 3.0, 4.0]] * 3]])  # (1, 1, 3, 4)
    rotated = apply_rotary(x, cos, sin)
    for t in range(3):
        for k, (even, odd) in enumerate(((1.0, 2.0), (3.0, 4.0))):
            c, s = math.cos(angles[t][k]), math.sin(angles[t][k])
            assert rotated[0, 0, t, 2 * k].item() == pytest.approx(even * c - odd * s, abs=1e-5)
            assert rotated[0, 0, t, 2 * k + 1].item() == pytest.approx(even * s + odd * c, abs=1e-5)
    assert apply_rotary(x.bfloat16(), cos, sin).dtype == torch.bfloat16


@pytest.mark.parametrize("q_positions", [[5, 6], [6], [10, 11], [0, 1]])
def test_rope_rotates_queries_and_keys_each_by_its_own_position(q_positions):
    """The chunk's queries at the keys' last positions (the usual case, angles shared) or anywhere else."""
    from bamctl.model import ModelConfig
    from bamctl.positional import RoPE, apply_rotary, rotary_angles

    config = ModelConfig.from_preset("micro", "rope", rope_base=5000.0)
    rope = RoPE(config)
    assert (rope.head_dim, rope.base, rope.rope_scaling) == (config.head_dim, 5000.0, None)  # unscaled until the engine says
    rope.rope_scaling = RopeScaling("linear", 2.0, 128)
    Dh = rope.head_dim
    q_at, k_at = torch.tensor(q_positions), torch.arange(7)
    q, k = torch.randn(1, 2, len(q_positions), Dh), torch.randn(1, 2, 7, Dh)
    q2, k2 = rope.transform_qk(q, k, q_at, k_at)
    assert torch.equal(q2, apply_rotary(q, *rotary_angles(q_at, Dh, rope.base, rope.rope_scaling)))
    assert torch.equal(k2, apply_rotary(k, *rotary_angles(k_at, Dh, rope.base, rope.rope_scaling)))


def test_check_plugin_names_what_it_was_given_and_what_is_missing():
    from torch import nn

    from bamctl.positional import check_plugin

    def not_a_class():
        pass

    class Plain:
        def distance_table(self, d):
            pass

    with pytest.raises(BamctlError, match=r"^positional encoding x is a function, not a torch.nn.Module class$"):
        check_plugin(not_a_class, "positional encoding x")
    with pytest.raises(BamctlError, match=r"^positional encoding x is a type, not a torch.nn.Module class$"):
        check_plugin(Plain, "positional encoding x")
    with pytest.raises(BamctlError) as refused:
        check_plugin(type("Content", (nn.Module,), {"content_dependent": True}), "positional encoding x")
    assert str(refused.value) == ("positional encoding x says content_dependent = True but has none of its hooks: "
                                  "content_bias(q, scores, q_positions, k_positions), content_scan(q, scores, q_positions, "
                                  "k_positions, carry), pair_bias(q, k, q_positions), score_mod(score, b, h, q_idx, kv_idx)")
    with pytest.raises(BamctlError, match=r"^positional encoding x says query_dependent = True but has no bias\(q_positions, k_positions\) hook$"):
        check_plugin(type("Query", (nn.Module,), {"query_dependent": True}), "positional encoding x")
    with pytest.raises(BamctlError, match=r"^positional encoding x has no hook of the PE protocol: give it distance_table"):
        check_plugin(type("Nothing", (nn.Module,), {}), "positional encoding x")
    check_plugin(type("Empty", (nn.Module,), {"changes_nothing": True}), "positional encoding x")  # NoPE's case
    for hook in ("content_bias", "content_scan", "pair_bias", "score_mod"):  # any one of a content bias's hooks
        check_plugin(type("Content", (nn.Module,), {"content_dependent": True, hook: lambda self, *a: None}), "x")
    check_plugin(type("Query", (nn.Module,), {"query_dependent": True, "bias": lambda self, q, k: None}), "x")


@pytest.mark.parametrize("table, message", [
    ([[0.0] * 8] * 4, "gave a list, not a tensor of shape (4, 8)"),
    (torch.zeros(4, 7), "gave shape (4, 7), not (4, 8) (one row per head, one column per distance 0..7)"),
    (torch.zeros(3, 8), "gave shape (3, 8), not (4, 8) (one row per head, one column per distance 0..7)"),
    (torch.zeros(4, 8, dtype=torch.long), "gave int64, not a floating-point tensor (float32)"),
    (torch.full((4, 8), float("-inf")), "holds values that are not finite (inf or nan); a key to leave out takes a large "
                                        "finite negative (the zoo caps at -5.5e34)"),
    (torch.full((4, 8), float("nan")), "holds values that are not finite (inf or nan)"),
])
def test_a_distance_table_is_held_to_its_shape_dtype_and_finite_values(table, message):
    from bamctl.positional import check_distance_table

    with pytest.raises(BamctlError) as refused:
        check_distance_table(table, 4, 7, "positional encoding x")
    assert str(refused.value).startswith(f"positional encoding x: distance_table(7) {message}")
    check_distance_table(torch.zeros(4, 8), 4, 7, "x")
    check_distance_table(torch.full((4, 8), -5.5e34), 4, 7, "x")  # finite, however large
    if "finite" in message:  # values=False reads shape and dtype only
        check_distance_table(table, 4, 7, "x", values=False)


def test_check_bias_hooks_asks_each_table_once_and_refuses_a_second_kind_of_bias():
    from torch import nn

    from bamctl.positional import PROBE_DISTANCE, check_bias_hooks

    asked = []

    class Table(nn.Module):
        def distance_table(self, max_distance):
            asked.append((max_distance, torch.is_grad_enabled()))
            return torch.zeros(2, max_distance + 1)

    check_bias_hooks(Table(), 2, "x")
    assert asked == [(PROBE_DISTANCE, False)] and PROBE_DISTANCE > 0
    with pytest.raises(BamctlError, match=r"^x: distance_table\(7\) gave shape \(2, 8\), not \(3, 8\)"):
        check_bias_hooks(Table(), 3, "x")
    check_bias_hooks(nn.Module(), 2, "x")  # no table: nothing to ask
    for flag, hook in (("query_dependent", "bias"), ("content_dependent", "its content hook")):
        with pytest.raises(BamctlError) as refused:
            check_bias_hooks(type("Both", (Table,), {flag: True})(), 2, "positional encoding x")
        assert str(refused.value) == (f"positional encoding x has distance_table and {flag} = True: a layer's bias is one "
                                      f"kind, so the table would be lost; add b_h(i - j) inside {hook}, or drop distance_table")
    with pytest.raises(BamctlError) as refused:
        check_bias_hooks(type("Both", (Table,), {"score_mod": lambda self, *a: None})(), 2, "positional encoding x")
    assert str(refused.value) == ("positional encoding x has distance_table and score_mod: a layer's bias is one kind, so "
                                  "the table would be lost; add b_h(q_idx - kv_idx) inside score_mod, or drop distance_table")
