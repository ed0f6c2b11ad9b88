"""flex_attention benchmark: ``torch_flydsl.flex_attention`` against torch's flex_attention.

    uv run python tools/bench_flex.py [--mode fwd|bwd|all] [--quick] [--reps N]
                                      [--ours compiled|eager] [--device auto|cpu|cuda]
                                      [--dtype bf16|fp32] [--json PATH]

The mods of the flex_attention issue: causal and sliding window (block masks), ALiBi from a
captured slope tensor, tanh softcap, document masking from a captured id tensor, prefix-LM,
a relative-position bias table, the same table learned (its gradient computed too), and GQA
(causal, 4:1). Forward, and forward + backward. ``--dtype fp32`` runs fp32 inputs.

On a GPU: ours is torch's ``flex_attention`` under ``torch.compile(backend="flydsl")`` (the pass
rewrites its HOP nodes, forward and backward, into the FlyDSL kernels with the mods translated;
``--ours eager``: ``torch_flydsl.flex_attention`` called eagerly), torch's is
``torch.compile(flex_attention)`` (Inductor's Triton kernels),
interleaved rep by rep with CUDA events and L2 flushes, median of ``--reps``; B=4, H=16, S=4096,
D=128, bf16. The ratio is torch's time over ours (above 1: ours is faster); the geomean over
the rows is printed last. The goal is >= 1 on every mod.

On the CPU (the default is ``--quick`` and ``--ours eager`` there): ours runs on FlyDSL's
reference backend and torch's is its eager (unfused) flex_attention; forward only (torch's flex_attention has no
CPU backward), small shapes. These are CPU figures: they say nothing about GPU speed.

Every output (and gradient) is checked against torch's first: ``max |ours - torch| /
max |torch| <= 2e-2``. Exit status 1 when a row failed or fell back to torch's path.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import torch_flydsl

TOL = 2e-2


def mods(S: int, H: int, device: str) -> dict:
    """name -> (score_mod, mask_mod, gqa, learned tensors): the issue's mods at length ``S``."""
    g = torch.Generator(device="cpu").manual_seed(0)
    slopes = (torch.rand(H, generator=g) * 0.5).to(device)
    doc = torch.sort(torch.randint(0, 8, (S,), generator=g)).values.to(device)
    table = (torch.randn(H, 2 * S - 1, generator=g) * 0.5).to(device)
    prefix = S // 4

    def causal(b, h, q, kv):
        return q >= kv

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv < 256)

    def alibi(s, b, h, q, kv):
        return s - slopes[h] * (q - kv).abs()

    def softcap(s, b, h, q, kv):
        return torch.tanh(s / 30.0) * 30.0

    def document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    def prefix_lm(b, h, q, kv):
        return (kv < prefix) | (q >= kv)

    def rel_bias(s, b, h, q, kv):
        return s + table[h, q - kv + (S - 1)]

    learned = table.clone().requires_grad_(True)

    def rel_bias_learned(s, b, h, q, kv):
        return s + learned[h, q - kv + (S - 1)]

    return {
        "causal": (None, causal, False, []),
        "sliding_window": (None, sliding, False, []),
        "alibi": (alibi, None, False, []),
        "softcap": (softcap, None, False, []),
        "document": (None, document, False, []),
        "prefix_lm": (None, prefix_lm, False, []),
        "rel_bias": (rel_bias, None, False, []),
        "rel_bias_learned": (rel_bias_learned, None, False, [learned]),
        "gqa_causal": (None, causal, True, []),
    }


def _time(fns, reps: int, device: str) -> list[float]:
    if device == "cuda":
        from flydsl_kernels.report import median_times_ms

        return [t / 1e3 for t in median_times_ms(fns, reps=reps)]
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))


def run(name, score_mod, mask_mod, gqa, shape, mode, device, reps, ours_kind, learn=(),
        dtype=torch.bfloat16) -> dict:  # fmt: skip
    B, H, S, D = shape
    Hk = H // 4 if gqa else H
    g = torch.Generator(device="cpu").manual_seed(1)
    mk = lambda h: torch.randn(B, h, S, D, generator=g).to(device, dtype)  # noqa: E731
    q, k, v = mk(H), mk(Hk), mk(Hk)
    bm = None
    if mask_mod is not None:
        bm = create_block_mask(mask_mod, None, None, S, S, device=device, BLOCK_SIZE=128)
    kw = {"score_mod": score_mod, "block_mask": bm, "enable_gqa": gqa}
    theirs_fn = torch.compile(torch_flex) if device == "cuda" else torch_flex
    bwd = mode == "bwd"
    if bwd:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    do = torch.randn(B, H, S, D, generator=g).to(device, dtype)

    def step(fn):
        def go():
            out = fn(q, k, v, **kw)
            if bwd:
                return out, torch.autograd.grad(out, (q, k, v, *learn), do)
            return out, ()

        return go

    if ours_kind == "compiled":
        opts = {"device": "cpu"} if device == "cpu" else None
        ours_fn = torch.compile(torch_flex, backend="flydsl", options=opts)
        key = "compile:flex_attention"
    else:
        ours_fn, key = torch_flydsl.flex_attention, "flex_attention"
    ours, theirs = step(ours_fn), step(theirs_fn)
    torch_flydsl.reset_stats()
    from torch._inductor import config

    with config.patch(fx_graph_cache=False):  # the pass runs (and counts) on every compile
        (o1, g1), (o2, g2) = ours(), theirs()
    st = torch_flydsl.stats().get(key, {"hits": 0, "fallbacks": {}})
    if st["hits"] < 1 or st["fallbacks"]:
        raise RuntimeError(f"ours fell back to torch's: {st['fallbacks']}")
    err = max([_err(o1, o2)] + [_err(a, b) for a, b in zip(g1, g2)])
    t_ours, t_theirs = _time([ours, theirs], reps, device)
    return {"err": err, "ours_s": t_ours, "torch_s": t_theirs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="all", choices=["fwd", "bwd", "all"])
    ap.add_argument("--quick", action="store_true", help="a small subset (the CPU default)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--ours", default=None, choices=["compiled", "eager"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    if cpu:
        torch_flydsl.enable(device="cpu")
    quick = a.quick or cpu
    ours_kind = a.ours or ("eager" if cpu else "compiled")
    reps = a.reps or (3 if cpu else 30)
    shape = (1, 2, 128, 64) if cpu else ((2, 8, 1024, 128) if quick else (4, 16, 4096, 128))
    modes = ["fwd"] if cpu else (["fwd", "bwd"] if a.mode == "all" else [a.mode])
    names = mods(shape[2], shape[1], device)
    if quick:
        names = {k: names[k] for k in ("causal", "alibi", "softcap", "document",
                                       "rel_bias_learned")}  # fmt: skip
    where = (
        "CPU figures (FlyDSL on the reference backend vs torch's eager flex; not GPU speeds)"
        if cpu
        else torch.cuda.get_device_name()
    )
    table = Table(title=f"FlyDSL flex_attention ({ours_kind}) vs torch's on {where}")
    for col in ("mod", "mode", "shape", "max err", "ours", "torch", "torch/ours"):
        table.add_column(col, justify="left" if col in ("mod", "mode", "shape") else "right")
    rows, bad, ratios = [], 0, []
    for mode in modes:
        for name, (sm, mm, gqa, learn) in names.items():
            row = {"mod": name, "mode": mode, "shape": list(shape), "device": device,
                   "cpu_figures": cpu, "ours": ours_kind, "dtype": a.dtype}  # fmt: skip
            try:
                r = run(name, sm, mm, gqa, shape, mode, device, reps, ours_kind, learn, dtype)
                row.update(r)
                row["ratio"] = r["torch_s"] / r["ours_s"]
                row["ok"] = r["err"] <= TOL
                ratios.append(row["ratio"])
            except Exception as e:  # a failing row is reported, not a crash
                row["ok"] = False
                row["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stderr)
            bad += not row["ok"]
            rows.append(row)
            shp = "x".join(map(str, shape))
            if "error" in row:
                table.add_row(name, mode, shp, f"[red]{escape(row['error'][:60])}[/]", "-", "-",
                              "-")  # fmt: skip
            else:
                table.add_row(
                    name, mode, shp, f"{row['err']:.2e}", f"{row['ours_s'] * 1e3:.2f} ms",
                    f"{row['torch_s'] * 1e3:.2f} ms", f"{row['ratio']:.2f}x",
                )  # fmt: skip
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    Console(width=160).print(table)
    if geomean is not None:
        print(f"geomean torch/ours: {geomean:.3f}x" + (" (CPU figures)" if cpu else ""))
    if cpu:
        print("CPU figures: FlyDSL runs on the reference backend here; these are not GPU speeds.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": device, "cpu_figures": cpu, "geomean": geomean, "rows": rows},
                      f, indent=2)  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
