"""Our own CPU attention kernel (``csrc/bam_attention.cpp``), compiled on first use.

torch's fused CPU kernel (``bamctl.engine.fused``) takes the prior only as an additive
mask; SSMax over the whole logits scales the prior row by row, which no strided view can
express, so that path must materialise mask tiles. This kernel reads the prior from one
line per head and scales it per row as it goes, inside the online softmax: one pass, no
mask, no merges, and the causal future is never visited. It is a plain flash-attention
loop in C++ (query blocks in parallel, key blocks with a running max and sum), calling
the BLAS that torch links for its two products.

FIRE's bias depends on the query's position as well as the distance, so no line holds
it; the kernel takes it as its piecewise-linear form instead (``PiecewiseBias``: one line
``ψ(d)``, one divisor per query, the pieces) and computes each pair's bias as it goes.

It is compiled once per machine with ``torch.utils.cpp_extension`` (about a minute; cached
under ``~/.cache/torch_extensions``, or ``$TORCH_EXTENSIONS_DIR``). Where that fails (no C++
compiler, no Python headers) the engine says so once and uses the fused path.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from pathlib import Path

import torch

from bamctl.attention_math import AttentionInputs, dense_attention, ssmax_factor
from bamctl.engine.attention import blockwise_attention, prior_line
from bamctl.engine.fused import fused_attention, needs_grad

SOURCE = Path(__file__).with_name("csrc") / "bam_attention.cpp"


def _flags() -> list[str]:
    """Compiler flags: AVX2 + FMA vector code where torch itself runs AVX2 or better."""
    flags = ["-O3", "-fopenmp"]  # OpenMP: at::parallel_for runs on torch's OpenMP threads
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "DEFAULT"
    if capability.startswith(("AVX2", "AVX512")):
        flags += ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]
    return flags


def _module_name(flags: list[str]) -> str:
    """A name per source, flags and torch version, so an edit or an upgrade rebuilds."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode() + torch.__version__.encode())
    return f"bamctl_attention_{digest.hexdigest()[:12]}"


@functools.cache
def _extension():
    """The compiled module, or the one-line reason it could not be built."""
    try:
        from torch.utils.cpp_extension import load

        flags = _flags()
        name = _module_name(flags)
        if not _built(name):
            print("compiling bamctl's CPU attention kernel (once per machine, about a minute)…", file=sys.stderr)
        return load(name=name, sources=[str(SOURCE)], extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as err:  # no compiler, no headers, no ninja: the fused path still works
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return reason[:200]


def _built(name: str) -> bool:
    """Whether a previous process already compiled this module (only decides whether to announce a build)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory  # where load() puts it

        return (Path(_get_build_directory(name, verbose=False)) / f"{name}.so").is_file()
    except Exception:  # a private helper: if it moves, we merely stay silent
        return True


def native_available() -> tuple[bool, str]:
    """Whether the kernel is built (building it if needed), and why not."""
    module = _extension()
    if isinstance(module, str):
        return False, f"bamctl's C++ attention kernel could not be compiled: {module}"
    return True, ""


@functools.cache
def _warn_fallback(why: str) -> None:
    print(f"warning: {why}; using the fused attention path", file=sys.stderr)


def native_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
    """Drop-in for the other kernels on CPUs. q: (B, H, Tq, Dh), k/v: (B, H, Tk, Dh)."""
    return native_attention_counted(q, k, v, inputs)[0]


def native_attention_counted(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs
) -> tuple[torch.Tensor, int, int]:
    """The attention output, the key blocks skipped (weights provably 0) and the key blocks visited."""
    query_prior = inputs.query_prior
    if needs_grad(q, k, v, inputs) or _prior_needs_grad(query_prior):
        return dense_attention(q, k, v, inputs), 0, 0  # the kernel has no backward
    ok, why = native_available()
    if not ok or q.device.type != "cpu":
        if not ok:
            _warn_fallback(why)
        if query_prior is not None:  # the fused kernel takes a distance prior only
            return blockwise_attention(q, k, v, inputs), 0, 0
        return fused_attention(q, k, v, inputs), 0, 0
    tq, head_dim = q.shape[2], q.shape[3]
    q0 = inputs.q_start
    qf = q.float() * (1.0 / math.sqrt(head_dim))
    prior_scale = None
    if inputs.ssmax_scale is not None:
        factor = ssmax_factor(inputs, tq, q.device)  # (H, Tq): c_h(i)
        has_prior = inputs.bias_table is not None or query_prior is not None
        if has_prior and inputs.ssmax_scope == "logits":
            # The kernel forms (s + b) * c_h(i) in the reference's order. Folded into q and the
            # prior instead, a negative c_h(i) turns a steep prior into large positive logits
            # that round elsewhere than the reference's, by up to ~4e-3 in the outputs.
            prior_scale = factor.contiguous()
        else:  # c_h(i) multiplies the content score alone: folding it into q is exact, for any sign
            qf = qf * factor[None, :, :, None]
    kf, vf = k.float(), v.float()
    if kf.stride(-1) != 1:
        kf = kf.contiguous()
    if vf.stride(-1) != 1:
        vf = vf.contiguous()
    if query_prior is not None:
        # Distances 0 .. q0 + tq - 1, reversed as the prior line below: keys walk it forward.
        form = query_prior.kernel_form(torch.arange(q0, q0 + tq, device=q.device), q0 + tq - 1)
        out, _lse, blocks = _extension().piecewise_attention(
            qf, kf, vf, form.line.float().flip(0).contiguous(), form.query_norm.float().contiguous(),
            form.breaks.float().contiguous(), form.slopes.float().contiguous(), form.offsets.float().contiguous(),
            prior_scale, q0,
        )
        return out.to(q.dtype), int(blocks[0]), int(blocks[1])
    prior = None
    if inputs.bias_table is not None:  # prior[h, t] = b_h(L - 1 - t), L = q0 + tq: keys walk it forward
        prior = prior_line(inputs.bias_table, q0 + tq - 1, q0 + tq).float().contiguous()
    out, _lse, blocks = _extension().bam_attention(qf, kf, vf, prior, prior_scale, q0)
    return out.to(q.dtype), int(blocks[0]), int(blocks[1])


def _prior_needs_grad(prior) -> bool:
    """Whether a query-dependent prior is being trained (its bias must then carry gradients)."""
    if prior is None or not torch.is_grad_enabled():
        return False
    return any(p.requires_grad for p in getattr(prior, "parameters", tuple)())


class NativeKernel:
    """``native_attention`` for one engine, which keeps its own count of key blocks skipped and visited."""

    def __init__(self) -> None:
        self.skipped_blocks = 0
        self.visited_blocks = 0

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        out, skipped, visited = native_attention_counted(q, k, v, inputs)
        self.skipped_blocks += skipped
        self.visited_blocks += visited
        return out
