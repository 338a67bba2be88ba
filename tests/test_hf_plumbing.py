"""The Hugging Face plumbing that the ``hf:`` and ``vllm:`` back-ends share (bamctl/backends/hf_common.py),
without loading a model: where a reference's files are, the weights' fingerprint (a model's identity),
what a config says about length and positions, the ``--beyond-max`` policy, what goes in front of a
prompt, and a folder's own code, refused unless trusted. Each rule is stated by hand here; where a test
restates an algorithm (the fingerprint's bytes, the memory estimate) it says so."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bamctl.backends import hf_common
from bamctl.backends.base import AS_BUILT, Fitting, ModelPeek
from bamctl.backends.hf_common import (
    LengthPolicy,
    ModelFiles,
    RequestShaper,
    ShapedBackend,
    check_remote_code,
    estimate_bytes,
    find_model,
    locate,
    max_positions,
    model_fingerprint,
    no_questions,
    positional_encoding,
    remote_code,
    trained_length,
)
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest


# -- where a reference's files are ------------------------------------------------------------------

def test_a_folder_with_a_config_is_the_model_whatever_gguf_files_lie_beside_it(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "a.gguf").write_bytes(b"x")
    (tmp_path / "b.gguf").write_bytes(b"y")
    assert locate(tmp_path) == (tmp_path, None)


def test_a_gguf_file_or_a_folder_of_one_gguf_names_that_file(tmp_path):
    (tmp_path / "model-q4.gguf").write_bytes(b"x")
    assert locate(tmp_path / "model-q4.gguf") == (tmp_path, "model-q4.gguf")
    assert locate(tmp_path) == (tmp_path, "model-q4.gguf")


def _weights_file(folder):
    folder.mkdir()
    (folder / "weights.safetensors").write_bytes(b"x")
    return folder / "weights.safetensors"


def _two_ggufs(folder):
    folder.mkdir()
    (folder / "a.gguf").write_bytes(b"x")
    (folder / "b.gguf").write_bytes(b"y")
    return folder


@pytest.mark.parametrize("make, said", [
    (lambda folder: folder, "does not exist"),
    (_weights_file, "is a file; give a model folder (config.json) or a .gguf file"),
    (lambda folder: folder.mkdir() or folder, "is not a Hugging Face model folder (no config.json and no .gguf file)"),
    (_two_ggufs, "is not a Hugging Face model folder (2 .gguf files; name one)"),
])
def test_anything_else_is_refused_saying_what_was_found(tmp_path, make, said):
    path = make(tmp_path / "model")
    with pytest.raises(BamctlError) as refused:
        locate(path)
    assert str(refused.value).startswith(f"hf: {path} ") or str(refused.value).startswith(f"hf: model path {path} ")
    assert said in str(refused.value)


def test_a_local_model_is_named_by_its_folder_or_its_gguf_file_and_has_no_revision(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert find_model(str(folder / ".." / "my-llama")) == ModelFiles(folder / ".." / "my-llama", None, "my-llama", None)
    (tmp_path / "q.gguf").write_bytes(b"x")
    assert find_model(str(tmp_path / "q.gguf")) == ModelFiles(tmp_path, "q.gguf", "q", None)


def test_a_hub_id_is_named_by_its_repository_and_carries_its_commit(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub", reason="huggingface_hub not installed (pip install 'bamctl[hf]')")
    from hub_cache import cache_snapshot, commit_sha, offline_hf_home

    files = tmp_path / "files"
    files.mkdir()
    (files / "config.json").write_text("{}")
    home = offline_hf_home(tmp_path, monkeypatch)
    snapshot = cache_snapshot(home / "hub", "org/model", files, commit_sha("main"), ("main",))
    assert find_model("org/model") == ModelFiles(snapshot, None, "org/model", commit_sha("main"))


def test_without_transformers_the_hf_back_end_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(BamctlError, match=r"^hf: models need transformers: pip install 'bamctl\[hf\]'$"):
        hf_common.import_transformers()


# -- the weights' fingerprint ---------------------------------------------------------------------

def _folder(tmp_path, weights: bytes, *, generation: bool = True):
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 8}')
    if generation:
        (folder / "generation_config.json").write_text('{"eos_token_id": 2}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_the_fingerprint_is_sha256_of_the_configs_then_each_weight_files_name_size_and_bytes(tmp_path):
    # restated from model_fingerprint's docstring: the digest rows were stored under must not move
    folder = _folder(tmp_path, b"0123456789")
    (folder / "tokenizer.json").write_text("{}")  # neither a config that changes the numbers nor weights
    (folder / "helper.py").write_text("x = 1")  # no auto_map: the folder's code is not run
    wanted = hashlib.sha256(b'config.json:{"hidden_size": 8}' + b'generation_config.json:{"eos_token_id": 2}'
                            + b"model.safetensors:10" + b"0123456789").hexdigest()
    assert model_fingerprint(folder, None) == wanted


def test_weight_files_are_hashed_in_name_order_and_only_weight_suffixes_count(tmp_path):
    folder = _folder(tmp_path, b"aa", generation=False)
    (folder / "model-2.bin").write_bytes(b"bbb")
    (folder / "a.pt").write_bytes(b"c")
    (folder / "b.pth").write_bytes(b"d")
    (folder / "notes.txt").write_bytes(b"ignored")
    wanted = hashlib.sha256(b'config.json:{"hidden_size": 8}' + b"a.pt:1c" + b"b.pth:1d" + b"model-2.bin:3bbb"
                            + b"model.safetensors:2aa").hexdigest()
    assert model_fingerprint(folder, None) == wanted


def test_a_gguf_fingerprint_holds_that_file_alone(tmp_path):
    folder = _folder(tmp_path, b"other weights", generation=False)
    (folder / "q4.gguf").write_bytes(b"gguf!")
    wanted = hashlib.sha256(b'config.json:{"hidden_size": 8}' + b"q4.gguf:5gguf!").hexdigest()
    assert model_fingerprint(folder, "q4.gguf") == wanted


def test_a_folder_that_runs_its_own_code_has_that_code_in_its_fingerprint(tmp_path):
    folder = _folder(tmp_path, b"w", generation=False)
    config = json.dumps({"auto_map": {"AutoModel": "modeling_mine.Mine"}})
    (folder / "config.json").write_text(config)
    (folder / "modeling_mine.py").write_text("A = 1")
    (folder / "b_util.py").write_text("B = 2")
    wanted = hashlib.sha256(f"config.json:{config}".encode() + b"b_util.py:B = 2" + b"modeling_mine.py:A = 1"
                            + b"model.safetensors:1w").hexdigest()
    assert model_fingerprint(folder, None) == wanted


def test_past_the_full_hash_limit_each_weight_file_is_sampled_at_its_head_and_tail(tmp_path, monkeypatch):
    weights = bytes(range(40))
    folder = _folder(tmp_path, weights, generation=False)
    monkeypatch.setattr(hf_common, "SAMPLE_BYTES", 8)
    monkeypatch.setattr(hf_common, "FULL_HASH_LIMIT", len(weights))  # at the limit: every byte
    full = model_fingerprint(folder, None)
    assert full == hashlib.sha256(b'config.json:{"hidden_size": 8}' + b"model.safetensors:40" + weights).hexdigest()
    monkeypatch.setattr(hf_common, "FULL_HASH_LIMIT", len(weights) - 1)  # one byte past: head and tail
    sampled = model_fingerprint(folder, None)
    assert sampled == hashlib.sha256(b'config.json:{"hidden_size": 8}' + b"model.safetensors:40"
                                     + weights[:8] + weights[-8:]).hexdigest()
    # a byte in the middle is not read; one in the head or the tail, or the size, is
    (folder / "model.safetensors").write_bytes(weights[:20] + b"X" + weights[21:])
    assert model_fingerprint(folder, None) == sampled
    for edited in (b"X" + weights[1:], weights[:-1] + b"X", weights + b"Z"):
        (folder / "model.safetensors").write_bytes(edited)
        assert model_fingerprint(folder, None) != sampled


def test_the_sampling_limits_are_the_ones_the_schema_states():
    schema = " ".join((Path(__file__).parents[1] / "docs" / "SCHEMA.md").read_text().split())
    assert "past 4 GiB of weights, each weight file by its name, its size and its first and last 16 MiB" in schema
    assert (hf_common.FULL_HASH_LIMIT, hf_common.SAMPLE_BYTES) == (4 * 2**30, 16 * 2**20)


def test_a_weight_file_shorter_than_the_sample_is_read_whole_twice(tmp_path, monkeypatch):
    folder = _folder(tmp_path, b"abc", generation=False)
    (folder / "big.bin").write_bytes(bytes(64))
    monkeypatch.setattr(hf_common, "SAMPLE_BYTES", 8)
    monkeypatch.setattr(hf_common, "FULL_HASH_LIMIT", 10)
    wanted = hashlib.sha256(b'config.json:{"hidden_size": 8}' + b"big.bin:64" + bytes(16)
                            + b"model.safetensors:3" + b"abc" + b"abc").hexdigest()
    assert model_fingerprint(folder, None) == wanted


def test_a_gguf_models_hash_is_of_its_own_file_among_others(tmp_path):
    folder = _folder(tmp_path, b"w", generation=False)
    (folder / "q4.gguf").write_bytes(b"four")
    (folder / "q8.gguf").write_bytes(b"eight")
    hashes = {ModelFiles(folder, name, "m").model_hash() for name in ("q4.gguf", "q8.gguf", None)}
    assert len(hashes) == 3


def test_a_hub_revision_is_part_of_the_model_hash(tmp_path):
    folder = _folder(tmp_path, b"w")
    weights = model_fingerprint(folder, None)[:16]
    assert ModelFiles(folder, None, "m").model_hash() == weights
    revised = ModelFiles(folder, None, "org/m", "abc123").model_hash()
    assert revised == digest([weights, "revision", "abc123"])
    assert revised != ModelFiles(folder, None, "org/m", "def456").model_hash()


# -- what a config says -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"])
def test_the_maximum_context_is_read_under_each_name_configs_give_it(name):
    assert max_positions(SimpleNamespace(**{name: 4096})) == 4096


def test_the_first_name_that_holds_a_positive_integer_wins():
    config = SimpleNamespace(max_position_embeddings=0, n_positions=2048.0, max_sequence_length=-1, seq_length=1024, n_ctx=512)
    assert max_positions(config) == 1024
    assert max_positions(SimpleNamespace(max_position_embeddings=8192, n_positions=2048)) == 8192
    assert max_positions(SimpleNamespace(n_positions="4096")) is None
    assert max_positions(SimpleNamespace(n_positions=1)) == 1  # positive is enough
    assert max_positions(SimpleNamespace(hidden_size=8)) is None


def test_a_multimodal_config_is_read_through_its_text_config():
    text = SimpleNamespace(max_position_embeddings=32768, rope_theta=1e6, model_type="qwen2",
                           rope_scaling={"original_max_position_embeddings": 4096})
    outer = SimpleNamespace(max_position_embeddings=7, model_type="llava", get_text_config=lambda: text)
    assert max_positions(outer) == 32768
    assert trained_length(outer, 32768) == 4096
    assert positional_encoding(outer) == "rope"


@pytest.mark.parametrize("scaling", ["rope_scaling", "rope_parameters"])
def test_a_rope_scaled_model_was_trained_on_its_original_length(scaling):
    config = SimpleNamespace(**{scaling: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}})
    assert trained_length(config, 32768) == 8192


def test_without_an_original_length_the_training_length_is_the_fallback():
    assert trained_length(SimpleNamespace(rope_scaling={"factor": 2.0}, rope_parameters=None), 2048) == 2048
    assert trained_length(SimpleNamespace(rope_scaling={"original_max_position_embeddings": 0}), 2048) == 2048
    assert trained_length(SimpleNamespace(rope_scaling=["not", "a", "dict"]), 512) == 512
    assert trained_length(SimpleNamespace(), None) == 0
    assert isinstance(trained_length(SimpleNamespace(rope_scaling={"original_max_position_embeddings": 4096.0}), 1), int)


@pytest.mark.parametrize("fields, pe", [
    ({"model_type": "falcon", "alibi": True, "rope_theta": 1e4}, "alibi"),
    ({"model_type": "falcon", "alibi": False, "rope_theta": 1e4}, "rope"),
    ({"model_type": "bloom"}, "alibi"),
    ({"model_type": "mpt"}, "alibi"),
    ({"model_type": "llama", "rope_theta": 1e4}, "rope"),
    ({"model_type": "qwen3", "rope_parameters": {"rope_theta": 1e6}}, "rope"),
    ({"model_type": "gptj", "rotary_dim": 64}, "rope"),
    ({"model_type": "gpt_neox", "rotary_emb_base": 1e4}, "rope"),
    ({"model_type": "gpt2"}, "learned"),
    ({"model_type": "opt"}, "learned"),
    ({"model_type": "gpt_neo"}, "learned"),
    ({"model_type": "gptj"}, "learned"),
    ({"model_type": "bert"}, "learned"),
    ({"model_type": "t5"}, "t5"),
])
def test_the_positional_encoding_is_read_from_the_config(fields, pe):
    assert positional_encoding(SimpleNamespace(**fields)) == pe


# -- --beyond-max --------------------------------------------------------------------------------

def test_an_unknown_policy_is_refused_naming_both():
    with pytest.raises(BamctlError, match=r"--beyond-max must be one of warn, refuse, not 'stop'"):
        LengthPolicy("m", 10, "stop")


def test_refuse_stops_past_the_maximum_and_not_at_it(capsys):
    policy = LengthPolicy("tiny", 10, "refuse")
    policy.check(10)
    with pytest.raises(BamctlError) as refused:
        policy.check(11)
    assert str(refused.value) == ("11 tokens exceed tiny's configured maximum of 10 positions (--beyond-max refuse); "
                                  "use --beyond-max warn to run past it")
    LengthPolicy("tiny", None, "refuse").check(10**9)  # no maximum: nothing to refuse
    assert capsys.readouterr().err == ""


def test_warn_runs_past_the_maximum_saying_so_once_on_stderr(capsys):
    policy = LengthPolicy("tiny", 10, "warn")
    policy.check(10)
    assert capsys.readouterr() == ("", "")
    policy.check(12)
    policy.check(13)
    out, err = capsys.readouterr()
    assert out == "" and err == ("warning: tiny: 12 tokens exceed its configured maximum of 10 positions; "
                                 "running beyond it (--beyond-max refuse to stop)\n")


@pytest.mark.parametrize("prefix, ids, after, limit, bos", [
    (1, 9, 0, 10, True),     # BOS and the prompt fill the limit exactly
    (1, 10, 0, 10, False),   # the prompt fills it: its BOS is left out
    (1, 8, 2, 10, False),    # the prompt and the tokens to come fill it
    (1, 7, 2, 10, True),
    (1, 11, 0, 10, True),    # the prompt alone is past it: --beyond-max decides, the BOS stays
    (1, 50, 0, None, True),  # no maximum
    (0, 10, 0, 10, False),   # nothing to put in front
])
def test_the_bos_is_left_out_only_where_it_alone_takes_a_prompt_past_the_maximum(prefix, ids, after, limit, bos):
    policy = LengthPolicy("m", limit, "warn")  # past the maximum: warn and run
    assert policy.prefix_fitting(prefix, ids, after) == Fitting(bos=bos)
    prompt = list(range(5, 5 + ids))
    assert policy.fit_prefix([1] * prefix, prompt, after) == [1] * (prefix if bos else 0) + prompt


def test_fit_prefix_applies_the_policy_to_what_is_fed_and_the_tokens_to_come():
    policy = LengthPolicy("m", 10, "refuse")
    assert policy.prefix_fitting(1, 9) == Fitting(bos=True)  # nothing to come unless said
    assert policy.fit_prefix([1], list(range(9))) == [1, *range(9)]
    assert policy.fit_prefix([1], list(range(8)), after=1) == [1, *range(8)]
    with pytest.raises(BamctlError, match="^12 tokens exceed"):
        policy.fit_prefix([1], list(range(9)), after=2)


def test_fit_applies_the_policy_to_what_is_fed():
    policy = LengthPolicy("m", 10, "refuse")
    with pytest.raises(BamctlError, match="^14 tokens exceed"):
        policy.fit([1], list(range(12)), [7, 8])  # the prompt alone is past it: nothing left out, refused
    assert policy.fit([1], list(range(9)), [7, 8]) == [1, *range(1, 9), 7]  # one prompt token makes room


def test_without_a_prefix_nothing_is_fed_in_front_whatever_fits():
    for limit in (None, 100):
        assert LengthPolicy("m", limit, "warn").continuation_fitting(0, 5, 2) == Fitting(bos=False)
        assert LengthPolicy("m", limit, "warn").prefix_fitting(0, 5, 2) == Fitting(bos=False)


def test_a_shaped_backend_fits_each_request_kind_by_its_own_rule():
    shaped = SimpleNamespace(shaper=SimpleNamespace(prefix=[1]), lengths=LengthPolicy("m", 10, "warn"))
    fitting = ShapedBackend.fitting
    assert fitting(shaped, "teacher_forced", 9, 3) == Fitting(bos=True, dropped=2)
    assert fitting(shaped, "generate", 8, 2) == Fitting(bos=False)  # its answer's tokens come after
    assert fitting(shaped, "generate", 7, 2) == Fitting(bos=True)
    assert fitting(shaped, "token_nll", 10, 5) == Fitting(bos=False)  # nothing comes after
    assert fitting(shaped, "token_nll", 9, 5) == Fitting(bos=True)


# -- the memory estimate -------------------------------------------------------------------------

def _fake_model(dtype=torch.float32, **config):
    model = torch.nn.Linear(3, 5, dtype=dtype)  # 20 parameters
    model.config = SimpleNamespace(**config)
    return model


def test_the_memory_estimate_is_weights_cache_scores_and_activations():
    # restated from estimate_bytes's docstring, for a Llama-like config with grouped keys and values
    model = _fake_model(num_attention_heads=8, hidden_size=64, num_key_value_heads=2, num_hidden_layers=3,
                        intermediate_size=100)
    n, chunk = 1000, 256
    weights = 20 * 4
    cache = 2 * 3 * 2 * (64 // 8) * n * 4
    scores = chunk * n * (4 * 8 + 4)
    activations = 4 * chunk * (8 * 64 + 3 * 100)
    assert estimate_bytes(model, n, chunk) == weights + cache + scores + activations
    assert estimate_bytes(model, 100, chunk) == weights + 2 * 3 * 2 * 8 * 100 * 4 + 100 * 100 * 36 + 4 * 100 * (8 * 64 + 300)


def test_the_memory_estimate_reads_gpt2s_names_an_explicit_head_size_and_the_weights_element():
    model = _fake_model(dtype=torch.bfloat16, n_head=None, num_attention_heads=4, n_embd=32, n_layer=2, head_dim=16)
    n, chunk = 64, 64
    # no key-value heads: as many as the queries'; no intermediate size: four times the hidden
    wanted = 20 * 2 + 2 * 2 * 4 * 16 * n * 2 + chunk * n * (4 * 4 + 2) + 4 * chunk * (8 * 32 + 3 * 128)
    assert estimate_bytes(model, n, chunk) == wanted


def test_a_config_without_heads_or_sizes_is_estimated_as_one_head_and_one_layer():
    for config in ({}, {"num_attention_heads": None, "num_key_value_heads": 0, "num_hidden_layers": 0}):
        model = _fake_model(**config)
        # no hidden size: no cache and no activations; the scores of one head
        assert estimate_bytes(model, 10, 4) == 80 + 4 * 10 * (4 * 1 + 4)


def test_a_config_of_a_hidden_size_alone_is_one_head_of_it_in_one_layer():
    n, chunk = 10, 4
    wanted = 80 + 2 * 1 * 1 * 8 * n * 4 + chunk * n * 8 + 4 * chunk * (8 * 8 + 3 * 32)
    assert estimate_bytes(_fake_model(hidden_size=8), n, chunk) == wanted


def test_a_head_size_from_a_hidden_size_the_heads_do_not_divide_is_whole():
    estimate = estimate_bytes(_fake_model(hidden_size=36, num_attention_heads=8, num_hidden_layers=1), 10, 10)
    assert isinstance(estimate, int)
    assert estimate == 80 + 2 * 8 * 4 * 10 * 4 + 10 * 10 * (32 + 4) + 4 * 10 * (8 * 36 + 3 * 144)  # 36 // 8 = 4


def test_the_memory_estimate_reads_a_multimodal_models_text_config():
    text = SimpleNamespace(num_attention_heads=2, hidden_size=8, num_hidden_layers=1)
    model = _fake_model(get_text_config=lambda: text, num_attention_heads=99, hidden_size=999, num_hidden_layers=99)
    assert estimate_bytes(model, 10, 10) == 80 + 2 * 1 * 2 * 4 * 10 * 4 + 10 * 10 * (8 + 4) + 4 * 10 * (64 + 3 * 32)


# -- what goes in front of a prompt ---------------------------------------------------------------

def _tokenizer(**fields):
    return SimpleNamespace(**{"name": "tok", "has_chat_template": False, "bos_id": 1, "leading_special_ids": [1], **fields})


def test_chat_mode_needs_a_template_and_bos_always_needs_a_bos():
    with pytest.raises(BamctlError, match="^tokenizer tok has no chat template; drop --chat-template$"):
        RequestShaper(_tokenizer(), chat_template=True)
    with pytest.raises(BamctlError, match="^--bos always: tokenizer tok has no BOS token$"):
        RequestShaper(_tokenizer(bos_id=None), chat_template=False, bos="always")
    assert RequestShaper(_tokenizer(bos_id=None), chat_template=False, bos="never").prefix == []


def test_a_tokenizer_that_does_not_say_it_has_a_template_or_a_bos_has_neither():
    bare = SimpleNamespace(name="bare")
    with pytest.raises(BamctlError, match="^tokenizer bare has no chat template; drop --chat-template$"):
        RequestShaper(bare, chat_template=True)
    with pytest.raises(BamctlError, match="^--bos always: tokenizer bare has no BOS token$"):
        RequestShaper(bare, chat_template=False, bos="always")
    assert RequestShaper(bare, chat_template=False).prefix == []  # nothing its own call puts in front


def test_in_chat_mode_nothing_is_put_in_front_the_template_holds_it():
    shaper = RequestShaper(_tokenizer(has_chat_template=True), chat_template=True, bos="always")
    assert shaper.prompt([5, 6]) == [5, 6] and not shaper.bos_for("generate")


def test_a_prompt_fed_as_built_shares_the_engines_feeding_and_anything_around_it_does_not():
    as_built = RequestShaper(_tokenizer(leading_special_ids=[]), chat_template=False)
    assert as_built.fingerprint == AS_BUILT
    bos = RequestShaper(_tokenizer(), chat_template=False).fingerprint
    other_bos = RequestShaper(_tokenizer(bos_id=3), chat_template=False, bos="always").fingerprint
    chat = RequestShaper(_tokenizer(has_chat_template=True), chat_template=True).fingerprint
    # the digests rows were stored under: restated from RequestShaper.fingerprint
    assert bos == digest({"prefix": [1], "chat_template": None, "chat": False})
    assert chat == digest({"prefix": [], "chat_template": None, "chat": True})
    assert len({AS_BUILT, bos, other_bos, chat}) == 4


def test_a_shaped_backend_feeds_and_scores_as_its_shaper_says():
    shaper = RequestShaper(_tokenizer(), chat_template=False)
    backend = SimpleNamespace(shaper=shaper)
    assert ShapedBackend.feeding.fget(backend) == shaper.fingerprint
    assert ShapedBackend.scored_tokens.fget(backend) == "all"
    assert ShapedBackend.bos_for(backend, "teacher_forced") is True
    backend.shaper = RequestShaper(_tokenizer(), chat_template=False, bos="never")
    assert ShapedBackend.bos_for(backend, "teacher_forced") is False


# -- a folder's own code --------------------------------------------------------------------------

def test_a_folders_own_code_is_every_auto_map_entry_of_its_config_and_tokenizer_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "modeling_x.X", "AutoConfig": "conf_x.C"}}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok_x.Slow", None]}}))
    assert remote_code(tmp_path) == {"config.json:AutoModel": "modeling_x.X", "config.json:AutoConfig": "conf_x.C",
                                     "tokenizer_config.json:AutoTokenizer": ["tok_x.Slow", None]}


@pytest.mark.parametrize("config, tokenizer_config", [
    (None, None),                                   # neither file
    ("{not json", json.dumps({"auto_map": "no"})),  # unreadable, and an auto_map that is not a mapping
    ("[1, 2]", json.dumps({"model_max_length": 8})),  # JSON that is not an object, and no auto_map
])
def test_a_folder_without_a_readable_auto_map_has_no_code_of_its_own(tmp_path, config, tokenizer_config):
    for name, text in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        if text is not None:
            (tmp_path / name).write_text(text)
    assert remote_code(tmp_path) == {}
    check_remote_code(tmp_path, "m", trusted=False)


def test_a_broken_config_does_not_hide_the_tokenizers_code(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["t.T", "t.TFast"]}}))
    assert remote_code(tmp_path) == {"tokenizer_config.json:AutoTokenizer": ["t.T", "t.TFast"]}


def test_a_folders_code_is_refused_untrusted_naming_its_files_and_where_they_are_mapped(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "org/repo--modeling_x.X",
                                                                   "AutoConfig": "configuration_x.C"}}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok_x.Slow", None]}}))
    with pytest.raises(BamctlError) as refused:
        check_remote_code(tmp_path, "mine", trusted=False)
    assert str(refused.value) == ("hf: mine runs its own code (configuration_x.py, modeling_x.py, tok_x.py in the auto_map "
                                  "of config.json and tokenizer_config.json); read it, then pass --trust-remote-code to run it")
    check_remote_code(tmp_path, "mine", trusted=True)


def test_an_auto_map_of_no_class_names_is_refused_as_an_auto_map(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": 7}}))
    with pytest.raises(BamctlError, match=r"^hf: m runs its own code \(auto_map in the auto_map of config.json\)"):
        check_remote_code(tmp_path, "m", trusted=False)


def test_while_transformers_loads_stdin_is_empty_and_stdout_goes_to_stderr(capsys):
    stdin = sys.stdin
    with no_questions():
        print("transformers says")
        with pytest.raises(EOFError):
            input("run this folder's code? [y/N] ")
    out, err = capsys.readouterr()
    assert out == "" and "transformers says" in err
    assert sys.stdin is stdin
    with pytest.raises(RuntimeError):
        with no_questions():
            raise RuntimeError
    assert sys.stdin is stdin
    print("bamctl's table")
    assert capsys.readouterr().out == "bamctl's table\n"


# -- the config, read -----------------------------------------------------------------------------

def test_peek_reads_the_training_and_maximum_length_from_the_config_alone(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    config = transformers.LlamaConfig(max_position_embeddings=4096, rope_scaling={
        "rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 1024})
    config.save_pretrained(tmp_path / "scaled")
    assert hf_common.peek(str(tmp_path / "scaled")) == ModelPeek(train_length=1024, max_length=4096)
    transformers.LlamaConfig(max_position_embeddings=2048).save_pretrained(tmp_path / "plain")
    assert hf_common.peek(str(tmp_path / "plain")) == ModelPeek(train_length=2048, max_length=2048)  # trained on all of it


def test_reading_a_config_runs_no_folder_code_unless_trusted(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    folder = tmp_path / "their-model"
    transformers.LlamaConfig().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    (folder / "configuration_x.py").write_text("raise SystemExit('their code ran')")
    for refused in (lambda: hf_common.read_config(str(folder)), lambda: hf_common.peek(str(folder)),
                    lambda: hf_common.peek(str(folder), SimpleNamespace())):
        with pytest.raises(BamctlError, match=r"^hf: their-model runs its own code \(configuration_x.py in the auto_map"):
            refused()


class _AutoConfigSpy:
    """Records what bamctl asks transformers' AutoConfig for; answers a config, or raises."""

    def __init__(self, raises: Exception | None = None):
        self.asked, self.raises = [], raises

    def from_pretrained(self, folder, **options):
        self.asked.append((folder, options))
        if self.raises is not None:
            raise self.raises
        return SimpleNamespace(max_position_embeddings=64)


def test_a_config_is_read_from_local_files_only_with_its_gguf_file_and_the_trust_given(tmp_path, monkeypatch):
    # what bamctl asks of transformers, stated: never the network, the GGUF file the reference names
    # (reading one needs the gguf package), and trust_remote_code as the user gave it
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    spy = _AutoConfigSpy()
    monkeypatch.setattr(hf_common.import_transformers(), "AutoConfig", spy)
    (tmp_path / "q4.gguf").write_bytes(b"GGUF")
    hf_common.read_config(str(tmp_path / "q4.gguf"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    hf_common.read_config(str(tmp_path / "folder"), trust_remote_code=1)
    assert spy.asked == [(str(tmp_path), {"local_files_only": True, "trust_remote_code": False, "gguf_file": "q4.gguf"}),
                         (str(tmp_path / "folder"), {"local_files_only": True, "trust_remote_code": True})]


@pytest.mark.parametrize("error", [OSError("no file named config.json\nsee the docs"), ValueError("bad value\nmore")])
def test_a_config_transformers_cannot_read_is_its_first_line_naming_the_model(tmp_path, monkeypatch, error):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    monkeypatch.setattr(hf_common.import_transformers(), "AutoConfig", _AutoConfigSpy(raises=error))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BamctlError) as refused:
        hf_common.read_config(str(tmp_path))
    assert str(refused.value) == f"cannot read the config of {tmp_path}: {str(error).splitlines()[0]}"


def test_an_architecture_transformers_does_not_know_is_one_line(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(BamctlError) as refused:
        hf_common.read_config(str(tmp_path))
    said = str(refused.value)
    assert said.startswith(f"cannot read the config of {tmp_path}: ") and "\n" not in said
