"""The layer's input reaches a PE (``observe(x, positions)``): Forgetting Attention (Lin et al. 2025),
written as the paper writes it (examples/positional/forgetting.py), equals a plain dense Forgetting
Attention written here from the paper's formula, and streams in chunks as one forward does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bamctl.checkpoint import new_random_model
from bamctl.model import ModelConfig

FORGETTING = f"{Path(__file__).resolve().parents[1] / 'examples' / 'positional' / 'forgetting.py'}:ForgettingGate"


def _model(seed: int = 0):
    model = new_random_model(ModelConfig.from_preset("micro", FORGETTING, train_length=64), seed).eval()
    with torch.no_grad():  # gates spread between nearly open and nearly shut, as a trained model's are
        for layer in model.layers:
            gate = layer.attention.prior.gate
            gate.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(layer.attention.layer_id))
            gate.bias.fill_(1.0)
    return model


def plain_forgetting_attention(attention, x: torch.Tensor) -> torch.Tensor:
    """The paper's Forgetting Attention over a whole sequence, from the layer's weights: o_i =
    sum_j softmax_j(q_i . k_j / sqrt(d) + D_ij) v_j, D_ij = sum_{l=j+1}^{i} log f_l, f_l =
    sigmoid(w . x_l + b), causal; heads merged and projected by W_o."""
    B, T, C = x.shape
    H = attention.n_heads
    d = C // H
    q, k, v = (w(x).view(B, T, H, d).transpose(1, 2) for w in (attention.wq, attention.wk, attention.wv))
    gate = attention.prior.gate
    log_f = F.logsigmoid(x @ gate.weight.T + gate.bias).transpose(1, 2)  # (B, H, T)
    D = torch.zeros(B, H, T, T)
    for i in range(T):
        for j in range(i + 1):
            D[:, :, i, j] = log_f[:, :, j + 1 : i + 1].sum(-1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(d) + D
    logits = logits.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    y = torch.softmax(logits, -1) @ v
    return attention.wo(y.transpose(1, 2).reshape(B, T, C))


@torch.inference_mode()
def test_a_forget_gate_from_the_layers_input_is_the_papers_forgetting_attention():
    model = _model()
    attention = model.layers[1].attention
    seen = {}
    attention.register_forward_hook(lambda module, args, out: seen.update(x=args[0], out=out))
    ids = torch.randint(0, 50257, (2, 40), generator=torch.Generator().manual_seed(0))
    model(ids)
    wanted = plain_forgetting_attention(attention, seen["x"])
    assert torch.allclose(seen["out"], wanted, atol=1e-5), (seen["out"] - wanted).abs().max()
    assert attention.prior.sums.shape == (2, model.config.n_heads, 40)


@pytest.mark.parametrize("path", ["blockwise", "dense", "flex"])
@torch.inference_mode()
def test_forgetting_attention_streams_in_chunks_as_one_forward(path, eager_flex):
    from bamctl.engine import flex
    from bamctl.engine.stream import StreamingEngine

    if path == "flex" and not flex.flex_available()[0]:
        pytest.skip("FlexAttention needs torch >= 2.5 on CUDA or an x86 CPU")
    model = _model()
    ids = torch.randint(0, 50257, (1, 600), generator=torch.Generator().manual_seed(1))
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=128, attention=path)
    streamed = torch.as_tensor(engine.token_nll(ids[0].tolist())).float()
    logprobs = torch.log_softmax(model(ids)[0, :-1].float(), -1)
    wanted = -logprobs.gather(1, ids[0, 1:, None])[:, 0]
    assert torch.allclose(streamed[-wanted.shape[0]:], wanted, atol=1e-4)


def test_forgetting_attention_passes_its_self_check():
    from bamctl.pe_check import failures, run_checks

    checks = run_checks(FORGETTING, train_length=16)
    assert not failures(checks), [(c.name, c.figure) for c in failures(checks)]
