"""Memory access of the FlyDSL language on both CPU backends (the ``target`` fixture).

Loads and stores through ``tile``, ``x[i]``, ``fly.ds`` slices (with steps),
static slices, gathers with index tiles, explicit ``mask=``/``other=``, on
contiguous and non-contiguous tensors, and every atomic. Each test compares
with plain PyTorch on seeded random data; outputs start as a sentinel, and
tensors passed as slices of a larger buffer check that nothing outside the
view is written.
"""

from __future__ import annotations

import pytest
import torch
from tests.flydsl_core.conftest import (
    INTERPRET,
    REF,
    SENTINEL,
    assert_bits,
    data,
    gen,
    randint,
    randn,
    sentinel_like,
)

import flydsl_core as fly
from flydsl_core.layout import Layout

pytestmark = pytest.mark.cpu


# ---------------------------------------------------------------------------------------------
# tiles
# ---------------------------------------------------------------------------------------------


@fly.kernel
def copy_1d(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    pid = fly.program_id(0)
    out.tile((B,), pid).store(x.tile((B,), pid).load())


DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=[str(d).removeprefix("torch.") for d in DTYPES])
def test_tile_copy_1d_every_dtype(target, dtype):
    for n in (0, 1, 13, 37):
        x = data((n,), dtype, seed=n)
        buf = sentinel_like((n + 20,), dtype)
        out = buf[5 : 5 + n]  # a window of a larger buffer: the tail tile must not spill
        copy_1d[(max(1, fly.cdiv(n, 16)),)](x, out, B=16, target=target)
        assert_bits(out, x)
        assert_bits(buf[:5], sentinel_like((5,), dtype))
        assert_bits(buf[5 + n :], sentinel_like((15,), dtype))


@fly.kernel
def tile_2d(x: fly.Tensor, out: fly.Tensor, BM: fly.constexpr, BN: fly.constexpr):
    i, j = fly.program_id(0), fly.program_id(1)
    t = x.tile((BM, BN), (i, j)).load()
    out.tile((BM, BN), (i, j)).store(t * 2 + 1)


def launch_2d(x, out, BM=4, BN=8, *, target):
    m, n = x.shape
    tile_2d[(max(1, fly.cdiv(m, BM)), max(1, fly.cdiv(n, BN)))](x, out, BM=BM, BN=BN, target=target)


@pytest.mark.parametrize("shape", [(5, 7), (1, 13), (9, 1), (8, 16), (0, 5), (3, 0)])
def test_tile_2d_grid(target, shape):
    x = randn(shape, seed=1)
    buf = torch.full((shape[0] + 3, shape[1] + 5), float(SENTINEL))
    out = buf[1 : 1 + shape[0], 2 : 2 + shape[1]]
    launch_2d(x, out, target=target)
    assert_bits(out, x * 2 + 1)
    mask = torch.ones_like(buf, dtype=torch.bool)
    mask[1 : 1 + shape[0], 2 : 2 + shape[1]] = False
    assert bool((buf[mask] == SENTINEL).all())


NONCONTIG = {
    "transposed": lambda b: b.T,
    "column_step": lambda b: b[:, ::2],
    "row_step_offset": lambda b: b[1::3, 2:],
    "both_steps_T": lambda b: b[::2, 1::3].T,
    "expanded": lambda b: b[:1, :].expand(5, b.shape[1]),
}


@pytest.mark.parametrize("kind", list(NONCONTIG))
def test_non_contiguous_inputs_and_outputs(target, kind):
    base = randn((11, 14), seed=2)
    x = NONCONTIG[kind](base)
    assert not x.is_contiguous()
    out_base = torch.full((x.shape[1] + 2, x.shape[0] + 3), float(SENTINEL))
    out = out_base[1 : 1 + x.shape[1], : x.shape[0]].T  # a non-contiguous output too
    launch_2d(x, out, target=target)
    assert_bits(out, x * 2 + 1)
    untouched = out_base.clone()
    untouched[1 : 1 + x.shape[1], : x.shape[0]] = float(SENTINEL)
    assert bool((untouched == SENTINEL).all())


# ---------------------------------------------------------------------------------------------
# indexing: x[i], chained views, scalars
# ---------------------------------------------------------------------------------------------


@fly.kernel
def rows_kernel(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    r = fly.program_id(0)
    row = x[r].tile((B,), 0).load(other=0.0)
    out[r, 0].store(fly.sum(row, 0))  # a scalar store
    out[r][1].store(x[r, 0].load() + x[r][x.shape[1] - 1].load())  # scalar loads, chained


@pytest.mark.parametrize("shape", [(4, 9), (1, 1), (3, 16), (6, 2)])
def test_row_index_and_scalar_access(target, shape):
    x = randn(shape, seed=3)
    out = torch.full((shape[0], 2), float(SENTINEL))
    rows_kernel[(shape[0],)](x, out, B=16, target=target)
    assert torch.allclose(out[:, 0], x.sum(1), rtol=1e-6, atol=1e-6)
    assert_bits(out[:, 1], x[:, 0] + x[:, -1])


@fly.kernel
def index3d_kernel(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    i, j = fly.program_id(0), fly.program_id(1)
    out[j, i].tile((B,), 0).store(x[i, j].tile((B,), 0).load(other=-1))  # a fixed pair of dims


def test_index_two_dims_of_3d(target):
    x = randint(-100, 100, (3, 4, 5), seed=4)
    out = torch.full((4, 3, 5), SENTINEL, dtype=torch.int32)
    index3d_kernel[(3, 4)](x, out, B=8, target=target)
    assert_bits(out, x.transpose(0, 1))


# ---------------------------------------------------------------------------------------------
# slices: fly.ds with run-time starts and steps, static slices
# ---------------------------------------------------------------------------------------------


@fly.kernel
def ds_kernel(x: fly.Tensor, out: fly.Tensor, start: int, SIZE: fly.constexpr, STEP: fly.constexpr):
    out.tile((SIZE,), 0).store(x[fly.ds(start, SIZE, STEP)].load(other=-1.0))


@pytest.mark.parametrize("n", [1, 10, 37])
@pytest.mark.parametrize("start", [0, 3, 9])
@pytest.mark.parametrize("step", [1, 2, 5])
def test_ds_slices_with_steps(target, n, start, step):
    SIZE = 8
    x = randn((n,), seed=5)
    out = torch.full((SIZE,), float(SENTINEL))
    ds_kernel[(1,)](x, out, start, SIZE=SIZE, STEP=step, target=target)
    want = torch.full((SIZE,), -1.0)
    got = x[start::step][:SIZE]
    want[: got.numel()] = got
    assert_bits(out, want)


@fly.kernel
def ds2d_kernel(
    x: fly.Tensor, out: fly.Tensor, r0: int, c0: int, BM: fly.constexpr, BN: fly.constexpr
):
    pid = fly.program_id(0)
    v = x[fly.ds(r0 + pid * BM, BM), fly.ds(c0, BN, 2)].load(other=0)
    out[fly.ds(pid * BM, BM), :].tile((None, BN), (0, 0)).store(v)


def test_ds_2d_with_run_time_offsets(target):
    x = randint(-1000, 1000, (13, 20), seed=6)
    r0, c0, BM, BN = 2, 3, 4, 16
    rows = fly.cdiv(13 - r0, BM)
    out = torch.full((rows * BM, BN), SENTINEL, dtype=torch.int32)
    ds2d_kernel[(rows,)](x, out, r0, c0, BM=BM, BN=BN, target=target)
    want = torch.zeros(rows * BM, BN, dtype=torch.int32)
    sub = x[r0:, c0::2][:, :BN]
    want[: sub.shape[0], : sub.shape[1]] = sub
    assert_bits(out, want)


@fly.kernel
def static_slice_kernel(
    x: fly.Tensor, y: fly.Tensor, out1: fly.Tensor, out2: fly.Tensor, out3: fly.Tensor
):
    out1.tile((8,), 0).store(x[2:10].load(other=0.5))
    out2.tile((4,), 0).store(x[1:12:3].load(other=0.5))
    out3.tile((3, 7), (0, 0)).store(y[1:4, 2:9].load(other=0.5))


@pytest.mark.parametrize("n, shape", [(37, (6, 11)), (7, (3, 5)), (2, (2, 3))])
def test_static_slices(n, shape):
    x = randn((n,), seed=7)
    y = randn(shape, seed=8)
    out1, out2, out3 = torch.empty(8), torch.empty(4), torch.empty(3, 7)
    static_slice_kernel[(1,)](x, y, out1, out2, out3, target=REF)

    def padded(src, size):
        p = torch.full(size, 0.5)
        p[tuple(slice(0, s) for s in src.shape)] = src
        return p

    assert_bits(out1, padded(x[2:10], (8,)))
    assert_bits(out2, padded(x[1:12:3], (4,)))
    assert_bits(out3, padded(y[1:4, 2:9], (3, 7)))


@fly.kernel
def chained_view_kernel(x: fly.Tensor, out: fly.Tensor, s: int):
    v = x[fly.ds(s, 20, 2)][fly.ds(1, 5, 3)]  # a strided slice of a strided slice
    out[0][fly.ds(0, 5)].store(v.load(other=-1.0))
    w = x[fly.ds(s, 32, 2)].tile((4,), 1)  # the second 4-block of a strided slice
    out[1][fly.ds(0, 4)].store(w.load(other=-1.0))
    u = x.tile((8,), 1)[2:6]  # a static slice of a tile
    out[2][fly.ds(0, 4)].store(u.load(other=-1.0))


@pytest.mark.parametrize("n, s", [(40, 3), (20, 3), (12, 0)])
def test_chained_views(n, s):
    x = randn((n,), seed=30)
    out = torch.full((3, 8), float(SENTINEL))
    chained_view_kernel[(1,)](x, out, s, target=REF)

    def pick(idx):
        row = torch.full((8,), float(SENTINEL))
        row[: len(idx)] = torch.tensor([x[i].item() if i < n else -1.0 for i in idx])
        return row

    assert_bits(out[0], pick([s + 2 * (1 + 3 * k) for k in range(5)]))
    assert_bits(out[1], pick([s + 8 + 2 * k for k in range(4)]))
    assert_bits(out[2], pick([10 + k for k in range(4)]))


@fly.kernel
def layout_kernel(x: fly.Tensor, out: fly.Tensor, L: fly.constexpr):
    # a static Layout tiler permutes the block: element k reads x[L(k)]
    out.tile((8,), 0).store(x.tile((L,), 0).load(other=-1.0))


def test_layout_tiler_permutes_the_block(target):
    L = Layout((4, 2), (2, 1))  # k -> (k % 4) * 2 + k // 4
    x = randn((7,), seed=9)
    out = torch.empty(8)
    layout_kernel[(1,)](x, out, L=L, target=target)
    perm = [(k % 4) * 2 + k // 4 for k in range(8)]
    want = torch.tensor([x[p].item() if p < 7 else -1.0 for p in perm])
    assert_bits(out, want)


# ---------------------------------------------------------------------------------------------
# gathers and scatters
# ---------------------------------------------------------------------------------------------


@fly.kernel
def gather_kernel(x: fly.Tensor, idx: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    pid = fly.program_id(0)
    i = idx.tile((B,), pid).load(other=-1)
    out.tile((B,), pid).store(x[i].load(other=-5.0))  # out-of-range indices are masked


@pytest.mark.parametrize("n, m", [(10, 13), (1, 5), (37, 40), (0, 6)])
def test_gather_masks_out_of_range_indices(target, n, m):
    x = randn((n,), seed=10)
    idx = randint(-3, n + 4, (m,), seed=11)
    out = torch.full((m,), float(SENTINEL))
    gather_kernel[(fly.cdiv(m, 16),)](x, idx, out, B=16, target=target)
    ok = (idx >= 0) & (idx < n)
    want = torch.full((m,), -5.0)
    want[ok] = x[idx[ok].long()]
    assert_bits(out, want)


@fly.kernel
def gather2d_kernel(
    x: fly.Tensor,
    ridx: fly.Tensor,
    cidx: fly.Tensor,
    out_r: fly.Tensor,
    out_c: fly.Tensor,
    out_b: fly.Tensor,
    B: fly.constexpr,
):
    r = ridx.tile((B,), 0).load(other=-1)
    c = cidx.tile((B,), 0).load(other=-1)
    rows = x[r, fly.ds(0, B)].load(other=0)  # gather rows, slice columns
    out_r.tile((B, B), (0, 0)).store(rows)
    cols = x[:, c].tile((B, None), (0, 0)).load(other=0)  # whole rows tiled, gathered columns
    out_c.tile((B, B), (0, 0)).store(cols)
    both = x[r, c].load(other=0)  # a gather on both axes: the outer product of the indices
    out_b.tile((B, B), (0, 0)).store(both)


def test_gather_along_either_axis_of_2d(target):
    x = randint(1, 1000, (6, 9), seed=12)
    ridx = torch.tensor([5, 0, -1, 2, 6, 2], dtype=torch.int32)
    cidx = torch.tensor([8, 9, 0, 3, 3, -2, 1], dtype=torch.int32)
    out_r = torch.full((6, 9), SENTINEL, dtype=torch.int32)
    out_c = torch.full((6, 7), SENTINEL, dtype=torch.int32)
    out_b = torch.full((6, 7), SENTINEL, dtype=torch.int32)
    gather2d_kernel[(1,)](x, ridx, cidx, out_r, out_c, out_b, B=16, target=target)
    xp = torch.zeros(x.shape[0] + 1, x.shape[1] + 1, dtype=torch.int32)  # an extra zero row/col
    xp[:-1, :-1] = x

    def clamp_oob(i, n):
        return torch.where((i >= 0) & (i < n), i, n).long()

    assert_bits(out_r, xp[clamp_oob(ridx, 6)][:, :9])
    assert_bits(out_c, xp[:6][:, clamp_oob(cidx, 9)])
    assert_bits(out_b, xp[clamp_oob(ridx, 6)][:, clamp_oob(cidx, 9)])


@fly.kernel
def scatter_kernel(x: fly.Tensor, idx: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    i = idx.tile((B,), 0).load(other=-1)
    out[i].store(x.tile((B,), 0).load())


def test_scatter_store_masks_out_of_range(target):
    n = 11
    perm = torch.randperm(n, generator=gen(13)).to(torch.int32)
    idx = torch.cat([perm, torch.tensor([n, -1, n + 5], dtype=torch.int32)])
    x = randn((idx.numel(),), seed=14)
    buf = torch.full((n + 8,), float(SENTINEL))
    out = buf[4 : 4 + n]
    scatter_kernel[(1,)](x, idx, out, B=16, target=target)
    want = torch.empty(n)
    want[perm.long()] = x[:n]
    assert_bits(out, want)
    assert bool((buf[:4] == SENTINEL).all()) and bool((buf[4 + n :] == SENTINEL).all())


# ---------------------------------------------------------------------------------------------
# explicit masks and other
# ---------------------------------------------------------------------------------------------


@fly.kernel
def mask_kernel(x: fly.Tensor, out: fly.Tensor, fill: float, BM: fly.constexpr, BN: fly.constexpr):
    r = fly.arange(0, BM)[:, None]
    c = fly.arange(0, BN)[None, :]
    view = x.tile((BM, BN), (0, 0))
    a = view.load(mask=(r + c) % 3 != 0, other=fill)  # a run-time scalar other
    b = view.load(
        mask=r < 2, other=fly.full((BM, BN), -1.0, fly.fp32)
    )  # a broadcast mask, tile other
    d = view.load(mask=c > 0, other=7)  # a Python number other (cast to the tensor dtype)
    out[0].tile((BM, BN), (0, 0)).store(a)
    out[1].tile((BM, BN), (0, 0)).store(b)
    out[2].tile((BM, BN), (0, 0)).store(d)
    out[3].tile((BM, BN), (0, 0)).store(a + b, mask=c % 2 == 0)  # a masked store
    out[4].tile((BM, BN), (0, 0)).store(1.0, mask=(r == 1) & (c < 3))  # a broadcast scalar value


@pytest.mark.parametrize("shape", [(5, 7), (1, 1), (8, 16), (3, 13)])
def test_explicit_mask_and_other(target, shape):
    BM, BN = 8, 16
    x = randn(shape, seed=15)
    fill = -3.25
    out = torch.full((5, *shape), float(SENTINEL))
    mask_kernel[(1,)](x, out, fill, BM=BM, BN=BN, target=target)
    m, n = shape
    r = torch.arange(m)[:, None]
    c = torch.arange(n)[None, :]
    a = torch.where((r + c) % 3 != 0, x, fill)
    b = torch.where(r < 2, x, -1.0).expand(m, n)
    assert_bits(out[0], a)
    assert_bits(out[1], b)
    assert_bits(out[2], torch.where(c > 0, x, 7.0))
    assert_bits(out[3], torch.where(c % 2 == 0, a + b, float(SENTINEL)))
    assert_bits(out[4], torch.where((r == 1) & (c < 3), 1.0, float(SENTINEL)).expand(m, n))


def test_load_cache_hints_are_accepted(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
        out.tile((B,), 0).store(x.tile((B,), 0).load(cache="cg", eviction="evict_last"))

    x = randn((9,), seed=16)
    out = torch.empty(9)
    k[(1,)](x, out, B=16, target=target)
    assert_bits(out, x)


def test_unmasked_access_with_bounds_check_off_in_bounds(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
        pid = fly.program_id(0)
        out.tile((B,), pid).store(
            x.tile((B,), pid).load(bounds_check=False) + 1, bounds_check=False
        )

    x = randn((32,), seed=17)
    out = torch.empty(32)
    k[(4,)](x, out, B=8, target=target)
    assert_bits(out, x + 1)


# ---------------------------------------------------------------------------------------------
# atomics
# ---------------------------------------------------------------------------------------------

ATOMIC_OPS = {
    "add": lambda a, b: a + b,
    "max": max,
    "min": min,
    "xchg": lambda a, b: b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
}


@fly.kernel
def atomic_kernel(
    t: fly.Tensor,
    idx: fly.Tensor,
    v: fly.Tensor,
    old: fly.Tensor,
    KIND: fly.constexpr,
    B: fly.constexpr,
):
    pid = fly.program_id(0)
    i = idx.tile((B,), pid).load(other=0)
    val = v.tile((B,), pid).load()
    lane = pid * B + fly.arange(0, B)
    live = lane < idx.shape[0]  # masked-off lanes do nothing
    r = getattr(t[i], "atomic_" + KIND)(val, mask=live)
    assert r.dtype == val.dtype
    old.tile((B,), pid).store(r)


def sequential_atomics(kind, t, idx, v, B):
    """Programs in order, lanes one after another: the serialization the reference backend runs."""
    t = t.clone()
    old = torch.empty_like(v)
    f = ATOMIC_OPS[kind]
    for j in range(idx.numel()):
        k = int(idx[j])
        old[j] = t[k]
        t[k] = f(t[k].item(), v[j].item())
    return t, old


ATOMIC_CASES = [
    (kind, dtype)
    for kind in ATOMIC_OPS
    for dtype in (torch.int32, torch.int64, torch.float32, torch.float16)
    if not (dtype.is_floating_point and kind in ("and", "or", "xor"))  # bitwise: integers only
]


@pytest.mark.parametrize(
    "kind, dtype", ATOMIC_CASES, ids=[f"{k}-{str(d)[6:]}" for k, d in ATOMIC_CASES]
)
def test_atomics_with_repeated_addresses(target, kind, dtype):
    if target == INTERPRET and dtype == torch.float16 and kind in ("max", "min", "xchg"):
        pytest.skip(f"Triton's interpreter has no fp16 atomic_{kind}")
    for n, m, unique in [(5, 37, False), (1, 6, False), (20, 13, False), (40, 29, True)]:
        check_atomics(kind, dtype, n, m, unique, target=target)


def check_atomics(kind, dtype, n, m, unique, *, target):
    B = 16
    if unique:  # distinct addresses: the backend's vectorized path
        idx = torch.randperm(n, generator=gen(18))[:m].to(torch.int32)
    else:  # repeats within a tile and across programs: the serialized path
        idx = randint(0, n, (m,), seed=18)
    if dtype.is_floating_point:  # small integers: float sums stay exact in any order
        v = randint(-8, 9, (m,), seed=19).to(dtype)
        t = randint(-8, 9, (n,), seed=20).to(dtype)
    else:
        v = randint(-(2**20), 2**20, (m,), dtype, seed=19)
        t = randint(-(2**20), 2**20, (n,), dtype, seed=20)
    want_t, want_old = sequential_atomics(kind, t, idx, v, B)
    old = torch.full((m,), SENTINEL, dtype=dtype)
    atomic_kernel[(fly.cdiv(m, B),)](t, idx, v, old, KIND=kind, B=B, target=target)
    assert_bits(t, want_t)
    if target == INTERPRET and dtype.is_floating_point and kind in ("max", "min") and not unique:
        # Triton makes a float max/min two integer atomics (lanes >= 0, then the others):
        # another valid order of the lanes at one address, so other old values.
        return
    assert_bits(old, want_old)


@fly.kernel
def counter_kernel(
    c: fly.Tensor, out: fly.Tensor, hist: fly.Tensor, x: fly.Tensor, B: fly.constexpr
):
    pid = fly.program_id(0) + fly.program_id(1) * fly.num_programs(0)
    out[pid].store(c[0].atomic_add(1))  # a scalar atomic: every program gets its own ticket
    v = x.tile((B,), pid).load(other=0)
    hist.tile((4,), 0).atomic_add(fly.sum(v[None, :] == fly.arange(0, 4)[:, None], 1))


def test_scalar_atomic_counter_and_histogram(target):
    grid = (3, 4)
    P, B = 12, 8
    x = randint(0, 4, (P * B - 5,), seed=21)
    c = torch.zeros(1, dtype=torch.int32)
    out = torch.full((P,), SENTINEL, dtype=torch.int32)
    hist = torch.zeros(4, dtype=torch.int32)
    counter_kernel[grid](c, out, hist, x, B=B, target=target)
    assert c.item() == P
    assert sorted(out.tolist()) == list(range(P))
    want_hist = torch.bincount(x.long(), minlength=4).to(torch.int32)
    want_hist[0] += 5  # the masked tail lanes read other=0
    assert_bits(hist, want_hist)


@fly.kernel
def atomic_tile_kernel(t: fly.Tensor, v: fly.Tensor, old: fly.Tensor, B: fly.constexpr):
    r = t.tile((B,), 0).atomic_max(v.tile((B,), 0).load(other=0))
    old.tile((B,), 0).store(r)


def test_atomic_on_a_tile_is_bounds_masked(target):
    n = 9
    buf = torch.full((n + 10,), SENTINEL, dtype=torch.int32)
    t = buf[3 : 3 + n]
    t.copy_(randint(-50, 50, (n,), seed=22))
    before = t.clone()
    v = randint(-50, 50, (n,), seed=23)
    old = torch.full((n,), 0, dtype=torch.int32)
    atomic_tile_kernel[(1,)](t, v, old, B=16, target=target)
    assert_bits(t, torch.maximum(before, v))
    assert_bits(old, before)
    assert bool((buf[:3] == SENTINEL).all()) and bool((buf[3 + n :] == SENTINEL).all())


@fly.kernel
def cas_kernel(
    t: fly.Tensor,
    idx: fly.Tensor,
    cmp: fly.Tensor,
    v: fly.Tensor,
    old: fly.Tensor,
    B: fly.constexpr,
):
    pid = fly.program_id(0)
    i = idx.tile((B,), pid).load()
    r = t[i].atomic_cas(cmp.tile((B,), pid).load(), v.tile((B,), pid).load())
    old.tile((B,), pid).store(r)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_atomic_cas_returns_old_values(target, dtype):
    n, B, P = 6, 8, 3
    m = B * P  # whole tiles: atomic_cas has no mask
    idx = randint(0, n, (m,), seed=24)
    t = randint(0, 3, (n,), seed=25).to(dtype)
    cmp = randint(0, 3, (m,), seed=26).to(dtype)  # matches often
    v = randint(3, 100, (m,), seed=27).to(dtype)
    want_t, want_old = t.clone(), torch.empty(m, dtype=dtype)
    for j in range(m):
        k = int(idx[j])
        want_old[j] = want_t[k]
        if want_t[k] == cmp[j]:
            want_t[k] = v[j]
    old = torch.full((m,), SENTINEL, dtype=dtype)
    cas_kernel[(P,)](t, idx, cmp, v, old, B=B, target=target)
    assert_bits(t, want_t)
    assert_bits(old, want_old)


def test_atomic_cas_as_a_lock(target):
    @fly.kernel
    def lock_kernel(lock: fly.Tensor, won: fly.Tensor):
        pid = fly.program_id(0)
        won[pid].store(lock[0].atomic_cas(0, pid + 1))

    lock = torch.zeros(1, dtype=torch.int32)
    won = torch.full((5,), SENTINEL, dtype=torch.int32)
    lock_kernel[(5,)](lock, won, target=target)
    assert lock.item() == 1  # program 0 ran first and took it
    assert won.tolist() == [0, 1, 1, 1, 1]


# ---------------------------------------------------------------------------------------------
# run-time sizes
# ---------------------------------------------------------------------------------------------


@fly.kernel
def sizes_kernel(x: fly.Tensor, out: fly.Tensor):
    out[0].store(x.shape[0])
    out[1].store(x.size(1))
    out[2].store(x.numel())
    out[3].store(x.stride[0])
    out[4].store(x.stride[1])


@pytest.mark.parametrize(
    "make", [lambda: torch.empty(5, 7), lambda: torch.empty(7, 5).T, lambda: torch.empty(1, 16)]
)
def test_run_time_sizes_and_strides(target, make):
    x = make()
    out = torch.full((5,), SENTINEL, dtype=torch.int32)
    sizes_kernel[(1,)](x, out, target=target)
    assert out.tolist() == [x.shape[0], x.shape[1], x.numel(), x.stride(0), x.stride(1)]


@fly.kernel
def report_static_strides(x: fly.Tensor, out: fly.Tensor):
    known = [x.static_stride(d) for d in range(2)]
    vals = [-1 if s is None else s for s in known]
    out[fly.ds(0, 2)].store(fly.where(fly.arange(0, 2) == 0, vals[0], vals[1]))


@pytest.mark.parametrize("transpose", [False, True])
def test_static_stride_reports_the_specialized_unit_stride(transpose):
    x = torch.randn(6, 10)
    x = x.t() if transpose else x
    out = torch.zeros(2, dtype=torch.int32)
    report_static_strides[(1,)](x, out)
    # only a stride of 1 is specialized into a constant; the other is a run-time value
    assert out.tolist() == ([1, -1] if transpose else [-1, 1])
