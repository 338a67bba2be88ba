"""A user's own PyTorch module as a model (``bamctl.backends.module``): held to the plain loops a
user writes around the module's own forward (``own_models``: not bamctl's engine), on a nanoGPT-style
module written there and on x-transformers' ``TransformerWrapper`` from the package index."""

from __future__ import annotations

import textwrap

import pytest
import torch
from typer.testing import CliRunner

import bamctl
from bamctl.backends import RunOptions, open_backend
from bamctl.backends.in_memory import in_memory
from bamctl.cli.app import app
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig
from bamctl.tasks.registry import generate_samples
from own_models import (gpt2_encoding, nanogpt, plain_continuation, plain_greedy, plain_nll, x_transformer,
                        x_transformers_step)

TOLERANCE = 1e-5  # nats per token


def _models():
    yield "nanogpt", nanogpt(), {}
    pytest.importorskip("x_transformers", reason="x-transformers is the dev extra's user model")
    for pe in ("alibi", "rope"):
        yield f"x-{pe}", x_transformer(pe), {}
        yield f"x-{pe}-cached", x_transformer(pe), {"step": x_transformers_step}


MODELS = ["nanogpt", "x-alibi", "x-rope", "x-alibi-cached", "x-rope-cached"]


def _model(which: str):
    return next((model, extra) for name, model, extra in _models() if name == which)


def _backend(model, extra: dict, chunk_size: int | None = None):
    encoding = gpt2_encoding()
    return open_backend(in_memory({"model": model, "tokenizer": encoding, **extra}), RunOptions(chunk_size=chunk_size))


@pytest.mark.parametrize("which", MODELS)
def test_teacher_forced_log_probs_equal_a_plain_loop_over_the_forward(which):
    model, extra = _model(which)
    backend = _backend(model, extra, chunk_size=48)  # prompts of 120 tokens: three chunks where cached
    samples = list(generate_samples("passkey", [120], 3, 7, backend.tokenizer, protocol="exact"))
    answers = backend.score_continuations([(s.input_ids, s.answer_ids) for s in samples])
    assert len({len(s.input_ids) for s in samples}) == 1  # one batch, side by side
    for sample, answer in zip(samples, answers):
        predicted, logprobs = plain_continuation(model, sample.input_ids, sample.answer_ids)
        assert answer.predicted_ids == predicted
        assert max(abs(a - b) for a, b in zip(answer.logprobs, logprobs)) < TOLERANCE


@pytest.mark.parametrize("which", MODELS)
def test_greedy_generation_is_token_identical_to_a_plain_greedy_loop(which):
    model, extra = _model(which)
    backend = _backend(model, extra, chunk_size=100)
    samples = list(generate_samples("niah_single_1", [240], 2, 3, backend.tokenizer))
    made = backend.generate_many([s.input_ids for s in samples], 6)
    for sample, tokens in zip(samples, made):
        assert tokens == plain_greedy(model, sample.input_ids, 6, backend.tokenizer.eos_id)


@pytest.mark.parametrize("which", MODELS)
def test_perplexity_per_window_equals_a_plain_loop(which):
    model, extra = _model(which)
    backend = _backend(model, extra, chunk_size=32)
    windows = [list(range(1000 + 7 * i, 1000 + 7 * i + 96)) for i in range(3)]
    for ids, nll in zip(windows, backend.token_nlls([(ids, 1) for ids in windows])):
        assert torch.allclose(nll, plain_nll(model, ids), atol=TOLERANCE, rtol=0)


def test_a_nanogpt_module_runs_through_the_api_and_its_rows_are_the_plain_loops(tmp_path):
    model, encoding = nanogpt(), gpt2_encoding()
    rows = bamctl.evaluate((model, encoding), task="passkey", lengths="128", samples=2, depths=[0.5], dir=tmp_path,
                           quiet=True)
    assert len(rows) == 2 and set(rows["backend"]) == {"module"} and set(rows["train_length"]) == {256}
    backend = _backend(model, {})
    for sample, (_, row) in zip(generate_samples("passkey", [128], 2, 0, backend.tokenizer, depths=[0.5], protocol="exact"),
                                rows.iterrows()):
        predicted, _ = plain_continuation(model, sample.input_ids, sample.answer_ids)
        wanted = predicted[len(sample.answer_ids) - len(sample.target_ids):]
        assert row["predicted"] == encoding.decode(wanted).strip()
    assert model.training is False  # left as found: it came in eval mode


def test_the_same_module_keeps_its_identity_and_an_edited_forward_is_another_model(tmp_path):
    first = _backend(nanogpt(), {}).info.model_hash
    assert _backend(nanogpt(), {}).info.model_hash == first  # the same weights and code
    assert _backend(nanogpt(seed=1), {}).info.model_hash != first  # other weights
    source = tmp_path / "mine.py"
    source.write_text(textwrap.dedent("""
        import torch
        class Doubled(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner, self.train_length = inner, 256
            def forward(self, ids):
                return self.inner(ids) * 2
    """))
    spec = __import__("importlib.util").util.spec_from_file_location("mine_v1", source)
    one = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(one)
    before = _backend(one.Doubled(nanogpt()), {}).info.model_hash
    source.write_text(source.read_text().replace("* 2", "* 3"))
    spec = __import__("importlib.util").util.spec_from_file_location("mine_v2", source)
    two = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(two)
    assert _backend(two.Doubled(nanogpt()), {}).info.model_hash != before  # same weights, edited forward


def _write_builder(folder, body: str):
    path = folder / "my_model.py"
    path.write_text(textwrap.dedent(body))
    return path


NANOGPT_BUILDER = """
    from own_models import gpt2_encoding, nanogpt

    def build(seed=0, n_layer=2):
        return nanogpt(seed, n_layer=n_layer), gpt2_encoding()
"""


def test_a_py_reference_runs_from_the_command_line_with_arguments(tmp_path):
    path = _write_builder(tmp_path, NANOGPT_BUILDER)
    result = CliRunner().invoke(app, ["passkey", f"py:{path}:build:seed=1,n_layer=1", "--lengths", "128", "--samples", "1",
                                      "--depths", "0.5", "--dir", str(tmp_path / "res"), "--json"])
    assert result.exit_code == 0, result.output
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "res")
    assert list(rows["model"]) == ["my_model.py:build:seed=1,n_layer=1"]
    direct = bamctl.evaluate((nanogpt(1, n_layer=1), gpt2_encoding()), lengths="128", samples=1, depths=[0.5],
                             dir=tmp_path / "direct", quiet=True)
    assert list(rows["predicted"]) == list(direct["predicted"])


X_TRANSFORMERS_BUILDER = """
    from own_models import gpt2_encoding, x_transformer

    def build(pe="alibi"):
        return x_transformer(pe), gpt2_encoding()
"""


def test_an_x_transformers_model_is_compared_beside_bam_ssmax(tmp_path):
    pytest.importorskip("x_transformers", reason="x-transformers is the dev extra's user model")
    path = _write_builder(tmp_path, X_TRANSFORMERS_BUILDER)
    result = CliRunner().invoke(app, ["compare", "bam-ssmax", f"py:{path}:build", "--task", "passkey", "--lengths", "128",
                                      "--samples", "1", "--depths", "0.5", "--dir", str(tmp_path / "res"),
                                      "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    import pandas as pd

    rows = pd.read_parquet(tmp_path / "res")
    assert sorted(set(rows["backend"])) == ["module", "native"]
    by_model = rows.groupby("model")["draw"].apply(sorted)
    assert by_model["bam-ssmax"] == by_model["my_model.py:build"]  # the same keys for both
    assert set(rows[rows["model"] == "my_model.py:build"]["train_length"]) == {128}  # x-transformers' max_seq_len


@pytest.mark.parametrize("body, words", [
    (None, "does not exist"),
    ("def other():\n    pass\n", "defines no 'build'"),
    ("def build():\n    raise RuntimeError('no weights here')\n", "raised RuntimeError: no weights here"),
    ("def build():\n    return 42\n", "gave a int, not a torch.nn.Module"),
    ("import torch\nclass M(torch.nn.Module):\n    train_length = 64\n    def forward(self, ids):\n"
     "        return torch.zeros(ids.shape[0], ids.shape[1], 100)\n"
     "def build():\n    return M(), 'gpt2'\n", "its logits cover 100 ids"),
    ("import torch\nclass M(torch.nn.Module):\n    train_length = 64\n    def forward(self, ids):\n"
     "        return torch.zeros(ids.shape[0], 1, 50257)\n"
     "def build():\n    return M(), 'gpt2'\n", "every position's logits are needed"),
    ("import torch\nclass M(torch.nn.Module):\n    def forward(self, ids):\n"
     "        return torch.zeros(ids.shape[0], ids.shape[1], 50257)\n"
     "def build():\n    return M(), 'gpt2'\n", "does not say the length it was trained at"),
    ("import torch\nclass M(torch.nn.Module):\n    train_length = 64\n    def forward(self, ids):\n"
     "        return torch.zeros(ids.shape[0], ids.shape[1], 50257)\n"
     "def build():\n    return M()\n", "has no tokenizer"),
])
def test_bad_py_references_are_one_line_and_exit_2_before_any_work(tmp_path, capsys, body, words):
    from bamctl.cli import main

    path = tmp_path / "my_model.py" if body is None else _write_builder(tmp_path, body)
    with pytest.raises(SystemExit) as exited:
        main(["passkey", f"py:{path}:build", "--lengths", "128", "--samples", "1", "--dir", str(tmp_path / "res")])
    said = capsys.readouterr().err
    assert exited.value.code == 2, said
    assert words in said and len(said.strip().splitlines()) == 1, said
    assert not (tmp_path / "res").exists() or not any((tmp_path / "res").rglob("*.parquet"))


def test_a_module_too_long_for_one_forward_is_refused_naming_the_cached_protocol(monkeypatch):
    from bamctl import devices

    backend = _backend(nanogpt(), {})
    monkeypatch.setattr(devices, "available_bytes", lambda device: 2 << 30)
    with pytest.raises(BamctlError, match="cached step"):
        backend.check_fits(128 * 1024, 5)
    backend.check_fits(1024, 5)  # a short one fits


def test_tokenizers_as_users_hold_them_are_fingerprinted_by_what_they_do():
    from bamctl.backends.user_tokenizer import as_tokenizer
    from bamctl.tokenizer import gpt2_tokenizer

    ours = as_tokenizer(gpt2_encoding(), "m")
    assert ours.encode("The pass key is 12345.") == gpt2_tokenizer().encode("The pass key is 12345.")
    assert ours.fingerprint == as_tokenizer(gpt2_encoding(), "other").fingerprint  # not keyed on who holds it
    assert as_tokenizer("gpt2", "m").fingerprint == gpt2_tokenizer().fingerprint
    with pytest.raises(BamctlError, match="cannot use a list as a tokenizer"):
        as_tokenizer([1, 2], "m")


def test_a_sentencepiece_processor_and_a_transformers_tokenizer_are_taken_as_they_are():
    pytest.importorskip("sentencepiece", reason="sentencepiece is the hf extra's")
    from mistral_vocab import reference_processor

    from bamctl.backends.user_tokenizer import as_tokenizer

    processor = reference_processor()
    tokenizer = as_tokenizer(processor, "m")
    assert tokenizer.encode("The pass key is 12345.") == processor.encode("The pass key is 12345.")
    assert tokenizer.leading_special_ids == [processor.bos_id()]  # a BOS in front, as Llama's loaders put it
    assert tokenizer.fingerprint and tokenizer.vocab_size == processor.get_piece_size()


def test_a_py_file_edited_between_submit_and_a_shards_start_is_refused_in_one_line(tmp_path, capsys):
    pytest.importorskip("submitit", reason="bamctl submit needs the cluster extra (pip install 'bamctl[cluster]')")
    from bamctl.cli import main
    from bamctl.cli.submit_commands import plan_sweep
    from bamctl.cluster import sweep

    path = _write_builder(tmp_path, NANOGPT_BUILDER)
    command = ["passkey", f"py:{path}:build", "--lengths", "128", "--samples", "2", "--depths", "0.5",
               "--dir", str(tmp_path / "res"), "--quiet"]
    description, planned_out, _ = plan_sweep(command)
    assert f"py:{path}:build" in description["code"]  # the file's digest is part of the submitted sweep
    record = sweep.claim(planned_out, description)
    path.write_text(path.read_text() + "\n# edited after submit\n")
    with sweep.expecting(record.id), pytest.raises(SystemExit) as exited:  # what a job of `bamctl submit` runs
        main([*command, "--shard", "0/2"])
    said = capsys.readouterr().err
    assert exited.value.code == 2 and "another sweep than the one submitted" in said and "code" in said
    assert not any((tmp_path / "res").rglob("*.parquet"))


def test_a_py_model_runs_in_lm_evals_command_line(tmp_path):
    """``bamctl lm-eval --model_args model=py:...``: lm-eval's own command line asks the module, and
    reports the accuracy its scores give by hand through the plugin in this process."""
    pytest.importorskip("lm_eval", reason="lm-eval is the dev extra's")
    import json
    import shutil
    from pathlib import Path

    from bamctl.harness import BamctlLM
    from test_harness import TASKS, _bamctl, _by_hand

    shutil.copy(Path(__file__).with_name("own_models.py"), tmp_path / "own_models.py")  # imported beside the builder
    path = _write_builder(tmp_path, NANOGPT_BUILDER)
    out = tmp_path / "out"
    done = _bamctl("lm-eval", "--model_args", f"model=py:{path}:build", "--tasks", "arc_mini", "--include_path",
                   str(TASKS), "--device", "cpu", "--output_path", str(out), home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = out.rglob("results_*.json")
    results = json.loads(written.read_text())["results"]["arc_mini"]
    acc, acc_norm = _by_hand(BamctlLM(model=f"py:{path}:build", device="cpu"))
    assert results["acc,none"] == pytest.approx(acc) and results["acc_norm,none"] == pytest.approx(acc_norm)


def test_generate_writes_the_prompts_a_py_model_is_fed(tmp_path):
    """``bamctl generate --tokenizer py:...``: the prompts in the module's own tokenizer, as a run feeds them."""
    import json

    from bamctl.cli import main

    path = _write_builder(tmp_path, NANOGPT_BUILDER)
    with pytest.raises(SystemExit) as exited:
        main(["generate", "passkey", "--tokenizer", f"py:{path}:build", "--lengths", "128", "--samples", "2",
              "--depths", "0.5", "--out", str(tmp_path / "prompts.jsonl")])
    assert exited.value.code == 0
    written = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    fed = generate_samples("passkey", [128], 2, 0, _backend(nanogpt(), {}).tokenizer, depths=[0.5], protocol="exact")
    assert [w["input_ids"] for w in written] == [s.input_ids for s in fed]


def _readme_nanogpt() -> str:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Your own model", 1)[1].split("### From Python", 1)[0]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_readmes_nanogpt_example_runs_as_written(tmp_path, monkeypatch):
    """README's nanoGPT lines, at most ten, executed as written: ``model`` is the nanoGPT-style module of
    own_models, ``ckpt.pt`` its weights as nanoGPT saves them, and tiktoken's gpt2 the Encoding built
    from bamctl's ranks (tiktoken's own would download them); one sample and depth per length."""
    import sys

    import own_models
    import tiktoken

    code = _readme_nanogpt()
    assert len(code.strip().splitlines()) <= 10
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "model", own_models)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: gpt2_encoding() if name == "gpt2" else None)
    torch.save({"model": own_models.GPT(own_models.GPTConfig(block_size=1024)).state_dict()}, tmp_path / "ckpt.pt")
    evaluate = bamctl.evaluate
    monkeypatch.setattr(bamctl, "evaluate", lambda *a, **kw: evaluate(*a, samples=1, depths=1, quiet=True, **kw))
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    rows = namespace["rows"]
    assert sorted(rows["length"].unique()) == [128, 256, 512] and set(rows["backend"]) == {"module"}


def test_auto_batches_of_a_plain_forward_keep_its_scores_small_and_a_cached_step_is_not_held_to_it():
    from bamctl.backends.module import PLAIN_SCORES_BYTES

    plain = _backend(nanogpt(block_size=8192), {})
    assert plain.batch_limit(4000, 5) == 1  # 2 heads x 4005^2 floats: 128 MB for one sequence already
    assert plain.batch_limit(500, 5) == min(16_384 // 505, PLAIN_SCORES_BYTES // (2 * 505 * 505 * 4))  # the token budget
    pytest.importorskip("x_transformers", reason="x-transformers is the dev extra's user model")
    cached = _backend(x_transformer("alibi"), {"step": x_transformers_step})
    assert cached.batch_limit(4000, 5) == 4  # the token budget alone: 16,384 // 4,005


@pytest.mark.parametrize("task, protocol, extra", [
    ("passkey", "exact", {"samples": 1, "depths": [0.5], "lengths": "512"}),
    ("passkey", "landmark", {"samples": 1, "depths": [0.5], "lengths": "512"}),
    ("niah_multikey_2", None, {"samples": 1, "lengths": "512"}),
    ("vt", None, {"samples": 1, "lengths": "1k"}),
    ("cwe", None, {"samples": 1, "lengths": "1k"}),
    ("fwe", None, {"samples": 1, "lengths": "1k"}),
    ("facts_2", "generate", {"samples": 1, "lengths": "512"}),
    ("facts_2", "teacher_forced", {"samples": 1, "depths": [0.5], "lengths": "512"}),
    ("ppl", "sliding", {"stride": 128, "lengths": "512"}),
    ("ppl", "buckets", {"bucket": 128, "lengths": "512"}),
])
def test_every_task_and_protocol_runs_on_a_plain_module(tmp_path, task, protocol, extra):
    """Through the API on each task and protocol: rows written, their back-end the module's, and a
    rerun computing none again. Teacher forcing and perplexity on a nanoGPT-style module's forward;
    RULER's greedy generations on x-transformers' decoder through its cached step (one forward per
    generated token over the whole prompt would take minutes)."""
    if task.startswith(("passkey", "ppl")) or protocol == "teacher_forced":
        model = {"model": nanogpt(block_size=2048), "tokenizer": gpt2_encoding(), "name": "mine"}
    else:
        pytest.importorskip("x_transformers", reason="x-transformers is the dev extra's user model")
        model = {"model": x_transformer("alibi"), "tokenizer": gpt2_encoding(), "step": x_transformers_step, "name": "mine"}
    kwargs = dict(task=task, dir=tmp_path, quiet=True, **({"protocol": protocol} if protocol else {}), **extra)
    rows = bamctl.evaluate(model, **kwargs)
    assert len(rows) >= 1 and set(rows["backend"]) == {"module"} and set(rows["model"]) == {"mine"}
    assert rows["score"].notna().all() if task != "ppl" else (rows["nll"] > 0).all()
    again = bamctl.evaluate(model, **kwargs)
    assert list(again["run_id"].unique()) == list(rows["run_id"].unique())  # the stored rows, reused


def test_a_module_keeps_its_identity_after_its_caches_fill():
    """x-transformers' ALiBi fills a non-persistent bias buffer at its first forward, sized by the
    sequence: the model is the same one before and after, so its rows are found again."""
    pytest.importorskip("x_transformers", reason="x-transformers is the dev extra's user model")
    from bamctl.backends.module import UserModel, module_identity

    model = x_transformer("alibi")
    before = module_identity(UserModel(model))
    with torch.no_grad():
        model(torch.randint(0, 50257, (1, 300)))
    assert any(not name.endswith("weight") for name, _ in model.named_buffers())  # a cache was filled
    assert module_identity(UserModel(model)) == before


class PlainTransformer(torch.nn.Module):
    """A bamctl Transformer seen only through its forward, as a user's module: GPT-2 ids mapped to its
    vocabulary's rows, its logits scattered back to GPT-2's ids (-inf for ids it has no row for; its one
    row for all the others goes to an id past GPT-2's, so it keeps its share of the distribution)."""

    def __init__(self, inner, vocab: int = 50257):
        super().__init__()
        self.inner, self.train_length, self.vocab = inner.eval(), inner.config.train_length, vocab
        subset = inner.config.token_subset or list(range(vocab))
        lookup = torch.full((vocab,), len(subset), dtype=torch.long)
        lookup[torch.tensor(subset)] = torch.arange(len(subset))
        self.register_buffer("lookup", lookup)
        self.register_buffer("rows", torch.tensor([*subset, vocab]))  # the model's rows, as ids here

    def forward(self, ids):
        logits = self.inner(self.lookup[ids])  # (B, T, its vocabulary)
        out = torch.full((*ids.shape, self.vocab + 1), float("-inf"), dtype=logits.dtype, device=logits.device)
        out[..., self.rows[: logits.shape[-1]]] = logits
        return out


def test_bam_ssmax_as_a_plain_module_gives_the_native_back_ends_numbers(tmp_path):
    """The shipped bam-ssmax through its forward alone (the module back-end) against the native engine:
    passkey log-probs within 1e-5 and the same rows; perplexity of a full-vocabulary bam-ssmax likewise."""
    from bamctl.catalog import resolve_model

    shipped = resolve_model("bam-ssmax").model
    native = open_backend("bam-ssmax", RunOptions(device="cpu"))
    plain = open_backend(in_memory({"model": PlainTransformer(shipped), "tokenizer": "gpt2", "name": "plain"}),
                         RunOptions(device="cpu"))
    samples = list(generate_samples("passkey", [128, 512], 2, 3, native.tokenizer, depths=[0.0, 0.5], protocol="exact"))
    for ours, theirs in zip(plain.score_continuations([(s.input_ids, s.answer_ids) for s in samples]),
                            native.score_continuations([(s.input_ids, s.answer_ids) for s in samples])):
        assert ours.predicted_ids == theirs.predicted_ids
        assert max(abs(a - b) for a, b in zip(ours.logprobs, theirs.logprobs)) < 1e-5
    full = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=128), 0)
    folder = save_checkpoint(full, tmp_path / "full")
    rows = [bamctl.evaluate(model, task="ppl", lengths="256,1k", dir=tmp_path / "res", quiet=True, names=name)
            for model, name in ((str(folder), "native"), ({"model": PlainTransformer(full), "tokenizer": "gpt2"}, "plain"))]
    assert set(rows[1]["backend"]) == {"module"}
    nll = [r.sort_values(["length", "position"])["nll"].to_numpy() for r in rows]
    assert len(nll[0]) == len(nll[1]) and (abs(nll[0] - nll[1]) / nll[0]).max() < 1e-5


def test_a_module_without_parameters_runs(tmp_path, capsys):
    """Its memory estimate reads the element size of parameters it may not have (a fixed-logits baseline)."""
    from bamctl.cli import main

    path = _write_builder(tmp_path, "import torch\nclass M(torch.nn.Module):\n    train_length = 64\n"
                          "    def forward(self, ids):\n        return torch.zeros(ids.shape[0], ids.shape[1], 50257)\n"
                          "def build():\n    return M(), 'gpt2'\n")
    with pytest.raises(SystemExit) as exited:
        main(["passkey", f"py:{path}:build", "--lengths", "128", "--samples", "1", "--depths", "0.5",
              "--dir", str(tmp_path / "res")])
    assert exited.value.code == 0, capsys.readouterr().err


def test_a_padded_vocabularys_extra_ids_predicted_by_a_module_are_no_text(tmp_path):
    """nanoGPT pads GPT-2's 50,257 ids to 50,304; a weak model may put its argmax on a padding row.
    Such an id is no token: the answer holds nothing for it (scored wrong), and the run goes on,
    teacher-forced and generated alike."""
    class PaddingFavoured(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, idx):
            logits = self.inner(idx)
            return torch.cat([logits[..., :50300], logits.amax(-1, keepdim=True) + 1, logits[..., 50301:]], dim=-1)

    model, encoding = PaddingFavoured(nanogpt()), gpt2_encoding()
    ids = torch.tensor([encoding.encode_ordinary("The pass key is 12345.")])
    assert model(ids).shape[-1] == 50304 and set(model(ids).argmax(-1).flatten().tolist()) == {50300}
    rows = bamctl.evaluate((model, encoding), task="passkey", lengths="128", samples=1, depths=[0.5], dir=tmp_path / "a",
                           quiet=True)
    assert list(rows["predicted"]) == [""] and list(rows["score"]) == [0.0]
    rows = bamctl.evaluate((model, encoding), task="niah_single_1", lengths="256", samples=1, dir=tmp_path / "b",
                           quiet=True)
    assert list(rows["predicted"]) == [""] and list(rows["score"]) == [0.0]
