"""Lazy imports of the flydsl_kernels functions the specs run (importing torch_flydsl compiles
nothing). ``K`` maps a short name to the function once it has been imported; tests and
``tools/bench_dispatch.py`` replace entries to observe or stub a kernel."""

from __future__ import annotations

import importlib

#: short name -> (module, attribute)
WHERE = {
    "topk": ("flydsl_kernels.topk", "topk"),
    "rms_norm": ("flydsl_kernels.rmsnorm", "rms_norm"),
    "rms_norm_backward": ("flydsl_kernels.rmsnorm", "rms_norm_backward"),
    "gemm": ("flydsl_kernels.gemm", "gemm"),
    "swiglu": ("flydsl_kernels.gemm", "swiglu"),
    "grouped_mm": ("flydsl_kernels.gemm", "grouped_mm"),
    "mx_gemm": ("flydsl_kernels.mx", "mx_gemm"),
    "mx_grouped_mm": ("flydsl_kernels.mx", "mx_grouped_mm"),
}

K: dict[str, object] = {}


def kernel(name: str):
    fn = K.get(name)
    if fn is None:
        mod, attr = WHERE[name]
        fn = K[name] = getattr(importlib.import_module(mod), attr)
    return fn
