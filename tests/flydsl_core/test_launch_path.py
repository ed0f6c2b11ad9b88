"""The launch path: bound calls reuse compiles exactly when their specializations agree."""

from __future__ import annotations

import pytest
import torch

import flydsl_core as fly
from flydsl_core import backends
from flydsl_core.runtime.binder import generic_key, make_key_fn

pytestmark = pytest.mark.cpu


class _Recorder:
    """A backend that counts compiles and records launches instead of running them."""

    def __init__(self):
        self.compiles = 0
        self.launches = []

    def compile(self, fn, spec, options):
        self.compiles += 1
        return self

    def launch(self, grid, args):
        self.launches.append((grid, args))


@pytest.fixture
def rec():
    r = _Recorder()
    backends._instances["recorder"] = r
    yield r
    del backends._instances["recorder"]


def _kernel():
    @fly.kernel
    def scale(x: fly.Tensor, out: fly.Tensor, n: int, alpha, BLOCK: fly.constexpr):
        i = fly.program_id(0)
        out.tile((BLOCK,), i).store(x.tile((BLOCK,), i).load() * alpha)

    return scale


def test_hits_skip_compiles_and_pass_fresh_arguments(rec):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    k[(4,)](x, o, 64, 2.0, BLOCK=16, target="recorder")
    x2, o2 = torch.randn(64), torch.empty(64)
    k[(4,)](x2, o2, 64, 3.0, BLOCK=16, target="recorder")
    assert rec.compiles == 1
    assert (
        rec.launches[1][1][0] is x2 and rec.launches[1][1][2] == 64 and rec.launches[1][1][3] == 3.0
    )
    assert rec.launches[1][0] == (4, 1, 1)


def test_constexpr_values_are_never_confused(rec):
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    k[(4,)](x, o, 64, 2.0, 16, target="recorder")  # BLOCK passed positionally
    k[(2,)](x, o, 64, 2.0, 32, target="recorder")
    k[(2,)](x, o, 64, 2.0, BLOCK=32, target="recorder")
    assert rec.compiles == 2


def test_new_facts_compile_again(rec):
    k = _kernel()
    k[(1,)](torch.randn(64), torch.empty(64), 64, 1.0, BLOCK=16, target="recorder")
    k[(1,)](
        torch.randn(63), torch.empty(63), 63, 1.0, BLOCK=16, target="recorder"
    )  # n no longer % 16
    k[(1,)](
        torch.randn(80), torch.empty(80), 80, 1.0, BLOCK=16, target="recorder"
    )  # same facts as 64
    k[(1,)](
        torch.randn(64).to(torch.bfloat16),
        torch.empty(64, dtype=torch.bfloat16),
        64,
        1.0,
        BLOCK=16,
        target="recorder",
    )
    base = torch.randn(65)
    k[(1,)](base[1:], torch.empty(64), 64, 1.0, BLOCK=16, target="recorder")  # misaligned data
    assert rec.compiles == 4  # 64; 63; bf16; misaligned (80 shares 64's facts)


def test_generated_and_generic_keys_agree_on_equality():
    k = _kernel()
    x, o = torch.randn(64), torch.empty(64)
    gen = make_key_fn(k)
    calls = [
        ((x, o, 64, 2.0), {"BLOCK": 16}),
        ((x, o, 64, 5.0), {"BLOCK": 16}),
        ((x, o, 63, 2.0), {"BLOCK": 16}),
    ]
    g = [gen(*a, **kw) for a, kw in calls]
    p = [generic_key(k, a, kw) for a, kw in calls]
    assert (g[0] == g[1]) and (p[0] == p[1])
    assert (g[0] != g[2]) and (p[0] != p[2])


def test_keyword_tensors_and_grid_functions(rec):
    k = _kernel()
    x, o = torch.randn(40), torch.empty(40)
    k[lambda a: (fly.cdiv(a["n"], a["BLOCK"]),)](
        x=x, out=o, n=40, alpha=1.0, BLOCK=16, target="recorder"
    )
    assert rec.launches[-1][0] == (3, 1, 1)
    assert rec.launches[-1][1][0] is x
