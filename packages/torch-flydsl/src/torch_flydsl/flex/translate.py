"""FX graphs of flex_attention mods -> ``Program`` (the one translation; ``program.py``).

The graphs come from ``make_fx`` of a callable (eager, ``mods.capture``) or from the HOP's
subgraphs under torch.compile (``compile.py``): ATen (and prims) ops on 0-d tensors, captured
tensors as ``get_attr`` constants or as placeholders after the mod's arguments.

Which ATen op translates how is derived from torch, not listed by hand (``lowering.py``:
FlyDSL's function of the same name, an operator, torch's decomposition traced and translated,
or a textbook identity for a prim FlyDSL has no function for); anything else is
``Unsupported`` with the op's name. Index, view, reduction, fill, cast and ``where`` nodes are
structure, handled here.

Structure beyond scalars, all resolved at translation: indexing a captured tensor (chained and
nested: ``bias[b][h][which, q]``, ``select``, slices left free) builds a lazy view that becomes
one ``gather`` when every dimension is indexed; a view or value with trailing dimensions (a row
``means[q]`` of shape ``(3,)``) is unrolled into one scalar per element (at most ``MAX_UNROLL``)
so reductions over it (``sum``, ``mean``, ``amax`` ...), elementwise ops and ``select`` /
indexing on computed values work element by element.
"""

from __future__ import annotations

import math
import operator

import torch
from torch import fx

from . import lowering as lowering_
from .lowering import LOGICAL, OPERATORS, functional, lowering, op_name
from .program import Program, const

aten = torch.ops.aten
prims = torch.ops.prims

#: elements a value with trailing dimensions may unroll into
MAX_UNROLL = 64
SCORE_ARGS = ("score", "b", "h", "q_idx", "kv_idx")
MASK_ARGS = ("b", "h", "q_idx", "kv_idx")


class Unsupported(Exception):
    """A mod the translation does not take; the message is the fallback reason."""


# -- values during translation ---------------------------------------------------------------------


class Vec:
    """A value with trailing dimensions: ``shape`` and its elements (scalar operands, row
    major)."""

    __slots__ = ("items", "shape")

    def __init__(self, shape, items):
        self.shape, self.items = tuple(shape), list(items)


class View:
    """A captured tensor (``slot``) partly indexed: per dimension an index operand or None."""

    __slots__ = ("idx", "shape", "slot")

    def __init__(self, slot, shape, idx=None):
        self.slot, self.shape = slot, tuple(shape)
        self.idx = tuple(idx) if idx is not None else (None,) * len(self.shape)

    @property
    def free(self):
        return [d for d, i in enumerate(self.idx) if i is None]

    def index(self, indices):
        """Apply ``indices`` (operands or None for a full slice) to the free dimensions."""
        free = self.free
        if len(indices) > len(free):
            raise Unsupported("too many indices for a captured tensor")
        idx = list(self.idx)
        for d, i in zip(free, indices):
            idx[d] = i
        return View(self.slot, self.shape, idx)


class Tup:
    __slots__ = ("items",)

    def __init__(self, items):
        self.items = list(items)


# -- dtypes ----------------------------------------------------------------------------------------


def dname(dtype) -> str:
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


def node_meta(node):
    """``node``'s shape and dtype: ``tensor_meta`` (ShapeProp) or ``val`` (a FakeTensor of a
    graph from torch.compile)."""
    tm = node.meta.get("tensor_meta")
    if tm is None:
        tm = node.meta.get("val")
    if not isinstance(getattr(tm, "dtype", None), torch.dtype):
        raise Unsupported(f"no type for {node.format_node()}")
    if not all(isinstance(s, int) for s in tm.shape):
        raise Unsupported(f"a symbolic shape in the mod ({node.format_node()})")
    return tuple(tm.shape), tm.dtype


# -- capture from a callable ------------------------------------------------------------------------


def examples(names):
    """0-d example inputs, one distinct tensor each (make_fx merges repeated objects)."""
    return [
        torch.zeros((), dtype=torch.float32 if n in ("score", "grad_out") else torch.int32)
        for n in names
    ]


def trace(fn, names, extra=()):
    """``make_fx`` of ``fn`` on 0-d examples for ``names`` (then ``extra`` tensors), with
    tensor indexing recorded as ``aten.index`` (torch's own mod capture does the same), and
    ShapeProp's dtypes and shapes on every node."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.shape_prop import ShapeProp

    ex = [*examples(names), *extra]
    try:
        with TransformGetItemToIndex():
            gm = make_fx(fn)(*ex)
    except Unsupported:
        raise
    except Exception as e:  # data-dependent branches, .item(), anything make_fx refuses
        text = str(e).strip()
        if "data-dependent" in text or "_local_scalar_dense" in text:
            raise Unsupported("data-dependent Python control flow or .item() in the mod") from e
        if isinstance(e, IndexError):
            raise  # torch's own error for an index out of range, as torch raises it
        first = text.splitlines()[0] if text else ""
        raise Unsupported(f"the mod could not be traced ({type(e).__name__}: {first[:120]})") from e
    try:
        with TransformGetItemToIndex():
            ShapeProp(gm).propagate(*ex)
    except Exception as e:
        raise Unsupported(f"the mod fails on example inputs ({type(e).__name__})") from e
    return gm


# -- the translator ---------------------------------------------------------------------------------


class Slots:
    """Captured tensors of one translation, by slot (deduplicated by identity)."""

    def __init__(self):
        self.tensors: list = []  # live tensors (eager capture) or None (compile buffers)
        self.meta: list = []  # (shape, torch dtype name)

    def slot(self, t) -> int:
        for i, u in enumerate(self.tensors):
            if u is t:
                return i
        self.tensors.append(t)
        self.meta.append((tuple(int(s) for s in t.shape), str(t.dtype).removeprefix("torch.")))
        return len(self.tensors) - 1

    def add(self, shape, dtype) -> int:
        self.tensors.append(None)
        self.meta.append((tuple(int(s) for s in shape), str(dtype).removeprefix("torch.")))
        return len(self.tensors) - 1


class Translator:
    """One program from one or more graphs (``run``)."""

    def __init__(self, slots: Slots, upcast=False):
        self.slots = slots
        self.upcast = upcast
        self.instrs: list[tuple] = []
        self._memo: dict = {}
        self.depth = 0

    # - instructions -

    def emit(self, op, dtype, operands, compute=None):
        if self.upcast:  # 16-bit floats computed in fp32 (torch's kernels do: fp32 scores)
            dtype = "fp32" if dtype in ("bf16", "fp16") else dtype
            compute = "fp32" if compute in ("bf16", "fp16") else compute
        ins = (op, dtype, tuple(operands), compute or dtype)
        hit = self._memo.get(ins)  # common subexpressions (unrolled rows repeat them)
        if hit is not None:
            return hit
        self.instrs.append(ins)
        v = ("v", len(self.instrs) - 1)
        self._memo[ins] = v
        return v

    def dtype_of(self, o) -> str:
        if o[0] == "v":
            return self.instrs[o[1]][1]
        if o[0] == "c":
            return {"f": "fp32", "i": "int32", "b": "bool"}[o[1]]
        return self.arg_dtypes[o[1]]

    # - values -

    def gather(self, view: View):
        slot = view.slot
        _, tdt = self.slots.meta[slot]
        return self.emit("gather", dname(getattr(torch, tdt)), [("t", slot), *view.idx])

    def unroll(self, v):
        """A scalar operand or a ``Vec`` for ``v`` (a view's free dimensions unrolled)."""
        if isinstance(v, View):
            free = v.free
            if not free:
                return self.gather(v)
            shape = tuple(v.shape[d] for d in free)
            if math.prod(shape) > MAX_UNROLL:
                raise Unsupported(
                    f"a captured tensor used with {math.prod(shape)} elements per score "
                    f"(at most {MAX_UNROLL} unroll)"
                )
            items = []
            for flat in range(math.prod(shape)):
                rest, pos = flat, []
                for n in reversed(shape):
                    pos.append(rest % n)
                    rest //= n
                pos.reverse()
                idx = list(v.idx)
                for d, p in zip(free, pos):
                    idx[d] = const(p)
                items.append(self.gather(View(v.slot, v.shape, idx)))
            return Vec(shape, items)
        if isinstance(v, Tup):
            raise Unsupported("a multi-output value used whole")
        return v

    def value(self, a):
        """The translated value of an argument (node or Python constant)."""
        if isinstance(a, fx.Node):
            return self.env[a]
        if isinstance(a, (bool, int, float)):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) >= 1 << 31:
                raise Unsupported(f"an integer constant {a} beyond int32")
            return const(a)
        raise Unsupported(f"an argument of type {type(a).__name__} in the mod")

    def example(self, a):
        """A tensor with ``a``'s dtype and shape, for torch's promotion rules."""
        if isinstance(a, fx.Node):
            shape, dtype = node_meta(a)
            return torch.empty(shape, dtype=dtype)
        return a

    # - elementwise over scalars and Vecs -

    def elementwise(self, fn, values, out_shape):
        vals = [self.unroll(v) for v in values]
        if not any(isinstance(v, Vec) for v in vals):
            return fn(*vals)
        shape = tuple(out_shape)
        n = math.prod(shape)
        if n > MAX_UNROLL:
            raise Unsupported(f"a value of {n} elements per score (at most {MAX_UNROLL})")
        out = []
        for flat in range(n):
            args = [self._pick(v, shape, flat) for v in vals]
            out.append(fn(*args))
        return Vec(shape, out) if shape else out[0]

    @staticmethod
    def _pick(v, shape, flat):
        if not isinstance(v, Vec):
            return v
        # broadcast v.shape against shape (numpy rules, right aligned)
        pos, rest = [], flat
        for n in reversed(shape):
            pos.append(rest % n)
            rest //= n
        pos.reverse()
        vs = v.shape
        pos = pos[len(shape) - len(vs) :]
        k = 0
        for p, n in zip(pos, vs):
            k = k * n + (p if n != 1 else 0)
        return v.items[k]

    # - graphs -

    def run(self, gm, names, arg_dtypes, buffers=(), inputs=None):
        """Translate ``gm`` (placeholders ``names`` then ``buffers``: slots) -> its output values.
        ``inputs``: values for the placeholders instead (inlining a decomposition)."""
        saved = getattr(self, "env", None)
        self.env = {}
        if inputs is None:
            self.arg_dtypes = dict(arg_dtypes)
        try:
            ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
            if inputs is not None:
                for n, v in zip(ph, inputs):
                    self.env[n] = v
            else:
                if len(ph) < len(names):
                    raise Unsupported("the mod takes fewer arguments than flex_attention passes")
                for n, name in zip(ph, names):
                    self.env[n] = ("arg", name)
                rest = ph[len(names) :]
                if len(rest) != len(buffers):
                    raise Unsupported("more mod inputs than the op passes")
                for n, slot in zip(rest, buffers):
                    self.env[n] = View(slot, self.slots.meta[slot][0])
            out = None
            for n in gm.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "get_attr":
                    t = getattr(gm, n.target)
                    if _literal(n, t):
                        # a tensor literal made in the mod (``torch.tensor(2.0)``, an int index
                        # torch's capture made a tensor): a constant of the program
                        v = t.item()
                        self.env[n] = const(float(v) if t.dtype.is_floating_point else v)
                    else:
                        self.env[n] = self.attr(t)
                elif n.op == "call_function":
                    self.env[n] = self.call(n)
                elif n.op == "output":
                    out = n.args[0]
                else:
                    raise Unsupported(f"graph node {n.op}")
            if isinstance(out, (tuple, list)):
                return [None if o is None else self.value(o) for o in out]
            return [self.value(out) if isinstance(out, fx.Node) else out]
        finally:
            if saved is not None:
                self.env = saved

    def attr(self, t):
        if not isinstance(t, torch.Tensor):
            raise Unsupported(f"a captured {type(t).__name__}")
        if t.numel() == 0:
            raise Unsupported("an empty captured tensor")
        dname(t.dtype)  # a dtype we can load
        slot = self.slots.slot(t)
        return View(slot, self.slots.meta[slot][0])

    def call(self, n):
        f = n.target
        out_of_place = functional(f)
        if out_of_place is not None:  # ``x.logical_and_(y)`` (autograd's formulas use some)
            n.target = out_of_place
            try:
                v = self.call(n)
            finally:
                n.target = f
            if isinstance(n.args[0], fx.Node):
                self.env[n.args[0]] = v  # later reads of the mutated value see the result
            return v
        a, kw = n.args, n.kwargs
        if f is operator.getitem:
            base = self.env.get(a[0])
            if isinstance(base, Tup):
                return base.items[a[1]]
            raise Unsupported("getitem on a value that is not a tuple")
        if f is aten.lift_fresh_copy.default:
            return self.env[a[0]]
        if f is aten.index.Tensor:
            return self.index(self.env[a[0]], list(a[1]))
        if f is aten.select.int:
            return self.select(self.env[a[0]], a[1], a[2])
        if f in _VIEWS:
            return self.view(n, self.env[a[0]] if isinstance(a[0], fx.Node) else self.value(a[0]))
        if f in _REDUCTIONS:
            return self.reduce(n)
        if f in (aten.unbind.int,):
            v = self.unroll(self.env[a[0]])
            dim = a[1] if len(a) > 1 else kw.get("dim", 0)
            if not isinstance(v, Vec) or dim not in (0, -len(v.shape)):
                raise Unsupported("unbind of a value without that dimension")
            k = math.prod(v.shape[1:])
            return Tup(
                [
                    Vec(v.shape[1:], v.items[i * k : (i + 1) * k]) if v.shape[1:] else v.items[i]
                    for i in range(v.shape[0])
                ]
            )
        if f in (aten.stack.default, aten.cat.default):
            return self.stack(n, f is aten.cat.default)
        shape, dtype = node_meta(n)
        d = dname(dtype)
        if f in _FILL:
            i = _FILL[f]
            if i is None:
                one = op_name(f) in ("ones_like", "ones", "new_ones")
                c = const(1 if one else 0)
            else:
                c = self.value(a[i])
            v = self.emit("copy", d, [self.unroll(c)])
            return Vec(shape, [v] * math.prod(shape)) if shape else v
        if f in (
            aten._to_copy.default,
            aten.to.dtype,
            aten.to.dtype_layout,
            prims.convert_element_type.default,
            aten.type_as.default,
        ):
            return self.elementwise(lambda x: self.emit("copy", d, [x]), [self.value(a[0])], shape)
        if f in (
            aten.where.self,
            aten.where.ScalarSelf,
            aten.where.ScalarOther,
            aten.where.Scalar,
            prims.where.default,
        ):
            return self.elementwise(
                lambda c, x, y: self.emit("where", d, [c, x, y]),
                [self.value(x) for x in a[:3]],
                shape,
            )
        if f in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
            return self.elementwise(
                lambda x, c, y: self.emit("where", d, [c, y, x]),
                [self.value(x) for x in a[:3]],
                shape,
            )
        if f in (
            aten.clamp.default,
            aten.clamp.Tensor,
            aten.clamp_min.default,
            aten.clamp_max.default,
            aten.clamp_min.Tensor,
            aten.clamp_max.Tensor,
        ):
            name = op_name(f)
            lo = a[1] if name in ("clamp", "clamp_min") and len(a) > 1 else kw.get("min")
            hi = (
                a[1]
                if name == "clamp_max"
                else (a[2] if name == "clamp" and len(a) > 2 else kw.get("max"))
            )
            v = self.value(a[0])
            if lo is not None:
                v = self.binary(n, "maximum", v, lo, d, shape, values=True)
            if hi is not None:
                v = self.binary(n, "minimum", v, hi, d, shape, values=True)
            return v
        if f in (aten.div.Tensor_mode, aten.div.Scalar_mode):
            mode = kw.get("rounding_mode", a[2] if len(a) > 2 else None)
            op = {None: "div", "floor": "floordiv", "trunc": "truncdiv"}[mode]
            return self.binary(n, op, a[0], a[1], d, shape)
        if f in (aten.rsub.Scalar, aten.rsub.Tensor):
            alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
            x = self.value(a[0])
            if alpha != 1:
                x = self.elementwise(lambda u: self.emit("mul", d, [u, const(alpha)]), [x], shape)
            return self.elementwise(
                lambda u, w: self.emit("sub", d, [w, u]), [x, self.value(a[1])], shape
            )
        low = lowering(f)
        if low is None:
            raise Unsupported(f"op {f} is outside the supported set")
        kind, what = low
        if kind == "unary":
            op = what
            return self.elementwise(lambda x: self.emit(op, d, [x]), [self.value(a[0])], shape)
        if kind == "binary":
            name = op_name(f)
            op = OPERATORS[what]
            if f.namespace == "prims" and op == "div" and d == "int32":
                op = "truncdiv"  # prims.div of integers truncates
            x, y = a[0], a[1]
            alpha = kw.get("alpha", 1)
            if op in ("add", "sub") and alpha != 1:
                yv = self.elementwise(
                    lambda u: self.emit("mul", d, [u, self.value(alpha)]), [self.value(y)], shape
                )
                return self.elementwise(
                    lambda u, w: self.emit(op, d, [u, w]), [self.value(x), yv], shape
                )
            if name in LOGICAL:

                def truthy(u):
                    return self.emit("ne", "bool", [u, const(0)], self.dtype_of(u))

                xb = self.elementwise(truthy, [self.value(x)], _shape_of(x))
                yb = self.elementwise(truthy, [self.value(y)], _shape_of(y))
                return self.elementwise(
                    lambda u, w: self.emit(op, d, [u, w], "bool"), [xb, yb], shape
                )
            return self.binary(n, op, x, y, d, shape)
        return self.decompose(n, what)

    def binary(self, n, op, x, y, d, shape, values=False):
        """``op`` of ``x`` and ``y`` (nodes or constants; ``values``: ``x`` is already a
        translated value)."""
        cd = d
        if d == "bool" or op in ("lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor"):
            cd = dname(torch.result_type(self.example(x), self.example(y)))
        xv = x if values else self.value(x)
        return self.elementwise(
            lambda u, w: self.emit(op, d, [u, w], cd), [xv, self.value(y)], shape
        )

    def decompose(self, n, fn):
        if self.depth > 16:
            raise Unsupported(f"op {n.target}: its decomposition does not terminate")
        args = list(n.args)
        tensor_args = [x for x in args if isinstance(x, fx.Node)]
        if any(
            isinstance(x, (list, tuple)) and any(isinstance(y, fx.Node) for y in x) for x in args
        ):
            raise Unsupported(f"op {n.target} with a list of tensors")
        metas = [node_meta(x) for x in tensor_args]
        for k, v in n.kwargs.items():
            if isinstance(v, fx.Node):
                raise Unsupported(f"op {n.target} with a tensor keyword argument {k}")
        key = (
            n.target,
            fn,
            tuple(
                ("T", m) if isinstance(x, fx.Node) else ("v", repr(x))
                for x, m in zip(args, _fill_metas(args, metas))
            ),
            tuple(sorted((k, repr(v)) for k, v in n.kwargs.items())),
        )
        try:
            gm = lowering_.trace_decomposition(fn, key, args, dict(n.kwargs), metas)
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(
                f"op {n.target}: its decomposition failed ({type(e).__name__})"
            ) from e
        self.depth += 1
        try:
            outs = self.run(gm, (), {}, inputs=[self.env[x] for x in tensor_args])
        finally:
            self.depth -= 1
        return outs[0] if len(outs) == 1 else Tup(outs)

    # - indexing -

    def index(self, base, indices):
        if isinstance(base, View):
            ops = []
            for i in indices:
                if i is None:
                    ops.append(None)
                    continue
                v = self.unroll(self.value(i))
                if isinstance(v, Vec):
                    raise Unsupported("indexing a captured tensor with a vector of indices")
                ops.append(v)
            return base.index(ops)
        v = self.unroll(base)
        if not isinstance(v, Vec):
            raise Unsupported("indexing a value with no dimensions")
        out = v
        dim = 0
        for i in indices:
            if i is None:
                dim += 1
                continue
            iv = self.unroll(self.value(i))
            if isinstance(iv, Vec):
                raise Unsupported("indexing a computed value with a vector of indices")
            out = self._dynamic_select(out, dim, iv)
        return out

    def _dynamic_select(self, v: Vec, dim, i):
        """``v`` indexed along ``dim`` by the scalar operand ``i`` (a chain of selects)."""
        n = v.shape[dim]
        parts = [self._static_select(v, dim, k) for k in range(n)]
        d = self.dtype_of(parts[0] if not isinstance(parts[0], Vec) else parts[0].items[0])
        cd = self.dtype_of(i)
        wrapped = self.emit(
            "where",
            cd,
            [self.emit("lt", "bool", [i, const(0)], cd), self.emit("add", cd, [i, const(n)]), i],
        )

        def choose(*xs):
            acc = xs[-1]
            for k in range(n - 2, -1, -1):
                acc = self.emit(
                    "where", d, [self.emit("eq", "bool", [wrapped, const(k)], cd), xs[k], acc]
                )
            return acc

        if isinstance(parts[0], Vec):
            items = [choose(*[p.items[e] for p in parts]) for e in range(len(parts[0].items))]
            return Vec(parts[0].shape, items)
        return choose(*parts)

    @staticmethod
    def _static_select(v: Vec, dim, k):
        shape = v.shape
        inner = math.prod(shape[dim + 1 :])
        outer = math.prod(shape[:dim])
        n = shape[dim]
        items = [v.items[(o * n + k) * inner + r] for o in range(outer) for r in range(inner)]
        rest = shape[:dim] + shape[dim + 1 :]
        return Vec(rest, items) if rest else items[0]

    def select(self, base, dim, i):
        if isinstance(base, View):
            free = base.free
            if dim < 0:
                dim += len(free)
            if not 0 <= dim < len(free):
                raise Unsupported("select past a captured tensor's dimensions")
            idx = list(base.idx)
            idx[free[dim]] = self.unroll(self.value(i))
            return View(base.slot, base.shape, idx)
        v = self.unroll(base)
        if not isinstance(v, Vec):
            raise Unsupported("select on a value with no dimensions")
        if dim < 0:
            dim += len(v.shape)
        if isinstance(i, int):
            if i < 0:
                i += v.shape[dim]
            return self._static_select(v, dim, i)
        return self._dynamic_select(v, dim, self.unroll(self.value(i)))

    def view(self, n, v):
        """Shape-only ops: free on scalars; on a ``Vec`` the items keep their (row-major)
        order under the node's new shape (``expand`` repeats them)."""
        f = n.target
        if isinstance(v, View):
            if f in (
                aten.alias.default,
                aten.detach.default,
                aten.clone.default,
                aten.contiguous.default,
                aten.lift_fresh_copy.default,
            ):
                return v
            shape, _ = node_meta(n)
            if tuple(shape) == tuple(v.shape[d] for d in v.free):
                return v
            v = self.unroll(v)
        if isinstance(v, Vec):
            shape, _ = node_meta(n)
            if f in (aten.expand.default, aten.expand_as.default):
                return self.elementwise(lambda x: x, [v], shape)
            if math.prod(shape) != len(v.items):
                raise Unsupported(f"{f} changes a value's element count")
            if (
                f in (aten.permute.default, aten.t.default, aten.transpose.int)
                and sum(x != 1 for x in v.shape) > 1
            ):
                raise Unsupported(f"{f} of a value with several dimensions")
            return Vec(shape, v.items) if shape else v.items[0]
        shape, _ = node_meta(n)
        if shape and math.prod(shape) > 1:
            return self.elementwise(lambda x: x, [v], shape)
        return v

    def reduce(self, n):
        f = n.target
        a, kw = n.args, n.kwargs
        v = self.unroll(self.env[a[0]])
        shape, dtype = node_meta(n)
        d = dname(dtype)
        if not isinstance(v, Vec):
            if f in (
                aten.mean.dim,
                aten.mean.default,
                aten.sum.dim_IntList,
                aten.sum.default,
                aten.amax.default,
                aten.amin.default,
                aten.prod.default,
            ):
                return self.emit("copy", d, [v])
            raise Unsupported(f"{f} of a value with no dimensions")
        dims = a[1] if len(a) > 1 else kw.get("dim", None)
        if f in (aten.sum.default, aten.mean.default, aten.prod.default) or dims in (None, []):
            dims = list(range(len(v.shape)))
        if isinstance(dims, int):
            dims = [dims]
        dims = sorted({x % len(v.shape) for x in dims})
        op = {
            aten.sum.dim_IntList: "add",
            aten.sum.default: "add",
            aten.mean.dim: "add",
            aten.mean.default: "add",
            aten.amax.default: "maximum",
            aten.amin.default: "minimum",
            aten.prod.default: "mul",
            aten.prod.dim_int: "mul",
        }[f]
        keep = [i for i in range(len(v.shape)) if i not in dims]
        groups: dict = {}
        for flat, item in enumerate(v.items):
            rest, pos = flat, []
            for s in reversed(v.shape):
                pos.append(rest % s)
                rest //= s
            pos.reverse()
            groups.setdefault(tuple(pos[i] for i in keep), []).append(item)
        out = []
        count = math.prod(v.shape[i] for i in dims)
        for key in sorted(groups):
            items = groups[key]
            acc = self.emit("copy", d, [items[0]])
            for it in items[1:]:
                acc = self.emit(op, d, [acc, it])
            if f in (aten.mean.dim, aten.mean.default):
                acc = self.emit("div", d, [acc, const(float(count))])
            out.append(acc)
        if math.prod(shape) != len(out):
            raise Unsupported(f"{f}: unexpected result shape")
        return Vec(shape, out) if shape else out[0]

    def stack(self, n, cat):
        shape, dtype = node_meta(n)
        d = dname(dtype)
        parts = [self.unroll(self.value(x)) for x in n.args[0]]
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        if dim not in (0, -len(shape)):
            raise Unsupported(f"{n.target} along a dimension other than the first")
        items = []
        for p in parts:
            if isinstance(p, Vec):
                items.extend(p.items)
            else:
                items.append(p)
        items = [self.emit("copy", d, [x]) for x in items]
        if len(items) != math.prod(shape):
            raise Unsupported(f"{n.target}: unexpected result shape")
        return Vec(shape, items)


def _literal(node, t) -> bool:
    """A ``get_attr`` constant only read through ``lift_fresh_copy``: a literal of the mod."""
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 0
        and bool(node.users)
        and all(u.target is aten.lift_fresh_copy.default for u in node.users)
    )


def _shape_of(a):
    return node_meta(a)[0] if isinstance(a, fx.Node) else ()


def _fill_metas(args, metas):
    it = iter(metas)
    return [next(it) if isinstance(x, fx.Node) else None for x in args]


_VIEWS = {
    aten.alias.default,
    aten.detach.default,
    aten.clone.default,
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.expand.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.unsqueeze.default,
    aten.contiguous.default,
    aten.expand_as.default,
    aten.view_as.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.flatten.using_ints,
}
_REDUCTIONS = {
    aten.sum.dim_IntList,
    aten.sum.default,
    aten.mean.dim,
    aten.mean.default,
    aten.amax.default,
    aten.amin.default,
    aten.prod.default,
    aten.prod.dim_int,
}
_FILL = {
    aten.scalar_tensor.default: 0,
    aten.full.default: 1,
    aten.full_like.default: 1,
    aten.zeros_like.default: None,
    aten.ones_like.default: None,
    aten.new_full.default: 2,
    aten.zeros.default: None,
    aten.ones.default: None,
    aten.new_zeros.default: None,
    aten.new_ones.default: None,
    aten.new_empty.default: None,
    aten.empty_like.default: None,
}


def translate(gms, names, slots: Slots, buffers=(), upcast=False, dtypes=None) -> Program:
    """One program from the graph(s) ``gms`` (each: placeholders ``names`` then ``buffers``,
    their outputs concatenated into the program's outputs; None outputs of a joint graph are
    dropped after the first)."""
    t = Translator(slots, upcast)
    if isinstance(gms, fx.GraphModule):
        gms = [gms]
    arg_dtypes = dtypes or {n: ("fp32" if n in ("score", "grad_out") else "int32") for n in names}
    outs = []
    for gm in gms:
        vals = t.run(gm, names, arg_dtypes, buffers)
        for k, v in enumerate(vals):
            if v is None:
                if k == 0:
                    raise Unsupported("the mod returns None")
                continue
            v = t.unroll(v)
            if isinstance(v, Vec):
                if len(v.items) != 1:
                    raise Unsupported(f"the mod returns shape {list(v.shape)}, not one value")
                v = v.items[0]
            if isinstance(v, (bool, int, float)):
                v = const(v)
            outs.append(v)
    return Program(tuple(names), tuple(t.instrs), tuple(outs), tuple(slots.meta))
