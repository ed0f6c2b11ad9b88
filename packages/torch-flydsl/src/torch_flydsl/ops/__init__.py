"""The op specs torch_flydsl ships (``spec.OpSpec``), one module each.

Adding an op: a module here whose ``SPEC`` (or several) describes it, listed in
``SPEC_MODULES``; ``enable()``, ``status()``, the torch.compile pass and ``calibrate`` pick
it up from ``SPECS``, and the lists of op groups (``torch_flydsl.OPS``: ``EAGER``) and gate
table ops (``gates.OPS``: ``GATES``) are derived from it.
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
    ("sdpa", "SPEC"),
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


#: the op groups with eager overrides (``torch_flydsl.OPS``), in status() order
EAGER: tuple[str, ...] = tuple(s.name for s in SPECS.values() if s.eager_overloads)
#: gate table op -> the dtypes its rules key on (the key-tensor dtypes of the overloads that
#: consult it), in spec order (``gates.OPS``)
GATES: dict[str, tuple] = {}
for _s in SPECS.values():
    for _o in _s.overloads:
        if _o.gate is not None:
            GATES[_o.gate] = tuple(dict.fromkeys((*GATES.get(_o.gate, ()), *_o.dtypes)))
del _s, _o


def spec(name: str) -> OpSpec:
    try:
        return SPECS[NAMES[name]]
    except KeyError:
        raise ValueError(f"unknown op {name!r}: torch_flydsl has {', '.join(SPECS)}") from None


def eager_specs() -> tuple[OpSpec, ...]:
    return tuple(s for s in SPECS.values() if s.eager_overloads)


def compile_specs() -> tuple[OpSpec, ...]:
    return tuple(s for s in SPECS.values() if s.compile_overloads)
