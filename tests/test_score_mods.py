"""FlexAttention's ``score_mod`` as a PE plugin hook, with FlexAttention's signature and meaning
(``score_mod(score, b, h, q_idx, kv_idx)`` returns the new score): attention-gym's own mods run
unchanged (examples/positional/score_mods.py), on every path that walks tiles, and give what
FlexAttention itself computes with them; its ALiBi gives `--pe alibi`'s rows."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

import bamctl
from bamctl.attention_math import AttentionInputs, dense_attention
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.model import ModelConfig

pytest.importorskip("attn_gym", reason="attention-gym (pip install attn-gym, in the dev extra) gives the score_mods")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "positional"
GYM_ALIBI = f"{EXAMPLES / 'score_mods.py'}:GymALiBi"
GYM_SOFTCAP = f"{EXAMPLES / 'score_mods.py'}:GymSoftcapALiBi"


def _model(pe: str, seed: int = 0):
    return new_random_model(ModelConfig.from_preset("micro", pe, train_length=128), seed)


def test_attention_gyms_alibi_score_mod_gives_the_zoos_alibi_rows(tmp_path):
    zoo, gym = _model("alibi"), _model(GYM_ALIBI)
    assert zoo.state_dict().keys() == gym.state_dict().keys()
    assert all(torch.equal(zoo.state_dict()[k], gym.state_dict()[k]) for k in zoo.state_dict())
    paths = [str(save_checkpoint(m, tmp_path / name)) for m, name in ((zoo, "zoo"), (gym, "gym"))]
    keys = ["length", "seed", "sample", "depth"]
    for task, extra in (("passkey", {"samples": 2, "depths": [0.0, 0.5]}), ("ppl", {})):
        rows = [bamctl.evaluate(p, task=task, lengths="256,1k", dir=tmp_path / task, quiet=True, **extra) for p in paths]
        a, b = (r.sort_values(keys).reset_index(drop=True) for r in rows)
        if task == "passkey":
            assert list(a["predicted"]) == list(b["predicted"]) and list(a["score"]) == list(b["score"])
        else:  # the zoo's on the native kernel, the mod pair by pair on blockwise: float32 rounding apart
            assert ((a["score"] - b["score"]).abs() < 1e-5).all(), (a["score"], b["score"])
        assert a["model_hash"].iloc[0] != b["model_hash"].iloc[0]


def _flex_reference(q, k, v, mod, q_start: int):
    """FlexAttention itself (its eager form) with the mod, causal, queries at q_start.. against keys 0.."""
    from torch.nn.attention.flex_attention import flex_attention

    def causal(score, b, h, q_idx, kv_idx):
        new = mod(score, b, h, q_idx + q_start, kv_idx)
        return torch.where(q_idx + q_start >= kv_idx, new, torch.full_like(new, float("-inf")))

    eager = torch.compile(flex_attention, dynamic=False, backend="eager")
    return eager(q, k, v, score_mod=causal, scale=1 / math.sqrt(q.shape[-1]))


@pytest.mark.parametrize("path", ["dense", "blockwise", "flex"])
@pytest.mark.parametrize("q_start", [0, 384])
@torch.inference_mode()
def test_a_score_mod_on_every_tile_path_is_what_flexattention_computes_with_it(path, q_start, eager_flex):
    from bamctl.engine import flex
    from bamctl.engine.attention import blockwise_attention

    if path == "flex" and not flex.flex_available()[0]:
        pytest.skip("FlexAttention needs torch >= 2.5 on CUDA or an x86 CPU")
    model = _model(GYM_SOFTCAP)
    prior = model.layers[0].attention.prior
    generator = torch.Generator().manual_seed(q_start)
    heads, tq, dim = 4, 256, 16
    q = torch.randn(1, heads, tq, dim, generator=generator) * 3  # scores past the cap, so tanh bends them
    k = torch.randn(1, heads, q_start + tq, dim, generator=generator) * 3
    v = torch.randn(1, heads, q_start + tq, dim, generator=generator)
    inputs = AttentionInputs(q_start=q_start, bias_table=None, ssmax_scale=None, content_prior=prior)
    kernel = {"dense": dense_attention, "blockwise": lambda *a: blockwise_attention(*a, block_size=128),
              "flex": lambda *a: flex.flex_attention_kernel(*a)}[path]
    wanted = _flex_reference(q, k, v, prior.score_mod, q_start)
    assert torch.allclose(kernel(q, k, v, inputs).float(), wanted.float(), atol=2e-5)
    uncapped = _flex_reference(q, k, v, _model(GYM_ALIBI).layers[0].attention.prior.score_mod, q_start)
    assert not torch.allclose(uncapped, wanted, atol=1e-3)  # the cap changed what attention gives


def test_a_score_mod_plugin_is_refused_by_name_on_the_paths_without_tiles():
    from bamctl.engine.stream import StreamingEngine
    from bamctl.errors import BamctlError

    for path in ("native", "fused"):
        with pytest.raises(BamctlError, match=f"--attention {path} cannot compute"):
            StreamingEngine(_model(GYM_ALIBI), device="cpu", attention=path)
