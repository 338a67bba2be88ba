"""Model commands: ``new`` (random checkpoint), ``inspect`` (what is inside), ``models`` (catalog)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from bamctl.cli.app import app

# Heavy modules (torch) are imported inside the commands: `bamctl --help` stays instant.
PRESET_NAMES = "micro, tiny, small, l6, l8, l12, l16, l24"

stdout = Console(highlight=False)


@app.command()
def new(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write config.json and model.safetensors into.")],
    pe: Annotated[str, typer.Option(help="Positional encoding: nope, sinusoidal, rope, alibi, bam; add -ssmax for Scalable-Softmax (e.g. bam-ssmax).")] = "bam",
    preset: Annotated[str, typer.Option(help=f"Model size: {PRESET_NAMES}.")] = "tiny",
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation; same seed, same weights.")] = 0,
    train_length: Annotated[int, typer.Option(help="Training context length recorded in the checkpoint (the unit of extrapolation ratios).")] = 512,
    bam_init: Annotated[str, typer.Option(help="BAM prior initialisation: flat (theta = 0), alibi (beta = 1, ALiBi slopes) or alibi-linear (ALiBi slopes, beta 0..1 across heads).")] = "flat",
) -> None:
    """Write a randomly initialised model, for tests and pipeline checks.

    Example: bamctl new --pe bam-ssmax --preset tiny --seed 0 --out models/random-bam
    """
    from bamctl.checkpoint import new_random_model, save_checkpoint
    from bamctl.model import ModelConfig

    config = ModelConfig.from_preset(preset, pe, train_length=train_length, bam_init=bam_init)
    model = new_random_model(config, seed)
    save_checkpoint(model, out, recipe={"kind": "random", "seed": seed, "preset": preset}, provenance={"created_by": "bamctl new"})
    stdout.print(f"wrote {config.label} ({preset}, {model.n_params():,} parameters) to {out}")


def _prior_rows(model) -> list[dict]:
    from bamctl.positional import GGDPrior

    rows = []
    for layer_id, block in enumerate(model.layers):
        attention = block.attention
        prior = attention.prior
        for head in range(model.config.n_heads):
            row = {"layer": layer_id, "head": head}
            if isinstance(prior, GGDPrior):
                effective = prior.effective()
                row.update({key: float(value[head]) for key, value in effective.items()})
            elif prior is not None:
                row["slope"] = float(prior.slopes[head])
            if attention.ssmax_scale is not None:
                row["ssmax_s"] = float(attention.ssmax_scale.detach()[head])
            rows.append(row)
    return rows


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4g}"


@app.command()
def inspect(
    model: Annotated[str, typer.Argument(help="Checkpoint directory or catalog name.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print config, parameter count and per-head priors as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="PNG: each head's prior (bias against distance, log axis), one panel per layer.")] = None,
    max_distance: Annotated[Optional[int], typer.Option(help="--plot: longest distance drawn (default: 64x the training length).")] = None,
    attention: Annotated[Optional[Path], typer.Option("--attention", help="PNG: where the last token of a passkey prompt attends, per layer and head; the key marked.")] = None,
    length: Annotated[Optional[int], typer.Option(help="--attention: passkey prompt length in tokens (default: 4x the training length).")] = None,
    depth: Annotated[float, typer.Option(help="--attention: depth of the key in the prompt, 0 to 1.")] = 0.5,
    seed: Annotated[int, typer.Option(help="--attention: seed of the passkey sample.")] = 0,
) -> None:
    """Show a checkpoint's config, parameter count and, per layer and head, the learned prior.

    For BAM: the paper's alpha and beta (alpha = exp(-theta_alpha / theta_beta); inf when
    beta = 0, a flat prior), the scale exp(theta_alpha) and mu; for ALiBi the slope; with
    SSMax the learned s.

    Example: bamctl inspect bam --plot priors.png --attention attention.png --length 2048
    """
    from bamctl.catalog import resolve_model

    checkpoint = resolve_model(model)
    config = checkpoint.model.config
    if plot is not None:
        from bamctl.interpret import plot_priors

        path = plot_priors(checkpoint.model, plot, max_distance or 64 * config.train_length)
        Console(stderr=True).print(f"priors drawn to {path}")
    if attention is not None:
        _draw_attention(checkpoint, attention, length or 4 * config.train_length, depth, seed)
    heads = _prior_rows(checkpoint.model)
    if json_output:
        payload = {
            "path": str(checkpoint.path),
            "sha256": checkpoint.sha256,
            "n_params": checkpoint.model.n_params(),
            "config": config.to_dict(),
            "recipe": checkpoint.recipe,
            "heads": heads,
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    summary = Table(title=f"{checkpoint.path}", show_header=False)
    summary.add_row("positional encoding", config.label)
    summary.add_row("parameters", f"{checkpoint.model.n_params():,}")
    summary.add_row("layers × heads × dim", f"{config.n_layers} × {config.n_heads} × {config.dim}")
    summary.add_row("training length", f"{config.train_length:,}")
    rows = f"{len(config.token_subset)} of its ids + UNK" if config.token_subset else f"vocab {config.vocab_size:,}"
    summary.add_row("tokenizer", f"{config.tokenizer} ({rows})")
    summary.add_row("weights sha256", checkpoint.sha256[:16])
    if checkpoint.recipe:  # the full recipe is in config.json and in --json
        recipe = checkpoint.recipe
        summary.add_row("recipe", recipe.get("description") or recipe.get("name") or recipe.get("kind", "?"))
    stdout.print(summary)
    columns = [key for key in heads[0] if key not in ("layer", "head")] if heads else []
    if columns:
        table = Table(title="per-head positional parameters")
        for name in ["layer", "head", *columns]:
            table.add_column(name, justify="right")
        for row in heads:
            table.add_row(str(row["layer"]), str(row["head"]), *(_fmt(row[c]) for c in columns))
        stdout.print(table)


def _draw_attention(checkpoint, path: Path, length: int, depth: float, seed: int) -> None:
    from bamctl.engine.stream import StreamingEngine
    from bamctl.interpret import plot_last_query_attention
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    config = checkpoint.model.config
    sample = next(iter(generate_samples("passkey", [length], 1, seed, get_tokenizer(config.tokenizer), [depth])))
    engine = StreamingEngine(checkpoint.model, device="cpu", dtype="float32")
    weights = engine.last_query_attention(sample.input_ids)
    title = f"{config.label}: last token of a {length:,}-token passkey prompt, key at depth {depth:g} (red)"
    plot_last_query_attention(weights, sample.needle_positions, path, title)
    Console(stderr=True).print(f"attention drawn to {path}")


@app.command("models")
def list_models(
    json_output: Annotated[bool, typer.Option("--json", help="Print the catalog as JSON.")] = False,
) -> None:
    """List the model catalog: name, PE, SSMax, training length, parameters, location.

    Any checkpoint directory works as a model argument too.

    Example: bamctl models
    """
    from bamctl.catalog import catalog

    entries = catalog()
    if json_output:
        typer.echo(json.dumps([{**vars(e), "path": str(e.path)} for e in entries.values()], indent=2))
        return
    table = Table(title="bamctl models")
    for column in ("name", "PE", "SSMax", "train length", "parameters", "path"):
        table.add_column(column)
    for entry in entries.values():
        base, _, suffix = entry.pe.partition("-")
        table.add_row(entry.name, base, "yes" if suffix else "no", f"{entry.train_length:,}", f"{entry.n_params:,}", str(entry.path))
    stdout.print(table)
    if not entries:
        stdout.print("no shipped checkpoints yet; make one with: bamctl new --out DIR")
