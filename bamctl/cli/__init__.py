"""Command-line entry point: parse, call the library, render; errors become one line."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from bamctl.version import __version__
from bamctl.cli.app import app
from bamctl.errors import BamctlError

try:  # typer >= 0.17 vendors its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer on top of click
    from click import exceptions as click_errors

# Ctrl-C and early exits as the installed typer/click spell them.
ABORTS = tuple({KeyboardInterrupt, typer.Abort, getattr(click_errors, "Abort", typer.Abort)})
EXITS = tuple({typer.Exit, getattr(click_errors, "Exit", typer.Exit)})

# Each module registers its commands on `app` when imported; --help lists them in this order,
# the evaluations a newcomer comes for first.
from bamctl.cli import eval_commands  # noqa: E402,F401
from bamctl.cli import results_commands  # noqa: E402,F401
from bamctl.cli import model_commands  # noqa: E402,F401
from bamctl.cli import task_commands  # noqa: E402,F401
from bamctl.cli import train_commands  # noqa: E402,F401
from bamctl.cli import submit_commands  # noqa: E402,F401
from bamctl.cli import harness_commands  # noqa: E402,F401
from bamctl.cli import pe_commands  # noqa: E402,F401

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

stderr = Console(stderr=True, highlight=False)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bamctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Benchmark long-context extrapolation of transformer language models."""


def _fail(message: str, code: int) -> None:
    stderr.print(f"[bold red]error:[/] {message}", soft_wrap=True, markup=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI. Known errors print one red line (exit 2); BAMCTL_DEBUG=1 shows tracebacks."""
    debug = os.environ.get("BAMCTL_DEBUG") == "1"
    try:
        result = app(args=argv, standalone_mode=False, prog_name="bamctl")
    except BamctlError as err:
        if debug:
            raise
        _fail(str(err).replace("[", r"\["), EXIT_USAGE)
    except click_errors.UsageError as err:
        if debug:
            raise
        hint = f" (see 'bamctl {err.ctx.command_path.split(' ', 1)[1]} --help')" if err.ctx and " " in err.ctx.command_path else " (see 'bamctl --help')"
        message = err.format_message().replace("Value error, ", "")  # typer's choices speak through pydantic
        _fail(message.replace("[", r"\[") + hint, EXIT_USAGE)
    except click_errors.ClickException as err:
        if debug:
            raise
        _fail(err.format_message().replace("[", r"\["), EXIT_USAGE)
    except ABORTS:
        stderr.print("interrupted; finished work is kept")
        sys.exit(EXIT_INTERRUPTED)
    except EXITS as err:
        sys.exit(err.exit_code)
    except Exception as err:  # a bug, not bad input: say so, keep the traceback one variable away
        if debug:
            raise
        _fail(f"internal error: {type(err).__name__}: {err} (set BAMCTL_DEBUG=1 for the traceback)", 1)
    else:
        if result == EXIT_INTERRUPTED:  # typer turns Ctrl-C into this return value
            stderr.print("interrupted; finished work is kept")
        sys.exit(result if isinstance(result, int) else 0)


def entry() -> None:
    """The ``bamctl`` command (and ``python -m bamctl``): :func:`main` on ``sys.argv``, then the
    process ends with its exit status."""
    try:
        main()
    except SystemExit as done:
        code = done.code
    else:
        code = 0
    _leave(code)


def _leave(code) -> None:
    """End the process with ``code``. Where vLLM ran in this process, its threads outside Python
    (ZeroMQ's, the engine client's) can abort the interpreter's own teardown ("terminate called
    without an active exception", exit -6) after every result is written and the engine is
    stopped; so there the exit handlers run, output is flushed, and the process ends without the
    teardown, with the status the command chose."""
    if "vllm" not in sys.modules or not (code is None or isinstance(code, int)):
        sys.exit(code)
    import atexit
    import logging

    atexit._run_exitfuncs()  # what would run at exit: temporary folders, multiprocessing's children
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
