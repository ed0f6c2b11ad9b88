"""PyTorch's own OpInfo samples for nn.functional.rms_norm and topk, torch_flydsl on vs off."""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import torch_flydsl

pytestmark = pytest.mark.cpu

OPS = {o.name: o for o in op_db if o.name in ("nn.functional.rms_norm", "topk")}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def _run(op, sample, grad):
    inp = sample.input.detach().clone().requires_grad_(grad)
    args = [
        a.detach().clone().requires_grad_(grad) if torch.is_tensor(a) else a for a in sample.args
    ]
    out = op(inp, *args, **sample.kwargs)
    grads = None
    if grad and torch.is_tensor(out) and out.numel():
        g = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype)
        leaves = [inp] + [a for a in args if torch.is_tensor(a)]
        grads = torch.autograd.grad(out, leaves, g, allow_unused=True)
    return out, grads


def _samples(name, dtype, grad=False):
    op = OPS[name]
    return list(op.sample_inputs("cpu", dtype, requires_grad=grad))


def test_opinfo_entries_exist():
    assert set(OPS) == {"nn.functional.rms_norm", "topk"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_samples(cpu_backend, dtype):
    op = OPS["nn.functional.rms_norm"]
    rtol, atol = TOL[dtype]
    for s in _samples("nn.functional.rms_norm", dtype, grad=True):
        out, grads = _run(op, s, grad=True)
        with torch_flydsl.disabled():
            rout, rgrads = _run(op, s, grad=True)
        torch.testing.assert_close(out, rout, rtol=rtol, atol=atol, equal_nan=True)
        if grads is not None:
            for a, b in zip(grads, rgrads):
                if a is None or b is None:
                    assert a is None and b is None
                    continue
                # the weight gradient sums rows: scale the tolerance with them
                torch.testing.assert_close(a, b, rtol=4 * rtol, atol=4 * atol * max(1, a.numel()))
    st = torch_flydsl.stats()["_fused_rms_norm"]
    assert st["hits"] > 0 and st["calls"] == st["hits"] + sum(st["fallbacks"].values())


def test_rms_norm_error_inputs(cpu_backend):
    op = OPS["nn.functional.rms_norm"]
    n = 0
    for e in op.error_inputs("cpu"):
        s = e.sample_input
        with pytest.raises(e.error_type) as ours:
            op(s.input, *s.args, **s.kwargs)
        with torch_flydsl.disabled(), pytest.raises(e.error_type) as theirs:
            op(s.input, *s.args, **s.kwargs)
        assert str(ours.value) == str(theirs.value)
        n += 1
    assert n >= 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_samples(cpu_backend, dtype):
    op = OPS["topk"]
    for s in _samples("topk", dtype):
        (v, i), _ = _run(op, s, grad=False)
        with torch_flydsl.disabled():
            (rv, ri), _ = _run(op, s, grad=False)
        torch.testing.assert_close(v, rv, rtol=0, atol=0, equal_nan=True)
        x = s.input
        if x.dim():
            dim = s.args[1] if len(s.args) > 1 else s.kwargs.get("dim", -1)
            torch.testing.assert_close(x.gather(dim, i), v, rtol=0, atol=0, equal_nan=True)
            # indices are exact where the selected values have no ties in their row
            xs = x.movedim(dim, -1)
            vals = v.movedim(dim, -1)
            for row in range(xs.reshape(-1, xs.shape[-1]).shape[0]):
                xr = xs.reshape(-1, xs.shape[-1])[row]
                if xr.unique().numel() == xr.numel():
                    assert torch.equal(
                        i.movedim(dim, -1).reshape(-1, vals.shape[-1])[row],
                        ri.movedim(dim, -1).reshape(-1, vals.shape[-1])[row],
                    )
        else:
            assert torch.equal(i, ri)
    st = torch_flydsl.stats()["topk"]
    assert st["hits"] > 0 and st["fallbacks"]  # some samples are eligible, some are not


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_samples_out_variant(cpu_backend, dtype):
    for s in _samples("topk", dtype):
        x = s.input
        rv, ri = torch.topk(x, *s.args, **s.kwargs)
        v, i = torch.empty_like(rv), torch.empty_like(ri)
        torch.topk(x, *s.args, **s.kwargs, out=(v, i))
        torch.testing.assert_close(v, rv, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(i, ri)  # same implementation on and off the out= path
