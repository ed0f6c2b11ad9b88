"""One prepared GPU run: everything worth measuring on a GPU, in one command, within a budget.

    python tools/gpu_run.py --out DIR [--device cuda|cpu] [--budget 510] [--pack]

``tools/gpu_run.sh`` is the entry point (it picks the interpreter and sets the import path);
docs/gpu-results.md says how to run it on the lent H200 and where its figures go.

Parts, in order, each a subprocess with its own time limit (the rest of the budget caps it);
a failing or timed-out part is recorded and the run goes on:

1. ``env``: GPU name, arch, driver, compute capability, memory, torch / triton / Python
   versions, the commit; ``nvidia-smi`` where present (``env.json``);
2. ``warm``: the report's compile and check phases split over parallel processes
   (``flydsl-kernels report --shard I/N --no-time``), which fills the on-disk compile cache
   so that later parts only load code objects (``warm-I.json``: correctness and resources
   per case already);
3. ``report``: ``flydsl-kernels report --device cuda --json`` for every case: resources,
   correctness at the case's shape with guard buffers after every output, times and speedups
   against ATen / cuBLAS, achieved TFLOP/s and GB/s (``report.json``);
4. ``attention``: ``tools/bench_attention.py`` at its default GPU shapes (prefill forward and
   backward B4 S4096 H32/8 and H64/8 D128, causal and not; paged decode, batch 1 to 256,
   context 1k to 128k) against ``F.scaled_dot_product_attention``, each output checked first
   (``attention.json``, rewritten after every row, so a part stopped at its limit keeps the
   rows it finished);
5. ``pytest``: ``pytest -m gpu`` with a JUnit XML (``junit.xml``);
6. ``launch``: launch overhead on the real driver, ours vs Triton's ``@triton.jit`` launch of
   the same generated kernel vs ATen, in one process (``launch.json``); ``host``: each API
   call's host work with the kernels stubbed, on this machine's CPU (``host.json``);
7. ``ops``, ``gemm``, ``dispatch``: the benchmarks under tools/ with their JSON;
8. ``tune`` (only when ``--only`` names it): ``tools/tune_attention.py``, the timed sweep of
   the attention configs against the shipped table (``tune.json``);
9. ``summary``: ``summary.md`` with the headline figures, each issue goal met / not met, and
   ``plots.png`` (speedup per case, % of HBM bandwidth of the memory-bound cases, % of cuBLAS
   of the GEMMs), made by ``tools/gpu_summary.py``.

``--device cpu`` is the dry run: the same parts on the CPU with small shapes (a few report
cases, the benchmarks' quick subsets), producing the same files, so the pipeline is known to
work before a GPU is ever lent. ``--pack`` (the default when DIR is ``$OUT``) leaves only
``summary.md``, ``plots.png``, ``report.json`` and ``gpu-run.tar.gz`` (everything) in DIR:
the device tool brings back at most 8 files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
sys.path.insert(0, str(TOOLS))  # the sibling tools import as modules (gpu_summary)
from gpu_summary import load_json, write_summary  # noqa: E402

#: report cases of the dry run: one quick case per family, covering rows / row / GEMM / MX
DRY_SELECT = [
    "rmsnorm_fwd_rows/65536x128",
    "topk_small/256x1024",
    "mx_quantize/32x4096 bf16 -> mxfp8",
]
#: seconds a part stopped at its limit gets between SIGINT and SIGKILL
GRACE_S = 8.0
#: the parts, in order (``--only`` runs a subset); ``tune`` only when named
PARTS = (
    "env", "warm", "report", "attention", "pytest", "launch", "host", "ops", "gemm", "dispatch",
    "tune",
)  # fmt: skip
DEFAULT_PARTS = PARTS[:-1]
#: files left in DIR by --pack (all the rest goes into gpu-run.tar.gz)
KEEP = ("summary.md", "plots.png", "report.json", "attention.json", "tune.json", "gpu-run.tar.gz")


def _in_process(argv: list[str], log: Path):
    """Run an entry point's ``main(args)`` here, output to ``log``; returns its exit code."""
    import contextlib
    import importlib
    import importlib.util

    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            if argv[0] == "-m" and argv[1] == "pytest":
                import pytest

                return int(pytest.main(argv[2:]))
            if argv[0] == "-m":
                main, args = importlib.import_module(argv[1]).main, argv[2:]
            else:
                spec = importlib.util.spec_from_file_location(Path(argv[0]).stem, argv[0])
                mod = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = mod
                spec.loader.exec_module(mod)
                main, args = mod.main, argv[1:]
            rc = main(args)
            return 0 if rc is None else int(rc)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:
            import traceback

            traceback.print_exc()
            return 1


class Run:
    def __init__(self, out: Path, budget: float, device: str, in_process: bool = False, only=PARTS):
        self.out, self.budget, self.device = out, budget, device
        self.only = {"env", *only}  # env always: the other parts read its target
        self.in_process = in_process
        self.t0 = time.monotonic()
        self.parts: list[dict] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env.setdefault("FLYDSL_CACHE_DIR", str(out / ".flydsl-cache"))
        self.env.setdefault("TRITON_CACHE_DIR", str(out / ".triton-cache"))

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def part(self, name: str, cmds, limit: float, reserve: float = 20.0) -> bool:
        """Run ``cmds`` (one argv, or several run concurrently) with the log in ``name.log``.

        An argv is ``[python, script or -m module, args...]``; with ``in_process`` the same
        entry point's ``main(args)`` runs in this process (no interpreter start per part: the
        dry run's test), one after another and without a time limit."""
        cmds = cmds if cmds and isinstance(cmds[0], list) else [cmds]
        if name not in self.only:
            self.parts.append({"part": name, "status": "not run", "reason": "--only"})
            return False
        limit = min(limit, self.left() - reserve)
        rec = {"part": name, "limit_s": round(limit, 1), "commands": [" ".join(c) for c in cmds]}
        if limit < 5:
            rec.update(status="skipped", reason="the budget is spent")
            print(f"[{self._clock()}] {name}: skipped (budget spent)", flush=True)
            self.parts.append(rec)
            return False
        print(f"[{self._clock()}] {name}: {len(cmds)} command(s), limit {limit:.0f} s", flush=True)
        t = time.monotonic()
        logs = [
            self.out / (f"{name}.log" if len(cmds) == 1 else f"{name}-{i}.log")
            for i in range(len(cmds))
        ]
        if self.in_process:
            codes = [_in_process(c[1:], log) for c, log in zip(cmds, logs)]
        else:
            codes = self._subprocesses(cmds, logs, limit, t)
        dt = time.monotonic() - t
        ok = all(c == 0 for c in codes)
        status = "ok" if ok else ("timeout" if "timeout" in codes else "failed")
        rec.update(status=status, exit_codes=codes, seconds=round(dt, 1))
        self.parts.append(rec)
        print(f"[{self._clock()}] {name}: {status} in {dt:.1f} s {codes}", flush=True)
        return ok

    def _subprocesses(self, cmds, logs, limit, t):
        procs = []
        for c, path in zip(cmds, logs):
            log = open(path, "w")  # noqa: SIM115 (closed after the wait below)
            procs.append(
                (
                    subprocess.Popen(
                        c,
                        cwd=ROOT,
                        env=self.env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),
                    log,
                )
            )
        codes = []
        for p, log in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, limit - (time.monotonic() - t))))
            except subprocess.TimeoutExpired:
                # SIGINT first: pytest then writes its JUnit XML and its summary of failures,
                # and a benchmark its last lines; the kill after a grace period is certain
                os.killpg(p.pid, signal.SIGINT)  # the part's own process group, nothing else
                try:
                    p.wait(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                codes.append("timeout")
            log.close()
        return codes

    def _clock(self) -> str:
        return f"{time.monotonic() - self.t0:6.1f} s"


def env_facts(out: Path, device: str) -> dict:
    """Facts of this machine and checkout (written by the ``env`` part, in a subprocess)."""
    import platform

    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "device": device}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError as e:
        facts["triton"] = f"not importable: {e}"
    try:
        facts["commit"] = (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        facts["commit"] = None
    if (ROOT / "COMMIT").exists():  # written just before the run: a copy's .git can be stale
        facts["commit"] = (ROOT / "COMMIT").read_text().strip() or facts["commit"]
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=p.name,
            capability=list(torch.cuda.get_device_capability(0)),
            multiprocessors=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            hip=getattr(torch.version, "hip", None),
        )
        from flydsl_core.targets import resolve_target

        t = resolve_target()
        facts.update(
            target=t.name, peak_hbm_tb_s=t.peak.hbm_tb_s, peak_bf16_tflops=t.peak.bf16_tflops
        )
        if shutil.which("nvidia-smi"):
            q = "name,driver_version,clocks.sm,clocks.mem,power.limit,temperature.gpu"
            r = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            facts["nvidia_smi"] = r.stdout.strip()
            facts["driver"] = (
                r.stdout.strip().splitlines()[-1].split(",")[1].strip()
                if r.returncode == 0
                else None
            )
    else:
        facts.update(gpu=None, target="cpu-reference", driver=None)
    (out / "env.json").write_text(json.dumps(facts, indent=2) + "\n")
    return facts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="output folder (default $OUT)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--budget", type=float, default=None, help="seconds (default 510; dry run 300)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel warm-up processes")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run every part's entry point in this process (no interpreter start per part, no "
        "time limits): the dry run's test",
    )
    ap.add_argument(
        "--only",
        type=lambda t: t.split(","),
        default=list(DEFAULT_PARTS),
        help=f"comma-separated parts to run (default {','.join(DEFAULT_PARTS)}; also: tune, "
        "tools/tune_attention.py's timed sweep of the attention configs)",
    )
    ap.add_argument(
        "--select",
        nargs="+",
        default=None,
        metavar="TERM",
        help="report cases to warm and time (flydsl-kernels report's SELECT; default all)",
    )
    ap.add_argument(
        "--attention-mode",
        choices=["fwd", "bwd", "decode", "all"],
        default="all",
        help="bench_attention's --mode",
    )
    ap.add_argument(
        "--tune-dclass",
        default="d128",
        help="the tune part's head-dim classes (tune_attention's --dclass; e.g. d128,d256)",
    )
    ap.add_argument("--env-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.out:
        ap.error("give --out DIR (or set $OUT)")
    bad = [p for p in args.only if p not in PARTS]
    if bad:
        ap.error(f"--only: unknown part(s) {bad}; the parts are {', '.join(PARTS)}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = args.device
    if args.env_only:
        env_facts(out, device)
        return 0
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    dry = device == "cpu"
    budget = args.budget or (300.0 if dry else 510.0)
    pack = (
        args.pack
        if args.pack is not None
        else (os.environ.get("OUT") and Path(os.environ["OUT"]).resolve() == out)
    )
    run = Run(out, budget, device, in_process=args.in_process, only=args.only)
    if args.in_process:  # the parts read these at call time; a subprocess gets them as env
        os.environ.setdefault("FLYDSL_CACHE_DIR", run.env["FLYDSL_CACHE_DIR"])
    py = sys.executable
    print(
        f"FlyDSL GPU run on {device} -> {out} (budget {budget:.0f} s{', dry run' if dry else ''})",
        flush=True,
    )

    run.part(
        "env",
        [py, str(TOOLS / "gpu_run.py"), "--out", str(out), "--device", device, "--env-only"],
        60,
    )

    facts = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    target = facts.get("target") if not dry else "sm90"
    if not target or target.startswith("cpu"):
        target = "sm90"
    report = [py, "-m", "flydsl_kernels.report", "--target", target, "--device", device]
    select = DRY_SELECT if dry else (args.select or [])
    jobs = args.jobs or (2 if dry else min(12, max(2, (os.cpu_count() or 4) - 2)))
    # 2. warm the compile cache: the report's compile, check and one timed run of each case (the
    # run's specializations differ from the check's: bf16 outputs, full shapes) over parallel
    # shards, so that the report and the tests load every code object from the disk cache. The
    # checks' results are these (the report merges them); their times, shared GPU, are not
    run.part(
        "warm",
        [
            [
                *report,
                *select,
                *(["--no-time"] if dry else ["--reps", "1"]),
                "--shard",
                f"{i}/{jobs}",
                "--json",
                str(out / f"warm-{i}.json"),
            ]
            for i in range(jobs)
        ],
        limit=60 if dry else 170,
    )
    # 3. the report with times and speedups, one process alone on the GPU (cache hits now). On
    # the GPU it does not check again (the full-shape checks with their float64 references
    # took the whole part on the first H200 run): the warm part's check results go in
    checks = [] if dry else ["--no-check"]
    if run.part("report", [*report, *select, *checks, "--json", str(out / "report.json")],
                60 if dry else 150) or not dry:  # fmt: skip
        merge_checks(out, jobs)
    # 4. attention against SDPA (issue 23), before the GPU tier: its prefill and decode kernels
    # are the report's (cache hits after warm), and its figures are the ones asked for. The dry
    # run takes the quick subset of small shapes
    run.part(
        "attention",
        [
            py,
            str(TOOLS / "bench_attention.py"),
            "--device",
            device,
            "--mode",
            args.attention_mode,
            *(["--quick", "--reps", "1"] if dry else ["--reps", "10"]),
            "--json",
            str(out / "attention.json"),
        ],
        45 if dry else 120,
    )
    # 5. the GPU tier
    pyt = [
        py,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={out / 'junit.xml'}",
    ]
    pyt += [
        "-o",
        "addopts=--strict-markers --import-mode=importlib -ra",
        "--continue-on-collection-errors",
    ]
    if dry:  # the dry run collects the GPU tier's own modules only (the rest is CI's)
        pyt += [str(ROOT / "tests" / "gpu")]
    else:
        import importlib.util

        if importlib.util.find_spec("xdist") is not None:  # the stress tests compile new shapes
            pyt += ["-n", str(min(8, jobs))]
        if importlib.util.find_spec("expecttest") is None:  # torch's OpInfo samples need it
            pyt += [f"--ignore={ROOT / 'tests' / 'torch_flydsl' / 'test_opinfo.py'}"]
    run.part("pytest", pyt, 60 if dry else 150)  # 155 of ~160 ran in 120 s (run 4)
    # 6. launch overhead on the real driver (the no-op device call on the CPU)
    calls = ["--calls", "300", "--rounds", "3"] if dry else ["--calls", "2000", "--rounds", "11"]
    run.part(
        "launch",
        [
            py,
            str(TOOLS / "bench_launch.py"),
            "--device",
            device,
            *calls,
            "--json",
            str(out / "launch.json"),
        ],
        40,
    )
    # the APIs' host work with the kernels stubbed, on this machine's CPU: the share of a
    # small call's time on this GPU that is Python
    hcalls = ["--calls", "3", "--rounds", "1"] if dry else ["--calls", "100", "--rounds", "5"]
    run.part(
        "host",
        [py, str(TOOLS / "bench_host.py"), *hcalls, "--json", str(out / "host.json")],
        30,
    )
    # 7. the benchmarks
    quick = ["--quick", "--reps", "1"] if dry else []
    small = ["--max-n", "8192"] if dry else []  # the CPU's radix rows take seconds a call
    run.part(
        "ops",
        [
            py,
            str(TOOLS / "bench_ops.py"),
            "--device",
            device,
            *quick,
            *small,
            "--json",
            str(out / "ops.json"),
        ],
        40 if dry else 45,
    )
    run.part(
        "gemm",
        [
            py,
            str(TOOLS / "bench_gemm.py"),
            "--device",
            device,
            *quick,
            "--json",
            str(out / "gemm.json"),
        ],
        60 if dry else 90,  # the H200's run 4 cut it at 45 s, three model shapes short
    )
    disp = ["--rounds", "3", "--calls", "200"] if dry else ["--rounds", "11", "--calls", "1000"]
    run.part(
        "dispatch",
        [py, str(TOOLS / "bench_dispatch.py"), *disp, "--json", str(out / "dispatch.json")],
        30,
    )
    # 8. (named only) the timed sweep of the attention configs, compiled in `jobs` processes
    tune = ["--limit", "2", "--jobs", "2"] if dry else ["--jobs", str(jobs)]
    tune += ["--dclass", args.tune_dclass]
    run.part(
        "tune",
        [py, str(TOOLS / "tune_attention.py"), "--device", device, *tune,
         "--json", str(out / "tune.json")],
        60 if dry else 400,
    )  # fmt: skip
    (out / "parts.json").write_text(
        json.dumps({"device": device, "budget_s": budget, "parts": run.parts}, indent=2) + "\n"
    )
    # 9. the summary (in-process: it must run whatever happened before)
    t = time.monotonic()
    try:
        write_summary(out)
        status = "ok"
    except Exception as e:  # the summary of a broken run still says what broke
        (out / "summary.md").write_text(f"# FlyDSL GPU run\n\nthe summary failed: {e!r}\n")
        status = "failed"
    run.parts.append(
        {"part": "summary", "status": status, "seconds": round(time.monotonic() - t, 1)}
    )
    (out / "parts.json").write_text(
        json.dumps({"device": device, "budget_s": budget, "parts": run.parts}, indent=2) + "\n"
    )
    print(f"[{run._clock()}] summary: {status}", flush=True)
    if pack:
        _pack(out)
    print((out / "summary.md").read_text(), flush=True)
    return 0 if all(p["status"] in ("ok", "not run") for p in run.parts) else 1


def merge_checks(out: Path, jobs: int) -> None:
    """report.json with the warm part's check results (``check_error``, ``ok``, a check's
    error) by case key; a case the warm part reached and the report did not is added as the
    warm part left it. Without report.json (the part stopped) the warm rows are the report."""
    warm = {}
    for i in range(jobs):
        doc = load_json(out / f"warm-{i}.json")
        for r in (doc or {}).get("rows", []):
            warm[r["key"]] = (r, doc)
    if not warm:
        return
    rep = load_json(out / "report.json")
    if rep is None:
        first = next(iter(warm.values()))[1]
        rep = {k: v for k, v in first.items() if k != "rows"}
        rep["rows"] = []
        rep["checks_from"] = "warm (the report part wrote nothing)"
    seen = set()
    for r in rep["rows"]:
        seen.add(r["key"])
        w = warm.get(r["key"], (None,))[0]
        if w is None or w.get("check_device") is None:
            continue
        r["check_device"], r["check_error"], r["ok"] = w["check_device"], w["check_error"], w["ok"]
        if w.get("error") and not r.get("error"):
            r["error"] = w["error"]
    # the warm part's own times ran beside other shards on one GPU: not figures
    timed = ("ours_us", "aten_us", "speedup", "tflops", "gbps", "hbm_pct")
    rep["rows"] += [{**w, **dict.fromkeys(timed)} for k, (w, _) in warm.items() if k not in seen]
    (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")


def _pack(out: Path) -> None:
    """Everything into gpu-run.tar.gz; only KEEP stays beside it (the 8-file limit)."""
    for cache in (".flydsl-cache", ".triton-cache"):
        shutil.rmtree(out / cache, ignore_errors=True)
    with tarfile.open(out / "gpu-run.tar.gz", "w:gz") as tar:
        for p in sorted(out.iterdir()):
            if p.name != "gpu-run.tar.gz":
                tar.add(p, arcname=p.name)
    for p in out.iterdir():
        if p.name not in KEEP:
            shutil.rmtree(p) if p.is_dir() else p.unlink()


if __name__ == "__main__":
    sys.exit(main())
