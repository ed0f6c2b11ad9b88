"""Process-wide settings, read from ``FLYDSL_*`` environment variables.

All parsing is strict: a value that does not parse raises ``SettingsError``
naming the variable, instead of being silently ignored. Settings are read at
call time (``settings()``), so tests can change the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .exc import SettingsError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    val = raw.strip().lower()
    if val in _TRUE:
        return True
    if val in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        val = int(raw.strip(), 0)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and val < minimum:
        raise SettingsError(f"{name}={raw!r} must be at least {minimum}")
    return val


def env_str(name: str, default: str | None = None) -> str | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip()


def default_cache_dir() -> Path:
    """``$FLYDSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/flydsl``, else ``~/.cache/flydsl``."""
    explicit = env_str("FLYDSL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env_str("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "flydsl"


@dataclass(frozen=True)
class Settings:
    target: str | None  # FLYDSL_TARGET: explicit target name
    dump_dir: Path | None  # FLYDSL_DUMP_DIR: write IR after every pass here
    cache_dir: Path  # FLYDSL_CACHE_DIR
    cache_disabled: bool  # FLYDSL_DISABLE_CACHE=1 skips the on-disk cache
    verify_each_pass: bool  # FLYDSL_VERIFY=0 turns the verifier off between passes


def settings() -> Settings:
    dump = env_str("FLYDSL_DUMP_DIR")
    return Settings(
        target=env_str("FLYDSL_TARGET"),
        dump_dir=Path(dump).expanduser() if dump else None,
        cache_dir=default_cache_dir(),
        cache_disabled=env_flag("FLYDSL_DISABLE_CACHE"),
        verify_each_pass=env_flag("FLYDSL_VERIFY", True),
    )
