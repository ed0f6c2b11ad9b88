"""Every computing operation of the FlyDSL language, run on both CPU backends.

Each test launches a small kernel on each CPU backend (the ``target``
fixture: ``cpu-reference`` and ``cpu-interpret``) on fresh seeded random data
and compares the result with the same computation written in plain PyTorch. Shapes are awkward on purpose (non-powers of two, size 1,
empty) and tiles are larger than the data, so the view's bounds masks matter.
Memory access lives in test_language_memory.py, control flow and error
reporting in test_language_control.py.
"""

from __future__ import annotations

import functools
import math
import operator

import pytest
import torch
from tests.flydsl_core.conftest import (
    assert_close,
    assert_same,
    gen,
    randint,
    randn,
    skip_unless_tiles_fit,
    tiles_fit,
)

import flydsl_core as fly
from flydsl_core.trace.context import current

pytestmark = pytest.mark.cpu

INF = float("inf")
NAN = float("nan")
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
FLY_OF = {
    torch.float32: fly.fp32,
    torch.bfloat16: fly.bf16,
    torch.float16: fly.fp16,
    torch.float64: fly.fp64,
    torch.int8: fly.int8,
    torch.int16: fly.int16,
    torch.int32: fly.int32,
    torch.int64: fly.int64,
    torch.uint8: fly.uint8,
    torch.bool: fly.bool_,
    torch.float8_e4m3fn: fly.fp8e4m3,
    torch.float8_e5m2: fly.fp8e5m2,
}


# ---------------------------------------------------------------------------------------------
# Generic kernels: one program per block of B elements, the function under test a constexpr.
# ---------------------------------------------------------------------------------------------


@fly.kernel
def unary_1d(
    x: fly.Tensor,
    out: fly.Tensor,
    FN: fly.constexpr,
    B: fly.constexpr,
    OTHER: fly.constexpr,
    EXPECT: fly.constexpr,
):
    pid = fly.program_id(0)
    r = FN(x.tile((B,), pid).load(other=OTHER))
    if EXPECT is not None:
        assert r.dtype == EXPECT, r.dtype
    out.tile((B,), pid).store(r)


@fly.kernel
def binary_1d(
    x: fly.Tensor,
    y: fly.Tensor,
    out: fly.Tensor,
    FN: fly.constexpr,
    B: fly.constexpr,
    EXPECT: fly.constexpr,
):
    pid = fly.program_id(0)
    # Masked-off lanes read 1 so that integer division stays defined there.
    r = FN(x.tile((B,), pid).load(other=1), y.tile((B,), pid).load(other=1))
    if EXPECT is not None:
        assert r.dtype == EXPECT, r.dtype
    out.tile((B,), pid).store(r)


def run_unary(fn, x, out_dtype, *, B=16, other=None, expect=None, target):
    out = torch.empty(x.shape, dtype=out_dtype)
    grid = (max(1, fly.cdiv(x.numel(), B)),)
    unary_1d[grid](x, out, FN=fn, B=B, OTHER=other, EXPECT=expect, target=target)
    return out


def run_binary(fn, x, y, out_dtype, *, B=16, expect=None, target):
    out = torch.empty(x.shape, dtype=out_dtype)
    grid = (max(1, fly.cdiv(x.numel(), B)),)
    binary_1d[grid](x, y, out, FN=fn, B=B, EXPECT=expect, target=target)
    return out


SIZES = [1, 13, 37]  # one element, a masked tail in one tile, three programs with a tail
SIZES_EMPTY = [0, *SIZES]


# ---------------------------------------------------------------------------------------------
# program ids, arange, constants
# ---------------------------------------------------------------------------------------------


@fly.kernel
def ids_kernel(out: fly.Tensor):
    i, j, k = fly.program_id(0), fly.program_id(1), fly.program_id(2)
    n0, n1, n2 = fly.num_programs(0), fly.num_programs(1), fly.num_programs(2)
    row = out[i, j, k]
    row[0].store(i)
    row[1].store(j)
    row[2].store(k)
    row[3].store(n0)
    row[4].store(n1)
    row[5].store(n2)


@pytest.mark.parametrize("grid", [(5,), (3, 4), (2, 3, 5), (1, 1, 1)])
def test_program_id_and_num_programs(target, grid):
    full = (*grid, *(1,) * (3 - len(grid)))
    out = torch.full((*full, 6), -7, dtype=torch.int32)
    ids_kernel[grid](out, target=target)
    mesh = torch.meshgrid(*(torch.arange(g, dtype=torch.int32) for g in full), indexing="ij")
    for axis in range(3):
        assert torch.equal(out[..., axis], mesh[axis])
        assert torch.equal(out[..., 3 + axis], torch.full(full, full[axis], dtype=torch.int32))


@fly.kernel
def ids_1d_kernel(out: fly.Tensor, B: fly.constexpr):
    pid = fly.program_id(0)
    out.tile((B,), pid).store(fly.full((B,), pid, fly.int32) * 1000 + fly.arange(0, B))


def test_program_id_in_tile_arithmetic(target):
    n, B = 29, 8
    out = torch.full((n,), -1, dtype=torch.int32)
    ids_1d_kernel[(fly.cdiv(n, B),)](out, B=B, target=target)
    k = torch.arange(n, dtype=torch.int32)
    assert torch.equal(out, (k // B) * 1000 + k % B)


@fly.kernel
def creation_kernel(
    out_ar: fly.Tensor,
    out_zeros: fly.Tensor,
    out_ones: fly.Tensor,
    out_full: fly.Tensor,
    out_scalar: fly.Tensor,
    out_like: fly.Tensor,
    s: float,
    B: fly.constexpr,
    START: fly.constexpr,
    DT: fly.constexpr,
):
    ar = fly.arange(START, START + B)
    assert ar.dtype == fly.int32 and ar.shape == (B,)
    out_ar.tile((B,), 0).store(ar)
    z = fly.zeros((B,), DT)
    o = fly.ones(B, DT)
    f = fly.full((B,), -2.5 if DT.is_float else -3, DT)
    assert z.dtype == o.dtype == f.dtype == DT
    out_zeros.tile((B,), 0).store(z)
    out_ones.tile((B,), 0).store(o)
    out_full.tile((B,), 0).store(f)
    # full with a scalar tile: a run-time float argument, broadcast and cast
    fs = fly.full((2, B), s, DT)
    assert fs.shape == (2, B) and fs.dtype == DT
    out_scalar.tile((2, B), (0, 0)).store(fs)
    zl = fly.zeros_like(f)
    fl = fly.full_like(ar, 7)
    assert zl.dtype == DT and fl.dtype == fly.int32
    out_like.tile((B,), 0).store(zl + fl.to(DT))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int8])
@pytest.mark.parametrize("n", [1, 11])
def test_arange_zeros_ones_full(target, dtype, n):
    B, start = 16, 3
    s = float(randint(-50, 50, (), torch.int32, seed=n).item()) + 0.25
    outs = [torch.full((n,), 99, dtype=torch.int32)] + [
        torch.full((n,), 99, dtype=dtype) for _ in range(3)
    ]
    out_scalar = torch.full((2, n), 99, dtype=dtype)
    out_like = torch.full((n,), 99, dtype=dtype)
    creation_kernel[(1,)](
        *outs, out_scalar, out_like, s, B=B, START=start, DT=FLY_OF[dtype], target=target
    )
    assert torch.equal(outs[0], torch.arange(start, start + n, dtype=torch.int32))
    assert torch.equal(outs[1], torch.zeros(n, dtype=dtype))
    assert torch.equal(outs[2], torch.ones(n, dtype=dtype))
    assert torch.equal(
        outs[3], torch.full((n,), -2.5 if dtype.is_floating_point else -3, dtype=dtype)
    )
    # the scalar argument arrives as fp32 and is cast to the tile dtype
    assert torch.equal(out_scalar, torch.tensor(s, dtype=torch.float32).to(dtype).expand(2, n))
    assert torch.equal(out_like, torch.full((n,), 7, dtype=dtype))


# ---------------------------------------------------------------------------------------------
# elementwise arithmetic
# ---------------------------------------------------------------------------------------------


def trunc_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


INT_BINARY = [
    ("add", operator.add, torch.add),
    ("sub", operator.sub, torch.sub),
    ("mul", operator.mul, torch.mul),
    ("floordiv", operator.floordiv, trunc_div),  # C semantics: toward zero
    ("mod", operator.mod, torch.fmod),  # C semantics: sign of the dividend
    ("and", operator.and_, torch.bitwise_and),
    ("or", operator.or_, torch.bitwise_or),
    ("xor", operator.xor, torch.bitwise_xor),
    ("maximum", fly.maximum, torch.maximum),
    ("minimum", fly.minimum, torch.minimum),
]


@pytest.mark.parametrize("name, fn, ref", INT_BINARY, ids=[c[0] for c in INT_BINARY])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.int64])
def test_int_binary(target, name, fn, ref, dtype):
    for n in SIZES_EMPTY:
        x = randint(-120, 120, (n,), dtype, seed=1 + n)
        y = randint(-9, 10, (n,), dtype, seed=2 + n)
        y[y == 0] = -3  # keep division defined; negatives on both sides
        out = run_binary(fn, x, y, dtype, expect=FLY_OF[dtype], target=target)
        assert_same(out, ref(x, y))


def test_int_division_truncates_toward_zero(target):
    x = torch.tensor([7, -7, 7, -7, 0, -1, 1, I32_MIN + 1, 5, -5], dtype=torch.int32)
    y = torch.tensor([2, 2, -2, -2, 3, 2, -2, 7, 5, 5], dtype=torch.int32)
    q = run_binary(operator.floordiv, x, y, torch.int32, target=target)
    r = run_binary(operator.mod, x, y, torch.int32, target=target)
    assert q.tolist() == [3, -3, -3, 3, 0, 0, 0, -306783378, 1, -1]
    assert r.tolist() == [1, -1, 1, -1, 0, -1, 1, -1, 0, 0]
    assert torch.equal(q * y + r, x)  # the C identity


INT_WITH_NUMBERS = [
    ("x+5", lambda a, b: a + 5, lambda x: x + 5),
    ("5-x", lambda a, b: 5 - a, lambda x: 5 - x),
    ("x*-3", lambda a, b: a * -3, lambda x: x * -3),
    ("x//3", lambda a, b: a // 3, lambda x: trunc_div(x, 3)),
    ("x//-4", lambda a, b: a // -4, lambda x: trunc_div(x, -4)),
    ("x%3", lambda a, b: a % 3, lambda x: torch.fmod(x, 3)),
    ("x%-4", lambda a, b: a % -4, lambda x: torch.fmod(x, -4)),
    ("-100//b", lambda a, b: -100 // b, None),
    ("x&6", lambda a, b: a & 6, lambda x: x & 6),
    ("9|x", lambda a, b: 9 | a, lambda x: x | 9),
    ("x^-1", lambda a, b: a ^ -1, lambda x: x ^ -1),
]


@pytest.mark.parametrize("name, fn, ref", INT_WITH_NUMBERS, ids=[c[0] for c in INT_WITH_NUMBERS])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_int_with_python_numbers(target, name, fn, ref, dtype):
    x = randint(-1000, 1000, (21,), dtype, seed=3)
    y = randint(1, 9, (21,), dtype, seed=4) * torch.tensor([1, -1], dtype=dtype).repeat(11)[:21]
    out = run_binary(
        fn, x, y, dtype, expect=FLY_OF[dtype], target=target
    )  # weak: the literal takes x's dtype
    want = trunc_div(torch.full_like(y, -100), y) if ref is None else ref(x)
    assert_same(out, want)


SHIFTS = [
    ("shl", operator.lshift, torch.bitwise_left_shift),
    ("shr", operator.rshift, torch.bitwise_right_shift),
]


@pytest.mark.parametrize("name, fn, ref", SHIFTS, ids=[c[0] for c in SHIFTS])
@pytest.mark.parametrize("dtype, bits", [(torch.int32, 32), (torch.int64, 64), (torch.uint8, 8)])
def test_shifts(target, name, fn, ref, dtype, bits):
    lo = 0 if dtype == torch.uint8 else -(2**20)
    x = randint(lo, 2**7 if dtype == torch.uint8 else 2**20, (19,), torch.int64, seed=5).to(dtype)
    s = randint(0, bits, (19,), torch.int64, seed=6).to(dtype)
    out = run_binary(fn, x, s, dtype, target=target)
    assert_same(out, ref(x, s))
    # arithmetic right shift of negatives, logical of unsigned; shifts by a Python number
    out2 = run_binary(lambda a, b: fn(a, 3), x, s, dtype, target=target)
    assert_same(out2, ref(x, torch.full_like(x, 3)))


def test_unary_int_ops(target):
    x = randint(-500, 500, (23,), seed=7)
    assert_same(run_unary(operator.neg, x, torch.int32, target=target), -x)
    assert_same(run_unary(abs, x, torch.int32, target=target), x.abs())
    assert_same(run_unary(fly.abs, x, torch.int32, target=target), x.abs())
    assert_same(run_unary(operator.invert, x, torch.int32, target=target), ~x)
    assert_same(run_unary(operator.pos, x, torch.int32, target=target), x)


def test_bool_logic(target):
    a = randint(0, 2, (29,), torch.bool, seed=8)
    b = randint(0, 2, (29,), torch.bool, seed=9)
    for fn, ref in [
        (operator.and_, torch.logical_and),
        (operator.or_, torch.logical_or),
        (operator.xor, torch.logical_xor),
        (lambda p, q: ~p, lambda p, q: ~p),
        (lambda p, q: (p & ~q) | (q & ~p), torch.logical_xor),
    ]:
        assert_same(run_binary(fn, a, b, torch.bool, expect=fly.bool_, target=target), ref(a, b))


def test_int32_wraparound(target):
    g = gen(10)
    x = I32_MAX - torch.randint(0, 50, (17,), generator=g, dtype=torch.int32)
    y = torch.randint(1, 1000, (17,), generator=g, dtype=torch.int32)

    def wrap(v):
        return ((v + 2**31) % 2**32 - 2**31).to(torch.int32)

    assert_same(
        run_binary(operator.add, x, y, torch.int32, target=target), wrap(x.long() + y.long())
    )
    assert_same(
        run_binary(operator.mul, x, y, torch.int32, target=target), wrap(x.long() * y.long())
    )
    assert_same(
        run_binary(lambda a, b: -a - b - 10, x, y, torch.int32, target=target),
        wrap(-x.long() - y.long() - 10),
    )
    int8 = randint(100, 128, (9,), torch.int8, seed=11)
    assert_same(
        run_unary(lambda a: a + 100, int8, torch.int8, expect=fly.int8, target=target),
        (int8.int() + 100).to(torch.int8),
    )


@fly.kernel
def folded_int_kernel(out: fly.Tensor, v: int):
    # Constants fold at compile time; the same expressions on the run-time scalar v do not.
    c = fly.full((), I32_MAX, fly.int32)
    seven = fly.full((), 7, fly.int32)
    exprs = [c + 1, c * 3, -seven // 2, -seven % 2, seven // -2, seven % -2, (c + 1) // -1]
    vals = [v + 1, v * 3, -(v - I32_MAX + 7) // 2]
    for i, e in enumerate(exprs + vals):
        out[i].store(e)


def test_constant_folding_matches_run_time_int_semantics(target):
    out = torch.zeros(10, dtype=torch.int32)
    folded_int_kernel[(1,)](out, I32_MAX, target=target)
    want = [I32_MIN, (3 * I32_MAX + 2**31) % 2**32 - 2**31, -3, -1, -3, 1, I32_MIN]
    want += [I32_MIN, want[1], -3]
    assert out.tolist() == want


@fly.kernel
def folded_float_kernel(
    out: fly.Tensor, flags: fly.Tensor, ints: fly.Tensor, big: float, tenth: float, near: float
):
    # Each value twice: from constants (folded at compile time) and from run-time scalars.
    c, r = fly.full((), 16777217.0, fly.fp32), fly.full((), big, fly.fp32)  # fp32 holds 16777216
    out[0].store(c - 16777216.0)
    out[1].store(r - 16777216.0)
    ints[0].store(c.to(fly.int32))
    ints[1].store(r.to(fly.int32))
    ints[2].store(c.to(fly.fp64).to(fly.int64))
    ints[3].store(r.to(fly.fp64).to(fly.int64))
    flags[0].store(fly.full((), 0.1, fly.bf16) == fly.full((), 0.1001, fly.bf16))  # equal in bf16
    flags[1].store(fly.full((), tenth, fly.bf16) == fly.full((), near, fly.bf16))
    flags[2].store(c == 16777216.0)
    flags[3].store(r == 16777216.0)
    # 0.0 and -0.0 are equal but different constants
    out[2].store(1.0 / fly.full((), -0.0, fly.fp32))
    out[3].store(1.0 / fly.full((), 0.0, fly.fp32))
    out[4].store(-fly.full((), 0.0, fly.fp32))


def test_constant_folding_matches_run_time_float_semantics(target):
    out = torch.full((5,), 123.0)
    flags = torch.zeros(4, dtype=torch.bool)
    ints = torch.zeros(4, dtype=torch.int64)
    folded_float_kernel[(1,)](out, flags, ints, 16777217.0, 0.1, 0.1001, target=target)
    fp32_big = torch.tensor(16777217.0, dtype=torch.float32)
    assert out[0].item() == out[1].item() == (fp32_big - 16777216.0).item() == 0.0
    assert ints.tolist() == [16777216] * 4
    bf = torch.tensor(0.1, dtype=torch.bfloat16) == torch.tensor(0.1001, dtype=torch.bfloat16)
    assert flags.tolist() == [bool(bf), bool(bf), True, True]
    assert out[2].item() == -INF and out[3].item() == INF
    assert out[4].item() == 0.0 and bool(torch.signbit(out[4]))
    ir = folded_float_kernel.ir(out, flags, ints, 16777217.0, 0.1, 0.1001)
    assert sum(op.name == "sub" for op in ir.walk()) == 1  # only the run-time subtraction is left


FLOAT_BINARY = [
    ("add", operator.add, torch.add),
    ("sub", operator.sub, torch.sub),
    ("mul", operator.mul, torch.mul),
    ("truediv", operator.truediv, torch.div),
    ("floordiv", operator.floordiv, lambda a, b: torch.floor(a / b)),
    ("mod", operator.mod, torch.fmod),
    ("pow", lambda a, b: abs(a) ** b, lambda a, b: a.abs() ** b),
]


@pytest.mark.parametrize("name, fn, ref", FLOAT_BINARY, ids=[c[0] for c in FLOAT_BINARY])
@pytest.mark.parametrize("dtype", FLOATS)
def test_float_binary(target, name, fn, ref, dtype):
    for n in SIZES_EMPTY:
        x = randn((n,), dtype, seed=12 + n, scale=3)
        y = randn((n,), dtype, seed=13 + n, scale=2)
        out = run_binary(fn, x, y, dtype, expect=FLY_OF[dtype], target=target)
        # 16-bit arithmetic computes in fp32 and rounds once, as torch's CPU kernels do
        want = ref(x.float(), y.float()).to(dtype)
        if name == "pow":
            assert_close(out, want, rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-6)
        elif name in ("floordiv", "mod") and dtype != torch.float32:
            # floor(a / b) rounds the quotient to the 16-bit type first
            assert_same(out, ref(x, y))
        else:
            assert_same(out, want)


FLOAT_WITH_NUMBERS = [
    ("x*2", lambda a: a * 2, lambda x: x * 2),
    ("2*x", lambda a: 2 * a, lambda x: 2 * x),
    ("x+0.5", lambda a: a + 0.5, lambda x: x + 0.5),
    ("1.5-x", lambda a: 1.5 - a, lambda x: 1.5 - x),
    ("x/4", lambda a: a / 4, lambda x: x / 4),
    ("1/x", lambda a: 1 / a, lambda x: 1 / x),
    ("x**2", lambda a: a**2, lambda x: x**2),
    ("x%1.5", lambda a: a % 1.5, lambda x: torch.fmod(x, 1.5)),
    ("-x", lambda a: -a, lambda x: -x),
    ("abs", abs, torch.abs),
]


@pytest.mark.parametrize(
    "name, fn, ref", FLOAT_WITH_NUMBERS, ids=[c[0] for c in FLOAT_WITH_NUMBERS]
)
@pytest.mark.parametrize("dtype", FLOATS)
def test_float_with_python_numbers_stays_in_dtype(target, name, fn, ref, dtype):
    x = randn((19,), dtype, seed=14, scale=4)
    out = run_unary(fn, x, dtype, other=1.0, expect=FLY_OF[dtype], target=target)
    assert_same(out, ref(x))  # torch's Python scalars are weak too


def test_pow_of_ints_and_numbers_is_float(target):
    x = randint(0, 6, (11,), seed=15)
    y = randint(0, 4, (11,), seed=16)
    out = run_binary(operator.pow, x, y, torch.float32, expect=fly.fp32, target=target)
    assert_close(out, x.float() ** y.float(), rtol=1e-6, atol=0)
    out = run_unary(lambda a: 2**a, x, torch.float32, expect=fly.fp32, target=target)
    assert_close(out, 2.0 ** x.float(), rtol=1e-6, atol=0)
    out = run_unary(
        lambda a: a / 2, x, torch.float32, expect=fly.fp32, target=target
    )  # true division of ints
    assert_close(out, x.float() / 2, rtol=0, atol=0)


COMPARE = [
    ("lt", operator.lt),
    ("le", operator.le),
    ("gt", operator.gt),
    ("ge", operator.ge),
    ("eq", operator.eq),
    ("ne", operator.ne),
]


@pytest.mark.parametrize("name, fn", COMPARE, ids=[c[0] for c in COMPARE])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_comparisons(target, name, fn, dtype):
    if dtype.is_floating_point:
        x = randint(-3, 4, (25,), seed=17).to(dtype) / 2
        y = randint(-3, 4, (25,), seed=18).to(dtype) / 2
        x[3], y[5], x[7], y[7] = NAN, NAN, NAN, NAN
    else:
        x = randint(0, 5, (25,), dtype, seed=17)
        y = randint(0, 5, (25,), dtype, seed=18)
    out = run_binary(fn, x, y, torch.bool, expect=fly.bool_, target=target)
    assert_same(out, fn(x, y))
    out = run_binary(lambda a, b: fn(a, 2), x, y, torch.bool, expect=fly.bool_, target=target)
    assert_same(out, fn(x, 2))
    out = run_binary(lambda a, b: fn(1, b), x, y, torch.bool, expect=fly.bool_, target=target)
    assert_same(out, fn(torch.ones_like(y), y))


# ---------------------------------------------------------------------------------------------
# type promotion
# ---------------------------------------------------------------------------------------------

PROMOTIONS = [
    (torch.int32, torch.float32, torch.float32),
    (torch.int64, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float16, torch.float32),
    (torch.float16, torch.float32, torch.float32),
    (torch.bfloat16, torch.float32, torch.float32),
    (torch.int32, torch.int64, torch.int64),
    (torch.int8, torch.int32, torch.int32),
    (torch.int16, torch.int8, torch.int16),
    (torch.uint8, torch.int8, torch.int8),  # equal width: signed wins
    (torch.bool, torch.int32, torch.int32),
    (torch.bool, torch.float16, torch.float16),
]


@pytest.mark.parametrize(
    "da, db, want", PROMOTIONS, ids=[f"{a}+{b}".replace("torch.", "") for a, b, _ in PROMOTIONS]
)
def test_promotion(target, da, db, want):
    x = randint(0, 100, (13,), torch.int64, seed=19).to(da)
    y = randint(0, 100, (13,), torch.int64, seed=20).to(db)
    if da.is_floating_point:
        x = randn((13,), da, seed=19, scale=10)
    if db.is_floating_point:
        y = randn((13,), db, seed=20, scale=10)
    out = run_binary(operator.add, x, y, want, expect=FLY_OF[want], target=target)
    assert_same(out, x.to(want) + y.to(want))
    out = run_binary(operator.mul, y, x, want, expect=FLY_OF[want], target=target)
    assert_same(out, y.to(want) * x.to(want))


WEAK = [
    (torch.bfloat16, lambda a: a * 2, 2, torch.bfloat16),
    (torch.float16, lambda a: a + 0.1, 0.1, torch.float16),
    (torch.int8, lambda a: a + 1, 1, torch.int8),
    (torch.uint8, lambda a: a + 200, 200, torch.uint8),
    (torch.int8, lambda a: a + 1000, 1000, torch.int32),  # does not fit: the literal's own int32
    (torch.int32, lambda a: a * 2.5, 2.5, torch.float32),  # int with float: float
    (torch.int64, lambda a: a - 3, 3, torch.int64),
    (torch.bool, lambda a: a + 1, 1, torch.int32),
]


@pytest.mark.parametrize(
    "dtype, fn, num, want", WEAK, ids=[f"{d}-{w}".replace("torch.", "") for d, _, _, w in WEAK]
)
def test_weak_typing_of_python_numbers(target, dtype, fn, num, want):
    if dtype.is_floating_point:
        x = randn((15,), dtype, seed=21, scale=5)
    else:
        x = randint(0, 100, (15,), torch.int64, seed=21).to(dtype)
    out = run_unary(fn, x, want, expect=FLY_OF[want], target=target)
    xv = x.to(want)
    if want in (torch.int8, torch.uint8):  # computed in the narrow type: wraps
        ref = (x.long() + num).to(want)
    else:
        ref = fn(xv)
    assert_same(out, ref)


# ---------------------------------------------------------------------------------------------
# math functions
# ---------------------------------------------------------------------------------------------

MATH = [
    ("exp", fly.exp, torch.exp, False),
    ("exp2", fly.exp2, torch.exp2, False),
    ("log", fly.log, torch.log, True),
    ("log2", fly.log2, torch.log2, True),
    ("sqrt", fly.sqrt, torch.sqrt, True),
    ("rsqrt", fly.rsqrt, torch.rsqrt, True),
    ("erf", fly.erf, torch.erf, False),
    ("tanh", fly.tanh, torch.tanh, False),
    ("reciprocal", fly.reciprocal, torch.reciprocal, True),
    ("sigmoid", fly.sigmoid, torch.sigmoid, False),
    ("sin", fly.sin, torch.sin, False),
    ("cos", fly.cos, torch.cos, False),
    ("floor", fly.floor, torch.floor, False),
    ("ceil", fly.ceil, torch.ceil, False),
]


@pytest.mark.parametrize("name, fn, ref, positive", MATH, ids=[m[0] for m in MATH])
@pytest.mark.parametrize("dtype", FLOATS)
def test_math_functions(target, name, fn, ref, positive, dtype):
    for n in (1, 27):
        x = randn((n,), torch.float32, seed=22 + n, scale=3)
        if positive:
            x = x.abs() + 0.05
        x = x.to(dtype)
        out = run_unary(fn, x, dtype, other=1.0, expect=FLY_OF[dtype], target=target)
        want = ref(x.float()).to(dtype)
        if dtype == torch.float32:
            assert_close(out, want, rtol=1e-6, atol=1e-7)
        else:  # 16-bit inputs compute in fp32 and round once: exact
            assert_same(out, want)


@pytest.mark.parametrize("name, fn, ref, positive", MATH, ids=[m[0] for m in MATH])
def test_math_of_ints_computes_in_fp32(target, name, fn, ref, positive):
    x = randint(1 if positive else -5, 6, (9,), seed=23)
    out = run_unary(fn, x, torch.float32, other=1, expect=fly.fp32, target=target)
    assert_close(out, ref(x.float()), rtol=1e-6, atol=1e-7)


def test_fma(target):
    x, y, z = (randn((21,), seed=s) for s in (24, 25, 26))

    @fly.kernel
    def fma_kernel(x: fly.Tensor, y: fly.Tensor, z: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
        v = [t.tile((B,), 0).load() for t in (x, y, z)]
        out.tile((B,), 0).store(fly.fma(*v))

    out = torch.empty(21)
    fma_kernel[(1,)](x, y, z, out, B=32, target=target)
    assert_close(out, x * y + z, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
@pytest.mark.parametrize("n", [0, 1, 23])
def test_maximum_minimum_propagate_nan(target, dtype, n):
    x = randint(-4, 5, (n,), seed=27).to(dtype)
    y = randint(-4, 5, (n,), seed=28).to(dtype)
    if dtype.is_floating_point and n > 5:
        x[1], y[2], x[4], y[4] = NAN, NAN, NAN, NAN
        x[3], y[5] = INF, -INF
    assert_same(run_binary(fly.maximum, x, y, dtype, target=target), torch.maximum(x, y))
    assert_same(run_binary(fly.minimum, x, y, dtype, target=target), torch.minimum(x, y))
    assert_same(
        run_binary(lambda a, b: fly.maximum(a, 1), x, y, dtype, target=target),
        torch.maximum(x, torch.ones_like(x)),
    )
    assert_same(
        run_binary(lambda a, b: fly.minimum(0, b), x, y, dtype, target=target),
        torch.minimum(torch.zeros_like(y), y),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_where(target, dtype):
    x = randint(-9, 10, (31,), seed=29).to(dtype)
    y = randint(-9, 10, (31,), seed=30).to(dtype)
    assert_same(
        run_binary(lambda a, b: fly.where(a > b, a, b), x, y, dtype, target=target),
        torch.where(x > y, x, y),
    )
    assert_same(
        run_binary(lambda a, b: fly.where(a < 0, 0, b), x, y, dtype, target=target),
        torch.where(x < 0, torch.zeros_like(y), y),
    )
    # a non-bool condition means "!= 0"; both values numbers: they take the default dtypes
    out = run_binary(lambda a, b: fly.where(a, b, -1), x, y, dtype, target=target)
    assert_same(out, torch.where(x != 0, y, torch.full_like(y, -1)))
    # broadcast condition: a scalar
    out = run_binary(
        lambda a, b: fly.where(fly.program_id(0) == 0, a, b), x, y, dtype, B=8, target=target
    )
    assert_same(out, torch.cat([x[:8], y[8:]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_clamp(target, dtype):
    x = randn((29,), torch.float32, seed=31, scale=3)
    if dtype == torch.int32:
        x = (x * 10).to(dtype)
        lo, hi = -7, 12
    else:
        x = x.to(dtype)
        x[4], x[9] = NAN, INF
        lo, hi = -0.75, 1.5
    out = run_unary(lambda a: fly.clamp(a, lo, hi), x, dtype, target=target)
    assert_same(out, torch.clamp(x, lo, hi))
    lo_t = randn((29,), dtype=torch.float32, seed=32).to(dtype) - 1
    out = run_binary(lambda a, b: fly.clamp(a, b, b + 2), x, lo_t, dtype, target=target)
    assert_same(out, torch.minimum(torch.maximum(x, lo_t), lo_t + 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32])
def test_isnan(target, dtype):
    x = randn((19,), torch.float32, seed=33).to(dtype)
    if dtype.is_floating_point:
        x[[0, 5, 18]] = NAN
        x[3] = INF
    out = run_unary(fly.isnan, x, torch.bool, expect=fly.bool_, target=target)
    assert_same(out, torch.isnan(x))


# ---------------------------------------------------------------------------------------------
# casts and bitcasts
# ---------------------------------------------------------------------------------------------

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def fp8_reference(x, to):
    """torch's own conversion of the clamped value: saturation to the finite max, NaN kept."""
    info = torch.finfo(to)
    x = x.double()
    return torch.where(torch.isnan(x), x, x.clamp(info.min, info.max)).to(to)


@fly.kernel
def cast_kernel(
    x: fly.Tensor, out: fly.Tensor, B: fly.constexpr, TO: fly.constexpr, METHOD: fly.constexpr
):
    pid = fly.program_id(0)
    t = x.tile((B,), pid).load()
    if METHOD == "to":
        r = t.to(TO)
    elif METHOD == "astype":
        r = t.astype(TO)
    else:
        r = fly.cast(t, TO)
    assert r.dtype == TO
    out.tile((B,), pid).store(r)


def run_cast(x, to, method="cast", B=16, *, target):
    out = torch.empty(x.shape, dtype=to)
    cast_kernel[(max(1, fly.cdiv(x.numel(), B)),)](
        x, out, B=B, TO=FLY_OF[to], METHOD=method, target=target
    )
    return out


def special_floats(n, *, seed, scale):
    x = randn((n,), torch.float32, seed=seed, scale=scale)
    x[:8] = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1e6, -1e6, 1e-9])
    return x


@pytest.mark.parametrize("src", FLOATS)
@pytest.mark.parametrize("to", FP8)
@pytest.mark.parametrize("scale", [1.0, 300.0, 1e5])
def test_cast_to_fp8_rounds_and_saturates(target, src, to, scale):
    x = special_floats(45, seed=34, scale=scale).to(src)
    out = run_cast(x, to, target=target)
    assert_same(out, fp8_reference(x, to))


def test_fp8_round_to_nearest_even_and_saturation_values(target):
    # e4m3 has 3 mantissa bits: the spacing in [1, 2) is 1/8; ties go to the even mantissa
    x = torch.tensor([1.0625, 1.1875, -1.0625, 1.3125, 448.0, 464.0, 1000.0, -INF, INF, NAN])
    out = run_cast(x, torch.float8_e4m3fn, target=target).float()
    want = torch.tensor([1.0, 1.25, -1.0, 1.25, 448.0, 448.0, 448.0, -448.0, 448.0, NAN])
    assert_same(out, want)
    # e5m2 has 2 mantissa bits: spacing 1/4 in [1, 2); the finite max is 57344 (e5m2 has inf)
    x = torch.tensor([1.125, 1.375, 1.625, 57344.0, 61440.0, 1e9, -INF, NAN])
    out = run_cast(x, torch.float8_e5m2, target=target).float()
    want = torch.tensor([1.0, 1.5, 1.5, 57344.0, 57344.0, 57344.0, -57344.0, NAN])
    assert_same(out, want)


@pytest.mark.parametrize("src", FP8)
@pytest.mark.parametrize("to", [*FLOATS, *FP8])
def test_cast_from_fp8(target, src, to):
    x = special_floats(33, seed=35, scale=50.0)
    x = fp8_reference(x, src)
    out = run_cast(x, to, target=target)
    want = fp8_reference(x.float(), to) if to in FP8 else x.float().to(to)
    assert_same(out, want)


@pytest.mark.parametrize("src", [torch.int32, torch.int64, torch.uint8])
@pytest.mark.parametrize("to", FP8)
def test_cast_int_to_fp8_saturates(target, src, to):
    x = randint(
        -200000 if src != torch.uint8 else 0,
        200000 if src != torch.uint8 else 256,
        (27,),
        torch.int64,
        seed=36,
    )
    x = x.to(src)
    assert_same(run_cast(x, to, target=target), fp8_reference(x, to))


FLOAT_CASTS = [(a, b) for a in [*FLOATS, torch.float64] for b in [*FLOATS, torch.float64] if a != b]


@pytest.mark.parametrize(
    "src, to", FLOAT_CASTS, ids=[f"{a}->{b}".replace("torch.", "") for a, b in FLOAT_CASTS]
)
@pytest.mark.parametrize("method", ["cast", "to", "astype"])
def test_float_casts(target, src, to, method):
    x = special_floats(23, seed=37, scale=1e3).to(src)
    assert_same(run_cast(x, to, method, target=target), x.to(to))


INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]


@pytest.mark.parametrize("src", [*FLOATS, torch.float64])
@pytest.mark.parametrize("to", INTS)
def test_float_to_int_truncates(target, src, to):
    lo = 0 if to == torch.uint8 else torch.iinfo(to).min
    hi = torch.iinfo(to).max if to != torch.int64 else 2**40
    if src in (torch.bfloat16, torch.float16):
        hi = min(hi, 60000)
        lo = max(lo, -60000)
    g = gen(38)
    x = (torch.rand(41, generator=g, dtype=torch.float64) * (0.98 * (hi - lo)) + lo * 0.98).to(src)
    x[:6] = torch.tensor([2.7, -2.7 if lo < 0 else 2.2, 0.5, 0.0, 1.999, 3.0]).to(src)
    out = run_cast(x, to, target=target)
    assert_same(out, x.double().trunc().to(to))


@pytest.mark.parametrize("src", INTS)
@pytest.mark.parametrize("to", [*INTS, torch.float32, torch.bfloat16, torch.float16])
def test_int_casts_wrap(target, src, to):
    info = torch.iinfo(src)
    x = torch.randint(
        max(info.min, -(2**40)), min(info.max, 2**40), (37,), generator=gen(39), dtype=torch.int64
    )
    x = x.to(src)
    # int -> narrower int keeps the low bits (two's complement), int -> float rounds to nearest
    assert_same(run_cast(x, to, target=target), x.to(to))


@pytest.mark.parametrize(
    "src", [torch.float32, torch.bfloat16, torch.int32, torch.uint8, torch.int64]
)
def test_cast_to_and_from_bool(target, src):
    x = randint(-2, 3, (29,), torch.int64, seed=40)
    x = x.abs().to(src) if src == torch.uint8 else x.to(src)
    if src.is_floating_point:
        x[3] = NAN
        x[4] = -0.0
    assert_same(run_cast(x, torch.bool, target=target), x != 0)
    b = x != 0
    assert_same(run_cast(b, src, target=target), b.to(src))


BITCASTS = [
    (torch.float32, torch.int32),
    (torch.int32, torch.float32),
    (torch.bfloat16, torch.int16),
    (torch.int16, torch.bfloat16),
    (torch.float16, torch.int16),
    (torch.int16, torch.float16),
    (torch.bfloat16, torch.float16),
    (torch.int8, torch.uint8),
    (torch.uint8, torch.int8),
    (torch.float8_e4m3fn, torch.uint8),
    (torch.uint8, torch.float8_e5m2),
    (torch.float64, torch.int64),
]


@fly.kernel
def bitcast_kernel(
    x: fly.Tensor, out: fly.Tensor, B: fly.constexpr, TO: fly.constexpr, METHOD: fly.constexpr
):
    t = x.tile((B,), 0).load()
    r = fly.bitcast(t, TO) if METHOD else t.to(TO, bitcast=True)
    out.tile((B,), 0).store(r)


@pytest.mark.parametrize(
    "src, to", BITCASTS, ids=[f"{a}->{b}".replace("torch.", "") for a, b in BITCASTS]
)
@pytest.mark.parametrize("method", [True, False])
def test_bitcast_is_bit_exact(target, src, to, method):
    nbytes = torch.empty((), dtype=src).element_size()
    raw = torch.randint(0, 256, (21 * nbytes,), generator=gen(41), dtype=torch.uint8)
    x = raw.view(src)
    out = torch.empty(x.shape, dtype=to)
    bitcast_kernel[(1,)](x, out, B=32, TO=FLY_OF[to], METHOD=method, target=target)
    assert torch.equal(out.view(torch.uint8), x.view(to).view(torch.uint8))


def test_bitcast_of_scalar(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor):
        out[0].store(fly.bitcast(x[0].load(), fly.int32) ^ I32_MIN)

    x = randn((1,), seed=42)
    out = torch.empty(1, dtype=torch.int32)
    k[(1,)](x, out, target=target)
    assert torch.equal(out, x.view(torch.int32) ^ I32_MIN)


# ---------------------------------------------------------------------------------------------
# broadcasting and shape ops
# ---------------------------------------------------------------------------------------------


@fly.kernel
def outer_kernel(
    x: fly.Tensor, y: fly.Tensor, out: fly.Tensor, BM: fly.constexpr, BN: fly.constexpr
):
    a = x.tile((BM,), 0).load()
    b = y.tile((BN,), 0).load()
    s = a[:, None] + b[None, :]
    p = a[:, None] * b  # rank promotion on the left, as NumPy
    assert s.shape == (BM, BN) and p.shape == (BM, BN)
    out[0].tile((BM, BN), (0, 0)).store(s)
    out[1].tile((BM, BN), (0, 0)).store(p - a.reshape(BM, 1))


@pytest.mark.parametrize("m, n", [(5, 7), (1, 9), (6, 1), (0, 3)])
def test_broadcasting(target, m, n):
    x = randn((m,), seed=43)
    y = randn((n,), seed=44)
    out = torch.full((2, m, n), 123.0)
    outer_kernel[(1,)](x, y, out, BM=8, BN=16, target=target)
    assert_same(out[0], x[:, None] + y[None, :])
    assert_close(out[1], x[:, None] * y - x[:, None], rtol=1e-6, atol=1e-6)


@fly.kernel
def shape_kernel(
    x: fly.Tensor,
    o_reshape: fly.Tensor,
    o_t: fly.Tensor,
    o_perm: fly.Tensor,
    o_bc: fly.Tensor,
    A: fly.constexpr,
    B: fly.constexpr,
    C: fly.constexpr,
):
    n = A * B * C
    t = x.tile((A, B, C), (0, 0, 0)).load()
    r = t.reshape(C, A * B)
    assert fly.reshape(t, (n,)).shape == (n,)
    o_reshape.tile((C, A * B), (0, 0)).store(r)
    o_t.tile((A * B, C), (0, 0)).store(r.T)
    p = t.permute(2, 0, 1)
    assert p.shape == (C, A, B)
    assert fly.permute(t, (1, 2, 0)).shape == (B, C, A)
    o_perm.tile((C, A, B), (0, 0, 0)).store(p + fly.permute(t, (2, 0, 1)))
    row = t.reshape(n)[None, :]
    col = x.tile((A, 1, 1), (0, 0, 0)).load().reshape(A, 1)
    o_bc[0].tile((A, n), (0, 0)).store(row.broadcast_to((A, n)))
    o_bc[1].tile((A, n), (0, 0)).store(
        fly.broadcast_to(col, (A, n)) + fly.broadcast_to(1.0, (A, n))
    )


@pytest.mark.parametrize("dims", [(2, 3, 4), (2, 4, 8)])
def test_reshape_permute_transpose_broadcast_to(target, dims):
    skip_unless_tiles_fit(target, *dims)
    a, b, c = dims
    n = a * b * c
    x = randn(dims, seed=45)
    o_reshape, o_t, o_perm, o_bc = (
        torch.empty(c, a * b),
        torch.empty(a * b, c),
        torch.empty(c, a, b),
        torch.empty(2, a, n),
    )
    shape_kernel[(1,)](x, o_reshape, o_t, o_perm, o_bc, A=a, B=b, C=c, target=target)
    assert_same(o_reshape, x.reshape(c, a * b))
    assert_same(o_t, x.reshape(c, a * b).T)
    assert_same(o_perm, 2 * x.permute(2, 0, 1))
    assert_same(o_bc[0], x.reshape(1, n).expand(a, n))
    assert_same(o_bc[1], x[:, 0, 0].reshape(a, 1).expand(a, n) + 1)


def concat(a, b, axis):
    # FlyIR's concat op has no language spelling yet: emit it directly.
    return fly.Tile(current().emit("concat", [a._v, b._v], {"axis": axis}).result)


@fly.kernel
def concat_kernel(x: fly.Tensor, out: fly.Tensor):
    t = x.tile((4, 8), (0, 0)).load()
    u = fly.permute(fly.reshape(t, (2, 2, 8)), (2, 0, 1))  # (8, 2, 2)
    v = concat(t.T, t.T * 2, 1)  # (8, 8)
    w = fly.reshape(u, (8, 4))
    out.tile((8, 16), (0, 0)).store(concat(v, concat(w, w + 1, 1), 1))


def test_concat(target):
    x = randn((4, 8), seed=19)
    out = torch.empty(8, 16)
    concat_kernel[(1,)](x, out, target=target)
    w = x.reshape(2, 2, 8).permute(2, 0, 1).reshape(8, 4)
    assert_same(out, torch.cat([x.T, x.T * 2, w, w + 1], 1))


# ---------------------------------------------------------------------------------------------
# reductions and scans
# ---------------------------------------------------------------------------------------------


@fly.kernel
def reduce_kernel(
    x: fly.Tensor,
    out: fly.Tensor,
    FN: fly.constexpr,
    AXIS: fly.constexpr,
    OTHER: fly.constexpr,
    KEEP: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
    EXPECT: fly.constexpr,
):
    t = x.tile((BM, BN), (0, 0)).load(other=OTHER)
    if KEEP:
        r = FN(t, AXIS, keepdims=True)
        want = (1, BN) if AXIS == 0 else (BM, 1)
        assert r.shape == want, r.shape
        out.tile(want, (0, 0)).store(r)
    else:
        r = FN(t, AXIS)
        assert r.shape == ((BN,) if AXIS == 0 else (BM,)), r.shape
        out.tile((r.shape[0],), 0).store(r)
    assert r.dtype == EXPECT, r.dtype


def xor_reference(x, axis):
    return functools.reduce(torch.bitwise_xor, x.unbind(axis), torch.zeros_like(x.select(axis, 0)))


def run_reduce(fn, x, axis, other, out_dtype, *, keep=False, BM=8, BN=16, target):
    m, n = x.shape
    shape = ((1, n) if axis == 0 else (m, 1)) if keep else ((n,) if axis == 0 else (m,))
    out = torch.full(shape, 99, dtype=out_dtype)
    reduce_kernel[(1,)](
        x,
        out,
        FN=fn,
        AXIS=axis,
        OTHER=other,
        KEEP=keep,
        BM=BM,
        BN=BN,
        EXPECT=FLY_OF[out_dtype],
        target=target,
    )
    return out


SHAPES_2D = [(5, 7), (1, 13), (8, 1), (3, 16)]


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_accumulates_in_fp32(target, axis, dtype):
    for shape in SHAPES_2D:
        for keep in (False, True):
            x = randn(shape, dtype, seed=46, scale=3)
            out = run_reduce(fly.sum, x, axis, 0.0, torch.float32, keep=keep, target=target)
            assert_close(out, x.float().sum(axis, keepdim=keep), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 0), (0, 5)])
def test_sum_of_empty_is_zero(target, shape):
    x = randn(shape, seed=47)
    for axis in (0, 1):
        out = run_reduce(fly.sum, x, axis, 0.0, torch.float32, target=target)
        assert_same(out, x.sum(axis))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.bool])
def test_int_sum_and_prod_accumulate_in_int32(target, dtype):
    x = randint(-3, 4, (5, 7), torch.int64, seed=48).to(dtype)
    for axis in (0, 1):
        assert_same(
            run_reduce(fly.sum, x, axis, 0, torch.int32, target=target),
            x.sum(axis, dtype=torch.int32),
        )
        assert_same(
            run_reduce(fly.prod, x, axis, 1, torch.int32, target=target),
            x.to(torch.int32).prod(axis, dtype=torch.int32),
        )


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", FLOATS)
def test_prod(target, axis, dtype):
    for shape in SHAPES_2D:
        x = (torch.rand(shape, generator=gen(49)) + 0.5).to(dtype)
        out = run_reduce(fly.prod, x, axis, 1.0, torch.float32, target=target)
        assert_close(out, x.float().prod(axis), rtol=1e-5, atol=1e-6)


MAXMIN = [("max", fly.max, torch.amax, -INF), ("min", fly.min, torch.amin, INF)]


@pytest.mark.parametrize("name, fn, ref, other", MAXMIN, ids=["max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_max_min(target, name, fn, ref, other, axis, dtype):
    if dtype == torch.int32:
        other = I32_MIN if name == "max" else I32_MAX
    for shape in SHAPES_2D:
        for keep in (False, True):
            x = randn(shape, torch.float32, seed=50, scale=100).to(dtype)
            if dtype.is_floating_point and shape == (5, 7):
                x[2, 3] = NAN  # NaN propagates, as torch.amax
            out = run_reduce(fn, x, axis, other, dtype, keep=keep, target=target)
            assert_same(out, ref(x, axis, keepdim=keep))


def test_tile_reduction_methods(target):
    x = randn((6, 5), seed=51)
    for m, ref in [
        (lambda t, a, **k: t.sum(a, **k), torch.sum),
        (lambda t, a, **k: t.max(a, **k), torch.amax),
    ]:
        out = run_reduce(
            m, x, 1, 0.0 if ref is torch.sum else -INF, torch.float32, keep=True, target=target
        )
        assert_close(out, ref(x, 1, keepdim=True), rtol=1e-6, atol=1e-6)
    out = run_reduce(lambda t, a, **k: t.min(a, **k), x, 0, INF, torch.float32, target=target)
    assert_same(out, x.amin(0))


ARG = [("argmax", fly.argmax, torch.argmax, -INF), ("argmin", fly.argmin, torch.argmin, INF)]


@pytest.mark.parametrize("name, fn, ref, other", ARG, ids=["argmax", "argmin"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
def test_argmax_argmin_first_index_on_ties(target, name, fn, ref, other, axis, dtype):
    if dtype == torch.int32:
        other = I32_MIN if name == "argmax" else I32_MAX
    for shape in SHAPES_2D:
        for keep in (False, True):
            x = randint(0, 3, shape, seed=52).to(dtype)  # few distinct values: many ties
            if dtype.is_floating_point and x.numel() > 20:
                x.view(-1)[[7, 19]] = NAN  # NaN wins either way, as in torch
            out = run_reduce(fn, x, axis, other, torch.int32, keep=keep, target=target)
            assert_same(out, ref(x, axis, keepdim=keep).to(torch.int32))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_xor_sum(target, axis, dtype):
    info = torch.iinfo(dtype)
    for shape in SHAPES_2D:
        for keep in (False, True):
            x = torch.randint(
                max(info.min, -(2**40)),
                min(info.max, 2**40),
                shape,
                generator=gen(53),
                dtype=torch.int64,
            )
            x = x.to(dtype)
            out = run_reduce(fly.xor_sum, x, axis, 0, dtype, keep=keep, target=target)
            want = xor_reference(x, axis)
            assert_same(out, want.unsqueeze(axis) if keep else want)


def test_reduction_dtype_override(target):
    x = randn((4, 9), torch.bfloat16, seed=54)
    out = run_reduce(
        lambda t, a, **k: fly.sum(t, a, dtype=fly.bf16, **k),
        x,
        1,
        0.0,
        torch.bfloat16,
        target=target,
    )
    assert_close(out.float(), x.float().sum(1), rtol=2e-2, atol=2e-2)


@fly.kernel
def scan_kernel(
    x: fly.Tensor,
    out: fly.Tensor,
    FN: fly.constexpr,
    AXIS: fly.constexpr,
    OTHER: fly.constexpr,
    REV: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
):
    t = x.tile((BM, BN), (0, 0)).load(other=OTHER)
    r = FN(t, AXIS, reverse=REV)
    assert r.shape == t.shape
    out.tile((BM, BN), (0, 0)).store(r)


def torch_scan(fn, x, axis, reverse):
    def f(v):
        r = fn(v, axis)
        return r if isinstance(r, torch.Tensor) else r.values

    return f(x.flip(axis)).flip(axis) if reverse else f(x)


SCANS = [
    ("cumsum", fly.cumsum, torch.cumsum, 0.0),
    ("cumprod", fly.cumprod, torch.cumprod, 1.0),
    ("cummax", fly.cummax, torch.cummax, -INF),
    ("cummin", fly.cummin, torch.cummin, INF),
]


@pytest.mark.parametrize("name, fn, ref, other", SCANS, ids=[s[0] for s in SCANS])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_scans(target, name, fn, ref, other, axis, reverse, dtype):
    if dtype == torch.int32:
        other = {"cummax": I32_MIN, "cummin": I32_MAX}.get(name, 0 if name == "cumsum" else 1)
    # 16-bit sums and products accumulate (and return) fp32
    acc = torch.float32 if dtype == torch.bfloat16 and name in ("cumsum", "cumprod") else dtype
    for shape in [(5, 7), (1, 13), (8, 1), (0, 4)]:
        if name == "cumprod":
            x = (torch.rand(shape, generator=gen(55)) + 0.5).to(dtype)
            if dtype == torch.int32:
                x = randint(-2, 3, shape, seed=55)
        else:
            x = randn(shape, torch.float32, seed=55, scale=10).to(dtype)
        out = torch.full(shape, 99, dtype=acc)
        scan_kernel[(1,)](
            x, out, FN=fn, AXIS=axis, OTHER=other, REV=reverse, BM=8, BN=16, target=target
        )
        want = torch_scan(ref, x.to(acc), axis, reverse).to(acc)  # torch widens int32 sums
        if name in ("cummax", "cummin") or dtype == torch.int32:
            assert_same(out, want)
        else:
            assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_scan_along_rows_with_nan(target):
    x = randn((3, 9), seed=56)
    x[1, 4] = NAN
    out = torch.empty(3, 9)
    scan_kernel[(1,)](
        x, out, FN=fly.cummax, AXIS=1, OTHER=-INF, REV=False, BM=4, BN=16, target=target
    )
    assert_same(out, torch.cummax(x, 1).values)


# ---------------------------------------------------------------------------------------------
# sort and top-k
# ---------------------------------------------------------------------------------------------


@fly.kernel
def sort_kernel(
    x: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    AXIS: fly.constexpr,
    DESC: fly.constexpr,
    OTHER: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
):
    t = x.tile((BM, BN), (0, 0)).load(other=OTHER)
    v, i = fly.sort(t, AXIS, descending=DESC, return_indices=True)
    assert i.dtype == fly.int32 and v.dtype == t.dtype
    only = fly.sort(t, AXIS, descending=DESC)
    vals.tile((BM, BN), (0, 0)).store(fly.where(only == v, v, v))  # the values-only form agrees
    idx.tile((BM, BN), (0, 0)).store(i)


def sort_pad(dtype, descending):
    """A padding value that sorts after every element (stable: padding has higher indices)."""
    if dtype.is_floating_point:
        return -INF if descending else NAN  # torch puts NaN last ascending
    info = torch.iinfo(dtype)
    return info.min if descending else info.max


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int8]
)
def test_sort_stable_with_ties_and_nan(target, axis, descending, dtype):
    for shape in [(3, 11), (1, 16), (6, 1), (5, 0)]:
        # heavy ties: indices must stay in source order
        x = randint(-3, 4, shape, seed=57).to(dtype)
        if dtype.is_floating_point and x.numel() > 12:
            x.view(-1)[[1, 4]] = NAN
            x.view(-1)[2] = INF if descending else -INF
            x.view(-1)[[3, 9, 11]] = -0.0  # -0.0 and 0.0 tie
            x.view(-1)[[5, 10]] = 0.0
        # lanes past the data read a value that sorts after all of it (and after it on ties)
        vals, idx = torch.full(shape, 99, dtype=dtype), torch.full(shape, -1, dtype=torch.int32)
        pad = sort_pad(dtype, descending)
        sort_kernel[(1,)](
            x, vals, idx, AXIS=axis, DESC=descending, OTHER=pad, BM=8, BN=16, target=target
        )
        want_v, want_i = torch.sort(x, dim=axis, descending=descending, stable=True)
        assert_same(vals, want_v)
        assert_same(idx, want_i.to(torch.int32))


@fly.kernel
def topk_kernel(
    x: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    K: fly.constexpr,
    AXIS: fly.constexpr,
    LARGEST: fly.constexpr,
    OTHER: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
):
    t = x.tile((BM, BN), (0, 0)).load(other=OTHER)
    v, i = fly.topk(t, K, AXIS, largest=LARGEST)
    shape = (K, BN) if AXIS == 0 else (BM, K)
    assert v.shape == shape and i.shape == shape and i.dtype == fly.int32
    vals.tile(shape, (0, 0)).store(v)
    idx.tile(shape, (0, 0)).store(i)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_topk_ties_by_index(target, axis, largest, dtype):
    if dtype.is_floating_point:
        pad = -INF if largest else INF
    else:
        pad = I32_MIN if largest else I32_MAX
    for shape, k in [((4, 13), 5), ((1, 9), 9), ((7, 3), 1), ((3, 6), 3), ((5, 11), 4)]:
        if not tiles_fit(target, k):
            continue  # the Triton backends: tiles of k elements only where k is a power of two
        if shape[axis] < k:
            shape = shape[::-1]
        x = randint(-2, 3, shape, seed=58).to(dtype)  # many ties
        out_shape = list(shape)
        out_shape[axis] = k
        vals = torch.full(out_shape, 99, dtype=dtype)
        idx = torch.full(out_shape, -1, dtype=torch.int32)
        topk_kernel[(1,)](
            x, vals, idx, K=k, AXIS=axis, LARGEST=largest, OTHER=pad, BM=16, BN=16, target=target
        )
        # the tie rule (value order, then index ascending) is a stable sort's prefix
        sv, si = torch.sort(x, dim=axis, descending=largest, stable=True)
        assert_same(vals, sv.narrow(axis, 0, k))
        assert_same(idx, si.narrow(axis, 0, k).to(torch.int32))
        assert_same(x.gather(axis, idx.long()), vals)
        tv, _ = torch.topk(x.float(), k, dim=axis, largest=largest, sorted=True)
        assert_same(vals.float(), tv)


def test_topk_distinct_values_match_torch_topk(target):
    x = torch.randperm(60, generator=gen(59)).float().reshape(4, 15) - 30
    vals, idx = torch.empty(4, 8), torch.empty(4, 8, dtype=torch.int32)
    topk_kernel[(1,)](
        x, vals, idx, K=8, AXIS=1, LARGEST=True, OTHER=-INF, BM=4, BN=16, target=target
    )
    tv, ti = torch.topk(x, 8, dim=1)
    assert_same(vals, tv)
    assert_same(idx, ti.to(torch.int32))


# ---------------------------------------------------------------------------------------------
# dot
# ---------------------------------------------------------------------------------------------


@fly.kernel
def dot_kernel(
    a: fly.Tensor,
    b: fly.Tensor,
    c: fly.Tensor,
    out: fly.Tensor,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
    ACC: fly.constexpr,
    OUT: fly.constexpr,
):
    at = a.tile((BM, BK), (0, 0)).load()
    bt = b.tile((BK, BN), (0, 0)).load()
    if ACC:
        r = fly.dot(at, bt, c.tile((BM, BN), (0, 0)).load(), out_dtype=OUT)
    else:
        r = fly.dot(at, bt, out_dtype=OUT)
    if OUT is None:
        assert r.dtype == (fly.int32 if at.dtype.is_int else fly.fp32), r.dtype
    out.tile((BM, BN), (0, 0)).store(r)


DOT_SHAPES = [(5, 7, 3), (1, 16, 1), (9, 1, 6), (16, 16, 16)]


def make_operand(shape, dtype, seed):
    if dtype == torch.int8:
        return randint(-128, 128, shape, torch.int8, seed=seed)
    if dtype in FP8:
        return fp8_reference(randn(shape, seed=seed, scale=4), dtype)
    return randn(shape, dtype, seed=seed)


@pytest.mark.parametrize(
    "da, db",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.float32),
        (torch.float8_e4m3fn, torch.float8_e4m3fn),
        (torch.float8_e5m2, torch.float8_e5m2),
    ],
)
@pytest.mark.parametrize("acc", [False, True])
def test_dot_float(target, da, db, acc):
    for m, k, n in DOT_SHAPES:
        a, b = make_operand((m, k), da, 60), make_operand((k, n), db, 61)
        c = randn((m, n), seed=62)
        out = torch.full((m, n), 99.0)
        dot_kernel[(1,)](a, b, c, out, BM=16, BN=16, BK=16, ACC=acc, OUT=None, target=target)
        want = a.float() @ b.float() + (c if acc else 0)
        assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mkn", DOT_SHAPES)
@pytest.mark.parametrize("acc", [False, True])
def test_dot_int8_is_exact_int32(target, mkn, acc):
    m, k, n = mkn
    a, b = make_operand((m, k), torch.int8, 63), make_operand((k, n), torch.int8, 64)
    c = randint(-(2**20), 2**20, (m, n), seed=65)
    out = torch.full((m, n), 99, dtype=torch.int32)
    dot_kernel[(1,)](a, b, c, out, BM=16, BN=16, BK=16, ACC=acc, OUT=None, target=target)
    want = a.long() @ b.long() + (c.long() if acc else 0)
    assert_same(out, want.to(torch.int32))


def test_dot_out_dtype(target):
    a, b = randn((6, 10), torch.bfloat16, seed=66), randn((10, 5), torch.bfloat16, seed=67)
    out = torch.empty(6, 5, dtype=torch.bfloat16)
    dot_kernel[(1,)](a, b, out, out, BM=8, BN=8, BK=16, ACC=False, OUT=fly.bf16, target=target)
    assert_same(out, (a.float() @ b.float()).to(torch.bfloat16))


@fly.kernel
def bdot_kernel(
    a: fly.Tensor,
    b: fly.Tensor,
    out: fly.Tensor,
    BB: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
):
    at = a.tile((BB, BM, BK), (0, 0, 0)).load()
    bt = b.tile((BB, BK, BN), (0, 0, 0)).load()
    acc = fly.full((BB, BM, BN), 0.5, fly.fp32)
    out.tile((BB, BM, BN), (0, 0, 0)).store(fly.dot(at, bt, acc))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bmkn", [(3, 5, 7, 2), (1, 4, 9, 4)])
def test_dot_batched_3d(target, dtype, bmkn):
    bs, m, k, n = bmkn
    a, b = randn((bs, m, k), dtype, seed=68), randn((bs, k, n), dtype, seed=69)
    out = torch.empty(bs, m, n)
    bdot_kernel[(1,)](a, b, out, BB=4, BM=8, BN=4, BK=16, target=target)
    assert_close(out, torch.bmm(a.float(), b.float()) + 0.5, rtol=1e-5, atol=1e-5)


# -- dot_scaled (MX) ----------------------------------------------------------------------------


def e2m1_decode(nib: torch.Tensor) -> torch.Tensor:
    """fp4 e2m1 nibbles as fp32, from the bit fields: s | ee | m, exponent bias 1."""
    nib = nib.to(torch.int64)
    s, e, m = (nib >> 3) & 1, (nib >> 1) & 3, nib & 1
    mag = torch.where(
        e == 0, m.double() * 0.5, (1 + m.double() / 2) * torch.pow(2.0, (e - 1).double())
    )
    return (torch.where(s == 1, -mag, mag)).float()


def unpack_e2m1(packed: torch.Tensor, axis: int) -> torch.Tensor:
    """Two fp4 values per byte along ``axis``, the low nibble first."""
    lo, hi = e2m1_decode(packed & 0xF), e2m1_decode(packed >> 4)
    if axis == 1:
        out = torch.empty(packed.shape[0], packed.shape[1] * 2)
        out[:, 0::2], out[:, 1::2] = lo, hi
    else:
        out = torch.empty(packed.shape[0] * 2, packed.shape[1])
        out[0::2, :], out[1::2, :] = lo, hi
    return out


def e8m0_decode(s: torch.Tensor) -> torch.Tensor:
    return torch.tensor([2.0 ** (int(v) - 127) for v in s.flatten()], dtype=torch.float64).reshape(
        s.shape
    )


def mx_operand(fmt, shape_elems, axis, seed):
    """An MX element tile (as stored) and its values as fp64."""
    rows, cols = shape_elems
    if fmt == "e2m1":
        pshape = (rows, cols // 2) if axis == 1 else (rows // 2, cols)
        packed = randint(0, 256, pshape, torch.uint8, seed=seed)
        return packed, unpack_e2m1(packed, axis).double()
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    x = fp8_reference(randn(shape_elems, seed=seed, scale=3), dtype)
    return x, x.double()


@fly.kernel
def dot_scaled_kernel(
    a: fly.Tensor,
    sa: fly.Tensor,
    b: fly.Tensor,
    sb: fly.Tensor,
    c: fly.Tensor,
    out: fly.Tensor,
    FA: fly.constexpr,
    FB: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
    K: fly.constexpr,
    ACC: fly.constexpr,
):
    ka = K // 2 if FA == "e2m1" else K
    kb = K // 2 if FB == "e2m1" else K
    at = a.tile((BM, ka), (0, 0)).load()
    bt = b.tile((kb, BN), (0, 0)).load()
    sat = sa.tile((BM, K // 32), (0, 0)).load(other=127)
    sbt = sb.tile((BN, K // 32), (0, 0)).load(other=127)
    acc = c.tile((BM, BN), (0, 0)).load() if ACC else None
    out.tile((BM, BN), (0, 0)).store(fly.dot_scaled(at, sat, FA, bt, sbt, FB, acc))


MX_PAIRS = [
    ("e4m3", "e4m3"),
    ("e5m2", "e5m2"),
    ("e2m1", "e2m1"),
    ("e4m3", "e2m1"),
    ("e2m1", "e5m2"),
    ("e5m2", "e4m3"),
]


@pytest.mark.parametrize("fa, fb", MX_PAIRS, ids=[f"{a}x{b}" for a, b in MX_PAIRS])
@pytest.mark.parametrize("acc", [False, True])
def test_dot_scaled(target, fa, fb, acc):
    K = 64
    for m, n in [(5, 3), (1, 8), (8, 1)]:
        a, av = mx_operand(fa, (m, K), 1, 70 + m)
        b, bv = mx_operand(fb, (K, n), 0, 71 + n)
        sa = randint(120, 134, (m, K // 32), torch.uint8, seed=72)
        sb = randint(118, 136, (n, K // 32), torch.uint8, seed=73)
        c = randn((m, n), seed=74)
        out = torch.full((m, n), 99.0)
        dot_scaled_kernel[(1,)](
            a, sa, b, sb, c, out, FA=fa, FB=fb, BM=8, BN=8, K=K, ACC=acc, target=target
        )
        # dequantize: every 32 consecutive K elements share one power-of-two scale
        A = av * e8m0_decode(sa).repeat_interleave(32, dim=1)
        B = bv * e8m0_decode(sb).repeat_interleave(32, dim=1).T
        want = (A @ B).float() + (c if acc else 0)
        assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_dot_scaled_nan_scale(target):
    # E8M0 0xFF is NaN: every output that uses the scaled block is NaN
    K, m, n = 64, 3, 2
    a, _ = mx_operand("e4m3", (m, K), 1, 75)
    b, _ = mx_operand("e4m3", (K, n), 0, 76)
    sa = torch.full((m, K // 32), 127, dtype=torch.uint8)
    sa[1, 1] = 255
    sb = torch.full((n, K // 32), 127, dtype=torch.uint8)
    out = torch.zeros(m, n)
    dot_scaled_kernel[(1,)](
        a, sa, b, sb, out, out, FA="e4m3", FB="e4m3", BM=4, BN=4, K=K, ACC=False, target=target
    )
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2]]).any()
    assert_close(out[[0, 2]], (a.float() @ b.float())[[0, 2]], rtol=1e-5, atol=1e-4)


def test_e2m1_decoding_table():
    # every nibble once, low nibble first: the reference decoder agrees with the spec table
    assert e2m1_decode(torch.arange(16)).tolist() == [
        0,
        0.5,
        1,
        1.5,
        2,
        3,
        4,
        6,
        -0.0,
        -0.5,
        -1,
        -1.5,
        -2,
        -3,
        -4,
        -6,
    ]
    assert math.isclose(e8m0_decode(torch.tensor([127, 128, 120])).prod().item(), 2.0**-6)


# ---------------------------------------------------------------------------------------------
# scalar arguments
# ---------------------------------------------------------------------------------------------


@fly.kernel
def scalar_kernel(
    x: fly.Tensor, out: fly.Tensor, n: int, alpha: float, flag, mode, B: fly.constexpr
):
    assert isinstance(flag, bool) and (mode is None or mode is True)  # constexpr: plain values
    assert n.dtype == fly.int32 and alpha.dtype == fly.fp32
    t = x.tile((B,), 0).load()
    lane = fly.arange(0, B)
    r = t * alpha + n
    if flag:
        r = -r
    if mode is not None:
        r = r * 0
    out.tile((B,), 0).store(r, mask=lane < n)


@pytest.mark.parametrize("n", [1, 5, 16, 19])
@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("mode", [None, True])
def test_scalar_arguments(target, n, flag, mode):
    x = randn((19,), seed=75)
    alpha = 0.37
    out = torch.full((19,), 123.0)
    scalar_kernel[(1,)](x, out, n, alpha, flag, mode, B=32, target=target)
    want = x * torch.tensor(alpha, dtype=torch.float32) + n
    if flag:
        want = -want
    if mode is not None:
        want = want * 0
    want = torch.cat([want[:n], torch.full((19 - n,), 123.0)])
    assert_same(out, want)


def test_large_int_argument_is_int64(target):
    @fly.kernel
    def k(out: fly.Tensor, v: int):
        assert v.dtype == fly.int64
        out[0].store(v + 1)

    out = torch.zeros(1, dtype=torch.int64)
    k[(1,)](out, 2**40 + 3, target=target)
    assert out.item() == 2**40 + 4
