"""Options every evaluation command takes, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Lengths = Annotated[
    Optional[str],
    typer.Option(
        "--lengths",
        "-l",
        help="Context lengths in tokens: '1k..64k' (doubling, k = 1024), '512..8k', '1k,3000,10k' or '4096'. "
        "Default: 1x to 64x the model's training length, doubling.",
    ),
]
Samples = Annotated[Optional[int], typer.Option("--samples", "-n", help="Samples per length (and per depth, for tasks with depths).")]
Seeds = Annotated[str, typer.Option("--seed", help="Seed of the samples; a comma list ('0,1') runs each seed.")]
Depths = Annotated[
    Optional[str],
    typer.Option(help="Needle depths: a count of evenly spaced depths ('5') or fractions ('0,0.25,0.5'). Default: the task's."),
]
Device = Annotated[str, typer.Option(help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N.")]
Dtype = Annotated[str, typer.Option(help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16.")]
ChunkSize = Annotated[int, typer.Option(help="Tokens per prefill chunk: memory is weights + KV cache + one chunk's workspace.")]
Attention = Annotated[str, typer.Option(help="Attention path: auto (flex on CUDA, native on CPU), native (our C++ CPU kernel, compiled once), fused (torch's fused CPU kernel), flex (compiled FlexAttention), blockwise (online softmax over key blocks) or dense (reference; n x n memory).")]
Tokenizer = Annotated[Optional[str], typer.Option(help="Tokenizer name or local path overriding the model's own (external models).")]
BeyondMax = Annotated[
    str,
    typer.Option(help="External models past their configured max positions: warn (run anyway; extrapolation is the point) or refuse."),
]
ChatTemplate = Annotated[bool, typer.Option(help="External chat models: wrap each prompt in the model's chat template (off: base-model mode).")]
TensorParallel = Annotated[int, typer.Option(help="vllm: number of GPUs one model is split over.")]
Out = Annotated[Path, typer.Option("--out", "-o", help="Results directory (Parquet part files, one row per sample).")]
Force = Annotated[bool, typer.Option(help="Recompute samples already in the results directory instead of skipping them.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Json = Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout (for scripts).")]
Shard = Annotated[
    Optional[str],
    typer.Option(help="I/N: evaluate only every N-th sample starting at I (0-based), e.g. one process per GPU in a SLURM array writing one --out."),
]
Threshold = Annotated[float, typer.Option(help="Accuracy that counts as 'still working' for the effective length.")]

DEFAULT_OUT = Path("results")
