"""Triton rules for leaves, elementwise arithmetic and math, casts, hints and ``where``."""

from __future__ import annotations

from .... import dtypes as dt
from ....ir.core import Op
from ..emitter import TV, Lowering, broadcast_shape, literal, lower, tl_dtype

# -- leaves ---------------------------------------------------------------------------------------


@lower("constant")
def _constant(cx: Lowering, op: Op):
    r = op.results[0]
    d = r.type.dtype
    cx.bind(r, TV(literal(op.attrs["value"], d), (), d, literal=True, value=op.attrs["value"]))


@lower("arange")
def _arange(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.arange({op.attrs['start']}, {op.attrs['end']})", loc=op.loc)


@lower("program_id")
def _program_id(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.program_id({op.attrs['axis']})", loc=op.loc)


@lower("num_programs")
def _num_programs(cx: Lowering, op: Op):
    cx.define(op.results[0], f"tl.num_programs({op.attrs['axis']})", loc=op.loc)


# -- arithmetic -------------------------------------------------------------------------------------

_BINOP = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "intdiv": "//",  # Triton's // on integers is sdiv/udiv: truncation, like FlyIR's
    "mod": "%",  # srem / frem: C fmod, like FlyIR's
    "truediv": "/",
    "and": "&",
    "or": "|",
    "xor": "^",
    "shl": "<<",
    "shr": ">>",  # arithmetic for signed, logical for unsigned: as torch
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}


def _binary_operands(cx: Lowering, op: Op) -> tuple[str, str, tuple]:
    a, b = op.operand("lhs"), op.operand("rhs")
    ta, tb = cx.get(a), cx.get(b)
    # Two literals would fold in Python, untyped: make the left one a tensor.
    ea = cx.scalar_tensor(ta) if ta.literal and tb.literal else cx.ref(a)
    return ea, cx.ref(b), broadcast_shape(ta.shape, tb.shape)


@lower(*_BINOP)
def _binary(cx: Lowering, op: Op):
    a, b, shape = _binary_operands(cx, op)
    d = op.operand("lhs").type.dtype
    expr = f"{a} {_BINOP[op.name]} {b}"
    # Triton computes / and % of 16-bit floats in fp32: round back, as torch does.
    if op.name in ("truediv", "mod") and d.is_float and d.bits < 32:
        expr = cx.convert(f"({expr})", dt.fp32, d)
    cx.define(op.results[0], expr, shape, op.loc)


@lower("maximum", "minimum")
def _minmax(cx: Lowering, op: Op):
    a, b, shape = _binary_operands(cx, op)
    d = op.operand("lhs").type.dtype
    f = "tl.maximum" if op.name == "maximum" else "tl.minimum"
    # FlyIR's max/min propagate NaN
    nan = ", propagate_nan=tl.PropagateNan.ALL" if d.is_float else ""
    cx.define(op.results[0], f"{f}({a}, {b}{nan})", shape, op.loc)


def lower_pow(cx: Lowering, op: Op, fn: str):
    """``fn(a, b)`` computing ``pow``, in fp32 for 16-bit floats."""
    x, y = op.operand("lhs"), op.operand("rhs")
    shape = broadcast_shape(cx.get(x).shape, cx.get(y).shape)
    d = x.type.dtype
    a, b = cx.tensor(x), cx.tensor(y)  # function arguments: tensors, not literals
    if d.bits < 32:
        a, b = cx.convert(a, d, dt.fp32), cx.convert(b, d, dt.fp32)
    expr = f"{fn}({a}, {b})"
    if d.bits < 32:
        expr = cx.convert(expr, dt.fp32, d)
    cx.define(op.results[0], expr, shape, op.loc)


@lower("pow")
def _pow(cx: Lowering, op: Op):
    lower_pow(cx, op, cx.libdevice("pow"))


_UNARY = {
    "exp": "tl.exp",
    "exp2": "tl.exp2",
    "log": "tl.log",
    "log2": "tl.log2",
    "sqrt": "tl.sqrt",
    "rsqrt": "tl.rsqrt",
    "erf": "tl.erf",
    "sigmoid": "tl.sigmoid",
    "sin": "tl.sin",
    "cos": "tl.cos",
    "floor": "tl.floor",
    "ceil": "tl.ceil",
}


def lower_unary(cx: Lowering, op: Op, fn: str | None, rcp: str | None = None):
    """``fn(x)`` (or ``rcp`` with ``{d}`` standing for ``x``); Triton's math functions take
    fp32/fp64, so 16-bit floats compute in fp32."""
    a = op.operand("x")
    tv = cx.get(a)
    x = cx.tensor(a)
    d = a.type.dtype
    if d.bits < 32:
        x = f"{x}.to(tl.float32)"
    expr = f"{fn}({x})" if rcp is None else rcp.format(d=x)
    if d.bits < 32:
        expr = cx.convert(expr, dt.fp32, d)
    cx.define(op.results[0], expr, tv.shape, op.loc)


@lower(*_UNARY)
def _unary_float(cx: Lowering, op: Op):
    lower_unary(cx, op, _UNARY[op.name])


#: the odd polynomial of ``tanh_helper`` for ``|x| < TANH_CUT``: ``tanh(x) ~ x + x^3 P(x^2)``,
#: fitted for relative error (1e-9 in exact arithmetic, below fp32's rounding)
TANH_POLY = (
    -0.333333175600152,
    0.13332586146606995,
    -0.05385231048273897,
    0.021071680494815198,
    -0.006274240479206875,
)
#: below this ``|x|`` the polynomial; above, ``1 - 2 / (1 + e^(2|x|))`` loses at most one bit
TANH_CUT = 0.55


def tanh_helper(rcp: str, clamp: bool = False) -> str:
    """The text of ``_fly_tanh``: fp32 tanh with no branch (ocml's and libdevice's branch per
    range: exec-masked branches inside a kernel's loop), within 2 ulp of the exact result on
    gfx950 (exp2 and the reciprocal are each within 1 ulp). ``rcp`` is the reciprocal
    expression the target computes cheaply (``{d}`` stands for the denominator).

    ``|x| >= TANH_CUT``: ``1 - 2 / (1 + 2^(2 log2(e) |x|))`` with the sign bit of ``x`` (an
    overflowing exponential gives 1 exactly); below: the odd polynomial ``x (1 + x^2 P(x^2))``
    (``TANH_POLY``: no cancellation near 0, ``-0.0`` stays ``-0.0``). NaN selects the
    polynomial, which propagates it. ``clamp`` bounds the exponent at ``|x| = 16`` (tanh(16)
    rounds to 1 either way), for the interpreter, where numpy warns on the overflow."""
    c0, c1, c2, c3, c4 = TANH_POLY
    a = "tl.minimum(tl.abs(x), 16.0)" if clamp else "tl.abs(x)"
    den = f"1.0 + tl.exp2({a} * 2.8853900817779268)"
    return f"""
@triton.jit
def _fly_tanh(x):
    # branch-free tanh in fp32 (flydsl_core.backends.triton.rules.elementwise.tanh_helper)
    big = 1.0 - 2.0 * {rcp.format(d=den)}
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    big = (big.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    x2 = x * x
    small = x * (1.0 + x2 * ({c0} + x2 * ({c1} + x2 * ({c2} + x2 * ({c3} + x2 * {c4})))))
    return tl.where(tl.abs(x) >= {TANH_CUT}, big, small)
"""


#: the reciprocal each GPU backend computes in one instruction: ``v_rcp_f32`` (1 ulp) on AMD,
#: ``rcp.approx.ftz.f32`` (1 ulp, one ``MUFU.RCP``) on NVIDIA, as inline asm on both (Triton
#: 3.6, the H200 image's, has no ``tl.math.fdiv(..., approx=True)``). On AMD a ``/`` is the
#: correctly rounded division sequence (``v_div_scale``, ``v_div_fmas``, ``v_div_fixup``: about
#: ten instructions) and LLVM's own approximate reciprocal scales for denormal results
#: (``v_frexp`` / ``v_ldexp``: five); the formula's denominators lie in [2, 2^47], so the bare
#: instruction is exact to its 1 ulp.
_RCP = {
    "hip": 'tl.inline_asm_elementwise("v_rcp_f32 $0, $1", "=v,v", [{d}], dtype=tl.float32, '
    "is_pure=True, pack=1)",
    "cuda": 'tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [{d}], '
    "dtype=tl.float32, is_pure=True, pack=1)",
}


@lower("reciprocal")
def _reciprocal(cx: Lowering, op: Op):
    # the target's one-instruction reciprocal (1 ulp; a result outside the normal range may
    # flush to 0 or overflow); fp64 and the interpreter divide
    d = op.operand("x").type.dtype
    rcp = _RCP.get(cx.target.backend) if d != dt.fp64 else None
    lower_unary(cx, op, None, rcp=rcp or "(1.0 / ({d}))")


@lower("tanh")
def _tanh(cx: Lowering, op: Op):
    d = op.operand("x").type.dtype
    if d == dt.fp64 or cx.target.has_native_tanh:
        # the helper is fp32 (fp64 keeps libdevice's); a native tanh is one instruction
        lower_unary(cx, op, cx.libdevice("tanh"))
        return
    rcp = _RCP.get(cx.target.backend, "(1.0 / ({d}))")
    lower_unary(cx, op, cx.helper("_fly_tanh", tanh_helper(rcp)))


#: most elements one ``rescale`` asm block takes (three operands each)
RESCALE_PACK_MAX = 64
#: the assembler error a ``rescale`` asm block raises where LLVM's register choice breaks its
#: assumptions; the backend then compiles the kernel again with plain multiplies
#: (``compiler.TritonBackend.compile``)
RESCALE_ASM_GUARD = "fly.rescale: register assignment unsupported"


def rescale_asm(pack: int) -> tuple[str, str]:
    """The AMD (wave64) inline asm of ``rescale`` over ``pack`` fp32 elements per thread, and
    its constraints: outputs ``$0..``, inputs, factors. The wave skips the multiplies as one
    (``s_cbranch_vccz``) when every lane's factor is exactly 1.0 (NaN compares unequal, so it
    multiplies); skipped, each output keeps its input, which is ``x * 1.0``: so each output
    must be in its input's register. The outputs are not tied to the inputs (tied, LLVM copied
    the accumulator out of its MFMA register tuple and back, 116 moves per KV tile on gfx950);
    it puts each output in its dying input's register by itself.

    Assembler-time guards, no code: each output in its input's register (so the inputs are
    distinct registers too), every factor in one register (each lane's elements share one
    row, as in the MFMA accumulator layouts) that no output takes. Anything else is an
    assembler error (``RESCALE_ASM_GUARD``) and the kernel is compiled again with plain
    multiplies; never wrong code. The multiplies are framed by ``s_nop``s and the test by one:
    LLVM's hazard recognizer does not look inside an asm block, and a matrix instruction's
    result read by a VALU needs up to 19 wait states (gfx950, 16 passes), a VALU result read by
    a matrix instruction 2, a transcendental's (the factor: an ``exp2``) read by a VALU 1."""
    x = [f"${pack + i}" for i in range(pack)]
    f = [f"${2 * pack + i}" for i in range(pack)]
    err = f'.error "{RESCALE_ASM_GUARD}"'
    lines = []
    for i in range(pack):
        lines += [f".ifnc ${i},{x[i]}", err, ".endif", f".ifc ${i},{f[0]}", err, ".endif"]
        if i:
            lines += [f".ifnc {f[i]},{f[0]}", err, ".endif"]
    lines += ["s_nop 0", f"v_cmp_neq_f32 vcc, 1.0, {f[0]}", "s_cbranch_vccz 2f"]
    lines += ["s_nop 7", "s_nop 7", "s_nop 7"]
    lines += [f"v_mul_f32 ${i}, ${i}, {f[0]}" for i in range(pack)]
    lines += ["s_nop 7", "2:"]
    cons = ["=v"] * pack + ["v"] * (2 * pack) + ["~{vcc}"]
    return "\n".join(lines), ",".join(cons)


def _rescale_pack(cx: Lowering, op: Op) -> int:
    """Elements per thread of ``rescale``'s tile (all of them in one asm block, up to
    ``RESCALE_PACK_MAX``), or 0 where the asm does not apply: Triton gives every thread the
    same power-of-two count of elements, at least ``numel / threads`` of them, and a pack must
    divide it (a pack above it reads undefined operands)."""
    x = op.operand("x")
    t = cx.target
    if not (cx.skip_asm and t.has_wave_skip_asm and cx.num_warps and x.type.dtype == dt.fp32):
        return 0
    n = 1
    for s in x.type.shape:
        n *= s
    if n & (n - 1):
        return 0
    return max(1, min(n // (cx.num_warps * t.warp_size), RESCALE_PACK_MAX))


@lower("rescale")
def _rescale(cx: Lowering, op: Op):
    x, f = op.operand("x"), op.operand("factor")
    pack = _rescale_pack(cx, op)
    if not pack:
        a, b, shape = cx.ref(x), cx.ref(f), broadcast_shape(cx.get(x).shape, cx.get(f).shape)
        cx.define(op.results[0], f"{a} * {b}", shape, op.loc)
        return
    asm, cons = rescale_asm(pack)
    expr = (
        f"tl.inline_asm_elementwise({asm!r}, {cons!r}, [{cx.full(x)}, {cx.full(f)}], "
        f"dtype=tl.float32, is_pure=True, pack={pack})"
    )
    cx.define(op.results[0], expr, loc=op.loc)


@lower("neg")
def _neg(cx: Lowering, op: Op):
    a = op.operand("x")
    cx.define(op.results[0], f"-{cx.tensor(a)}", cx.get(a).shape, op.loc)


@lower("abs")
def _abs(cx: Lowering, op: Op):
    a = op.operand("x")
    cx.define(op.results[0], f"tl.abs({cx.tensor(a)})", cx.get(a).shape, op.loc)


@lower("invert")
def _invert(cx: Lowering, op: Op):
    a = op.operand("x")
    cx.define(op.results[0], f"~{cx.tensor(a)}", cx.get(a).shape, op.loc)


# -- conversions and facts ---------------------------------------------------------------------------


@lower("hint")
def _hint(cx: Lowering, op: Op):
    # tl.multiple_of / tl.max_contiguous set AxisInfo divisibility and contiguity, which
    # decide vector widths where Triton's own analysis cannot see them (xor swizzles).
    a = op.operand("x")
    c, m = op.attrs["contiguous"], op.attrs["multiple_of"]
    if a.type.shape == ():
        expr = cx.full(a)
        if m[0] > 1:
            expr = f"tl.multiple_of({expr}, {m[0]})"
        cx.define(op.results[0], expr, (), op.loc)
        return
    expr = cx.full(a)
    if any(x > 1 for x in m):
        expr = f"tl.multiple_of({expr}, {list(m)})"
    if any(x > 1 for x in c):
        expr = f"tl.max_contiguous({expr}, {list(c)})"
    cx.define(op.results[0], expr, loc=op.loc)


@lower("cast")
def _cast(cx: Lowering, op: Op):
    a = op.operand("x")
    tv = cx.get(a)
    expr = cx.convert(cx.tensor(a), a.type.dtype, op.attrs["dtype"])
    cx.define(op.results[0], expr, tv.shape, op.loc)


@lower("bitcast")
def _bitcast(cx: Lowering, op: Op):
    a = op.operand("x")
    tv = cx.get(a)
    to = op.attrs["dtype"]
    cx.define(op.results[0], f"{cx.tensor(a)}.to({tl_dtype(to)}, bitcast=True)", tv.shape, op.loc)


@lower("where")
def _where(cx: Lowering, op: Op):
    c, a, b = op.operand("cond"), op.operand("x"), op.operand("y")
    tc, ta, tb = cx.get(c), cx.get(a), cx.get(b)
    ea = cx.scalar_tensor(ta) if ta.literal and tb.literal else cx.ref(a)
    shape = broadcast_shape(tc.shape, ta.shape, tb.shape)
    cx.define(op.results[0], f"tl.where({cx.ref(c)}, {ea}, {cx.ref(b)})", shape, op.loc)
