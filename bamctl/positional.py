"""Positional encodings (PE) as data: a registry of what each one changes in the model.

A PE can touch three places, and each entry says which:

- the input embeddings (``sinusoidal``: absolute sinusoids added to token embeddings),
- queries and keys (``rope``: rotary embedding),
- the attention logits, as a bias that depends only on the distance ``i - j`` between
  query ``i`` and key ``j`` (``alibi``, ``bam``). Such a bias is a *prior* over offsets
  (BAM paper, arXiv 2505.22842): the engine asks each layer's prior for a 1-D table
  ``(H, max_distance + 1)`` and indexes it, so no ``n x n`` bias ever exists.

``nope`` touches nothing but the causal mask. Any PE may add Scalable-Softmax (SSMax,
arXiv 2501.19399) by the suffix ``-ssmax``: that is a model switch, not a PE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from bamctl.errors import BamctlError, did_you_mean

# exp() of anything above this would overflow float32 once SSMax multiplies it by
# s * log(n); -exp(80) = -5.5e34 is already "minus infinity" for a softmax.
LOG_BIAS_CAP = 80.0
# The authors' epsilon inside |d - mu| + eps: keeps d = 0 finite when beta < 0.
GGD_EPS = 1e-5


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's geometric head slopes (Press et al. 2022), with its rule for non-powers of 2."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


class ALiBiPrior(nn.Module):
    """Laplace prior: bias ``-m_h * |i - j|`` with fixed slopes ``m_h``."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    def distance_table(self, max_distance: int) -> torch.Tensor:
        distance = torch.arange(max_distance + 1, device=self.slopes.device, dtype=torch.float32)
        return -self.slopes[:, None].float() * distance  # (H, D+1)


class GGDPrior(nn.Module):
    """Generalized-Gaussian prior of GGD-BAM, per head.

    The paper writes the bias as ``-|(d - mu) / alpha|^beta``. We parametrise it as the
    authors' code does, which trains well from ``theta = 0`` (a flat prior):

        bias(d) = -(|d - mu| + eps) ** theta_beta * exp(theta_alpha),
        mu      = exp(theta_mu) - exp(-theta_mu)          (theta_mu frozen at 0 by default)

    so ``beta = theta_beta`` and ``alpha = exp(-theta_alpha / theta_beta)``. ``beta = 1``
    is ALiBi with slope ``exp(theta_alpha)``; ``beta = 0`` a constant, i.e. NoPE.

    Overflow guard: with ``beta < 0`` the power at ``d = 0`` is ``eps ** beta``, which
    overflows float32 for ``beta < -7.7`` (1e-5 ** -8 = 1e40). We evaluate the magnitude in
    log space, ``exp(min(beta * log(|d - mu| + eps) + theta_alpha, 80))``: identical where
    the authors' form is finite, -5.5e34 instead of -inf where it is not, and gradients
    stay finite (zero where capped) for every theta.
    """

    def __init__(self, n_heads: int, init: str = "flat", train_mu: bool = False):
        super().__init__()
        if init == "flat":
            alpha, beta = torch.zeros(n_heads), torch.zeros(n_heads)
        elif init == "alibi":
            alpha, beta = torch.tensor(alibi_slopes(n_heads)).log(), torch.ones(n_heads)
        elif init == "alibi-linear":
            # The authors' scale_init = "slope", shape_init = "linear": ALiBi's slopes, beta
            # spread evenly from 0 (first head, steepest slope) to 1 (last head).
            alpha, beta = torch.tensor(alibi_slopes(n_heads)).log(), torch.linspace(0, 1, n_heads)
        else:
            raise BamctlError(f"unknown BAM init {init!r}; use 'flat', 'alibi' or 'alibi-linear'")
        self.theta_alpha = nn.Parameter(alpha)  # (H,)
        self.theta_beta = nn.Parameter(beta)  # (H,)
        self.theta_mu = nn.Parameter(torch.zeros(n_heads), requires_grad=train_mu)  # (H,)

    @property
    def mu(self) -> torch.Tensor:
        return self.theta_mu.exp() - (-self.theta_mu).exp()

    def distance_table(self, max_distance: int) -> torch.Tensor:
        # Distance d = i - j >= 0 under the causal mask; the authors' offset is j - i = -d.
        offset = -torch.arange(max_distance + 1, device=self.theta_beta.device, dtype=torch.float32)
        z = (offset[None, :] - self.mu.float()[:, None]).abs() + GGD_EPS  # (H, D+1)
        log_magnitude = self.theta_beta.float()[:, None] * z.log() + self.theta_alpha.float()[:, None]
        return -log_magnitude.clamp(max=LOG_BIAS_CAP).exp()

    def effective(self) -> dict[str, torch.Tensor]:
        """The paper's (alpha, beta, mu) per head; alpha is inf where beta = 0 (a flat prior)."""
        beta = self.theta_beta.detach()
        alpha = torch.where(
            beta == 0, torch.full_like(beta, math.inf), (-self.theta_alpha.detach() / beta).exp()
        )
        return {"alpha": alpha, "beta": beta, "mu": self.mu.detach(), "scale": self.theta_alpha.detach().exp()}


SINUSOIDAL_LAYOUTS = ("vaswani", "bam")


def sinusoidal_encoding(
    positions: torch.Tensor, dim: int, base: float = 10000.0, layout: str = "vaswani"
) -> torch.Tensor:
    """Absolute sinusoids, sin on even channels and cos on odd ones. (T,) -> (T, dim).

    ``layout="vaswani"``: channels 2k and 2k+1 share the frequency ``base^(-2k/dim)``
    (Vaswani et al.). ``layout="bam"``: the authors' code gives the cos channel 2k+1 its
    own frequency ``base^(-(2k+1)/dim)``; their checkpoints need it.
    """
    channel = torch.arange(dim, device=positions.device, dtype=torch.float32)
    if layout == "vaswani":
        inv_freq = torch.exp(-math.log(base) * (channel - channel.remainder(2)) / dim)  # 2k+1 -> 2k
    elif layout == "bam":
        inv_freq = torch.exp(channel * -(math.log(base) / dim))  # their order of operations, bit for bit
    else:
        raise BamctlError(f"unknown sinusoidal layout {layout!r}; use one of {', '.join(SINUSOIDAL_LAYOUTS)}")
    angles = positions.float()[:, None] * inv_freq[None, :]  # (T, dim)
    encoding = torch.empty(positions.shape[0], dim, device=positions.device)
    encoding[:, 0::2] = angles[:, 0::2].sin()
    encoding[:, 1::2] = angles[:, 1::2].cos()
    return encoding


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of RoPE's angles for absolute ``positions``: each (T, head_dim/2)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (0,1), (2,3), … as Meta's Llama code does. x: (B, H, T, Dh)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, H, T, Dh/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


@dataclass(frozen=True)
class PESpec:
    """What one positional encoding does to the model."""

    name: str
    summary: str
    absolute_input: bool = False  # add sinusoids to token embeddings
    rotary: bool = False  # rotate queries and keys
    make_prior: Callable[..., nn.Module] | None = None  # per-layer distance prior


PE_REGISTRY: dict[str, PESpec] = {
    spec.name: spec
    for spec in [
        PESpec("nope", "no positional encoding; causal mask only"),
        PESpec("sinusoidal", "absolute sinusoids added to the embeddings", absolute_input=True),
        PESpec("rope", "rotary embedding of queries and keys", rotary=True),
        PESpec("alibi", "linear distance bias, fixed slopes (Laplace prior)", make_prior=lambda cfg: ALiBiPrior(cfg.n_heads)),
        PESpec(
            "bam",
            "generalized-Gaussian prior, learned per head (GGD-BAM)",
            make_prior=lambda cfg: GGDPrior(cfg.n_heads, cfg.bam_init, cfg.bam_train_mu),
        ),
    ]
}

SSMAX_SUFFIX = "-ssmax"


def parse_pe_name(name: str) -> tuple[str, bool]:
    """``"bam-ssmax"`` -> ``("bam", True)``; unknown names raise with close matches."""
    base, ssmax = (name[: -len(SSMAX_SUFFIX)], True) if name.endswith(SSMAX_SUFFIX) else (name, False)
    if base not in PE_REGISTRY:
        choices = [*PE_REGISTRY, *(f"{n}{SSMAX_SUFFIX}" for n in PE_REGISTRY)]
        raise BamctlError(f"unknown positional encoding {name!r}{did_you_mean(name, choices)}")
    return base, ssmax


def pe_label(pe: str, ssmax: bool) -> str:
    return f"{pe}{SSMAX_SUFFIX}" if ssmax else pe
