"""Matching what follows a GEMM in the post-grad graph: the fused epilogue and SwiGLU.

FlyDSL's dense GEMM computes ``act(alpha * acc + beta * C + bias) + residual`` in fp32 and
rounds once to the output dtype. After AOTAutograd the chain that follows an ``mm`` /
``addmm`` / ``bmm`` is decomposed: ``F.linear`` reshapes its output back to 3-D,
``F.gelu`` is ``convert -> mul / erf / add / mul -> convert``, ``F.silu`` is
``x / (1 + exp(-x))``. The activations are found with Inductor's own pattern matcher on
patterns traced from ``F.relu`` / ``F.gelu`` / ``F.gelu(approximate="tanh")`` / ``F.silu``
through Inductor's decompositions, one per input dtype (``fwd_only`` + ``fx_to_pattern``),
so they match exactly what the decomposition produces, constants included.

``extend`` walks single-use nodes after the GEMM in the order the kernel applies them:

1. a reshape keeping the last dim (``F.linear`` on 3-D input);
2. a bias add: an ``(N,)``-like row (per column) or, for a 2-D output, an ``(M, 1)``
   column (per row), without type promotion;
3. an activation (possibly after an upcast to fp32, which then sets the output dtype);
4. a residual add of a tensor of the output's shape;
5. a dtype cast (fp32 / bf16 / fp16).

A node with another user ends the chain there (the intermediate is needed), and what is not
matched stays Inductor's. Numerics: eager rounds after every step; the fused kernel rounds
once, so results agree within the output dtype's tolerance, not bit for bit.

``find_swiglu``: ``mul(silu(x @ Wg), x @ Wu)`` where both GEMMs are plain ``mm`` of the same
``x`` (the same node, or the same reshape of it) and weights of one shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import fx

aten = torch.ops.aten
prims = torch.ops.prims
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
ADD = aten.add.Tensor
MUL = aten.mul.Tensor
CONVERT = prims.convert_element_type.default
#: the dtypes an activation pattern is traced in (a pattern per dtype: a bf16 graph carries casts
#: an fp32 one lacks); a pattern-matching choice, not a kernel's dtype list
FLOATS = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def activation_patterns():
    """``[(name, pattern)]`` for every activation and input dtype, longest first (a bf16
    pattern includes the up / down casts that its fp32 one lacks)."""
    import torch.nn.functional as F
    from torch._inductor.pattern_matcher import fwd_only, fx_to_pattern

    fns = {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
        "silu": F.silu,
    }
    out = []
    for name, fn in fns.items():
        for dt in FLOATS:
            gm = fwd_only(_one_arg(fn), [torch.empty(8, 8, dtype=dt)])
            size = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            out.append(
                (size, name, fx_to_pattern(gm, argnames=["x"], ignore_types=(torch.device,)))
            )
    return [(name, p) for _, name, p in sorted(out, key=lambda t: -t[0])]


def _one_arg(fn):
    def act(x):
        return fn(x)

    return act


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


#: users that read only a size or stride of a node (``splice`` re-points them)
SIZE_READERS = (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default)


def data_users(n: fx.Node) -> list[fx.Node]:
    return [u for u in n.users if u.target not in SIZE_READERS]


def single_user(n: fx.Node) -> fx.Node | None:
    users = data_users(n)
    return users[0] if len(users) == 1 else None


def _reachable(start: fx.Node, depth: int = 16) -> list[fx.Node]:
    seen, frontier, out = {start}, [start], []
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u not in seen:
                    seen.add(u)
                    out.append(u)
                    nxt.append(u)
        frontier = nxt
    return out


def match_activation(x: fx.Node) -> tuple[str, fx.Node, list[fx.Node]] | None:
    """``(name, end node, matched nodes)`` of an activation applied to ``x``, consuming every
    use of ``x`` and of the intermediates (only the end node may be used outside)."""
    for cand in _reachable(x):
        for name, pat in activation_patterns():
            m = pat.match(cand)
            if not m or m.kwargs.get("x") is not x:
                continue
            inside = set(m.nodes)
            if any(u not in inside for n in m.nodes if n is not cand for u in data_users(n)):
                continue
            if any(u not in inside for u in data_users(x)):
                continue
            return name, cand, m.nodes
    return None


def same_value(a, b) -> bool:
    """Two arguments that hold the same value: one node; two size expressions the shape
    environment proves equal; or the same view of the same tensor."""
    if a is b:
        return True
    if not isinstance(a, fx.Node) or not isinstance(b, fx.Node):
        if isinstance(a, fx.Node) or isinstance(b, fx.Node):
            return _same_size(
                _val(a) if isinstance(a, fx.Node) else a, _val(b) if isinstance(b, fx.Node) else b
            )
        return a == b
    va, vb = _val(a), _val(b)
    if isinstance(va, torch.SymInt) or isinstance(vb, torch.SymInt):
        return _same_size(va, vb)
    if a.target != b.target or a.target not in VIEWS or a.kwargs != b.kwargs:
        return False
    if len(a.args) != len(b.args) or not same_value(a.args[0], b.args[0]):
        return False
    fa, fb = _flat(a.args[1:]), _flat(b.args[1:])
    return len(fa) == len(fb) and all(same_value(x, y) for x, y in zip(fa, fb))


def _same_size(x, y) -> bool:
    from ..ops import _sym

    if not isinstance(x, (int, torch.SymInt)) or not isinstance(y, (int, torch.SymInt)):
        return False
    return _sym.eq(x, y)


def _flat(args):
    out = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, (list, tuple)) else [a])
    return out


@dataclass
class Chain:
    """What ``extend`` found after a GEMM node (see the module docstring)."""

    end: fx.Node
    shape: list | None = None  # the reshape applied to the GEMM's output
    bias: fx.Node | None = None
    bias_rows: bool = False  # an (M, 1) bias: one per row
    activation: str = ""
    residual: fx.Node | None = None
    out_dtype: torch.dtype | None = None
    nodes: tuple = ()

    @property
    def fused(self) -> list[str]:
        parts = []
        if self.bias is not None:
            parts.append("bias_rows" if self.bias_rows else "bias")
        if self.activation:
            parts.append(self.activation)
        if self.residual is not None:
            parts.append("residual")
        if self.out_dtype is not None:
            parts.append("cast")
        return parts


def _strip_view(n: fx.Node):
    """``(gemm node, reshape shape or None)`` for ``n`` = a GEMM or a reshape of one."""
    if n.target in VIEWS and isinstance(n.args[0], fx.Node):
        return n.args[0], n.args[1]
    return n, None


def _row_like(v, n_cols) -> bool:
    """An ``(N,)``, ``(1, N)``, ``(1, 1, N)`` ... tensor (no guard on a symbolic size: a
    size that may be 1 or not is not a row)."""
    from ..ops import _sym

    shape = tuple(v.shape)
    return len(shape) >= 1 and _sym.eq(shape[-1], n_cols) and all(_sym.eq(s, 1) for s in shape[:-1])


def extend(root: fx.Node) -> Chain:
    """The epilogue chain after ``root`` (a dense GEMM node); ``Chain(end=root)`` if none."""
    from ..ops import _sym

    rv = _val(root)
    chain = Chain(end=root)
    tip = root
    n_cols = rv.shape[-1]
    nodes = []
    # 1. a reshape of a 2-D result that keeps the last dim (F.linear on 3-D input)
    u = single_user(tip)
    if u is not None and u.target in VIEWS and rv.dim() == 2:
        uv = _val(u)
        if uv is not None and uv.dim() >= 2 and _sym.eq(uv.shape[-1], n_cols):
            chain.shape, tip = u.args[1], u
            nodes.append(u)
    tv = _val(tip)
    # 2. bias
    u = single_user(tip)
    if u is not None and u.target is ADD and not u.kwargs and len(u.args) == 2:
        other = u.args[1] if u.args[0] is tip else u.args[0]
        ov, uv = _val(other), _val(u)
        if ov is not None and uv is not None and uv.dtype == tv.dtype and ov.is_floating_point():
            if _row_like(ov, n_cols) and ov.device == tv.device:
                chain.bias, tip = other, u
            elif (
                tv.dim() == 2
                and ov.dim() == 2
                and _sym.eq(ov.shape[0], tv.shape[0])
                and _sym.eq(ov.shape[1], 1)
                and ov.device == tv.device
            ):
                chain.bias, chain.bias_rows, tip = other, True, u
            if tip is u:
                nodes.append(u)
    # 3. activation, possibly after an upcast to fp32
    act = match_activation(tip) if single_user(tip) is not None else None
    if act is None:
        up = single_user(tip)
        if up is not None and up.target is CONVERT and up.args[1] == torch.float32:
            act = match_activation(up) if single_user(up) is not None else None
            if act is not None:
                nodes.append(up)
    if act is not None:
        chain.activation, tip, matched = act
        nodes.extend(matched)
    tv = _val(tip)
    # 4. residual: a tensor of exactly the output's shape
    u = single_user(tip)
    if u is not None and u.target is ADD and not u.kwargs and len(u.args) == 2:
        other = u.args[1] if u.args[0] is tip else u.args[0]
        ov, uv = _val(other), _val(u)
        if (
            ov is not None
            and uv is not None
            and ov.is_floating_point()
            and ov.device == tv.device
            and _sym.shape_eq(tuple(ov.shape), tuple(tv.shape))
            and uv.dtype in FLOATS
        ):
            chain.residual, tip = other, u
            nodes.append(u)
    # 5. a cast
    u = single_user(tip)
    if u is not None and u.target is CONVERT and u.args[1] in FLOATS:
        tip = u
        nodes.append(u)
    chain.end = tip
    chain.nodes = tuple(nodes)
    ev = _val(tip)
    if ev.dtype != rv.dtype:
        chain.out_dtype = ev.dtype
    return chain


@dataclass
class SwiGLU:
    mul: fx.Node
    gate: fx.Node  # the gate GEMM (mm)
    up: fx.Node
    shape: list | None  # the reshape of both GEMMs' outputs


def find_swiglu(mul: fx.Node) -> SwiGLU | None:
    """``mul(silu(gate_mm), up_mm)`` (either operand order, either through one reshape)."""
    if mul.target is not MUL or len(mul.args) != 2 or mul.kwargs:
        return None
    for x, y in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
        if isinstance(x, fx.Node) and isinstance(y, fx.Node):
            found = _swiglu_pair(mul, x, y)
            if found is not None:
                return found
    return None


def _swiglu_pair(mul, x, y) -> SwiGLU | None:
    up, up_shape = _strip_view(y)
    if up.target is not aten.mm.default or single_user(up) is None:
        return None
    if up_shape is not None and single_user(y) is not mul:
        return None
    gate_out = _silu_input(x)
    if gate_out is None:
        return None
    gate, gate_shape = _strip_view(gate_out)
    if gate.target is not aten.mm.default or single_user(gate) is None or gate is up:
        return None
    if (gate_shape is None) != (up_shape is None):
        return None
    if gate_shape is not None and not all(
        same_value(p, q) for p, q in zip(_flat([gate_shape]), _flat([up_shape]))
    ):
        return None
    if not same_value(gate.args[0], up.args[0]):
        return None
    from ..ops import _sym

    gv, uv = _val(gate.args[1]), _val(up.args[1])
    if not _sym.shape_eq(tuple(gv.shape), tuple(uv.shape)) or gv.dtype != uv.dtype:
        return None
    return SwiGLU(mul, gate, up, gate_shape)


def _silu_input(x: fx.Node) -> fx.Node | None:
    """The node ``x`` is ``silu`` of (the activation pattern ending at ``x``), or None."""
    for name, pat in activation_patterns():
        if name != "silu":
            continue
        m = pat.match(x)
        if m:
            src = m.kwargs.get("x")
            inside = set(m.nodes)
            if any(u not in inside for n in m.nodes if n is not x for u in data_users(n)):
                return None
            if any(u not in inside for u in data_users(src)):
                return None
            return src
    return None
