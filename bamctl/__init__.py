"""bamctl: a benchmark suite for long-context extrapolation of language models."""

__version__ = "0.1.0"
