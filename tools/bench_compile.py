"""Compile times per example kernel and GPU target, on this machine (no GPU needed).

    uv run python tools/bench_compile.py [--targets gfx950 sm90 ...] [--examples matmul ...]

* cold: trace + passes + codegen + triton.compile, with Triton's own cache
  pointed at an empty directory;
* warm disk: a fresh kernel object (as in a new process) whose code object
  comes from FlyDSL's on-disk cache: trace, passes and a load, no compile;
* hit: the in-process cache of a compiled kernel.
Goals on the 2-core machine: cold at most ~3 s per specialization, warm disk
load at most 50 ms.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="flydsl-bench-triton-")
os.environ["FLYDSL_CACHE_DIR"] = tempfile.mkdtemp(prefix="flydsl-bench-cache-")

from flydsl_core import examples
from flydsl_core.runtime.kernel import Kernel

ARGS = {
    "vector_add": lambda: (
        (torch.randn(1 << 16), torch.randn(1 << 16), torch.empty(1 << 16)),
        {"BLOCK": 1024},
    ),
    "softmax": lambda: (
        (torch.randn(64, 4096, dtype=torch.bfloat16), torch.empty(64, 4096, dtype=torch.bfloat16)),
        {"BLOCK": 4096},
    ),
    "matmul": lambda: (
        (
            torch.randn(256, 256, dtype=torch.bfloat16),
            torch.randn(256, 256, dtype=torch.bfloat16),
            torch.empty(256, 256, dtype=torch.bfloat16),
        ),
        {"BM": 128, "BN": 128, "BK": 64},
    ),
    "cumsum": lambda: ((torch.randn(8, 4096), torch.empty(8, 4096)), {"BLOCK": 1024}),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["gfx950", "gfx942", "gfx1250", "sm90"])
    ap.add_argument("--examples", nargs="+", choices=examples.NAMES, default=examples.NAMES)
    args = ap.parse_args(argv)
    table = Table(title="FlyDSL compile times (CPU, 2 cores; seconds / milliseconds)")
    for col in ("kernel", "target", "cold", "warm disk", "in-process hit"):
        table.add_column(col, justify="left" if col in ("kernel", "target") else "right")
    for name in args.examples:
        mod = examples.load(name)
        a, kw = ARGS[name]()
        for tgt in args.targets:
            k = Kernel(mod.KERNEL.fn)  # a fresh kernel: empty in-process cache
            t0 = time.perf_counter()
            k.compile(*a, target=tgt, **kw)
            t1 = time.perf_counter()
            k.compile(*a, target=tgt, **kw)
            t2 = time.perf_counter()
            k2 = Kernel(mod.KERNEL.fn)
            t3 = time.perf_counter()
            k2.compile(*a, target=tgt, **kw)
            t4 = time.perf_counter()
            table.add_row(
                name,
                tgt,
                f"{t1 - t0:.2f} s",
                f"{(t4 - t3) * 1e3:.0f} ms",
                f"{(t2 - t1) * 1e6:.0f} us",
            )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
