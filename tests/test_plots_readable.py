"""Plots that can be read: the perplexity grid writes the ratio it colours, the curves' legend
covers no data, and the priors plot shows every head, however steep the steepest."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from bamctl.results.plots import curves_figure, grid_figure, heatmap_figure

from results_fakes import fake_row, frame_of, passkey_grid


def drawn(fig):
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig


def perplexity_frame():
    """tiny-rope's perplexity triples from 512 to 2k; tiny-bam's stays."""
    rows = []
    for model, growth in (("tiny-rope", 3.0), ("tiny-bam", 1.0)):
        for step, length in enumerate((512, 1024, 2048)):
            mean_nll = math.log(10.0 * growth ** (step / 2))
            rows.append(fake_row(model, task="ppl", protocol="sliding", scoring="nll", length=length, depth=None,
                                 score=mean_nll, nll=mean_nll * (length - 1), n_scored=length - 1))
    return frame_of(rows)


def test_the_perplexity_grid_writes_the_ratio_its_colour_shows():
    (ax, *_) = grid_figure(perplexity_frame(), models=["tiny-rope", "tiny-bam"]).axes
    texts = [t.get_text() for t in ax.texts]
    assert texts[:3] == ["10\n×1", "17.3\n×1.73", "30\n×3"]  # tiny-rope: 10 → 30, three times its first
    assert texts[3:] == ["10\n×1", "10\n×1", "10\n×1"]
    colours = ax.images[0].get_array()
    assert colours[0, 2] == np.log2(3.0) and colours[1, 2] == 0.0  # the colour is log2 of the written ratio


def test_the_curves_legend_covers_no_panel():
    fig = drawn(curves_figure(frame_of(passkey_grid())))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_the_priors_plot_shows_every_head_that_moves():
    from bamctl.catalog import resolve_model
    from bamctl.interpret import priors_figure

    model = resolve_model("bam").model  # one head per layer reaches -1e5 and more, the others a few logits
    fig = drawn(priors_figure(model, 8192))
    for ax in fig.axes:
        height = ax.get_window_extent().height
        for line in ax.get_lines():
            y = line.get_ydata()
            if len(y) < 3 or np.ptp(y) < 1.0:  # the training-length marker, or a head that stays flat
                continue
            pixels = ax.transData.transform(np.column_stack([line.get_xdata(), y]))[:, 1]
            assert np.ptp(pixels) > 0.1 * height, (ax.get_title(), line.get_label())


LONG_NAMES = {  # two checkpoints that share a folder name are told apart by their whole paths
    "tiny-rope": "/home/researcher/experiments/2026-11-rope-baseline/checkpoints/step-500",
    "tiny-bam": "/home/researcher/experiments/2026-11-bam-ggd-prior/checkpoints/step-500",
}


def long_named(rows):
    return frame_of(rows).assign(model=lambda f: f["model"].map(LONG_NAMES))


def test_long_model_names_wrap_and_every_panel_keeps_its_room(recwarn):
    """Found by running `compare a/checkpoints/step-500 b/checkpoints/step-500`: the labels
    are whole paths, the fixed legend and tick room overflowed and constrained layout gave up
    (a UserWarning, panels of zero width in the PNG) or cut titles at the page's edge."""
    rows = long_named(passkey_grid(lengths=(512, 1024)))
    for fig in (curves_figure(rows), grid_figure(rows, baseline=LONG_NAMES["tiny-rope"]), heatmap_figure(rows)):
        drawn(fig)
        renderer = fig.canvas.get_renderer()
        page = fig.get_window_extent(renderer)
        panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        named = ""
        for ax in panels:
            box = ax.get_window_extent(renderer)
            assert box.width > 0.3 * page.width / len(panels) and box.height > 0.3 * page.height
            texts = ax.get_yticklabels() + [ax.title] + (ax.get_legend().get_texts() if ax.get_legend() else [])
            for text in texts:
                lines = text.get_text().splitlines()
                assert max(map(len, lines), default=0) <= 60, lines
                extent = text.get_window_extent(renderer)
                assert page.x0 <= extent.x0 and extent.x1 <= page.x1, text.get_text()  # nothing cut at the edge
            ticks = [t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text()]
            assert not any(a.overlaps(b) for i, a in enumerate(ticks) for b in ticks[i + 1:])  # wrapped rows fit
            named += " ".join(t.get_text().replace("\n", "") for t in texts)
        assert all(name in named for name in LONG_NAMES.values())  # wrapped, each path still whole
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)], [str(w.message) for w in recwarn]
