"""The heatmap's and the grid's colours read in greyscale print and by red-green colour-blind
readers: a score's colour gets lighter as the score rises (so the order survives without hue), it
stays so under a simulated deuteranopia, and every number written in a cell contrasts with it.
The red-to-green map they had (RdYlGn) is lightest in the middle and its two ends are one dark
brown to a red-green colour-blind reader."""

from __future__ import annotations

import numpy as np
import pytest

from bamctl.results.plots import grid_figure, heatmap_figure

from results_fakes import frame_of, passkey_grid

SCORES = np.linspace(0.0, 1.0, 21)
# Viénot, Brettel & Mollon (1999): what a deuteranope sees, on linear RGB
DEUTERANOPIA = np.array([[0.29275, 0.70725, 0.0], [0.29275, 0.70725, 0.0], [-0.02234, 0.02234, 1.0]])


def linear(rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb, dtype=float)[..., :3]
    return np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)


def luminance(linear_rgb: np.ndarray) -> np.ndarray:
    return linear_rgb @ np.array([0.2126, 0.7152, 0.0722])


def contrast(a: float, b: float) -> float:
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def score_images():
    rows = frame_of(passkey_grid())
    yield "heatmap", heatmap_figure(rows).axes[0].images[0]
    yield "grid", grid_figure(rows).axes[0].images[0]


@pytest.mark.parametrize("which", ["heatmap", "grid"])
def test_a_higher_score_is_a_lighter_cell_also_to_a_deuteranope(which):
    image = dict(score_images())[which]
    seen = linear(image.to_rgba(SCORES))
    grey = luminance(seen)
    assert np.all(np.diff(grey) > 0), f"{which}: lightness not rising with the score ({image.get_cmap().name})"
    assert grey[-1] - grey[0] > 0.5  # from dark to light, not two shades of one grey
    deuteranope = luminance(np.clip(seen @ DEUTERANOPIA.T, 0.0, 1.0))
    assert np.all(np.diff(deuteranope) > 0) and deuteranope[-1] - deuteranope[0] > 0.5


def test_every_number_written_in_a_cell_contrasts_with_it():
    from matplotlib.colors import to_rgba

    from test_plots_readable import perplexity_frame

    rows = frame_of(passkey_grid())
    for fig in (heatmap_figure(rows), grid_figure(rows), grid_figure(perplexity_frame())):
        ax = fig.axes[0]
        (image,) = ax.images
        cells = image.get_array()
        assert ax.texts
        for text in ax.texts:
            x, y = text.get_position()
            cell = float(luminance(linear(image.to_rgba(cells[int(round(y)), int(round(x))]))))
            ink = float(luminance(linear(to_rgba(text.get_color()))))
            assert contrast(cell, ink) >= 4.5, (text.get_text(), text.get_color())  # WCAG's ratio for small text
