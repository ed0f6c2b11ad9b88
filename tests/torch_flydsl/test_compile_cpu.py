"""``torch.compile(..., backend="flydsl")`` end to end on the CPU test backend.

One program holds every case the issue names: an MLP with bias + gelu + residual, a SwiGLU
MLP, a ``bmm``, a top-1 MoE layer calling ``torch._grouped_mm`` and an MX linear through
``F.scaled_mm``. It is compiled once (``dynamic=True``; size-oblivious backed sizes, so that
M = 1 does not specialize) and run for M = 7, 1, 64 and 300. Each run is compared with eager
ATen on fresh random data (bf16 tolerance: 2e-2 relative + 2e-2 of the largest magnitude;
eager rounds after every op, FlyDSL once per fused kernel); FlyDSL's ops must have run
(``torch_flydsl.stats()`` counts their launches) and Dynamo must not have recompiled.

On the CPU, Inductor emits C++ for the rest of the graph and calls the ``flydsl::`` ops as
extern kernels, which run FlyDSL's CPU backend (docs/architecture.md says why: Inductor
cannot launch Triton kernels on a CPU). Wall time: one compile, about 20-60 s on the 2-core
dev machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_flydsl

pytestmark = pytest.mark.cpu

BF16 = torch.bfloat16
BLK, NO = F.ScalingType.BlockWise1x32, F.SwizzleType.NO_SWIZZLE
MS = (7, 1, 64, 300)


class MoE(nn.Module):
    """Top-1 routed experts: tokens sorted by expert, ``torch._grouped_mm`` up and down. The
    router stays fp32 (a plain attribute, which ``.to(bf16)`` leaves alone), so ATen computes
    it in eager and compiled runs alike and the routing is the same in both."""

    def __init__(self, hidden, ffn, experts):
        super().__init__()
        self.router = torch.randn(experts, hidden)
        self.up = nn.Parameter(torch.randn(experts, ffn, hidden) / hidden**0.5)
        self.down = nn.Parameter(torch.randn(experts, hidden, ffn) / ffn**0.5)
        self.experts = experts

    def forward(self, x):
        idx = (x.float() @ self.router.t()).argmax(-1)
        order = idx.argsort()
        counts = torch.zeros(self.experts, dtype=torch.int64, device=x.device)
        counts = counts.scatter_add(0, idx, torch.ones_like(idx))
        offs = counts.cumsum(0).to(torch.int32)
        xs = x[order]
        h = F.silu(torch._grouped_mm(xs, self.up.transpose(1, 2), offs))
        ys = torch._grouped_mm(h, self.down.transpose(1, 2), offs)
        return torch.empty_like(ys).index_copy(0, order, ys)


class Program(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 48), nn.Linear(48, 32)
        self.gate = nn.Linear(32, 40, bias=False)
        self.upp = nn.Linear(32, 40, bias=False)
        self.down = nn.Linear(40, 32, bias=False)
        self.heads = nn.Parameter(torch.randn(2, 16, 24) / 4)
        self.moe = MoE(32, 24, experts=3)
        self.eager_mx = False  # the eager reference: ATen has no CPU MX kernel
        from flydsl_kernels.mx import to_mx

        # the MX weight and its scales: plain attributes (constants to Dynamo, untouched by .to)
        self.wq, self.ws = to_mx(torch.randn(24, 64), torch.float8_e4m3fn)

    def forward(self, x, xq, xs):
        wq, ws = self.wq, self.ws
        mlp = self.fc2(F.gelu(self.fc1(x))) + x
        swiglu = self.down(F.silu(self.gate(x)) * self.upp(x))
        per_head = torch.bmm(x.view(-1, 2, 16).transpose(0, 1), self.heads)
        moe = self.moe(x)
        if self.eager_mx:  # the MX spec's dequantization, then a float64 matmul
            from flydsl_kernels.mx import reference

            e4m3 = torch.float8_e4m3fn
            xd, wd = (reference.from_mx(q, s, e4m3).double() for q, s in ((xq, xs), (wq, ws)))
            deq = xd @ wd.T
            mx = deq.to(BF16)
        else:
            mx = F.scaled_mm(xq, wq.t(), xs, BLK, ws, BLK, NO, NO, output_dtype=BF16)
        return mlp, swiglu, per_head, moe, mx


def _no_compile_caches():
    import contextlib

    import torch._functorch.config as functorch_config
    from torch._inductor import config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


@pytest.fixture(scope="module")
def compiled():
    """The program compiled once, run at every M: ``(outputs, references, stats, counters)``."""
    import torch._dynamo
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.utils import counters

    from flydsl_kernels.mx import to_mx

    torch_flydsl.reset_stats()
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    prog = Program().to(BF16)
    # Inductor's caches would serve a graph compiled by an earlier run (FlyDSLPass.uuid()
    # allows it when nothing changed) and the pass's compile-time counters would stay 0
    no_cache = _no_compile_caches()
    no_cache.__enter__()
    fn = torch.compile(prog, backend="flydsl", options={"device": "cpu"}, dynamic=True)
    outs, refs = {}, {}
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        for m in MS:
            x = torch.randn(m, 32).to(BF16)
            xq, xs = to_mx(torch.randn(m, 64), torch.float8_e4m3fn)
            outs[m] = fn(x, xq, xs)
            prog.eager_mx = True
            refs[m] = prog(x, xq, xs)
            prog.eager_mx = False
    stats = torch_flydsl.stats()
    graphs = dict(counters["stats"])
    no_cache.__exit__(None, None, None)
    torch._dynamo.reset()
    torch_flydsl.reset_stats()
    return outs, refs, stats, graphs


def _close(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    tol = 2e-2
    torch.testing.assert_close(
        out.float(), ref.float(), rtol=tol, atol=tol * ref.abs().max().item()
    )


CASES = ["mlp bias+gelu+residual", "swiglu", "bmm", "moe grouped_mm", "mx linear"]


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("case", CASES)
def test_results_match_eager(compiled, case, m):
    outs, refs, _, _ = compiled
    i = CASES.index(case)
    _close(outs[m][i], refs[m][i])


def test_flydsl_ran_every_op(compiled):
    _, _, stats, _ = compiled
    runs = len(MS)
    assert stats["flydsl::gemm"]["hits"] == 4 * runs  # fc1, fc2, SwiGLU's down proj, bmm
    assert stats["flydsl::swiglu"]["hits"] == runs
    assert stats["flydsl::grouped_mm"]["hits"] == 2 * runs
    assert stats["flydsl::mx_mm"]["hits"] == runs
    assert stats["compile:epilogue"]["hits"] >= 2  # fc1 + gelu, fc2 + bias + residual
    assert stats["compile:swiglu"]["hits"] == 1


def test_one_graph_for_every_m(compiled):
    _, _, _, graphs = compiled
    assert graphs["unique_graphs"] == 1, graphs  # no recompilation across M = 7, 1, 64, 300


def test_install_with_backend_inductor():
    """``torch_flydsl.inductor.install()`` keeps ``backend="inductor"`` and adds the pass."""
    import torch._dynamo

    from torch_flydsl import inductor

    torch._dynamo.reset()
    torch_flydsl.reset_stats()
    a, b = torch.randn(9, 32).to(BF16), torch.randn(32, 24).to(BF16)
    inductor.install({"device": "cpu", "ops": ["gemm"]})
    try:
        with _no_compile_caches():
            out = torch.compile(lambda a, b: torch.relu(a @ b), backend="inductor")(a, b)
    finally:
        inductor.uninstall()
        torch._dynamo.reset()
    _close(out, torch.relu(a @ b))
    st = torch_flydsl.stats()
    assert st["flydsl::gemm"]["hits"] == 1 and st["compile:epilogue"]["hits"] == 1


def test_marked_dynamic_batch_dim_serves_every_m():
    """``torch._dynamo.mark_dynamic`` on the rows (no ``dynamic=True``): one graph for
    M = 7, 64, 300 and 1 (size-oblivious backed sizes, as above: M = 1 would otherwise
    specialize), each result as eager's, and Dynamo compiles one graph once. ~25 s."""
    import torch._dynamo
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch_flydsl.reset_stats()
    lin = nn.Linear(40, 24).to(BF16)

    def f(x):
        return F.relu(lin(x))

    fn = torch.compile(f, backend="flydsl", options={"device": "cpu", "ops": ["gemm"]})
    ms = (7, 64, 300, 1)
    with _no_compile_caches(), torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        for m in ms:
            x = torch.randn(m, 40).to(BF16)
            torch._dynamo.mark_dynamic(x, 0)
            _close(fn(x), f(x))
    graphs = dict(counters["stats"])
    torch._dynamo.reset()
    assert graphs["unique_graphs"] == 1, graphs
    assert graphs.get("calls_captured", 0) > 0
    st = torch_flydsl.stats()
    assert st["flydsl::gemm"]["hits"] == len(ms) and st["compile:epilogue"]["hits"] == 1


def _sink_attention(q, k, v, sinks):
    """gpt-oss's eager attention (``eager_attention_forward``): the scores ``q @ k^T`` (the KV
    length as N), a learned sink logit per head in the softmax, ``p @ v`` (the KV length as
    K). The sinks keep Inductor from matching it to SDPA, so both matmuls reach the pass."""
    w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    s = sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)
    c = torch.cat([w, s], dim=-1)
    c = c - c.max(dim=-1, keepdim=True).values
    p = torch.softmax(c, dim=-1)[..., :-1]
    return torch.matmul(p, v)


def test_decode_with_a_growing_kv_length_does_not_recompile():
    """Decode steps of a growing KV length: Dynamo compiles the first step's static graph,
    then one graph with the length symbolic (its automatic dynamic shapes); the pass keeps the
    length symbolic (no guard on its value), so no later step recompiles, and both matmuls of
    every step run FlyDSL's GEMM, each as eager's. (Before: N / K were specialized, each step
    recompiled until Dynamo's recompile limit of 8, then ran uncompiled.) ~20 s."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch_flydsl.reset_stats()
    torch.manual_seed(0)
    sinks = torch.randn(2).to(BF16)
    fn = torch.compile(_sink_attention, backend="flydsl", options={"device": "cpu"})
    steps = range(3, 16)  # 13 steps: more than the default recompile limit
    # a third graph would be a recompile too many: raise instead of running uncompiled
    limit = torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True)
    with _no_compile_caches(), torch.no_grad(), limit:
        for kv in steps:
            q = torch.randn(1, 2, 1, 16).to(BF16)
            k, v = (torch.randn(1, 2, kv, 16).to(BF16) for _ in range(2))
            _close(fn(q, k, v, sinks), _sink_attention(q, k, v, sinks))
    graphs = dict(counters["stats"])
    torch._dynamo.reset()
    assert graphs["unique_graphs"] == 2, graphs
    st = torch_flydsl.stats()
    assert st["flydsl::gemm"]["hits"] == 2 * len(steps)
    assert st["compile:bmm"]["fallbacks"] == {}
