"""``--dtype autocast-bfloat16``: float32 weights, the forward under ``torch.autocast``, as the
BAM authors' evaluation runs their models (their evaluate.py keeps the float32 checkpoint and
wraps the forward in ``torch.autocast(device_type, dtype=torch.bfloat16)``).

Under autocast the projections and the head run in bfloat16 while the residual stream, the
norms, the priors and SSMax stay float32. ``--dtype bfloat16`` instead casts the weights, and
its residual stream is bfloat16: another number.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from authors_bam_ssmax import SSMaxBATModelArgs, SSMaxBATransformer, randomise, save_like_train_py, train_py_args
from bamctl.attention_math import dense_attention
from bamctl.backends import RunOptions, open_backend
from bamctl.backends.authors import load_authors_checkpoint
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.engine import stream
from bamctl.engine.stream import StreamingEngine
from bamctl.errors import BamctlError
from bamctl.model import ForwardState, ModelConfig

VOCAB, LENGTH = 96, 200
TOKENS = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def their_checkpoint(tmp_path_factory):
    """Their bam_ssmax (restated layout, tests/authors_bam_ssmax.py), three layers, as train.py saves it."""
    args = SSMaxBATModelArgs(dim=64, n_layers=3, n_heads=4, vocab_size=VOCAB, ffn_dim_multiplier=2, max_seq_len=16,
                             max_batch_size=4, train_loc=True, global_positional_encoding=False)
    model = SSMaxBATransformer(args)
    randomise(model, 0)
    folder = tmp_path_factory.mktemp("autocast") / "run"
    save_like_train_py(model, folder, train_py_args(16, global_prior=False))
    return folder


def float32_attention(q, k, v, inputs):
    """The attention core computed in float32 on what it is handed (autocast off), as the authors'
    FlexAttention does with bfloat16 q, k, v. Left under autocast, the dense kernel's products
    would be rounded to bfloat16, as their pre-flex matmul code was."""
    with torch.autocast("cpu", enabled=False):
        return dense_attention(q, k, v, inputs)


def autocast_reference(model) -> torch.Tensor:
    """The plain reference: the model's dense forward, whole sequence, under CPU autocast."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return model.output(model.hidden(TOKENS[None], 0, ForwardState(kernel=float32_attention))).float()[0]


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits.float(), -1)[:-1].gather(1, TOKENS[1:, None])[:, 0]


def bfloat16_ulp(x: float) -> float:
    """The spacing of bfloat16 values around ``x`` (8 significant bits)."""
    return 2.0 ** (torch.tensor(abs(x)).log2().floor().item() - 7)


@pytest.mark.parametrize("attention", ["dense", "blockwise", "native", "fused"])
def test_autocast_equals_the_dense_autocast_reference(their_checkpoint, attention):
    """Every CPU path, chunked through the KV cache, gives the reference's logits to within 2 bfloat16
    steps at the logits' size (the head's output is bfloat16; the native and fused paths fold SSMax
    into q before the product, a float32 rounding that can turn one bfloat16 attention output into
    its neighbour: 1 step measured, 0 for dense and blockwise). Casting the weights instead is off
    by more than 10 such steps (24 measured: its residual stream is bfloat16), 0.02 nats on average."""
    model = load_authors_checkpoint(their_checkpoint).model
    expected = autocast_reference(copy.deepcopy(model))
    tolerance = 2 * bfloat16_ulp(expected.abs().max().item())

    engine = StreamingEngine(copy.deepcopy(model), device="cpu", dtype="autocast-bfloat16", chunk_size=64, attention=attention)
    got = engine.logits_at(TOKENS.tolist(), list(range(LENGTH)))
    assert (got - expected).abs().max() <= tolerance
    assert (log_probs(got) - log_probs(expected)).abs().mean() < 1e-3

    cast = StreamingEngine(copy.deepcopy(model), device="cpu", dtype="bfloat16", chunk_size=64, attention=attention)
    cast_logits = cast.logits_at(TOKENS.tolist(), list(range(LENGTH)))
    assert (cast_logits - expected).abs().max() > 10 * tolerance
    assert (log_probs(cast_logits) - log_probs(expected)).abs().mean() > 0.02


def test_weights_stay_float32_and_kernels_get_bfloat16_outside_autocast(their_checkpoint, monkeypatch):
    """Every parameter keeps its float32 value (the priors and SSMax scales bit for bit, as under
    bfloat16); the KV cache holds the projections' bfloat16; each kernel is handed bfloat16 q, k, v
    with autocast off inside it."""
    handed = []

    def spy(q, k, v, inputs):
        handed.append((q.dtype, k.dtype, v.dtype, torch.is_autocast_enabled("cpu")))
        return dense_attention(q, k, v, inputs)

    monkeypatch.setitem(stream.ATTENTION_PATHS, "dense", lambda: spy)
    model = load_authors_checkpoint(their_checkpoint).model
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine = StreamingEngine(model, device="cpu", dtype="autocast-bf16", chunk_size=64, attention="dense")
    for name, p in engine.model.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p, saved[name]), name
    assert engine.precision.label == "autocast-bfloat16" and engine.precision.activations == torch.bfloat16
    engine.token_nll(TOKENS.tolist())
    assert handed and set(handed) == {(torch.bfloat16, torch.bfloat16, torch.bfloat16, False)}


def test_rows_record_autocast_apart_from_bfloat16(tmp_path, capsys):
    """A rerun under autocast after bfloat16 is computed, not resumed, and tabled apart."""
    from test_fingerprints import run

    from bamctl.results.store import ResultStore

    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=128), 0)
    path = save_checkpoint(model, tmp_path / "m")
    out = tmp_path / "r"
    passkey = ["--task", "passkey", "--lengths", "128", "--samples", "2", "--depths", "0.5", "--dir", str(out)]
    run(capsys, "compare", str(path), *passkey, "--dtype", "bfloat16")
    captured = run(capsys, "compare", str(path), *passkey, "--dtype", "autocast-bf16")
    assert "skipped" not in captured.err
    assert sorted(ResultStore(out).read()["dtype"]) == ["autocast-bfloat16"] * 2 + ["bfloat16"] * 2


def test_the_authors_backend_runs_autocast(their_checkpoint, tmp_path):
    from test_external_authors import _word_tokenizer

    tokenizer = _word_tokenizer(tmp_path / "tokenizer.json", VOCAB - 2)
    backend = open_backend(f"bam:{their_checkpoint}", RunOptions(device="cpu", dtype="autocast-bfloat16", tokenizer=str(tokenizer)))
    assert backend.dtype == "autocast-bfloat16"
    assert backend.engine.model.layers[0].attention.wq.weight.dtype == torch.float32


@pytest.mark.parametrize("dtype", ["autocast-bfloat16", "autocast-bf16"])
@pytest.mark.parametrize("reference", ["hf:/nowhere", "vllm:/nowhere"])
def test_backends_running_one_dtype_refuse_autocast_by_name(reference, dtype):
    """Before any work: the option types refuse it (they know the names by their prefix)."""
    from bamctl.backends.base import AUTOCAST_PREFIX
    from bamctl.devices import AUTOCAST_DTYPES, resolve_dtype

    assert dtype in AUTOCAST_DTYPES and all(name.startswith(AUTOCAST_PREFIX) for name in AUTOCAST_DTYPES)
    with pytest.raises(BamctlError) as err:
        open_backend(reference, RunOptions(dtype=dtype))
    assert f"--dtype {dtype} does not apply to" in str(err.value)
    with pytest.raises(BamctlError, match="streaming engine only"):  # any other caller of one dtype
        resolve_dtype(dtype, torch.device("cpu"))
