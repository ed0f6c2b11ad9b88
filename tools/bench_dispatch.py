"""Dispatch overhead of torch_flydsl's eager overrides, measured on the CPU test backend.

    uv run python tools/bench_dispatch.py [--rounds 31] [--calls 2000] [--json PATH]

Per call, medians over interleaved rounds in one process (each round times a
batch of plain ATen calls with the overrides removed, then the same calls
with them registered):

* fallback: an input the predicate rejects (float64 topk / RMSNorm), against
  the same call with no override registered. The difference is what every
  ineligible call pays: the Python kernel, the predicate, the stats counter
  and the boxed call into the captured ATen kernel.
* floor: a bare Python kernel registered at the CPU key that only calls the
  captured ATen kernel: the cost of any torch.library Python override.
* eligible, up to launch: an eligible input with the FlyDSL kernel replaced
  by a no-op returning preallocated outputs (monkeypatched, in this
  benchmark only). That is the dispatch cost before a real kernel launch,
  against ATen's own full computation of the same (tiny) problem.

Goal (issues 6 and 15): a fallback adds at most 2 us over plain ATen. The wrapper is
generated per overload from its schema (``torch_flydsl.dispatch.make_kernel``); the floor
row is what any Python kernel costs, whatever it does.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import torch_flydsl
from torch_flydsl.ops import _kernels

#: the clock: this thread's CPU time by default (the work a call costs, unaffected by other
#: processes taking the CPU away on a shared machine); ``--clock wall`` for perf_counter
CLOCKS = {"thread": time.thread_time_ns, "wall": time.perf_counter_ns}
_clock = CLOCKS["thread"]


def _batch(fn, calls: int) -> float:
    t0 = _clock()
    for _ in range(calls):
        fn()
    return (_clock() - t0) / calls / 1e3  # us per call


_best = 0.0


def _case(fn, rounds, calls, ops):
    aten, ours = [], []
    for _ in range(3):  # warm up both paths
        torch_flydsl.disable()
        _batch(fn, calls // 10)
        torch_flydsl.enable(ops=ops, device="cpu")
        _batch(fn, calls // 10)
    for _ in range(rounds):
        torch_flydsl.disable()
        aten.append(_batch(fn, calls))
        torch_flydsl.enable(ops=ops, device="cpu")
        ours.append(_batch(fn, calls))
    torch_flydsl.disable()
    global _best
    _best = min(o - t for o, t in zip(ours, aten))  # the least disturbed round's difference
    return statistics.median(aten), statistics.median(ours)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="thread")
    a = p.parse_args(argv)
    global _clock, _best
    _clock = CLOCKS[a.clock]
    rows = []
    torch.set_num_threads(1)

    x64 = torch.randn(4, 64, dtype=torch.float64)
    x32 = torch.randn(4, 64)
    w64, w32 = torch.randn(64, dtype=torch.float64), torch.randn(64)
    tv, ti = torch.topk(x32, 8)
    ga, gb = torch.randn(8, 16), torch.randn(2, 16, 8)  # float32: FlyDSL takes bf16 / fp16
    goffs = torch.tensor([3, 8], dtype=torch.int32)
    ry, rr = torch.ops.aten._fused_rms_norm(x32, [64], w32, 1e-6)

    # the no-op "kernels": dispatch cost up to the launch, no computation
    noop = {
        "topk": lambda *args, **kw: (tv, ti),
        "rms_norm": lambda *args, **kw: (ry, rr),
    }
    cases = [
        ("topk fallback (float64)", "topk", lambda: torch.topk(x64, 8), False),
        ("topk.values fallback (float64)", "topk", None, False),
        (
            "rms_norm fallback (float64, F.rms_norm)",
            "rms_norm",
            lambda: F.rms_norm(x64, (64,), w64, 1e-6),
            False,
        ),
        (
            "_fused_rms_norm fallback (float64)",
            "rms_norm",
            lambda: torch.ops.aten._fused_rms_norm(x64, [64], w64, 1e-6),
            False,
        ),
        (
            "_grouped_mm fallback (float32, torch._grouped_mm)",
            "grouped_mm",
            lambda: torch._grouped_mm(ga, gb, goffs),
            False,
        ),
        ("topk eligible, up to launch (no-op kernel)", "topk", lambda: torch.topk(x32, 8), True),
        (
            "rms_norm eligible, up to launch (no-op kernel)",
            "rms_norm",
            lambda: F.rms_norm(x32, (64,), w32, 1e-6),
            True,
        ),
    ]
    vo, io = torch.empty(4, 8, dtype=torch.float64), torch.empty(4, 8, dtype=torch.int64)
    cases[1] = (cases[1][0], "topk", lambda: torch.topk(x64, 8, out=(vo, io)), False)

    table = Table(
        title=f"torch_flydsl dispatch overhead, CPU, median of {a.rounds} rounds x {a.calls} calls"
    )
    for col in (
        "case",
        "plain ATen (us)",
        "with torch_flydsl (us)",
        "added (us)",
        "added, best round",
    ):
        table.add_column(col, justify="right" if col != "case" else "left")
    saved = dict(_kernels.K)
    try:
        for name, op, fn, eligible in cases:
            if eligible:
                _kernels.K[op] = noop[op]
            else:
                _kernels.K.clear()
                _kernels.K.update(saved)
            torch_flydsl.reset_stats()
            ta, to = _case(fn, a.rounds, a.calls, [op])
            st = torch_flydsl.stats()
            hit = sum(v["hits"] for v in st.values())
            assert (hit > 0) == eligible, (name, st)
            table.add_row(name, f"{ta:.2f}", f"{to:.2f}", f"{to - ta:+.2f}", f"{_best:+.2f}")
            rows.append({"case": name, "aten_us": ta, "ours_us": to, "added_us": to - ta,
                         "added_best_round_us": _best})  # fmt: skip
    finally:
        _kernels.K.clear()
        _kernels.K.update(saved)
    # the floor: a Python kernel at the CPU key that only calls the captured ATen kernel
    torch_flydsl.disable()
    orig = torch.library.get_kernel("aten::topk", "CPU")
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    fl = []
    for _ in range(a.rounds):
        base = _batch(cases[0][2], a.calls)
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.impl("topk", lambda *args: orig.call_boxed(ks, *args), "CPU")
        fl.append((base, _batch(cases[0][2], a.calls)))
        lib._destroy()
    ta, to = statistics.median(f[0] for f in fl), statistics.median(f[1] for f in fl)
    _best = min(f[1] - f[0] for f in fl)
    floor = "floor: Python kernel that only calls ATen (topk float64)"
    table.add_row(floor, f"{ta:.2f}", f"{to:.2f}", f"{to - ta:+.2f}", f"{_best:+.2f}")
    rows.append({"case": floor, "aten_us": ta, "ours_us": to, "added_us": to - ta,
                 "added_best_round_us": _best})  # fmt: skip
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rounds": a.rounds, "calls": a.calls,
                       "rows": rows}, f, indent=1)  # fmt: skip
    Console().print(table)
    Console().print(
        "'up to launch' rows: the FlyDSL kernel is a no-op here, so 'added' compares our dispatch "
        "with ATen doing the whole (tiny) computation; torch version " + torch.__version__
    )


if __name__ == "__main__":
    main()
