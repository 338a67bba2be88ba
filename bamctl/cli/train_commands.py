"""Training command: ``train`` runs a recipe (``bamctl/data/baselines/*.toml``) into a checkpoint directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from bamctl.cli.app import app
from bamctl.errors import BamctlError

stdout = Console(highlight=False)
stderr = Console(stderr=True, highlight=False)


def _progress_display(total: int):
    """A rich progress bar on stderr (step, loss, tokens/s, ETA); None when stderr is not a terminal."""
    if not stderr.is_terminal:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[speed]} tok/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=stderr,
        transient=False,
    )


LINE_EVERY_S = 60.0  # at most this long between two progress lines when stderr is no terminal


def _progress_lines(total: int):
    """Progress as plain lines on stderr (step, loss, tokens/s, elapsed, time left): at every tenth
    of the steps and at least every ``LINE_EVERY_S``, so a log shows a long run is alive."""
    import time

    started, last = time.monotonic(), [time.monotonic()]
    tenth = max(1, total // 10)

    def show(report) -> None:
        now = time.monotonic()
        if report.step % tenth and report.step != total and now - last[0] < LINE_EVERY_S:
            return
        last[0] = now
        elapsed = now - started
        left = elapsed / max(report.step, 1) * (total - report.step)
        stderr.print(f"train step {report.step:,}/{total:,}: loss {report.loss:.4f}, {report.tokens_per_s:,.0f} tok/s, "
                     f"{elapsed:,.0f} s elapsed, about {left:,.0f} s left", soft_wrap=True, highlight=False)

    return show


@app.command()
def train(
    recipe: Annotated[str, typer.Option("--recipe", "-r", help="A shipped recipe's name (bam, rope-ssmax, ...: the recipe of that reference model) or a recipe TOML file (model, PE, data mix, optimiser, schedule, steps, seed).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Checkpoint directory to write (config.json, model.safetensors, and train_state.pt while running). Default: models/NAME in the working directory; a shipped checkpoint is replaced only when named here.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Override the recipe's number of optimiser steps.")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0, help="Override the recipe's seed (>= 0; model init, text windows, key depths).")] = None,
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu, cuda or cuda:N. On CUDA the forward pass runs under bfloat16 autocast.")] = "auto",
    data: Annotated[Optional[Path], typer.Option("--data", help="Folder of training text: *.txt files, or pre-tokenised GPT-2 shards (*.npy, *.bin uint16, llm.c headers accepted). Replaces the shipped corpus.")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="Train from step 0 even where --out holds a saved state or a finished checkpoint; that one stays until the new run finishes (it trains in .NAME.restart beside it, and running again without --restart resumes there).")] = False,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Train your own module instead of the recipe's model: a py: reference (py:FILE.py:FUNCTION[:KEY=VALUE,...]) whose function returns a torch.nn.Module taking GPT-2 token ids (B, T) and returning logits (B, T, V >= 50257). The recipe's data, loss, optimiser, schedule, steps and seed apply unchanged; of its [model] section only train_length does. Writes a checkpoint folder holding the weights and a copy of the code, which every command takes as a model. Default --out: models/FILE-RECIPE.")] = None,
    cpu_allocator: Annotated[str, typer.Option("--cpu-allocator", help="keep: freed memory stays in the process for the next step (glibc's malloc without per-block mmap or trimming; about a quarter faster on a CPU, same weights); system: the C library's defaults.")] = "keep",
) -> None:
    """Train a model from a recipe; an interrupted run resumes where it last saved.

    The run saves a training state (weights, optimiser, step) every save_every (a recipe key)
    steps and on Ctrl-C; running the same command again continues from it and reaches
    the same weights. A finished run leaves a core-format checkpoint whose config.json
    holds the full recipe and its provenance (losses, steps, wall time, torch version).

    Example: bamctl train --recipe bam --device cpu   (writes models/bam)

    Your own model on a reference's budget, then beside it:
      bamctl train --recipe bam-ssmax --model py:nanogpt.py:build --out models/nanogpt
      bamctl compare bam-ssmax models/nanogpt --task passkey
    """
    from bamctl.train import ALLOCATORS, keep_freed_cpu_memory, load_recipe, recipe_path, resuming_from
    from bamctl.train import train as run_training

    if cpu_allocator not in ALLOCATORS:
        raise BamctlError(f"--cpu-allocator must be one of {', '.join(ALLOCATORS)}, not {cpu_allocator!r}")
    from bamctl.pe_check import require_passing

    path = recipe_path(recipe)
    spec = load_recipe(path).with_overrides(steps=steps, seed=seed)
    module = _module_reference(model)
    if module is None:
        require_passing(spec.model.pe, spec.model.train_length)  # a plugin that leaks the future never trains
    target = out if out is not None else Path("models") / _default_name(spec.name, module)  # never into the package unasked
    _note_shipped(target)
    resumed = None if restart else resuming_from(target)
    progress = _progress_display(spec.train.steps)
    if resumed is not None:
        stderr.print(f"resuming {target} from its saved training state{'' if resumed == target else f' in {resumed}'}", soft_wrap=True)

    if cpu_allocator == "keep":
        keep_freed_cpu_memory()  # this process trains and exits; elsewhere than glibc nothing changes
    if progress is None:  # stderr to a file or a scheduler's log: a line every tenth of the run or LINE_EVERY_S
        result = run_training(spec, target, device=device, data_dir=data, restart=restart,
                              on_step=_progress_lines(spec.train.steps), module=module)
    else:
        with progress:
            task = progress.add_task("train", total=spec.train.steps, loss="-", speed="-")

            def show(report) -> None:
                progress.update(task, completed=report.step, loss=f"{report.loss:.4f}", speed=f"{report.tokens_per_s:,.0f}")

            result = run_training(spec, target, device=device, data_dir=data, restart=restart, on_step=show, module=module)
    final = result.provenance
    what = f"{spec.name} ({spec.model.pe}" if module is None else f"{final['model']} (recipe {spec.name}"
    stdout.print(
        f"wrote {what}, {spec.train.steps} steps, final loss {final['final_loss']:.4f}, "
        f"{result.wall_time_s:.0f} s) to {target}"
    )


def _module_reference(model: str | None) -> str | None:
    """``--model``'s ``py:`` reference without its prefix; one line for anything else."""
    if model is None:
        return None
    if not model.startswith("py:"):
        raise BamctlError(f"--model takes a py: reference (py:FILE.py:FUNCTION), not {model!r}: a recipe trains "
                          "bamctl's own model from its [model] section, or your module")
    return model.removeprefix("py:")


def _default_name(recipe_name: str, module: str | None) -> str:
    """models/RECIPE, or models/FILE-RECIPE for a module (its file's or module's last name)."""
    if module is None:
        return recipe_name
    target = module.split(":", 1)[0]
    stem = Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]
    return f"{stem}-{recipe_name}"


def _note_shipped(target: Path) -> None:
    """Say so when the run will replace a checkpoint of the catalog (only ever when --out names it)."""
    from bamctl.catalog import baselines_dir

    if target.resolve().parent == baselines_dir().resolve():
        stderr.print(f"note: {target} is the catalog's {target.name}: every command naming {target.name} will use "
                     "the weights this run leaves there", soft_wrap=True)
