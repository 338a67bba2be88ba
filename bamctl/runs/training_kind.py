"""What a model was trained on, read from its checkpoint's recipe, and the tasks that kind does not fit.

The passkey references learnt one skill on synthetic passkey prompts and nothing else: their
perplexity of English (millions) and their RULER generations measure nothing they were
taught, and a table prints such numbers as plainly as any other. A run says so once, before
its first sample. Models without a bamctl recipe (``hf:``, ``vllm:``, the authors'
checkpoints) are language models or unknown: nothing is said of them.
"""

from __future__ import annotations

from pathlib import Path

from typing import Callable

PASSKEY_ONLY = "passkey-only"
TEXT = "text"


def _kind_of_recipe(data: dict) -> str:
    """``passkey-only`` when the recipe's rows held no text, else ``text``."""
    return PASSKEY_ONLY if data.get("text") == "none" or float(data.get("passkey_fraction", 0.0)) >= 1.0 else TEXT


# The tasks each kind was trained for; any task fits a model trained on text.
FITTING_TASKS: dict[str, Callable[[str], bool]] = {
    PASSKEY_ONLY: lambda task: task == "passkey",
    TEXT: lambda task: True,
}
WHY = {PASSKEY_ONLY: "was trained on synthetic passkey prompts only, never as a language model"}


def trained_on(reference) -> str | None:
    """The training kind of a bamctl checkpoint's recipe; None for other back-ends, no recipe, or
    a model in memory (its training is the caller's)."""
    from bamctl.backends import BACKENDS, RunOptions, backend_for, split_rope_suffix
    from bamctl.catalog import checkpoint_path
    from bamctl.checkpoint import read_config
    from bamctl.errors import BamctlError

    if not isinstance(reference, str):
        return None
    try:
        reference, _ = split_rope_suffix(reference, RunOptions())
        entry, rest = backend_for(reference)
        if entry is BACKENDS["trained-py"]:  # a user's module trained by a recipe keeps it beside its weights
            from bamctl.module_checkpoint import read_module_config

            recipe = read_module_config(Path(rest).expanduser()).get("recipe") or {}
        elif entry is BACKENDS["native"]:
            recipe = read_config(checkpoint_path(rest)).get("recipe") or {}
        else:
            return None
    except (BamctlError, OSError, ValueError):
        return None
    data = recipe.get("data")
    return _kind_of_recipe(data) if isinstance(data, dict) else None


def mismatch_warnings(models: list, names: list[str], tasks: list[str]) -> list[str]:
    """One line per model whose training kind does not fit a task of the run."""
    lines = []
    for model, name in zip(models, names):
        kind = trained_on(model)
        if kind is None:
            continue
        unfit = [task for task in tasks if not FITTING_TASKS[kind](task)]
        if unfit:
            lines.append(f"warning: {name} {WHY[kind]}: its {', '.join(unfit)} numbers say nothing it was taught")
    return lines
