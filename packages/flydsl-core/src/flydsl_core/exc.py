"""The error catalog of flydsl-core.

One class per error, each with a message template. Errors that come from a
user's kernel carry the kernel's own source location, so a report reads as
``ERROR[Name] file.py:12: message`` and points at the line the user wrote,
not at the compiler's frames.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """A position in a user's kernel source."""

    file: str
    line: int
    function: str = ""
    text: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class FlyDSLError(Exception):
    """Base class of every error flydsl-core raises on purpose."""

    template: str = "{msg}"

    def __init__(self, msg: str = "", *, loc: SourceLoc | None = None, **fields):
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


class LayoutError(FlyDSLError, ValueError):
    """An operation of the layout algebra got arguments it is not defined for."""


class TraceError(FlyDSLError):
    """The kernel's Python code cannot be traced as written."""


class TypeCheckError(TraceError, TypeError):
    """Operands of an operation have dtypes or shapes that do not fit."""


class ControlFlowError(TraceError):
    """Python control flow depends on a traced (run-time) value."""


class VerifyError(FlyDSLError):
    """The IR breaks an invariant; a bug in a pass or in the tracer."""


class LoweringError(FlyDSLError):
    """A backend has no rule for an operation, or its rule failed."""


class ArgumentError(FlyDSLError, TypeError):
    """A kernel was called with arguments that do not match its signature."""


class SettingsError(FlyDSLError, ValueError):
    """An FLYDSL_* environment variable holds a value that cannot be parsed."""


class UnknownTargetError(FlyDSLError, ValueError):
    """A target name or device arch that flydsl-core does not know."""


class CompileError(FlyDSLError):
    """The backend compiler rejected the generated code."""


class CacheError(FlyDSLError):
    """The compile cache could not be read or written."""
