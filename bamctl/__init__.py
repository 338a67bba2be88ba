"""bamctl: a benchmark suite for long-context extrapolation of language models.

From Python, ``bamctl.evaluate`` returns a run's rows and ``bamctl.compare`` its summary
(``bamctl.api``); the command line is ``bamctl --help``.
"""

from bamctl.code_version import record_imports

record_imports()  # before any other bamctl module: a compute version hashes the code this process runs

from bamctl.api import Comparison, compare, evaluate  # noqa: E402
from bamctl.version import __version__  # noqa: E402

__all__ = ["evaluate", "compare", "Comparison", "__version__"]
