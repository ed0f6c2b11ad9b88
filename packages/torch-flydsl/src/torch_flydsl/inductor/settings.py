"""The torch.compile settings: ``torch.compile(..., backend="flydsl", options={...})`` or
``torch_flydsl.inductor.install(options={...})``.

=================  =========================================================================
option             meaning
=================  =========================================================================
``ops``            op groups to rewrite (spec names or aliases; default every compile spec:
                   ``gemm``, ``grouped_mm``, ``scaled_mm``, ``scaled_grouped_mm``)
``gates``          ``"local"`` (default: shipped rules, the calibrated table where there is
                   one), ``"shipped"``, ``"open"`` (everywhere: tests, benchmarks) or the path
                   of an existing table file
``autotune``       time FlyDSL against ATen per static GEMM shape at compile time (GPU only);
                   default: on under ``mode="max-autotune"``
``epilogue``       fuse bias / activation / residual / cast chains (default True)
``swiglu``         fuse ``silu(x @ Wg) * (x @ Wu)`` into one kernel (default True)
``kernels``        GPU nodes: ``"triton"`` (default: FlyDSL's generated Triton kernels in
                   Inductor's graph, ``wrap_triton``) or ``"extern"`` (the ``flydsl::`` op
                   as an extern call, FlyDSL's own launcher)
``device``         ``"cpu"`` also rewrites CPU nodes (the test backend; default from
                   ``$FLYDSL_TORCH_DEVICE``); GPU nodes are rewritten where the arch is in
                   ``$FLYDSL_TORCH_ARCHS``
``arch``           the GPU target (a name or alias registered with flydsl-core) to compile GPU
                   nodes for when the device cannot be asked (lowering on a machine without
                   that GPU: cross-compiling, tests); default: ``$FLYDSL_TARGET`` where it
                   names a GPU target, else the device's own (``torch_flydsl.eligibility``)
``inductor``       a dict of Inductor config patches applied with ours (backend only)
=================  =========================================================================

Options are typed: ``options`` is a dict; a flag is a ``bool`` (``"false"`` / ``"no"`` /
``"off"``, ``0`` or ``None`` where a bool is due are errors, not read as truth values);
``ops`` a name or a list of names; ``gates`` one of the three words or the path of an existing
table file; ``arch`` a GPU target registered with flydsl-core, by name or alias; ``inductor`` a
dict. A wrong type is a ``TypeError``, a wrong value or an unknown key a ``ValueError``; each
names the option and what it takes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KNOWN = ("ops", "gates", "autotune", "epilogue", "swiglu", "kernels", "device", "arch", "inductor")
KERNELS = ("triton", "extern")
GATE_SOURCES = ("local", "shipped", "open")
FLAGS = ("autotune", "epilogue", "swiglu")


def _what(v) -> str:
    return f"{v!r} ({type(v).__name__})"


def _flag(o: dict, name: str, default: bool) -> bool:
    v = o.get(name, default)
    if not isinstance(v, bool):
        raise TypeError(f"options[{name!r}] is {_what(v)}; it takes True or False")
    return v


def _ops(value) -> tuple[str, ...]:
    from ..ops import NAMES, compile_specs

    every = tuple(s.name for s in compile_specs())
    if value is None:
        return every
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"options['ops'] is {_what(value)}; it takes an op group name or a list of them: "
            f"{', '.join(every)}"
        )
    out = []
    for name in names:
        g = NAMES.get(name)
        if g not in every:
            raise ValueError(
                f"options['ops']: {name!r} is not rewritten under torch.compile; it takes "
                f"{', '.join(every)} (or their aliases)"
            )
        if g not in out:
            out.append(g)
    return tuple(out)


def _gates(value) -> str:
    import os
    from pathlib import Path

    if isinstance(value, str) and value in GATE_SOURCES:
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"options['gates'] is {_what(value)}; it takes {', '.join(map(repr, GATE_SOURCES))} "
            "or the path of a gate table file"
        )
    path = Path(value).expanduser()
    if not path.is_file():
        what = "a folder" if path.is_dir() else "no such file"
        raise ValueError(
            f"options['gates'] = {str(value)!r}: {what} at {path.resolve()}; it takes "
            f"{', '.join(map(repr, GATE_SOURCES))} or the path of a gate table file"
        )
    return str(path)


def _arch(value) -> str | None:
    if value is None:
        return None
    from flydsl_core.targets import all_targets, lookup_target

    gpus = ", ".join(t.name for t in all_targets() if t.is_gpu)
    if not isinstance(value, str):
        raise TypeError(f"options['arch'] is {_what(value)}; it takes a GPU target: {gpus}")
    t = lookup_target(value)
    if t is None or not t.is_gpu:
        what = "a CPU target" if t is not None else "not a known target"
        raise ValueError(
            f"options['arch'] = {value!r} is {what}; it takes a GPU target or an alias of one: "
            f"{gpus} (see `flydsl targets`)"
        )
    return t.name


@dataclass(frozen=True)
class Settings:
    ops: tuple[str, ...]
    gates: str = "local"
    autotune: bool = False
    epilogue: bool = True
    swiglu: bool = True
    kernels: str = "triton"
    cpu: bool = False
    arch: str | None = None
    inductor: dict = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_options(cls, options=None, mode=None) -> Settings:
        from collections.abc import Mapping

        from .. import _runtime

        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise TypeError(
                f"torch_flydsl's options are a dict, not {_what(options)}; keys: {', '.join(KNOWN)}"
            )
        o = dict(options)
        bad = sorted(map(str, set(o) - set(KNOWN)))
        if bad:
            raise ValueError(
                f"unknown torch_flydsl option(s) {bad}; torch_flydsl takes: {', '.join(KNOWN)}"
            )
        kernels = o.get("kernels", "triton")
        if kernels not in KERNELS:
            raise ValueError(f"options['kernels'] is {_what(kernels)}; it takes one of {KERNELS}")
        dev = o.get("device")
        if dev is None:
            dev = _runtime.normalize_device(None)  # $FLYDSL_TORCH_DEVICE, else cuda
        elif not isinstance(dev, str) and type(dev).__name__ != "device":
            raise TypeError(f"options['device'] is {_what(dev)}; it takes 'cpu' or 'cuda'")
        else:
            try:
                dev = _runtime.normalize_device(dev)
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"options['device']: {e}") from None
        auto = o.get("autotune")
        if auto is None:
            auto = mode == "max-autotune"
        elif not isinstance(auto, bool):
            raise TypeError(f"options['autotune'] is {_what(auto)}; it takes True or False")
        inductor = o.get("inductor")
        if inductor is None:
            inductor = {}
        elif not isinstance(inductor, Mapping):  # an empty list too: not "no patches"
            raise TypeError(
                f"options['inductor'] is {_what(inductor)}; it takes a dict of Inductor config "
                "patches"
            )
        return cls(
            ops=_ops(o.get("ops")),
            gates=_gates(o.get("gates", "local")),
            autotune=auto,
            epilogue=_flag(o, "epilogue", True),
            swiglu=_flag(o, "swiglu", True),
            kernels=kernels,
            cpu=dev == "cpu",
            arch=_arch(o.get("arch")),
            inductor=dict(inductor),
        )

    def as_dict(self) -> dict:
        return {
            "ops": list(self.ops),
            "gates": self.gates,
            "autotune": self.autotune,
            "epilogue": self.epilogue,
            "swiglu": self.swiglu,
            "kernels": self.kernels,
            "cpu": self.cpu,
            "arch": self.arch,
        }

    def key(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)
