"""Task commands: ``generate`` writes a task's prompts as JSONL, with no model."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bamctl.cli import options as opt
from bamctl.cli.app import app
from bamctl.cli.requests import asked_requests
from bamctl.runs.requests import task_names

stderr = Console(stderr=True, highlight=False)


def sample_line(sample) -> str:
    """One JSONL line; key order is the Sample's field order, so equal samples give equal bytes."""
    return json.dumps(sample.to_json(), ensure_ascii=False) + "\n"


@app.command()
@opt.with_options("samples", "prompt")
def generate(
    task: Annotated[str, typer.Argument(help="Tasks, comma separated: passkey, ppl, niah_single_1 ... niah_multiquery, vt, cwe, fwe, qa_1, qa_2, facts_1 ... facts_3 (see bamctl/data/tasks/*.toml); all: every RULER task but qa_1, qa_2.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write, one sample per line; '-' writes to stdout.")],
    *,
    samples,
    prompt,
) -> None:
    """Write a task's prompts (text and token ids, answers, needle positions) as JSONL; no model runs.

    The same options give the same prompts as a run command (passkey, ruler, ppl, compare) feeds a
    model whose tokenizer --tokenizer names (bamctl's own models: gpt2, the default); the same seed
    gives byte-identical output.

    Example: bamctl generate passkey --lengths 1k..32k --samples 4 --depths 5 --seed 0 --out passkey.jsonl
    """
    asked = asked_requests(task_names(task), samples, prompt)
    from bamctl.backends.module import tokenizer_of  # torch, only when a command runs

    tokenizer = tokenizer_of(prompt.tokenizer or "gpt2")
    requests = asked.for_models([])  # no model: --lengths is needed
    plans = [request.plan(tokenizer) for request in requests]
    stream = (sample for plan in plans for sample in plan.samples())
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

        atomic_write(out, write_file, make_parents=True)  # a complete file or none, also on Ctrl-C
    from bamctl.results.render import plural

    stderr.print(f"wrote {plural(count, task + ' sample')} ({plural(len(requests[0].lengths), 'length')}) to {out}")
