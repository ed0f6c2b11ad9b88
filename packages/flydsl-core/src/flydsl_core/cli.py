"""The ``flydsl`` command line.

flydsl check [--target cpu-reference] [EXAMPLE ...]   run the shipped examples, compare with PyTorch
flydsl ir EXAMPLE [--stage traced|final]               print an example's FlyIR
flydsl targets                                         list the known targets
flydsl cache info|clear                                the on-disk compile cache
"""

from __future__ import annotations

import argparse
import sys
import time


def _console():
    from rich.console import Console

    # Wide enough for the tables when output is piped (rich assumes 80 columns then).
    c = Console()
    return c if c.is_terminal else Console(width=160)


def _dtype_name(d) -> str:
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}[str(d)]


def cmd_check(args) -> int:
    import torch
    from rich.table import Table

    from . import examples

    names = args.examples or list(examples.NAMES)
    dtypes = [
        getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[d])
        for d in args.dtypes
    ]
    table = Table(title=f"FlyDSL examples on {args.target} vs PyTorch")
    for col in (
        "example",
        "dtype",
        "shape",
        "max abs err",
        "tolerance (rtol, atol)",
        "compile+run",
        "warm run",
        "ok",
    ):
        table.add_column(col)
    failures = 0
    gen = torch.Generator().manual_seed(args.seed)
    for name in names:
        mod = examples.load(name)
        for d in dtypes:
            inputs = mod.make_inputs(dtype=d, generator=gen)
            t0 = time.perf_counter()
            out = mod.run(*inputs, target=args.target)
            t1 = time.perf_counter()
            out = mod.run(*inputs, target=args.target)
            t2 = time.perf_counter()
            ref = mod.reference(*inputs)
            rtol, atol = mod.TOLERANCE[_dtype_name(d)]
            ok = out.shape == ref.shape and torch.allclose(
                out.float(), ref.float(), rtol=rtol, atol=atol
            )
            err = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
            failures += not ok
            shape = "x".join(str(s) for s in mod.DEFAULT_SHAPE)
            table.add_row(
                name,
                _dtype_name(d),
                shape,
                f"{err:.3g}",
                f"({rtol:g}, {atol:g})",
                f"{(t1 - t0) * 1e3:.0f} ms",
                f"{(t2 - t1) * 1e3:.0f} ms",
                "[green]yes[/]" if ok else "[red]NO[/]",
            )
    con = _console()
    con.print(table)
    con.print(
        f"{'all examples match PyTorch' if not failures else f'{failures} mismatches'} (CPU figures, no GPU involved)"
    )
    return 1 if failures else 0


def cmd_ir(args) -> int:
    import torch

    from . import examples
    from .passes import run_pipeline

    mod = examples.load(args.example)
    k = mod.KERNEL
    spec = _example_spec(mod, getattr(torch, args.dtype))
    fn = k.trace(spec)
    if args.stage == "final":
        fn = run_pipeline(fn, k.pipeline)
    from .ir.printer import print_function

    print(print_function(fn, locs=args.locs))
    return 0


def cmd_inspect(args) -> int:
    """Compile an example for a target (no GPU needed) and print its report and a stage."""
    import torch
    from rich.table import Table

    from . import examples

    mod = examples.load(args.example)
    spec = _example_spec(mod, getattr(torch, args.dtype))
    options = {"num_warps": args.num_warps} if args.num_warps else {}
    ck = mod.KERNEL._compiled(spec, args.target, options)
    exe = ck.executable
    if getattr(args, "out", None):
        from pathlib import Path

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        ext = {"triton": "py", "flyir": "ir"}
        for name, data in ck.stages().items():
            path = out / f"{mod.KERNEL.name}.{ext.get(name, name)}"
            if isinstance(data, str):
                path.write_text(data)
            else:
                path.write_bytes(data)
        print(f"wrote {len(ck.stages())} stages of {mod.KERNEL.name} for {args.target} to {out}")
    if args.stage:
        stages = exe.stages() if hasattr(exe, "stages") else {}
        if args.stage == "flyir":
            print(ck.ir)
        elif args.stage not in stages:
            print(f"no stage {args.stage!r}; stages: flyir, {', '.join(stages)}", file=sys.stderr)
            return 2
        else:
            v = stages[args.stage]
            print(v if isinstance(v, str) else f"<{len(v)} bytes of binary>")
    report = getattr(exe, "report", None)
    if report is None:
        print(f"{args.target} produces no resource report")
        return 0
    t = Table(
        title=f"{args.example} on {args.target}: resources (static, from the compiler's output)"
    )
    t.add_column("field")
    t.add_column("value")
    for k, v in report.to_dict().items():
        if v not in (None, {}, [], ()) and k not in ("reasons", "warnings"):
            t.add_row(k, str(v))
    _console().print(t)
    return 0


def _example_spec(mod, dtype):
    import torch

    from .backends import Backend, Executable, temporary

    inputs = mod.make_inputs(dtype=dtype, generator=torch.Generator().manual_seed(0))
    captured = {}

    class _Capture(Backend, Executable):
        """Records the specialization the example launches with; runs nothing."""

        def __init__(self):
            pass

        def compile(self, fn, spec, options):
            captured["spec"] = spec
            return self

        def launch(self, grid, a):
            pass

    with temporary("__capture__", _Capture()):
        try:
            mod.run(*inputs, target="__capture__")
        finally:
            mod.KERNEL.clear_cache()
    return captured["spec"]


def cmd_aot(args) -> int:
    """Compile the examples' default specializations for a target into a bundle."""
    import torch

    from . import examples
    from .aot import write_bundle

    compiled = []
    for name in args.examples or examples.NAMES:
        mod = examples.load(name)
        for d in args.dtypes:
            spec = _example_spec(mod, getattr(torch, d))
            compiled.append(mod.KERNEL._compiled(spec, args.target, {}))
            print(f"compiled {name} ({d}) for {args.target}")
    out = write_bundle(compiled, args.out)
    print(f"wrote {len(compiled)} kernels to {out}")
    return 0


def cmd_targets(args) -> int:
    from rich.table import Table

    from .targets import get_target, known_targets

    table = Table(title="FlyDSL targets")
    for col in ("name", "backend", "arch", "wave", "CUs", "LDS/CU", "matrix instructions"):
        table.add_column(col)
    for n in known_targets():
        t = get_target(n)
        lds = t.lds_bytes_per_cu
        table.add_row(
            t.name,
            str(t.backend),
            str(t.arch or "-"),
            str(t.warp_size),
            str(t.num_cus or "-"),
            f"{lds // 1024} KiB" if lds else "-",
            "\n".join(t.matrix_instructions) or "-",
        )
    _console().print(table)
    return 0


def cmd_cache(args) -> int:
    from .cache import DiskCache

    cache = DiskCache()
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} entries from {cache.root}")
    else:
        info = cache.info()
        print(f"{info.root}: {info.entries} entries, {info.total_bytes / 1e6:.1f} MB")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flydsl", description="FlyDSL compiler tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="run the shipped example kernels and compare with PyTorch")
    c.add_argument("examples", nargs="*", help="example names (default: all)")
    c.add_argument("--target", default="cpu-reference")
    c.add_argument(
        "--dtypes", nargs="+", default=["fp32", "bf16", "fp16"], choices=["fp32", "bf16", "fp16"]
    )
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=cmd_check)
    i = sub.add_parser("ir", help="print the FlyIR of an example kernel")
    i.add_argument("example")
    i.add_argument("--stage", choices=["traced", "final"], default="final")
    i.add_argument("--dtype", default="float32")
    i.add_argument("--locs", action="store_true", help="annotate ops with their source lines")
    i.set_defaults(func=cmd_ir)
    n = sub.add_parser(
        "inspect", help="compile an example for a target and print its resource report"
    )
    n.add_argument("example")
    n.add_argument("--target", default="gfx950")
    n.add_argument("--dtype", default="bfloat16")
    n.add_argument("--num-warps", type=int, default=None)
    n.add_argument(
        "--stage", help="also print a stage: flyir, triton, ttir, ttgir, llir, amdgcn, ptx"
    )
    n.set_defaults(func=cmd_inspect)
    co = sub.add_parser(
        "compile", help="compile an example for a target and write every stage to --out"
    )
    co.add_argument("example")
    co.add_argument("--target", default="gfx950")
    co.add_argument("--dtype", default="bfloat16")
    co.add_argument("--num-warps", type=int, default=None)
    co.add_argument("--out", required=True)
    co.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    co.set_defaults(func=cmd_inspect)
    a = sub.add_parser(
        "aot", help="compile example specializations for a target into an AOT bundle"
    )
    a.add_argument("examples", nargs="*")
    a.add_argument("--target", default="gfx950")
    a.add_argument("--dtypes", nargs="+", default=["bfloat16"])
    a.add_argument("--out", required=True)
    a.set_defaults(func=cmd_aot)
    t = sub.add_parser("targets", help="list the known targets")
    t.set_defaults(func=cmd_targets)
    ca = sub.add_parser("cache", help="inspect or clear the on-disk compile cache")
    ca.add_argument("action", choices=["info", "clear"])
    ca.set_defaults(func=cmd_cache)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .exc import FlyDSLError

    try:
        return args.func(args)
    except FlyDSLError as e:
        print(e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
