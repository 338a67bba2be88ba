"""The GPU run's phases as tables: dependencies, FlexAttention against SDPA, passkey against the FLOP floor.

``scripts/gpu_run.sh`` runs each subcommand as one phase under its own timeout. Each
writes its table to ``--out`` (``NAME.md`` and ``NAME.json``) again after every row, so a
phase cut short by its timeout still leaves the rows it finished. Timings come apart:
*cold* is the first call at a shape, torch.compile's compilation included; *warm* the
median of the calls after it.

    python bench/gpu_bench.py deps
    python bench/gpu_bench.py attention --out OUT --lengths 16k,64k
    python bench/gpu_bench.py passkey --out OUT --lengths 32k,512k --preset l12
    python bench/gpu_bench.py batches --out OUT --lengths 4k --preset l12
    python bench/gpu_bench.py tests --out OUT --junit OUT/cuda-tests.xml

``attention``: the engine's FlexAttention kernel with a BAM prior and SSMax against torch's
``scaled_dot_product_attention`` (causal, no prior, no SSMax) on the same q, k, v.

``passkey``: one teacher-forced passkey sample through the streaming engine on a random
BAM+SSMax model. Its floor is arithmetic alone, the model's forward FLOPs

    n_layers * 2 * n^2 * dim        (QK^T and PV over the causal half: 4 n^2 dim / 2)
  + 2 * n * the layers' weight-matrix parameters

over the card's bf16 matmul rate, measured first in the same process (a large matmul, timed).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Table:
    """A table written whole to OUT/NAME.md and OUT/NAME.json after every row."""

    def __init__(self, out: Path, name: str, title: str, columns: list[str]):
        self.md, self.json = out / f"{name}.md", out / f"{name}.json"
        self.title, self.columns, self.rows = title, columns, []
        out.mkdir(parents=True, exist_ok=True)
        self._write()

    def add(self, **row) -> None:
        self.rows.append(row)
        self._write()
        print(" | ".join(_cell(row.get(c)) for c in self.columns), flush=True)

    def _write(self) -> None:
        lines = [f"{self.title}\n", "| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in self.columns) + " |" for row in self.rows]
        self.md.write_text("\n".join(lines) + "\n")
        self.json.write_text(json.dumps({"title": self.title, "rows": self.rows}, indent=1) + "\n")


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "" if value is None else str(value)


# -- deps ---------------------------------------------------------------------------------
def missing_requirements() -> list[str]:
    """Distributions pyproject.toml requires (and pytest) that are not installed; torch is the machine's."""
    import importlib.metadata
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for r in project["optional-dependencies"]["dev"] if r.startswith("pytest")]
    missing = []
    for requirement in wanted:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        if name == "torch":
            continue
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
    return missing


def deps(args) -> int:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
    import bamctl

    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (cuda {torch.version.cuda}, {gpu})")
    print(f"bamctl {bamctl.__version__} imported from {Path(bamctl.__file__).parent}")
    missing = missing_requirements()
    print(f"missing: {', '.join(missing)}" if missing else "every required package is installed")
    return 1 if missing else 0


# -- timing -------------------------------------------------------------------------------
def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(call, device, repeats: int) -> tuple[float, float]:
    """(cold seconds, warm median seconds) of ``call()``: its first run, then ``repeats`` more."""
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    cold = time.perf_counter() - start
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        _sync(device)
        warm.append(time.perf_counter() - start)
    return cold, statistics.median(warm) if warm else float("nan")


def matmul_rate(device, dtype, size: int) -> float:
    """FLOP/s of one (size x size) @ (size x size) product in ``dtype``, warm."""
    import torch

    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    _, seconds = timed(lambda: a @ b, device, repeats=10)
    return 2 * size**3 / seconds


def _dtype(name: str, device: str):
    import torch

    from bamctl.devices import resolve_dtype

    return resolve_dtype(name, torch.device(device))


# -- attention ----------------------------------------------------------------------------
def attention(args) -> int:
    import torch
    import torch.nn.functional as F

    from bamctl.attention_math import AttentionInputs
    from bamctl.engine.flex import FlexKernel
    from bamctl.lengths import parse_lengths
    from bamctl.positional import GGDPrior

    device, dtype = args.device, _dtype(args.dtype, args.device)
    table = Table(
        args.out, "attention",
        f"FlexAttention BAM+SSMax ({args.ssmax_scope} scope) against SDPA (causal, no bias): "
        f"1 x {args.heads} heads x {args.head_dim} dims, {str(dtype).removeprefix('torch.')}, {_device_name(device)}",
        ["length", "flex cold s", "flex warm ms", "flex TFLOP/s", "sdpa cold s", "sdpa warm ms", "sdpa TFLOP/s",
         "flex / sdpa throughput", "flex fell back"],
    )
    prior = GGDPrior(args.heads, init="alibi")
    with torch.no_grad():  # steep, ALiBi-like and flat heads alike
        prior.theta_beta.copy_(torch.linspace(0.0, 1.2, args.heads))
    for n in parse_lengths(args.lengths):
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, args.heads, n, args.head_dim, generator=g).to(device, dtype) for _ in range(3))
        with torch.no_grad():
            bias = prior.distance_table(n - 1).to(device)
        inputs = AttentionInputs(0, bias, torch.ones(args.heads, device=device), args.ssmax_scope)
        kernel = FlexKernel()
        flex_cold, flex_warm = timed(lambda: kernel(q, k, v, inputs), device, args.repeats)
        sdpa_cold, sdpa_warm = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, args.repeats)
        flops = 2 * n * n * args.heads * args.head_dim  # causal half of 4 n^2 (H Dh)
        table.add(**{
            "length": n, "flex cold s": flex_cold, "flex warm ms": flex_warm * 1e3, "flex TFLOP/s": flops / flex_warm / 1e12,
            "sdpa cold s": sdpa_cold, "sdpa warm ms": sdpa_warm * 1e3, "sdpa TFLOP/s": flops / sdpa_warm / 1e12,
            "flex / sdpa throughput": sdpa_warm / flex_warm, "flex fell back": "yes" if kernel.failed_shapes else "no",
        })
        del q, k, v
    return 0


# -- passkey ------------------------------------------------------------------------------
def forward_flops(model, n: int) -> float:
    """Forward FLOPs of ``n`` tokens: attention's two products over the causal half, plus the
    layers' weight matmuls (the embedding is a lookup; the head runs on a few rows only)."""
    config = model.config
    weights = sum(p.numel() for p in model.layers.parameters() if p.dim() == 2)  # norms, priors, SSMax: no matmul
    return config.n_layers * 2 * n * n * config.dim + 2 * n * weights


def passkey(args) -> int:
    import torch

    from bamctl.checkpoint import new_random_model
    from bamctl.engine.memory import estimate_bytes
    from bamctl.engine.stream import StreamingEngine
    from bamctl.lengths import parse_lengths
    from bamctl.model import ModelConfig
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    config = ModelConfig.from_preset(args.preset, "bam-ssmax", train_length=512)
    model = new_random_model(config, seed=0)
    engine = StreamingEngine(model, device=args.device, dtype=args.dtype, chunk_size=args.chunk_size, attention=args.attention)
    rate = matmul_rate(engine.device, torch.bfloat16, args.matmul_size)
    cuda = engine.device.type == "cuda"
    table = Table(
        args.out, "passkey",
        f"passkey, one teacher-forced sample, random {args.preset} BAM+SSMax ({model.n_params():,} parameters), "
        f"{str(engine.dtype).removeprefix('torch.')}, {engine.attention} attention, chunk {args.chunk_size}, "
        f"{_device_name(engine.device)}; bf16 matmul measured at {rate / 1e12:.3g} TFLOP/s",
        ["length", "cold s", "warm s", "floor s", "warm / floor", "warm tok/s", "peak GiB", "estimate GiB", "flex fell back",
         "key blocks left out"],
    )
    tokenizer = get_tokenizer(config.tokenizer)
    for n in parse_lengths(args.lengths):
        sample = next(iter(generate_samples("passkey", [n], 1, 0, tokenizer, [0.5])))
        engine.check_fits(len(sample.input_ids) + len(sample.target_ids))
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        cold, warm = timed(lambda: engine.score_continuation(sample.input_ids, sample.target_ids), engine.device, args.repeats)
        floor = forward_flops(model, n) / rate
        estimate = estimate_bytes(config, n, args.chunk_size, engine.dtype, engine.attention)
        table.add(**{
            "length": n, "cold s": cold, "warm s": warm, "floor s": floor, "warm / floor": warm / floor,
            "warm tok/s": n / warm, "peak GiB": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            "estimate GiB": estimate / 2**30,
            "flex fell back": ("yes" if engine.kernel.failed_shapes else "no") if engine.attention == "flex" else "",
            "key blocks left out": _left_out(engine),
        })
    return 0


def _left_out(engine) -> str:
    """The last request's key blocks left out by the certified bound (--block-skip auto), of those considered."""
    found = (getattr(engine, "last_block_counts", None) or [None])[0]
    return "" if found is None else f"{found[0]:,} of {found[1]:,}"


def batches(args) -> int:
    """Passkey tokens/s at one length, one request per call against ``--batch-size auto``'s batches."""
    import torch

    from bamctl.backends.base import auto_batch_size
    from bamctl.checkpoint import new_random_model
    from bamctl.engine.stream import StreamingEngine
    from bamctl.lengths import parse_lengths
    from bamctl.model import ModelConfig
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    config = ModelConfig.from_preset(args.preset, "bam-ssmax", train_length=512)
    model = new_random_model(config, seed=0)
    engine = StreamingEngine(model, device=args.device, dtype=args.dtype, chunk_size=args.chunk_size, attention=args.attention)
    tokenizer = get_tokenizer(config.tokenizer)
    table = Table(
        args.out, "batches",
        f"passkey tokens/s, B = 1 against --batch-size auto, random {args.preset} BAM+SSMax, "
        f"{str(engine.dtype).removeprefix('torch.')}, {engine.attention} attention, chunk {args.chunk_size}, "
        f"{_device_name(engine.device)}; {args.prompts} prompts per length, warm (after one cold pass each)",
        ["length", "auto batch", "B=1 tok/s", "auto tok/s", "auto / B=1", "same answers"],
    )
    for n in parse_lengths(args.lengths):
        samples = list(generate_samples("passkey", [n], args.prompts, 0, tokenizer, [0.5]))
        requests = [(s.input_ids, s.target_ids) for s in samples]
        tokens = sum(len(p) + len(t) for p, t in requests)
        each = len(requests[0][0]) + len(requests[0][1])  # exact protocol: every prompt of a length is as long
        auto = auto_batch_size(each, engine.largest_batch(each), engine.device.type)

        def passes(batch):
            out = []
            for lo in range(0, len(requests), batch):
                out += engine.score_continuations(requests[lo : lo + batch])
            return out

        answers = {}
        seconds = {}
        for batch in (1, auto):
            passes(batch)  # cold: compilation and allocation
            _sync(engine.device)
            start = time.perf_counter()
            answers[batch] = passes(batch)
            _sync(engine.device)
            seconds[batch] = time.perf_counter() - start
        same = sum(a[0] == b[0] for a, b in zip(answers[1], answers[auto]))
        table.add(**{"length": n, "auto batch": auto, "B=1 tok/s": tokens / seconds[1], "auto tok/s": tokens / seconds[auto],
                     "auto / B=1": seconds[1] / seconds[auto], "same answers": f"{same}/{len(requests)}"})
    return 0


def _device_name(device) -> str:
    import torch

    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


# -- tests --------------------------------------------------------------------------------
def tests(args) -> int:
    """The pytest phase's JUnit XML as a table: each test, its outcome and seconds."""
    import xml.etree.ElementTree as ET

    table = Table(args.out, "cuda-tests", f"pytest -m cuda ({args.junit.name})", ["test", "outcome", "seconds", "message"])
    if not args.junit.is_file():
        table.add(test="(no report)", outcome="not run", seconds=None, message="pytest wrote no JUnit XML (cut by its timeout?): the log has a line per finished test")
        return 1
    for case in ET.parse(args.junit).iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "FAILED", "error": "ERROR", "skipped": "skipped"}[kind]
                message = (found.get("message") or "").splitlines()[0][:120] if found.get("message") else ""
        table.add(test=case.get("name"), outcome=outcome, seconds=float(case.get("time", "nan")), message=message)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("deps", help="torch and the GPU; the required packages that are missing")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, required=True, help="folder of the tables")
    common.add_argument("--device", default="auto")
    common.add_argument("--repeats", type=int, default=3, help="warm calls after the cold one")

    att = commands.add_parser("attention", parents=[common], help="FlexAttention BAM+SSMax against SDPA")
    att.add_argument("--lengths", default="16k,64k")
    att.add_argument("--heads", type=int, default=16)
    att.add_argument("--head-dim", type=int, default=48, help="l12's: 768 / 16")
    att.add_argument("--dtype", default="auto")
    att.add_argument("--ssmax-scope", default="logits", choices=["logits", "content"])

    pk = commands.add_parser("passkey", parents=[common], help="passkey seconds and memory against the FLOP floor")
    pk.add_argument("--lengths", default="32k,512k")
    pk.add_argument("--preset", default="l12")
    pk.add_argument("--chunk-size", type=int, default=8192)
    pk.add_argument("--attention", default="auto")
    pk.add_argument("--dtype", default="auto")
    pk.add_argument("--matmul-size", type=int, default=8192, help="side of the timed bf16 matmul")

    bt = commands.add_parser("batches", parents=[common], help="passkey tokens/s, B = 1 against --batch-size auto")
    bt.add_argument("--lengths", default="4k")
    bt.add_argument("--preset", default="l12")
    bt.add_argument("--prompts", type=int, default=32)
    bt.add_argument("--chunk-size", type=int, default=8192)
    bt.add_argument("--attention", default="auto")
    bt.add_argument("--dtype", default="auto")

    ts = commands.add_parser("tests", help="the pytest phase's JUnit XML as a table")
    ts.add_argument("--out", type=Path, required=True)
    ts.add_argument("--junit", type=Path, required=True)

    args = parser.parse_args(argv)
    if getattr(args, "device", None) == "auto":
        from bamctl.devices import resolve_device

        args.device = str(resolve_device("auto"))
    return {"deps": deps, "attention": attention, "passkey": passkey, "batches": batches, "tests": tests}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
