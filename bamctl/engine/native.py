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

It is compiled with ``torch.utils.cpp_extension`` once per build configuration: the
source's contents, the torch version, the Python ABI and the compiler flags (about a minute).
Each configuration has its own folder, named by that configuration's digest, under
``$TORCH_EXTENSIONS_DIR`` or torch's ``~/.cache/torch_extensions``: environments with other
flags or another torch build beside each other, and checkouts in other places with the same
source share one build instead of rewriting a shared folder and recompiling in turn. A built
kernel is imported as it is, with no build step, and only when attention first runs: a run
that skips every sample never loads it. Where building fails (no C++ compiler, no Python
headers) the engine says so once and uses the fused path.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bamctl.attention_math import AttentionInputs, dense_attention, ssmax_factor
from bamctl.code_version import native_source
from bamctl.engine.attention import blockwise_attention, prior_line
from bamctl.engine.block_skip import BlockCounts
from bamctl.engine.fused import fused_attention, needs_grad

SOURCE = Path(__file__).with_name("csrc") / "bam_attention.cpp"
LDFLAGS = ("-fopenmp",)
STAMP = "built.json"  # written after a build succeeds: the library beside it is complete


def _flags() -> list[str]:
    """Compiler flags: AVX2 + FMA vector code where torch itself runs AVX2 or better."""
    flags = ["-O3", "-fopenmp"]  # OpenMP: at::parallel_for runs on torch's OpenMP threads
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "DEFAULT"
    if capability.startswith(("AVX2", "AVX512")):
        flags += ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"]
    return flags


@dataclass(frozen=True)
class BuildConfig:
    """Everything the compiled library depends on; its digest names the build folder and the module.

    The source enters by its contents, not its path: two checkouts of the same code share a build.
    """

    source_sha256: str
    torch_version: str
    python_abi: str
    cflags: tuple[str, ...]
    ldflags: tuple[str, ...] = LDFLAGS

    @classmethod
    def current(cls) -> "BuildConfig":
        return cls(
            source_sha256=hashlib.sha256(native_source(SOURCE)).hexdigest(),
            torch_version=torch.__version__,
            python_abi=f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}",
            cflags=tuple(_flags()),
        )

    @property
    def name(self) -> str:
        """The module's name, and its folder's: one per configuration."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"bamctl_attention_{digest[:16]}"

    def folder(self) -> Path:
        return build_root() / self.name

    def library(self) -> Path:
        return self.folder() / f"{self.name}{_library_suffix()}"

    def built(self) -> bool:
        """Whether a build of this configuration finished (a build in progress has no stamp yet)."""
        return (self.folder() / STAMP).is_file() and self.library().is_file()


def build_root() -> Path:
    """Where build folders go: ``$TORCH_EXTENSIONS_DIR``, else torch's default cache folder."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def _library_suffix() -> str:
    from torch.utils.cpp_extension import LIB_EXT

    return LIB_EXT


def build_source(config: BuildConfig) -> Path:
    """The source the build compiles: the bytes this process keeps (``native_source``, those its
    compute version hashed), written into the configuration's folder, not the file in the
    checkout, which may have changed since."""
    source = native_source(SOURCE)
    if hashlib.sha256(source).hexdigest() != config.source_sha256:
        raise RuntimeError(f"{SOURCE.name} is not the source of build configuration {config.name}")
    folder = config.folder()
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / SOURCE.name
    if not copy.is_file() or copy.read_bytes() != source:
        partial = copy.with_name(f"{copy.name}.{os.getpid()}")
        partial.write_bytes(source)
        os.replace(partial, copy)
    return copy


def _compile(config: BuildConfig):
    """Build this configuration's library in its own folder and import it (torch's lock keeps
    processes that build the same configuration at once from building it twice)."""
    from torch.utils.cpp_extension import load

    return load(name=config.name, sources=[str(build_source(config))], extra_cflags=list(config.cflags),
                extra_ldflags=list(config.ldflags), build_directory=str(config.folder()), verbose=False)


def _import_built(config: BuildConfig):
    """Import a finished build as it is: no build files written, no compiler run."""
    spec = importlib.util.spec_from_file_location(config.name, config.library())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_kernel(config: BuildConfig):
    """The compiled module of ``config``: imported when built, else compiled first (and stamped)."""
    if config.built():
        try:
            return _import_built(config)
        except ImportError:  # a library left damaged: build it again below
            (config.folder() / STAMP).unlink(missing_ok=True)
    print(f"compiling bamctl's CPU attention kernel into {config.folder()} (once per torch version and compiler "
          "flags, about a minute)…", file=sys.stderr)
    module = _compile(config)
    stamp = config.folder() / STAMP
    partial = stamp.with_name(f"{STAMP}.{os.getpid()}")
    partial.write_text(json.dumps(asdict(config), indent=1))
    os.replace(partial, stamp)  # whole or absent: another process never reads half a stamp
    return module


@functools.cache
def _extension():
    """The compiled module, or the one-line reason it could not be built."""
    try:
        return load_kernel(BuildConfig.current())
    except Exception as err:  # no compiler, no headers, no ninja: the fused path still works
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return reason[:200]


@functools.cache
def native_available() -> tuple[bool, str]:
    """Whether the kernel can run, and why not: a finished build says yes without loading it
    (it loads when attention first runs); with none, it is built now."""
    try:
        if BuildConfig.current().built():
            return True, ""
    except Exception:  # no build root, an unreadable source: building says why below
        pass
    module = _extension()
    if isinstance(module, str):
        return False, f"bamctl's C++ attention kernel could not be compiled: {module}"
    return True, ""


@functools.cache
def _warn_fallback(why: str) -> None:
    print(f"warning: {why}; using the fused attention path", file=sys.stderr)


def native_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs,
                     block_skip: str = "auto") -> torch.Tensor:
    """Drop-in for the other kernels on CPUs. q: (B, H, Tq, Dh), k/v: (B, H, Tk, Dh)."""
    return native_attention_blocks(q, k, v, inputs, block_skip)[0]


def native_attention_counted(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, block_skip: str = "auto"
) -> tuple[torch.Tensor, int, int]:
    """The attention output, the key blocks left out and the key blocks visited, over the batch."""
    out, blocks = native_attention_blocks(q, k, v, inputs, block_skip)
    if blocks is None:
        return out, 0, 0
    return out, int(blocks[:, 0].sum()), int(blocks[:, 1].sum())


def native_attention_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs, block_skip: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention output and, per sequence, (key blocks left out, key blocks considered): a (B, 2)
    tensor, or None where another path ran. ``block_skip="auto"``: the certified skipping of
    docs/engine.md (bamctl.engine.block_skip's bound, in C++); ``off``: every key block is read."""
    query_prior = inputs.query_prior
    if needs_grad(q, k, v, inputs) or _prior_needs_grad(query_prior):
        return dense_attention(q, k, v, inputs), None  # the kernel has no backward
    ok, why = native_available()
    if not ok or q.device.type != "cpu":
        if not ok:
            _warn_fallback(why)
        if query_prior is not None:  # the fused kernel takes a distance prior only
            return blockwise_attention(q, k, v, inputs, block_skip=block_skip), None
        return fused_attention(q, k, v, inputs), None
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
    kf, vf = _as_stored(k), _as_stored(v)
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
        return out.to(q.dtype), blocks
    prior = None
    if inputs.bias_table is not None:  # prior[h, t] = b_h(L - 1 - t), L = q0 + tq: keys walk it forward
        prior = prior_line(inputs.bias_table, q0 + tq - 1, q0 + tq).float().contiguous()
    out, _lse, blocks = _extension().bam_attention(qf, kf, vf, prior, prior_scale, q0, block_skip == "auto")
    return out.to(q.dtype), blocks


def _as_stored(x: torch.Tensor) -> torch.Tensor:
    """Keys or values as the kernel takes them: float32 and bfloat16 caches as they are (it widens a
    bfloat16 block as it reads it, exactly), any other dtype as a float32 copy."""
    return x if x.dtype in (torch.float32, torch.bfloat16) else x.float()


def _prior_needs_grad(prior) -> bool:
    """Whether a query-dependent prior is being trained (its bias must then carry gradients)."""
    if prior is None or not torch.is_grad_enabled():
        return False
    return any(p.requires_grad for p in getattr(prior, "parameters", tuple)())


class NativeKernel:
    """``native_attention`` for one engine: its ``--block-skip`` and its counts per sequence of key
    blocks left out and considered (``counts``, read per request by the engine), as blockwise and flex keep them."""

    def __init__(self, block_skip: str = "auto") -> None:
        self.block_skip = block_skip
        self.counts = BlockCounts()

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: AttentionInputs) -> torch.Tensor:
        out, blocks = native_attention_blocks(q, k, v, inputs, self.block_skip)
        if blocks is not None:
            self.counts.add(blocks[:, 0].tolist(), blocks[:, 1].tolist())
        return out
