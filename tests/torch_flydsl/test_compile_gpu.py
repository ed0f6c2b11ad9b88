"""``torch.compile(..., backend="flydsl")`` on a GPU (``-m gpu``; skipped without one).

The CPU tier's program (test_compile_cpu.py) on the device: FlyDSL's generated Triton kernels
inside Inductor's graph (``kernels="triton"``, the default) and as extern calls
(``kernels="extern"``), for M = 7, 1, 64 and 300 in one graph, against eager ATen. The gate
is opened (``gates="open"``) and the device's arch allowed, so that FlyDSL runs whatever the
shipped table says about this GPU; the MX linear is left out where ATen has no MX kernel to
compare with eagerly (it is compared with the MX spec's dequantization instead).
"""

from __future__ import annotations

import pytest
import torch

import torch_flydsl

from .test_compile_cpu import CASES, MS, Program, _close

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


@pytest.mark.parametrize("kernels", ["triton", "extern"])
def test_program_on_gpu(kernels, monkeypatch):
    import torch._dynamo
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.utils import counters

    from flydsl_kernels.mx import to_mx
    from torch_flydsl import eligibility

    monkeypatch.setenv("FLYDSL_TORCH_ARCHS", eligibility.resolve_arch(None) or "none")
    torch._dynamo.reset()
    counters.clear()
    torch_flydsl.reset_stats()
    torch.manual_seed(0)
    prog = Program().to(BF16).cuda()
    prog.moe.router = prog.moe.router.cuda()
    prog.wq, prog.ws = prog.wq.cuda(), prog.ws.cuda()
    fn = torch.compile(
        prog, backend="flydsl", options={"gates": "open", "kernels": kernels}, dynamic=True
    )
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        for m in MS:
            x = torch.randn(m, 32, device="cuda").to(BF16)
            xq, xs = to_mx(torch.randn(m, 64, device="cuda"), torch.float8_e4m3fn)
            out = fn(x, xq, xs)
            prog.eager_mx = True
            ref = prog(x, xq, xs)
            prog.eager_mx = False
            assert len(out) == len(CASES)
            for o, r in zip(out, ref):
                _close(o, r.to(o.device))
    assert dict(counters["stats"])["unique_graphs"] == 1
    st = torch_flydsl.stats()
    for op in ("compile:addmm", "compile:bmm", "compile:_grouped_mm", "compile:swiglu"):
        assert st[op]["hits"] >= 1, (op, st)
    if kernels == "extern":  # the flydsl:: ops ran as extern kernels: their launches count
        assert st["flydsl::gemm"]["hits"] == 4 * len(MS)
