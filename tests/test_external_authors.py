"""The authors' checkpoints: their layout in, their logits out.

Each test writes ``model.pt`` + ``args.json`` exactly as the authors' ``train.py`` does
(state-dict names and shapes of their ``models/*.py``, DDP / torch.compile prefixes,
old and new prior shapes, global and per-layer priors) with random weights, loads it
through bamctl, and holds our logits to ``reference_logits`` below: a plain, dense
re-implementation of their forward pass, written from their formulas.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from bamctl.backends import RunOptions, open_backend
from bamctl.engine.stream import StreamingEngine
from bamctl.errors import BamctlError
from bamctl.backends.authors import TOKENIZER_HINT, load_authors_checkpoint

DIM, LAYERS, HEADS, VOCAB = 32, 2, 4, 96
EPS = 1e-5


# -- their architecture, dense, from their formulas ----------------------------------------
def their_slopes(n: int) -> list[float]:
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [start ** (i + 1) for i in range(n)]


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def reference_logits(family: str, P: dict, model_args: dict, tokens: torch.Tensor, scaled_distance: bool = False) -> torch.Tensor:
    """Their forward for one sequence (T,) -> (T, V); ``P`` is their prefix-free state dict.

    ``scaled_distance``: the prior as their evaluation code of mid-2025 computed it,
    ``-(|(d - mu) e^alpha| + eps)^beta``, instead of ``-(|d - mu| + eps)^beta e^alpha``.
    """
    dim, H = model_args["dim"], model_args["n_heads"]
    hd = dim // H
    kv_heads = model_args.get("n_kv_heads") or H
    T = tokens.shape[0]
    pos = torch.arange(T, dtype=torch.float32)
    rel = pos[None, :] - pos[:, None]  # [query, key] = key - query
    causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    log_keys = torch.arange(1, T + 1, dtype=torch.float32).log()[:, None]  # keys visible to each query
    x = P["tok_embeddings.weight"][tokens]
    if family.startswith("sinusoidal"):
        theta = model_args.get("sinusoidal_theta", 10_000)
        sin_div = torch.exp(torch.arange(0, dim, 2).float() * -(math.log(theta) / dim))
        cos_div = torch.exp(torch.arange(1, dim, 2).float() * -(math.log(theta) / dim))
        table = torch.zeros(T, dim)
        table[:, 0::2] = torch.sin(pos[:, None] * sin_div)
        table[:, 1::2] = torch.cos(pos[:, None] * cos_div)
        x = x + table
    for layer in range(model_args["n_layers"]):
        p = f"layers.{layer}."
        a = rms_norm(x, P[p + "attention_norm.weight"])
        q = (a @ P[p + "attention.wq.weight"].T).view(T, H, hd)
        k = (a @ P[p + "attention.wk.weight"].T).view(T, kv_heads, hd).repeat_interleave(H // kv_heads, dim=1)
        v = (a @ P[p + "attention.wv.weight"].T).view(T, kv_heads, hd).repeat_interleave(H // kv_heads, dim=1)
        if family.startswith("rotary"):
            freqs = 1.0 / (model_args.get("rope_theta", 500_000) ** (torch.arange(0, hd, 2).float() / hd))
            cis = torch.polar(torch.ones(T, hd // 2), torch.outer(pos, freqs))[:, None, :]  # (T, 1, hd/2)
            q = torch.view_as_real(torch.view_as_complex(q.reshape(T, H, -1, 2)) * cis).flatten(2)
            k = torch.view_as_real(torch.view_as_complex(k.reshape(T, H, -1, 2)) * cis).flatten(2)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        bias = torch.zeros(H, T, T)
        if family.startswith("alibi"):
            bias = -rel.abs()[None] * torch.tensor(their_slopes(H))[:, None, None]
        if family.startswith("bam"):
            prior = {n: P.get(f"{p}attention.prior.{n}", P.get(f"prior.{n}")).reshape(H, 1, 1) for n in ("theta_alpha", "theta_beta", "theta_mu")}
            b = rel[None] - (prior["theta_mu"].exp() - (-prior["theta_mu"]).exp())
            if scaled_distance:
                bias = -(((b * prior["theta_alpha"].exp()).abs() + EPS) ** prior["theta_beta"])
            else:
                bias = -((b.abs() + EPS) ** prior["theta_beta"]) * prior["theta_alpha"].exp()
        if family.endswith("_ssmax"):
            seq_scale = P[p + "attention.seq_scale"].reshape(H, 1, 1)
            if family == "bam_ssmax":  # (score + prior) * log n * s
                scores = (scores + bias) * (log_keys * seq_scale)
            else:  # score * log n * s, then the bias with the mask
                scores = scores * (log_keys * seq_scale) + bias
        else:
            scores = scores + bias
        weights = torch.softmax(scores + causal, dim=-1)
        out = (weights @ v.transpose(0, 1)).transpose(0, 1).reshape(T, dim)
        x = x + out @ P[p + "attention.wo.weight"].T
        f = rms_norm(x, P[p + "ffn_norm.weight"])
        x = x + (F.silu(f @ P[p + "feed_forward.w1.weight"].T) * (f @ P[p + "feed_forward.w3.weight"].T)) @ P[p + "feed_forward.w2.weight"].T
    return rms_norm(x, P["norm.weight"]) @ P["output.weight"].T


# -- their checkpoint layout -------------------------------------------------------------
def their_state_dict(family: str, *, seed: int, hidden: int, kv_heads: int | None = None,
                     prior_shape: str = "(H,1)", global_prior: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    hd = DIM // HEADS
    kv = (kv_heads or HEADS) * hd
    P = {"tok_embeddings.weight": rand(VOCAB, DIM, scale=1.0), "norm.weight": 1 + rand(DIM, scale=0.1), "output.weight": rand(VOCAB, DIM)}
    per_head = (HEADS, 1) if prior_shape == "(H,1)" else (1, HEADS, 1, 1)
    ssmax_shape = (1, HEADS, 1) if prior_shape == "(H,1)" else (1, HEADS, 1, 1)

    def prior(prefix: str) -> None:
        P[prefix + "theta_alpha"] = (torch.rand(HEADS, generator=g) * 3 - 2).reshape(per_head)
        P[prefix + "theta_beta"] = (torch.rand(HEADS, generator=g) * 2.2 - 0.7).reshape(per_head)  # inverted priors too
        P[prefix + "theta_mu"] = rand(HEADS, scale=0.5).reshape(per_head)

    for layer in range(LAYERS):
        p = f"layers.{layer}."
        P[p + "attention.wq.weight"] = rand(DIM, DIM)
        P[p + "attention.wk.weight"] = rand(kv, DIM)
        P[p + "attention.wv.weight"] = rand(kv, DIM)
        P[p + "attention.wo.weight"] = rand(DIM, DIM)
        P[p + "feed_forward.w1.weight"] = rand(hidden, DIM)
        P[p + "feed_forward.w2.weight"] = rand(DIM, hidden)
        P[p + "feed_forward.w3.weight"] = rand(hidden, DIM)
        P[p + "attention_norm.weight"] = 1 + rand(DIM, scale=0.1)
        P[p + "ffn_norm.weight"] = 1 + rand(DIM, scale=0.1)
        if family.endswith("_ssmax"):
            P[p + "attention.seq_scale"] = (1 + rand(HEADS, scale=0.3)).reshape(ssmax_shape)
        if family.startswith("bam") and not global_prior:
            prior(p + "attention.prior.")
    if family.startswith("bam") and global_prior:
        prior("prior.")
    return P


def write_checkpoint(folder, family: str, state: dict, *, prefix: str = "", ffn_multiplier: float | None = 2,
                     kv_heads: int | None = None, extra_model_args: dict | None = None) -> dict:
    model_args = {
        "dim": DIM, "n_layers": LAYERS, "n_heads": HEADS, "n_kv_heads": kv_heads, "vocab_size": VOCAB,
        "multiple_of": 1, "ffn_dim_multiplier": ffn_multiplier, "norm_eps": EPS, "max_batch_size": 4, "max_seq_len": 24,
        **(extra_model_args or {}),
    }
    args = {"position_encoding": family, "model_size": "custom", "sequence_length": 16, "batch_size": 4}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "args.json").write_text(json.dumps({"args": args, "model_args": model_args}, indent=4))
    torch.save({prefix + k: v for k, v in state.items()}, folder / "model.pt")
    return model_args


CASES = {
    # name: (family, state options, checkpoint options)
    "bam_ssmax": ("bam_ssmax", {}, {"prefix": "module."}),
    "bam_ssmax-old-shapes-global": ("bam_ssmax", {"prior_shape": "(1,H,1,1)", "global_prior": True}, {"prefix": "_orig_mod."}),
    "bam_ssmax-global": ("bam_ssmax", {"global_prior": True}, {"prefix": "module._orig_mod."}),
    "bam": ("bam", {"prior_shape": "(1,H,1,1)"}, {}),
    "alibi": ("alibi", {}, {}),
    "alibi_ssmax": ("alibi_ssmax", {"prior_shape": "(1,H,1,1)"}, {}),
    "rotary": ("rotary", {}, {"extra_model_args": {"rope_theta": 500_000}}),
    "rotary_ssmax-gqa": ("rotary_ssmax", {"kv_heads": 2}, {"kv_heads": 2}),
    "sinusoidal": ("sinusoidal", {}, {"extra_model_args": {"sinusoidal_theta": 10_000}}),
    "sinusoidal_ssmax": ("sinusoidal_ssmax", {}, {}),
    "nope": ("nope", {}, {"ffn_multiplier": None}),
    "nope_ssmax": ("nope_ssmax", {}, {}),
}


def build(tmp_path, name: str, seed: int = 0):
    family, state_options, options = CASES[name]
    hidden = DIM if options.get("ffn_multiplier", 2) is None else 2 * DIM
    state = their_state_dict(family, seed=seed, hidden=hidden, **state_options)
    folder = tmp_path / name
    model_args = write_checkpoint(folder, family, state, **options)
    return folder, family, state, model_args


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_their_architecture(tmp_path, name):
    folder, family, state, model_args = build(tmp_path, name)
    checkpoint = load_authors_checkpoint(folder)
    tokens = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1))  # past max_seq_len 24
    expected = reference_logits(family, state, model_args, tokens)
    with torch.no_grad():
        ours = checkpoint.model(tokens[None])[0]
    torch.testing.assert_close(ours, expected, atol=2e-4, rtol=1e-4)
    # The streaming path (KV cache, blockwise kernel, small chunks) gives the same rows.
    engine = StreamingEngine(checkpoint.model, device="cpu", dtype="float32", chunk_size=7, attention="blockwise")
    positions = [0, 5, 17, 39]
    torch.testing.assert_close(engine.logits_at(tokens.tolist(), positions), expected[positions], atol=2e-4, rtol=1e-4)


def test_config_follows_their_family_and_args(tmp_path):
    folder, *_ = build(tmp_path, "bam_ssmax")
    cfg = load_authors_checkpoint(folder).model.config
    assert (cfg.pe, cfg.ssmax, cfg.ssmax_scope) == ("bam", True, "logits")
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.train_length) == (VOCAB, DIM, LAYERS, HEADS, 16)
    assert int(cfg.ffn_dim_multiplier * cfg.dim) == 2 * DIM
    folder, *_ = build(tmp_path, "alibi_ssmax")
    assert load_authors_checkpoint(folder).model.config.ssmax_scope == "content"
    folder, *_ = build(tmp_path, "rotary")
    assert load_authors_checkpoint(folder).model.config.rope_base == 500_000


def test_global_prior_is_copied_into_every_layer(tmp_path):
    folder, _, state, _ = build(tmp_path, "bam_ssmax-global")
    model = load_authors_checkpoint(folder).model
    for layer in model.layers:
        torch.testing.assert_close(layer.attention.prior.theta_beta.data, state["prior.theta_beta"].reshape(-1))


def test_an_unknown_family_is_refused(tmp_path):
    folder, *_ = build(tmp_path, "alibi")
    data = json.loads((folder / "args.json").read_text())
    data["args"]["position_encoding"] = "bam_ssmx"
    (folder / "args.json").write_text(json.dumps(data))
    with pytest.raises(BamctlError, match="did you mean bam_ssmax"):
        load_authors_checkpoint(folder)


def _old_names(state: dict) -> dict:
    return {k.replace("theta_alpha", "scale").replace("theta_beta", "shape").replace("theta_mu", "loc"): v for k, v in state.items()}


@pytest.mark.parametrize("name, scaled", [("bam", True), ("bam_ssmax-old-shapes-global", False)])
def test_checkpoints_naming_the_prior_shape_scale_loc_load_with_their_formula(tmp_path, capsys, name, scaled):
    """Plain bam of that naming was evaluated with the scaled-distance formula (said on load);
    bam_ssmax of that naming and of May 2025 (its ModelArgs has ssmax_prior) uses the released
    one: renaming is enough. April 2025's bam_ssmax, without ssmax_prior: test_authors_args.py."""
    folder, family, state, model_args = build(tmp_path, name)
    torch.save(_old_names(state), folder / "model.pt")
    if family == "bam_ssmax":
        data = json.loads((folder / "args.json").read_text())
        data["model_args"]["ssmax_prior"] = True
        (folder / "args.json").write_text(json.dumps(data))
    checkpoint = load_authors_checkpoint(folder)
    assert checkpoint.model.config.bam_prior_form == ("scaled_distance" if scaled else "released")
    assert ("scaled" in capsys.readouterr().err) == scaled
    tokens = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = checkpoint.model(tokens[None])[0]
    torch.testing.assert_close(ours, reference_logits(family, state, model_args, tokens, scaled_distance=scaled), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("form", ["released", "scaled_distance"])
def test_either_prior_formula_on_request(tmp_path, form):
    folder, family, state, model_args = build(tmp_path, "bam")
    checkpoint = load_authors_checkpoint(folder, prior_form=form)
    tokens = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = checkpoint.model(tokens[None])[0]
    expected = reference_logits(family, state, model_args, tokens, scaled_distance=form == "scaled_distance")
    torch.testing.assert_close(ours, expected, atol=2e-4, rtol=1e-4)
    assert load_authors_checkpoint(folder).model.config.bam_prior_form == "released"  # theta names: the released one


def test_wrong_shapes_are_refused(tmp_path):
    folder, family, state, _ = build(tmp_path, "nope")
    state["layers.1.attention.wo.weight"] = state["layers.1.attention.wo.weight"][:, :-1]
    torch.save(state, folder / "model.pt")
    with pytest.raises(BamctlError, match="layers.1.attention.wo.weight"):
        load_authors_checkpoint(folder)


def test_missing_tokenizer_is_one_clear_error(tmp_path):
    folder, *_ = build(tmp_path, "bam_ssmax")
    for reference in (str(folder), f"bam:{folder}"):  # detected as a bare path, or by prefix
        with pytest.raises(BamctlError) as err:
            open_backend(reference, RunOptions(device="cpu"))
        assert str(err.value) == TOKENIZER_HINT
    with pytest.raises(BamctlError, match="does not exist"):
        open_backend(str(folder), RunOptions(device="cpu", tokenizer=str(tmp_path / "nowhere")))


def _word_tokenizer(path, n_words: int):
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed (the hf extra)")
    vocab = {"<unk>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(n_words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path))
    return path


def test_backend_runs_their_model_with_a_local_tokenizer(tmp_path):
    folder, family, state, model_args = build(tmp_path, "bam_ssmax")
    tokenizer_file = _word_tokenizer(tmp_path / "tokenizer.json", VOCAB - 2)
    backend = open_backend(str(folder), RunOptions(device="cpu", chunk_size=5, tokenizer=str(tokenizer_file)))
    assert (backend.info.pe, backend.info.ssmax, backend.info.train_length) == ("bam", True, 16)
    ids = backend.tokenizer.encode("w3 w7 w1 w40 w2 w9 w11 w5")
    assert ids == [5, 9, 3, 42, 4, 11, 13, 7]  # no BOS, no EOS
    expected = reference_logits(family, state, model_args, torch.tensor(ids))
    nll = backend.token_nll(ids, 1)
    torch.testing.assert_close(nll, F.cross_entropy(expected[:-1], torch.tensor(ids[1:]), reduction="none"), atol=2e-4, rtol=1e-4)
    score = backend.score_continuation(ids[:5], ids[5:])
    assert score.predicted_ids == expected[4:7].argmax(-1).tolist()
    # A tokenizer.json shipped inside the checkpoint folder is found without --tokenizer.
    _word_tokenizer(folder / "tokenizer.json", VOCAB - 2)
    assert open_backend(f"bam:{folder}", RunOptions(device="cpu")).tokenizer.encode("w3") == [5]


def test_tokenizer_larger_than_the_model_is_refused(tmp_path):
    folder, *_ = build(tmp_path, "nope")
    tokenizer_file = _word_tokenizer(tmp_path / "big.json", VOCAB + 10)
    with pytest.raises(BamctlError, match="Mistral-7B-v0.3"):
        open_backend(str(folder), RunOptions(device="cpu", tokenizer=str(tokenizer_file)))


def test_tokenizer_json_loads_without_transformers(tmp_path, monkeypatch):
    import sys

    from bamctl.backends.hf_tokenizer import load_hf_tokenizer

    (tmp_path / "plain").mkdir()
    tokenizer_file = _word_tokenizer(tmp_path / "plain" / "tokenizer.json", 10)
    monkeypatch.setitem(sys.modules, "transformers", None)  # tokenizers alone reads tokenizer.json
    tok = load_hf_tokenizer(tokenizer_file.parent)
    assert tok.encode("w3 w7") == [5, 9] and tok.eos_id == 1 and tok.leading_special_ids == []
    assert tok.decode([5, 9]) == "w3 w7"


def _bos_tokenizer(path, n_words: int):
    """A word-level tokenizer whose plain call puts <s> in front, as Mistral's does."""
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed (the hf extra)")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(n_words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path))
    return path


@pytest.mark.parametrize("bos", ["auto", "always", "never"])
def test_bos_follows_their_evaluation(tmp_path, bos):
    """auto: one BOS before a perplexity document (their Wikipedia evaluation), none before a
    passkey prompt; never: their FineWeb validation; the BOS is context, never scored."""
    folder, family, state, model_args = build(tmp_path, "bam_ssmax")
    tokenizer_file = _bos_tokenizer(tmp_path / "tokenizer.json", VOCAB - 3)
    backend = open_backend(str(folder), RunOptions(device="cpu", chunk_size=5, tokenizer=str(tokenizer_file), bos=bos))
    ids = [5, 9, 3, 42, 4, 11, 13, 7]
    with_bos = bos in ("auto", "always")
    fed = [1] + ids if with_bos else ids
    logits = reference_logits(family, state, model_args, torch.tensor(fed))[len(fed) - len(ids):]
    expected = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
    torch.testing.assert_close(backend.token_nll(ids, 1), expected, atol=2e-4, rtol=1e-4)
    assert backend.bos_for("nll") == with_bos and backend.bos_for("teacher_forced") == (bos == "always")
    score = backend.score_continuation(ids[:5], ids[5:])
    prompt = [1] + ids[:5] if bos == "always" else ids[:5]
    rows = reference_logits(family, state, model_args, torch.tensor(prompt + ids[5:]))[len(prompt) - 1 : -1]
    assert score.predicted_ids == rows.argmax(-1).tolist()


def test_bos_is_refused_for_bamctls_own_models():
    with pytest.raises(BamctlError, match="--bos does not apply"):
        open_backend("bam", RunOptions(bos="never"))


def test_positional_parameters_stay_float32_under_bfloat16(tmp_path):
    folder, family, state, model_args = build(tmp_path, "bam_ssmax")
    checkpoint = load_authors_checkpoint(folder)
    engine = StreamingEngine(checkpoint.model, device="cpu", dtype="bfloat16", chunk_size=8, attention="blockwise")
    positional = engine.model.positional_parameters()
    assert positional and all(p.dtype == torch.float32 for p in positional)
    assert engine.model.layers[0].attention.wq.weight.dtype == torch.bfloat16
    tokens = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(4))
    expected = reference_logits(family, state, model_args, tokens)
    got = engine.logits_at(tokens.tolist(), list(range(24)))
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.8  # bfloat16 weights, float32 prior
    torch.testing.assert_close(got, expected, atol=0.5, rtol=0.1)


def test_inspect_shows_their_checkpoint_and_its_priors(tmp_path, capsys):
    from bamctl.cli import main

    folder, family, state, _ = build(tmp_path, "bam_ssmax")
    with pytest.raises(SystemExit) as done:
        main(["inspect", f"bam:{folder}", "--json"])
    assert done.value.code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["config"]["pe"] == "bam" and shown["n_params"] > 0 and len(shown["heads"]) == LAYERS * HEADS
    beta = state["layers.1.attention.prior.theta_beta"].reshape(-1)
    assert [h["beta"] for h in shown["heads"] if h["layer"] == 1] == pytest.approx(beta.tolist())


@pytest.mark.parametrize("ssmax_prior, scope", [(True, "logits: s·log n scales content score and prior"),
                                                (False, "content: s·log n scales the content score only")])
def test_inspect_shows_where_their_ssmax_multiplies(tmp_path, capsys, ssmax_prior, scope):
    """``bamctl inspect bam:PATH`` names the SSMax scope their ``ssmax_prior`` decides (it did not)."""
    from bamctl.cli import main

    folder, *_ = build(tmp_path, "bam_ssmax")
    data = json.loads((folder / "args.json").read_text())
    data["model_args"]["ssmax_prior"] = ssmax_prior
    (folder / "args.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit) as done:
        main(["inspect", f"bam:{folder}"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"SSMax scope │ {scope}" in shown
