"""The error catalog of flydsl-core: every error (and warning) class it raises on purpose.

One class per kind of error. Errors that come from a user's kernel carry
the kernel's own source location, so a report reads as
``ERROR[Name] file.py:12: message`` and points at the line the user wrote,
not at the compiler's frames. Trace-time errors (``TraceError`` and its
subclasses) and argument errors find that line themselves
(``user_location``): a raise site passes ``loc=`` only when it knows a
better one (an op's recorded location, the line of a ``break``).
``docs/errors.md`` lists the classes with example messages.

This module imports nothing from the rest of flydsl_core.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

#: the public surface: the classes docs/errors.md lists (the location helpers are the core's)
__all__ = [
    "ArgumentError",
    "CacheCorruptionWarning",
    "CacheError",
    "CompileError",
    "ControlFlowError",
    "FlyDSLError",
    "LayoutError",
    "LoweringError",
    "ReferenceRuntimeError",
    "SettingsError",
    "TraceError",
    "TritonLaunchError",
    "TypeCheckError",
    "UnknownSettingWarning",
    "UnknownTargetError",
    "UsageError",
    "VerifyError",
]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_EXAMPLES_DIR = os.path.join(_PKG_DIR, "examples") + os.sep


@dataclass(frozen=True)
class SourceLoc:
    """A position in a user's kernel source."""

    file: str
    line: int
    function: str = ""
    text: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def is_user_code(fname: str) -> bool:
    """Whether a frame of this file is the user's (not flydsl-core's own, bar its examples)."""
    path = os.path.abspath(fname)
    return not path.startswith(_PKG_DIR + os.sep) or path.startswith(_EXAMPLES_DIR)


def frame_location(f) -> SourceLoc:
    """The location a frame is executing now."""
    fname = f.f_code.co_filename
    return SourceLoc(fname, f.f_lineno, f.f_code.co_name, linecache.getline(fname, f.f_lineno))


def user_location(skip_pkg: bool = True) -> SourceLoc | None:
    """The innermost frame outside flydsl-core (its shipped examples count as user code):
    the kernel line being traced, or the user's call. ``skip_pkg=False``: the caller's frame."""
    f = sys._getframe(1)
    while f is not None:
        if not skip_pkg or is_user_code(f.f_code.co_filename):
            return frame_location(f)
        f = f.f_back
    return None


class FlyDSLError(Exception):
    """Base class of every error flydsl-core raises on purpose."""

    template: str = "{msg}"
    #: find the user's source line when no ``loc`` is given
    locate: bool = False

    def __init__(self, msg: str = "", *, loc: SourceLoc | None = None, **fields):
        if loc is None and self.locate:
            loc = user_location()
        self.loc = loc
        self.fields = fields
        self.msg = self.template.format(msg=msg, **fields) if fields or msg else self.template
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" {self.loc}:" if self.loc else ""
        text = f"ERROR[{type(self).__name__}]{where} {self.msg}"
        if self.loc and self.loc.text:
            text += f"\n    {self.loc.text.strip()}"
        return text


# -- writing and tracing kernels ---------------------------------------------------------------


class LayoutError(FlyDSLError, ValueError):
    """An operation of the layout algebra got arguments it is not defined for."""


class TraceError(FlyDSLError):
    """The kernel's Python code cannot be traced as written."""

    locate = True


class TypeCheckError(TraceError, TypeError):
    """Operands of an operation have dtypes or shapes that do not fit."""


class ControlFlowError(TraceError):
    """Python control flow depends on a traced (run-time) value, or leaves a structured
    region (``fly.range``, ``fly.while_``, ``fly.if_``) early."""


class ArgumentError(FlyDSLError, TypeError):
    """A kernel was called with arguments that do not match its signature, or a launch
    grid that is not 1 to 3 non-negative ints."""

    locate = True


# -- compiling --------------------------------------------------------------------------------


class VerifyError(FlyDSLError):
    """The IR breaks an invariant; a bug in a pass or in the tracer."""


class LoweringError(FlyDSLError):
    """A backend has no rule for an operation, or its rule failed."""


class CompileError(FlyDSLError):
    """The backend compiler rejected the generated code."""


# -- running ----------------------------------------------------------------------------------


class ReferenceRuntimeError(FlyDSLError, RuntimeError):
    """A kernel did something undefined while running on the reference backend
    (an unmasked out-of-bounds access, integer division by zero, a false hint)."""


class TritonLaunchError(FlyDSLError, RuntimeError):
    """A Triton-compiled kernel cannot be launched here (no matching GPU, CPU tensors)."""


# -- configuration ----------------------------------------------------------------------------


class SettingsError(FlyDSLError, ValueError):
    """An FLYDSL_* environment variable holds a value that cannot be parsed."""


class UnknownTargetError(FlyDSLError, ValueError):
    """A target name or device arch that flydsl-core does not know."""


class CacheError(FlyDSLError):
    """The compile cache could not be read or written."""


class UsageError(FlyDSLError, ValueError):
    """A command-line argument that is not valid (``flydsl``, ``flydsl-kernels``): reported
    in one line on stderr, exit status 2."""


class CacheCorruptionWarning(UserWarning):
    """A cache entry failed verification; it was removed (or, where it could not be,
    left in place) and the kernel compiled again."""


class UnknownSettingWarning(UserWarning):
    """A ``FLYDSL_*`` environment variable that no FlyDSL package declares (it is ignored)."""
