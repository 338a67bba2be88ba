"""Tasks: seeded prompt generators with exact token lengths, and their metrics.

Tasks never see models: a task yields :class:`Sample` objects (token ids, text,
answers, how to score), a back-end answers them, a metric scores the answer.
Variants are data in the repository's ``tasks/*.toml``.
"""

from bamctl.tasks.metrics import METRICS, score, string_match_all, string_match_part
from bamctl.tasks.passkey import passkey_digit_hits
from bamctl.tasks.perplexity import Bucket, Window, position_buckets, ppl_corpus_tokens, sliding_windows
from bamctl.tasks.registry import TaskVariant, generate_samples, get_task, task_names
from bamctl.tasks.sample import Sample

__all__ = [
    "METRICS",
    "Bucket",
    "Sample",
    "TaskVariant",
    "Window",
    "generate_samples",
    "get_task",
    "passkey_digit_hits",
    "position_buckets",
    "ppl_corpus_tokens",
    "score",
    "sliding_windows",
    "string_match_all",
    "string_match_part",
    "task_names",
]
