"""What a result row's ``score`` holds for each task: the table docs/SCHEMA.md shows.

``score`` is one column for every task, and its meaning follows the task's metric: an
accuracy in [0, 1] for passkey and RULER, a mean NLL in nats for perplexity. The table
is made from the task registry and the metrics' own docstrings, so it cannot drift from
the code; a test compares it with the page.
"""

from __future__ import annotations

import inspect

from bamctl.tasks.metrics import METRICS
from bamctl.tasks.registry import get_task, protocol_names, task_names

AUTO = "auto"


def score_table() -> str:
    """A Markdown table: per metric, the tasks and protocols that score by it and what ``score`` then holds."""
    by_metric: dict[str, dict[str, list[str]]] = {}
    for task in task_names():
        for protocol in protocol_names(task):
            if protocol == AUTO:
                continue
            metric = get_task(task, protocol).metric
            by_metric.setdefault(metric, {}).setdefault(protocol, []).append(task)
    lines = ["| tasks | protocols | metric | `score` holds |", "|---|---|---|---|"]
    for metric, protocols in by_metric.items():
        tasks = list(dict.fromkeys(task for names in protocols.values() for task in names))
        meaning = " ".join(inspect.getdoc(METRICS[metric]).split())
        lines.append(f"| {', '.join(tasks)} | {', '.join(protocols)} | `{metric}` | {meaning} |")
    return "\n".join(lines)
