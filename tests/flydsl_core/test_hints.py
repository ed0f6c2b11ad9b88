"""Value hints (``fly.hint``): checked on the reference backend, kept by the interpreter, and
turned into wide loads on gfx950 where Triton cannot derive them (swizzled layout views)."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core.backends.reference.rules import ReferenceRuntimeError
from flydsl_core.exc import TypeCheckError
from flydsl_core.language import views
from flydsl_core.language.hints import static_facts
from flydsl_core.layout import Layout, Swizzle, make_swizzled_layout


@fly.kernel
def gather_hinted(
    x: fly.Tensor, idx: fly.Tensor, out: fly.Tensor, C: fly.constexpr, M: fly.constexpr
):
    i = idx.tile((64,), 0).load()
    j = fly.hint(i, contiguous=C, multiple_of=M)
    out.tile((64,), 0).store(x[j].load(bounds_check=False))


def _runs_of_4(g):
    # 16 aligned runs of 4 consecutive indices, each starting at a multiple of 8
    starts = torch.randperm(16, generator=g) * 8
    return (starts[:, None] + torch.arange(4)).flatten().to(torch.int32)


@pytest.mark.cpu
@pytest.mark.parametrize("target", ["cpu-reference", "cpu-interpret"])
def test_true_hints_leave_values_unchanged(target):
    g = torch.Generator().manual_seed(1)
    x, idx = torch.randn(200, generator=g), _runs_of_4(g)
    out = torch.empty(64)
    gather_hinted[(1,)](x, idx, out, C=4, M=8, target=target)
    assert torch.equal(out, x[idx.long()])


@pytest.mark.cpu
@pytest.mark.parametrize(
    ("c", "m", "what"), [(8, 1, "runs of 8"), (4, 16, "divisible by 16"), (1, 2, "divisible by 2")]
)
def test_the_reference_backend_rejects_false_hints(c, m, what):
    g = torch.Generator().manual_seed(2)
    idx = _runs_of_4(g)
    if m == 2:
        idx = idx + 1  # odd starts
    with pytest.raises(ReferenceRuntimeError, match=what):
        gather_hinted[(1,)](torch.randn(300), idx, torch.empty(64), C=c, M=m)


@fly.kernel
def bad_hint(x: fly.Tensor, out: fly.Tensor, KIND: fly.constexpr):
    v = fly.arange(0, 16)
    if KIND == 0:
        v = fly.hint(v.to(fly.fp32), contiguous=4)
    elif KIND == 1:
        v = fly.hint(v, contiguous=3)
    elif KIND == 2:
        v = fly.hint(v, contiguous=32)
    elif KIND == 3:
        v = fly.hint(v, multiple_of=(1, 4))
    else:
        v = fly.hint(fly.program_id(0), contiguous=2)
    out.tile((16,), 0).store(x[v].load())


@pytest.mark.cpu
@pytest.mark.parametrize(
    ("kind", "match"),
    [
        (0, "integer"),
        (1, "power of two"),
        (2, "divide the shape"),
        (3, "one per axis"),
        (4, "scalar cannot be contiguous"),
    ],
)
def test_malformed_hints_are_type_errors(kind, match):
    with pytest.raises(TypeCheckError, match=match):
        bad_hint[(1,)](torch.randn(32), torch.empty(16), KIND=kind)


@pytest.mark.cpu
def test_static_facts():
    assert static_facts(torch.arange(64)) == ((64,), (1 << 16,))
    assert static_facts(torch.arange(64) + 3) == ((64,), (1,))
    assert static_facts(_runs_of_4(torch.Generator().manual_seed(0))) == ((4,), (8,))
    assert static_facts(torch.tensor(12)) == ((1,), (4,))
    two_d = torch.arange(8)[:, None] * 32 + torch.arange(16)[None, :]
    assert static_facts(two_d) == ((1, 16), (1, 32))  # down a column every value is a start
    sw = make_swizzled_layout(Swizzle(3, 2, 3), Layout((32, 32), (32, 1)))
    vals = torch.tensor([[sw((i, j)) for j in range(32)] for i in range(32)])
    assert static_facts(vals)[0] == (1, 4)  # the swizzle keeps runs of 2**base


@fly.kernel
def swizzled_copy(x: fly.Tensor, out: fly.Tensor, SRC: fly.constexpr):
    out.view(Layout((32, 32), (32, 1)), 0).store(x.view(SRC, 0).load(bounds_check=False))


@fly.kernel
def swizzled_copy_unhinted(x: fly.Tensor, out: fly.Tensor, SRC: fly.constexpr):
    # the same body, traced with the swizzle facts switched off (a separate cache entry)
    out.view(Layout((32, 32), (32, 1)), 0).store(x.view(SRC, 0).load(bounds_check=False))


SWIZZLED = make_swizzled_layout(Swizzle(3, 2, 3), Layout((32, 32), (32, 1)))


@pytest.mark.cpu
@pytest.mark.parametrize("target", ["cpu-reference", "cpu-interpret"])
def test_swizzled_views_state_their_facts_and_stay_exact(target):
    x, out = torch.randn(1024), torch.empty(1024)
    swizzled_copy[(1,)](x, out, SRC=SWIZZLED, target=target)
    ref = torch.tensor([SWIZZLED((i, j)) for i in range(32) for j in range(32)])
    assert torch.equal(out, x[ref])


@pytest.mark.compile
def test_swizzle_hints_give_128_bit_loads_on_gfx950(monkeypatch):
    x, out = torch.empty(1024, device="meta"), torch.empty(1024, device="meta")
    ck = swizzled_copy.compile(x, out, SRC=SWIZZLED, target="gfx950")
    assert "tl.max_contiguous(tl.multiple_of(" in ck.stages()["triton"]
    assert ck.report.load_widths_bits.get(128, 0) > 0, ck.report.load_widths_bits
    # without the hint Triton sees only the xor and loads 32 bits at a time
    monkeypatch.setattr(views, "_swizzle_facts", lambda layout, shape: None)
    plain = swizzled_copy_unhinted.compile(x, out, SRC=SWIZZLED, target="gfx950")
    assert "tl.max_contiguous" not in plain.stages()["triton"]
    assert set(plain.report.load_widths_bits) == {32}, plain.report.load_widths_bits
