"""torch-flydsl's eager overrides with the gates opened for the device's arch.

On the GPU: ``FLYDSL_TORCH_ARCHS`` names the device's arch and ``FLYDSL_TORCH_GATES`` points
at a table whose rules open every shape of every op there (no performance claim: the test is
about the dispatch path and the results), so ``F.rms_norm`` (forward and backward through
autograd) and ``torch.topk`` (``out=`` too, deterministic mode too) run FlyDSL on the GPU;
each result must equal ATen's (within the RMSNorm tolerance; TopK exactly) and the counters
must show hits. On the CPU the same code runs on the CPU test backend (the open ``cpu`` gate).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import torch_flydsl

BF16 = torch.bfloat16


@pytest.fixture
def overrides(device, tmp_path, monkeypatch):
    if device == "cuda":
        from torch_flydsl import eligibility

        arch = eligibility.resolve_arch(None)  # what the arch gate compares (sm90 on an H200)
        rules = [
            {"arch": arch, "op": op, "dtype": dt, "source": "test: open gate"}
            for op in ("rms_norm", "rms_norm_backward", "topk")
            for dt in ("float32", "bfloat16", "float16")
        ]
        path = tmp_path / "gates.json"
        path.write_text(json.dumps({"format": "torch_flydsl.gates/1", "rules": rules}))
        monkeypatch.setenv("FLYDSL_TORCH_ARCHS", arch)
        monkeypatch.setenv("FLYDSL_TORCH_GATES", str(path))
    # rms_norm is opt-in on the CPU key (stock CPU torch decomposes F.rms_norm): named here
    torch_flydsl.enable(ops=["rms_norm", "topk"], device=device)
    torch_flydsl.reset_stats()
    yield device
    torch_flydsl.disable()


def _hits(op):
    return torch_flydsl.stats()[op]["hits"]


def test_rms_norm_forward_backward(overrides, big):
    dev = overrides
    m, n = big(6, 4096), big(257, 8192)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m, n, generator=g).to(BF16).to(dev).requires_grad_()
    w = torch.randn(n, generator=g).to(BF16).to(dev).requires_grad_()
    y = F.rms_norm(x, (n,), w, 1e-6)
    gy = torch.randn(m, n, generator=g).to(BF16).to(dev)
    y.backward(gy)
    assert _hits("_fused_rms_norm") >= 1 and _hits("_fused_rms_norm_backward") >= 1
    with torch_flydsl.disabled():
        x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y2 = F.rms_norm(x2, (n,), w2, 1e-6)
        y2.backward(gy)
    torch.testing.assert_close(y.float(), y2.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad.float(), x2.grad.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(w.grad.float(), w2.grad.float(), rtol=2e-2, atol=2e-2 * m**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, BF16, torch.float16])
def test_topk_values_and_out(overrides, big, dtype):
    dev = overrides
    m, n, k = big(5, 4096), big(1031, 4099), 8
    x = torch.randn(m, n, generator=torch.Generator().manual_seed(2)).to(dtype).to(dev)
    v, i = torch.topk(x, k)
    with torch_flydsl.disabled():
        rv, _ = torch.topk(x, k)
    assert torch.equal(v, rv) and torch.equal(x.gather(-1, i), v)
    ov, oi = torch.empty_like(v), torch.empty_like(i)
    torch.topk(x, k, out=(ov, oi))
    assert torch.equal(ov, rv)
    torch.use_deterministic_algorithms(True)
    try:
        a = torch.topk(x, k)[1]
        b = torch.topk(x, k)[1]
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(a, b)
    assert _hits("topk") >= 3 and _hits("topk.values") >= 1
