"""GEMMs under torch.compile: ``backend="inductor"`` (ATen / Inductor's Triton) against
``backend="flydsl"``.

    uv run python tools/bench_compile_gemm.py [--m 16,2048] [--reps 50] [--gates local|open]
                                              [--json PATH]

Programs (shapes from ../shared/reference/gfx950.md), each compiled both ways:

* the GEMMs of a Llama-3.1-8B decoder layer, one program per GEMM: q / k / v / o
  projections (``F.linear``), the MLP's gate + up as SwiGLU (``silu(x Wg^T) * (x Wu^T)``,
  one kernel with ``backend="flydsl"``) and the down projection with its residual add;
* the Qwen3-30B-A3B experts: 128 experts, top-8 routing of the M tokens (uniform), gate +
  up (N = 1536) and down (K = 768) as ``torch._grouped_mm``;
* an mxfp4 linear (``F.scaled_mm``, e2m1 data with e8m0 1x32 scales, 4096 x 4096).

On a GPU each pair is timed interleaved in one process (device-event medians of ``--reps``
runs, ``bench_ops.time_gpu``); the table gives both times, the ratio (inductor / flydsl,
above 1 = FlyDSL faster) and the geomean. ``--gates open`` lets FlyDSL take every GEMM;
the default uses the gate table in force (a GEMM the gate leaves to ATen times the same).

On the CPU nothing is timed (FlyDSL's CPU backend is a reference interpreter, not a
competitor): the pass runs on each program's real shapes for gfx950 on FakeTensors, and
the table gives the count of GEMM nodes it rewrote, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from rich.console import Console
from rich.table import Table

from bench_ops import geomean, time_gpu

BF16 = torch.bfloat16
HIDDEN, FFN, KV = 4096, 14336, 1024  # Llama-3.1-8B
E, TOPK, EH, EFFN = 128, 8, 2048, 768  # Qwen3-30B-A3B


def _randn(*shape, device, scale=1.0):
    """Random bf16 data, or (``device="meta"``: the CPU mode, shapes only) no data at all."""
    if device == "meta":
        return torch.empty(*shape, dtype=BF16, device="meta")
    return (torch.randn(*shape, device=device) * scale).to(BF16)


def _w(n, k, device):
    return _randn(n, k, device=device, scale=k**-0.5)


def _mx(rows, k, device):
    e2m1 = torch.float4_e2m1fn_x2
    if device == "meta":
        return (
            torch.empty(rows, k // 2, dtype=e2m1, device="meta"),
            torch.empty(rows, k // 32, dtype=torch.float8_e8m0fnu, device="meta"),
        )
    from flydsl_kernels.mx import to_mx

    return to_mx(torch.randn(rows, k, device=device), e2m1)


def programs(m: int, device: str):
    """``[(name, fn, args, gemm nodes)]`` at ``m`` tokens (``device="meta"``: shapes only)."""
    x = _randn(m, HIDDEN, device=device)
    out = []
    for name, n in (("q_proj", HIDDEN), ("k_proj", KV), ("v_proj", KV), ("o_proj", HIDDEN)):
        out.append((f"llama8b.{name}", F.linear, (x, _w(n, HIDDEN, device)), 1))

    def swiglu(x, wg, wu):
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)

    out.append(
        (
            "llama8b.gate_up (swiglu)",
            swiglu,
            (x, _w(FFN, HIDDEN, device), _w(FFN, HIDDEN, device)),
            2,
        )
    )

    def down(h, w, r):
        return F.linear(h, w) + r

    h = _randn(m, FFN, device=device)
    out.append(("llama8b.down + residual", down, (h, _w(HIDDEN, FFN, device), x), 1))
    rows = m * TOPK
    counts = torch.full((E,), rows // E, dtype=torch.int64)
    counts[: rows % E] += 1
    offs = counts.cumsum(0).to(torch.int32).to(device)
    xe = _randn(rows, EH, device=device)
    up = _randn(E, 2 * EFFN, EH, device=device, scale=EH**-0.5).transpose(1, 2)
    dn = _randn(E, EH, EFFN, device=device, scale=EFFN**-0.5).transpose(1, 2)
    he = _randn(rows, EFFN, device=device)
    out.append(("qwen3-30b-a3b experts gate+up", torch._grouped_mm, (xe, up, offs), 1))
    out.append(("qwen3-30b-a3b experts down", torch._grouped_mm, (he, dn, offs), 1))
    blk, none = F.ScalingType.BlockWise1x32, F.SwizzleType.NO_SWIZZLE
    aq, sa = _mx(m, HIDDEN, device)
    wq, sw = _mx(HIDDEN, HIDDEN, device)

    def mx_linear(aq, wq, sa, sw):
        return F.scaled_mm(aq, wq.t(), sa, blk, sw, blk, none, none, output_dtype=BF16)

    out.append(("mxfp4 linear 4096x4096", mx_linear, (aq, wq, sa, sw), 1))
    return out


def count_rewrites(m: int, arch: str = "gfx950") -> list[dict]:
    """The CPU mode: the pass on each program's shapes for ``arch`` (FakeTensors, no kernel run)."""
    from torch._inductor.pattern_matcher import fwd_only
    from torch._subclasses.fake_tensor import FakeTensorMode

    import torch_flydsl
    from torch_flydsl.inductor import Settings
    from torch_flydsl.inductor.graph_pass import rewrite

    rows = []
    for name, fn, args, gemms in programs(m, "meta"):
        mode = FakeTensorMode()
        with mode:
            fakes = [mode.from_tensor(a).to("cuda") for a in args]
            gm = fwd_only(fn, fakes)
        torch_flydsl.reset_stats()
        n = rewrite(gm.graph, Settings.from_options({"kernels": "extern", "arch": arch}))
        reasons = {}
        for op, st in torch_flydsl.stats().items():
            if op.startswith("compile:"):
                for r, c in st["fallbacks"].items():
                    reasons[r] = reasons.get(r, 0) + c
        rows.append({"program": name, "m": m, "gemm_nodes": gemms, "rewritten": n, "kept": reasons})
    return rows


def time_pairs(ms, reps, gates) -> list[dict]:
    rows = []
    for m in ms:
        for name, fn, args, _ in programs(m, "cuda"):
            torch._dynamo.reset()
            base = torch.compile(fn, backend="inductor")
            ours = torch.compile(fn, backend="flydsl", options={"gates": gates})
            ta, tf = time_gpu([partial(base, *args), partial(ours, *args)], reps)
            rows.append({"program": name, "m": m, "inductor_ms": ta * 1e3, "flydsl_ms": tf * 1e3,
                         "ratio": ta / tf})  # fmt: skip
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", default="16,2048,8192", help="token counts (comma separated)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--gates", default="local", help="local | shipped | open | a table path")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    ms = [int(v) for v in a.m.split(",") if v.strip()]
    console = Console()
    if not torch.cuda.is_available():
        rows = [r for m in ms for r in count_rewrites(m)]
        t = Table(title="GEMM nodes rewritten by the FlyDSL pass (gfx950 shapes on FakeTensors)")
        for c in ("program", "M", "GEMM nodes", "rewritten", "kept on ATen (why)"):
            t.add_column(c, justify="left" if c in ("program", "kept on ATen (why)") else "right")
        for r in rows:
            t.add_row(r["program"], str(r["m"]), str(r["gemm_nodes"]), str(r["rewritten"]),
                      ", ".join(f"{k}: {v}" for k, v in r["kept"].items()) or "-")  # fmt: skip
        console.print(t)
        console.print(
            "No GPU here: nothing is timed. The counts are the pass's decisions for gfx950 "
            "(options arch='gfx950') with the gate table in force; speed needs a GPU."
        )
        out = {"device": "cpu", "timed": False, "rows": rows}
    else:
        rows = time_pairs(ms, a.reps, a.gates)
        t = Table(
            title=f"torch.compile GEMMs on {torch.cuda.get_device_name()}, median of {a.reps}"
        )
        for c in ("program", "M", "inductor (ms)", "flydsl (ms)", "inductor / flydsl"):
            t.add_column(c, justify="left" if c == "program" else "right")
        for r in rows:
            t.add_row(r["program"], str(r["m"]), f"{r['inductor_ms']:.4f}", f"{r['flydsl_ms']:.4f}",
                      f"{r['ratio']:.2f}x")  # fmt: skip
        gm = geomean([r["ratio"] for r in rows])
        console.print(t)
        console.print(f"geomean inductor / flydsl: {gm:.3f}x" if gm else "no rows")
        out = {"device": torch.cuda.get_device_name(), "timed": True, "gates": a.gates,
               "rows": rows, "geomean": gm}  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
