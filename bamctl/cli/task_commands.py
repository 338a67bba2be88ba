"""Task commands: ``generate`` writes a task's prompts as JSONL, with no model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from bamctl.backends.hf_tokenizer import resolve_tokenizer
from bamctl.cli.app import app
from bamctl.errors import BamctlError
from bamctl.lengths import parse_depths, parse_lengths
from bamctl.tasks import generate_samples

stderr = Console(stderr=True, highlight=False)


def sample_line(sample) -> str:
    """One JSONL line; key order is the Sample's field order, so equal samples give equal bytes."""
    return json.dumps(sample.to_json(), ensure_ascii=False) + "\n"


@app.command()
def generate(
    task: Annotated[str, typer.Argument(help="Task name: passkey, ppl, niah_single_1 ... niah_multiquery, vt, cwe, fwe (see bamctl/data/tasks/*.toml).")],
    lengths: Annotated[str, typer.Option(help="Target lengths in tokens: 1k..512k (doubling, k = 1024), 512..8k, or a list like 1k,3000,10k.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write, one sample per line; '-' writes to stdout.")],
    samples: Annotated[int, typer.Option(help="Samples per length (and per depth, where depths apply).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed; the same seed gives byte-identical output.")] = 0,
    tokenizer: Annotated[str, typer.Option(help="Tokenizer that lengths are counted in: gpt2, or a local Hugging Face tokenizer folder, tokenizer.json or SentencePiece .model file.")] = "gpt2",
    depths: Annotated[Optional[str], typer.Option(help="Needle depths: a count (5 = 0, .25, .5, .75, 1) or fractions (0,0.25,0.5). Passkey default: 5; RULER default: its own random placement.")] = None,
    protocol: Annotated[Optional[str], typer.Option(help="The task's protocol: passkey auto (default), authors, exact or landmark; ppl sliding (default) or buckets.")] = None,
    corpus: Annotated[Optional[Path], typer.Option(help="ppl only: a UTF-8 text file to use instead of the shipped corpus.")] = None,
) -> None:
    """Write a task's prompts (text and token ids, answers, needle positions) as JSONL; no model runs.

    Example: bamctl generate passkey --lengths 1k..32k --samples 4 --depths 5 --seed 0 --out passkey.jsonl
    """
    length_list = parse_lengths(lengths)
    depth_list = parse_depths(depths) if depths is not None else None
    if corpus is not None and task != "ppl":
        raise BamctlError("--corpus applies to ppl only")
    stream = generate_samples(
        task, length_list, samples, seed, resolve_tokenizer(tokenizer), depth_list, protocol=protocol, corpus_path=corpus
    )
    count = 0

    def write(handle) -> None:
        nonlocal count
        for sample in stream:
            handle.write(sample_line(sample))
            count += 1

    def write_file(path: str) -> None:
        with open(path, "w", encoding="utf-8", newline="\n") as handle:
            write(handle)

    if str(out) == "-":
        write(sys.stdout)
        sys.stdout.flush()
    else:
        from bamctl.files import atomic_write

        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, write_file)  # a complete file or none, also on Ctrl-C
    stderr.print(f"wrote {count} {task} samples ({len(length_list)} lengths) to {out}")
