"""``Launch``: one kernel launch as a family's plan describes it, runnable or compilable.

Every family's ``plan.py`` turns a problem (shapes, dtypes, strides, options, the target) into
``Launch``es: the kernel, its grid, its run-time arguments in the kernel's order, its
constexprs and its compiler options. The function API runs them on torch tensors; the config
model, the compile tests and the report compile the same launches with ``TensorSpec``s in
place of the tensors. So each kernel's call is written once, in its family's plan.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

#: options the launcher also takes as plain keywords (``runtime.kernel.LAUNCH_OPTIONS``); a
#: launch whose options are all of these passes them so, which keeps the launch's fast-path
#: key hashable (an ``options=`` dict sends every call through the slow bind)
_KEYWORD_OPTIONS = frozenset({"num_warps", "num_stages"})


@dataclass
class Launch:
    """One kernel launch: ``run(target)`` launches it, ``compile(target)`` only compiles it."""

    kernel: Any  # a ``flydsl_core`` Kernel
    grid: tuple
    args: tuple  # run-time arguments, in the kernel's order (tensors or ``TensorSpec``s)
    constexprs: dict
    options: dict = field(default_factory=dict)  # compiler options (num_warps, ...)

    def __post_init__(self):
        if getattr(_RECORDING, "launches", None) is not None:
            f = sys._getframe(2)  # the plan line that built this launch (past __init__)
            self.origin = (f.f_code.co_filename, f.f_lineno)

    @property
    def name(self) -> str:
        return self.kernel.name

    def run(self, target):
        """Launch on ``target``; returns the ``CompiledKernel``. (No test of the grid here:
        sizes may be symbolic under a graph capture, and the APIs return before an empty launch.)"""
        opts = self.options
        if opts.keys() <= _KEYWORD_OPTIONS:
            return self.kernel[self.grid](*self.args, **self.constexprs, target=target, **opts)
        return self.kernel[self.grid](*self.args, **self.constexprs, target=target, options=opts)

    def compile(self, target):
        """Compile for ``target`` without running (``TensorSpec`` arguments need no GPU); inside
        ``recording()``, record this launch and return it instead."""
        rec = getattr(_RECORDING, "launches", None)
        if rec is not None:
            rec.append(self)
            return self
        return self.kernel.compile(
            *self.args, target=target, options=self.options, **self.constexprs
        )


def run_all(launches, target) -> None:
    """Run ``launches`` in order on ``target``."""
    for launch in launches:
        launch.run(target)


_RECORDING = threading.local()


@contextlib.contextmanager
def recording():
    """``with recording() as launches:`` on this thread, ``Launch.compile`` appends the launch
    to ``launches`` (each with ``origin``, the plan line that built it) and compiles nothing:
    how ``flydsl export`` reads the launches a report case compiles."""
    prev = getattr(_RECORDING, "launches", None)
    _RECORDING.launches = out = []
    try:
        yield out
    finally:
        _RECORDING.launches = prev


def is_recording() -> bool:
    """Whether ``recording()`` is on for this thread (``Launch.compile`` compiles nothing)."""
    return getattr(_RECORDING, "launches", None) is not None
