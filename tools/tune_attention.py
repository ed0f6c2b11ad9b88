"""Time the attention config space on a GPU: the sweep the static model cannot make.

    uv run python tools/tune_attention.py [--kind fwd,bwd_dkdv,bwd_dq,decode] [--dclass d128,...]
                                          [--stages 1,2,3,4] [--limit N] [--reps R] [--jobs J]
                                          [--device auto|cpu|cuda] [--json PATH]

The shipped tables of a GPU we have never timed on (sm90's, against the H200 figures of
docs/gpu-results.md: forward 0.63-0.70x SDPA, backward 0.41-0.48x) were picked by the static
model from cross-compiled code. This tool times each candidate tile at the model's problem
(``attention.model.model_problem``: B4 S4096 H32/8 causal for prefill, B64 ctx8192 H32/8 page
64 for decode) through the public API with ``config=``, against the shipped entry:

* candidates: the model's tiles (``model.TILES``) x ``--stages``, deduplicated by what the
  target compiles differently (NVIDIA: tile, warps, stages; AMD: the model's whole space);
* each candidate's resources compiled for the table's target at the model problem
  (``model.compile_config``: registers, spill and scratch bytes, shared memory): a spilling
  tile is timed and shown but is not a table entry (issue 23: no spills on any shipped
  target), so each kind prints its fastest and its fastest without spills;
* every candidate's output (and gradient) is compared with the shipped entry's first: one over
  ``2e-2`` (bf16) is reported and never ranked; a candidate that fails to compile or spills
  is skipped with its reason;
* times: CUDA events, L2 flushed, median of ``--reps`` (``report.median_times_ms``), one
  candidate at a time; ``--jobs J`` first compiles them in J processes (each runs its share
  once, through the same calls, so the timing process only loads code objects from the disk
  cache: a compile is seconds, a timing a fraction of one).

It prints a table per kind (best first, the shipped entry marked) and the table line the
best would be, and writes every row as JSON. On the CPU it runs a tiny problem on the
reference backend: a dry run of the tool, not a measurement (figures labelled CPU).

Exit status: 0, or 1 when a kind has no candidate that ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import replace

import torch
from rich.console import Console
from rich.table import Table

from flydsl_kernels.attention import configs, flash_attn_func, flash_attn_with_kvcache, model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling tools
from bench_attention import median_s  # one timer for the benchmark and the sweep

KINDS = ("fwd", "bwd_dkdv", "bwd_dq", "decode")
TOL = 2e-2


def _target(device: str) -> str:
    if device == "cpu":
        return "cpu-reference"
    from flydsl_core.targets import detected_arch_to_target_name, device_arch

    return detected_arch_to_target_name(device_arch()) or "sm90"


def candidates(kind: str, dcls: str, table_target: str, stages) -> list[configs.Config]:
    """The model's tiles x ``stages`` for ``table_target``, deduplicated by what it compiles
    differently; the shipped entry first."""
    shipped = configs.table(table_target)[(kind, dcls)]
    tiles = model.TILES["fwd_d256" if kind == "fwd" and dcls in ("d192", "d256") else kind]
    nvidia = table_target.startswith("sm")
    out, seen = [shipped], set()

    def key(c):
        return (c.BM, c.BN, c.num_warps, c.num_stages) if nvidia else c

    seen.add(key(shipped))
    for bm, bn, w in tiles:
        for ns in stages:
            c = replace(shipped, BM=bm, BN=bn, num_warps=w, num_stages=ns, notes={})
            if key(c) not in seen:
                seen.add(key(c))
                out.append(c)
    return out


def _problem(kind: str, dcls: str, cpu: bool):
    """``(batch, seqlen, heads, heads_k, d, dv)`` and the decode page: the model's problem on a
    GPU, a tiny one on the CPU."""
    b, s, d, dv = model.MODEL_SHAPES[dcls]
    if cpu:
        return (1, 40, 4, 2, 16, 16), 16
    if kind == "decode":
        return (64, 8192, 32, 8, d, dv), 64
    return (b, s, 32, 8, d, dv), 0


def _make(kind: str, dcls: str, device: str):
    """``(run(config) -> outputs, flops)`` of one kind at its problem on ``device``."""
    (b, s, h, hk, d, dv), page = _problem(kind, dcls, device == "cpu")
    g = torch.Generator(device=device).manual_seed(0)
    tgt = "cpu-reference" if device == "cpu" else None

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)

    if kind == "decode":
        pages = -(-s // page)
        q = rnd(b, 1, h, d)
        kc, vc = rnd(b * pages, page, hk, d), rnd(b * pages, page, hk, dv)
        perm = torch.randperm(b * pages, generator=g, device=device)
        table = perm.view(b, pages).to(torch.int32)
        lens = torch.randint(s // 2, s + 1, (b,), generator=g, device=device).to(torch.int32)
        flops = 4.0 * h * d * float(lens.sum())

        def run(cfg):
            return (
                flash_attn_with_kvcache(
                    q, kc, vc, cache_seqlens=lens, block_table=table, causal=True,
                    config=cfg, target=tgt,
                ),
            )  # fmt: skip

        return run, flops
    q, k, v = rnd(b, s, h, d), rnd(b, s, hk, d), rnd(b, s, hk, dv)
    flops = 4.0 * b * h * d * s * (s + 1) / 2
    if kind == "fwd":
        return (lambda cfg: (flash_attn_func(q, k, v, causal=True, config={"fwd": cfg},
                                             target=tgt),)), flops  # fmt: skip
    for t in (q, k, v):
        t.requires_grad_()
    do = rnd(b, s, h, dv)

    def run(cfg):
        out = flash_attn_func(q, k, v, causal=True, config={kind: cfg}, target=tgt)
        return torch.autograd.grad(out, (q, k, v), do)

    return run, flops * 2.5


def resources(kind: str, dcls: str, cfg, target: str) -> dict:
    """``cfg``'s registers, spill / scratch bytes and shared memory compiled for ``target`` at
    the model problem; ``clean`` where it neither spills nor uses scratch. The compile cache
    keeps it, so the ``--jobs`` workers' compile makes the timing process's a load."""
    try:
        ck = model.compile_config(kind, cfg, model.model_problem(kind, dcls), target)
    except Exception as e:  # the row says why; it is then no table entry either
        return {"clean": False, "compile_error": f"{type(e).__name__}: {str(e)[:160]}"}
    rep = ck.executable.report.to_dict()
    spill, scratch = rep.get("spill_store_bytes") or 0, rep.get("scratch_bytes") or 0
    return {
        "vgpr": rep.get("vgpr"),
        "spill_bytes": spill,
        "scratch_bytes": scratch,
        "lds_bytes": rep.get("lds_bytes"),
        "clean": not spill and not scratch,
    }


def _err(got, want) -> float:
    return max(
        float((a.float() - b.float()).abs().max() / (1 + b.float().abs().max()))
        for a, b in zip(got, want)
    )


def _table_target(device: str) -> str:
    return "sm90" if device == "cpu" else _target(device)


def _cands(kind, dcls, device, stages, limit):
    cands = candidates(kind, dcls, _table_target(device), stages)
    return cands[:limit] if limit else cands


def warm(kinds, dcls, device, stages, limit, shard) -> None:
    """Run every ``shard``-th candidate once (compiles into the disk cache); errors are the
    timing pass's to report."""
    i, n = shard
    for kind in kinds:
        run, _ = _make(kind, dcls, device)
        for j, cfg in enumerate(_cands(kind, dcls, device, stages, limit)):
            if j % n == i:
                resources(kind, dcls, cfg, _table_target(device))
                try:
                    run(cfg)
                except Exception:  # the timing pass reports it
                    continue


def tune(kind, dcls, device, stages, limit, reps, log=print) -> list[dict]:
    cands = _cands(kind, dcls, device, stages, limit)
    run, flops = _make(kind, dcls, device)
    want = run(cands[0])
    rows = []
    for i, cfg in enumerate(cands):
        row = {"kind": kind, "dclass": dcls, "shipped": i == 0, "config": cfg.as_dict()}
        row["resources"] = resources(kind, dcls, cfg, _table_target(device))
        try:
            got = run(cfg)  # compiles on first use
            row["err"] = _err(got, want)
            row["ok"] = row["err"] <= TOL
            if row["ok"]:
                row["s"] = median_s(lambda c=cfg: run(c), reps, device)
                row["tflops"] = flops / row["s"] / 1e12
        except Exception as e:  # a candidate that fails is a row, not a stop
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            if device != "cpu":
                traceback.print_exc(file=sys.stderr)
        rows.append(row)
        log(f"{kind} {dcls} {i + 1}/{len(cands)} {cfg.as_dict()}: "
            + (f"{row['s'] * 1e3:.3f} ms" if "s" in row else row.get("error", "mismatch")))  # fmt: skip
    base = rows[0].get("s")
    for r in rows:
        r["vs_shipped"] = base / r["s"] if base and r.get("s") else None
    return rows


def _compile_in(jobs: int, argv: list[str]) -> None:
    """``jobs`` worker processes of this script, each running its share of the candidates once."""
    import subprocess

    base, skip = [], False
    for a in argv:  # the workers write no JSON
        if skip or a.startswith("--json"):
            skip = a == "--json"
            continue
        base.append(a)
    procs = [
        subprocess.Popen([sys.executable, __file__, *base, "--shard", f"{i}/{jobs}"])
        for i in range(jobs)
    ]
    for p in procs:
        p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default=",".join(KINDS), help=f"comma-separated: {','.join(KINDS)}")
    ap.add_argument(
        "--dclass",
        default="d128",
        help=f"comma-separated head-dim classes: {','.join(model.MODEL_SHAPES)}",
    )
    ap.add_argument("--stages", default="1,2,3,4", help="pipeline stages to try (comma-separated)")
    ap.add_argument("--limit", type=int, default=0, help="at most N candidates per kind")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--jobs", type=int, default=1, help="processes compiling the candidates first")
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # I/N: a --jobs worker
    a = ap.parse_args(argv)
    kinds = [k for k in a.kind.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"--kind: unknown {bad}; the kinds are {', '.join(KINDS)}")
    dclasses = [d for d in a.dclass.split(",") if d]
    bad = [d for d in dclasses if d not in model.MODEL_SHAPES]
    if bad or not dclasses:
        ap.error(f"--dclass: unknown {bad}; the classes are {', '.join(model.MODEL_SHAPES)}")
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    reps = a.reps or (1 if cpu else 20)
    stages = [int(x) for x in a.stages.split(",") if x]
    if a.shard:
        i, n = (int(x) for x in a.shard.split("/"))
        for dcls in dclasses:
            warm(kinds, dcls, device, stages, a.limit, (i, n))
        return 0
    if a.jobs > 1:
        _compile_in(a.jobs, argv if argv is not None else sys.argv[1:])
    where = "CPU figures (reference backend; a dry run, not a measurement)" if cpu else (
        torch.cuda.get_device_name()
    )  # fmt: skip
    out, failed = [], 0
    console = Console(width=160)

    def dump():  # after every kind: a sweep stopped at its time limit keeps the kinds it finished
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"device": device, "cpu_figures": cpu, "rows": out}, f, indent=2)

    for dcls, kind in ((d, k) for d in dclasses for k in kinds):
        rows = tune(kind, dcls, device, stages, a.limit, reps)
        out += rows
        dump()
        timed = sorted((r for r in rows if r.get("s")), key=lambda r: r["s"])
        failed += not timed
        t = Table(title=f"attention {kind} {dcls} configs on {where}")
        for col in ("config", "ms", "TFLOP/s", "vs shipped", "err", "spill B"):
            t.add_column(col, justify="left" if col == "config" else "right")
        for r in timed + [r for r in rows if not r.get("s")]:
            name = ("[bold]shipped[/] " if r["shipped"] else "") + str(r["config"])
            res = r["resources"]
            t.add_row(
                name,
                f"{r['s'] * 1e3:.3f}" if r.get("s") else "-",
                f"{r['tflops']:.0f}" if r.get("tflops") else "-",
                f"{r['vs_shipped']:.2f}x" if r.get("vs_shipped") else "-",
                f"{r['err']:.1e}" if "err" in r else r.get("error", "-")[:50],
                str(res.get("spill_bytes", "-")) if "compile_error" not in res else "error",
            )
        console.print(t)
        clean = [r for r in timed if r["resources"]["clean"]]
        for label, best in (("best", timed[:1]), ("best without spills", clean[:1])):
            if best and not cpu:
                c = best[0]["config"]
                print(f"{label} {kind} {dcls}: {c} "
                      f"({best[0].get('vs_shipped') or 1:.2f}x shipped)")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
