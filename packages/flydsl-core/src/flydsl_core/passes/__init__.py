"""FlyIR passes and the pipeline that runs them."""

from .cse import cse
from .dce import dce
from .facts import Facts
from .fold import fold
from .manager import DEFAULT_PIPELINE, PASSES, PassManager, register_pass, run_pipeline
from .masks import eliminate_masks
from .specialize import specialize

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "Facts",
    "PassManager",
    "cse",
    "dce",
    "eliminate_masks",
    "fold",
    "register_pass",
    "run_pipeline",
    "specialize",
]
