"""The torch.compile settings: ``torch.compile(..., backend="flydsl", options={...})`` or
``torch_flydsl.inductor.install(options={...})``.

=================  =========================================================================
option             meaning
=================  =========================================================================
``ops``            op groups to rewrite (spec names or aliases; default every compile spec:
                   ``gemm``, ``grouped_mm``, ``scaled_mm``, ``scaled_grouped_mm``)
``gates``          ``"local"`` (default: shipped rules, the calibrated table where there is
                   one), ``"shipped"``, ``"open"`` (everywhere: tests, benchmarks) or a path
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
``arch``           the GPU arch to compile GPU nodes for when the device cannot be asked
                   (lowering on a machine without that GPU: cross-compiling, tests); default:
                   the device's own (``flydsl_core.targets.device_arch``)
``inductor``       a dict of Inductor config patches applied with ours (backend only)
=================  =========================================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KNOWN = ("ops", "gates", "autotune", "epilogue", "swiglu", "kernels", "device", "arch", "inductor")
KERNELS = ("triton", "extern")


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
        from ..ops import NAMES, compile_specs

        o = dict(options or {})
        bad = sorted(set(o) - set(KNOWN))
        if bad:
            raise ValueError(
                f"unknown torch_flydsl option(s) {bad}; torch_flydsl takes: {', '.join(KNOWN)}"
            )
        every = tuple(s.name for s in compile_specs())
        ops = o.get("ops")
        if ops is None:
            ops = every
        else:
            if isinstance(ops, str):
                ops = [ops]
            names = []
            for name in ops:
                g = NAMES.get(str(name))
                if g not in every:
                    raise ValueError(
                        f"op {name!r} is not rewritten under torch.compile; options['ops'] takes "
                        f"{', '.join(every)}"
                    )
                if g not in names:
                    names.append(g)
            ops = tuple(names)
        kernels = o.get("kernels", "triton")
        if kernels not in KERNELS:
            raise ValueError(f"options['kernels'] is {kernels!r}; expected one of {KERNELS}")
        from .. import _runtime

        dev = _runtime.normalize_device(o.get("device"))  # None: $FLYDSL_TORCH_DEVICE or cuda
        auto = o.get("autotune")
        if auto is None:
            auto = mode == "max-autotune"
        inductor = dict(o.get("inductor") or {})
        return cls(
            ops=ops,
            gates=str(o.get("gates", "local")),
            autotune=bool(auto),
            epilogue=bool(o.get("epilogue", True)),
            swiglu=bool(o.get("swiglu", True)),
            kernels=kernels,
            cpu=dev == "cpu",
            arch=str(o["arch"]) if o.get("arch") else None,
            inductor=inductor,
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
