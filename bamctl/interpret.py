"""What a checkpoint learned about position: its priors, and where its last query attends.

The BAM paper reads its models through two figures: each head's prior (bias against
distance, log axis), where heads with beta <= 0 stay flat or rise with distance, and
the attention of the final query on a passkey prompt, where those heads reach the
key. Both are drawn here for any checkpoint.
"""

from __future__ import annotations

import math
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
        drawable = getattr(prior, "query_dependent", False) or callable(getattr(prior, "distance_table", None))
        if prior is None or not drawable:
            raise BamctlError(f"{model.config.label} has no attention bias to draw (its positions are not a bias)")
        with torch.no_grad():
            if getattr(prior, "query_dependent", False):
                query = torch.tensor([int(distances[-1])])
                curve = prior.bias(query, query - torch.as_tensor(distances))[:, 0].float().cpu().numpy()
            else:
                curve = prior.distance_table(int(distances[-1])).float().cpu().numpy()[:, distances]
        curves.append(curve)
    return distances, curves


# Below 1 logit in magnitude the prior's axis is linear, above it logarithmic: one steep head
# reaching -1e5 would otherwise flatten every other head of its layer onto the zero line.
SYMLOG_LINEAR_WITHIN = 1.0


def plot_priors(model, path: Path, max_distance: int) -> Path:
    return save_figure(priors_figure(model, max_distance), path)


def priors_figure(model, max_distance: int) -> Figure:
    """Per layer, each head's prior bias against distance, both axes logarithmic (the bias symmetrically)."""
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
        _symlog_axis(ax, curve)
        ax.axvline(config.train_length, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("distance i - j (tokens)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    axes[0].set_ylabel(f"prior bias (logits; log scale beyond ±{SYMLOG_LINEAR_WITHIN:g})")
    fig.suptitle(f"{config.label}: learned priors (dashed: training length {config.train_length})")
    return fig


def _symlog_axis(ax, curve: np.ndarray) -> None:
    """A symmetric log axis for the biases: no empty half above a prior that stays <= 0, and
    at most about six labelled decades however steep the steepest head."""
    from matplotlib.ticker import FuncFormatter, SymmetricalLogLocator

    finite = curve[np.isfinite(curve)]
    reach = float(np.abs(finite).max()) if finite.size else 1.0
    decades = math.log10(max(reach, 10.0))
    base = 10 ** max(1, math.ceil(decades / 6))
    ax.set_yscale("symlog", linthresh=SYMLOG_LINEAR_WITHIN, base=base)
    ax.yaxis.set_major_locator(SymmetricalLogLocator(base=base, linthresh=SYMLOG_LINEAR_WITHIN))
    ax.yaxis.set_major_formatter(FuncFormatter(_power_of_ten))
    top = float(finite.max()) if finite.size else 0.0
    ax.set_ylim(top=max(SYMLOG_LINEAR_WITHIN, 2 * top))


def _power_of_ten(value: float, _position=None) -> str:
    """-1e5 -> $-10^{5}$ whatever the axis's base; 0 -> 0."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    return f"${sign}10^{{{round(math.log10(abs(value)))}}}$"


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
