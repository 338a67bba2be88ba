"""Prior plots and last-query attention for any checkpoint."""

import pytest
import torch

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.engine.stream import StreamingEngine
from bamctl.interpret import prior_curves
from bamctl.model import ModelConfig

PNG = b"\x89PNG\r\n\x1a\n"


def test_last_query_attention_is_a_distribution_and_matches_alibi_decay():
    model = new_random_model(ModelConfig.from_preset("micro", "alibi", vocab_size=97), 0)
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=64)
    weights = engine.last_query_attention(ids)
    assert len(weights) == 2 and weights[0].shape == (4, 200)
    assert torch.allclose(weights[0].sum(-1), torch.ones(4), atol=1e-5)
    # The steepest ALiBi head (slope 1/4) puts more weight near the query than far from it.
    assert weights[0][0, -20:].sum() > weights[0][0, :20].sum()


def test_prior_curves_follow_the_ggd_formula():
    model = new_random_model(ModelConfig.from_preset("micro", "bam", vocab_size=97), 0)
    prior = model.layers[1].attention.prior
    with torch.no_grad():
        prior.theta_alpha.fill_(-1.0)
        prior.theta_beta.copy_(torch.tensor([-0.5, 0.0, 0.5, 1.0]))
    distances, curves = prior_curves(model, 1000)
    expected = -((torch.tensor(distances, dtype=torch.float64) + 1e-5)[None] ** prior.theta_beta.double()[:, None]) * torch.exp(torch.tensor(-1.0))
    assert torch.allclose(torch.tensor(curves[1], dtype=torch.float64), expected, rtol=1e-4)
    assert curves[1][0][-1] > curves[1][0][0]  # beta < 0: far tokens favoured


def test_inspect_draws_priors_and_attention(tmp_path):
    path = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=128), 0), tmp_path / "m")
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(path), "--plot", str(tmp_path / "p.png"), "--attention-map", str(tmp_path / "a.png"), "--length", "300"])
    assert exit_info.value.code == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG and (tmp_path / "a.png").read_bytes()[:8] == PNG


def test_plot_of_a_model_without_prior_is_one_clear_error(tmp_path, capsys):
    path = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "rope"), 0), tmp_path / "m")
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", str(path), "--plot", str(tmp_path / "p.png")])
    assert exit_info.value.code == 2 and "has no attention bias to draw" in capsys.readouterr().err
