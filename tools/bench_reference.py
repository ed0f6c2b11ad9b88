"""Benchmark of the CPU reference backend and of tracing, per example kernel.

    uv run python tools/bench_reference.py [--repeats 5]

For each example it reports, as medians over repeats:
- trace: Python -> FlyIR for one specialization;
- passes: the default pipeline on that IR;
- run: one warm launch on the reference backend (compile excluded).
It also runs the budget case from the issue: a row-wise fp32 kernel
(softmax) over 4096 x 4096. All figures are CPU figures on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from flydsl_core import backends, examples
from flydsl_core.passes import run_pipeline


def _median(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class _Capture(backends.Backend, backends.Executable):
    """A stand-in backend that records the specialization a run asks for."""

    def __init__(self):
        self.spec = None

    def compile(self, fn, spec, options):
        self.spec = spec
        return self

    def launch(self, grid, args):
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-budget", action="store_true", help="skip the 4096x4096 case")
    args = ap.parse_args(argv)

    cases = [(n, examples.load(n), None) for n in examples.NAMES]
    if not args.skip_budget:
        cases.append(("softmax 4096x4096", examples.load("softmax"), (4096, 4096)))
    table = Table(title="FlyDSL reference backend and tracing (CPU figures, medians)")
    for col in ("kernel", "shape", "ops", "trace", "passes", "warm run", "elements/s"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    gen = torch.Generator().manual_seed(0)
    for name, mod, shape in cases:
        inputs = mod.make_inputs(shape or mod.DEFAULT_SHAPE, generator=gen)
        cap = _Capture()
        with backends.temporary("__bench__", cap):
            mod.run(*inputs, target="__bench__")
        k = mod.KERNEL
        t_trace = _median(lambda k=k, cap=cap: k.trace(cap.spec), args.repeats)
        t_pass = (
            _median(lambda k=k, cap=cap: run_pipeline(k.trace(cap.spec)), args.repeats) - t_trace
        )
        n_ops = sum(1 for _ in run_pipeline(k.trace(cap.spec)).walk())
        mod.run(*inputs)  # compile once
        reps = 1 if shape else args.repeats
        t_run = _median(lambda mod=mod, inputs=inputs: mod.run(*inputs), reps)
        n = sum(t.numel() for t in inputs)
        table.add_row(
            name,
            "x".join(map(str, shape or mod.DEFAULT_SHAPE)),
            str(n_ops),
            f"{t_trace * 1e3:.2f} ms",
            f"{max(t_pass, 0) * 1e3:.2f} ms",
            f"{t_run * 1e3:.1f} ms",
            f"{n / t_run / 1e6:.1f} M",
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
