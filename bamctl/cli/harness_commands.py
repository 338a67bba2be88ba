"""``bamctl lm-eval``: lm-evaluation-harness's own command line, with ``--model bamctl`` in it."""

from __future__ import annotations

import sys

import typer

from bamctl.cli.app import app
from bamctl.errors import BamctlError

LM_EVAL_COMMANDS = ("run", "ls", "validate")


def lm_eval_argv(args: list[str]) -> list[str]:
    """What lm-eval's command line is given: its ``run`` (unless another of its commands is
    named), with ``--model bamctl`` unless a model is named."""
    if args and args[0] in LM_EVAL_COMMANDS:
        command, rest = args[0], args[1:]
    else:
        command, rest = "run", args
    named = any(a == "--model" or a.startswith("--model=") for a in rest)
    if command == "run" and not named:
        rest = ["--model", "bamctl", *rest]
    return ["lm-eval", command, *rest]


@app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def lm_eval(ctx: typer.Context) -> None:
    """Run lm-evaluation-harness on a bamctl model: lm-eval's own command line, with --model bamctl.

    Every argument goes to lm-eval (`lm-eval run`), with `--model bamctl` added; `--model_args`
    names the model and bamctl's engine options: model= (a catalog name, a checkpoint folder,
    hf:PATH, vllm:PATH, bam:PATH), dtype, device, chunk_size, bos, rope_scaling and rope_factor,
    max_gen_toks. `--batch_size auto` sizes batches as bamctl's runs do. `bamctl lm-eval --help`
    prints lm-eval's own help.

    Example: bamctl lm-eval --model_args model=lm-bam,dtype=float32 --tasks arc_easy --batch_size auto
    """
    try:
        import bamctl.harness  # noqa: F401  registers --model bamctl in lm-eval's registry
        from lm_eval.__main__ import cli_evaluate
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] == "lm_eval":
            raise BamctlError("bamctl lm-eval needs lm-eval: pip install 'bamctl[lm-eval]'") from None
        raise
    argv = sys.argv
    sys.argv = lm_eval_argv(list(ctx.args))
    try:
        with bamctl.harness.closing_what_it_makes():  # vLLM's engine stops here, not in the interpreter's exit
            cli_evaluate()
    except ValueError as err:
        if not raised_by_lm_eval(err):
            raise
        # lm-eval's refusal of its own input ("Tasks not found: x"): one line, as bamctl's are
        raise BamctlError(f"lm-eval: {err}{TASKS_HINT if 'task' in str(err).lower() else ''}") from err
    finally:
        sys.argv = argv


TASKS_HINT = " (`bamctl lm-eval ls tasks` lists them; --include_path adds a folder of task YAMLs)"


def raised_by_lm_eval(err: BaseException) -> bool:
    """Whether ``err`` was raised in lm-eval's own code, not in bamctl's plugin it called."""
    import os

    import lm_eval

    frame = err.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return False
    package = os.path.dirname(os.path.abspath(lm_eval.__file__)) + os.sep
    return os.path.abspath(frame.tb_frame.f_code.co_filename).startswith(package)
