"""Tasks: seeded prompt generators with exact token lengths, and their metrics.

Tasks never see models: a task plans :class:`SampleSlot` objects and builds each into a
:class:`Sample` (token ids, text, answers, how to score), a back-end answers it, a metric
scores the answer. Tasks and their protocols are data in the repository's ``bamctl/data/tasks/*.toml``.
"""

from bamctl.tasks.metrics import METRICS, score, string_match_all, string_match_part
from bamctl.tasks.passkey import passkey_digit_hits
from bamctl.tasks.perplexity import Bucket, Window, position_buckets, ppl_corpus_tokens, sliding_windows
from bamctl.tasks.registry import TaskPlan, TaskSpec, generate_samples, get_task, plan_samples, protocol_names, task_names
from bamctl.tasks.sample import Sample, SampleSlot, ScoredSpan

__all__ = [
    "METRICS",
    "Bucket",
    "Sample",
    "SampleSlot",
    "ScoredSpan",
    "TaskPlan",
    "TaskSpec",
    "Window",
    "generate_samples",
    "get_task",
    "passkey_digit_hits",
    "plan_samples",
    "position_buckets",
    "ppl_corpus_tokens",
    "protocol_names",
    "score",
    "sliding_windows",
    "string_match_all",
    "string_match_part",
    "task_names",
]
