"""Positional encodings of the user's own, found by reference (``bamctl.pe_plugins.pe_spec``): a
file, a module path or an installed package's entry point, wherever a PE is named; recorded in the
checkpoint; held to the zoo's own ALiBi where the example restates it."""

from __future__ import annotations

import math
import shutil
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

import bamctl
from bamctl.checkpoint import load_checkpoint, new_random_model, save_checkpoint
from bamctl.errors import BamctlError
from bamctl.local_code import local_code
from bamctl.model import ModelConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "positional"
ALIBI = f"{EXAMPLES / 'alibi.py'}:ALiBi"
SANDWICH = f"{EXAMPLES / 'sandwich.py'}:Sandwich"


def _model(pe: str, seed: int = 0):
    return new_random_model(ModelConfig.from_preset("micro", pe, train_length=128), seed)


def test_alibi_restated_as_a_plugin_has_the_zoos_weights_logits_and_rows(tmp_path):
    zoo, plugin = _model("alibi"), _model(ALIBI)
    assert zoo.state_dict().keys() == plugin.state_dict().keys()
    assert all(torch.equal(zoo.state_dict()[k], plugin.state_dict()[k]) for k in zoo.state_dict())
    ids = torch.randint(0, 50257, (2, 300), generator=torch.Generator().manual_seed(0))
    assert torch.equal(zoo(ids), plugin(ids))
    paths = [str(save_checkpoint(m, tmp_path / name)) for m, name in ((zoo, "zoo"), (plugin, "plugin"))]
    columns = ["length", "seed", "sample", "depth", "predicted", "score"]
    for task, extra in (("passkey", {"samples": 2, "depths": [0.0, 0.5]}), ("ppl", {})):
        rows = [bamctl.evaluate(p, task=task, lengths="256,1k", dir=tmp_path / task, quiet=True, **extra) for p in paths]
        keep = columns + (["nll"] if task == "ppl" else [])
        a, b = (r[keep].sort_values(columns[:4]).reset_index(drop=True) for r in rows)
        pd.testing.assert_frame_equal(a, b)  # the same numbers, on the native kernel the run chose
        assert rows[0]["model_hash"].iloc[0] != rows[1]["model_hash"].iloc[0]  # two models by name and source


def test_a_plugin_checkpoint_records_its_source_and_loads_from_anywhere(tmp_path, monkeypatch):
    shutil.copy(EXAMPLES / "sandwich.py", tmp_path / "my_pe.py")
    monkeypatch.chdir(tmp_path)
    model = _model("./my_pe.py:Sandwich-ssmax")
    assert model.config.pe == "./my_pe.py:Sandwich" and model.config.ssmax
    assert model.config.pe_source["text"] == (tmp_path / "my_pe.py").read_text()
    folder = save_checkpoint(model, tmp_path / "ckpt")
    monkeypatch.chdir("/")  # the relative name no longer reaches the file: where it was found does
    loaded = load_checkpoint(folder)
    ids = torch.randint(0, 50257, (1, 64))
    assert torch.equal(loaded.model(ids), model(ids))


def test_an_edited_or_missing_plugin_is_one_line_when_its_checkpoint_loads(tmp_path):
    shutil.copy(EXAMPLES / "sandwich.py", tmp_path / "my_pe.py")
    folder = save_checkpoint(_model(f"{tmp_path / 'my_pe.py'}:Sandwich"), tmp_path / "ckpt")
    source = tmp_path / "my_pe.py"
    source.write_text(source.read_text().replace("8.0 / config.n_heads", "4.0 / config.n_heads"))
    with pytest.raises(BamctlError, match="is not the code this checkpoint was made with"):
        load_checkpoint(folder)
    source.unlink()
    with pytest.raises(BamctlError, match="its file is neither where the checkpoint found it"):
        load_checkpoint(folder)


def test_a_checkpoint_moved_to_another_folder_finds_its_plugin_by_the_name_it_was_given(tmp_path, monkeypatch):
    """Made in one checkout (the plugin named relative to it), loaded in another: where it was found is
    gone, the name it was given reaches the same file from the new folder, whose digest is checked."""
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        (root / "pe").mkdir(parents=True)
        shutil.copy(EXAMPLES / "sandwich.py", root / "pe" / "sandwich.py")
    monkeypatch.chdir(first)
    folder = save_checkpoint(_model("pe/sandwich.py:Sandwich"), tmp_path / "ckpt")
    shutil.rmtree(first)
    monkeypatch.chdir(second)
    loaded = load_checkpoint(folder)
    assert loaded.model.config.pe_source["where"].startswith(str(first))  # the record is kept as made


@pytest.mark.parametrize("body, said", [
    (None, "does not exist"),
    ("import torch\nclass Other(torch.nn.Module):\n    pass\n", "defines no 'Mine'"),
    ("import torch\nclass Mine(torch.nn.Module):\n    def __init__(self, config):\n        super().__init__()\n",
     "has no hook of the PE protocol: give it distance_table(max_distance)"),
    ("import torch\nclass Mine(torch.nn.Module):\n    query_dependent = True\n", "has no bias(q_positions, k_positions) hook"),
    ("import torch\nclass Mine(torch.nn.Module):\n    content_dependent = True\n", "has none of its hooks: content_bias("),
    ("class Mine:\n    def distance_table(self, d):\n        pass\n", "not a torch.nn.Module class"),
    ("raise ImportError('needs my_lib')\n", "raised ImportError: needs my_lib"),
])
def test_bad_plugins_are_one_line_and_exit_2_from_bamctl_new(tmp_path, capsys, body, said):
    from bamctl.cli import main

    path = tmp_path / "my_pe.py"
    if body is not None:
        path.write_text(body)
    with pytest.raises(SystemExit) as exited:
        main(["new", "--pe", f"{path}:Mine", "--preset", "micro", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_an_unknown_name_says_how_to_give_a_plugin(capsys):
    with pytest.raises(BamctlError, match="FILE.py:CLASS"):
        ModelConfig.from_preset("micro", "sandwich")


def test_bamctl_new_and_inspect_take_a_plugin(tmp_path, capsys):
    from bamctl.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["new", "--pe", f"{SANDWICH}-ssmax", "--preset", "micro", "--train-length", "128", "--out", str(tmp_path / "m")])
    assert exited.value.code == 0
    with pytest.raises(SystemExit) as exited:
        main(["inspect", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "scale" in out and "sandwich.py:Sandwich" in out  # its per-head values


def entry_point_site(tmp_path: Path, with_package: bool = True) -> Path:
    """A folder to put on the path holding package ``mype`` (examples' Sandwich as ``mype/pe.py``) and
    its installed metadata as pip writes it, declaring the PE ``sandwich`` by entry point."""
    site = tmp_path / "site"
    if with_package:
        (site / "mype").mkdir(parents=True)
        shutil.copy(EXAMPLES / "sandwich.py", site / "mype" / "pe.py")
        (site / "mype" / "__init__.py").write_text("")
    info = site / "mype-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mype\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[bamctl.positional_encodings]\nsandwich = mype.pe:Sandwich\n")
    return site


def test_an_installed_packages_entry_point_is_a_pe_name(tmp_path, monkeypatch):
    """A package that declares ``[project.entry-points."bamctl.positional_encodings"]`` (here its
    installed metadata, written as pip writes it) gives its PE by name. Its package lies on the path,
    not in site-packages (an editable install, a PYTHONPATH): the user named its code by naming the
    entry point, so the model builds with no flag, and its identity is that code's digest, as a
    file named FILE.py:CLASS would be."""
    site = entry_point_site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    model = _model("sandwich")
    assert model.config.pe == "sandwich" and model.config.pe_source["where"] == "mype.pe:Sandwich"
    assert type(model.layers[0].attention.prior).__name__ == "Sandwich"
    assert model.config.pe_source["digest"] == local_code(site / "mype" / "pe.py").digest


def test_bamctl_train_trains_a_plugin_named_in_a_recipe(tmp_path, capsys, monkeypatch):
    """The recipe names the plugin's file (from the working directory, as the command line does); the
    trained checkpoint records it, its prior's parameter moved, and it loads and runs."""
    from bamctl.cli import main
    from test_train_loop import MICRO_RECIPE

    shutil.copy(EXAMPLES / "sandwich.py", tmp_path / "my_pe.py")
    (tmp_path / "plugin.toml").write_text(MICRO_RECIPE.replace('pe = "bam"', 'pe = "./my_pe.py:Sandwich-ssmax"'))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["train", "--recipe", "plugin.toml", "--steps", "3", "--device", "cpu", "--out", "trained"])
    assert exited.value.code == 0, capsys.readouterr().err
    checkpoint = load_checkpoint(tmp_path / "trained")
    config = checkpoint.model.config
    assert config.pe == "./my_pe.py:Sandwich" and config.ssmax and config.pe_source["digest"]
    scale = checkpoint.model.layers[0].attention.prior.log_scale.detach()
    assert not torch.allclose(scale, torch.full_like(scale, 8.0 / config.n_heads).log())  # trained, positional lr


QUERY_DEPENDENT = """
import torch


class Progressive(torch.nn.Module):
    \"\"\"A bias that depends on the query's position too: -slope (i - j) / log(i + 2).\"\"\"

    query_dependent = True

    def __init__(self, config):
        super().__init__()
        self.register_buffer("slope", torch.linspace(0.5, 2.0, config.n_heads), persistent=False)

    def bias(self, q_positions, k_positions):
        distance = (q_positions[:, None] - k_positions[None, :]).clamp(min=0).float()
        return -self.slope[:, None, None] * distance / torch.log(q_positions.float() + 2)[None, :, None]
"""


def test_a_query_dependent_plugin_runs_where_it_can_and_native_says_why_not(tmp_path):
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    (tmp_path / "progressive.py").write_text(QUERY_DEPENDENT)
    model = _model(f"{tmp_path / 'progressive.py'}:Progressive")
    assert StreamingEngine(model, device="cpu").attention == "blockwise"  # auto: a path that serves it
    with pytest.raises(BamctlError, match="--attention native takes a query-dependent prior only in its piecewise"):
        StreamingEngine(model, device="cpu", attention="native")
    with pytest.raises(BamctlError, match="--attention fused takes a prior by distance only"):
        StreamingEngine(model, device="cpu", attention="fused")
    sample = next(generate_samples("passkey", [300], 1, 0, get_tokenizer("gpt2")))
    chunked = StreamingEngine(model, device="cpu", chunk_size=64).score_continuation(sample.input_ids, sample.target_ids)
    dense = StreamingEngine(model, device="cpu", attention="dense").score_continuation(sample.input_ids, sample.target_ids)
    assert chunked[0] == dense[0] and max(abs(a - b) for a, b in zip(chunked[1], dense[1])) < 1e-4


COPE = f"{EXAMPLES / 'cope.py'}:CoPE"


def _cope_as_published(query, attn_logits, pos_emb, npos_max):
    """CoPE's forward as its paper prints it (Golovneva et al. 2024, arXiv 2405.18719, listing 1),
    restated here: attn_logits are the masked, scaled dot products; pos_emb is (1, Dh, npos_max)."""
    gates = torch.sigmoid(attn_logits)
    pos = gates.flip(-1).cumsum(dim=-1).flip(-1)
    pos = pos.clamp(max=npos_max - 1)
    pos_ceil, pos_floor = pos.ceil().long(), pos.floor().long()
    logits_int = torch.matmul(query, pos_emb)
    logits_ceil, logits_floor = logits_int.gather(-1, pos_ceil), logits_int.gather(-1, pos_floor)
    w = pos - pos_floor
    return logits_ceil * w + logits_floor * (1 - w)


def _trained_like(model):
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.prior.pos_emb.normal_(0, 1.0, generator=torch.Generator().manual_seed(layer.attention.layer_id))
    return model


# CoPE's bias over whole rows, through the paper's listing restated above: a plugin of the
# content_bias kind (dense only), with the example's parameters, so both build the same weights.
COPE_AS_PUBLISHED = """
import torch
from test_pe_plugins import _cope_as_published


class PublishedCoPE(torch.nn.Module):
    content_dependent = True

    def __init__(self, config, npos_max: int = 64):
        super().__init__()
        self.npos_max = npos_max
        self.pos_emb = torch.nn.Parameter(torch.zeros(config.head_dim, npos_max))

    def content_bias(self, q, scores, q_positions, k_positions):
        return _cope_as_published(q.float(), scores, self.pos_emb[None].float(), self.npos_max)
"""


def test_a_content_scan_on_blockwise_computes_the_papers_cope_on_dense(tmp_path, monkeypatch):
    """The example's CoPE, a scan over key blocks nearest first, streamed in chunks on the blockwise
    path with blocks of 32 keys (so the count crosses blocks), gives the answers of a model whose
    bias is the paper's listing over whole rows, on dense, in one full forward; whatever the path, the
    scan over one block is the listing's bias."""
    import math

    from bamctl.attention_math import content_bias
    from bamctl.engine.attention import BlockwiseKernel
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    (tmp_path / "published_cope.py").write_text(COPE_AS_PUBLISHED)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    ours, published = _trained_like(_model(COPE)), _trained_like(_model(f"{tmp_path / 'published_cope.py'}:PublishedCoPE"))
    assert all(torch.equal(ours.state_dict()[k], published.state_dict()[k]) for k in ours.state_dict())
    prior = ours.layers[0].attention.prior
    generator = torch.Generator().manual_seed(0)  # unseeded, a draw now and then summed past 1e-6 apart
    q, k = torch.randn(1, 4, 50, 16, generator=generator), torch.randn(1, 4, 50, 16, generator=generator)
    scores = ((q @ k.transpose(-1, -2)) / math.sqrt(16)).masked_fill(torch.ones(50, 50).triu(1).bool(), float("-inf"))
    assert torch.allclose(content_bias(prior, q, k, scores, torch.arange(50), torch.arange(50)),
                          _cope_as_published(q, scores, prior.pos_emb[None], prior.npos_max), atol=1e-6)
    engine = StreamingEngine(ours, device="cpu", chunk_size=64)
    assert engine.attention == "blockwise"  # auto: the fastest path that walks a scan
    engine.kernel = BlockwiseKernel(block_size=32)
    sample = next(generate_samples("passkey", [300], 1, 0, get_tokenizer("gpt2")))
    chunked = engine.score_continuation(sample.input_ids, sample.target_ids)
    ids = torch.tensor([sample.input_ids + sample.target_ids[:-1]])
    with torch.no_grad():
        logprobs = torch.log_softmax(published(ids)[0, len(sample.input_ids) - 1:], -1)  # dense, one full forward
    assert chunked[0] == logprobs.argmax(-1).tolist()
    wanted = logprobs.gather(1, torch.tensor(sample.target_ids)[:, None])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(chunked[1], wanted)) < 1e-4


@pytest.mark.parametrize("scope", ["logits", "content"])
@pytest.mark.parametrize("q_start,queries", [(0, 100), (60, 40), (99, 1)])
def test_the_blockwise_kernel_walks_a_content_scan_as_dense_computes_it(scope, q_start, queries):
    """Across block edges, with SSMax of either sign in either scope, and a chunk of queries after a
    cache: blockwise with blocks of 16 keys equals the dense reference."""
    from bamctl.attention_math import AttentionInputs, dense_attention
    from bamctl.engine.attention import blockwise_attention

    prior = _trained_like(_model(COPE)).layers[0].attention.prior
    generator = torch.Generator().manual_seed(q_start)
    q, k, v = (torch.randn(2, 4, n, 16, generator=generator) for n in (queries, 100, 100))
    for scale in (None, torch.tensor([0.5, 1.0, -0.3, 2.0])):
        inputs = AttentionInputs(q_start=q_start, bias_table=None, ssmax_scale=scale, ssmax_scope=scope, content_prior=prior)
        dense, blockwise = dense_attention(q, k, v, inputs), blockwise_attention(q, k, v, inputs, block_size=16)
        assert (dense - blockwise).abs().max() < 5e-4  # float32 counts summed in two orders, times |q.e| ~ 4


def test_a_whole_row_content_bias_runs_on_dense_and_is_refused_elsewhere_by_name(tmp_path, monkeypatch):
    from bamctl.engine.stream import StreamingEngine

    (tmp_path / "published_cope.py").write_text(COPE_AS_PUBLISHED)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    published, ours = _model(f"{tmp_path / 'published_cope.py'}:PublishedCoPE"), _model(COPE)
    assert StreamingEngine(published, device="cpu").attention == "dense"
    for path in ("native", "blockwise", "fused"):
        with pytest.raises(BamctlError, match=f"--attention {path} cannot compute .* depends on the content.*: use "
                                              "--attention dense .*content_scan"):
            StreamingEngine(published, device="cpu", attention=path)
    for path in ("native", "fused"):
        with pytest.raises(BamctlError, match=f"--attention {path} cannot compute .*: use --attention blockwise or dense$"):
            StreamingEngine(ours, device="cpu", attention=path)
    assert StreamingEngine(ours, device="cpu", attention="dense").attention == "dense"


CABLE = f"{EXAMPLES / 'cable.py'}:Cable"


def test_a_pair_bias_that_starts_as_alibi_gives_the_zoos_alibi(tmp_path):
    """The Cable example at its start (every rate its head's ALiBi slope) is ALiBi computed another
    way: the zoo's ALiBi on the native kernel and Cable pair by pair on blockwise give the same rows."""
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    zoo, cable = _model("alibi"), _model(CABLE)
    assert all(torch.equal(zoo.state_dict()[k], cable.state_dict()[k]) for k in zoo.state_dict())
    sample = next(generate_samples("passkey", [600], 1, 0, get_tokenizer("gpt2")))
    engines = [StreamingEngine(m, device="cpu", chunk_size=128) for m in (zoo, cable)]
    assert [e.attention for e in engines] == ["native", "blockwise"]
    answers = [e.score_continuation(sample.input_ids, sample.target_ids) for e in engines]
    assert answers[0][0] == answers[1][0] and max(abs(a - b) for a, b in zip(answers[0][1], answers[1][1])) < 1e-4


def _cable_trained_like():
    model = _model(CABLE)
    with torch.no_grad():
        for layer in model.layers:
            prior = layer.attention.prior
            prior.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(layer.attention.layer_id))
            prior.offset.add_(1.0)
    return model


@pytest.mark.parametrize("path", ["flex", "blockwise"])
@torch.inference_mode()
def test_a_pair_bias_streams_on_flex_and_blockwise_as_one_dense_forward(path, eager_flex):
    """Cable with rates that vary by token: chunks of 256 queries through a KV cache, on flex (a
    score_mod over padded queries and widened keys) and on blockwise, equal one full forward (dense)."""
    from bamctl.engine import flex
    from bamctl.engine.stream import StreamingEngine

    if path == "flex" and not flex.flex_available()[0]:
        pytest.skip("FlexAttention needs torch >= 2.5 on CUDA or an x86 CPU")
    model = _cable_trained_like()
    ids = torch.randint(0, 50257, (1, 1100), generator=torch.Generator().manual_seed(3))
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=256, attention=path)
    streamed = engine.token_nll(ids[0].tolist())
    logprobs = torch.log_softmax(model(ids)[0, :-1].float(), -1)
    wanted = -logprobs.gather(1, ids[0, 1:, None])[:, 0]
    assert torch.allclose(torch.as_tensor(streamed)[-wanted.shape[0]:].float(), wanted, atol=1e-4)


def test_a_pair_bias_is_refused_by_name_on_the_paths_without_tiles():
    from bamctl.engine import flex
    from bamctl.engine.stream import StreamingEngine

    model = _model(CABLE)
    can = "flex, blockwise or dense" if flex.flex_available()[0] else "blockwise or dense"
    for path in ("native", "fused"):
        with pytest.raises(BamctlError, match=f"--attention {path} cannot compute .*: use --attention {can}$"):
            StreamingEngine(model, device="cpu", attention=path)


def test_a_pair_bias_trains():
    model = _model(CABLE)
    ids = torch.randint(0, 50257, (2, 40))
    torch.nn.functional.cross_entropy(model(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
    prior = model.layers[0].attention.prior
    assert prior.weight.grad.abs().sum() > 0 and prior.offset.grad.abs().sum() > 0


def test_a_content_dependent_plugin_trains(tmp_path):
    model = _model(COPE)
    ids = torch.randint(0, 50257, (2, 40))
    loss = torch.nn.functional.cross_entropy(model(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert model.layers[0].attention.prior.pos_emb.grad.abs().sum() > 0


def test_rope_restated_through_the_query_key_hook_is_the_zoos_rope(tmp_path):
    """The hook that turns queries and keys by position runs before keys are cached, so every path
    takes it; RoPE restated so gives --pe rope's logits, whole and in chunks on the native kernel."""
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    zoo, plugin = _model("rope"), _model(f"{EXAMPLES / 'rope.py'}:RoPE")
    assert all(torch.equal(zoo.state_dict()[k], plugin.state_dict()[k]) for k in zoo.state_dict())
    ids = torch.randint(0, 50257, (1, 200), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(zoo(ids), plugin(ids), atol=1e-5, rtol=0)
    sample = next(generate_samples("passkey", [400], 1, 0, get_tokenizer("gpt2")))
    answers = [StreamingEngine(m, device="cpu", chunk_size=128).score_continuation(sample.input_ids, sample.target_ids)
               for m in (zoo, plugin)]
    assert answers[0][0] == answers[1][0] and max(abs(a - b) for a, b in zip(answers[0][1], answers[1][1])) < 1e-5
    assert StreamingEngine(plugin, device="cpu").attention == "native"  # no bias: the fastest path


def test_input_embeddings_by_position_through_the_embed_hook(tmp_path):
    """A plugin's embed(h, positions) adds to the token embeddings at absolute positions: a learned
    absolute table whose chunked run equals the full forward."""
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    (tmp_path / "learned.py").write_text(textwrap.dedent("""
        import torch


        class Learned(torch.nn.Module):  # learned absolute positions, as GPT-2's, up to 1,024

            def __init__(self, config):
                super().__init__()
                self.table = torch.nn.Parameter(torch.randn(1024, config.dim) * 0.5)

            def embed(self, h, positions):
                return h + self.table[positions].to(h.dtype)
    """))
    model = _model(f"{tmp_path / 'learned.py'}:Learned")
    sample = next(generate_samples("passkey", [300], 1, 0, get_tokenizer("gpt2")))
    chunked = StreamingEngine(model, device="cpu", chunk_size=64).score_continuation(sample.input_ids, sample.target_ids)
    with torch.no_grad():
        full = torch.log_softmax(model(torch.tensor([sample.input_ids + sample.target_ids[:-1]]))[0, len(sample.input_ids) - 1:], -1)
    assert chunked[0] == full.argmax(-1).tolist()
    plain = _model("nope")
    assert not torch.equal(plain(torch.tensor([sample.input_ids[:50]])), model(torch.tensor([sample.input_ids[:50]])))


def test_bamctl_models_lists_the_pes_installed_packages_give(tmp_path, monkeypatch, capsys):
    from bamctl.cli import main

    monkeypatch.syspath_prepend(str(entry_point_site(tmp_path, with_package=False)))
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        main(["models"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "bam-ssmax" in out
    assert "positional encodings of installed packages" in out and "mype.pe:Sandwich" in out and "mype 0.1" in out


@pytest.mark.parametrize("name, cls", [("nope", "NoPE"), ("sinusoidal", "Sinusoidal"), ("rope", "RoPE"), ("xpos", "XPos"),
                                       ("alibi", "ALiBiPrior"), ("kerple", "KerplePrior"), ("t5", "T5Prior"),
                                       ("fire", "FIREPrior"), ("bam", "GGDPrior")])
def test_the_zoo_is_the_protocols_first_user(name, cls):
    """Each of the nine is a class of the protocol: named by its module path, as a user's plugin is,
    it builds the zoo's model (same weights, same logits, whole and in chunks through the cache)."""
    from bamctl.engine.stream import StreamingEngine

    zoo, plugin = _model(name), _model(f"bamctl.positional:{cls}")
    assert zoo.config.embedding_scale == plugin.config.embedding_scale  # sinusoidal's sqrt(dim) comes from its class
    assert zoo.state_dict().keys() == plugin.state_dict().keys()
    assert all(torch.equal(zoo.state_dict()[k], plugin.state_dict()[k]) for k in zoo.state_dict())
    ids = torch.randint(0, 50257, (2, 300), generator=torch.Generator().manual_seed(2))
    assert torch.equal(zoo(ids), plugin(ids))
    chunked = [StreamingEngine(m, device="cpu", chunk_size=64, attention="dense").score_continuation(ids[0, :280].tolist(), ids[0, 280:].tolist())
               for m in (zoo, plugin)]
    assert chunked[0] == chunked[1]


def test_position_ids_say_what_the_model_is_told_the_positions_are(tmp_path):
    """Positions halved by the position-index hook on the zoo's RoPE are RoPE's linear position
    interpolation by 2 (Chen et al. 2023), which bamctl computes another way (frequencies divided):
    the same logits within float32 rounding, whole and streamed in chunks through the cache."""
    from bamctl.engine.stream import StreamingEngine
    from bamctl.positional import RopeScaling

    (tmp_path / "halved.py").write_text(textwrap.dedent("""
        from bamctl.positional import RoPE


        class Halved(RoPE):
            def position_ids(self, token_indices):
                return token_indices / 2
    """))
    zoo, plugin, unscaled = _model("rope"), _model(f"{tmp_path / 'halved.py'}:Halved"), _model("rope")
    with torch.no_grad():
        for model in (zoo, plugin, unscaled):  # sharper attention than random weights give, so positions matter
            for layer in model.layers:
                layer.attention.wq.weight.mul_(30)
                layer.attention.wk.weight.mul_(30)
    zoo.rope_scaling = RopeScaling("linear", 2.0, 128)
    ids = torch.randint(0, 50257, (1, 300), generator=torch.Generator().manual_seed(3))
    same, other = ((m(ids) - plugin(ids)).abs().max().item() for m in (zoo, unscaled))
    assert same < 1e-4 and other > 1e-2  # unscaled RoPE is another model
    prompt, answer = ids[0, :290].tolist(), ids[0, 290:].tolist()
    scaling = zoo.rope_scaling  # the engine sets the model's own (None unless given)
    streamed = [StreamingEngine(m, device="cpu", chunk_size=64, rope_scaling=s).score_continuation(prompt, answer)
                for m, s in ((zoo, scaling), (plugin, None))]
    assert streamed[0][0] == streamed[1][0]
    assert max(abs(a - b) for a, b in zip(streamed[0][1], streamed[1][1])) < 1e-4


def test_randomized_positions_in_training_and_indices_in_evaluation():
    """examples/positional/randomized_rope.py: in training, sorted distinct positions drawn up to
    spread x train_length, new at each forward; in evaluation, the token indices (so the zoo's RoPE
    logits exactly, the same weights)."""
    model = _model(f"{EXAMPLES / 'randomized_rope.py'}:RandomizedRoPE")
    hook = model.layers[0].attention.prior
    indices = torch.arange(100)
    model.train()
    first, second = hook.position_ids(indices), hook.position_ids(indices)
    for drawn in (first, second):
        assert drawn.shape == (100,) and bool((drawn[1:] > drawn[:-1]).all()) and 0 <= int(drawn[0]) and int(drawn[-1]) < 8 * 128
    assert not torch.equal(first, second)
    ids = torch.randint(0, 50257, (1, 100), generator=torch.Generator().manual_seed(4))
    trained_view = model(ids)
    model.eval()
    assert torch.equal(hook.position_ids(indices), indices)
    assert torch.equal(model(ids), _model("rope").eval()(ids))
    assert not torch.allclose(trained_view, model(ids), atol=1e-3)


def test_the_docs_two_commands_train_a_plugin_and_compare_it_beside_the_nine(tmp_path, capsys, monkeypatch):
    """docs/positional-plugins.md's two commands, as written there but for --steps 3 (train) and one
    length and sample (compare): the plugin's column sits beside the nine references'."""
    import shlex

    from bamctl.cli import main

    text = (Path(__file__).resolve().parents[1] / "docs" / "positional-plugins.md").read_text()
    block = text.split("in two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    train, compare = (shlex.split(line) for line in block.replace("\\\n", " ").strip().splitlines())
    assert train[:2] == ["bamctl", "train"] and compare[:2] == ["bamctl", "compare"]
    shutil.copytree(EXAMPLES, tmp_path / "examples" / "positional")
    monkeypatch.chdir(tmp_path)
    for argv in (train[1:] + ["--steps", "3"],
                 compare[1:compare.index("--lengths")] + ["--lengths", "128", "--seed", "1", "--samples", "1", "--dir", "results"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 0, capsys.readouterr().err
    rows = pd.read_parquet(tmp_path / "results")
    assert set(rows["model"]) >= {"bam-ssmax", "nope", "sinusoidal", "rope", "alibi", "bam", "nope-ssmax", "rope-ssmax", "alibi-ssmax"}
    assert len(set(rows["model"])) == 10 and len(rows) == 10 * 5  # the plugin's rows beside the nine's, 5 depths each


class _Given:
    """A content prior of one kind (``hook``), recording what the dense reference hands it, as
    docs/positional-plugins.md's table documents each kind's arguments; its bias is 0."""

    content_dependent = True

    def __init__(self, hook: str):
        self.seen = {}
        setattr(self, hook, getattr(self, f"_{hook}"))

    def _pair_bias(self, q, k, q_positions):
        self.seen.update(q=q, k=k, q_positions=q_positions)
        return lambda score, b, h, i, j: score * 0

    def _score_mod(self, score, b, h, i, j):
        self.seen.update(b=b, h=h, i=i, j=j)
        return score

    def _content_scan(self, q, scores, q_positions, k_positions, carry):
        self.seen.update(q=q, scores=scores, q_positions=q_positions, k_positions=k_positions, carry=carry)
        return scores.nan_to_num(0.0, 0.0, 0.0) * 0, None

    def _content_bias(self, q, scores, q_positions, k_positions):
        self.seen.update(q=q, scores=scores, q_positions=q_positions, k_positions=k_positions)
        return scores.nan_to_num(0.0, 0.0, 0.0) * 0


@pytest.mark.parametrize("hook", ["pair_bias", "score_mod", "content_scan", "content_bias"])
def test_each_content_hook_is_given_the_queries_keys_positions_and_indices_its_kind_documents(hook):
    """Queries 6..9 of a chunk against keys 0..9, a batch of 2 and 3 heads: a pair bias gets the chunk's
    queries, every key and the queries' positions; a score_mod FlexAttention's broadcasting index grids
    (batch, head, query position, key position); a scan one block of every key, nearest first (scores and
    key positions reversed) and no carry; a whole-row bias the scores and positions in order."""
    from bamctl.attention_math import AttentionInputs, attention_weights, depends_on_content, gives_bias

    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 4, 8, generator=generator), torch.randn(2, 3, 10, 8, generator=generator)
    prior = _Given(hook)
    assert depends_on_content(prior) and gives_bias(prior)  # by its flag, whichever hook it has
    weights = attention_weights(q, k, AttentionInputs(q_start=6, bias_table=None, ssmax_scale=None, content_prior=prior))
    queries, keys = torch.arange(6, 10), torch.arange(10)
    scores = ((q @ k.transpose(-1, -2)) / math.sqrt(8)).masked_fill(queries[:, None] < keys[None, :], float("-inf"))
    assert torch.allclose(weights, torch.softmax(scores, -1))  # a zero bias: plain causal attention
    seen = prior.seen
    if hook == "pair_bias":
        assert torch.equal(seen["q"], q) and torch.equal(seen["k"], k) and torch.equal(seen["q_positions"], queries)
    elif hook == "score_mod":
        for grid, wanted in (("b", torch.arange(2)[:, None, None, None]), ("h", torch.arange(3)[None, :, None, None]),
                             ("i", queries[None, None, :, None]), ("j", keys[None, None, None, :])):
            assert torch.equal(seen[grid], wanted), grid
    else:
        order = (lambda t: t.flip(-1)) if hook == "content_scan" else (lambda t: t)
        assert torch.equal(seen["q"], q) and torch.equal(seen["q_positions"], queries)
        assert torch.equal(seen["k_positions"], order(keys))
        assert torch.allclose(seen["scores"], order(scores), equal_nan=True)
        assert seen.get("carry", None) is None


def test_a_prior_without_the_flag_or_a_score_mod_does_not_read_the_content():
    from bamctl.attention_math import depends_on_content

    class Plain:
        content_dependent = False

        def content_bias(self, q, scores, q_positions, k_positions):
            return scores * 0

    assert not depends_on_content(Plain())
