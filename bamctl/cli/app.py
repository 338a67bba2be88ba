"""The Typer application that every command module registers on."""

import typer

app = typer.Typer(
    name="bamctl",
    help=(
        "Benchmark long-context extrapolation of transformer language models: passkey "
        "retrieval, RULER needle-in-a-haystack and perplexity, streamed in chunks so "
        "memory grows linearly with context.\n\n"
        "Example: bamctl new --pe bam-ssmax --preset tiny --out models/demo && bamctl inspect models/demo"
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
