"""bamctl's version: in every checkpoint and result row it writes."""

__version__ = "0.1.0"
