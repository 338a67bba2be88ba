"""The Typer application that every command module registers on."""

import typer

app = typer.Typer(
    name="bamctl",
    help=(
        "Benchmark long-context extrapolation of transformer language models: passkey "
        "retrieval, RULER needle-in-a-haystack and perplexity, streamed in chunks so "
        "memory grows linearly with context.\n\n"
        "Examples:\n\n"
        "bamctl passkey bam-ssmax --lengths 128..8k    (one model: accuracy per length)\n\n"
        "bamctl compare rope alibi bam-ssmax --task passkey --lengths 128..8k    (side by side, with paired tests)\n\n"
        "bamctl models    (the shipped reference models)"
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="rich",
)
