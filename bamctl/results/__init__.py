"""The results layer: one Parquet row per evaluated sample, summaries, exports and plots.

Modules, from storage up:
- `schema`  the typed columns of one row and their version;
- `store`   crash-safe append, resume keys and one-table reads of a results directory;
- `select`  filters a user asks for (task, model, a pandas query);
- `summary` pure statistics: Wilson intervals, accuracy/perplexity tables, effective length;
- `render`  rich tables and the JSON form of a summary;
- `export`  CSV, Markdown, LaTeX and JSON tables for papers;
- `plots`   accuracy-against-length curves and depth × length heatmaps.

Heavy modules (matplotlib) load only when their functions are imported from them.
"""

from bamctl.results.schema import KEY_COLUMNS, SCHEMA, SCHEMA_VERSION, row_key
from bamctl.results.store import ResultStore
from bamctl.results.summary import (
    Summary,
    accuracy_table,
    effective_length,
    perplexity_table,
    summarize,
    wilson_interval,
)

__all__ = [
    "KEY_COLUMNS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "ResultStore",
    "Summary",
    "accuracy_table",
    "effective_length",
    "perplexity_table",
    "row_key",
    "summarize",
    "wilson_interval",
]
