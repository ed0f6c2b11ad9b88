"""Reference rules: one function per FlyIR op, turning the op into a step.

The rules of the structured control-flow ops (``for``, ``if``, ``while``)
live in ``interpreter.py``, beside the block compiler they recurse into; the
terminators (``yield``, ``condition``) are read by those rules.

A rule gets the op and a ``Slots`` map (value -> index into the
environment list) and returns ``step(env, state)``, which computes the op's
results from ``env`` with torch and stores them back. Building closures once
per compile, rather than interpreting per call, keeps the per-op cost at a
couple of microseconds beyond torch's own.
"""

from __future__ import annotations

import torch

from ... import dtypes as dt
from ...exc import LoweringError, ReferenceRuntimeError
from ...ir.core import Op

RULES: dict = {}


def rule(*names):
    def deco(fn):
        for n in names:
            if n in RULES:
                raise LoweringError(f"reference rule for {n!r} registered twice")
            RULES[n] = fn
        return fn

    return deco


def tdt(d: dt.DType):
    return d.torch_dtype()


def _fail(op: Op, msg: str, state):
    raise ReferenceRuntimeError(f"{msg} (program {state.pid})", loc=op.loc)


# --- leaves ---------------------------------------------------------------------------


@rule("constant")
def _constant(op, S):
    t = op.results[0].type
    val = torch.full(t.shape, op.attrs["value"], dtype=tdt(t.dtype))
    S.preset(op.results[0], val)
    return None


@rule("arange")
def _arange(op, S):
    S.preset(op.results[0], torch.arange(op.attrs["start"], op.attrs["end"], dtype=torch.int32))
    return None


@rule("program_id")
def _program_id(op, S):
    r, axis = S[op.results[0]], op.attrs["axis"]

    def step(env, state):
        env[r] = state.pid_t[axis]

    return step


@rule("num_programs")
def _num_programs(op, S):
    r, axis = S[op.results[0]], op.attrs["axis"]

    def step(env, state):
        env[r] = state.grid_t[axis]

    return step


# --- elementwise ----------------------------------------------------------------------


def _c_mod(a, b):
    return torch.fmod(a, b)


_BIN = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "truediv": torch.div,
    "intdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "mod": _c_mod,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "pow": torch.pow,
    "and": torch.bitwise_and,
    "or": torch.bitwise_or,
    "xor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift,
    "shr": torch.bitwise_right_shift,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": torch.eq,
    "ne": torch.ne,
}

_UN = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "exp2": torch.exp2,
    "log": torch.log,
    "log2": torch.log2,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "erf": torch.erf,
    "tanh": torch.tanh,
    "reciprocal": torch.reciprocal,
    "sigmoid": torch.sigmoid,
    "sin": torch.sin,
    "cos": torch.cos,
    "floor": torch.floor,
    "ceil": torch.ceil,
}


def _make_binary(name):
    f = _BIN[name]

    def build(op, S):
        a, b = S[op.operand("lhs")], S[op.operand("rhs")]
        r = S[op.results[0]]
        if name == "intdiv":

            def step(env, state):
                y = env[b]
                if bool((y == 0).any()):
                    _fail(op, "integer division by zero", state)
                env[r] = f(env[a], y)

            return step

        def step(env, state):
            env[r] = f(env[a], env[b])

        return step

    return build


def _make_unary(name):
    f = _UN[name]

    def build(op, S):
        a = S[op.operand("x")]
        r = S[op.results[0]]

        def step(env, state):
            env[r] = f(env[a])

        return step

    return build


for _n in _BIN:
    rule(_n)(_make_binary(_n))
for _n in _UN:
    rule(_n)(_make_unary(_n))


@rule("invert")
def _invert(op, S):
    x = op.operand("x")
    a, r = S[x], S[op.results[0]]
    f = torch.logical_not if x.type.dtype.is_bool else torch.bitwise_not

    def step(env, state):
        env[r] = f(env[a])

    return step


@rule("hint")
def _hint(op, S):
    # A false hint would make GPU code silently wrong: the reference checks it.
    a, r = S[op.operand("x")], S[op.results[0]]
    contiguous, multiple_of = op.attrs["contiguous"], op.attrs["multiple_of"]

    def step(env, state):
        x = env[a]
        env[r] = x
        v = x.reshape(1) if x.dim() == 0 else x
        for d, (c, m) in enumerate(zip(contiguous, multiple_of)):
            runs = v.movedim(d, -1).unflatten(-1, (-1, c)).long()
            if c > 1 and not bool((runs.diff(dim=-1) == 1).all()):
                _fail(op, f"hint: axis {d} is not made of runs of {c} consecutive values", state)
            if m > 1 and not bool((runs[..., 0] % m == 0).all()):
                _fail(
                    op, f"hint: axis {d} has a run starting at a value not divisible by {m}", state
                )

    return step


@rule("cast")
def _cast(op, S):
    a, r = S[op.operand("x")], S[op.results[0]]
    src, to = op.operand("x").type.dtype, op.attrs["dtype"]
    tt = tdt(to)
    if to.is_float and to.storage_only:
        # FlyDSL's fp8 conversions saturate to the largest finite value (NaN stays NaN),
        # from integers and bools as from floats.
        info = torch.finfo(tt)

        def step(env, state):
            x = env[a].float()
            env[r] = torch.where(torch.isnan(x), x, x.clamp(info.min, info.max)).to(tt)

        return step
    if src.storage_only and to.is_float:

        def step(env, state):
            env[r] = env[a].float().to(tt)

        return step

    def step(env, state):
        env[r] = env[a].to(tt)

    return step


@rule("bitcast")
def _bitcast(op, S):
    a, r = S[op.operand("x")], S[op.results[0]]
    tt = tdt(op.attrs["dtype"])

    def step(env, state):
        env[r] = (
            env[a].contiguous().view(tt) if env[a].dim() else env[a].reshape(1).view(tt).reshape(())
        )

    return step


@rule("rescale")
def _rescale(op, S):
    """The product: a skipped multiply by 1 (the GPU lowering's branch) gives the same values."""
    a, f, r = S[op.operand("x")], S[op.operand("factor")], S[op.results[0]]

    def step(env, state):
        env[r] = env[a] * env[f]

    return step


@rule("where")
def _where(op, S):
    c, a, b = S[op.operand("cond")], S[op.operand("x")], S[op.operand("y")]
    r = S[op.results[0]]

    def step(env, state):
        env[r] = torch.where(env[c], env[a], env[b])

    return step


# --- shape ----------------------------------------------------------------------------


@rule("broadcast")
def _broadcast(op, S):
    a, r, shape = S[op.operand("x")], S[op.results[0]], op.attrs["shape"]

    def step(env, state):
        env[r] = env[a].expand(shape)

    return step


@rule("reshape")
def _reshape(op, S):
    a, r, shape = S[op.operand("x")], S[op.results[0]], op.attrs["shape"]

    def step(env, state):
        env[r] = env[a].reshape(shape)

    return step


@rule("permute")
def _permute(op, S):
    a, r, order = S[op.operand("x")], S[op.results[0]], op.attrs["order"]

    def step(env, state):
        env[r] = env[a].permute(order)

    return step


@rule("concat")
def _concat(op, S):
    a, b = S[op.operand("a")], S[op.operand("b")]
    r, axis = S[op.results[0]], op.attrs["axis"]

    def step(env, state):
        env[r] = torch.cat([env[a], env[b]], axis)

    return step


# --- reductions, scans, sorting ---------------------------------------------------------


def _xor_reduce(x, axis):
    x = x.movedim(axis, -1)
    while x.shape[-1] > 1:
        n = x.shape[-1]
        if n % 2:
            x = torch.cat([x, torch.zeros_like(x[..., :1])], -1)
            n += 1
        x = torch.bitwise_xor(x[..., : n // 2], x[..., n // 2 :])
    return x[..., 0]


@rule("reduce")
def _reduce(op, S):
    a, r = S[op.operand("x")], S[op.results[0]]
    kind, axis = op.attrs["kind"], op.attrs["axis"]
    td = tdt(op.results[0].type.dtype)
    f = {
        "sum": lambda x: torch.sum(x, axis, dtype=td),
        "prod": lambda x: torch.prod(x, axis, dtype=td),
        "max": lambda x: torch.amax(x, axis),
        "min": lambda x: torch.amin(x, axis),
        "xor_sum": lambda x: _xor_reduce(x, axis),
    }[kind]

    def step(env, state):
        env[r] = f(env[a])

    return step


@rule("argreduce")
def _argreduce(op, S):
    a = S[op.operand("x")]
    rv, ri = (S[v] for v in op.results)
    axis = op.attrs["axis"]
    largest = op.attrs["kind"] == "argmax"

    def step(env, state):
        x = env[a]
        # torch.argmax/argmin return the first extreme value and rank NaN highest.
        idx = torch.argmax(x, axis) if largest else torch.argmin(x, axis)
        env[ri] = idx.to(torch.int32)
        env[rv] = torch.gather(x, axis, idx.unsqueeze(axis)).squeeze(axis)

    return step


@rule("scan")
def _scan(op, S):
    a, r = S[op.operand("x")], S[op.results[0]]
    kind, axis, rev = op.attrs["kind"], op.attrs["axis"], op.attrs.get("reverse", False)
    td = tdt(op.results[0].type.dtype)
    f = {
        "cumsum": lambda x: torch.cumsum(x, axis, dtype=td),
        "cumprod": lambda x: torch.cumprod(x, axis, dtype=td),
        "cummax": lambda x: torch.cummax(x, axis).values,
        "cummin": lambda x: torch.cummin(x, axis).values,
    }[kind]

    def step(env, state):
        x = env[a]
        env[r] = f(x.flip(axis)).flip(axis) if rev else f(x)

    return step


@rule("sort")
def _sort(op, S):
    a = S[op.operand("x")]
    rv, ri = (S[v] for v in op.results)
    axis, desc = op.attrs["axis"], op.attrs["descending"]

    def step(env, state):
        v, i = torch.sort(env[a], dim=axis, descending=desc, stable=True)
        env[rv], env[ri] = v, i.to(torch.int32)

    return step


@rule("topk")
def _topk(op, S):
    a = S[op.operand("x")]
    rv, ri = (S[v] for v in op.results)
    axis, k, largest = op.attrs["axis"], op.attrs["k"], op.attrs["largest"]

    def step(env, state):
        # A stable sort gives the documented tie order: equal values by index ascending.
        v, i = torch.sort(env[a], dim=axis, descending=largest, stable=True)
        env[rv] = v.narrow(axis, 0, k)
        env[ri] = i.narrow(axis, 0, k).to(torch.int32)

    return step


@rule("histogram")
def _histogram(op, S):
    a, r = S[op.operand("values")], S[op.results[0]]
    mask = op.operand("mask")
    m = S[mask] if mask is not None else None
    nb = op.attrs["num_bins"]

    def step(env, state):
        x = env[a]
        keep = (x >= 0) & (x < nb)
        if m is not None:
            keep &= env[m]
        env[r] = torch.bincount(x[keep].long(), minlength=nb).to(torch.int32)

    return step


# --- matrix multiply ---------------------------------------------------------------------

_FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)


def decode_mx(x: torch.Tensor, fmt: str, axis: int) -> torch.Tensor:
    """MX elements as fp32; e2m1 bytes hold two elements along ``axis``, low nibble first."""
    if fmt != "e2m1":
        return x.float()
    u = x.to(torch.int32)
    lo, hi = u & 0xF, (u >> 4) & 0xF

    def val(n):
        mag = _FP4[n & 7]
        return torch.where(n >= 8, -mag, mag)

    pair = torch.stack([val(lo), val(hi)], dim=axis + 1)
    shape = list(x.shape)
    shape[axis] *= 2
    return pair.reshape(shape)


def decode_e8m0(s: torch.Tensor) -> torch.Tensor:
    e = s.to(torch.int32)
    v = torch.pow(2.0, (e - 127).to(torch.float32))
    return torch.where(e == 255, torch.full_like(v, float("nan")), v)


@rule("dot")
def _dot(op, S):
    a, b, c = (S[op.operand(n)] for n in ("a", "b", "acc"))
    r = S[op.results[0]]
    is_int = op.operand("a").type.dtype.is_int

    if is_int:

        def step(env, state):
            env[r] = (torch.matmul(env[a].long(), env[b].long()) + env[c].long()).to(torch.int32)

        return step

    def step(env, state):
        env[r] = torch.matmul(env[a].float(), env[b].float()) + env[c]

    return step


@rule("dot_scaled")
def _dot_scaled(op, S):
    a, sa, b, sb, c = (S[op.operand(n)] for n in ("a", "a_scale", "b", "b_scale", "acc"))
    r = S[op.results[0]]
    fa, fb = op.attrs["a_format"], op.attrs["b_format"]

    def step(env, state):
        A = decode_mx(env[a], fa, 1) * decode_e8m0(env[sa]).repeat_interleave(32, dim=1)
        B = decode_mx(env[b], fb, 0) * decode_e8m0(env[sb]).repeat_interleave(32, dim=1).T
        env[r] = torch.matmul(A, B) + env[c]

    return step


# --- memory --------------------------------------------------------------------------------


def _check_offsets(op, flat, offs, mask, state):
    bad = (offs < 0) | (offs >= flat.numel())
    if mask is not None:
        bad &= mask
    if bool(bad.any()):
        sample = offs[bad][:4].tolist()
        _fail(
            op,
            f"out-of-bounds access: offsets {sample} outside the tensor's {flat.numel()} addressable "
            "elements; mask the access (views mask their own bounds unless bounds_check=False)",
            state,
        )


def _raw(flat):
    # fp8 has no CPU indexing kernels: move its bytes as uint8.
    return flat.view(torch.uint8) if flat.element_size() == 1 and flat.is_floating_point() else flat


@rule("load")
def _load(op, S):
    return _load_rule(op, S, None)


@rule("load_at")
def _load_at(op, S):
    return _load_rule(op, S, S[op.operand("base")])


def _load_rule(op, S, base):
    t, o = S[op.operand("tensor")], S[op.operand("offsets")]
    masked = op.operand("mask") is not None
    m = S[op.operand("mask")] if masked else None
    other = S[op.operand("other")] if op.operand("other") is not None else None
    r = S[op.results[0]]
    out_t = tdt(op.results[0].type.dtype)

    def step(env, state):
        flat, offs = env[t], env[o].long()
        if base is not None:
            offs = offs + int(env[base])
        mk = env[m] if masked else None
        _check_offsets(op, flat, offs, mk, state)
        raw = _raw(flat)
        if masked:
            vals = (
                raw[torch.where(mk, offs, 0)]
                if raw.numel()
                else torch.zeros(offs.shape, dtype=raw.dtype)
            )
            if other is None:  # masked-off elements read 0
                oth = torch.zeros((), dtype=raw.dtype)
            else:
                oth = env[other]
                oth = oth.view(raw.dtype) if raw is not flat else oth
            vals = torch.where(mk, vals, oth)
        else:
            vals = raw[offs]
        env[r] = vals.view(out_t) if raw is not flat else vals

    return step


@rule("store")
def _store(op, S):
    t, o, v = (S[op.operand(n)] for n in ("tensor", "offsets", "value"))
    masked = op.operand("mask") is not None
    m = S[op.operand("mask")] if masked else None

    def step(env, state):
        flat, offs, vals = env[t], env[o].long(), env[v]
        mk = env[m] if masked else None
        _check_offsets(op, flat, offs, mk, state)
        raw = _raw(flat)
        vals = vals.view(torch.uint8) if raw is not flat else vals
        vals = vals.expand(offs.shape)
        if masked and not bool(mk.all()):
            raw[offs[mk]] = vals[mk]
        else:
            raw[offs] = vals

    return step


_ATOMIC = {
    "add": lambda old, v: old + v,
    "max": torch.maximum,
    "min": torch.minimum,
    "xchg": lambda old, v: v,
    "and": torch.bitwise_and,
    "or": torch.bitwise_or,
    "xor": torch.bitwise_xor,
}


@rule("atomic_rmw")
def _atomic(op, S):
    t, o, v = (S[op.operand(n)] for n in ("tensor", "offsets", "value"))
    masked = op.operand("mask") is not None
    m = S[op.operand("mask")] if masked else None
    r = S[op.results[0]]
    f = _ATOMIC[op.attrs["kind"]]

    def step(env, state):
        flat, offs, vals = env[t], env[o].long(), env[v].expand(env[o].shape)
        mk = env[m] if masked else torch.ones(offs.shape, dtype=torch.bool)
        _check_offsets(op, flat, offs, mk, state)
        old = torch.zeros(offs.shape, dtype=flat.dtype)
        # Lanes act one after another in row-major order, so repeated addresses see each
        # other's updates: a valid serialization of what the GPU does.
        fo, fv, fm, fold = offs.reshape(-1), vals.reshape(-1), mk.reshape(-1), old.view(-1)
        live = fm.nonzero().flatten()
        li = fo[live]
        if li.unique().numel() == li.numel():
            cur = flat[li]
            fold[live] = cur
            flat[li] = f(cur, fv[live]).to(flat.dtype)
        else:
            for j in live.tolist():
                k = int(fo[j])
                cur = flat[k].clone()
                fold[j] = cur
                flat[k] = f(cur, fv[j]).to(flat.dtype)
        env[r] = old

    return step


@rule("atomic_cas")
def _atomic_cas(op, S):
    t, o, c, v = (S[op.operand(n)] for n in ("tensor", "offsets", "cmp", "value"))
    r = S[op.results[0]]

    def step(env, state):
        flat, offs = env[t], env[o].long()
        _check_offsets(op, flat, offs, None, state)
        cmp, val = env[c].expand(offs.shape).reshape(-1), env[v].expand(offs.shape).reshape(-1)
        fo = offs.reshape(-1)
        old = torch.empty(fo.shape, dtype=flat.dtype)
        for j in range(fo.numel()):
            k = int(fo[j])
            cur = flat[k].clone()
            old[j] = cur
            if bool(cur == cmp[j]):
                flat[k] = val[j]
        env[r] = old.reshape(offs.shape)

    return step


@rule("range_mask")
def _range_mask(op, S):
    s, e = S[op.operand("start")], S[op.operand("extent")]
    r = S[op.results[0]]
    axis, length, shape = op.attrs["axis"], op.attrs["length"], tuple(op.attrs["shape"])
    if axis < 0 or length == 1:

        def step(env, state):
            env[r] = torch.lt(env[s], env[e]).expand(shape)

        return step
    view = [1] * len(shape)
    view[axis] = length
    ar = torch.arange(length, dtype=torch.int64).reshape(view)

    def step(env, state):
        env[r] = torch.lt(ar + env[s], env[e]).expand(shape)

    return step
