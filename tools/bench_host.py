"""Host time of the kernel APIs per call, with the kernels themselves stubbed out.

    uv run python tools/bench_host.py [--calls 200] [--rounds 7] [--json PATH]

On the lent H200 (docs/gpu-results.md, 2026-12-04) small calls were host-bound: a paged decode
call took 0.5 to 1 ms against 0.05 ms of kernels. This prints, per public API call at a small
shape, what the host does besides our kernels, on the CPU and without a GPU:

* ``host us``: the call's own Python (validation, planning, allocation, argument binding and the
  compiled-kernel lookup of every launch), with the backend's launch replaced by one that does
  nothing (median of ``--rounds`` rounds of ``--calls`` calls);
* ``our launches``: the kernel launches of one call;
* ``torch ops``: the ATen ops one call runs outside our kernels that compute something (views
  and allocations left out): on a GPU each is a kernel launch of its own;
* ``reads back``: ``.item()`` calls (device syncs on a GPU; a ``.tolist()`` is one too and is
  not counted here).

Attention's index tensors take the device path the GPU takes (``validate.HOST_VALUES`` off), so
that the decode row counts what a GPU call runs. Figures are this CPU's: compare rows and
revisions with each other, not with the H200's host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import Counter

import torch
from rich.console import Console
from rich.table import Table
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from flydsl_core.backends.reference.interpreter import ReferenceExecutable
from flydsl_kernels.attention import flash_attn_func, flash_attn_with_kvcache, validate
from flydsl_kernels.gemm import gemm, grouped_mm
from flydsl_kernels.rmsnorm import rms_norm
from flydsl_kernels.topk import topk

T = "cpu-reference"
#: ATen ops that compute nothing a GPU would launch a kernel for
_FREE = ("view", "empty", "as_strided", "unsqueeze", "squeeze", "reshape", "expand", "select",
         "slice", "permute", "transpose", "t.", "alias", "detach", "lift_fresh", "unflatten",
         "_unsafe_view", "split", "flatten")  # fmt: skip


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _stubbed():
    """The reference backend's launch does nothing (the lookup before it still runs); counts
    the launches."""
    n = [0]
    orig = ReferenceExecutable.launch

    def launch(self, grid, args):
        n[0] += 1
        if self.fn.name == "paged_index_check_kernel":  # the host reads its flags back
            with _disable_current_modes():  # the stub's own op is not the call's
                args[2].zero_()

    ReferenceExecutable.launch = launch
    prev = validate.HOST_VALUES
    validate.HOST_VALUES = False  # index tensors take the GPU's path
    try:
        yield n
    finally:
        ReferenceExecutable.launch = orig
        validate.HOST_VALUES = prev


def cases() -> list[tuple[str, str, object]]:
    g = torch.Generator().manual_seed(0)

    def r(*s, dt=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dt)

    out = []
    x, w = r(64, 4096), r(4096)
    out.append(("rms_norm", "64x4096 bf16", lambda: rms_norm(x, (4096,), w, target=T)))
    xt = r(64, 8192, dt=torch.float32)
    out.append(("topk", "64x8192 fp32 k=8", lambda: topk(xt, 8, target=T)))
    a, b = r(16, 1024), r(2048, 1024).t()
    out.append(("gemm", "16x2048x1024 bf16", lambda: gemm(a, b, target=T)))
    ga, gw = r(256, 512), r(8, 512, 256)
    offs = torch.tensor([32, 64, 96, 128, 160, 192, 224, 256], dtype=torch.int32)
    out.append(("grouped_mm", "256 tokens, 8 experts", lambda: grouped_mm(ga, gw, offs, target=T)))
    q, k, v = r(1, 128, 8, 128), r(1, 128, 2, 128), r(1, 128, 2, 128)
    out.append(("flash_attn_func", "B1 S128 H8/2 D128 causal",
                lambda: flash_attn_func(q, k, v, causal=True, target=T)))  # fmt: skip
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = r(1, 128, 8, 128)

    def fwd_bwd():
        o = flash_attn_func(qg, kg, vg, causal=True, target=T)
        return torch.autograd.grad(o, (qg, kg, vg), do)

    out.append(("flash_attn_func fwd+bwd", "B1 S128 H8/2 D128 causal", fwd_bwd))
    b8, page, pages = 8, 16, 64
    qd = r(b8, 1, 32, 128)
    kc, vc = r(b8 * pages, page, 8, 128), r(b8 * pages, page, 8, 128)
    table = torch.randperm(b8 * pages, generator=g).view(b8, pages).to(torch.int32)
    lens = torch.randint(512, 1025, (b8,), generator=g).to(torch.int32)
    out.append(("flash_attn_with_kvcache", "B8 ctx1024 H32/8 D128 page16",
                lambda: flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                                block_table=table, causal=True, target=T)))  # fmt: skip
    return out


def measure(fn, calls: int, rounds: int) -> dict:
    with _stubbed() as n:
        fn()  # compile and warm
        n[0] = 0
        with _Ops() as ops:
            fn()
        launches = n[0]
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t) / calls)
    compute = {k: c for k, c in ops.ops.items() if not k.startswith(_FREE)}
    return {
        "host_us": statistics.median(times) * 1e6,
        "launches": launches,
        "torch_ops": sum(c for k, c in compute.items() if k != "_local_scalar_dense"),
        "reads_back": compute.get("_local_scalar_dense", 0),
        "ops": dict(compute),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    rows = []
    table = Table(title="host time per API call, kernels stubbed (CPU figures)")
    for col in ("api", "shape", "host us", "our launches", "torch ops", "reads back"):
        table.add_column(col, justify="left" if col in ("api", "shape") else "right")
    for api, shape, fn in cases():
        r = {"api": api, "shape": shape, **measure(fn, a.calls, a.rounds)}
        rows.append(r)
        table.add_row(api, shape, f"{r['host_us']:.1f}", str(r["launches"]), str(r["torch_ops"]),
                      str(r["reads_back"]))  # fmt: skip
    Console(width=140).print(table)
    print("torch ops: ATen ops besides our kernels that compute (a GPU launch each on a device)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu_figures": True, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
