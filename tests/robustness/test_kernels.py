"""flydsl_kernels under random misuse: TopK's function API and the grouped GEMMs' offs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from flydsl_kernels.gemm import grouped_mm
from flydsl_kernels.mx import mx_grouped_mm, to_mx
from flydsl_kernels.mx import reference as mx_reference
from flydsl_kernels.topk import topk

from .conftest import ROBUST, outcome

pytestmark = pytest.mark.cpu

# -- topk: torch.topk's rules exactly ----------------------------------------------------------

SHAPES = [(), (0,), (1,), (5,), (3, 4), (2, 0, 3)]
#: at most one argument is misused per example (None: all are fine)
MISUSE = [None, None, None, None, None, "k", "k_range", "dim", "dim_range", "largest", "sorted"]
BAD = {
    "k": [2.0, 1.5, True, None, "2", torch.tensor(1.0)],
    "k_range": [-1, 7],
    "dim": [0.0, True, None],
    "dim_range": [3, -4],
    "largest": [0, 1, None, "yes"],
    "sorted": [0, None],
}


@ROBUST
@given(
    shape=st.sampled_from(SHAPES),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    misuse=st.sampled_from(MISUSE),
    data=st.data(),
)
def test_topk_is_torch_topk(shape, dtype, misuse, data):
    x = torch.randn(shape).to(dtype)
    nd = max(x.dim(), 1)
    dim = data.draw(st.integers(-nd, nd - 1), label="dim")
    n = x.shape[dim] if x.dim() else 1
    args = {
        "k": data.draw(st.one_of(st.integers(0, n), st.just(torch.tensor(min(n, 1)))), "k"),
        "dim": dim,
        "largest": data.draw(st.booleans(), "largest"),
        "sorted": data.draw(st.booleans(), "sorted"),
    }
    if misuse is not None:
        args[misuse.removesuffix("_range")] = data.draw(st.sampled_from(BAD[misuse]), misuse)
    k = args.pop("k")
    theirs = outcome(torch.topk, x, k, **args)
    ours = outcome(topk, x, k, **args, deterministic=True)
    event("torch raised" if not theirs.ok else "torch answered")
    if not theirs.ok:
        assert ours.error is not None and type(ours.error) is type(theirs.error), ours.error
        if isinstance(theirs.error, TypeError):  # names the argument, as torch's does
            arg = str(theirs.error).split("argument '")[1].split("'")[0]
            assert f"'{arg}'" in str(ours.error)
        return
    assert ours.ok, ours.error
    (tv, ti), (v, i) = theirs.value, ours.value
    assert type(ours.value) is type(theirs.value)  # torch.return_types.topk
    assert v.shape == tv.shape and i.shape == ti.shape and i.dtype == torch.int64
    if tv.dim() == 0:
        assert torch.equal(v, tv) and torch.equal(i, ti)
        return
    d = args["dim"] % x.dim()
    assert torch.equal(v.sort(d).values, tv.sort(d).values)  # the same multiset of values
    assert torch.equal(x.gather(d, i), v)  # the indices point at them


def test_topk_unsupported_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="topk supports"):
        topk(torch.arange(5), 2)


# -- grouped GEMM offs: torch's answer or a ValueError / TypeError naming offs --------------------

M, K, N, G = 12, 16, 8, 3
#: at most one thing wrong with offs per example (None: valid)
OFFS_MISUSE = [None, None, None, "negative", "decreasing", "past", "list", "int64", "float",
               "2d", "short", "long"]  # fmt: skip


@st.composite
def offs_args(draw, groups=G, extent=M):
    """``(offs, valid)``: cumulative ends of ``groups`` groups over ``extent``, then misused."""
    values = sorted(draw(st.lists(st.integers(0, extent), min_size=groups, max_size=groups)))
    how = draw(st.sampled_from(OFFS_MISUSE))
    event(f"offs: {how or 'valid'}")
    if how == "negative":
        values[0] = -draw(st.integers(1, 3))
    elif how == "decreasing" and groups > 1:
        values[-1], values[0] = 0, max(values[-1], 1)
    elif how == "past":
        values[-1] = extent + draw(st.integers(1, 4))
    elif how == "short":
        values = values[:-1]
    elif how == "long":
        values = [*values, extent]
    if how == "list":
        return values, False
    dtype = {"int64": torch.int64, "float": torch.float32}.get(how, torch.int32)
    t = torch.tensor(values, dtype=dtype)
    return (t.reshape(1, -1) if how == "2d" else t), how is None or (
        how == "decreasing" and groups < 2
    )


def _check_error(err: BaseException | None):
    assert isinstance(err, (ValueError, TypeError)), err
    assert "offs" in str(err)


@ROBUST
@given(args=offs_args())
def test_grouped_mm_offs(args):
    offs, valid = args
    g = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=g).to(torch.bfloat16)
    b = torch.randn(G, K, N, generator=g).to(torch.bfloat16)
    ours = outcome(grouped_mm, a, b, offs)
    if not valid:
        _check_error(ours.error)
        return
    assert ours.ok, ours.error
    want = torch._grouped_mm(a, b, offs)
    end = int(offs[-1])  # rows past offs[-1] belong to no group
    torch.testing.assert_close(ours.value[:end].float(), want[:end].float(), rtol=1e-2, atol=1e-2)


@ROBUST
@given(args=offs_args(groups=2, extent=12))
def test_grouped_mm_ragged_k_offs(args):
    offs, valid = args
    a = torch.randn(5, 12).to(torch.bfloat16)  # K (12) is the ragged dimension of 2-D x 2-D
    b = torch.randn(12, 6).to(torch.bfloat16)
    ours = outcome(grouped_mm, a, b, offs)
    # any length is a group count in this form, so "short" / "long" offs are valid here
    ends = offs.tolist() if isinstance(offs, torch.Tensor) and offs.dim() == 1 else None
    valid = (
        ends is not None
        and offs.dtype == torch.int32
        and all(0 <= x <= y <= 12 for x, y in zip([0, *ends], ends))
    )
    if not valid:
        _check_error(ours.error)
        return
    assert ours.ok, ours.error
    want = torch.stack([a[:, s:e].float() @ b[s:e].float() for s, e in zip([0, *ends[:-1]], ends)])
    torch.testing.assert_close(ours.value.float(), want, rtol=1e-2, atol=1e-2)


@pytest.fixture(scope="module")
def mx_operands():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(M, 32, generator=g)
    w = torch.randn(G, 8, 32, generator=g) * 0.1
    return (*to_mx(a, torch.float8_e4m3fn), *to_mx(w, torch.float8_e4m3fn))


@ROBUST
@given(args=offs_args())
def test_mx_grouped_mm_offs(mx_operands, args):
    offs, valid = args
    ours = outcome(mx_grouped_mm, *mx_operands, "e4m3", "e4m3", offs)
    if not valid:
        _check_error(ours.error)
        return
    assert ours.ok, ours.error
    want = mx_reference.mx_grouped_mm(*mx_operands, "e4m3", "e4m3", offs)
    end = int(offs[-1])
    torch.testing.assert_close(ours.value[:end].float(), want[:end].float(), rtol=1e-2, atol=1e-2)


def test_hostile_offs_never_reach_outside_the_operands(monkeypatch):
    """The GPU path: offs not checked on the host. The kernels clamp every group to the
    operand, and the reference backend raises on any unmasked out-of-bounds access, so a
    clean run proves the in-kernel masks (the check this replaces fired before the clamp)."""
    from flydsl_kernels import _offs as offs_rule

    monkeypatch.setattr(offs_rule, "_check_values", lambda *a, **k: None)
    a = torch.randn(M, K).to(torch.bfloat16)
    b = torch.randn(G, K, N).to(torch.bfloat16)
    for values in ([-5, 7, M], [7, 3, M], [3, 7, 1000], [2**31 - 1, -(2**31), 5]):
        grouped_mm(a, b, torch.tensor(values, dtype=torch.int32))  # no ReferenceRuntimeError
    kk = 64
    a2, b2 = torch.randn(5, kk).to(torch.bfloat16), torch.randn(kk, 6).to(torch.bfloat16)
    for values in ([-40, 32, 64], [64, 32, 200]):
        grouped_mm(a2, b2, torch.tensor(values, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "values", [[-5, 7, M], [7, 3, M], [3, 7, 1 << 20], [2**31 - 1, -(2**31), 5]]
)
def test_hostile_gpu_offs_do_not_fault(values):
    """A GPU offs is not read on the host: the kernel's clamps must keep every access inside
    the operands (a stray one faults or corrupts the context; the next valid call shows it).
    Guard-buffer checks of the outputs belong to the GPU tier of the report."""
    a = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    b = torch.randn(G, K, N, device="cuda").to(torch.bfloat16)
    grouped_mm(a, b, torch.tensor(values, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    offs = torch.tensor([3, 7, M], dtype=torch.int32, device="cuda")
    torch.testing.assert_close(
        grouped_mm(a, b, offs).float(), torch._grouped_mm(a, b, offs).float(), rtol=1e-2, atol=1e-2
    )
