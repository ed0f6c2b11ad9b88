"""Op benchmark: FlyDSL RMSNorm and TopK against ATen on the available device.

    uv run python tools/bench_ops.py [--op rmsnorm|topk|all] [--quick | --full] [--reps N]
                                     [--device auto|cpu|cuda] [--json PATH] [--max-n N]

Shapes: the published upstream cases (RMSNorm rows 2048-8192 with N 4096-114688;
small-k TopK such as k=8 over N=4096, and k 64-1024 over N 8k-256k, M = 256 rows,
at least one per CU) plus the hidden sizes of the models in
../shared/reference/gfx950.md. Every output is checked against ATen before it is
timed (RMSNorm within the family's tolerance, TopK values exactly and
``x.gather(indices) == values``).

Timing: on a GPU, CUDA events around each launch, ours and ATen interleaved rep
by rep, L2 flushed before each launch, median of ``--reps``; on the CPU,
``time.perf_counter`` medians. GB/s counts the bytes the op must move (RMSNorm:
read x and w, write y and the fp32 rstd; fused add: also read the residual and
write the new one; TopK: read x, write k values and int64 indices) over our
median time; the % of peak divides by the device's HBM bandwidth (MI355X 8 TB/s,
H200 4.8 TB/s; ``--peak-tbs`` for others). "kernel us" (GPU only) is the GPU time of
the kernels one call of ours launches (torch.profiler): an "ours us" far above it is host
time, not kernel time. On the CPU the FlyDSL kernels run on
the reference backend (Python, one program at a time), so the CPU figures are
labelled as such, the default there is the ``--quick`` subset of small shapes,
and no % of peak is given.

Exit status 1 when any case raised or did not match ATen.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

#: HBM bandwidth (TB/s) by device, from ../shared/reference/gfx950.md
PEAK_TBS = {"gfx950": 8.0, "gfx942": 5.3, "H200": 4.8}

#: hidden sizes of the models in ../shared/reference/gfx950.md
MODEL_HIDDEN = {
    "Qwen3-30B-A3B": 2048,
    "gpt-oss-120b": 2880,
    "Llama-3.1-8B": 4096,
    "Qwen3-32B": 5120,
    "DeepSeek-V3": 7168,
    "Llama-3.3-70B": 8192,
}
_DNAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
EPS = 1e-6


@dataclass
class Case:
    op: str  # "rmsnorm" | "fused_add_rmsnorm" | "topk"
    m: int
    n: int
    dtype: torch.dtype
    k: int = 0
    label: str = ""  # where the shape comes from

    @property
    def shape(self) -> str:
        s = f"{self.m}x{self.n}" + (f" k={self.k}" if self.op == "topk" else "")
        return f"{s} ({self.label})" if self.label else s

    def bytes_moved(self) -> int:
        e = torch.empty((), dtype=self.dtype).element_size()
        if self.op == "topk":
            return self.m * self.n * e + self.m * self.k * (e + 8)
        if self.op == "rmsnorm":
            return 2 * self.m * self.n * e + self.n * e + self.m * 4
        return 4 * self.m * self.n * e + self.n * e  # x, residual in; y, new residual out


def gpu_cases(op: str) -> list[Case]:
    bf = torch.bfloat16
    out: list[Case] = []
    if op in ("rmsnorm", "all"):
        # published regions: 4096<=N<8192 at M>=8192, 8192<=N<16384 at M>=4096, to N=114688 at M>=2048
        for m, n in ((8192, 4096), (4096, 8192), (4096, 16384), (2048, 32768), (2048, 65536)):
            out.append(Case("rmsnorm", m, n, bf, label="published"))
        out.append(Case("rmsnorm", 2048, 114688, bf, label="published"))
        out.append(Case("rmsnorm", 8192, 4097, torch.float16, label="N one above aligned"))
        for model, h in MODEL_HIDDEN.items():
            out.append(Case("rmsnorm", 4096, h, bf, label=model))
        for model, h in MODEL_HIDDEN.items():
            out.append(Case("fused_add_rmsnorm", 4096, h, bf, label=model))
    if op in ("topk", "all"):
        f32 = torch.float32
        for n, k in ((4096, 8), (1024, 2), (2048, 4), (8192, 16)):
            out.append(Case("topk", 256, n, f32, k, "small k"))
        for n, k in ((8192, 64), (32768, 256), (32768, 300), (65536, 512), (131072, 832)):
            out.append(Case("topk", 256, n, f32, k, "radix region"))
        out.append(Case("topk", 256, 262144, f32, 1024, "radix region"))
        out.append(Case("topk", 256, 151936, f32, 64, "Qwen3 vocab"))
    return out


def quick_cases(op: str) -> list[Case]:
    """Few rows (the reference backend runs programs one by one), the same kernels' paths."""
    bf = torch.bfloat16
    out: list[Case] = []
    if op in ("rmsnorm", "all"):
        out += [
            Case("rmsnorm", 16, 4096, bf, label="Llama-3.1-8B"),
            Case("rmsnorm", 8, 2880, bf, label="gpt-oss-120b"),
            Case("rmsnorm", 4, 65536, bf, label="long row"),
            Case("fused_add_rmsnorm", 8, 7168, bf, label="DeepSeek-V3"),
        ]
    if op in ("topk", "all"):
        f32 = torch.float32
        out += [
            Case("topk", 16, 4096, f32, 8, "small k"),
            Case("topk", 8, 8192, f32, 64, "moderate k"),
            Case("topk", 4, 32768, f32, 256, "k 64-1024"),
            Case("topk", 2, 131072, f32, 832, "k 64-1024"),
        ]
    return out


def _inputs(c: Case, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(c.m, c.n, generator=g).to(c.dtype).to(device)
    w = torch.randn(c.n, generator=g).to(c.dtype).to(device)
    r = torch.randn(c.m, c.n, generator=g).to(c.dtype).to(device)
    return x, w, r


def _aten_rms_norm(x, n, w):
    # what torch.nn.functional.rms_norm dispatches to on GPUs; returns (y, rstd) as ours does
    if hasattr(torch.ops.aten, "_fused_rms_norm"):
        return torch.ops.aten._fused_rms_norm(x, [n], w, EPS)
    return torch.nn.functional.rms_norm(x, (n,), w, EPS), None


def thunks(c: Case, device: str) -> tuple[Callable, Callable, Callable[[], None]]:
    """(ours, aten, verify): verify raises AssertionError when ours differs from ATen."""
    x, w, r = _inputs(c, device)
    if c.op == "topk":
        from flydsl_kernels.topk import topk

        def ours():
            return topk(x, c.k)

        def aten():
            return torch.topk(x, c.k)

        def verify():
            (v, i), (rv, _) = ours(), aten()
            # explicit raises, not asserts: the check must survive python -O
            if not torch.equal(v, rv):
                raise AssertionError(f"values differ from torch.topk at {(v != rv).sum()} places")
            if not torch.equal(x.gather(-1, i), v):
                raise AssertionError("x.gather(-1, indices) != values")

        return ours, aten, verify

    from flydsl_kernels.rmsnorm import TOLERANCE, fused_add_rms_norm, rms_norm

    rtol, atol = TOLERANCE[c.dtype]
    if c.op == "rmsnorm":

        def ours():
            return rms_norm(x, (c.n,), w, EPS)

        def aten():
            return _aten_rms_norm(x, c.n, w)

    else:

        def ours():
            return fused_add_rms_norm(x, r, w, EPS)

        def aten():  # eager PyTorch: the add, then the norm
            h = x + r
            return _aten_rms_norm(h, c.n, w)[0], h

    def verify():
        got, ref = ours(), aten()
        for a, b, what in zip(got, ref, ("y", "rstd" if c.op == "rmsnorm" else "residual")):
            if b is None:
                continue
            torch.testing.assert_close(
                a.float().view(b.shape),
                b.float(),
                rtol=rtol,
                atol=atol,
                msg=lambda m, w=what: f"{w}: {m}",
            )

    return ours, aten, verify


def kernel_of(c: Case) -> str:
    """The FlyDSL kernel the op's selection rule picks for the case."""
    if c.op == "topk":
        from flydsl_kernels.topk import select

        p = select("topk", c.m, c.n, c.k, c.dtype)
        return p.kernel + (f"+sort_{p.sorter}" if p.sorter else "")
    from flydsl_kernels.rmsnorm import configs

    return configs.select("fwd", c.n, c.dtype, c.m).kernel


def time_cpu(fns, reps: int) -> list[float]:
    """Median seconds of each fn over its own block of reps, after one warm call.

    Not interleaved as on the GPU: between two slow reference-backend calls ATen's
    CPU thread pool goes idle and pays a wake-up per call (tens of ms here).
    """
    out = []
    for f in fns:
        f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        out.append(statistics.median(ts))
    return out


def time_gpu(fns, reps: int) -> list[float]:
    from flydsl_kernels.report import median_times_ms

    return [ms / 1e3 for ms in median_times_ms(fns, reps=reps, warmup=10)]


def device_peak(device: str, override: float | None) -> tuple[str, float | None]:
    """(device name, HBM TB/s or None)."""
    if device == "cpu":
        import platform

        return f"CPU ({platform.processor() or platform.machine()})", None
    props = torch.cuda.get_device_properties(0)
    name = props.name
    arch = getattr(props, "gcnArchName", "") or ""
    if override is not None:
        return name, override
    for key, tbs in PEAK_TBS.items():
        if key in arch or key in name:
            return name, tbs
    if "MI355" in name or "MI350" in name:
        return name, PEAK_TBS["gfx950"]
    return name, None


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def run(
    cases: list[Case], device: str, reps: int, peak: float | None, progress=None, verbose=False
) -> list[dict]:
    rows = []
    timer = time_cpu if device == "cpu" else time_gpu
    for c in cases:
        row = {
            "op": c.op,
            "shape": c.shape,
            "m": c.m,
            "n": c.n,
            "k": c.k or None,
            "dtype": _DNAME[c.dtype],
            "kernel": None,
            "bytes": c.bytes_moved(),
            "ours_us": None,
            "kernel_us": None,
            "aten_us": None,
            "gbs": None,
            "peak_frac": None,
            "speedup": None,
            "error": None,
        }
        if progress:
            progress(f"{c.op} {c.shape}")
        try:
            row["kernel"] = kernel_of(c)
            ours, aten, verify = thunks(c, device)
            verify()  # also the first (compiling) call of ours
            t_ours, t_aten = timer([ours, aten], reps)
            if device != "cpu":  # our kernels' own time: a wall time far above it is the host
                from flydsl_kernels.report import kernel_time_ms

                ms = kernel_time_ms(ours, min(reps, 20))
                row["kernel_us"] = None if ms is None else ms * 1e3
            row.update(
                ours_us=t_ours * 1e6,
                aten_us=t_aten * 1e6,
                gbs=row["bytes"] / t_ours / 1e9,
                speedup=t_aten / t_ours,
            )
            if peak:
                row["peak_frac"] = row["gbs"] / (peak * 1e3)
        except Exception as e:
            row["error"] = (
                f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            )
            if verbose:
                traceback.print_exc()
        rows.append(row)
        if device != "cpu":
            torch.cuda.empty_cache()
    return rows


def table(rows: list[dict], title: str, cpu: bool) -> Table:
    t = Table(title=title)
    for col in (
        "op",
        "shape",
        "dtype",
        "kernel",
        "ours us",
        "kernel us",
        "ATen us",
        "GB/s ours",
        "% of peak",
        "speedup",
    ):
        t.add_column(col, justify="left" if col in ("op", "shape", "dtype", "kernel") else "right")
    for r in rows:
        if r["error"]:
            t.add_row(
                r["op"], r["shape"], r["dtype"], r["kernel"] or "?", f"[red]{escape(r['error'])}[/]"
            )
            continue
        t.add_row(
            r["op"],
            r["shape"],
            r["dtype"],
            r["kernel"],
            f"{r['ours_us']:.1f}",
            "-" if r.get("kernel_us") is None else f"{r['kernel_us']:.1f}",
            f"{r['aten_us']:.1f}",
            f"{r['gbs']:.3g}" if cpu else f"{r['gbs']:.0f}",
            "n/a" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%",
            f"{r['speedup']:.3g}x",
        )
    ops = sorted({r["op"] for r in rows})
    t.add_section()
    for op in [*ops, None] if len(ops) > 1 else [None]:
        g = geomean(r["speedup"] for r in rows if op is None or r["op"] == op)
        label = f"geomean {op}" if op else "geomean (all)"
        t.add_row(label, "", "", "", "", "", "", "", "", "-" if g is None else f"{g:.3g}x")
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=["rmsnorm", "topk", "all"], default="all")
    q = ap.add_mutually_exclusive_group()
    q.add_argument("--quick", action="store_true", default=None, help="small shapes (CPU default)")
    q.add_argument(
        "--full", dest="quick", action="store_false", help="the full shape list (GPU default)"
    )
    ap.add_argument("--reps", type=int, default=None, help="timed reps (default: 100 GPU, 3 CPU)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: on a shared CPU a wider intra-op pool stalls "
        "for descheduled workers, tens of ms per ATen call)",
    )
    ap.add_argument("--peak-tbs", type=float, default=None, help="HBM bandwidth for %% of peak")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--max-n", type=int, default=None, help="only cases with rows of at most N")
    ap.add_argument("-v", action="store_true", help="print tracebacks of failing cases")
    args = ap.parse_args(argv)

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU")
    cpu = device == "cpu"
    quick = cpu if args.quick is None else args.quick
    reps = args.reps or (5 if cpu else 100)
    if cpu:
        torch.set_num_threads(args.threads)
    cases = quick_cases(args.op) if quick else gpu_cases(args.op)
    if args.max_n is not None:
        cases = [c for c in cases if c.n <= args.max_n]
    name, peak = device_peak(device, args.peak_tbs)

    con = Console() if Console().is_terminal else Console(width=160)
    err = Console(stderr=True)
    if cpu:
        con.print(
            "[bold yellow]CPU figures: FlyDSL runs on the reference backend; not a GPU speed.[/] "
            f"ATen runs its native CPU kernels ({torch.get_num_threads()} thread(s)); "
            "the speedups compare the two on this CPU only."
        )
    t0 = time.perf_counter()
    with err.status("benchmarking") as st:
        rows = run(
            cases,
            device,
            reps,
            peak,
            progress=lambda s: st.update(f"benchmarking {s}"),
            verbose=args.v,
        )
    peak_txt = f"peak {peak:g} TB/s" if peak else "no peak bandwidth known"
    title = (
        f"FlyDSL vs ATen on {name} ({'CPU figures' if cpu else 'GPU'}; median of {reps}; "
        f"{peak_txt}; {'quick' if quick else 'full'} shapes)"
    )
    con.print(table(rows, title, cpu))
    bad = [r for r in rows if r["error"]]
    con.print(
        f"{len(rows)} cases in {time.perf_counter() - t0:.0f} s; {len(bad)} failed", highlight=False
    )
    if args.json:
        doc = {"device": name, "cpu": cpu, "peak_tbs": peak, "reps": reps, "quick": quick}
        doc["rows"] = rows
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
