"""``torch_flydsl calibrate``: time FlyDSL against ATen per shape bucket on this GPU, write the gates.

    torch_flydsl calibrate [--ops rms_norm,topk,gemm,grouped_mm,scaled_mm] [--dtypes ...]
                           [--out PATH] [--reps 20] [--min-speedup 1.05] [--quick]

The buckets and the code timed come from the op specs (``spec.Calibration`` of
``torch_flydsl.ops``): RMSNorm and its backward, TopK, the dense GEMM (M classes at
Llama-3.1-8B widths), the grouped GEMM (rows per expert, Qwen3-30B-A3B's experts) and the MX
GEMM (mxfp8 / mxfp4 M buckets, against ``torch._scaled_mm`` where the device has MX MMA).
For every (op, dtype) and bucket it times one representative shape with both
implementations, interleaved in one process, and keeps the median of ``--reps`` CUDA-event
timings each. A bucket where FlyDSL is at least ``--min-speedup`` times faster becomes a
rule of the local gate table (gates.py); an (arch, op, dtype) where it never wins is
written as closed. ``--dtypes`` narrows each op's own dtypes. The table goes to ``--out``,
else ``$FLYDSL_TORCH_GATES``, else the FlyDSL cache dir; the overrides and the torch.compile
pass prefer it to the shipped table. Needs a GPU: without one it says so and exits with
status 2.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys

import torch

from . import gates

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


def paired_medians(ours, aten, reps: int) -> tuple[float, float]:
    """Medians of ours and ATen, timed interleaved (clock drift hits both alike)."""
    ours(), aten()
    to, ta = [], []
    for _ in range(reps):
        to.append(_median_ms(ours, 1))
        ta.append(_median_ms(aten, 1))
    return statistics.median(to), statistics.median(ta)


def buckets(ops, dtypes=None, quick=False) -> list[tuple]:
    """``[(Calibration, torch dtype, m, n, k)]``: every bucket of the specs named by ``ops``
    (spec names or aliases), in their own dtypes (narrowed to ``dtypes`` names if given)."""
    from .ops import spec

    out = []
    for name in ops:
        for cal in spec(name).calibration:
            names = [d for d in cal.dtypes if dtypes is None or d in dtypes]
            dts = [gates.DTYPES_BY_NAME[d] for d in names]
            for dt, m, n, k in cal.cases(dts, quick):
                out.append((cal, dt, m, n, k))
    return out


def calibrate(args) -> int:
    if not torch.cuda.is_available():
        extra = (
            "; this torch is built without CUDA/ROCm" if not torch.backends.cuda.is_built() else ""
        )
        print(NO_GPU.format(extra=extra), file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import disabled as _plain_aten
    from . import eligibility

    dev = torch.device("cuda", torch.cuda.current_device())
    # the rules' arch is what the overrides look up: the GPU target (``eligibility``)
    arch = eligibility.gpu_target(dev.index) or "unknown"
    name = torch.cuda.get_device_name(dev)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else None
    cases = buckets(ops, dtypes, args.quick)
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
        for cal, dt, m, n, k in cases:
            op = cal.op
            dname = gates.DTYPE_NAMES[dt]
            bar.update(
                task, description=f"{op} {dname} m={m[0]} n={n[0]}" + (f" k={k[0]}" if k else "")
            )
            tried.add((arch, op, dname))
            try:
                ours, aten = cal.make(dt, m, n, k, dev)
                to, ta = paired_medians(ours, aten, args.reps)
            except Exception as e:  # a kernel that fails here stays on ATen
                errors += 1
                console.print(f"[yellow]{op} {dname} {m[0]}x{n[0]}: {type(e).__name__}: {e}")
                bar.advance(task)
                continue
            speedup = ta / to if to > 0 else 0.0
            if speedup >= args.min_speedup:
                if cal.rule_extra is not None:
                    extra = cal.rule_extra(k)
                else:
                    extra = {"k": list(k)} if k else {}
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
    c.add_argument("--ops", default="rms_norm,topk,gemm,grouped_mm,scaled_mm")
    c.add_argument(
        "--dtypes", default=None, help="narrow each op's own dtypes (e.g. bfloat16,float16)"
    )
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
