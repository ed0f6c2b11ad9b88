"""Control flow of the FlyDSL language, and how its errors point at the user's line.

``fly.range`` (carried values, nesting, run-time and zero-trip bounds),
``fly.static_range``, ``fly.if_`` / ``fly.else_``, ``fly.while_`` and
branches on constexpr parameters, each run on both CPU backends (the
``target`` fixture) against a plain Python/PyTorch computation; then the
trace-, verify- and run-time errors with their source locations (the
run-time ones are the reference backend's own checks).
"""

from __future__ import annotations

import pytest
import torch
from tests.flydsl_core.conftest import REF, SENTINEL, gen, line_of, ops_of, randint, randn

import flydsl_core as fly
from flydsl_core.backends.reference.rules import ReferenceRuntimeError
from flydsl_core.exc import ControlFlowError, FlyDSLError, TraceError, TypeCheckError, VerifyError

pytestmark = pytest.mark.cpu

INF_F = float("inf")


# ---------------------------------------------------------------------------------------------
# fly.range
# ---------------------------------------------------------------------------------------------


@fly.kernel
def carried_kernel(
    x: fly.Tensor, out_f: fly.Tensor, out_i: fly.Tensor, out_h: fly.Tensor, B: fly.constexpr
):
    row = fly.program_id(0)
    n = x.shape[1]
    total = fly.zeros((), fly.fp32)  # fp32 sum
    count = fly.zeros((), fly.int32)  # int32 count of positives
    best = fly.full((), float("-inf"), fly.bf16)  # bf16 running max
    seen_neg = fly.zeros((), fly.bool_)  # bool: any negative
    parts = fly.zeros((B,), fly.fp32)  # a tile, carried too
    iters = fly.zeros((), fly.int64)  # int64 trip count
    for k in fly.range(0, n, B):
        v = x[row, fly.ds(k, B)].load(other=0.0)
        lane = k + fly.arange(0, B)
        live = lane < n
        total += fly.sum(v, 0)
        count += fly.sum(((v > 0) & live).to(fly.int32), 0)
        best.set(fly.maximum(best, fly.max(fly.where(live, v, float("-inf")), 0).to(fly.bf16)))
        seen_neg |= fly.max(((v < 0) & live).to(fly.int32), 0) > 0
        parts += v
        iters += 1
    out_f[row, 0].store(total)
    out_f[row, 1].store(fly.sum(parts, 0))
    out_i[row, 0].store(count)
    out_i[row, 1].store(seen_neg)
    out_i[row, 2].store(iters)
    out_h[row].store(best)


@pytest.mark.parametrize("shape", [(3, 37), (1, 1), (2, 16), (4, 5)])
def test_range_carries_several_values_of_different_dtypes(target, shape):
    B = 8
    x = randn(shape, seed=1).to(torch.bfloat16).float()  # bf16-exact, so the bf16 max is exact
    out_f = torch.full((shape[0], 2), float(SENTINEL))
    out_i = torch.full((shape[0], 3), SENTINEL, dtype=torch.int32)
    out_h = torch.full((shape[0],), SENTINEL, dtype=torch.bfloat16)
    carried_kernel[(shape[0],)](x, out_f, out_i, out_h, B=B, target=target)
    assert torch.allclose(out_f[:, 0], x.sum(1), rtol=1e-5, atol=1e-5)
    assert torch.allclose(out_f[:, 1], x.sum(1), rtol=1e-5, atol=1e-5)
    assert torch.equal(out_i[:, 0], (x > 0).sum(1).int())
    assert torch.equal(out_i[:, 1], (x < 0).any(1).int())
    assert torch.equal(out_i[:, 2], torch.full((shape[0],), -(-shape[1] // B), dtype=torch.int32))
    assert torch.equal(out_h, x.amax(1).to(torch.bfloat16))


@fly.kernel
def nested_kernel(x: fly.Tensor, rows: fly.Tensor, total: fly.Tensor, B: fly.constexpr):
    grand = fly.zeros((), fly.fp32)
    for r in fly.range(0, x.shape[0]):
        acc = fly.zeros((B,), fly.fp32)  # created in the outer body: carried by the inner loop only
        for k in fly.range(0, x.shape[1], B):
            acc += x[r, fly.ds(k, B)].load()
        s = fly.sum(acc, 0)
        rows[r].store(s)
        grand += s
    total[0].store(grand)


@pytest.mark.parametrize("shape", [(5, 21), (1, 3), (3, 16), (0, 4)])
def test_nested_loops(target, shape):
    x = randn(shape, seed=2)
    rows = torch.full((shape[0],), float(SENTINEL))
    total = torch.full((1,), float(SENTINEL))
    nested_kernel[(1,)](x, rows, total, B=8, target=target)
    assert torch.allclose(rows, x.sum(1), rtol=1e-5, atol=1e-5)
    assert torch.allclose(total, x.sum().reshape(1), rtol=1e-5, atol=1e-5)


@fly.kernel
def bounds_kernel(out: fly.Tensor, lo: int, hi: int, step: int, STATIC_STEP: fly.constexpr):
    s = fly.zeros((), fly.int32)
    n = fly.zeros((), fly.int32)
    last = fly.full((), -1, fly.int32)
    for i in fly.range(lo, hi, STATIC_STEP if STATIC_STEP else step):
        s += i * i
        n += 1
        last.set(i)
    out[0].store(s)
    out[1].store(n)
    out[2].store(last)


@pytest.mark.parametrize(
    "lo, hi, step",
    [(0, 10, 1), (3, 17, 4), (-5, 6, 3), (7, 7, 1), (9, 2, 1), (0, 1, 16), (2, 3, 1)],
)
@pytest.mark.parametrize("static_step", [False, True])
def test_range_with_run_time_bounds_and_zero_trips(target, lo, hi, step, static_step):
    out = torch.full((3,), SENTINEL, dtype=torch.int32)
    bounds_kernel[(1,)](out, lo, hi, step, STATIC_STEP=step if static_step else 0, target=target)
    r = list(range(lo, hi, step))
    assert out.tolist() == [sum(i * i for i in r), len(r), r[-1] if r else -1]


def test_loop_index_dtype_follows_the_bounds(target):
    @fly.kernel
    def k(out: fly.Tensor, n: int, big: int):
        acc = fly.zeros((), fly.int64)
        for i in fly.range(big - big, n):  # an int64 start makes an int64 induction variable
            assert i.dtype == fly.int64
            acc += i
        for j in fly.range(0, n):
            assert j.dtype == fly.int32
        out[0].store(acc)

    out = torch.zeros(1, dtype=torch.int64)
    k[(1,)](out, 11, 2**40, target=target)  # 2**40 needs 64 bits: an int64 scalar argument
    assert out.item() == sum(range(11))


def test_loop_hints_stages_unroll_are_accepted(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
        acc = fly.zeros((B,), fly.fp32)
        for i in fly.range(0, x.shape[0], B, stages=3, unroll=2):
            acc += x[fly.ds(i, B)].load()
        out.tile((B,), 0).store(acc)

    x = randn((29,), seed=3)
    out = torch.empty(8)
    k[(1,)](x, out, B=8, target=target)
    want = torch.nn.functional.pad(x, (0, 3)).reshape(4, 8).sum(0)
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-6)


@fly.kernel
def static_kernel(x: fly.Tensor, out: fly.Tensor, N: fly.constexpr, B: fly.constexpr):
    acc = fly.zeros((B,), fly.fp32)
    pieces = []
    for i in fly.static_range(N):  # unrolled: i is a Python int
        assert isinstance(i, int)
        t = x[i].tile((B,), 0).load()
        acc += t * (i + 1)
        pieces.append(t)
    for j in fly.static_range(1, N, 2):
        acc -= pieces[j]
    out.tile((B,), 0).store(acc)


def test_static_range_unrolls(target):
    N, B = 5, 8
    x = randn((N, 6), seed=4)
    out = torch.full((6,), float(SENTINEL))
    static_kernel[(1,)](x, out, N=N, B=B, target=target)
    want = sum(x[i] * (i + 1) for i in range(N)) - sum(x[j] for j in range(1, N, 2))
    assert torch.allclose(out, want, rtol=1e-6, atol=1e-6)
    assert "for" not in ops_of(static_kernel, x, out, N=N, B=B)


# ---------------------------------------------------------------------------------------------
# fly.if_ / fly.else_
# ---------------------------------------------------------------------------------------------


@fly.kernel
def even_kernel(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    pid = fly.program_id(0)
    with fly.if_(pid % 2 == 0):  # only even programs store
        out.tile((B,), pid).store(x.tile((B,), pid).load() + 1)


def test_if_only_even_programs_store(target):
    n, B = 45, 8
    x = randn((n,), seed=5)
    out = torch.full((n,), float(SENTINEL))
    even_kernel[(fly.cdiv(n, B),)](x, out, B=B, target=target)
    block_even = (torch.arange(n) // B) % 2 == 0
    assert torch.equal(out, torch.where(block_even, x + 1, torch.tensor(float(SENTINEL))))


@fly.kernel
def branch_kernel(x: fly.Tensor, out: fly.Tensor, thr: float):
    pid = fly.program_id(0)
    v = x[pid].load()
    a = fly.zeros((), fly.fp32)
    b = fly.full((), 10, fly.int32)
    c = fly.full((), 5, fly.int32)
    with fly.if_(v > thr):
        a.set(v * 2)  # updated in both branches
        b += 1  # updated only here
    with fly.else_():
        a.set(-v)
        c *= 3  # updated only in the else branch
    only_then = fly.zeros((), fly.fp32)
    with fly.if_(v < 0):  # no else: keeps its old value where the condition fails
        only_then += 100.0
    with fly.if_(pid):  # an integer condition means != 0
        only_then += 1.0
    out[pid, 0].store(a)
    out[pid, 1].store(b)
    out[pid, 2].store(c)
    out[pid, 3].store(only_then)


def test_if_else_with_values_updated_in_one_or_both_branches(target):
    n, thr = 17, 0.25
    x = randn((n,), seed=6)
    out = torch.full((n, 4), float(SENTINEL))
    branch_kernel[(n,)](x, out, thr, target=target)
    for p in range(n):
        v = x[p].item()
        big = v > thr
        want = [
            v * 2 if big else -v,
            11 if big else 10,
            5 if big else 15,
            (100.0 if v < 0 else 0.0) + (1.0 if p else 0.0),
        ]
        assert out[p].tolist() == pytest.approx(want, rel=1e-6), (p, out[p], want)


@fly.kernel
def if_in_loop_kernel(x: fly.Tensor, out: fly.Tensor):
    pos = fly.zeros((), fly.fp32)
    neg = fly.zeros((), fly.fp32)
    flips = fly.zeros((), fly.int32)
    for i in fly.range(0, x.shape[0]):
        v = x[i].load()
        with fly.if_(v >= 0):
            pos += v
        with fly.else_():
            neg += v
            with fly.if_(i % 2 == 1):  # nested branch inside else inside a loop
                flips += 1
    out[0].store(pos)
    out[1].store(neg)
    out[2].store(flips.to(fly.fp32))


def test_if_else_inside_a_loop_with_nesting(target):
    x = randn((23,), seed=7)
    out = torch.full((3,), float(SENTINEL))
    if_in_loop_kernel[(1,)](x, out, target=target)
    odd_neg = sum(1 for i in range(23) if x[i] < 0 and i % 2 == 1)
    assert torch.allclose(
        out, torch.tensor([x[x >= 0].sum(), x[x < 0].sum(), float(odd_neg)]), rtol=1e-5, atol=1e-5
    )


def test_if_with_a_constant_tile_condition_folds_away(target):
    @fly.kernel
    def k(out: fly.Tensor):
        v = fly.full((), 3, fly.int32)
        with fly.if_(fly.full((), 2, fly.int32) > 1):
            v += 4
        with fly.else_():
            v -= 4
        out[0].store(v)

    out = torch.zeros(1, dtype=torch.int32)
    k[(1,)](out, target=target)
    assert out.item() == 7
    assert "if" not in ops_of(k, out)


# ---------------------------------------------------------------------------------------------
# fly.while_
# ---------------------------------------------------------------------------------------------


@fly.kernel
def while_kernel(x: fly.Tensor, out: fly.Tensor, thr: float):
    s = fly.zeros((), fly.fp32)
    n = fly.zeros((), fly.int32)
    size = x.shape[0]
    # the condition reads the handles as the body updates them in place: intended late binding
    for _ in fly.while_(lambda: (s <= thr) & (n < size)):  # noqa: B023
        s += x[n].load()
        n += 1
    out[0].store(n.to(fly.fp32))
    out[1].store(s)


@pytest.mark.parametrize("thr", [-1.0, 0.0, 2.5, 7.0, 1e9])
def test_while_counts_until_the_running_sum_exceeds(target, thr):
    x = torch.rand(19, generator=gen(8))
    out = torch.full((2,), float(SENTINEL))
    while_kernel[(1,)](x, out, thr, target=target)
    s, n = 0.0, 0
    while s <= thr and n < x.numel():
        s = float(torch.tensor(s, dtype=torch.float32) + x[n])  # fp32 accumulation, as the kernel
        n += 1
    assert out[0].item() == n
    assert out[1].item() == pytest.approx(s, rel=1e-6)


def test_while_collatz_steps_per_program(target):
    @fly.kernel
    def collatz(start: fly.Tensor, steps: fly.Tensor):
        pid = fly.program_id(0)
        v = start[pid].load()
        k = fly.zeros((), fly.int32)
        for _ in fly.while_(lambda: v != 1):
            v.set(fly.where(v % 2 == 0, v // 2, 3 * v + 1))
            k += 1
        steps[pid].store(k)

    start = randint(1, 60, (9,), torch.int64, seed=9)
    steps = torch.full((9,), SENTINEL, dtype=torch.int32)
    collatz[(9,)](start, steps, target=target)

    def py(v):
        k = 0
        while v != 1:
            v = v // 2 if v % 2 == 0 else 3 * v + 1
            k += 1
        return k

    assert steps.tolist() == [py(int(v)) for v in start]


# ---------------------------------------------------------------------------------------------
# constexpr branches
# ---------------------------------------------------------------------------------------------


@fly.kernel
def mode_kernel(
    x: fly.Tensor, out: fly.Tensor, MODE: fly.constexpr, SCALE: fly.constexpr, B: fly.constexpr
):
    t = x.tile((B,), 0).load()
    if MODE == "square":  # a plain Python branch on a compile-time value
        r = t * t
    elif MODE == "neg":
        r = -t
    else:
        r = t
    if SCALE is not None:
        r = r * SCALE
    out.tile((B,), 0).store(r)


@pytest.mark.parametrize("mode", ["square", "neg", "id"])
@pytest.mark.parametrize("scale", [None, 3.0])
def test_branches_on_constexpr_parameters(target, mode, scale):
    x = randn((13,), seed=10)
    out = torch.full((13,), float(SENTINEL))
    mode_kernel[(1,)](x, out, MODE=mode, SCALE=scale, B=16, target=target)
    want = {"square": x * x, "neg": -x, "id": x}[mode]
    if scale is not None:
        want = want * scale
    assert torch.equal(out, want)


def test_bool_and_none_arguments_are_constexpr(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, negate, bias, B: fly.constexpr):
        t = x.tile((B,), 0).load()
        if negate:  # a Python bool at trace time
            t = -t
        if bias is not None:
            t = t + bias
        out.tile((B,), 0).store(t)

    x = randn((7,), seed=11)
    for negate in (False, True):
        for bias in (None, 2):
            out = torch.empty(7)
            k[(1,)](x, out, negate, bias, B=8, target=target)
            want = (-x if negate else x) + (bias or 0)
            assert torch.equal(out, want)
    assert len(k._cache) == 4  # one specialization per (bool, None-ness) combination


@pytest.mark.parametrize("binder", ["generated", "generic"])
def test_constexpr_values_that_compare_equal_compile_separately(target, binder, monkeypatch):
    # 2 == 2.0 == True-ish and 0.0 == -0.0, but each traces to a different kernel
    if binder == "generic":
        monkeypatch.setenv("FLYDSL_GENERIC_BINDER", "1")

    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, S: fly.constexpr):
        r = x[0].load() * S  # int32 for an int S, fp32 for a float S
        out[0].store(r)
        out[1].store({int: 0, float: 1, bool: 2}[type(S)])
        out[2].store(
            1.0 / fly.full((), float(S) - float(S), fly.fp32) if isinstance(S, float) else 0.0
        )

    x = torch.tensor([2**30], dtype=torch.int32)
    cases = [
        (2, [-(2**31), 0, 0]),
        (2.0, [2**31, 1, INF_F]),
        (1, [2**30, 0, 0]),
        (True, [2**30, 2, 0]),
    ]
    for keyword in (True, False):
        for S, want in cases:
            out = torch.zeros(3, dtype=torch.float64)
            if keyword:
                k[(1,)](x, out, S=S, target=target)
            else:
                k[(1,)](x, out, S, target=target)
            assert out.tolist() == want, (S, keyword)
    zero = torch.zeros(3, dtype=torch.float64)
    k[(1,)](x, zero, -0.0, target=target)
    assert zero[2].item() == INF_F  # (-0.0) - (-0.0) is +0.0
    assert len(k._cache) == 5


def test_body_writing_different_tiles_in_its_two_trace_passes_is_an_error(target):
    @fly.kernel
    def k(out: fly.Tensor):
        acc = fly.zeros((), fly.int32)
        passes = []
        for _ in fly.range(0, 3):
            passes.append(1)
            if len(passes) == 2:  # trace-time state: only the second pass writes acc
                acc += 1
        out[0].store(acc)

    with pytest.raises(ControlFlowError, match="two trace passes"):
        k[(1,)](torch.zeros(1, dtype=torch.int32), target=target)


def test_while_and_range_nested_inside_branches(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor):
        pid = fly.program_id(0)
        n = x[pid].load()
        steps = fly.zeros((), fly.int32)
        tri = fly.zeros((), fly.int32)
        with fly.if_(n > 0):
            for i in fly.range(0, n):
                tri += i
            v = fly.zeros((), fly.int32)
            for _ in fly.while_(lambda: v * v < n):  # noqa: B023
                v += 1
                steps += 1
        with fly.else_():
            steps -= 1
        out[pid, 0].store(steps)
        out[pid, 1].store(tri)

    x = randint(-3, 30, (11,), seed=12)
    out = torch.full((11, 2), SENTINEL, dtype=torch.int32)
    k[(11,)](x, out, target=target)
    for p, n in enumerate(x.tolist()):
        want_steps = -1 if n <= 0 else next(v for v in range(n + 1) if v * v >= n)
        assert out[p].tolist() == [want_steps, sum(range(n)) if n > 0 else 0], (p, n)


# ---------------------------------------------------------------------------------------------
# errors and their locations
# ---------------------------------------------------------------------------------------------


@fly.kernel
def python_if_kernel(x: fly.Tensor, out: fly.Tensor):
    t = x[0].load()
    if t > 0:  # a Python if cannot test a traced value
        out[0].store(t)


def test_python_if_on_a_traced_value_raises_control_flow_error_at_its_line(target):
    with pytest.raises(ControlFlowError) as info:
        python_if_kernel[(1,)](torch.ones(1), torch.zeros(1), target=target)
    err = info.value
    assert "where" in err.msg and "constant" in err.msg
    assert err.loc is not None
    assert err.loc.file == __file__
    assert err.loc.line == line_of(python_if_kernel, "if t > 0:")
    assert f"{__file__}:{err.loc.line}" in str(err)
    assert "if t > 0" in str(err)  # the offending source line is quoted


@pytest.mark.parametrize(
    "body",
    [
        lambda t: t and t,  # `and` on a tile
        lambda t: not t,
        lambda t: max(t, t),  # Python's max
        lambda t: list(range(t)),  # a tile as a Python int
        lambda t: float(t),
        lambda t: [*t],  # iteration
    ],
    ids=["and", "not", "builtin-max", "range", "float", "iter"],
)
def test_python_uses_of_traced_values_raise_control_flow_error(target, body):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor, FN: fly.constexpr):
        t = x[0].load()
        FN(t)
        out[0].store(t)

    with pytest.raises(ControlFlowError) as info:
        k[(1,)](torch.ones(1), torch.zeros(1), FN=body, target=target)
    assert info.value.loc is not None and info.value.loc.file == __file__


@fly.kernel
def bad_dot_kernel(a: fly.Tensor, b: fly.Tensor, out: fly.Tensor):
    at = a.tile((8, 16), (0, 0)).load()
    bt = b.tile((8, 8), (0, 0)).load()
    out.tile((8, 8), (0, 0)).store(fly.dot(at, bt))  # K of 16 does not chain with 8


def test_type_error_points_at_the_kernel_line(target):
    with pytest.raises(TypeCheckError) as info:
        bad_dot_kernel[(1,)](torch.ones(8, 16), torch.ones(8, 8), torch.zeros(8, 8), target=target)
    err = info.value
    assert "dot" in err.msg
    assert err.loc.file == __file__
    assert err.loc.line == line_of(bad_dot_kernel, "fly.dot(at, bt)")


@pytest.mark.parametrize(
    "body",
    [
        lambda x: x.tile((8,), 0).load() + x.tile((4,), 0).load(),  # shapes do not broadcast
        lambda x: (
            x.tile((8,), 0).load().to(fly.fp8e4m3) + x.tile((8,), 0).load().to(fly.fp8e4m3)
        ),  # fp8
        lambda x: x.tile((8,), 0).load().to(fly.int32) << 1.5,  # a float shift amount
        lambda x: fly.sum(x.tile((8,), 0).load(), 1),  # axis out of range
        lambda x: fly.topk(x.tile((8,), 0).load(), 9),  # k larger than the axis
        lambda x: fly.where(
            x.tile((8,), 0).load() > 0, x.tile((8,), 0).load(), x.tile((4,), 0).load()
        ),
        lambda x: fly.full((2, 0), 1.0),  # tile shapes are positive
        lambda x: fly.arange(0, x.shape[0]),  # a run-time bound
    ],
    ids=[
        "broadcast",
        "fp8-math",
        "float-shift",
        "axis",
        "topk-k",
        "where-shape",
        "empty-tile",
        "arange",
    ],
)
def test_type_errors(target, body):
    @fly.kernel
    def k(x: fly.Tensor, FN: fly.constexpr):
        FN(x)

    with pytest.raises(TypeCheckError) as info:
        k[(1,)](torch.ones(8), FN=body, target=target)
    assert info.value.loc is not None and info.value.loc.file == __file__


@fly.kernel
def escaped_kernel(x: fly.Tensor, out: fly.Tensor):
    acc = fly.zeros((), fly.fp32)
    for i in fly.range(0, x.shape[0]):
        last = x[i].load()  # computed inside the loop, not carried
        acc += last
    out[0].store(last)  # used after the loop


def test_value_escaping_a_loop_raises_verify_error(target):
    with pytest.raises(VerifyError) as info:
        escaped_kernel[(1,)](torch.ones(4), torch.zeros(1), target=target)
    err = info.value
    assert "in place" in str(err)
    assert err.loc.file == __file__
    assert err.loc.line == line_of(escaped_kernel, "out[0].store(last)")


def test_value_escaping_a_branch_raises_verify_error(target):
    @fly.kernel
    def k(x: fly.Tensor, out: fly.Tensor):
        v = x[0].load()
        with fly.if_(v > 0):
            w = v * 2
        out[0].store(w)

    with pytest.raises(VerifyError, match="in place"):
        k[(1,)](torch.ones(1), torch.zeros(1), target=target)


def _brk(x: fly.Tensor, out: fly.Tensor):
    acc = fly.zeros((), fly.fp32)
    for i in fly.range(0, x.shape[0]):
        acc += x[i].load()
        break
    out[0].store(acc)


def _cont_in_if(x: fly.Tensor, out: fly.Tensor):
    acc = fly.zeros((), fly.fp32)
    for i in fly.range(0, x.shape[0]):
        v = x[i].load()
        with fly.if_(v > 0):
            continue
        acc += v
    out[0].store(acc)


def _return_in_if(x: fly.Tensor, out: fly.Tensor):
    pid = fly.program_id(0)
    with fly.if_(pid >= x.shape[0]):
        return
    out[pid].store(x[pid].load())


def _cont_in_while(x: fly.Tensor, out: fly.Tensor):
    i = fly.zeros((), fly.int32)
    for _ in fly.while_(lambda: i < x.shape[0]):  # noqa: B023
        i += 1
        if True:
            continue


def _break_in_inner_python_loop(x: fly.Tensor, out: fly.Tensor):
    acc = fly.zeros((), fly.fp32)
    for i in fly.range(0, x.shape[0]):
        for j in fly.static_range(4):
            if j == 2:
                break  # leaves the unrolled Python loop only: fine
            acc += x[i].load()
    out[0].store(acc)


@pytest.mark.parametrize(
    "fn, stmt, advice",
    [
        (_brk, "break", "fly.while_"),
        (_cont_in_if, "continue", "guard the rest of the body"),
        (_return_in_if, "return", "opposite condition"),
        (_cont_in_while, "continue", "fly.if_"),
    ],
    ids=["break-in-range", "continue-in-if", "return-in-if", "continue-in-while"],
)
def test_early_exits_from_regions_are_reported_at_their_line(target, fn, stmt, advice):
    k = fly.kernel(fn)
    with pytest.raises(ControlFlowError, match=advice) as info:
        k[(1,)](torch.ones(4), torch.zeros(4), target=target)
    assert info.value.loc.file == __file__
    assert info.value.loc.line == line_of(k, f"{stmt}\n")
    assert info.value.loc.text.strip() == stmt


def test_break_of_a_python_loop_inside_a_range_is_fine(target):
    k = fly.kernel(_break_in_inner_python_loop)
    x, out = torch.randn(5), torch.zeros(1)
    k[(1,)](x, out, target=target)
    torch.testing.assert_close(out, (2 * x.sum()).reshape(1))


@pytest.mark.parametrize(
    "body, exc",
    [
        (lambda x: fly.if_(True).__enter__(), ControlFlowError),  # a Python bool condition
        (lambda x: fly.else_().__enter__(), ControlFlowError),  # else without if
        (lambda x: fly.if_(x.tile((4,), 0).load() > 0).__enter__(), TypeCheckError),  # not a scalar
        (lambda x: fly.range(0, 4, 0), ControlFlowError),  # zero step
        (lambda x: fly.static_range(x.shape[0]), ControlFlowError),  # run-time bound
        (lambda x: fly.while_(True), ControlFlowError),  # not a function
        (lambda x: list(fly.range(0, 4.5)), TypeCheckError),  # a float bound
    ],
    ids=[
        "if-bool",
        "else-alone",
        "if-tile",
        "zero-step",
        "static-runtime",
        "while-not-callable",
        "float-bound",
    ],
)
def test_control_flow_misuse(target, body, exc):
    @fly.kernel
    def k(x: fly.Tensor, FN: fly.constexpr):
        FN(x)

    with pytest.raises(exc) as info:
        k[(1,)](torch.ones(8), FN=body, target=target)
    assert isinstance(info.value, FlyDSLError)


def test_kernel_returning_a_value_is_an_error(target):
    @fly.kernel
    def k(x: fly.Tensor):
        return x[0].load()

    with pytest.raises(TraceError, match="returned"):
        k[(1,)](torch.ones(1), target=target)


@fly.kernel
def oob_kernel(x: fly.Tensor, out: fly.Tensor, B: fly.constexpr):
    pid = fly.program_id(0)
    v = x.tile((B,), pid).load(bounds_check=False)  # the tail block reads past the end
    out.tile((B,), pid).store(v)


def test_out_of_bounds_without_bounds_check_names_the_line():
    with pytest.raises(ReferenceRuntimeError) as info:
        oob_kernel[(2,)](torch.ones(12), torch.zeros(12), B=8, target=REF)
    err = info.value
    assert "out-of-bounds" in err.msg
    assert "program (1, 0, 0)" in err.msg  # the offending program
    assert err.loc.file == __file__
    assert err.loc.line == line_of(oob_kernel, "bounds_check=False")
    assert f"test_language_control.py:{err.loc.line}" in str(err)


def test_out_of_bounds_store_without_bounds_check():
    @fly.kernel
    def k(out: fly.Tensor, B: fly.constexpr):
        out.tile((B,), 0).store(1.0, bounds_check=False)

    buf = torch.zeros(8)
    with pytest.raises(ReferenceRuntimeError, match="out-of-bounds"):
        k[(1,)](buf[:5], B=8, target=REF)


def test_integer_division_by_zero_is_reported():
    @fly.kernel
    def k(x: fly.Tensor, y: fly.Tensor, out: fly.Tensor):
        out[0].store(x[0].load() // y[0].load())

    with pytest.raises(ReferenceRuntimeError, match="division by zero") as info:
        k[(1,)](
            torch.ones(1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int32),
            target=REF,
        )
    assert info.value.loc.file == __file__
