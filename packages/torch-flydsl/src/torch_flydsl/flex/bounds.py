"""Index checks of a mod's captured-tensor reads, on the host before any launch.

torch evaluates a mod at every ``(b, h, q_idx, kv_idx)`` of the call and raises ``IndexError``
when an index is out of range; the kernels read without bounds checks. ``check`` proves every
``gather`` of a program in range, or raises torch's ``IndexError``:

1. interval arithmetic over the program (inputs in ``[0, extent)``, a captured tensor's values
   in ``[min, max]`` of its data): exact for the usual index expressions (sums, differences,
   ``abs``, ``clamp``, ``//`` and ``%`` by constants, table lookups);
2. where that cannot prove an index in range, the index is computed exactly with torch over
   the grid of the inputs it depends on (at most ``EXACT_LIMIT`` points), which finds the first
   out-of-range index as torch's own evaluation would;
3. beyond that grid size, ``Unsupported`` (torch's flex_attention runs and decides).

Results are cached per program, shapes and captured tensors' versions.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch

from .program import Program, const_value, evaluate
from .translate import Unsupported

EXACT_LIMIT = 1 << 24
_CACHE: OrderedDict = OrderedDict()
_RANGES: OrderedDict = OrderedDict()
INF = math.inf


def value_range(t: torch.Tensor):
    """``(min, max)`` of a captured tensor's values (cached per tensor version)."""
    key = (id(t), t._version)
    hit = _RANGES.get(key)
    if hit is not None and hit[0] is t:
        return hit[1]
    if t.dtype == torch.bool:
        r = (0.0, 1.0)
    else:
        lo, hi = torch.aminmax(t.detach().reshape(-1))
        r = (float(lo), float(hi))
    _RANGES[key] = (t, r)
    if len(_RANGES) > 256:
        _RANGES.popitem(last=False)
    return r


def _mul(a, b):
    ps = [x * y for x in a for y in b if not (math.isinf(x) or math.isinf(y))]
    if any(math.isinf(x) for x in (*a, *b)) or not ps:
        return (-INF, INF)
    return (min(ps), max(ps))


def intervals(prog: Program, extents: dict, tensors) -> list:
    """Per instruction ``(lo, hi)`` (floats, possibly infinite)."""
    out: list = []

    def rng(o):
        if o[0] == "v":
            return out[o[1]]
        if o[0] == "arg":
            n = extents.get(o[1])
            return (0.0, float(n - 1)) if n is not None else (-INF, INF)
        if o[0] == "c":
            v = float(const_value(o[1], o[2]))
            return (v, v)
        return (-INF, INF)

    for op, d, ops, _cd in prog.instrs:
        r = (-INF, INF)
        a = rng(ops[0]) if ops and ops[0][0] != "t" else None
        b = rng(ops[1]) if len(ops) > 1 and op != "gather" else None
        if d == "bool" or op in ("lt", "le", "gt", "ge", "eq", "ne", "not"):
            r = (0.0, 1.0)
        elif op == "gather":
            t = tensors[ops[0][1]]
            r = value_range(t) if t is not None else (-INF, INF)
        elif op == "copy":
            r = a
            if d == "int32" and not (math.isinf(a[0]) or math.isinf(a[1])):
                r = (float(math.trunc(a[0])), float(math.trunc(a[1])))
        elif op == "neg":
            r = (-a[1], -a[0])
        elif op == "abs":
            r = (0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1])), max(abs(a[0]), abs(a[1])))
        elif op == "add":
            r = (a[0] + b[0], a[1] + b[1])
        elif op == "sub":
            r = (a[0] - b[1], a[1] - b[0])
        elif op == "mul":
            r = _mul(a, b)
        elif op == "maximum":
            r = (max(a[0], b[0]), max(a[1], b[1]))
        elif op == "minimum":
            r = (min(a[0], b[0]), min(a[1], b[1]))
        elif op == "where":
            x, y = rng(ops[1]), rng(ops[2])
            r = (min(x[0], y[0]), max(x[1], y[1]))
        elif op in ("floordiv", "truncdiv") and b[0] == b[1] and b[0] > 0:
            c = b[0]
            f = math.floor if op == "floordiv" else math.trunc
            r = (
                f(a[0] / c) if not math.isinf(a[0]) else -INF,
                f(a[1] / c) if not math.isinf(a[1]) else INF,
            )
        elif op == "remainder" and b[0] == b[1] and b[0] > 0:
            c = b[0]
            r = (0.0, c - 1 if d == "int32" else c)
            if not (math.isinf(a[0]) or math.isinf(a[1])) and math.floor(a[0] / c) == math.floor(
                a[1] / c
            ):
                r = (a[0] - math.floor(a[0] / c) * c, a[1] - math.floor(a[0] / c) * c)
        elif op in ("floor", "ceil"):
            r = a
        if any(math.isnan(x) for x in r):
            r = (-INF, INF)
        out.append(r)
    return out


def check(prog: Program, extents: dict, tensors) -> None:
    """Raise torch's ``IndexError`` if some gather of ``prog`` reads out of range anywhere in
    ``extents`` (``b``, ``h``, ``q_idx``, ``kv_idx`` -> size); ``Unsupported`` when that cannot
    be decided (see the module doc)."""
    if not prog.gathers():
        return
    key = (
        prog,
        tuple(sorted(extents.items())),
        tuple((id(t), t._version) if t is not None else None for t in tensors),
    )
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return
    ranges = intervals(prog, extents, tensors)
    deps = None
    for g in prog.gathers():
        slot = prog.instrs[g][2][0][1]
        shape = prog.tensors[slot][0]
        for dim, (o, n) in enumerate(zip(prog.instrs[g][2][1:], shape)):
            if o[0] == "c":
                lo = hi = float(const_value(o[1], o[2]))
            elif o[0] == "arg":
                e = extents.get(o[1])
                lo, hi = (0.0, float(e - 1)) if e is not None else (-INF, INF)
            else:
                lo, hi = ranges[o[1]]
            if lo >= -n and hi <= n - 1:
                continue
            if o[0] == "c":
                _raise(int(lo), dim, n)
            deps = prog.deps() if deps is None else deps
            _exact(prog, o, dim, n, extents, tensors, deps)
    _CACHE[key] = True
    if len(_CACHE) > 256:
        _CACHE.popitem(last=False)


def _raise(v, dim, n):
    raise IndexError(f"index {v} is out of bounds for dimension {dim} with size {n}")


def _exact(prog, o, dim, n, extents, tensors, deps):
    ds = prog.operand_deps(o, deps)
    names = [x for x in ("b", "h", "q_idx", "kv_idx") if x in ds]
    if any(not x.startswith("t") and x not in names for x in ds):
        raise Unsupported("a captured tensor indexed by a value computed from the score")
    size = math.prod(extents[x] for x in names)
    if size > EXACT_LIMIT:
        raise Unsupported(
            f"cannot prove a captured tensor's index in range without evaluating it at {size} "
            "points"
        )
    dev = next((t.device for t in tensors if t is not None), torch.device("cpu"))
    env = {}
    for k, x in enumerate(names):
        shape = [1] * len(names)
        shape[k] = extents[x]
        env[x] = torch.arange(extents[x], dtype=torch.int32, device=dev).reshape(shape)
    if o[0] == "arg":
        val = env[o[1]]
    else:
        (val,) = evaluate(prog, env, tensors, upto=o[1])
    val = val.long().reshape(-1)
    bad = (val < -n) | (val >= n)
    if bool(bad.any()):
        _raise(int(val[bad][0]), dim, n)
