"""``bamctl pe check``: a positional encoding's self-check (``bamctl.pe_check``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bamctl.cli.app import app

pe_app = typer.Typer(help="Positional encodings of your own: check one before training it.", no_args_is_help=True)
app.add_typer(pe_app, name="pe")
stdout = Console()


@pe_app.command()
def check(
    pe: Annotated[str, typer.Argument(help="The PE: a plugin (FILE.py:CLASS, package.module:CLASS, an installed entry point) or a zoo name; -ssmax allowed.")],
    train_length: Annotated[int, typer.Option(min=8, help="The training length of the tiny model it is built into: the checks run at 4x it, 'finite far out' at 64x.")] = 64,
    quick: Annotated[bool, typer.Option("--quick", help="Only the checks bamctl new and train run first (no forward at 64x the training length).")] = False,
) -> None:
    """Build the PE into a tiny model and check it: hooks' shapes and dtypes, no information from a
    later token, the table a long run asks for starting with a short run's, the streaming engine in
    chunks equal to one forward, finite values at 64x the training length, and what block skipping
    may assume. One line each, pass or fail with its figure; exit 2 on a failure.

    Example: bamctl pe check examples/positional/cope.py:CoPE
    """
    from bamctl.errors import BamctlError
    from bamctl.pe_check import failures, run_checks

    checks = run_checks(pe, train_length=train_length, full=not quick)
    table = Table(title=f"pe check {pe}", show_lines=False)
    for column in ("check", "result", "figure"):
        table.add_column(column, overflow="fold")
    for item in checks:
        table.add_row(item.name, "[green]pass[/]" if item.passed else "[bold red]fail[/]", item.figure)
    stdout.print(table)
    failed = failures(checks)
    if failed:
        raise BamctlError(f"{pe} fails {len(failed)} check(s): {', '.join(c.name for c in failed)}")
