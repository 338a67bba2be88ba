"""bamctl: a benchmark suite for long-context extrapolation of language models.

From Python, ``bamctl.evaluate`` returns a run's rows and ``bamctl.compare`` its summary
(``bamctl.api``); the command line is ``bamctl --help``.
"""

from bamctl.api import Comparison, compare, evaluate
from bamctl.version import __version__

__all__ = ["evaluate", "compare", "Comparison", "__version__"]
