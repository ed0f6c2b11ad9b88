"""The ``flydsl`` command line.

flydsl check [--target cpu-reference] [EXAMPLE ...]   run the shipped examples, compare with PyTorch
flydsl ir EXAMPLE [--stage traced|final]               print an example's FlyIR
flydsl inspect|compile EXAMPLE [--target gfx950]       cross-compile an example, print / write stages
flydsl aot [EXAMPLE ...] --out DIR                     an AOT bundle of the examples
flydsl export NAME ... --target gfx950 --out DIR       kernels as standalone Triton + contracts
flydsl targets                                         list the known targets
flydsl settings                                        the FLYDSL_* variables and their values
flydsl cache info|clear                                the on-disk compile cache

``--target`` takes a target's name or alias (``mi355x``, ``GFX950``, ``interpret``);
without it ``$FLYDSL_TARGET`` is used, then the command's default. Exit status:
0 success, 1 a failure (an example that does not match PyTorch, a cache that
cannot be cleared), 2 a bad argument or setting, reported in one line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .exc import UsageError

#: stages `inspect --stage` can print (which exist depends on the target)
STAGES = ("flyir", "triton", "ttir", "ttgir", "llir", "amdgcn", "ptx", "hsaco", "cubin")
#: dtype names the commands take
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument raises ``UsageError`` (one line, exit status 2) instead of
    printing the usage; ``parse(argv)`` returns the namespace or reports the error."""

    def error(self, message):
        raise UsageError(message, prog=self.prog)

    def parse(self, argv) -> argparse.Namespace | None:
        """The parsed arguments, or None after printing the one-line error."""
        try:
            return self.parse_args(argv)
        except UsageError as e:
            usage_error(e.fields.get("prog") or self.prog, e.msg)
            return None


def usage_error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def dtype_name(text: str) -> str:
    """``fp32`` / ``bf16`` / ``fp16`` (or the torch names) -> the short name."""
    name = _DTYPE_ALIASES.get(text, text)
    if name not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use one of {', '.join(DTYPES)}")
    return name


def target_name(text: str) -> str:
    """A target's canonical name from a name or alias (``--target``)."""
    from .exc import UnknownTargetError
    from .targets import get_target

    try:
        return get_target(text).name
    except UnknownTargetError as e:
        raise argparse.ArgumentTypeError(e.msg) from None


def out_dir(text: str) -> Path:
    """A folder to write into: created if missing; an existing file is a usage error."""
    p = Path(text).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"--out {text}: not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {text}: cannot create it ({e.strerror or e})") from None
    return p


def _example(name: str):
    from . import examples

    if name not in examples.NAMES:
        raise UsageError(f"unknown example {name!r}; examples: {', '.join(examples.NAMES)}")
    return examples.load(name)


def _target(args, default: str) -> str:
    """``--target``, else ``$FLYDSL_TARGET``, else the command's default."""
    if args.target is not None:
        return args.target
    from . import settings
    from .targets import resolve_target

    if settings.get("FLYDSL_TARGET") is None:
        return default
    return resolve_target().name  # reads $FLYDSL_TARGET; an unknown name names the variable


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

    target = _target(args, "cpu-reference")
    mods = [_example(n) for n in args.examples or examples.NAMES]
    dtypes = [getattr(torch, DTYPES[d]) for d in args.dtypes]
    table = Table(title=f"FlyDSL examples on {target} vs PyTorch")
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
    for mod in mods:
        name = mod.__name__.rsplit(".", 1)[-1]
        for d in dtypes:
            inputs = mod.make_inputs(dtype=d, generator=gen)
            t0 = time.perf_counter()
            out = mod.run(*inputs, target=target)
            t1 = time.perf_counter()
            out = mod.run(*inputs, target=target)
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

    from .passes import run_pipeline

    mod = _example(args.example)
    k = mod.KERNEL
    spec = _example_spec(mod, getattr(torch, DTYPES[args.dtype]))
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

    mod = _example(args.example)
    target = _target(args, "gfx950")
    out = out_dir(args.out) if getattr(args, "out", None) else None
    spec = _example_spec(mod, getattr(torch, DTYPES[args.dtype]))
    options = {"num_warps": args.num_warps} if args.num_warps else {}
    ck = mod.KERNEL._compiled(spec, target, options)
    exe = ck.executable
    if out is not None:
        ext = {"triton": "py", "flyir": "ir"}
        for name, data in ck.stages().items():
            path = out / f"{mod.KERNEL.name}.{ext.get(name, name)}"
            if isinstance(data, str):
                path.write_text(data)
            else:
                path.write_bytes(data)
        print(f"wrote {len(ck.stages())} stages of {mod.KERNEL.name} for {target} to {out}")
    if args.stage:
        stages = exe.stages()
        if args.stage == "flyir":
            print(ck.ir)
        elif args.stage not in stages:
            raise UsageError(f"no stage {args.stage!r}; stages: flyir, {', '.join(stages)}")
        else:
            v = stages[args.stage]
            print(v if isinstance(v, str) else f"<{len(v)} bytes of binary>")
    report = exe.report
    if report is None:
        print(f"{target} produces no resource report")
        return 0
    t = Table(title=f"{args.example} on {target}: resources (static, from the compiler's output)")
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
    from .targets import get_target

    target = _target(args, "gfx950")
    if not get_target(target).is_gpu:
        raise UsageError(f"--target {target}: AOT bundles hold GPU code; name a GPU target")
    mods = [(n, _example(n)) for n in args.examples or examples.NAMES]
    out = out_dir(args.out)
    compiled = []
    for name, mod in mods:
        for d in args.dtypes:
            spec = _example_spec(mod, getattr(torch, DTYPES[d]))
            compiled.append(mod.KERNEL._compiled(spec, target, {}))
            print(f"compiled {name} ({d}) for {target}")
    out = write_bundle(compiled, out)
    print(f"wrote {len(compiled)} kernels to {out}")
    return 0


def cmd_export(args) -> int:
    """Write kernels (groups, kernel names, ``all``) as standalone Triton (``export.py``)."""
    from . import export

    target = _target(args, "gfx950")
    if args.list:
        for name, g in export.groups().items():
            kernels = sorted({c.kernel for c in g.cases()})
            print(f"{name}: {g.description}\n    {', '.join(kernels)}")
        return 0
    if not args.names:
        raise UsageError("name what to export: a group, a kernel, or all (--list lists them)")
    if args.out is None:
        raise UsageError("--out DIR is required")
    from .targets import get_target

    if get_target(target).compiler != "triton":
        raise UsageError(
            f"--target {target} does not generate Triton; export for a GPU target "
            "(gfx950, gfx942, gfx1250, sm90) or cpu-interpret"
        )
    chosen = export.select(args.names, export.groups())  # a bad name: before writing anything
    out = out_dir(args.out)
    m = export.export(
        chosen, target, out, specialized=args.specialized, progress=lambda s: print(f"  {s}")
    )
    n = sum(len(g["kernels"]) for g in m["groups"].values())
    print(f"wrote {n} kernels for {target} to {out} (README.md, manifest.json)")
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


def cmd_settings(args) -> int:
    """Every FLYDSL_* variable of every installed package (``settings.load_all``): what it
    takes, what it does, its value here; then the FLYDSL_* names set here that no package
    declares (typos: ignored by FlyDSL, warned about at the first read of a setting)."""
    import os

    from rich.markup import escape
    from rich.table import Table

    from . import settings

    variables = settings.load_all()
    t = Table(title="FLYDSL_* environment variables (declared with flydsl_core.settings.declare)")
    for col in ("variable", "package", "takes", "meaning", "value here"):
        t.add_column(col, overflow="fold")
    for v in sorted(variables.values(), key=lambda v: (v.package != "flydsl-core", v.package)):
        raw = os.environ.get(v.name)
        try:
            shown = "(unset)" if raw is None else repr(v.parse(raw))
        except settings.SettingsError as e:
            shown = f"[red]invalid: {escape(e.msg if hasattr(e, 'msg') else str(e))}[/]"
        t.add_row(v.name, v.package, escape(v.accepted()), escape(v.doc), shown)
    for name, close in settings.unknown().items():
        hint = f"; did you mean {close}?" if close else ""
        t.add_row(
            f"[red]{name}[/]",
            "-",
            "-",
            f"[red]not a FlyDSL setting: ignored{escape(hint)}[/]",
            escape(repr(os.environ.get(name))),
        )
    _console().print(t)
    for where, why in settings.load_errors().items():
        print(
            f"flydsl settings: could not load the declarations at {where}: {why}", file=sys.stderr
        )
    return 0


def cmd_cache(args) -> int:
    from .cache import DiskCache
    from .exc import CacheError

    cache = DiskCache()
    if args.action == "clear":
        try:
            n = cache.clear()
        except CacheError as e:
            print(f"flydsl cache clear: error: {e.msg}", file=sys.stderr)
            return 1
        print(f"removed {n} entries from {cache.root}")
    else:
        info = cache.info()
        print(f"{info.root}: {info.entries} entries, {info.total_bytes / 1e6:.1f} MB")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="flydsl", description="FlyDSL compiler tools")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    target_help = "a target name or alias (default: $FLYDSL_TARGET, else {})"
    c = sub.add_parser("check", help="run the shipped example kernels and compare with PyTorch")
    c.add_argument("examples", nargs="*", help="example names (default: all)")
    c.add_argument("--target", type=target_name, help=target_help.format("cpu-reference"))
    c.add_argument("--dtypes", nargs="+", type=dtype_name, default=["fp32", "bf16", "fp16"])
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=cmd_check)
    i = sub.add_parser("ir", help="print the FlyIR of an example kernel")
    i.add_argument("example")
    i.add_argument("--stage", choices=["traced", "final"], default="final")
    i.add_argument("--dtype", type=dtype_name, default="fp32")
    i.add_argument("--locs", action="store_true", help="annotate ops with their source lines")
    i.set_defaults(func=cmd_ir)
    for name, what in (
        ("inspect", "compile an example for a target and print its resource report"),
        ("compile", "compile an example for a target and write every stage to --out"),
    ):
        n = sub.add_parser(name, help=what)
        n.add_argument("example")
        n.add_argument("--target", type=target_name, help=target_help.format("gfx950"))
        n.add_argument("--dtype", type=dtype_name, default="bf16")
        n.add_argument("--num-warps", type=int, choices=[1, 2, 4, 8, 16], default=None)
        if name == "inspect":
            n.add_argument("--stage", choices=STAGES, help="also print this stage")
        else:
            n.add_argument("--out", required=True)
            n.add_argument("--stage", default=None, help=argparse.SUPPRESS)
        n.set_defaults(func=cmd_inspect)
    a = sub.add_parser(
        "aot", help="compile example specializations for a target into an AOT bundle"
    )
    a.add_argument("examples", nargs="*")
    a.add_argument("--target", type=target_name, help=target_help.format("gfx950"))
    a.add_argument("--dtypes", nargs="+", type=dtype_name, default=["bf16"])
    a.add_argument("--out", required=True)
    a.set_defaults(func=cmd_aot)
    e = sub.add_parser(
        "export", help="write kernels as standalone Triton modules with launch contracts"
    )
    e.add_argument("names", nargs="*", help="groups (families, examples), kernel names, or all")
    e.add_argument("--target", type=target_name, help=target_help.format("gfx950"))
    e.add_argument("--out", help="the folder to write (created if missing)")
    e.add_argument(
        "--specialized",
        action="store_true",
        help="keep each problem's size facts (faster code, valid only for such shapes)",
    )
    e.add_argument("--list", action="store_true", help="list what can be exported")
    e.set_defaults(func=cmd_export)
    t = sub.add_parser("targets", help="list the known targets")
    t.set_defaults(func=cmd_targets)
    st = sub.add_parser("settings", help="list the FLYDSL_* environment variables")
    st.set_defaults(func=cmd_settings)
    ca = sub.add_parser("cache", help="inspect or clear the on-disk compile cache")
    ca.add_argument("action", choices=["info", "clear"])
    ca.set_defaults(func=cmd_cache)
    return p


def main(argv=None) -> int:
    from . import settings
    from .exc import FlyDSLError, SettingsError, UnknownTargetError

    args = build_parser().parse(argv)
    if args is None:
        return 2
    prog = f"flydsl {args.cmd}"
    try:
        settings.check_environment()  # a FLYDSL_* name no package declares: a warning, once
        if args.cmd != "settings":  # the one command that shows bad values instead
            settings.check_all()  # a bad FLYDSL_* value is reported before any work
        return args.func(args)
    except (UsageError, SettingsError, UnknownTargetError) as e:
        return usage_error(prog, getattr(e, "msg", str(e)))
    except FlyDSLError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
