"""``TensorRef.load_at``: a load at ``base + offsets`` with the scalar base kept apart (AMD
buffer loads take it as the buffer's base). Checked on both CPU backends against torch
indexing of seeded random data (paged rows gathered tile by tile in a loop, masked tails,
awkward sizes), its bounds check on the reference backend, its errors, and the gfx950 code:
the base goes into a scalar pointer and every load of the loop stays a 128-bit buffer load
with no per-load address arithmetic."""

from __future__ import annotations

import re

import pytest
import torch

import flydsl_core as fly
from flydsl_core.backends import get_backend
from flydsl_core.backends.triton import amdgcn
from flydsl_core.exc import FlyDSLError, TypeCheckError

pytestmark = pytest.mark.cpu

TARGETS = ["cpu-reference", "cpu-interpret"]


@fly.kernel
def paged_rows(x, table, out, n, R: fly.constexpr, C: fly.constexpr, P: fly.constexpr):
    """``out[h, t*R + r, c] = x[table[t], r, h, c]`` for ``t < n`` (rows past ``P`` and
    columns past ``x``'s read -1)."""
    h = fly.program_id(0)
    r = fly.arange(0, R)
    c = fly.arange(0, C)
    rs = fly.minimum(fly.maximum(x.stride[1], 0), 1 << 19)  # a bounded stride: buffer loads
    for t in fly.range(0, n):
        page = table[t].load()
        base = page * x.stride[0] + h * x.stride[2]
        offs = r[:, None] * rs + c[None, :] * x.stride[3]
        v = x.load_at(base, offs, (r < P)[:, None] & (c < x.shape[3])[None, :], -1.0)
        out[h].tile((R, C), (t, 0)).store(v)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("P,R,H", [(5, 8, 3), (16, 16, 1), (1, 4, 2)])
def test_load_at_reads_base_plus_offsets(target, P, R, H):
    g = torch.Generator().manual_seed(P * 10 + R)
    pages, C = 7, 24
    x = torch.randn(pages, P, H, C, generator=g)
    table = torch.randperm(pages, generator=g)[:5].to(torch.int32)
    out = torch.full((H, 5 * R, 32), 99.0)
    paged_rows[(H,)](x, table, out, 5, R=R, C=32, P=P, target=target)
    for h in range(H):
        want = torch.full((5 * R, 32), -1.0)
        for t, pg in enumerate(table.tolist()):
            want[t * R : t * R + P, :C] = x[pg, :, h, :]
        torch.testing.assert_close(out[h], want, rtol=0, atol=0)


@fly.kernel
def shifted(x, out, base, B: fly.constexpr):
    out.tile((B,), 0).store(x.load_at(base, fly.arange(0, B)))


def test_load_at_out_of_bounds_is_a_reference_error():
    x = torch.randn(10)
    out = torch.zeros(4)
    shifted[(1,)](x, out, 6, B=4, target="cpu-reference")
    torch.testing.assert_close(out, x[6:10], rtol=0, atol=0)
    with pytest.raises(FlyDSLError, match="out-of-bounds"):
        shifted[(1,)](x, out, 7, B=4, target="cpu-reference")


def test_load_at_needs_a_scalar_base_and_integer_offsets():
    @fly.kernel
    def tile_base(x, out):
        out.tile((4,), 0).store(x.load_at(fly.arange(0, 4), fly.arange(0, 4)))

    @fly.kernel
    def float_offsets(x, out):
        out.tile((4,), 0).store(x.load_at(0, fly.full((4,), 1.0, fly.fp32)))

    with pytest.raises(TypeCheckError, match="base must be a scalar"):
        tile_base[(1,)](torch.zeros(8), torch.zeros(4), target="cpu-reference")
    with pytest.raises(TypeCheckError, match="offsets must be integers"):
        float_offsets[(1,)](torch.zeros(8), torch.zeros(4), target="cpu-reference")


@fly.kernel
def paged_sum(x, table, out, n, R: fly.constexpr, C: fly.constexpr, FOLD: fly.constexpr = True):
    """``out[h] = sum_t x[table[t], :R, h, :C]``: whole pages, no mask."""
    h = fly.program_id(0)
    rs = fly.minimum(fly.maximum(x.stride[1], 0), 1 << 19)
    offs = fly.arange(0, R)[:, None] * rs + fly.arange(0, C)[None, :]
    acc = fly.zeros((R, C), fly.fp32)
    for t in fly.range(0, n):
        base = table[t].load() * x.stride[0] + h * x.stride[2]
        acc += x.load_at(base, offs, fold_base=FOLD).to(fly.fp32)
    out[h].tile((R, C), (0, 0)).store(acc)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fold", [True, False])
def test_load_at_in_a_loop_with_hoisted_offsets(target, fold):
    # fold_base=False: the same elements, the base added to the offsets rather than folded
    # into the buffer's base address (one shared offset register per load on AMD)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(9, 16, 3, 32, generator=g)
    table = torch.tensor([8, 0, 3, 3, 5], dtype=torch.int32)
    out = torch.zeros(3, 16, 32)
    paged_sum[(3,)](x, table, out, 5, R=16, C=32, FOLD=fold, target=target)
    want = x[table.long()].sum(0).permute(1, 0, 2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def _spec_args():
    x = fly.TensorSpec(torch.bfloat16, (4096, 64, 8, 128))
    table = fly.TensorSpec(torch.int32, (64,))
    out = fly.TensorSpec(torch.bfloat16, (8, 64 * 64, 128))
    return x, table, out


def test_gfx950_source_keeps_the_base_in_a_scalar_pointer():
    gen = get_backend("gfx950").generate(paged_rows.ir(*_spec_args(), 64, R=64, C=128, P=64))
    src = gen.source
    assert re.search(r"_base\d+ = \(x_ptr\.to\(tl\.int64\) \+ .*\.to\(tl\.int64\) \* 2\)", src)
    assert "tl.multiple_of(tl.broadcast_to(_base" in src
    # NVIDIA and the interpreter: the plain pointer sum; so is gfx950's with fold_base=False
    nv = get_backend("sm90").generate(paged_rows.ir(*_spec_args(), 64, R=64, C=128, P=64))
    assert "to(tl.int64)" not in nv.source and "x_ptr + (" in nv.source
    x, table, _ = _spec_args()
    out = fly.TensorSpec(torch.float32, (8, 64, 128))
    ir = paged_sum.ir(x, table, out, 64, R=64, C=128, FOLD=False)
    amd = get_backend("gfx950").generate(ir)
    assert "to(tl.int64)" not in amd.source and "x_ptr + (" in amd.source


def test_gfx950_loop_loads_keep_their_offsets_across_the_loop():
    """Every load of the loop is a 128-bit buffer load whose per-lane offset register is not
    written inside the loop (with ``x[...]`` views, one vector add per load and trip)."""
    x, table, _ = _spec_args()
    out = fly.TensorSpec(torch.float32, (8, 64, 128))
    ck = paged_sum.compile(x, table, out, 64, R=64, C=128, target="gfx950")
    (lp,) = [lp for lp in amdgcn.loops(ck.executable.stages()["amdgcn"], None, "gfx950")]
    loads = [ops for m, ops in lp.instructions if m.startswith("buffer_load")]
    assert loads and all(
        m == "buffer_load_dwordx4"
        for m, _ in lp.instructions
        if m.startswith(("buffer_load", "global_load"))
    )
    written = {ops.split(",")[0].strip() for m, ops in lp.instructions if ops}
    voffsets = {ops.split(",")[1].strip() for ops in loads}
    assert voffsets and not voffsets & written, voffsets & written


@fly.kernel
def table_walk(table, out, n, W: fly.constexpr):
    """``out[b, t] = table[b, t // W]``: a scalar ``load_at`` from the row's start."""
    b = fly.program_id(0)
    for t in fly.range(0, n):
        e = table.load_at(b * table.stride[0], (t // W) * table.stride[1])
        out[b, t].store(e)


@pytest.mark.parametrize("target", TARGETS)
def test_scalar_load_at_reads_base_plus_offset(target):
    table = torch.randint(0, 1000, (3, 5), generator=torch.Generator().manual_seed(3))
    table = table.to(torch.int32)
    out = torch.zeros(3, 10, dtype=torch.int32)
    table_walk[(3,)](table, out, 10, W=2, target=target)
    torch.testing.assert_close(out, table.repeat_interleave(2, 1), rtol=0, atol=0)


def test_gfx950_scalar_load_at_adds_the_base_to_the_pointer_first():
    # the row's pointer apart from the offset, through an integer address Triton does not fold
    # back (LLVM builds it before a loop; the paged decode's page id then an SMEM load at the
    # index's byte offset: test_attention_compile); the plain sum without fold_base
    t = fly.TensorSpec(torch.int32, (64, 64))
    o = fly.TensorSpec(torch.int32, (64, 256))
    src = get_backend("gfx950").generate(table_walk.ir(t, o, 256, W=4)).source
    assert re.search(r"(_base\d+) = \(table_ptr\.to\(tl\.int64\) \+ .*\* 4\)", src), src
    assert re.search(r"tl\.load\(_base\d+ \+ ", src), src
