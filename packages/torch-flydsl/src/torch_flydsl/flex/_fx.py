"""flex_attention mods (PyTorch callables) -> FX graphs -> FlyDSL mod programs.

``capture(fn, kind)`` traces a ``score_mod`` / ``mask_mod`` with ``make_fx`` on one-element
example tensors (``score`` fp32 as torch's math path gives it, ``b``/``h``/``q_idx``/``kv_idx``
int32), the way torch captures mods for its own kernels. One-element rather than 0-d inputs:
indexing a captured tensor with a 0-d tensor calls ``item()`` in eager PyTorch (torch's own
capture runs under vmap or dynamo, which avoid that); with ``(1,)`` it records
``aten.index.Tensor``, and a data-dependent Python branch still stops the trace (make_fx
refuses ``item()``), which makes it unsupported. Tensors the mod reads from its closure or
globals are the graph's constants: one-element ones are folded in as numbers, the others
become mod tensors (kernel inputs, at most ``MAX_TENSORS`` for both mods together).

``translate`` walks the graph into a ``_program`` program, with the dtype torch's promotion
gives each value (``ShapeProp`` on the example inputs). Anything outside the op set raises
``Unsupported`` with the reason the caller logs and counts.

The score mod's gradient is captured the same way: ``make_fx`` of ``autograd.grad`` of the
mod w.r.t. ``score`` (a joint graph, ``capture_grad``). A mod whose gradient is ``grad_out``
itself is additive (no gradient program in the kernel).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

#: mod tensor slots the attention kernels have (flydsl_kernels.attention.mods.MAX_MOD_TENSORS)
MAX_TENSORS = 4
SCORE_ARGS = ("score", "b", "h", "q_idx", "kv_idx")
MASK_ARGS = ("b", "h", "q_idx", "kv_idx")
JOINT_ARGS = (*SCORE_ARGS, "grad_out")

aten = torch.ops.aten


class Unsupported(Exception):
    """A mod the translation does not take; the message is the fallback reason."""


# -- capture -----------------------------------------------------------------------------------


def _examples(names):
    return [
        torch.zeros((1,), dtype=torch.float32 if n in ("score", "grad_out") else torch.int32)
        for n in names
    ]


def _trace(fn, names):
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        gm = make_fx(fn)(*_examples(names))
    except Exception as e:  # data-dependent branches, .item(), anything make_fx refuses
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if "data-dependent" in str(e) or "_local_scalar_dense" in str(e):
            raise Unsupported("data-dependent Python control flow or .item() in the mod") from e
        raise Unsupported(f"the mod could not be traced ({type(e).__name__}: {first[:120]})") from e
    try:
        ShapeProp(gm).propagate(*_examples(names))
    except Exception as e:
        raise Unsupported(f"the mod fails on example inputs ({type(e).__name__})") from e
    return gm


def _joint(fn):
    def joint(score, b, h, q_idx, kv_idx, grad_out):
        with torch.enable_grad():
            s = score.detach().requires_grad_(True)
            out = fn(s, b, h, q_idx, kv_idx)
            if not (isinstance(out, torch.Tensor) and out.requires_grad):
                return torch.zeros_like(grad_out)  # the mod does not depend on the score
            (g,) = torch.autograd.grad(out, s, grad_out, allow_unused=True)
        return torch.zeros_like(grad_out) if g is None else g

    return joint


# -- translation -------------------------------------------------------------------------------


def _dname(dtype) -> str:
    if dtype in (torch.float32, torch.float64):
        return "fp32"
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    if dtype == torch.bool:
        return "bool"
    if dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        return "int32"
    raise Unsupported(f"a value of dtype {dtype} in the mod")


def _const(v):
    if isinstance(v, bool):
        return ("c", "b", str(v))
    if isinstance(v, int):
        if abs(v) >= 1 << 31:
            raise Unsupported(f"an integer constant {v} beyond int32")
        return ("c", "i", str(v))
    if isinstance(v, float):
        return ("c", "f", repr(v) if math.isfinite(v) else str(v))
    raise Unsupported(f"a constant of type {type(v).__name__} in the mod")


class Slots:
    """Captured tensors shared by the programs of one call (deduplicated by identity)."""

    def __init__(self):
        self.tensors: list[torch.Tensor] = []

    def slot(self, t: torch.Tensor) -> int:
        for i, u in enumerate(self.tensors):
            if u is t:
                return i
        if len(self.tensors) >= MAX_TENSORS:
            raise Unsupported(
                f"the mods read more than {MAX_TENSORS} captured tensors (the kernels' limit)"
            )
        self.tensors.append(t)
        return len(self.tensors) - 1


_BINARY = {
    aten.add.Tensor: "add", aten.add.Scalar: "add",
    aten.sub.Tensor: "sub", aten.sub.Scalar: "sub",
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul",
    aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.pow.Tensor_Scalar: "pow", aten.pow.Tensor_Tensor: "pow", aten.pow.Scalar: "pow",
    aten.floor_divide.default: "floordiv", aten.floor_divide.Scalar: "floordiv",
    aten.remainder.Tensor: "remainder", aten.remainder.Scalar: "remainder",
    aten.remainder.Scalar_Tensor: "remainder",
    aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.lt.Tensor: "lt", aten.lt.Scalar: "lt", aten.le.Tensor: "le", aten.le.Scalar: "le",
    aten.gt.Tensor: "gt", aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge",
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
    aten.bitwise_and.Tensor: "and", aten.bitwise_and.Scalar: "and",
    aten.bitwise_or.Tensor: "or", aten.bitwise_or.Scalar: "or",
    aten.bitwise_xor.Tensor: "xor", aten.bitwise_xor.Scalar: "xor",
    aten.logical_and.default: "land", aten.logical_or.default: "lor",
    aten.logical_xor.default: "lxor",
}  # fmt: skip
_CMP = {"lt", "le", "gt", "ge", "eq", "ne"}
_UNARY = {
    aten.exp.default: "exp", aten.exp2.default: "exp2", aten.log.default: "log",
    aten.log2.default: "log2", aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.erf.default: "erf",
    aten.sin.default: "sin", aten.cos.default: "cos", aten.floor.default: "floor",
    aten.ceil.default: "ceil", aten.abs.default: "abs", aten.neg.default: "neg",
    aten.sign.default: "sign", aten.sgn.default: "sign",
    aten.logical_not.default: "not",
}  # fmt: skip
_PASS = {
    aten.alias.default, aten.detach.default, aten.clone.default, aten.lift_fresh_copy.default,
    aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.expand.default,
    aten.squeeze.default, aten.squeeze.dim, aten.unsqueeze.default, aten.contiguous.default,
    aten.expand_as.default, aten.view_as.default, aten.squeeze.dims, aten.positive.default,
}  # fmt: skip
_FILL = {
    aten.scalar_tensor.default: 0, aten.full.default: 1, aten.full_like.default: 1,
    aten.zeros_like.default: None, aten.ones_like.default: None, aten.new_full.default: 2,
    aten.zeros.default: None, aten.ones.default: None, aten.new_zeros.default: None,
    aten.new_ones.default: None,
}  # fmt: skip


def _meta(node):
    """``node``'s shape and dtype: ``tensor_meta`` (ShapeProp, eager capture) or ``val`` (the
    FakeTensor of a graph from torch.compile)."""
    tm = node.meta.get("tensor_meta")
    if tm is None:
        tm = node.meta.get("val")
    if not isinstance(getattr(tm, "dtype", None), torch.dtype):
        raise Unsupported(f"no type for {node.format_node()}")
    if not all(isinstance(s, int) for s in tm.shape):
        raise Unsupported(f"a symbolic shape in the mod ({node.format_node()})")
    return tm


class _Translator:
    def __init__(self, gm, names, slots: Slots, buffers=(), first=False, upcast=False):
        self.gm, self.names, self.slots, self.first = gm, names, slots, first
        self.upcast = upcast
        self.buffers = list(buffers)  # (slot, sizes) of placeholders after ``names``
        self.slot_dtypes: dict[int, torch.dtype] = {}
        self.prog: list[tuple] = []
        self.env: dict = {}
        self.grad_tensors: list[str] = []

    def emit(self, op, dtype, operands, compute=None):
        if self.upcast:  # 16-bit floats computed in fp32 (torch's kernels do: fp32 scores)
            dtype = "fp32" if dtype in ("bf16", "fp16") else dtype
            compute = "fp32" if compute in ("bf16", "fp16") else compute
        self.prog.append((op, dtype, tuple(operands), compute or dtype))
        return ("v", len(self.prog) - 1)

    def operand(self, a):
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if v[0] == "t":
                raise Unsupported("a captured tensor used whole, not indexed by scalars")
            return v
        if isinstance(a, (bool, int, float)):
            return _const(a)
        raise Unsupported(f"an argument of type {type(a).__name__} in the mod")

    def example(self, a):
        """A tensor (or number) with ``a``'s dtype and rank, for torch's promotion rules."""
        if isinstance(a, torch.fx.Node):
            tm = _meta(a)
            return torch.empty(tuple(tm.shape), dtype=tm.dtype)
        return a

    def run(self):
        args = iter(self.names)
        bufs = iter(self.buffers)
        out = None
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                name = next(args, None)
                if name is not None:
                    self.env[n] = ("arg", name)
                    continue
                b = next(bufs, None)
                if b is None:
                    raise Unsupported("more mod inputs than the op passes")
                slot, sizes = b
                if not sizes:  # a 0-d buffer: read as element 0 of its (1,) view
                    self.env[n] = self.emit(
                        "gather", _dname(_meta(n).dtype), [("t", slot, (1,)), _const(0)]
                    )
                else:
                    self.slot_dtypes[slot] = _meta(n).dtype
                    self.env[n] = ("t", slot, tuple(sizes), ())
            elif n.op == "get_attr":
                self.env[n] = self.attr(getattr(self.gm, n.target))
            elif n.op == "call_function":
                self.env[n] = self.call(n)
            elif n.op == "output":
                out = n.args[0]
                if isinstance(out, (tuple, list)):
                    # a joint graph returns the gradients of every input: the score's, then
                    # None for the indices and the buffers (captured tensors without grad)
                    if len(out) != 1 and not (self.first and all(x is None for x in out[1:])):
                        raise Unsupported("the mod returns several values (buffer gradients)")
                    out = out[0]
            else:
                raise Unsupported(f"graph node {n.op}")
        if not isinstance(out, torch.fx.Node):
            v = self.emit("copy", _dname(torch.float32), [self.operand(out)])
            return tuple(self.prog), v
        tm = _meta(out)
        if math.prod(tm.shape) != 1:
            raise Unsupported(f"the mod returns shape {list(tm.shape)}, not one value")
        v = self.operand(out)
        if v[0] != "v" or v[1] != len(self.prog) - 1:
            v = self.emit("copy", _dname(tm.dtype), [v])
        return tuple(self.prog), v

    def attr(self, t):
        if not isinstance(t, torch.Tensor):
            raise Unsupported(f"a captured {type(t).__name__}")
        if t.requires_grad:
            self.grad_tensors.append(f"{tuple(t.shape)} {t.dtype}")
        if t.dim() == 0:  # a literal (torch.tensor(2.0)) or a 0-d parameter: a number
            v = t.item()
            if t.dtype.is_floating_point:
                v = float(v)
            return _const(v)
        if t.numel() == 0:
            raise Unsupported("an empty captured tensor")
        _dname(t.dtype)  # a dtype we can load
        return ("t", self.slots.slot(t), tuple(int(s) for s in t.shape), ())

    def gather_or_view(self, base, more):
        _, slot, sizes, idx = base
        idx = idx + tuple(more)
        if len(idx) > len(sizes):
            raise Unsupported("too many indices for a captured tensor")
        if len(idx) < len(sizes):
            return ("t", slot, sizes, idx)
        t = self.slots.tensors[slot] if slot < len(self.slots.tensors) else None
        dtype = t.dtype if t is not None else self.slot_dtypes[slot]
        return self.emit("gather", _dname(dtype), [("t", slot, sizes), *idx])

    def call(self, n):
        f = n.target
        out_of_place = _functional(f)
        if out_of_place is not None:  # ``x.logical_and_(y)`` (autograd's formulas use some)
            n.target = out_of_place
            try:
                v = self.call(n)
            finally:
                n.target = f
            if isinstance(n.args[0], torch.fx.Node):
                self.env[n.args[0]] = v  # later reads of the mutated value see the result
            return v
        a, kw = n.args, n.kwargs
        if f is operator.getitem:
            raise Unsupported("multi-output ops in the mod")
        if f is aten.index.Tensor:
            base = self.env.get(a[0]) if isinstance(a[0], torch.fx.Node) else None
            if base is None or base[0] != "t":
                raise Unsupported("indexing a computed value (only captured tensors)")
            if any(i is None for i in a[1]):
                raise Unsupported("indexing a captured tensor with slices")
            return self.gather_or_view(base, [self.operand(i) for i in a[1]])
        if f is aten.select.int:
            base = self.env.get(a[0])
            if base is None or base[0] != "t" or a[1] not in (0, -len(base[2]) + len(base[3])):
                raise Unsupported("select on a computed value or a non-leading dimension")
            return self.gather_or_view(base, [self.operand(a[2])])
        if f in _PASS:
            v = self.env[a[0]] if isinstance(a[0], torch.fx.Node) else self.operand(a[0])
            if v[0] == "t" and f not in (aten.lift_fresh_copy.default, aten.alias.default,
                                         aten.detach.default, aten.clone.default):  # fmt: skip
                raise Unsupported(f"{f} on a captured tensor")
            return v
        d = _dname(_meta(n).dtype)
        if math.prod(_meta(n).shape) != 1:
            raise Unsupported(f"{f} makes a value of shape {list(_meta(n).shape)}")
        if f in _FILL:
            i = _FILL[f]
            if i is None:
                one = f in (aten.ones_like.default, aten.ones.default, aten.new_ones.default)
                return self.emit("copy", d, [_const(1 if one else 0)])
            return self.emit("copy", d, [self.operand(a[i])])
        if f in (
            aten._to_copy.default,
            aten.to.dtype,
            torch.ops.prims.convert_element_type.default,
        ):
            return self.emit("copy", d, [self.operand(a[0])])
        if f in _UNARY:
            return self.emit(_UNARY[f], d, [self.operand(a[0])])
        if f is aten.bitwise_not.default:
            if _meta(a[0]).dtype != torch.bool:
                raise Unsupported("bitwise_not of an integer")
            return self.emit("not", d, [self.operand(a[0])])
        if f in (aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther,
                 aten.where.Scalar):  # fmt: skip
            return self.emit("where", d, [self.operand(x) for x in a[:3]])
        if f in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
            return self.emit("where", d, [self.operand(a[1]), self.operand(a[2]),
                                          self.operand(a[0])])  # fmt: skip
        if f in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
            lo = a[1] if f is not aten.clamp_max.default else None
            hi = a[2] if f is aten.clamp.default and len(a) > 2 else None
            if f is aten.clamp_max.default:
                hi = a[1]
            v = self.operand(a[0])
            if lo is not None:
                v = self.emit("maximum", d, [v, self.operand(lo)])
            if hi is not None:
                v = self.emit("minimum", d, [v, self.operand(hi)])
            return v
        if f is aten.relu.default:
            return self.emit("maximum", d, [self.operand(a[0]), _const(0)])
        if f is aten.tanh_backward.default:  # g * (1 - y^2)
            g, y = self.operand(a[0]), self.operand(a[1])
            y2 = self.emit("mul", d, [y, y])
            return self.emit("mul", d, [g, self.emit("sub", d, [_const(1.0), y2])])
        if f is aten.sigmoid_backward.default:  # g * y * (1 - y)
            g, y = self.operand(a[0]), self.operand(a[1])
            one_m = self.emit("sub", d, [_const(1.0), y])
            return self.emit("mul", d, [g, self.emit("mul", d, [y, one_m])])
        if f is aten.threshold_backward.default:  # g where x > threshold else 0
            gt = self.emit("gt", "bool", [self.operand(a[1]), self.operand(a[2])],
                           _dname(_meta(a[1]).dtype))  # fmt: skip
            return self.emit("where", d, [gt, self.operand(a[0]), _const(0)])
        if f is aten.rsub.Scalar or f is aten.rsub.Tensor:
            alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
            x = self.operand(a[0])
            if alpha != 1:
                x = self.emit("mul", d, [x, self.operand(alpha)])
            return self.emit("sub", d, [self.operand(a[1]), x])
        if f is aten.div.Tensor_mode or f is aten.div.Scalar_mode:
            mode = kw.get("rounding_mode", a[2] if len(a) > 2 else None)
            op = {None: "div", "floor": "floordiv", "trunc": "truncdiv"}[mode]
            return self.emit(op, d, [self.operand(a[0]), self.operand(a[1])])
        if f in _BINARY:
            op = _BINARY[f]
            x, y = self.operand(a[0]), self.operand(a[1])
            alpha = kw.get("alpha", 1)
            if op in ("add", "sub") and alpha != 1:
                y = self.emit("mul", d, [y, self.operand(alpha)])
            if op in ("land", "lor", "lxor"):
                return self.emit({"land": "and", "lor": "or", "lxor": "xor"}[op], d, [x, y],
                                 "bool")  # fmt: skip
            if op in _CMP or op in ("and", "or", "xor"):
                cd = _dname(torch.result_type(self.example(a[0]), self.example(a[1])))
                return self.emit(op, d, [x, y], cd)
            return self.emit(op, d, [x, y])
        raise Unsupported(f"op {f} is outside the supported set")


def _functional(f):
    """The out-of-place overload of an in-place ATen op (``add_.Tensor`` -> ``add.Tensor``)."""
    if not isinstance(f, torch._ops.OpOverload):
        return None
    name = f._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    return getattr(packet, f._overloadname, None) if packet is not None else None


@dataclass(frozen=True)
class Program:
    prog: tuple
    additive: bool = False  # a gradient program that is grad_out itself


def translate(
    gm, names, slots: Slots, buffers=(), first=False, upcast=False
) -> tuple[Program, list[str]]:
    """The program of ``gm`` (placeholders named ``names``, then ``buffers``: ``(slot,
    sizes)`` of the mod tensors passed as inputs) and the captured tensors that require grad
    (their descriptions). ``first``: the graph returns a list whose first item is the value
    (a joint graph's gradients). ``upcast``: bf16 / fp16 values are computed in fp32 (a
    compiled graph's mods see the score in the inputs' dtype; torch's kernels and ours hold it
    in fp32)."""
    t = _Translator(gm, names, slots, buffers, first, upcast)
    prog, _out = t.run()
    last = prog[-1]
    additive = last[0] == "copy" and last[2][0] == ("arg", "grad_out")
    return Program(prog, additive=additive), t.grad_tensors


def capture(fn, kind: str, slots: Slots):
    """``(Program, grad_tensors)`` of a score mod (``kind="score"``), mask mod (``"mask"``) or
    a score mod's gradient (``"grad"``); raises ``Unsupported``."""
    if kind == "score":
        return translate(_trace(fn, SCORE_ARGS), SCORE_ARGS, slots)
    if kind == "mask":
        return translate(_trace(fn, MASK_ARGS), MASK_ARGS, slots)
    if kind == "grad":
        return translate(_trace(_joint(fn), JOINT_ARGS), JOINT_ARGS, slots)
    raise ValueError(kind)
