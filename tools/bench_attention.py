"""Attention benchmark: FlyDSL flash attention against ``F.scaled_dot_product_attention``.

    uv run python tools/bench_attention.py [--mode fwd|bwd|decode|all] [--quick | --full]
                                           [--reps N] [--device auto|cpu|cuda] [--json PATH]

Shapes (the issue's): prefill with B * S = 16k tokens, H 32 or 64 (GQA 4:1 / 8:1), D 128, causal
and not, forward and forward + backward; decode over a paged KV cache (page 16 / 64), batch 1 to
256, context 1k to 128k (cache lengths drawn in [ctx/2, ctx]; SDPA gets the same keys as a
dense gathered cache and the same lengths through a boolean mask, since SDPA has no paged or
ragged form).

Every output (and gradient) is checked against SDPA before it is timed: ``max |ours - sdpa| /
(1 + max |sdpa|) <= 2e-2`` (bf16).

Timing: on a GPU, CUDA events around each call, ours and SDPA interleaved rep by rep, L2
flushed, median of ``--reps``; beside it "ours kernels", the GPU time of the kernels a call
launches (torch.profiler), so that the rest of our time is the host's; and for decode, both
calls captured in CUDA graphs and replayed (``graph_s``, ``sdpa_graph_s``: how serving stacks
run decode steps, with no host work a call). On the CPU, ``time.perf_counter`` medians. TFLOP/s counts
``4 * B * H * Sq * Sk_visible * D`` for the forward (QK^T and PV; a causal mask halves the
visible keys) and 2.5x that for the backward (its five matmuls), over our median time.

On the CPU the FlyDSL kernels run on the reference backend (Python, one program at a time):
the default there is the ``--quick`` subset of small shapes and the figures are labelled CPU
figures (they say nothing about GPU speed).

Exit status 1 when any case raised or did not match SDPA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flydsl_kernels.attention import flash_attn_func, flash_attn_with_kvcache

TOL = 2e-2


@dataclass
class Case:
    mode: str  # "fwd" | "bwd" | "decode"
    batch: int
    seqlen: int  # prefill: Sq = Sk; decode: the context length
    heads: int
    heads_k: int
    head_dim: int = 128
    causal: bool = True
    page: int = 16

    @property
    def shape(self) -> str:
        if self.mode == "decode":
            return (
                f"B{self.batch} ctx{self.seqlen} H{self.heads}/{self.heads_k} D{self.head_dim} "
                f"page{self.page}"
            )
        c = " causal" if self.causal else ""
        return f"B{self.batch} S{self.seqlen} H{self.heads}/{self.heads_k} D{self.head_dim}{c}"

    def flops(self, visible_keys: float) -> float:
        f = 4.0 * self.batch * self.heads * self.head_dim * visible_keys
        return f * 2.5 if self.mode == "bwd" else f


def cases(full: bool, quick: bool) -> list[Case]:
    if quick:
        return [
            Case("fwd", 1, 256, 4, 1, 64, True),
            Case("fwd", 1, 256, 4, 1, 64, False),
            Case("bwd", 1, 128, 2, 1, 64, True),
            Case("decode", 2, 1024, 8, 2, 64, True, 16),
        ]
    out = []
    for h, hk in ((32, 8), (64, 8)):
        for b, s in ((4, 4096), (2, 8192), (1, 16384)) if full else ((4, 4096),):
            for causal in (True, False):
                out.append(Case("fwd", b, s, h, hk, 128, causal))
                out.append(Case("bwd", b, s, h, hk, 128, causal))
    for b in (1, 8, 64, 256):
        for ctx in (1024, 8192, 32768, 131072) if full else (1024, 8192, 131072):
            if b * ctx > 4 * 2**20:  # keep the cache under ~8 GiB of bf16 K and V at H_k 8
                continue
            out.append(Case("decode", b, ctx, 32, 8, 128, True, 16 if ctx <= 8192 else 64))
    return out


def median_s(fn, reps: int, device: str) -> float:
    """Median seconds of ``fn`` (see the module doc); tune_attention times with it too."""
    if device == "cuda":
        from flydsl_kernels.report import median_times_ms

        return median_times_ms([fn], reps=reps)[0] / 1e3
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _kernel_time(fn, reps: int) -> float | None:
    """Seconds of GPU kernel time per call of ``fn`` (``report.kernel_time_ms``)."""
    from flydsl_kernels.report import kernel_time_ms

    ms = kernel_time_ms(fn, reps)
    return None if ms is None else ms / 1e3


def _graphed(fn):
    """``fn`` captured once in a CUDA graph: ``(replay, the captured call's output)``.

    Serving stacks run decode steps this way (one replay a step, no host work a call), so a
    decode row also times the replay of ours and of SDPA: the figure without the host. Under
    capture our index checks assert on the device instead of reading back (``validate``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm: compiles and allocator pools outside the capture
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def _graph_times(ours, ref, want, reps: int) -> dict:
    """``graph_s`` / ``sdpa_graph_s``: median replay times; ``graph_err`` the replayed output's
    error; a capture that fails is ``graph_error``, not a failed row."""
    try:
        replay, out = _graphed(ours)
        replay()
        torch.cuda.synchronize()
        got = {"graph_err": _err(out, want), "graph_s": median_s(replay, reps, "cuda")}
        replay_ref, _ = _graphed(ref)
        got["sdpa_graph_s"] = median_s(replay_ref, reps, "cuda")
        return got
    except Exception as e:  # a capture problem is this column's, the eager figures stand
        return {"graph_error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}


def _err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / (1 + b.abs().max())) if a.numel() else 0.0


def _sdpa(q, k, v, causal, mask=None):
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, is_causal=causal and mask is None,
        enable_gqa=q.shape[2] != k.shape[2],
    )  # fmt: skip
    return out.transpose(1, 2)


def run_prefill(c: Case, device: str, reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    shape_q = (c.batch, c.seqlen, c.heads, c.head_dim)
    shape_k = (c.batch, c.seqlen, c.heads_k, c.head_dim)
    q = torch.randn(shape_q, generator=g).to(torch.bfloat16).to(device)
    k = torch.randn(shape_k, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(shape_k, generator=g).to(torch.bfloat16).to(device)
    ours = flash_attn_func(q, k, v, causal=c.causal)
    ref = _sdpa(q, k, v, c.causal)
    err = _err(ours, ref)
    visible = c.seqlen * (c.seqlen + 1) / 2 if c.causal else c.seqlen * c.seqlen
    kernel = None
    if c.mode == "fwd":
        t_ours = median_s(lambda: flash_attn_func(q, k, v, causal=c.causal), reps, device)
        t_ref = median_s(lambda: _sdpa(q, k, v, c.causal), reps, device)
        if device == "cuda":
            kernel = _kernel_time(lambda: flash_attn_func(q, k, v, causal=c.causal), reps)
    else:
        for t in (q, k, v):
            t.requires_grad_()
        do = torch.randn_like(ours)
        o1 = flash_attn_func(q, k, v, causal=c.causal)
        o2 = _sdpa(q, k, v, c.causal)
        g1 = torch.autograd.grad(o1, (q, k, v), do, retain_graph=True)
        g2 = torch.autograd.grad(o2, (q, k, v), do, retain_graph=True)
        err = max(err, *(_err(a, b) for a, b in zip(g1, g2)))
        t_ours = median_s(
            lambda: torch.autograd.grad(o1, (q, k, v), do, retain_graph=True), reps, device
        )
        t_ref = median_s(
            lambda: torch.autograd.grad(o2, (q, k, v), do, retain_graph=True), reps, device
        )
        if device == "cuda":
            kernel = _kernel_time(
                lambda: torch.autograd.grad(o1, (q, k, v), do, retain_graph=True), reps
            )
    return {
        "err": err,
        "ours_s": t_ours,
        "sdpa_s": t_ref,
        "kernel_s": kernel,
        "flops": c.flops(visible),
    }


def run_decode(c: Case, device: str, reps: int) -> dict:
    g = torch.Generator().manual_seed(0)
    b, h, hk, d, page = c.batch, c.heads, c.heads_k, c.head_dim, c.page
    npg = -(-c.seqlen // page)
    q = torch.randn(b, 1, h, d, generator=g).to(torch.bfloat16).to(device)
    kc = torch.randn(b * npg, page, hk, d, generator=g).to(torch.bfloat16).to(device)
    vc = torch.randn(b * npg, page, hk, d, generator=g).to(torch.bfloat16).to(device)
    table = torch.randperm(b * npg, generator=g).view(b, npg).to(torch.int32).to(device)
    lens = torch.randint(max(c.seqlen // 2, 1), c.seqlen + 1, (b,), generator=g)
    lens_d = lens.to(torch.int32).to(device)
    kd = kc[table.long()].flatten(1, 2)
    vd = vc[table.long()].flatten(1, 2)
    mask = (torch.arange(npg * page)[None, :] < lens[:, None]).to(device)[:, None, None, :]

    def ours():
        return flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens_d, block_table=table, causal=True
        )

    def ref():
        return _sdpa(q, kd, vd, False, mask)

    want = ref()
    err = _err(ours(), want)
    got = {
        "err": err,
        "ours_s": median_s(ours, reps, device),
        "sdpa_s": median_s(ref, reps, device),
        "kernel_s": _kernel_time(ours, reps) if device == "cuda" else None,
        "flops": c.flops(float(lens.sum()) / b),
    }
    if device == "cuda":
        got.update(_graph_times(ours, ref, want, reps))
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="all", choices=["fwd", "bwd", "decode", "all"])
    ap.add_argument("--quick", action="store_true", help="the small subset (the CPU default)")
    ap.add_argument("--full", action="store_true", help="every shape")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    quick = a.quick or (cpu and not a.full)
    reps = a.reps or (3 if cpu else 50)
    todo = [c for c in cases(a.full, quick) if a.mode in ("all", c.mode)]
    where = (
        "CPU figures (FlyDSL on the reference backend; not GPU speeds)"
        if cpu
        else torch.cuda.get_device_name()
    )
    table = Table(title=f"FlyDSL attention vs SDPA on {where}")
    for col in (
        "mode",
        "shape",
        "max err",
        "ours",
        "ours kernels",
        "SDPA",
        "speedup",
        "ours TFLOP/s",
    ):
        table.add_column(col, justify="left" if col in ("mode", "shape") else "right")
    rows, bad = [], 0

    def dump():  # after every row: a run stopped at its time limit keeps the rows it finished
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"device": device, "cpu_figures": cpu, "rows": rows}, f, indent=2)

    dump()
    for c in todo:
        row = {"mode": c.mode, "shape": c.shape, "device": device, "cpu_figures": cpu}
        try:
            r = run_decode(c, device, reps) if c.mode == "decode" else run_prefill(c, device, reps)
            row.update(r)
            row["ok"] = r["err"] <= TOL
            row["speedup"] = r["sdpa_s"] / r["ours_s"] if r["ours_s"] > 0 else None
            if r.get("graph_s"):  # both replayed from CUDA graphs: no host work in either
                row["graph_speedup"] = r["sdpa_graph_s"] / r["graph_s"]
                row["ok"] = row["ok"] and r["graph_err"] <= TOL
            row["tflops"] = r["flops"] / r["ours_s"] / 1e12 if r["ours_s"] > 0 else None
        except Exception as e:  # a failing case is a row, not a crash
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        bad += not row["ok"]
        rows.append(row)
        dump()
        print(
            f"{c.mode} {c.shape}: "
            + (
                row["error"][:100]
                if "error" in row
                else f"err {row['err']:.1e}, {row['speedup'] or 0:.2f}x, {row['tflops'] or 0:.3g} TFLOP/s"
                + (
                    f"; CUDA graphs {row['graph_s'] * 1e3:.3f} ms vs SDPA "
                    f"{row['sdpa_graph_s'] * 1e3:.3f} ms, {row['graph_speedup']:.2f}x"
                    if row.get("graph_speedup")
                    else ""
                )
                + (f"; graph capture failed: {row['graph_error']}" if "graph_error" in row else "")
            ),
            flush=True,
        )
        if "error" in row:
            table.add_row(
                c.mode, c.shape, f"[red]{escape(row['error'][:60])}[/]", "-", "-", "-", "-", "-"
            )
        else:
            table.add_row(
                c.mode, c.shape, f"{row['err']:.2e}", f"{row['ours_s'] * 1e3:.3f} ms",
                "-" if row["kernel_s"] is None else f"{row['kernel_s'] * 1e3:.3f} ms",
                f"{row['sdpa_s'] * 1e3:.3f} ms", f"{row['speedup']:.2f}x", f"{row['tflops']:.3g}",
            )  # fmt: skip
    Console(width=160).print(table)
    if cpu:
        print("CPU figures: FlyDSL runs on the reference backend here; these are not GPU speeds.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
