"""Config spaces, static pruning, timing and the tuning database."""

from .config import OPTION_NAMES, Config, ConfigSpace
from .db import Entry, TuningDB, user_db_path
from .prune import Candidate, PruneResult, prune
from .tuner import TuneResult, static_pick, tune

__all__ = [
    "OPTION_NAMES",
    "Candidate",
    "Config",
    "ConfigSpace",
    "Entry",
    "PruneResult",
    "TuneResult",
    "TuningDB",
    "prune",
    "static_pick",
    "tune",
    "user_db_path",
]
