"""Backends: each turns verified FlyIR into something that runs.

Exactly one backend serves each target name. Backends never import each
other; they are looked up here by name and imported lazily, so importing
flydsl_core loads neither torch's heavy parts nor Triton.
"""

from __future__ import annotations

import importlib

from ..exc import UnknownTargetError

# target name -> "module:Class" of its backend
_BACKENDS = {
    "cpu-reference": "flydsl_core.backends.reference:ReferenceBackend",
    "gfx950": "flydsl_core.backends.triton:Gfx950Backend",
    "gfx942": "flydsl_core.backends.triton:Gfx942Backend",
    "gfx1250": "flydsl_core.backends.triton:Gfx1250Backend",
    "sm90": "flydsl_core.backends.triton:Sm90Backend",
    "cpu-interpret": "flydsl_core.backends.triton:CpuInterpretBackend",
}
_instances: dict[str, object] = {}


def register_backend(target: str, path: str) -> None:
    _BACKENDS[target] = path


def target_name(target) -> str:
    """The name of a target given as a name, a Target object or None (resolved)."""
    if target is None:
        from ..targets import resolve_target

        target = resolve_target()
    name = getattr(target, "name", target)
    if name in ("reference", "cpu", "ref"):
        name = "cpu-reference"
    return name


def get_backend(name: str):
    if name in _instances:
        return _instances[name]
    path = _BACKENDS.get(name)
    if path is None:
        raise UnknownTargetError(
            f"no backend can run target {name!r} yet; backends: {', '.join(sorted(_BACKENDS))}"
        )
    mod, cls = path.split(":")
    inst = getattr(importlib.import_module(mod), cls)()
    _instances[name] = inst
    return inst
