"""Every ``FLYDSL_*`` environment variable, declared once and parsed strictly.

``VARIABLES`` is the one table of the variables flydsl-core, flydsl-kernels
and torch-flydsl read; ``get(name)`` parses one of them. A value that does
not parse raises ``SettingsError`` naming the variable and what it accepts,
instead of being silently ignored or read as the default. Values are read
at call time, so tests can change the environment.

Target names (``FLYDSL_TARGET``, ``FLYDSL_TORCH_CPU_TARGET``) are parsed here
as names and checked against the target registry by the code that uses
them (``targets.resolve_target``), whose error also names the variable:
this module imports nothing above it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .exc import SettingsError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Var:
    """One environment variable: how it parses and what it means."""

    name: str
    kind: str  # "flag" | "int" | "choice" | "str" | "path" | "list"
    doc: str
    default: object = None
    choices: tuple[str, ...] = ()  # "choice": the accepted values (lower case)
    minimum: int | None = None  # "int"
    package: str = "flydsl-core"  # the package that reads it

    def accepted(self) -> str:
        """What the variable accepts, in words (for errors and docs)."""
        if self.kind == "flag":
            return "1/0, true/false, yes/no or on/off"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "int":
            return "an integer" + (f" >= {self.minimum}" if self.minimum is not None else "")
        if self.kind == "list":
            return "a comma-separated list of names"
        return "a path" if self.kind == "path" else "a name"

    def parse(self, raw: str | None):
        """The value of ``raw`` (the variable's text; None or blank: the default)."""
        if raw is None or raw.strip() == "":
            return self.default
        text = raw.strip()
        if self.kind == "flag":
            low = text.lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
        elif self.kind == "choice":
            if text.lower() in self.choices:
                return text.lower()
        elif self.kind == "int":
            try:
                val = int(text, 0)
            except ValueError:
                val = None
            if val is not None and (self.minimum is None or val >= self.minimum):
                return val
        elif self.kind == "path":
            return Path(text).expanduser()
        elif self.kind == "list":
            items = tuple(p.strip() for p in text.split(","))
            if all(items):
                return items
        else:
            return text
        raise SettingsError(f"{self.name}={raw!r} is not valid; it takes {self.accepted()}")


_VARS = (
    # -- flydsl-core -----------------------------------------------------------------------
    Var("FLYDSL_TARGET", "str", "the target to compile for, by name or alias (see `flydsl targets`); "
        "default: the current GPU, else cpu-reference"),
    Var("FLYDSL_GPU_ARCH", "str", "the arch to assume for the current GPU instead of the one torch "
        "reports (e.g. gfx950); only where a GPU is present"),
    Var("FLYDSL_CACHE_DIR", "path", "the compile cache folder (default $XDG_CACHE_HOME/flydsl or "
        "~/.cache/flydsl)"),
    Var("FLYDSL_DISABLE_CACHE", "flag", "1: do not read or write the on-disk compile cache", False),
    Var("FLYDSL_DUMP_DIR", "path", "write the FlyIR after tracing and after every pass here"),
    Var("FLYDSL_VERIFY", "flag", "0: skip the IR verifier between passes", True),
    Var("FLYDSL_GENERIC_BINDER", "flag", "1: compute launch keys with the plain loop instead of "
        "the generated per-kernel function (debugging)", False),
    Var("FLYDSL_ACCEPT", "flag", "1: the golden-file tests rewrite their golden files", False,
        package="tests"),
    Var("FLYDSL_TEST_AOTI", "flag", "1: also run the AOTInductor package test on the CPU "
        "(opt-in: minutes)", False, package="tests"),
    # -- torch-flydsl ----------------------------------------------------------------------
    Var("FLYDSL_TORCH", "flag", "1: `import torch_flydsl` enables the overrides", False,
        package="torch-flydsl"),
    Var("FLYDSL_TORCH_DEVICE", "choice", "the device enable() registers for when none is given",
        "cuda", choices=("cuda", "cpu", "rocm", "hip", "gpu"), package="torch-flydsl"),
    Var("FLYDSL_TORCH_PRECEDENCE", "choice", "ours: register over prior (e.g. torch's own) "
        "overrides; upstream: leave op groups that already have one", "ours",
        choices=("ours", "upstream"), package="torch-flydsl"),
    Var("FLYDSL_TORCH_ARCHS", "list", "GPU archs the overrides dispatch to (default gfx950)",
        package="torch-flydsl"),
    Var("FLYDSL_TORCH_CPU_TARGET", "str", "the CPU target of the CPU test backend: cpu-reference "
        "or cpu-interpret (or an alias); default: $FLYDSL_TARGET where it names a CPU target, "
        "else cpu-reference", package="torch-flydsl"),
    Var("FLYDSL_TORCH_GATES", "path", "the local gate table (default <cache dir>/torch_gates.json)",
        package="torch-flydsl"),
)  # fmt: skip

#: every FLYDSL_* variable, by name
VARIABLES: dict[str, Var] = {v.name: v for v in _VARS}


def get(name: str):
    """The parsed value of the declared variable ``name`` (its default when unset or blank)."""
    try:
        var = VARIABLES[name]
    except KeyError:
        raise SettingsError(
            f"{name} is not a FlyDSL setting; declare it in flydsl_core.settings.VARIABLES"
        ) from None
    return var.parse(os.environ.get(name))


def check_all() -> None:
    """Parse every variable that is set (a bad one raises ``SettingsError``)."""
    for name in VARIABLES:
        get(name)


def default_cache_dir() -> Path:
    """``$FLYDSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/flydsl``, else ``~/.cache/flydsl``."""
    explicit = get("FLYDSL_CACHE_DIR")
    if explicit is not None:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "flydsl"


@dataclass(frozen=True)
class Settings:
    """What the pass pipeline reads (``passes/manager.py``), read at once."""

    dump_dir: Path | None  # FLYDSL_DUMP_DIR: write IR after every pass here
    verify_each_pass: bool  # FLYDSL_VERIFY=0 turns the verifier off between passes


def settings() -> Settings:
    """The pass pipeline's settings, read now."""
    return Settings(dump_dir=get("FLYDSL_DUMP_DIR"), verify_each_pass=get("FLYDSL_VERIFY"))
