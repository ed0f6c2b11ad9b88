"""What the ``cpu-interpret`` target (Triton 3.9's interpreter) needs beyond the GPU lowering.

Everything interpreter-specific lives here, in two steps; the GPU rules never
see it.

1. ``legalize(fn)``, an IR legalization of a copy of the function. The
   interpreter holds bf16 as raw 16-bit integers and computes on the bits,
   and computes 16-bit ``tl.dot`` wrongly, so: every arithmetic, math,
   comparison, reduction, scan and sort op on bf16 computes in fp32 between
   explicit ``cast`` ops (the rounding each bf16 op does stays, as a cast back
   after it); ``dot`` upcasts bf16, fp16 and fp8 operands to fp32 (the
   products are exact in fp32, so this gives the reference's result); a bf16
   constant becomes the fp32 constant of its bf16 value, cast to bf16 where a
   bf16 value is needed (the interpreter builds bf16 constants from the
   number's bits).
2. ``InterpretLowering``, the emitter with the interpreter's overrides:
   conversions to and from bf16 and fp8 are built from integer operations
   (the interpreter truncates, neither saturates nor rounds to even, and
   decodes fp8 NaN as a number); ``pow`` avoids libdevice, which the
   interpreter lacks, and ``tanh`` runs the GPU targets' branch-free formula
   with a plain division (fp64: its own helper); a float ``atomic_xchg`` moves the bits as int32
   (the interpreter exchanges integers only); scalar parameters are given
   their dtypes (the interpreter types Python numbers by value).

Running the kernel under the interpreter (patching ``triton.language`` for one
launch) is the launcher's job (``launcher.py``).
"""

from __future__ import annotations

from collections import ChainMap

from ... import dtypes as dt
from ...ir import ops as O
from ...ir.core import Block, Function, Op, Value
from ...ir.types import TileType
from ...ir.verifier import verify
from ...passes.rewrite import clone_function
from .emitter import FP8_MAX, LOWERINGS, Lowering, Rule, tl_dtype
from .rules.elementwise import lower_pow, lower_unary, tanh_helper
from .rules.memory import atomic_args, define_atomic

# -- 1. the IR legalization ---------------------------------------------------------------------------

#: ops that compute on their operands' values: on bf16 they compute in fp32
_UPCAST = {
    *O.BINARY_ARITH,
    *O.COMPARE,
    *O.UNARY_ANY,
    *O.UNARY_FLOAT,
    "reduce",
    "argreduce",
    "scan",
    "sort",
    "topk",
}
#: dot operand dtypes computed in fp32
_DOT_UPCAST = {dt.bf16, dt.fp16, dt.fp8e4m3, dt.fp8e5m2}


def _bf16_value(x):
    """The value a bf16 constant holds (as the reference backend builds it)."""
    import torch

    return torch.full((), x, dtype=torch.bfloat16).item()


class _Legalizer:
    def __init__(self):
        self.subst: dict[int, Value] = {}
        self.exact: set[int] = set()  # bf16 constants turned into fp32 ones of the same value

    def block(self, block: Block, caches: list[dict]):
        caches = [*caches, {}]  # (value id, dtype) -> that value converted; seen by nested blocks
        out: list[Op] = []
        for op in block.ops:
            op.operands = [self.subst.get(v.id, v) for v in op.operands]
            for r in op.regions:
                self.block(r, caches)
            if op.name == "constant" and op.attrs["dtype"] == dt.bf16:
                r = op.result
                op.attrs = {**op.attrs, "value": _bf16_value(op.attrs["value"]), "dtype": dt.fp32}
                r.type = r.type.with_dtype(dt.fp32)
                self.exact.add(r.id)
                out.append(op)
                continue
            if op.name in _UPCAST and any(self.dtype(v) == dt.bf16 for v in op.operands):
                op.operands = [self.to_fp32(v, op, out, caches) for v in op.operands]
                self.append_computed_in_fp32(op, out)
                continue
            if op.name == "dot" and self.dtype(op.operand("a")) in _DOT_UPCAST:
                a, b = (self.to_fp32(op.operand(n), op, out, caches) for n in ("a", "b"))
                op.operands[op.opdef.index("a")] = a
                op.operands[op.opdef.index("b")] = b
                out.append(op)
                continue
            op.operands = [
                self.convert(v, dt.bf16, op, out, caches) if v.id in self.exact else v
                for v in op.operands
            ]
            out.append(op)
        for o in out:
            o.block = block
            for r in o.results:
                r.block = block
        block.ops[:] = out

    def dtype(self, v: Value):
        """``v``'s dtype before legalization (bf16 for the constants made fp32)."""
        if v.id in self.exact:
            return dt.bf16
        return v.type.dtype if isinstance(v.type, TileType) else None

    def to_fp32(self, v: Value, user: Op, out: list[Op], caches) -> Value:
        if v.id in self.exact or self.dtype(v) not in _DOT_UPCAST:
            return v  # an fp32 constant already, or not a 16-bit / fp8 float
        return self.convert(v, dt.fp32, user, out, caches)

    def convert(self, v: Value, to: dt.DType, user: Op, out: list[Op], caches) -> Value:
        key = (v.id, to)
        for cache in reversed(caches):
            if key in cache:
                return cache[key]
        cast = Op("cast", [v], {"dtype": to}, [v.type.with_dtype(to)], loc=user.loc)
        out.append(cast)
        caches[-1][key] = cast.result
        return cast.result

    def append_computed_in_fp32(self, op: Op, out: list[Op]):
        """``op`` now computes in fp32: each of its bf16 results becomes fp32, rounded back."""
        out.append(op)
        for r in op.results:
            if r.type.dtype == dt.bf16:
                r.type = r.type.with_dtype(dt.fp32)
                back = Op("cast", [r], {"dtype": dt.bf16}, [r.type.with_dtype(dt.bf16)], loc=op.loc)
                out.append(back)
                self.subst[r.id] = back.result


def legalize(fn: Function) -> Function:
    """A copy of ``fn`` the interpreter computes correctly (see the module doc)."""
    fn = clone_function(fn)
    _Legalizer().block(fn.body, [])
    return verify(fn)


# -- 2. the emitter's overrides ----------------------------------------------------------------------

#: a NaN bit pattern of each fp8 format (as uint8)
FP8_NAN = {dt.fp8e4m3: 0x7F, dt.fp8e5m2: 0x7F}
#: fp8 format -> (exponent bias, mantissa bits)
_FP8_FORMAT = {dt.fp8e4m3: (7, 3), dt.fp8e5m2: (15, 2)}

_POW_HELPER = """
@triton.jit
def _fly_pow(a, b):
    # torch.pow for the interpreter, which has no libdevice (in fp64, then rounded).
    dtype = a.dtype
    a = a.to(tl.float64)
    b = b.to(tl.float64)
    m = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.floor(b) == b
    b_odd = b_int & (tl.floor(b * 0.5) * 2.0 != b)
    m = tl.where((a < 0) & b_odd, -m, m)
    m = tl.where((a < 0) & ~b_int, float("nan"), m)
    return tl.where(b == 0, 1.0, m).to(dtype)
"""


_TO_BF16_HELPER = """
@triton.jit
def _fly_to_bf16(x):
    # fp32 -> bf16, round to nearest even (NaN -> 0x7FC0, as torch): in integer arithmetic,
    # because the interpreter's own conversion truncates.
    b = x.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
"""

_TO_FP8_HELPER = """
@triton.jit
def _fly_to_fp8(x, BIAS: tl.constexpr, M: tl.constexpr, MAX: tl.constexpr, NAN: tl.constexpr, DT: tl.constexpr):
    # fp32 -> fp8 as FlyDSL converts: saturate to +-MAX, round to nearest even, NaN stays
    # NaN. Built from integers, because the interpreter's own conversion neither
    # saturates nor rounds to even.
    nan = x != x
    a = tl.minimum(tl.where(nan, 0.0, tl.abs(x)), MAX)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, 1 - BIAS)
    ulp = ((e - M + 127) << 23).to(tl.float32, bitcast=True)
    n = ((a / ulp + 12582912.0) - 12582912.0).to(tl.int32)  # significand, rounded to even
    bits = ((e + BIAS - 1) << M) + n  # a carry out of the significand bumps the exponent
    bits = bits | ((x.to(tl.int32, bitcast=True) >> 24) & 0x80)
    bits = tl.where(nan, NAN, bits)
    return bits.to(tl.uint8).to(DT, bitcast=True)
"""

_FROM_FP8_HELPER = """
@triton.jit
def _fly_from_fp8(x, BIAS: tl.constexpr, M: tl.constexpr, IEEE: tl.constexpr):
    # fp8 -> fp32 from the bits: the interpreter decodes the NaN (and e5m2's inf)
    # encodings as ordinary numbers.
    b = x.to(tl.uint8, bitcast=True).to(tl.int32)
    e = (b >> M) & ((1 << (7 - M)) - 1)
    m = b & ((1 << M) - 1)
    v = (((e - BIAS + 127) << 23) | (m << (23 - M))).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * (2.0 ** (1 - BIAS - M)), v)
    top = e == (1 << (7 - M)) - 1
    if IEEE:
        v = tl.where(top, tl.where(m == 0, float("inf"), float("nan")), v)
    else:
        v = tl.where(top & (m == (1 << M) - 1), float("nan"), v)
    return tl.where(b >= 128, -v, v)
"""

_TL_FLOAT = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16"}

#: op name -> the interpreter's rule, used instead of the GPU one
OVERRIDES: dict[str, Rule] = {}


def _override(name: str):
    def deco(fn):
        OVERRIDES[name] = fn
        return fn

    return deco


@_override("pow")
def _pow(cx: Lowering, op: Op):
    # exp2(b * log2|a|) in fp64, with torch.pow's signs
    lower_pow(cx, op, cx.helper("_fly_pow", _POW_HELPER))


@_override("tanh")
def _tanh(cx: Lowering, op: Op):
    # the GPU targets' branch-free fp32 formula with a plain division (the interpreter has no
    # libdevice): the interpreter runs what the GPU code computes
    if op.operand("x").type.dtype == dt.fp64:
        lower_unary(cx, op, cx.helper("_fly_tanh64", _TANH64_HELPER))
        return
    lower_unary(cx, op, cx.helper("_fly_tanh", tanh_helper("(1.0 / ({d}))", clamp=True)))


_TANH64_HELPER = """
@triton.jit
def _fly_tanh64(x):
    # fp64 tanh for the interpreter, which has no libdevice
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    t = tl.where(tl.abs(x) < 0.0625, tl.abs(small), t)
    return tl.where(x < 0, -t, t)
"""


@_override("atomic_rmw")
def _atomic_rmw(cx: Lowering, op: Op):
    d = op.operand("value").type.dtype
    if not (op.attrs["kind"] == "xchg" and d.is_float and d.bits == 32):
        return LOWERINGS["atomic_rmw"](cx, op)
    # An exchange is a move of bits: exchange them as int32.
    args = atomic_args(cx, op)
    args[0] = f"({args[0]}).to(tl.pointer_type(tl.int32), bitcast=True)"
    args[1] = f"{args[1]}.to(tl.int32, bitcast=True)"
    define_atomic(cx, op, f"tl.atomic_xchg({', '.join(args)}).to(tl.float32, bitcast=True)")


class InterpretLowering(Lowering):
    """The emitter for Triton's interpreter: GPU rules with ``OVERRIDES`` and exact conversions."""

    note = (
        "For Triton's interpreter: legalized first (bf16 math and 16-bit/fp8 dot in fp32, "
        "so v<N> is %N of the legalized IR); conversions and libdevice math by helpers."
    )

    def __init__(self, fn: Function, target, **kw):
        super().__init__(fn, target, rules=ChainMap(OVERRIDES, LOWERINGS), **kw)

    def convert(self, x: str, src: dt.DType, to: dt.DType) -> str:
        if src == to:
            return x
        if src.storage_only:
            bias, m = _FP8_FORMAT[src]
            name = self.helper("_fly_from_fp8", _FROM_FP8_HELPER)
            return self.convert(f"{name}({x}, {bias}, {m}, {src == dt.fp8e5m2})", dt.fp32, to)
        if to.storage_only:
            f = self.convert(x, src, dt.fp32)
            bias, m = _FP8_FORMAT[to]
            name = self.helper("_fly_to_fp8", _TO_FP8_HELPER)
            return f"{name}({f}, {bias}, {m}, {FP8_MAX[to]}, {FP8_NAN[to]}, {tl_dtype(to)})"
        if src == dt.bf16 and to != dt.fp32:  # the interpreter converts bf16 right only to fp32
            return self.convert(f"{x}.to(tl.float32)", dt.fp32, to)
        if to == dt.bf16:
            if src != dt.fp32:
                x = self.convert(x, src, dt.fp32)
            return f"{self.helper('_fly_to_bf16', _TO_BF16_HELPER)}({x})"
        if src.is_int and to.is_int:  # index widening: loop variables are Python ints here
            return f"tl.cast({x}, {tl_dtype(to)})"
        return super().convert(x, src, to)

    def prologue(self, params) -> None:
        for kp in params:
            if kp.sig == "i64":  # an int that fits 32 bits would be typed int32
                # tl.cast, not .to: the interpreter passes an argument equal to 1 as a plain int
                self.emit(f"{kp.name} = tl.cast({kp.name}, tl.int64)")
            elif kp.kind == "scalar" and kp.sig.startswith("fp"):  # a Python float there
                self.emit(f"{kp.name} = tl.full((), {kp.name}, tl.{_TL_FLOAT[kp.sig]})")
