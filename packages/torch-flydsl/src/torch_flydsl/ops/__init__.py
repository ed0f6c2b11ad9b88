"""The op specs torch_flydsl ships (``spec.OpSpec``), one module each.

Adding an op: a module here whose ``SPEC`` (or several) describes it, listed in
``SPEC_MODULES``; ``enable()``, ``status()``, the torch.compile pass and ``calibrate`` pick
it up from ``SPECS``.
"""

from __future__ import annotations

import importlib

from ..spec import OpSpec

#: (module, attribute) of every shipped spec, in the order status() lists them
SPEC_MODULES = (
    ("rms_norm", "SPEC"),
    ("topk", "SPEC"),
    ("grouped_mm", "SPEC"),
    ("scaled_mm", "SCALED_MM"),
    ("gemm", "SPEC"),
    ("scaled_mm", "SCALED_GROUPED_MM"),
)


def _load() -> dict[str, OpSpec]:
    out = {}
    for mod, attr in SPEC_MODULES:
        spec = getattr(importlib.import_module(f"{__name__}.{mod}"), attr)
        out[spec.name] = spec
    return out


SPECS: dict[str, OpSpec] = _load()
#: what enable(ops=...) and options={"ops": ...} accept -> spec name
NAMES: dict[str, str] = {
    **{a: s.name for s in SPECS.values() for a in s.aliases},
    **{s.name: s.name for s in SPECS.values()},
}


def spec(name: str) -> OpSpec:
    try:
        return SPECS[NAMES[name]]
    except KeyError:
        raise ValueError(f"unknown op {name!r}: torch_flydsl has {', '.join(SPECS)}") from None


def eager_specs() -> tuple[OpSpec, ...]:
    return tuple(s for s in SPECS.values() if s.eager_overloads)


def compile_specs() -> tuple[OpSpec, ...]:
    return tuple(s for s in SPECS.values() if s.compile_overloads)
