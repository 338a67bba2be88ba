"""What a checkpoint learned about position: its priors, and where its last query attends.

The BAM paper reads its models through two figures: each head's prior (bias against
distance, log axis), where heads with beta <= 0 stay flat or rise with distance, and
the attention of the final query on a passkey prompt, where those heads reach the
key. Both are drawn here for any checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from bamctl.errors import BamctlError
from bamctl.plotting import save_figure


def prior_curves(model, max_distance: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distances (log-spaced, 1..max_distance) and, per layer, bias (H, D) of each head's prior.

    A prior that depends on the query's position too (FIRE) is drawn for the query at
    ``max_distance``, looking back over every distance.
    """
    distances = np.unique(np.geomspace(1, max_distance, 200).astype(int))
    curves = []
    for block in model.layers:
        prior = block.attention.prior
        if prior is None:
            raise BamctlError(f"{model.config.label} has no attention bias to draw (its positions are not a bias)")
        with torch.no_grad():
            if getattr(prior, "query_dependent", False):
                query = torch.tensor([int(distances[-1])])
                curve = prior.bias(query, query - torch.as_tensor(distances))[:, 0].float().cpu().numpy()
            else:
                curve = prior.distance_table(int(distances[-1])).float().cpu().numpy()[:, distances]
        curves.append(curve)
    return distances, curves


def plot_priors(model, path: Path, max_distance: int) -> Path:
    distances, curves = prior_curves(model, max_distance)
    config = model.config
    fig = Figure(figsize=(4.2 * len(curves), 3.4), layout="constrained")
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    betas = _betas(model)
    for layer, (ax, curve) in enumerate(zip(axes, curves)):
        for head, values in enumerate(curve):
            label = f"h{head}" + (f" β={betas[layer][head]:.2f}" if betas else "")
            ax.plot(distances, values, label=label)
        ax.set_xscale("log")
        ax.axvline(config.train_length, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("distance i - j (tokens)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel("prior bias (logits)")
    fig.suptitle(f"{config.label}: learned priors (dashed: training length {config.train_length})")
    return save_figure(fig, path)


def plot_last_query_attention(weights: list[torch.Tensor], needle_positions: list[int], path: Path, title: str) -> Path:
    """Per layer, each head's attention of the final token over positions; needles marked."""
    fig = Figure(figsize=(4.2 * len(weights), 3.4), layout="constrained")
    axes = fig.subplots(1, len(weights), squeeze=False)[0]
    for layer, (ax, w) in enumerate(zip(axes, weights)):
        positions = np.arange(w.shape[1])
        for head, row in enumerate(w.numpy()):
            ax.plot(positions, row, label=f"h{head}", linewidth=0.8)
        for needle in needle_positions:
            ax.axvline(needle, color="red", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylim(bottom=1e-6)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("key position")
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel("attention of the last token")
    fig.suptitle(title)
    return save_figure(fig, path)


def _betas(model) -> list[list[float]] | None:
    priors = [block.attention.prior for block in model.layers]
    if not all(hasattr(p, "theta_beta") for p in priors):
        return None
    return [p.theta_beta.detach().cpu().tolist() for p in priors]
