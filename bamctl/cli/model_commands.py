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
from bamctl.cli.options import TRUST_REMOTE_CODE_HELP

# Heavy modules (torch) are imported inside the commands: `bamctl --help` stays instant.
PRESET_NAMES = "micro, tiny, small, l6, l8, l12, l16, l24"
PE_NAMES = "nope, sinusoidal, rope, xpos, alibi, kerple, t5, fire, bam"  # positional.PE_REGISTRY's, in its order

stdout = Console(highlight=False)


@app.command()
def new(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write config.json and model.safetensors into.")],
    pe: Annotated[str, typer.Option(help=f"Positional encoding: {PE_NAMES} (bamctl models says what each is), or a plugin of your own (FILE.py:CLASS, package.module:CLASS, an installed entry point: docs/positional-plugins.md); add -ssmax for Scalable-Softmax (e.g. bam-ssmax, ./my_pe.py:Sandwich-ssmax).")] = "bam",
    preset: Annotated[str, typer.Option(help=f"Model size: {PRESET_NAMES}.")] = "tiny",
    seed: Annotated[int, typer.Option(min=0, help="Seed of the random initialisation (>= 0); same seed, same weights.")] = 0,
    train_length: Annotated[int, typer.Option(help="Training context length recorded in the checkpoint (the unit of extrapolation ratios).")] = 512,
    bam_init: Annotated[str, typer.Option(help="BAM prior initialisation: flat (theta = 0), alibi (beta = 1, ALiBi slopes) or alibi-linear (ALiBi slopes, beta 0..1 across heads).")] = "flat",
    force: Annotated[bool, typer.Option("--force", help="Overwrite a checkpoint already in --out.")] = False,
) -> None:
    """Write a randomly initialised model, for tests and pipeline checks.

    Example: bamctl new --pe bam-ssmax --preset tiny --seed 0 --out models/random-bam
    A PE of your own: bamctl new --pe examples/positional/sandwich.py:Sandwich --out models/sandwich
    """
    from bamctl.checkpoint import is_checkpoint_dir, new_random_model, save_checkpoint
    from bamctl.errors import BamctlError
    from bamctl.model import ModelConfig

    if is_checkpoint_dir(out) and not force:
        raise BamctlError(f"{out} already holds a checkpoint; pass --force to overwrite it, or choose another --out")
    from bamctl.pe_check import require_passing

    config = ModelConfig.from_preset(preset, pe, train_length=train_length, bam_init=bam_init)
    require_passing(pe, train_length)
    model = new_random_model(config, seed)
    save_checkpoint(model, out, recipe={"kind": "random", "seed": seed, "preset": preset}, provenance={"created_by": "bamctl new"})
    stdout.print(f"wrote {config.label} ({preset}, {model.n_params():,} parameters) to {out}")


def _prior_rows(model) -> list[dict]:
    rows = []
    for layer_id, block in enumerate(model.layers):
        attention = block.attention
        prior = attention.prior
        described = prior.describe() if callable(getattr(prior, "describe", None)) else {}  # optional for a plugin
        for head in range(model.config.n_heads):
            row = {"layer": layer_id, "head": head}
            row.update({key: float(value[head]) for key, value in described.items()})
            if attention.ssmax_scale is not None:
                row["ssmax_s"] = float(attention.ssmax_scale.detach()[head])
            if attention.ssmax_bias is not None:
                row["ssmax_b"] = float(attention.ssmax_bias.detach()[head])
            rows.append(row)
    return rows


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.4g}"


@app.command()
def inspect(
    model: Annotated[str, typer.Argument(help="Catalog name, checkpoint directory, bam:PATH (the authors' checkpoint), hf:PATH or vllm:PATH (a Hugging Face model: config and parameter count) or py:FILE.py:FUNCTION (a module of your own: its class, training length, size and identity).")],
    json_output: Annotated[bool, typer.Option("--json", help="Print config, parameter count and per-head priors as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="PNG: each head's prior (bias against distance, log axis), one panel per layer.")] = None,
    max_distance: Annotated[Optional[int], typer.Option(help="--plot: longest distance drawn (default: 64x the training length).")] = None,
    attention_map: Annotated[Optional[Path], typer.Option("--attention-map", help="PNG: where the last token of a passkey prompt attends, per layer and head; the key marked.")] = None,
    length: Annotated[Optional[int], typer.Option(min=1, help="--attention-map: passkey prompt length in tokens (default: 4x the training length).")] = None,
    depth: Annotated[float, typer.Option(min=0.0, max=1.0, help="--attention-map: depth of the key in the prompt, 0 to 1.")] = 0.5,
    seed: Annotated[int, typer.Option(min=0, help="--attention-map: seed of the passkey sample (>= 0).")] = 0,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help=TRUST_REMOTE_CODE_HELP)] = False,
) -> None:
    """Show a checkpoint's config, parameter count and, per layer and head, the learned prior.

    For BAM: the paper's alpha and beta (alpha = exp(-theta_alpha / theta_beta); inf when
    beta = 0, a flat prior), the scale exp(theta_alpha) and mu; for ALiBi the slope; with
    SSMax the learned s.

    Example: bamctl inspect bam --plot priors.png --attention-map attention.png --length 2048
    """
    from bamctl.backends import BACKENDS, backend_for
    from bamctl.errors import BamctlError

    entry, rest = backend_for(model)
    if entry in (BACKENDS["hf"], BACKENDS["vllm"], BACKENDS["py"], BACKENDS["trained-py"]):
        drawn = [flag for flag, value in (("--plot", plot), ("--attention-map", attention_map)) if value is not None]
        if drawn:  # they read bamctl's own priors and attention; another model's are its own code's
            verb = "draw" if len(drawn) > 1 else "draws"
            raise BamctlError(f"{' and '.join(drawn)} {verb} bamctl's own models (a catalog name, checkpoint or bam:); "
                              f"{model} is not one")
        if entry is BACKENDS["py"]:
            _inspect_module(rest, json_output)
        elif entry is BACKENDS["trained-py"]:
            _inspect_module(rest, json_output, trained=True, trust_remote_code=trust_remote_code)
        else:
            _inspect_hf(rest, json_output, trust_remote_code)
        return
    from bamctl.consent import trusting

    with trusting(trust_remote_code):
        checkpoint = _load_for_inspection(rest, authors=entry is BACKENDS["bam"])
    config = checkpoint.model.config
    if plot is not None:
        from bamctl.interpret import plot_priors

        path = plot_priors(checkpoint.model, plot, max_distance or 64 * config.train_length)
        Console(stderr=True).print(f"priors drawn to {path}")
    if attention_map is not None:
        _draw_attention(checkpoint, attention_map, length or 4 * config.train_length, depth, seed)
    heads = _prior_rows(checkpoint.model)
    if json_output:
        typer.echo(json.dumps(_inspect_json(checkpoint, heads), indent=2))
        return
    stdout.print(_summary_table(checkpoint))
    if heads and len(heads[0]) > 2:
        stdout.print(_heads_table(heads))


def _load_for_inspection(reference: str, authors: bool):
    """A bamctl checkpoint, or the authors' mapped onto our model."""
    if authors:
        from bamctl.backends.authors import load_authors_checkpoint

        return load_authors_checkpoint(reference)
    from bamctl.catalog import resolve_model

    return resolve_model(reference)


def _inspect_hf(reference: str, json_output: bool, trust_remote_code: bool = False) -> None:
    """What a Hugging Face model's files say: its config, positions, tokenizer and parameter count."""
    from bamctl.backends.hf_common import max_positions, positional_encoding, read_config, trained_length

    config, folder, gguf_file = read_config(reference, trust_remote_code)
    limit = max_positions(config)
    summary = {
        "path": str(folder / gguf_file) if gguf_file else str(folder),
        "model_type": config.model_type,
        "positional encoding": positional_encoding(config),
        "max positions": limit,
        "training length": trained_length(config, limit),
        "parameters": _hf_parameter_count(folder, gguf_file, config, trust_remote_code),
        "config": config.to_dict(),
    }
    if json_output:
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    table = Table(title=summary["path"], show_header=False)
    for key in ("model_type", "positional encoding", "max positions", "training length", "parameters"):
        value = summary[key]
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    stdout.print(table)


def _inspect_module(reference: str, json_output: bool, *, trained: bool = False, trust_remote_code: bool = False) -> None:
    """What a py: reference's function returns, or a trained module's folder holds, as a run would
    open it: its classes, its training length, its size and the identity its rows carry."""
    from pathlib import Path

    from bamctl.backends.module import class_name, build, defining_files, load_trained, model_shape, module_identity, train_length
    from bamctl.backends.user_tokenizer import as_tokenizer
    from bamctl.consent import trusting
    from bamctl.local_code import code_of_files

    if trained:
        with trusting(trust_remote_code):
            found = load_trained(Path(reference))
    else:
        found = build(reference)
    width, layers, heads = model_shape(found.module)
    summary = {
        "reference": reference if trained else f"py:{reference}",
        "module": class_name(type(found.module)),  # a user's file's class by its name, an installed one's with its module
        "training length": train_length(found, found.name),
        "parameters": sum(p.numel() for p in found.module.parameters()),
        "width": width,
        "layers": layers,
        "heads": heads,
        "tokenizer": as_tokenizer(found.tokenizer, found.name).name if found.tokenizer is not None else None,
        "cached step": getattr(found.step, "__qualname__", None) if found.step is not None else None,
        "model hash": module_identity(found),
        "arguments": found.arguments or None,
        "files": sorted(code_of_files(defining_files(found))),  # its code as its identity counts it
    }
    if json_output:
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    table = Table(title=found.name, show_header=False)
    for key, value in summary.items():
        if key != "files" and value is not None:
            table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    stdout.print(table)


def _hf_parameter_count(folder, gguf_file, config, trust_remote_code: bool = False) -> int:
    """Counted from the weight files' headers where they are safetensors, else by building the model empty."""
    import struct

    files = sorted(folder.glob("*.safetensors"))
    if files and not gguf_file:
        total = 0
        for file in files:
            with open(file, "rb") as handle:
                header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        return total
    import torch
    from transformers import AutoModelForCausalLM

    from bamctl.backends.hf_common import no_questions

    with torch.device("meta"), no_questions():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=bool(trust_remote_code))
    return sum(p.numel() for p in model.parameters())


def _inspect_json(checkpoint, heads: list[dict]) -> dict:
    return {
        "path": str(checkpoint.path),
        "sha256": checkpoint.sha256,
        "n_params": checkpoint.model.n_params(),
        "config": checkpoint.model.config.to_dict(),
        "recipe": checkpoint.recipe,
        "heads": heads,
    }


SSMAX_SCOPES = {
    "logits": "logits: s·log n scales content score and prior",
    "content": "content: s·log n scales the content score only, the prior added after",
}


def _summary_table(checkpoint) -> Table:
    config = checkpoint.model.config
    summary = Table(title=f"{checkpoint.path}", show_header=False)
    summary.add_row("positional encoding", config.label)
    summary.add_row("parameters", f"{checkpoint.model.n_params():,}")
    summary.add_row("layers × heads × dim", f"{config.n_layers} × {config.n_heads} × {config.dim}")
    summary.add_row("training length", f"{config.train_length:,}")
    if config.ssmax:  # where s·log n multiplies: bamctl's rule, or the authors' per checkpoint (bam:'s ssmax_prior)
        summary.add_row("SSMax scope", SSMAX_SCOPES[config.ssmax_scope])
    rows = f"{len(config.token_subset)} of its ids + UNK" if config.token_subset else f"vocab {config.vocab_size:,}"
    summary.add_row("tokenizer", f"{config.tokenizer} ({rows})")
    summary.add_row("weights sha256", checkpoint.sha256[:16])
    if checkpoint.recipe:  # the full recipe is in config.json and in --json
        recipe = checkpoint.recipe
        summary.add_row("recipe", recipe.get("description") or recipe.get("name") or recipe.get("kind", "?"))
    return summary


def _heads_table(heads: list[dict]) -> Table:
    columns = [key for key in heads[0] if key not in ("layer", "head")]
    table = Table(title="per-head positional parameters")
    for name in ["layer", "head", *columns]:
        table.add_column(name, justify="right")
    for row in heads:
        table.add_row(str(row["layer"]), str(row["head"]), *(_fmt(row[c]) for c in columns))
    return table


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
    """List the model catalog: name, PE, SSMax, training length, parameters, location; the positional
    encodings bamctl new --pe takes, and those installed packages give (entry points of
    bamctl.positional_encodings).

    Any checkpoint directory works as a model argument too.

    Example: bamctl models
    """
    from bamctl.catalog import catalog
    from bamctl.pe_plugins import PLUGIN_GROUP, installed_plugins
    from bamctl.positional import PE_REGISTRY, SSMAX_SUFFIX

    entries = catalog()
    if json_output:
        typer.echo(json.dumps([{**vars(e), "path": str(e.path)} for e in entries.values()], indent=2))
        return
    table = Table(title="bamctl models")
    for column in ("name", "PE", "SSMax", "train length", "parameters", "path"):
        table.add_column(column)
    for entry in entries.values():
        ssmax = entry.pe.endswith(SSMAX_SUFFIX)
        base = entry.pe.removesuffix(SSMAX_SUFFIX)
        table.add_row(entry.name, base, "yes" if ssmax else "no", f"{entry.train_length:,}", f"{entry.n_params:,}", str(entry.path))
    stdout.print(table)
    if not entries:
        stdout.print("no shipped checkpoints yet; make one with: bamctl new --out DIR")
    zoo = Table(title=f"positional encodings (bamctl new --pe NAME; NAME{SSMAX_SUFFIX} adds Scalable-Softmax)")
    for column in ("--pe", "what it is"):
        zoo.add_column(column)
    for spec in PE_REGISTRY.values():
        zoo.add_row(spec.name, spec.summary)
    stdout.print(zoo)
    plugins = installed_plugins()
    if plugins:  # PEs that installed packages give by name (bamctl new --pe NAME)
        found = Table(title=f"positional encodings of installed packages ({PLUGIN_GROUP})")
        for column in ("--pe", "class", "package"):
            found.add_column(column)
        for name, point in sorted(plugins.items()):
            dist = getattr(point, "dist", None)
            found.add_row(name, point.value, f"{dist.name} {dist.version}" if dist is not None else "")
        stdout.print(found)
