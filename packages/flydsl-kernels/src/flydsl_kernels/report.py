"""``flydsl-kernels report``: every shipped kernel and default config in one table.

    flydsl-kernels report [SELECT ...] [--target gfx950] [--device auto] [--json PATH]
    python -m flydsl_kernels.report [SELECT ...] ...
    flydsl-kernels model FAMILY [ARGS ...]     (the static model behind a family's tables)

For each selected case of each family (``flydsl_kernels.families()``) it

* compiles the kernel for ``--target`` (gfx950 by default; cross-compiling
  needs no GPU) and reads the resource report of the compiled code: VGPRs,
  LDS, scratch, occupancy, the widest global load, matrix instructions, and on
  AMD targets the loop figure ``loop/MFMA``: instructions per trip of the
  innermost loops holding matrix instructions per 32x32-equivalent matrix
  instruction (the core's loop finder, ``flydsl_core.backends.triton.amdgcn.
  loops``; a block a trip may skip is not counted), as ``main / worst`` where a
  kernel has several such loops (attention's unmasked and masked KV loops);
* checks correctness on ``--device`` (auto: the GPU if torch sees one, else
  the CPU reference backend); the error is normalized so <= 1 passes;
* where the check device is a GPU, times ours and the ATen op on the same
  inputs (median of CUDA-event timings) and reports the speedup aten / ours;
  a case that names its baseline (``ReportCase.baseline``, e.g. a dequantize
  + matmul fallback) shows the name in a ``baseline`` column; cases that state
  their ``flops`` / ``bytes`` get achieved TFLOP/s, GB/s and the % of the
  device's peak bandwidth;
* runs each check (and, on a GPU, one run at the timed size) with guard
  buffers around every tensor the kernel library allocates (``guards.py``):
  a changed guard byte is an out-of-bounds write and fails the case, naming it.

Each case compiles with the config of ``--target``'s own table (every family
ships one per tuned target), and a case whose compile for that target has
scratch, spills or more LDS / shared memory than a workgroup may use fails: no
shipped case may. A case the target only emulates (e.g. MX GEMMs without MX
matrix instructions) says so in ``emulated``.

``collect()`` builds the rows (plain dicts, JSON-serializable); ``render_table()``
draws them; ``main()`` is the command line. The exit status is 0 when every
selected case compiled and passed its check, 1 when any case raised or has an
error above tolerance, 2 for a usage error (an unknown selection).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

log = logging.getLogger(__name__)

__all__ = [
    "SelectionError",
    "case_key",
    "collect",
    "main",
    "matrix_summary",
    "median_times_ms",
    "render_table",
    "resolve_device",
    "resource_problems",
    "select_cases",
]


class SelectionError(ValueError):
    """A SELECT term matched no case."""


def case_key(case) -> str:
    """What SELECT terms match against: ``family/kernel/shape``."""
    return f"{case.family}/{case.kernel}/{case.shape}"


def _matches(term: str, key: str) -> bool:
    return term.lower() in key.lower()


def select_cases(select: Sequence[str] | None, fams: dict | None = None):
    """``(cases, broken)``: the selected cases in family order, and ``(family, exception,
    position)`` for each family whose ``cases()`` raised that a term names (all of them
    without terms); ``position`` is where its error row goes among the cases.

    A term selects every case whose ``family/kernel/shape`` contains it (case-insensitive),
    so a family name, a kernel name, or e.g. ``topk_small/256x4096`` all work. Raises
    ``SelectionError``, listing the families, for a term that matches nothing.
    """
    if fams is None:
        from . import families

        fams = families()
    terms = [t for t in (select or ()) if t]
    cases, broken, keys = [], [], []
    for name, fam in fams.items():
        listed, exc = [], None
        try:
            listed.extend(fam.cases())  # a generator: it can raise part-way
        except Exception as e:
            log.debug("cases() of %s raised", name, exc_info=True)
            exc = e
        keys.extend(case_key(c) for c in listed)
        cases.extend(c for c in listed if not terms or any(_matches(t, case_key(c)) for t in terms))
        if exc is not None:
            broken.append((name, exc, len(cases)))  # its row goes after what it did list
    # a broken family counts when a term names it: its error row stands for its cases
    chosen = [b for b in broken if not terms or any(_matches(t, b[0]) for t in terms)]
    unknown = [
        t
        for t in terms
        if not any(_matches(t, k) for k in keys) and not any(_matches(t, b[0]) for b in chosen)
    ]
    if unknown:
        text = (
            f"no case matches {', '.join(map(repr, unknown))}; families: {', '.join(fams)} "
            "(`flydsl-kernels report --list` lists the cases)"
        )
        for n, e, _ in broken:
            text += f"; the cases of {n} could not be listed: {_err_text(e)}"
        raise SelectionError(text)
    return cases, chosen


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` where torch sees a GPU, else ``cpu`` (the reference backend)."""
    if device != "auto":
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise SelectionError("--device cuda: torch sees no GPU on this machine")
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def matrix_summary(matrix_ops: dict[str, int]) -> str:
    """``{'v_mfma_f32_16x16x32_bf16': 64}`` -> ``'v_mfma_f32_16x16x32_bf16 x 64'``."""
    return ", ".join(f"{k} x {v}" for k, v in sorted(matrix_ops.items())) if matrix_ops else ""


def _err_text(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def _jsonable(v: Any) -> Any:
    """Configs may hold dtypes or tuples: keep the JSON and the rows the same data."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)  # JSON has no inf/nan
    return str(v)


def _flush_l2(buf) -> None:
    buf.zero_()  # evicts the inputs, so each rep reads from HBM (as triton's do_bench does)


def median_times_ms(
    thunks: Sequence[Callable[[], Any]], *, reps: int = 50, warmup: int = 10, flush: bool = True
) -> list[float]:
    """Median CUDA-event time (ms) of each thunk, interleaved rep by rep so clock drift
    hits all of them alike; the L2 is flushed before each timed launch (``flush``)."""
    import torch

    buf = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if flush else None
    for f in thunks:
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    events = [
        [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        for _ in thunks
    ]
    for r in range(reps):
        for f, ev in zip(thunks, events):
            if buf is not None:
                _flush_l2(buf)
            ev[r][0].record()
            f()
            ev[r][1].record()
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in ev) for ev in events]


#: a timed case this far behind ATen (its speedup below) also gets ``kernel_us``
SLOW_CASE = 0.8


def kernel_time_ms(fn: Callable[[], Any], reps: int = 20) -> float | None:
    """GPU kernel time (ms) per call of ``fn``: torch.profiler's CUDA activity, every kernel
    the call launches (ours and ATen's), so that a wall time above it is the host's share;
    None where the profiler gives no device times."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = sum(getattr(e, "device_time_total", 0.0) for e in prof.key_averages())  # us
    return total / reps / 1e3 if total > 0 else None


def _blank_row(family, kernel, shape, config, notes, target, device, check) -> dict[str, Any]:
    return {
        "family": family,
        "kernel": kernel,
        "shape": shape,
        "key": f"{family}/{kernel}/{shape}",
        "config": _jsonable(config),
        "notes": notes,
        "target": target,
        "check_device": device if check else None,
        "vgpr": None,
        "agpr": None,
        "sgpr": None,
        "scratch_bytes": None,
        "lds_bytes": None,
        "occupancy": None,
        "occupancy_max": None,
        "occupancy_limiter": None,
        "instruction_count": None,
        "load_width_bits": None,
        "store_width_bits": None,
        "matrix_ops": {},
        "matrix": "",
        "loop_per_mfma": None,
        "check_error": None,
        "ok": None,
        "ours_us": None,
        "kernel_us": None,  # timed cases behind ATen (speedup < SLOW_CASE): kernels' GPU time
        "aten_us": None,
        "baseline": None,
        "speedup": None,
        "emulated": None,
        "flops": None,
        "bytes": None,
        "tflops": None,
        "gbps": None,
        "hbm_pct": None,
        "error": None,
        "resources": None,
    }


def _fill_resources(row: dict, report) -> None:
    d = report.to_dict()
    row["resources"] = _jsonable(d)
    for k in (
        "vgpr",
        "agpr",
        "sgpr",
        "scratch_bytes",
        "lds_bytes",
        "occupancy",
        "occupancy_max",
        "occupancy_limiter",
        "instruction_count",
    ):
        row[k] = d.get(k)
    row["load_width_bits"] = max(d["load_widths_bits"], default=None)
    row["store_width_bits"] = max(d["store_widths_bits"], default=None)
    row["matrix_ops"] = dict(d["matrix_ops"])
    row["matrix"] = matrix_summary(d["matrix_ops"])
    per = report.loop_per_mfma
    row["loop_per_mfma"] = None if per is None else [round(per[0], 2), round(per[1], 2)]


def _fmt_loop(per) -> str:
    """``[8.78, 15.75]`` -> ``'8.78 / 15.75'`` (main / worst loop); one figure when they agree."""
    if not per:
        return "-"
    main, worst = per
    return f"{main:.2f}" if worst == main else f"{main:.2f} / {worst:.2f}"


def resource_problems(report, target) -> list[str]:
    """What makes a compiled kernel unshippable on ``target``: scratch (AMD private segment /
    NVIDIA stack frame), spills, or more LDS / shared memory than one workgroup may have."""
    from flydsl_core.targets import get_target

    d = report.to_dict() if hasattr(report, "to_dict") else report
    out = []
    if d.get("scratch_bytes"):
        out.append(f"scratch {d['scratch_bytes']} B")
    spills = [
        f"{d[k]} {k.removesuffix('_count').replace('_', ' ')}"
        for k in ("vgpr_spill_count", "sgpr_spill_count", "spill_store_bytes")
        if d.get(k)
    ]
    out += [f"spills ({', '.join(spills)})"] if spills else []
    tg = get_target(target)
    limit = tg.lds_bytes_per_block or tg.lds_bytes_per_cu
    if limit and (d.get("lds_bytes") or 0) > limit:
        out.append(f"LDS {d['lds_bytes']} B over the {limit} B a workgroup may use")
    return out


def _accepts_target(fn) -> bool:
    import inspect

    try:
        return "target" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _guarded(fn, row: dict, phase: str):
    """``fn()`` with guard buffers around the library's allocations; a changed guard byte
    fails the row (an out-of-bounds write)."""
    from .guards import GuardedAllocations

    with GuardedAllocations() as g:
        out = fn()
    bad = g.violations()
    if bad:
        text = "; ".join(map(str, bad[:3])) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        row["error"] = (row["error"] + "; " if row["error"] else "") + f"{phase} canary: {text}"
        row["ok"] = False
    return out


def _peak_hbm_tb_s(device: str) -> float | None:
    """The peak memory bandwidth of the check device's target (None on the CPU)."""
    if device in ("cpu", "cpu-reference", "cpu-interpret"):
        return None
    from flydsl_core.targets import resolve_target

    try:
        return resolve_target().peak.hbm_tb_s
    except Exception:
        return None


def _add_error(row: dict, phase: str, e: BaseException) -> None:
    log.debug("%s of %s raised:\n%s", phase, row["key"], "".join(traceback.format_exception(e)))
    text = f"{phase}: {_err_text(e)}"
    row["error"] = text if not row["error"] else f"{row['error']}; {text}"
    row["ok"] = False


def _broken_row(family: str, e: BaseException, target, device, check) -> dict[str, Any]:
    """The row standing for a family whose ``cases()`` raised."""
    row = _blank_row(family, "?", "?", {}, "its cases could not be listed", target, device, check)
    _add_error(row, "cases()", e)
    return row


def collect(
    select: Sequence[str] | None = None,
    target: str = "gfx950",
    device: str = "auto",
    check: bool = True,
    progress: Callable[[str, int, int, str], None] | None = None,
    *,
    time_gpu: bool | None = None,
    reps: int = 50,
    guards: bool = True,
    shard: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """One row per selected case (see the module doc); never raises for a failing case.

    ``progress(phase, done, total, label)`` is called before each step of the
    ``compile``, ``check`` and ``time`` phases and once at the end of each
    (``done == total``). ``time_gpu`` (default: whether ``device`` is a GPU)
    times ours and ATen. ``guards`` runs checks (and one GPU run) with guard buffers.
    Raises ``SelectionError`` for a term that matches nothing.
    """
    device = resolve_device(device)
    cases, broken = select_cases(select)
    if shard is not None:  # every n-th case from i; broken families go with shard 0
        i, n = shard
        cases = cases[i::n]
        broken = [(name, e, 0) for name, e, _ in broken] if i == 0 else []
    rows = []
    for c in cases:
        try:
            cfg = c.config_for(target)
        except Exception as e:  # a target the family's table cannot serve: the row says so
            cfg = {}
            row = _blank_row(c.family, c.kernel, c.shape, cfg, c.notes, target, device, check)
            _add_error(row, "config", e)
            rows.append(row)
            continue
        rows.append(_blank_row(c.family, c.kernel, c.shape, cfg, c.notes, target, device, check))
    step = progress or (lambda *a: None)
    for case, row in zip(cases, rows):
        row["flops"], row["bytes"] = case.flops, case.bytes
        try:
            row["emulated"] = case.emulation(target)
        except Exception as e:
            _add_error(row, "emulated", e)
        if case.aten is not None:
            try:
                row["baseline"] = case.baseline(device) if case.baseline else "ATen"
            except Exception as e:
                _add_error(row, "baseline", e)

    # compile first (the slow, GPU-free part), so its progress bar is one phase
    for i, (case, row) in enumerate(zip(cases, rows)):
        step("compile", i, len(cases), row["key"])
        try:
            ck = case.compile(target)
            report = getattr(getattr(ck, "executable", None), "report", None)
            if report is None:
                row["error"] = f"{target} produces no resource report"
                log.info("%s: %s", row["key"], row["error"])
            else:
                _fill_resources(row, report)
                problems = resource_problems(report, target)
                if problems:
                    row["error"] = "resources: " + ", ".join(problems)
                    row["ok"] = False
        except Exception as e:
            _add_error(row, "compile", e)
    step("compile", len(cases), len(cases), "")

    if check:
        for i, (case, row) in enumerate(zip(cases, rows)):
            step("check", i, len(cases), row["key"])
            try:
                kw = {"target": target} if _accepts_target(case.check) else {}
                fn = lambda case=case, kw=kw: case.check(device, **kw)  # noqa: E731
                err = float(_guarded(fn, row, "check") if guards else fn())
                row["check_error"] = err
                # NaN fails too: `err <= 1` is False for it
                row["ok"] = (row["ok"] is not False) and err <= 1.0
            except Exception as e:
                _add_error(row, "check", e)
        step("check", len(cases), len(cases), "")

    if time_gpu is None:
        from ._target import check_target

        time_gpu = check_target(device) is None
    if time_gpu:
        timed = [(c, r) for c, r in zip(cases, rows) if c.run is not None]
        peak = _peak_hbm_tb_s(device)
        for i, (case, row) in enumerate(timed):
            step("time", i, len(timed), row["key"])
            try:
                thunks = [case.run(device)]
                if guards:  # one launch at the timed size, guarded (the check may be smaller)
                    _guarded(thunks[0], row, "run")
                if case.aten is not None:
                    thunks.append(case.aten(device))
                ms = median_times_ms(thunks, reps=reps)
                row["ours_us"] = ms[0] * 1e3
                if ms[0] > 0 and row["flops"]:
                    row["tflops"] = row["flops"] / (ms[0] * 1e-3) / 1e12
                if ms[0] > 0 and row["bytes"]:
                    row["gbps"] = row["bytes"] / (ms[0] * 1e-3) / 1e9
                    if peak:
                        row["hbm_pct"] = 100 * row["gbps"] / (peak * 1e3)
                if len(ms) > 1:
                    row["aten_us"] = ms[1] * 1e3
                    row["speedup"] = ms[1] / ms[0] if ms[0] > 0 else None
                if row["speedup"] is not None and row["speedup"] < SLOW_CASE:
                    # behind ATen: our kernels' own GPU time tells the host's share apart (the
                    # H200's 16x4096x4096 GEMM took 115 us, and nothing said whose)
                    k = kernel_time_ms(thunks[0], 10)
                    row["kernel_us"] = None if k is None else k * 1e3
            except Exception as e:
                _add_error(row, "time", e)
        step("time", len(timed), len(timed), "")
    for n, e, pos in reversed(broken):  # in family order, where the family's cases would be
        rows.insert(pos, _broken_row(n, e, target, device, check))
    for row in rows:
        for k in ("check_error", "speedup", "ours_us", "kernel_us", "aten_us", "tflops", "gbps",
                  "hbm_pct"):  # fmt: skip
            row[k] = _jsonable(row[k])
    return rows


def failed(rows: Iterable[dict]) -> list[dict]:
    """Rows that make the exit status nonzero: an exception, or a check above tolerance."""
    return [r for r in rows if r["error"] or r["ok"] is False]


def _fmt(v, unit: str = "") -> str:
    return "-" if v is None else f"{v}{unit}"


def _fmt_config(cfg) -> str:
    """``{'BLOCK': 8, 'kernels': [{...}]}`` -> ``'BLOCK=8 kernels=[...]'`` (nested configs too)."""
    if isinstance(cfg, dict):
        return " ".join(
            f"{k}=({_fmt_config(v)})" if isinstance(v, dict) else f"{k}={_fmt_config(v)}"
            for k, v in cfg.items()
        )
    if isinstance(cfg, list):
        return "[" + ", ".join(_fmt_config(v) for v in cfg) + "]"
    return str(cfg)


def render_table(rows: Sequence[dict], *, title: str | None = None):
    """A ``rich.table.Table`` of the rows; timing columns only where a row was timed."""
    from rich.markup import escape
    from rich.table import Table

    timed = any(r["ours_us"] is not None for r in rows)
    named = any(r.get("baseline") not in (None, "ATen") for r in rows)
    t = Table(title=title)
    cols = ["kernel", "shape", "config", "VGPR", "LDS", "scratch", "occupancy", "load"]
    cols += ["matrix instr", "loop/MFMA", "check err"]
    if named:
        cols += ["baseline"]
    if timed:
        cols += ["ours", "ATen", "speedup"]
    for c in cols:
        right = c in (
            "VGPR",
            "LDS",
            "scratch",
            "occupancy",
            "load",
            "loop/MFMA",
            "check err",
            "ours",
            "ATen",
        )
        t.add_column(c, justify="right" if right or c == "speedup" else "left", overflow="fold")
    for r in rows:
        occ = r["occupancy"]
        if occ is not None and r["occupancy_max"]:
            occ = f"{occ}/{r['occupancy_max']}"
        err = r["check_error"]
        if r["error"]:
            err_cell = f"[red]{escape(r['error'])}[/]"
        elif err is None:
            err_cell = "-" if r["check_device"] is None else "[yellow]?[/]"
        else:
            e = float(err)
            err_cell = f"[green]{e:.3g}[/]" if e <= 1.0 else f"[red]{e:.3g} FAIL[/]"
        row = [
            escape(f"{r['family']}/{r['kernel']}"),
            escape(r["shape"]),
            escape(_fmt_config(r["config"])),
            _fmt(r["vgpr"]),
            _fmt(r["lds_bytes"], " B"),
            _fmt(r["scratch_bytes"], " B"),
            _fmt(occ),
            _fmt(r["load_width_bits"], " b"),
            (escape(r["matrix"]) or "-") + (" [yellow](emulated)[/]" if r.get("emulated") else ""),
            _fmt_loop(r.get("loop_per_mfma")),
            err_cell,
        ]
        if named:
            row += [escape(r.get("baseline") or "-")]
        if timed:
            sp = r["speedup"]
            row += [
                "-" if r["ours_us"] is None else f"{r['ours_us']:.1f} us",
                "-" if r["aten_us"] is None else f"{r['aten_us']:.1f} us",
                "-" if sp is None else f"{sp:.2f}x",
            ]
        t.add_row(*row)
    return t


def _geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _console(stderr: bool = False):
    from rich.console import Console

    # wide enough for the table when output is piped (rich assumes 80 columns then)
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=200)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive int")
    return n


def _json_path(text: str) -> str:
    from pathlib import Path

    p = Path(text).expanduser()
    if p.is_dir() or not p.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a file in an existing directory")
    return text


def build_parser() -> argparse.ArgumentParser:
    from flydsl_core.cli import Parser, target_name

    p = Parser(
        prog="flydsl-kernels report",
        description="Compile every shipped kernel and default config, check it, and print "
        "its resources (and GPU times vs ATen where a GPU is present) in one table.",
        epilog="SELECT: a case is selected when its 'family/kernel/shape' contains a term "
        "(case-insensitive), e.g. 'topk', 'topk_small', 'rmsnorm/rmsnorm_fwd_row', "
        "'256x4096'; several terms select the union; none selects every case. "
        "Exit status: 0 all cases compiled and passed; 1 some case raised or its check "
        "error is above tolerance (> 1); 2 usage error (e.g. a term that matches nothing).",
    )
    p.add_argument("select", nargs="*", metavar="SELECT", help="cases to report (default: all)")
    p.add_argument(
        "--target",
        type=target_name,
        default=None,
        help="compile target, a name or alias (default: $FLYDSL_TARGET, else gfx950)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cpu-interpret", "cuda"],
        help="where checks run: auto = cuda if a GPU is present, else cpu (reference backend)",
    )
    p.add_argument(
        "--json", metavar="PATH", type=_json_path, help="also write the rows as JSON to PATH"
    )
    p.add_argument("--no-check", action="store_true", help="compile and report resources only")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("--reps", type=_positive, default=50, help="timed reps per case on a GPU")
    p.add_argument("--no-time", action="store_true", help="no GPU timing (compile and check)")
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="only every N-th selected case, starting at I (0-based): N processes warm the "
        "compile cache in parallel",
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v info, -vv debug")
    return p


def _shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise SelectionError(f"--shard takes I/N (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise SelectionError(f"--shard {text}: I must be in 0..N-1")
    return i, n


def _versions() -> dict:
    import torch

    try:
        import triton

        tv = triton.__version__
    except ImportError:
        tv = None
    return {"torch": torch.__version__, "triton": tv}


def _list(select) -> int:
    from rich.markup import escape
    from rich.table import Table

    cases, broken = select_cases(select)
    t = Table(title="shipped report cases")
    for c in ("family", "kernel", "shape", "notes"):
        t.add_column(c, overflow="fold")
    cells = [list(map(escape, (c.family, c.kernel, c.shape, c.notes))) for c in cases]
    for n, e, pos in reversed(broken):
        cells.insert(pos, [escape(n), "?", "?", f"[red]cases() raised {escape(_err_text(e))}[/]"])
    for row in cells:
        t.add_row(*row)
    _console().print(t)
    return 1 if broken else 0


def _collect_with_bar(args, device: str) -> list[dict[str, Any]]:
    """``collect`` under a progress bar on stderr (stdout keeps only the table)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    verbs = {
        "compile": f"compiling for {args.target}",
        "check": f"checking on {device}",
        "time": "timing vs ATen",
    }
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[label]}"),
        console=_console(stderr=True),
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase, done, total, label):
            if phase not in tasks:
                tasks[phase] = bar.add_task(verbs.get(phase, phase), total=total, label="")
            bar.update(tasks[phase], completed=done, label=label)

        return collect(
            args.select,
            target=args.target,
            device=device,
            check=not args.no_check,
            progress=progress,
            reps=args.reps,
            time_gpu=False if args.no_time else None,
            shard=_shard(args.shard),
        )


def target_name_from_env() -> str:
    """``$FLYDSL_TARGET``'s canonical name (an unknown one names the variable)."""
    from flydsl_core.targets import resolve_target

    return resolve_target().name


def run_model(argv: Sequence[str]) -> int:
    """``flydsl-kernels model FAMILY [ARGS]``: a family's static model (``<family>.model.main``),
    the offline ranking its tables came from. One entry point, so that the model modules need
    no ``python -m``: each family's package imports its model, and runpy warns when a module
    it runs is already imported."""
    import importlib

    from flydsl_core.cli import usage_error

    from . import FAMILIES

    prog = "flydsl-kernels model"
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {prog} {{{','.join(FAMILIES)}}} [ARGS ...]")
        print("Rank a family's configs with its static model (ARGS: `model FAMILY --help`).")
        return 0 if argv else 2
    if argv[0] not in FAMILIES:
        return usage_error(prog, f"unknown family {argv[0]!r}; use one of {', '.join(FAMILIES)}")
    mod = importlib.import_module(f"{__package__}.{argv[0]}.model")
    try:
        mod.main(list(argv[1:]))
    except SystemExit as e:  # argparse's --help and usage errors, --check-tables' status
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["model"]:
        return run_model(argv[1:])
    if argv[:1] == ["report"]:  # `flydsl-kernels report ...`; the subcommand word is optional
        argv = argv[1:]
    from flydsl_core import settings
    from flydsl_core.cli import usage_error
    from flydsl_core.exc import SettingsError, UnknownTargetError

    parser = build_parser()
    args = parser.parse(argv)
    if args is None:
        return 2
    try:
        settings.check_all()  # a bad FLYDSL_* value is a one-line usage error
        if args.target is None:
            env = settings.get("FLYDSL_TARGET")
            args.target = "gfx950" if env is None else target_name_from_env()
    except (SettingsError, UnknownTargetError) as e:
        return usage_error(parser.prog, e.msg)
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.list:
            return _list(args.select)
        device = resolve_device(args.device)
        select_cases(args.select)  # a bad selection raises before the progress bar starts
        rows = _collect_with_bar(args, device)
    except SelectionError as e:
        return usage_error(parser.prog, str(e))

    import torch

    gpu = torch.cuda.is_available()
    gpu_name = torch.cuda.get_device_name() if gpu else None
    where = f"checked on {device}" if not args.no_check else "not checked"
    timed = any(r["ours_us"] is not None for r in rows)
    title = f"FlyDSL kernels for {args.target} ({where}; " + (
        f"times on {gpu_name})" if timed else "no GPU timing)"
    )
    out = _console()
    out.print(render_table(rows, title=title))
    bad = failed(rows)
    geo = _geomean([r["speedup"] for r in rows if r["speedup"] is not None])
    summary = f"{len(rows)} cases, {len(bad)} failed"
    if geo is not None:
        summary += f"; geomean speedup vs ATen {geo:.2f}x"
    out.print(summary, highlight=False)
    if args.json:
        from pathlib import Path

        doc = {"target": args.target, "device": device, "gpu": gpu, "gpu_name": gpu_name}
        doc.update(_versions(), peak_hbm_tb_s=_peak_hbm_tb_s(device), rows=rows)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        log.info("wrote %d rows to %s", len(rows), args.json)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
