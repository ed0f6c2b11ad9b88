"""The pass pipeline: a visible list of named passes, with dumps.

``DEFAULT_PIPELINE`` names the passes in order. After tracing and after each
pass the IR is verified (unless ``FLYDSL_VERIFY=0``), and when
``FLYDSL_DUMP_DIR`` is set each stage is written there as
``<kernel>-<hash>/NN_<pass>.ir`` (``00_traced.ir`` first).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from ..exc import FlyDSLError
from ..ir.core import Function
from ..ir.printer import print_function
from ..ir.verifier import verify
from ..settings import settings
from .cse import cse
from .dce import dce
from .fold import fold
from .masks import eliminate_masks
from .specialize import specialize

log = logging.getLogger(__name__)

PASSES: dict[str, Callable[[Function], Function]] = {
    "specialize": specialize,
    "fold": fold,
    "eliminate-masks": eliminate_masks,
    "cse": cse,
    "dce": dce,
}

DEFAULT_PIPELINE: tuple[str, ...] = ("specialize", "fold", "cse", "eliminate-masks", "fold", "dce")


def register_pass(name: str, fn: Callable[[Function], Function]) -> None:
    if name in PASSES:
        raise FlyDSLError(f"a pass named {name!r} is already registered")
    PASSES[name] = fn


class PassManager:
    def __init__(self, names=None):
        names = tuple(DEFAULT_PIPELINE if names is None else names)
        unknown = [n for n in names if n not in PASSES]
        if unknown:
            raise FlyDSLError(f"unknown passes {unknown}; known: {sorted(PASSES)}")
        self.names = names

    def run(self, fn: Function) -> Function:
        s = settings()
        dump = None
        if s.dump_dir is not None:
            text = print_function(fn, locs=True)
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            dump = Path(s.dump_dir) / f"{fn.name}-{digest}"
            dump.mkdir(parents=True, exist_ok=True)
            (dump / "00_traced.ir").write_text(text + "\n")
        for i, name in enumerate(self.names, 1):
            fn = PASSES[name](fn)
            if s.verify_each_pass:
                verify(fn)
            if dump is not None:
                (dump / f"{i:02d}_{name}.ir").write_text(print_function(fn, locs=True) + "\n")
            log.debug("after %s:\n%s", name, _Lazy(fn))
        return fn


class _Lazy:
    """Prints the IR only if the log record is emitted."""

    def __init__(self, fn):
        self.fn = fn

    def __str__(self):
        return print_function(self.fn)


def run_pipeline(fn: Function, names=None) -> Function:
    return PassManager(names).run(fn)
