"""Positional encodings (PE): each one a module of the PE protocol, the zoo's and a user's alike.

A PE is a ``torch.nn.Module`` class, built once per layer from the model's config, that
implements the hooks of what it changes (docs/positional-plugins.md holds the protocol):

- the input embeddings by position, ``embed`` (``sinusoidal``: absolute sinusoids);
- queries and keys by position, ``transform_qk`` before the keys are cached (``rope``'s
  rotation) and ``transform_qk_after_cache`` for every chunk's queries and all their keys
  (``xpos``'s decay, measured from the chunk's first query);
- the attention logits, by a bias that depends only on the distance ``i - j`` between query
  ``i`` and key ``j`` (``alibi``, ``kerple``, ``t5``, ``bam``). Such a bias is a *prior* over
  offsets (BAM paper, arXiv 2505.22842): the engine asks each layer's prior for a 1-D table
  ``(H, max_distance + 1)`` and indexes it, so no ``n x n`` bias ever exists. A bias that
  depends on the query's position too (``fire``) or on the content are kinds of their own;
- what the model is told the positions are, ``position_ids`` (a training-time trick).

``nope`` changes nothing but is a module too. Any PE may add Scalable-Softmax (SSMax,
arXiv 2501.19399) by the suffix ``-ssmax``: that is a model switch, not a PE. The zoo is
registered below through ``zoo_entry``, which checks each class against the protocol as a
plugin's is checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from bamctl.attention_math import PiecewiseBias, gives_bias
from bamctl.errors import BamctlError

# exp() of anything above this would overflow float32 once SSMax multiplies it by
# s * log(n); -exp(80) = -5.5e34 is already "minus infinity" for a softmax.
LOG_BIAS_CAP = 80.0
# The authors' epsilon inside |d - mu| + eps: keeps d = 0 finite when beta < 0.
GGD_EPS = 1e-5
# How the GGD prior combines its scale with the distance (see GGDPrior).
PRIOR_FORMS = ("released", "scaled_distance")


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
    """ALiBi (Press et al. 2022, "Train Short, Test Long"): bias ``-m_h * |i - j|``, fixed
    geometric slopes ``m_h``; BAM's Laplace prior."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    @classmethod
    def from_config(cls, config) -> "ALiBiPrior":
        return cls(config.n_heads)

    def distance_table(self, max_distance: int) -> torch.Tensor:
        distance = torch.arange(max_distance + 1, device=self.slopes.device, dtype=torch.float32)
        return -self.slopes[:, None].float() * distance  # (H, D+1)

    def describe(self) -> dict[str, torch.Tensor]:
        return {"slope": self.slopes.detach()}


class KerplePrior(nn.Module):
    """KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
    Embedding for Length Extrapolation"): bias ``-r1 * log(1 + r2 * |i - j|)`` with ``r1, r2 > 0``
    learned per head (kept positive as exponentials of the stored parameters)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.log_r1 = nn.Parameter(torch.zeros(n_heads))  # r1 = 1
        self.log_r2 = nn.Parameter(torch.zeros(n_heads))  # r2 = 1: bias -log(1 + d) at the start

    @classmethod
    def from_config(cls, config) -> "KerplePrior":
        return cls(config.n_heads)

    def distance_table(self, max_distance: int) -> torch.Tensor:
        distance = torch.arange(max_distance + 1, device=self.log_r1.device, dtype=torch.float32)
        r1, r2 = self.log_r1.float().exp()[:, None], self.log_r2.float().exp()[:, None]
        return -r1 * torch.log1p(r2 * distance)  # (H, D+1)

    def describe(self) -> dict[str, torch.Tensor]:
        return {"r1": self.log_r1.detach().exp(), "r2": self.log_r2.detach().exp()}


T5_BUCKETS = 32
T5_MAX_DISTANCE = 128


def t5_bucket(distance: torch.Tensor, buckets: int = T5_BUCKETS, max_distance: int = T5_MAX_DISTANCE) -> torch.Tensor:
    """T5's relative-position bucket of a causal distance ``d >= 0`` (Raffel et al. 2020, its
    decoder's unidirectional scheme): half the buckets hold distances exactly, the other half
    are log-spaced up to ``max_distance``; everything farther shares the last bucket."""
    exact = buckets // 2
    far = exact + (
        torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (buckets - exact)
    ).long()
    return torch.where(distance < exact, distance.long(), far.clamp(max=buckets - 1))


class T5Prior(nn.Module):
    """T5's relative attention bias (Raffel et al. 2020, "Exploring the Limits of Transfer
    Learning with a Unified Text-to-Text Transformer"): a learned scalar per head and distance
    bucket (32 buckets, log-spaced to distance 128)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.bucket_bias = nn.Parameter(torch.zeros(n_heads, T5_BUCKETS))  # (H, buckets)

    @classmethod
    def from_config(cls, config) -> "T5Prior":
        return cls(config.n_heads)

    def distance_table(self, max_distance: int) -> torch.Tensor:
        distance = torch.arange(max_distance + 1, device=self.bucket_bias.device)
        return self.bucket_bias.float()[:, t5_bucket(distance)]  # (H, D+1)

    def describe(self) -> dict[str, torch.Tensor]:
        bias = self.bucket_bias.detach()
        return {"b(0)": bias[:, 0], "b(16)": bias[:, 16], "b(128+)": bias[:, -1]}


class GGDPrior(nn.Module):
    """Generalized-Gaussian prior of GGD-BAM, per head.

    The paper writes the bias as ``-|(d - mu) / alpha|^beta``. We parametrise it as the
    authors' code does, which trains well from ``theta = 0`` (a flat prior):

        bias(d) = -(|d - mu| + eps) ** theta_beta * exp(theta_alpha),
        mu      = exp(theta_mu) - exp(-theta_mu)          (theta_mu frozen at 0 by default)

    so ``beta = theta_beta`` and ``alpha = exp(-theta_alpha / theta_beta)``. ``beta = 1``
    is ALiBi with slope ``exp(theta_alpha)``; ``beta = 0`` a constant, i.e. NoPE.

    ``form="scaled_distance"`` computes ``-(|(d - mu) * exp(theta_alpha)| + eps) ** theta_beta``
    instead: the formula of the authors' evaluation code between 2025-05-30 and 2025-10-16
    (and of their checkpoints naming the prior ``prior.shape/scale/loc``). The two agree
    when ``theta_beta = 1`` up to where eps enters; results published from that code used it.

    Overflow guard: with ``beta < 0`` the power at ``d = 0`` is ``eps ** beta``, which
    overflows float32 for ``beta < -7.7`` (1e-5 ** -8 = 1e40). We evaluate the magnitude in
    log space, ``exp(min(beta * log(|d - mu| + eps) + theta_alpha, 80))``: identical where
    the authors' form is finite, -5.5e34 instead of -inf where it is not, and gradients
    stay finite (zero where capped) for every theta.
    """

    def __init__(self, n_heads: int, init: str = "flat", train_mu: bool = False, form: str = "released"):
        super().__init__()
        if form not in PRIOR_FORMS:
            raise BamctlError(f"unknown BAM prior form {form!r}; use one of {', '.join(PRIOR_FORMS)}")
        self.form = form
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

    @classmethod
    def from_config(cls, config) -> "GGDPrior":
        return cls(config.n_heads, config.bam_init, config.bam_train_mu, config.bam_prior_form)

    @property
    def mu(self) -> torch.Tensor:
        return self.theta_mu.exp() - (-self.theta_mu).exp()

    def distance_table(self, max_distance: int) -> torch.Tensor:
        # Distance d = i - j >= 0 under the causal mask; the authors' offset is j - i = -d.
        offset = -torch.arange(max_distance + 1, device=self.theta_beta.device, dtype=torch.float32)
        alpha, beta = self.theta_alpha.float()[:, None], self.theta_beta.float()[:, None]
        shifted = offset[None, :] - self.mu.float()[:, None]  # (H, D+1)
        if self.form == "scaled_distance":  # -(|(d - mu) e^alpha| + eps)^beta
            log_magnitude = beta * ((shifted * alpha.exp()).abs() + GGD_EPS).log()
        else:  # released: -(|d - mu| + eps)^beta e^alpha
            log_magnitude = beta * (shifted.abs() + GGD_EPS).log() + alpha
        return -log_magnitude.clamp(max=LOG_BIAS_CAP).exp()

    def describe(self) -> dict[str, torch.Tensor]:
        return self.effective()

    def effective(self) -> dict[str, torch.Tensor]:
        """The paper's (alpha, beta, mu) per head; alpha is inf where beta = 0 (a flat prior)."""
        beta = self.theta_beta.detach()
        alpha = torch.where(
            beta == 0, torch.full_like(beta, math.inf), (-self.theta_alpha.detach() / beta).exp()
        )
        return {"alpha": alpha, "beta": beta, "mu": self.mu.detach(), "scale": self.theta_alpha.detach().exp()}


class FIREPrior(nn.Module):
    """FIRE (Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context
    Transformers"): bias ``f(ψ(i - j) / ψ(max(L, i)))`` with ``ψ(x) = log(c·x + 1)``, ``f`` a ReLU
    MLP (1 -> 32 -> one output per head), ``c > 0`` and the threshold ``L`` learned. Dividing by
    ``ψ(max(L, i))`` (progressive interpolation) makes the bias depend on the query's position,
    not on the distance alone, so no 1-D table of ``b_h(d)`` holds it.

    Exact and cheap without gradients: an MLP of one scalar is piecewise linear, with at most one
    breakpoint per hidden unit, so ``f`` is evaluated as ``A[segment] x + B[segment]`` after
    locating each ``x`` among the sorted breakpoints (``piecewise``), instead of 32 hidden units
    per (query, key) pair. Kernels take the bias in one of two forms: ``bias(queries, keys)``, a
    tile (dense, blockwise), or ``kernel_form(queries, max_distance)``, the 1-D line ``ψ(d)``,
    one ``ψ(max(L, i))`` per query and the pieces, from which the native kernel computes each
    pair's bias as it goes (no tile).
    """

    query_dependent = True
    HIDDEN = 32

    def __init__(self, n_heads: int, train_length: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, self.HIDDEN), nn.ReLU(), nn.Linear(self.HIDDEN, n_heads))
        self.log_c = nn.Parameter(torch.tensor(math.log(0.1)))  # c = 0.1, as the paper starts
        self.threshold = nn.Parameter(torch.tensor(float(train_length)))  # L, starting at the training length

    @classmethod
    def from_config(cls, config) -> "FIREPrior":
        return cls(config.n_heads, config.train_length)

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        """ψ(x) = log(c·x + 1), float32."""
        return torch.log1p(self.log_c.float().exp() * x.float())

    def query_norm(self, q_positions: torch.Tensor) -> torch.Tensor:
        """ψ(max(L, i)) for each query position i: (Tq,), float32."""
        return self.psi(torch.maximum(self.threshold.float().abs(), q_positions.float()))

    def normalized_distance(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """x = ψ(i - j) / ψ(max(L, i)) for every (query, key): (Tq, Tk), float32 (future keys: x of 0)."""
        distance = (q_positions[:, None] - k_positions[None, :]).clamp(min=0)
        return self.psi(distance) / self.query_norm(q_positions)[:, None]

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """b_h(i, j) for queries and keys at these absolute positions: (H, Tq, Tk), float32."""
        x = self.normalized_distance(q_positions, k_positions)
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return self.mlp.float()(x[..., None]).permute(2, 0, 1)  # training: the MLP itself
        breaks, slopes, offsets = self.piecewise()
        segment = torch.bucketize(x, breaks)  # (Tq, Tk): which linear piece each x falls on
        return slopes[:, segment] * x[None] + offsets[:, segment]

    def kernel_form(self, q_positions: torch.Tensor, max_distance: int) -> PiecewiseBias:
        """The bias as the native kernel takes it; ``bias`` gives the same values (same ψ, same
        division, same pieces), so a kernel that computes ``slope·x + offset`` from these matches it."""
        distance = torch.arange(max_distance + 1, device=q_positions.device)
        breaks, slopes, offsets = self.piecewise()
        return PiecewiseBias(self.psi(distance), self.query_norm(q_positions), breaks, slopes, offsets)

    def piecewise(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sorted breakpoints (m,), slopes (H, m+1), offsets (H, m+1)): on piece s, f_h(x) = slope x + offset."""
        first, second = self.mlp[0], self.mlp[2]
        w, b = first.weight.detach().float()[:, 0], first.bias.detach().float()  # (K,)
        crossing = w != 0
        breaks = torch.sort(-b[crossing] / w[crossing]).values  # where a hidden unit switches on or off
        # one point inside each piece tells which units are on there
        inner = torch.cat([breaks[:1] - 1, (breaks[1:] + breaks[:-1]) / 2, breaks[-1:] + 1]) if len(breaks) else torch.zeros(1)
        active = ((w[None, :] * inner[:, None] + b[None, :]) > 0).float()  # (pieces, K)
        out_w, out_b = second.weight.detach().float(), second.bias.detach().float()  # (H, K), (H,)
        slopes = out_w @ (active * w[None, :]).T  # (H, pieces)
        offsets = out_w @ (active * b[None, :]).T + out_b[:, None]
        return breaks, slopes, offsets

    def describe(self) -> dict[str, torch.Tensor]:
        heads = self.mlp[2].out_features
        return {"c": self.log_c.detach().exp().expand(heads), "L": self.threshold.detach().abs().expand(heads)}


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


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaled at inference, for a model trained at ``original_length`` tokens, by ``factor``.

    - ``linear``: position interpolation (Chen et al. 2023): positions divided by the factor;
    - ``ntk``: NTK-aware scaling (bloc97, 2023): the base raised to ``base * factor^(d / (d - 2))``;
    - ``yarn``: YaRN (Peng et al. 2023, as transformers computes it): dimensions whose wavelength
      fits ``original_length`` more than ``beta_fast`` (32) times keep their frequency, those
      fitting fewer than ``beta_slow`` (1) times are interpolated, a linear ramp between; and
      cos and sin scaled by ``0.1 ln(factor) + 1`` (an attention temperature).
    """

    kind: str
    factor: float
    original_length: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise BamctlError(f"unknown RoPE scaling {self.kind!r}; use one of {', '.join(ROPE_SCALINGS)}")
        if not self.factor >= 1.0:
            raise BamctlError(f"--rope-factor must be at least 1, not {self.factor}")

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.factor:g}"


ROPE_SCALINGS = ("linear", "ntk", "yarn")


def rope_inverse_frequencies(head_dim: int, base: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """RoPE's per-pair frequencies ``base^(-2k/d)``, scaled as ``scaling`` says. (d/2,) float32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    if scaling is not None and scaling.kind == "ntk":
        base = base * scaling.factor ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / base**exponents
    if scaling is None or scaling.kind == "ntk":
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    # yarn: the dimensions (in pair units) where the wavelength fits the training length
    # beta_fast and beta_slow times, floored and ceiled as transformers does; a linear ramp between.
    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(scaling.original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(scaling.beta_fast)), 0)
    high = min(math.ceil(correction_dim(scaling.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # as transformers does: no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency (fast, short wavelengths); 0: interpolated
    return inv_freq / scaling.factor * (1 - keep) + inv_freq * keep


def rope_attention_factor(scaling: RopeScaling | None) -> float:
    """What YaRN multiplies cos and sin by (so the logits by its square); 1 otherwise."""
    if scaling is None or scaling.kind != "yarn":
        return 1.0
    return 0.1 * math.log(scaling.factor) + 1.0


def rotary_angles(
    positions: torch.Tensor, head_dim: int, base: float, scaling: RopeScaling | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of RoPE's angles for absolute ``positions``: each (T, head_dim/2)."""
    inv_freq = rope_inverse_frequencies(head_dim, base, scaling).to(positions.device)
    angles = positions.float()[:, None] * inv_freq[None, :]
    factor = rope_attention_factor(scaling)
    return angles.cos() * factor, angles.sin() * factor


XPOS_GAMMA = 512.0  # xPos's scale base: distances are measured in units of it
XPOS_SHIFT = 0.4  # ζ_k = (2k/d + 0.4) / 1.4, in (0.29, 1): the pair's decay per XPOS_GAMMA tokens


def xpos_scale(offsets: torch.Tensor, head_dim: int) -> torch.Tensor:
    """xPos's per-channel scale ``ζ^(offset / γ)`` for each offset (T,) -> (T, Dh), the two
    channels of a rotary pair sharing theirs (Sun et al. 2022, "A Length-Extrapolatable
    Transformer"). Queries take it at ``i - o`` and keys at ``o - j`` for one reference
    position ``o`` (the query block's start), so a score carries ``ζ^((i - j) / γ)`` as xPos
    defines it, and neither factor can overflow float32 however long the context: the
    unshifted ``ζ^(-j/γ)`` of a key would pass 3.4e38 beyond about 36k tokens."""
    pairs = torch.arange(0, head_dim, 2, device=offsets.device, dtype=torch.float32)
    zeta = (pairs / head_dim + XPOS_SHIFT) / (1 + XPOS_SHIFT)  # (Dh/2,)
    scale = zeta[None, :] ** (offsets.float()[:, None] / XPOS_GAMMA)  # (T, Dh/2)
    return scale.repeat_interleave(2, dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (0,1), (2,3), … as Meta's Llama code does. x: (B, H, T, Dh)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (B, H, T, Dh/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class NoPE(nn.Module):
    """No positional encoding: the causal mask alone tells a token what came before it."""

    changes_nothing = True  # the protocol's empty case; a plugin without a hook is refused as a mistake

    def __init__(self, config):
        super().__init__()


class Sinusoidal(nn.Module):
    """Absolute sinusoids added to the token embeddings (Vaswani et al. 2017)."""

    scale_token_embeddings = True  # a new model multiplies token embeddings by sqrt(dim) first (their section 3.4)

    def __init__(self, config):
        super().__init__()
        self.dim, self.base, self.layout = config.dim, config.sinusoidal_base, config.sinusoidal_layout

    def embed(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return h + sinusoidal_encoding(positions, self.dim, self.base, self.layout).to(h.dtype)


class RoPE(nn.Module):
    """Rotary embedding of queries and keys (Su et al. 2021), optionally scaled at inference
    (``rope_scaling``, a ``RopeScaling`` the engine sets for ``--rope-scaling``)."""

    def __init__(self, config):
        super().__init__()
        self.head_dim, self.base = config.head_dim, config.rope_base
        self.rope_scaling: RopeScaling | None = None

    def transform_qk(self, q, k, q_positions, k_positions):
        cos, sin = rotary_angles(k_positions, self.head_dim, self.base, self.rope_scaling)
        if q_positions.shape[0] <= k_positions.shape[0] and torch.equal(q_positions, k_positions[-q_positions.shape[0]:]):
            q_cos, q_sin = cos[-q_positions.shape[0]:], sin[-q_positions.shape[0]:]  # the chunk's last rows: the same angles
        else:
            q_cos, q_sin = rotary_angles(q_positions, self.head_dim, self.base, self.rope_scaling)
        return apply_rotary(q, q_cos, q_sin), apply_rotary(k, cos, sin)


class XPos(RoPE):
    """RoPE with an exponential decay of the scores with distance (xPos, Sun et al. 2022). The decay
    is applied after the cache, for each chunk, around its first query: see ``xpos_scale``."""

    def transform_qk_after_cache(self, q, k, q_positions, k_positions):
        first = q_positions[0]
        q = (q.float() * xpos_scale(q_positions - first, self.head_dim)).type_as(q)
        k = (k.float() * xpos_scale(first - k_positions, self.head_dim)).type_as(k)
        return q, k


@dataclass(frozen=True)
class PESpec:
    """One positional encoding: its class, of the PE protocol, and where a plugin's came from."""

    name: str
    summary: str
    module: type[nn.Module]  # built once per layer (``build``): the layer's ``attention.prior``
    source: dict | None = None  # a plugin's: where it was found, its file's digest and text (None: the zoo's)

    def build(self, config) -> nn.Module:
        """``Class.from_config(config)`` where the class has one (the zoo's keep plain constructors), else
        ``Class(config)``; its bias hooks checked on the module built (``check_bias_hooks``)."""
        from_config = getattr(self.module, "from_config", None)
        module = from_config(config) if callable(from_config) else self.module(config)
        check_bias_hooks(module, config.n_heads, f"positional encoding {self.name}")
        return module

    @property
    def gives_bias(self) -> bool:
        """Whether it adds a bias to the attention logits (by distance, query position or content)."""
        return gives_bias(self.module)

    @property
    def scales_token_embeddings(self) -> bool:
        return getattr(self.module, "scale_token_embeddings", False)


# The distance a built module's table is asked for once, to check it before any sample: short, so
# building a model costs nothing more, and more than 0, so a table that ignores its argument shows.
PROBE_DISTANCE = 7


def check_bias_hooks(module: nn.Module, n_heads: int, who: str) -> None:
    """A bias the kernels will serve as it is given. A distance table beside a bias by query
    position or content would be lost (every path takes one kind of bias per layer), so such a
    class is refused; a distance table is asked for once, here, and held to ``check_distance_table``."""
    if not callable(getattr(module, "distance_table", None)):
        return
    for flag, hook in (("query_dependent", "bias"), ("content_dependent", "its content hook")):
        if getattr(module, flag, False):
            raise BamctlError(f"{who} has distance_table and {flag} = True: a layer's bias is one kind, so the table "
                              f"would be lost; add b_h(i - j) inside {hook}, or drop distance_table")
    if callable(getattr(module, "score_mod", None)):
        raise BamctlError(f"{who} has distance_table and score_mod: a layer's bias is one kind, so the table would be "
                          "lost; add b_h(q_idx - kv_idx) inside score_mod, or drop distance_table")
    with torch.no_grad():
        table = module.distance_table(PROBE_DISTANCE)
    check_distance_table(table, n_heads, PROBE_DISTANCE, who)


def check_distance_table(table, n_heads: int, max_distance: int, who: str, values: bool = True) -> None:
    """``distance_table(max_distance)`` gave a floating ``(H, max_distance + 1)`` tensor of finite
    values: the shape every kernel indexes, and values a softmax can take (a key to leave out takes
    a large finite negative, as the zoo's cap -5.5e34, not -inf: a row of -inf has no softmax).
    ``values=False``: shape and dtype only, which read no tensor (no wait for a GPU)."""
    expected = (n_heads, max_distance + 1)
    if not isinstance(table, torch.Tensor):
        raise BamctlError(f"{who}: distance_table({max_distance}) gave a {type(table).__name__}, not a tensor of "
                          f"shape {expected}")
    if tuple(table.shape) != expected:
        raise BamctlError(f"{who}: distance_table({max_distance}) gave shape {tuple(table.shape)}, not {expected} "
                          f"(one row per head, one column per distance 0..{max_distance})")
    if not table.is_floating_point():
        raise BamctlError(f"{who}: distance_table({max_distance}) gave {str(table.dtype).removeprefix('torch.')}, "
                          "not a floating-point tensor (float32)")
    if values and not bool(torch.isfinite(table).all()):
        raise BamctlError(f"{who}: distance_table({max_distance}) holds values that are not finite (inf or nan); "
                          "a key to leave out takes a large finite negative (the zoo caps at -5.5e34)")


def zoo_entry(name: str, summary: str, module: type[nn.Module]) -> PESpec:
    check_plugin(module, f"positional encoding {name}")  # the zoo meets the protocol it offers
    return PESpec(name, summary, module)


def _zoo() -> dict[str, PESpec]:
    entries = [
        zoo_entry("nope", "no positional encoding; causal mask only", NoPE),
        zoo_entry("sinusoidal", "absolute sinusoids added to the embeddings", Sinusoidal),
        zoo_entry("rope", "rotary embedding of queries and keys", RoPE),
        zoo_entry("xpos", "rotary embedding with an exponential decay of the scores with distance (xPos)", XPos),
        zoo_entry("alibi", "linear distance bias, fixed slopes (Laplace prior)", ALiBiPrior),
        zoo_entry("kerple", "logarithmic distance bias -r1 log(1 + r2 d), learned per head (KERPLE)", KerplePrior),
        zoo_entry("t5", "learned bias per head and log-spaced distance bucket (T5)", T5Prior),
        zoo_entry("fire", "learned MLP of the log distance over the log query position (FIRE)", FIREPrior),
        zoo_entry("bam", "generalized-Gaussian prior, learned per head (GGD-BAM)", GGDPrior),
    ]
    return {entry.name: entry for entry in entries}


SSMAX_SUFFIX = "-ssmax"


# -- the protocol a PE meets, the zoo's and a plugin's alike (bamctl.pe_plugins finds plugins) ------
#
# A PE is a torch.nn.Module class built once per layer as ``Class(config)`` (or
# ``Class.from_config(config)``), ``config`` the model's ModelConfig (n_heads, head_dim,
# train_length ...), with the hooks of what it changes. The module docstring lists them;
# docs/positional-plugins.md holds the protocol and an example per kind.

PLUGIN_HOOKS = ("distance_table(max_distance), score_mod(score, b, h, q_idx, kv_idx) returning the new score (FlexAttention's), "
                "bias(q_positions, k_positions) with query_dependent = True, "
                "content_bias(q, scores, q_positions, k_positions), content_scan(q, scores, q_positions, k_positions, "
                "carry) or pair_bias(q, k, q_positions) with content_dependent = True, "
                "transform_qk(q, k, q_positions, k_positions), transform_qk_after_cache(q, k, q_positions, k_positions), "
                "embed(h, positions) or position_ids(token_indices); observe(x, positions) gives a bias hook the layer's input")
# hooks a class may have alone (a bias's kinds are checked by their flags above)
POSITION_HOOKS = ("distance_table", "score_mod", "transform_qk", "transform_qk_after_cache", "embed", "position_ids")


def check_plugin(cls, who: str) -> None:
    """A PE class meets the protocol: an nn.Module class with the hooks of what it changes."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise BamctlError(f"{who} is a {type(cls).__name__}, not a torch.nn.Module class")
    if getattr(cls, "content_dependent", False):
        if not any(callable(getattr(cls, hook, None)) for hook in ("content_bias", "content_scan", "pair_bias", "score_mod")):
            raise BamctlError(f"{who} says content_dependent = True but has none of its hooks: content_bias(q, scores, "
                              "q_positions, k_positions), content_scan(q, scores, q_positions, k_positions, carry), "
                              "pair_bias(q, k, q_positions), score_mod(score, b, h, q_idx, kv_idx)")
    elif getattr(cls, "query_dependent", False):
        if not callable(getattr(cls, "bias", None)):
            raise BamctlError(f"{who} says query_dependent = True but has no bias(q_positions, k_positions) hook")
    elif not getattr(cls, "changes_nothing", False) and not any(callable(getattr(cls, hook, None)) for hook in POSITION_HOOKS):
        raise BamctlError(f"{who} has no hook of the PE protocol: give it {PLUGIN_HOOKS}")


def pe_label(pe: str, ssmax: bool) -> str:
    return f"{pe}{SSMAX_SUFFIX}" if ssmax else pe


PE_REGISTRY: dict[str, PESpec] = _zoo()
