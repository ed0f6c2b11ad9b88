"""GEMM benchmark: FlyDSL dense and grouped GEMM against ATen on the available device.

    uv run python tools/bench_gemm.py [--quick | --full] [--reps N] [--device auto|cpu|cuda]
                                      [--json PATH]

Shapes (../shared/reference/gfx950.md): BF16 NT dense GEMMs ``x @ W^T`` with M
from decode (1-64) through prefill (8192) and (N, K) from Llama-3.1-8B, Qwen3-32B
and gpt-oss-120b projections; grouped GEMMs (``torch._grouped_mm``, 2-D x 3-D,
ragged M) for Qwen3-30B-A3B (128 experts, top-8), gpt-oss-120b (128, top-4) and
DeepSeek-V3 (256, top-8) routing: uniform (every expert the same rows),
projection (few tokens, decode-like) and ragged (seeded multinomial routing);
MX block-scaled GEMMs (``mx_gemm``, mxfp8, mxfp4 and a8w4) at decode M=32 with
Llama-3.1-8B's 4096x4096 and 14336x4096 projections, against the baseline of
``flydsl_kernels.mx.baseline`` (``torch._scaled_mm`` where the device has MX
MMA, else torch dequantize + bf16 matmul; the row names which).
MX grouped GEMMs (``mx_grouped_mm``, the MoE forward on MX operands) for
Qwen3-30B-A3B (mxfp8) and gpt-oss-120b (MXFP4 experts: a8w4 and mxfp4 x
mxfp4), against ATen's bf16 ``torch._grouped_mm`` of the dequantized operands.
MX rows print no %peak (the dense BF16 peak is not the MX one).

Every output is checked against the fp32 reference before it is timed. On a GPU:
device-event medians (``bench_ops.time_gpu``), TFLOP/s, fraction of the target's
dense BF16 peak, speedup vs ATen and its geomean. On the CPU the FlyDSL kernels
run on the reference backend (Python, one program at a time): a tiny ``--quick``
subset, labelled CPU figures, no fraction of peak.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_ops import geomean, time_cpu, time_gpu
from flydsl_kernels import mx
from flydsl_kernels.gemm import gemm, grouped_mm, reference

#: (N, K) of the dense projections: name -> (N, K)
PROJ = {
    "llama8b.qkv": (6144, 4096),
    "llama8b.o": (4096, 4096),
    "llama8b.gate_up": (28672, 4096),
    "llama8b.down": (4096, 14336),
    "qwen3-32b.down": (5120, 25600),
    "gpt-oss.qkv": (5120, 2880),
}
DENSE_M = (1, 16, 64, 256, 1024, 4096, 8192)
#: MX MoE: model -> (experts, top-k, N, K, activation format, weight format) of the up projection
MX_MOE = {
    "qwen3-30b-a3b mxfp8": (128, 8, 1536, 2048, "e4m3", "e4m3"),
    "gpt-oss-120b a8w4": (128, 4, 5760, 2880, "e4m3", "e2m1"),
    "gpt-oss-120b mxfp4": (128, 4, 5760, 2880, "e2m1", "e2m1"),
}
_MX_DTYPE = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.float4_e2m1fn_x2}
#: model -> (experts, top-k, N, K) of the expert up projection
MOE = {
    "qwen3-30b-a3b": (128, 8, 1536, 2048),
    "gpt-oss-120b": (128, 4, 5760, 2880),
    "deepseek-v3": (256, 8, 4096, 7168),
}


def dense_cases(quick: bool):
    if quick:
        return [("tiny", 4, 128, 256), ("tiny", 33, 96, 200)]
    return [(name, m, n, k) for name, (n, k) in PROJ.items() for m in DENSE_M]


def grouped_cases(quick: bool):
    if quick:
        return [("tiny ragged", 4, 48, 64, 128, "ragged")]
    out = []
    for name, (e, top, n, k) in MOE.items():
        for tokens, kind in ((4096, "uniform"), (64, "projection"), (4096, "ragged")):
            out.append((f"{name} {kind}", e, tokens * top, n, k, kind))
    return out


#: MX GEMMs (M, N, K) at decode M from Llama-3.1-8B, each as mxfp8, mxfp4 and a8w4
MX_SHAPES = ((32, 4096, 4096), (32, 14336, 4096))
MX_FORMATS = (("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1"))


def mx_cases(quick: bool):
    shapes = ((4, 64, 256),) if quick else MX_SHAPES
    return [(m, n, k, fa, fb) for m, n, k in shapes for fa, fb in MX_FORMATS]


def mx_grouped_cases(quick: bool):
    if quick:
        return [("tiny mx ragged", 4, 40, 48, 160, "ragged", "e4m3", "e4m3")]
    out = []
    for name, (e, top, n, k, fa, fb) in MX_MOE.items():
        for tokens, kind in ((4096, "ragged"), (64, "projection")):
            out.append((f"{name} {kind}", e, tokens * top, n, k, kind, fa, fb))
    return out


def _offs(rows, experts, kind, g):
    if kind == "uniform":
        counts = torch.full((experts,), rows // experts)
        counts[: rows - int(counts.sum())] += 1
    else:
        counts = torch.bincount(torch.randint(0, experts, (rows,), generator=g), minlength=experts)
    return counts.cumsum(0).to(torch.int32)


def peak_tflops(device):
    if device == "cpu":
        return None
    from flydsl_core.targets import resolve_target

    peak = getattr(resolve_target(), "peak", None)
    return getattr(peak, "bf16_tflops", None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--full", action="store_true")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu = device == "cpu"
    quick = args.quick or (cpu and not args.full)
    reps = args.reps or (3 if cpu else 50)
    timer = time_cpu if cpu else time_gpu
    peak = peak_tflops(device)
    label = "CPU figures (reference backend)" if cpu else torch.cuda.get_device_name(0)
    print(f"# FlyDSL GEMM vs ATen on {label}; peak bf16 {peak or '-'} TFLOP/s")
    print(
        f"{'case':44} {'shape':>22} {'ours ms':>9} {'aten ms':>9} {'TFLOP/s':>8} {'%peak':>6} {'speedup':>7}"
    )
    g = torch.Generator().manual_seed(0)
    speedups, failed, results = [], 0, []

    def report(name, shape, flops, ours, theirs, out, ref, peak=peak):
        nonlocal failed
        err = (out.double() - ref.double()).abs().max().item() if out.numel() else 0.0
        scale = max(1.0, ref.double().abs().max().item()) if ref.numel() else 1.0
        ok = err <= 2e-2 * scale
        failed += not ok
        t_ours, t_aten = timer([ours, theirs], reps) if ok else (float("nan"),) * 2
        tf = flops / t_ours / 1e12
        sp = t_aten / t_ours
        speedups.append(sp)
        pct = f"{100 * tf / peak:5.1f}%" if peak else "-"
        results.append(
            {
                "case": name,
                "shape": shape,
                "flops": flops,
                "ours_ms": t_ours * 1e3,
                "aten_ms": t_aten * 1e3,
                "tflops": tf,
                "peak_pct": 100 * tf / peak if peak else None,
                "speedup": sp,
                "ok": ok,
                "max_err": err,
            }
        )
        print(
            f"{name:44} {shape:>22} {t_ours * 1e3:9.3f} {t_aten * 1e3:9.3f} {tf:8.2f} {pct:>6} "
            f"{sp:6.2f}x" + ("" if ok else "  MISMATCH")
        )

    for name, m, n, k in dense_cases(quick):
        a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
        w = torch.randn(n, k, generator=g).to(torch.bfloat16).to(device)
        b = w.t()
        ours, aten = partial(gemm, a, b), partial(torch.matmul, a, b)
        report(name, f"{m}x{n}x{k}", 2 * m * n * k, ours, aten, ours(), reference.gemm(a, b))
    for name, e, rows, n, k, kind in grouped_cases(quick):
        offs = _offs(rows, e, kind, g).to(device)
        a = torch.randn(rows, k, generator=g).to(torch.bfloat16).to(device)
        w = torch.randn(e, n, k, generator=g).to(torch.bfloat16).to(device).transpose(1, 2)
        ours, aten = partial(grouped_mm, a, w, offs), partial(torch._grouped_mm, a, w, offs)
        ref = reference.grouped_mm(a, w, offs)
        report(name, f"{rows}x{n}x{k} E{e}", 2 * rows * n * k, ours, aten, ours(), ref)
    for m, n, k, fa, fb in mx_cases(quick):
        a = torch.randn(m, k, generator=g).to(device)
        w = (torch.randn(n, k, generator=g) * 0.05).to(device)
        ops = (*mx.to_mx(a, _MX_DTYPE[fa]), *mx.to_mx(w, _MX_DTYPE[fb]))
        kind = mx.baseline.choose(device, fa, fb)
        ours = partial(mx.mx_gemm, *ops, fa, fb)
        theirs = mx.baseline.thunk(kind, *ops, fa, fb)
        ref = mx.reference.mx_gemm(*ops, fa, fb, out_dtype=torch.float32)
        name = f"mx {fa}x{fb} vs {mx.baseline.NAMES[kind]}"
        # no %peak: the bf16 peak is not the MX one
        report(name, f"{m}x{n}x{k}", 2 * m * n * k, ours, theirs, ours(), ref, peak=None)
    for name, e, rows, n, k, kind, fa, fb in mx_grouped_cases(quick):
        offs = _offs(rows, e, kind, g).to(device)
        a = torch.randn(rows, k, generator=g).to(device)
        w = (torch.randn(e, n, k, generator=g) * 0.05).to(device)
        ops = (*mx.to_mx(a, _MX_DTYPE[fa]), *mx.to_mx(w, _MX_DTYPE[fb]))
        ad = mx.from_mx(*ops[:2], fa, out_dtype=torch.bfloat16)
        wd = mx.from_mx(*ops[2:], fb, out_dtype=torch.bfloat16).transpose(1, 2)
        ours = partial(mx.mx_grouped_mm, *ops, fa, fb, offs)
        aten = partial(torch._grouped_mm, ad, wd, offs)  # bf16, on the dequantized operands
        ref = mx.reference.mx_grouped_mm(*ops, fa, fb, offs, out_dtype=torch.float32)
        label = f"{name} vs dequant + bf16 _grouped_mm"
        report(label, f"{rows}x{n}x{k} E{e}", 2 * rows * n * k, ours, aten, ours(), ref, peak=None)
    gm = geomean(speedups)
    print(f"# geomean speedup vs ATen: {gm:.2f}x" if gm else "# no timings")
    if args.json:
        import json
        import math

        doc = {"device": label, "cpu": cpu, "peak_bf16_tflops": peak, "reps": reps}
        doc.update(quick=quick, geomean_speedup=gm)
        with open(args.json, "w") as f:  # NaN (a mismatch's times) is no JSON: null instead
            clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                      for k, v in r.items()} for r in results]  # fmt: skip
            json.dump({**doc, "rows": clean}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
