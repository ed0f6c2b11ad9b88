"""Config spaces, static pruning and timing on a GPU.

Kernel families keep the configs they ship in their own ``configs.py`` (each
with its source: a static pick or a timed one); there is no tuning database.
"""

from .config import OPTION_NAMES, Config, ConfigSpace
from .prune import Candidate, PruneResult, prune
from .tuner import TuneResult, static_pick, tune

__all__ = [
    "OPTION_NAMES",
    "Candidate",
    "Config",
    "ConfigSpace",
    "PruneResult",
    "TuneResult",
    "prune",
    "static_pick",
    "tune",
]
