"""Every ``FLYDSL_*`` environment variable, declared once by the package that reads it, and
parsed strictly.

Each package declares its own variables in one table mechanism, ``declare(package, *vars)``:
flydsl-core below; flydsl-kernels in ``flydsl_kernels/variables.py``; torch-flydsl in
``torch_flydsl/variables.py``; the test suite in ``tests/conftest.py``. An installed package
makes its declarations discoverable without importing it through the ``flydsl.settings``
entry point group (``pyproject.toml``)::

    [project.entry-points."flydsl.settings"]
    torch-flydsl = "torch_flydsl.variables:VARIABLES"

The module named there imports nothing but this one (it is loaded on its own, without its
package's ``__init__``, so that listing or checking the variables never imports torch or runs
a package's import-time work); ``load_all()`` loads every such module. Core names no other
package: what is installed is what is listed (``flydsl settings``).

``get(name)`` parses one variable. A value that does not parse raises ``SettingsError`` naming
the variable and what it accepts, instead of being silently ignored or read as the default.
Values are read at call time, so tests can change the environment. A ``FLYDSL_*`` name in
the environment that no package declares (a typo of a declared name) is
reported once per process through ``warnings`` (``UnknownSettingWarning``, naming the
closest declared name) at the first read of any setting, and listed by ``flydsl settings``.

Target names (``FLYDSL_TARGET``) are parsed here as names and checked against the target
registry by the code that uses them (``targets.resolve_target``), whose error also names the
variable: this module imports nothing above it.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from .exc import SettingsError, UnknownSettingWarning

#: the public surface: what other packages use (declare their variables, read one)
__all__ = [
    "ENTRY_POINT_GROUP",
    "PREFIX",
    "VARIABLES",
    "UnknownSettingWarning",
    "Var",
    "check_all",
    "check_environment",
    "declare",
    "default_cache_dir",
    "get",
    "load_all",
    "load_errors",
    "unknown",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
#: the entry point group through which installed packages declare their variables
ENTRY_POINT_GROUP = "flydsl.settings"
PREFIX = "FLYDSL_"


@dataclass(frozen=True)
class Var:
    """One environment variable: how it parses and what it means."""

    name: str
    kind: str  # "flag" | "int" | "choice" | "str" | "path" | "dir" | "list"
    doc: str
    default: object = None
    choices: tuple[str, ...] = ()  # "choice": the accepted values (lower case)
    minimum: int | None = None  # "int"
    package: str = ""  # the package that declares (and reads) it; set by declare()

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
        if self.kind == "dir":
            return "a folder path (created when missing; not a file)"
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
        elif self.kind == "dir":
            p = Path(text).expanduser()
            blocker = next((a for a in (p, *p.parents) if a.exists()), None)
            if blocker is None or blocker.is_dir():
                return p
            raise SettingsError(
                f"{self.name}={raw!r}: {blocker} is a file, not a folder; it takes "
                f"{self.accepted()}"
            )
        elif self.kind == "list":
            items = tuple(p.strip() for p in text.split(","))
            if all(items):
                return items
        else:
            return text
        raise SettingsError(f"{self.name}={raw!r} is not valid; it takes {self.accepted()}")


#: every declared FLYDSL_* variable, by name (what has been declared in this process so far:
#: ``load_all()`` adds every installed package's)
VARIABLES: dict[str, Var] = {}


def declare(package: str, *variables: Var) -> tuple[Var, ...]:
    """Declare ``package``'s variables (each package once, in one module); returns them with
    ``package`` set. A name outside ``FLYDSL_*`` or declared differently by another package
    is a ``ValueError``."""
    out = []
    for v in variables:
        if not v.name.startswith(PREFIX) or not v.name[len(PREFIX) :]:
            raise ValueError(f"{v.name!r}: FlyDSL settings are named FLYDSL_<NAME>")
        v = replace(v, package=package)
        old = VARIABLES.get(v.name)
        if old is not None and old != v:
            raise ValueError(f"{v.name} is declared by {old.package} already")
        VARIABLES[v.name] = v
        out.append(v)
    return tuple(out)


declare(
    "flydsl-core",
    Var(
        "FLYDSL_TARGET",
        "str",
        "the target to compile for, by name or alias (see `flydsl targets`); "
        "default: the current GPU, else cpu-reference",
    ),
    Var(
        "FLYDSL_GPU_ARCH",
        "str",
        "the arch to assume for the current GPU instead of the one torch "
        "reports (e.g. gfx950); only where a GPU is present",
    ),
    Var(
        "FLYDSL_CACHE_DIR",
        "dir",
        "the compile cache folder (default $XDG_CACHE_HOME/flydsl or ~/.cache/flydsl)",
    ),
    Var("FLYDSL_DISABLE_CACHE", "flag", "1: do not read or write the on-disk compile cache", False),
    Var("FLYDSL_DUMP_DIR", "dir", "write the FlyIR after tracing and after every pass here"),
    Var("FLYDSL_VERIFY", "flag", "0: skip the IR verifier between passes", True),
    Var(
        "FLYDSL_GENERIC_BINDER",
        "flag",
        "1: compute launch keys with the plain loop instead of "
        "the generated per-kernel function (debugging)",
        False,
    ),
)


# -- installed packages' declarations (entry points) ---------------------------------------------

_LOADED: set[str] = set()  # entry point values already loaded
_LOAD_ERRORS: dict[str, str] = {}  # entry point value -> why it could not be loaded


def _entry_points():
    from importlib.metadata import entry_points

    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def _module_file(name: str) -> str | None:
    """The source file of module ``name`` found without importing its parent packages."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if len(parts) == 1:
        return spec.origin
    dirs = list(spec.submodule_search_locations or ())
    for p in parts[1:-1]:
        dirs = [os.path.join(d, p) for d in dirs]
    for d in dirs:
        f = os.path.join(d, parts[-1] + ".py")
        if os.path.isfile(f):
            return f
    return None


def _load_module(name: str):
    """Module ``name``, loaded on its own when its package is not imported yet (declaring
    modules import nothing but this one, so their package's ``__init__`` need not run)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    parent = name.rpartition(".")[0]
    if not parent or parent in sys.modules:
        return importlib.import_module(name)
    path = _module_file(name)
    if path is None:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def load_all() -> dict[str, Var]:
    """Load every installed package's declarations (``ENTRY_POINT_GROUP``); returns
    ``VARIABLES``. A package whose declarations cannot be loaded is recorded
    (``load_errors()``), not raised: the others still count."""
    for ep in _entry_points():
        if ep.value in _LOADED:
            continue
        _LOADED.add(ep.value)
        try:
            getattr(_load_module(ep.module), ep.attr) if ep.attr else _load_module(ep.module)
        except Exception as e:  # a broken package must not hide every other variable
            _LOAD_ERRORS[ep.value] = f"{type(e).__name__}: {e}"
    return VARIABLES


def load_errors() -> dict[str, str]:
    """``{entry point: why}`` for declarations ``load_all()`` could not load."""
    return dict(_LOAD_ERRORS)


def unknown(environ=None) -> dict[str, str | None]:
    """``{name: closest declared name or None}`` for every ``FLYDSL_*`` name set in
    ``environ`` (default ``os.environ``) that no installed package declares."""
    env = os.environ if environ is None else environ
    names = [n for n in env if n.startswith(PREFIX)]
    if all(n in VARIABLES for n in names):
        return {}
    load_all()
    out = {}
    for n in sorted(names):
        if n not in VARIABLES:
            close = difflib.get_close_matches(n, list(VARIABLES), n=1, cutoff=0.8)
            out[n] = close[0] if close else None
    return out


_CHECKED = False


def check_environment() -> dict[str, str | None]:
    """Warn (``UnknownSettingWarning``, once per process) about every ``FLYDSL_*`` name in the
    environment that no package declares; returns them (``unknown()``)."""
    global _CHECKED
    found = unknown()
    if not _CHECKED:
        _CHECKED = True
        for name, close in found.items():
            hint = f"; did you mean {close}?" if close else ""
            warnings.warn(
                f"{name} is set but no FlyDSL package declares it, so it is ignored{hint} "
                "(`flydsl settings` lists the variables)",
                UnknownSettingWarning,
                stacklevel=3,
            )
    return found


def get(name: str):
    """The parsed value of the declared variable ``name`` (its default when unset or blank)."""
    if not _CHECKED:
        check_environment()
    var = VARIABLES.get(name)
    if var is None:
        var = load_all().get(name)
    if var is None:
        raise SettingsError(
            f"{name} is not a FlyDSL setting; declare it with flydsl_core.settings.declare"
        )
    return var.parse(os.environ.get(name))


def check_all() -> None:
    """Parse every variable of every installed package that is set (a bad one raises
    ``SettingsError``)."""
    for name in list(load_all()):
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
