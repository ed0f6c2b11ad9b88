"""``torch_flydsl calibrate``: time FlyDSL against ATen per shape bucket on this GPU, write the gates.

    torch_flydsl calibrate [--ops rms_norm,topk] [--dtypes float32,bfloat16,float16]
                           [--out PATH] [--reps 20] [--min-speedup 1.05] [--quick]

For every (op, dtype) and shape bucket it times one representative shape
(the bucket's lower corner) with both implementations, interleaved in one
process, and keeps the median of ``--reps`` CUDA-event timings each. A
bucket where FlyDSL is at least ``--min-speedup`` times faster becomes a
rule of the local gate table (gates.py); an (arch, op, dtype) where it never
wins is written as closed. The table goes to ``--out``, else
``$FLYDSL_TORCH_GATES``, else the FlyDSL cache dir; the overrides prefer it
to the shipped table from the next ``enable()`` on. Needs a GPU: without
one it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

from . import gates

#: row-length buckets (closed ranges) and row-count buckets for RMSNorm
RMS_N = [(1 << j, (1 << (j + 1)) - 1) for j in range(7, 17)] + [(131072, 262144)]
RMS_M = [(1, 255), (256, 1023), (1024, 4095), (4096, 16383), (16384, 65536)]
#: TopK: k buckets, power-of-two N buckets, row-count buckets
TOPK_K = [(1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 255), (256, 1024)]
TOPK_N = [(1 << j, (1 << (j + 1)) - 1) for j in range(10, 18)]
TOPK_M = [(1, 63), (64, 255), (256, 1023), (1024, 8192)]
QUICK = {"rms_m": RMS_M[::2], "topk_m": TOPK_M[1::2], "topk_k": TOPK_K[::2]}
#: the largest input calibrate allocates (bytes), so buckets stay within memory
MAX_BYTES = 1 << 31

NO_GPU = (
    "torch_flydsl calibrate times kernels on a GPU and found none "
    "(torch.cuda.is_available() is False{extra}). Run it on the machine whose gates you want; "
    "the shipped gate table stays in use until then."
)


def _median_ms(fn, reps: int) -> float:
    fn()  # compile / warm up
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _pair(ours, aten, reps: int) -> tuple[float, float]:
    """Medians of ours and ATen, timed interleaved (clock drift hits both alike)."""
    ours(), aten()
    to, ta = [], []
    for _ in range(reps):
        to.append(_median_ms(ours, 1))
        ta.append(_median_ms(aten, 1))
    return statistics.median(to), statistics.median(ta)


def _cases(ops, dtypes, quick):
    rms_m = QUICK["rms_m"] if quick else RMS_M
    t_m = QUICK["topk_m"] if quick else TOPK_M
    t_k = QUICK["topk_k"] if quick else TOPK_K
    for dt in dtypes:
        size = torch.empty((), dtype=dt).element_size()
        if "rms_norm" in ops:
            for n in RMS_N:
                for m in rms_m:
                    if m[0] * n[0] * size <= MAX_BYTES:
                        yield ("rms_norm", dt, m, n, None)
                        yield ("rms_norm_backward", dt, m, n, None)
        if "topk" in ops:
            for n in TOPK_N:
                for k in t_k:
                    if k[0] > n[0]:
                        continue
                    for m in t_m:
                        if m[0] * n[0] * size <= MAX_BYTES:
                            yield ("topk", dt, m, n, k)


def _fns(op, dt, m, n, k, dev):
    from flydsl_kernels.rmsnorm import rms_norm, rms_norm_backward
    from flydsl_kernels.topk import topk

    x = torch.randn(m, n, device=dev).to(dt)
    if op == "topk":
        return (lambda: topk(x, k)), (lambda: torch.ops.aten.topk.default(x, k))
    w = torch.randn(n, device=dev).to(dt)
    if op == "rms_norm":
        return (
            lambda: rms_norm(x, (n,), w, 1e-6),
            lambda: torch.ops.aten._fused_rms_norm.default(x, [n], w, 1e-6),
        )
    g = torch.randn_like(x)
    _, rstd = torch.ops.aten._fused_rms_norm.default(x, [n], w, 1e-6)
    det = torch.are_deterministic_algorithms_enabled()
    return (
        lambda: rms_norm_backward(g, x, rstd, w, det),
        lambda: torch.ops.aten._fused_rms_norm_backward.default(g, x, [n], rstd, w, [True, True]),
    )


def calibrate(args) -> int:
    if not torch.cuda.is_available():
        extra = (
            "; this torch is built without CUDA/ROCm" if not torch.backends.cuda.is_built() else ""
        )
        print(NO_GPU.format(extra=extra), file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import _runtime
    from . import disabled as _plain_aten

    dev = torch.device("cuda", torch.cuda.current_device())
    arch = _runtime.resolve_arch(dev.index) or "unknown"
    name = torch.cuda.get_device_name(dev)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    dtypes = [gates._DTYPES[d.strip()] for d in args.dtypes.split(",") if d.strip()]
    cases = list(_cases(ops, dtypes, args.quick))
    day = datetime.date.today().isoformat()
    rules, tried, errors = [], set(), 0
    console = Console(stderr=True)
    console.print(f"calibrating {len(cases)} buckets on {name} ({arch}), {args.reps} reps each")
    with (
        _plain_aten(),
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as bar,
    ):
        task = bar.add_task("buckets", total=len(cases))
        for op, dt, m, n, k in cases:
            dname = gates.DTYPE_NAMES[dt]
            bar.update(
                task, description=f"{op} {dname} m={m[0]} n={n[0]}" + (f" k={k[0]}" if k else "")
            )
            tried.add((arch, op, dname))
            try:
                ours, aten = _fns(op, dt, m[0], n[0], k[0] if k else None, dev)
                to, ta = _pair(ours, aten, args.reps)
            except Exception as e:  # a kernel that fails here stays on ATen
                errors += 1
                console.print(f"[yellow]{op} {dname} {m[0]}x{n[0]}: {type(e).__name__}: {e}")
                bar.advance(task)
                continue
            speedup = ta / to if to > 0 else 0.0
            if speedup >= args.min_speedup:
                extra = {"k": k, "largest": True, "sorted": True} if op == "topk" else {}
                if op == "topk" and k[0] == k[1]:
                    extra["k_in"] = [k[0]]
                rules.append(
                    gates.Rule.from_json(
                        {
                            "arch": arch,
                            "op": op,
                            "dtype": dname,
                            "m": list(m),
                            "n": list(n),
                            **extra,
                            "source": (
                                f"calibrated {day} on {name} ({arch}): {speedup:.2f}x vs ATen at "
                                f"m={m[0]} n={n[0]}"
                                + (f" k={k[0]}" if k else "")
                                + f", median of {args.reps}"
                            ),
                        }
                    )
                )
            bar.advance(task)
            torch.cuda.empty_cache()
    won = {(r.arch, r.op, r.dtype) for r in rules}
    closed = [
        {
            "arch": a,
            "op": o,
            "dtype": d,
            "source": f"calibrated {day} on {name}: ATen won every bucket",
        }
        for a, o, d in sorted(tried - won)
    ]
    path = args.out or gates.local_path()
    # keep what an earlier calibration wrote for other (arch, op, dtype) keys
    keep = []
    if gates.Path(path).is_file():
        try:
            keep = [r for r in gates.read_table(path) if (r.arch, r.op, r.dtype) not in tried]
        except ValueError:
            keep = []
    gates.write_table(path, keep + rules, closed)
    console.print(
        f"wrote {len(rules)} winning buckets ({len(closed)} closed op/dtype keys, {errors} errors) "
        f"to {path}"
    )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="torch_flydsl", description="torch-flydsl tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate", help="time FlyDSL vs ATen on this GPU and write the gate table")
    c.add_argument("--ops", default="rms_norm,topk")
    c.add_argument("--dtypes", default="float32,bfloat16,float16")
    c.add_argument("--out", default=None, help="table path (default: FLYDSL_TORCH_GATES or cache)")
    c.add_argument("--reps", type=int, default=20)
    c.add_argument("--min-speedup", type=float, default=1.05)
    c.add_argument("--quick", action="store_true", help="fewer buckets")
    sub.add_parser("status", help="print torch_flydsl.status()")
    args = p.parse_args(argv)
    if args.cmd == "status":
        import json

        from . import status

        print(json.dumps(status(), indent=1))
        return 0
    return calibrate(args)


if __name__ == "__main__":
    sys.exit(main())
