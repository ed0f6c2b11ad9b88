"""The translated mods of a flex_attention call and their caches: the one owner of both.

``capture(score_mod, mask_mod)`` (eager: Python callables) and ``from_graphs(...)`` (torch.compile:
the HOP's subgraphs) give a ``Mods``: the score and mask ``Program``s over one numbering of the
captured tensors. Everything else is derived from those programs, never re-captured:

* ``joint(score, sites)``: the gradient program, the score program followed by the gradient of
  its output w.r.t. the score and w.r.t. each gradient site (a ``gather`` of a captured tensor
  that requires grad), all taken by torch's autograd on ``program.evaluate`` and traced, so the
  formulas are torch's own;
* ``kernel_mods(...)``: the FlyDSL ``ScoreMod`` / ``MaskMod`` / ``GradSite`` objects the kernels
  take (one per program and layout, so a repeated call reuses the compiled kernels);
* ``layout`` / ``pack``: how the captured tensors reach the kernels' four tensor slots (as they
  are when they fit, else packed per dtype into flat buffers: any number of tensors).

Captures are cached per mod function and the objects its closure cells and global names hold
(held by the entry, so their ids stay unique); captured tensors are read live at each call.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import torch

from . import translate as tr
from .program import INDEX_ARGS, Program, evaluate
from .translate import MASK_ARGS, SCORE_ARGS, Unsupported

#: tensor slots the attention kernels have for mods (flydsl_kernels.attention.mods)
KERNEL_SLOTS = 4
_CACHE_SIZE = 128


@dataclass(frozen=True)
class Mods:
    """The programs of one call's mods (None: the identity score mod / no mask) and the live
    captured tensors by slot (None entries under torch.compile, where they are graph inputs)."""

    score: Program | None
    mask: Program | None
    tensors: tuple = ()

    @property
    def metas(self) -> tuple:
        p = self.score or self.mask
        return p.tensors if p is not None else ()

    def grad_slots(self) -> tuple[int, ...]:
        """Slots of live captured tensors that require grad (read by the score mod)."""
        return tuple(
            i
            for i, t in enumerate(self.tensors)
            if t is not None and t.requires_grad and self.score is not None
        )

    def sites(self, slots) -> tuple[int, ...]:
        """The score program's gathers of ``slots`` (the gradient sites), in program order."""
        if self.score is None:
            return ()
        want = set(slots)
        return tuple(i for i in self.score.gathers() if self.score.instrs[i][2][0][1] in want)


# -- eager capture ----------------------------------------------------------------------------------

_CACHE: OrderedDict = OrderedDict()


def _unwrap(fn):
    inner = getattr(fn, "fn", None)
    return inner if type(fn).__name__ == "_MaskModWrapper" and callable(inner) else fn


def _key(fn):
    """``(key, held)`` for ``fn``'s capture, or ``(None, ())`` (not cached)."""
    if fn is None:
        return ("none",), ()
    code = getattr(fn, "__code__", None)
    if code is None:
        return None, ()
    cells = tuple(c.cell_contents for c in (fn.__closure__ or ()))
    g = fn.__globals__
    globs = tuple(g.get(n) for n in code.co_names)
    defaults = fn.__defaults__ or ()
    held = (fn, cells, globs, defaults)
    return (id(fn), tuple(map(id, cells)), tuple(map(id, globs)), tuple(map(id, defaults))), held


def _is_identity(fn) -> bool:
    from torch.nn.attention.flex_attention import _identity

    return fn is None or fn is _identity


def _is_noop(fn) -> bool:
    from torch.nn.attention.flex_attention import noop_mask

    return fn is None or _unwrap(fn) is noop_mask


def capture(score_mod, mask_mod) -> Mods:
    """The ``Mods`` of two Python mods (cached); raises ``Unsupported``, or torch's error for
    what torch refuses (a mask mod that does not return a bool tensor, an index out of range at
    the example point)."""
    score_mod = None if _is_identity(score_mod) else score_mod
    mask_mod = None if _is_noop(mask_mod) else _unwrap(mask_mod)
    ks, hs = _key(score_mod)
    km, hm = _key(mask_mod)
    key = (ks, km) if ks is not None and km is not None else None
    hit = _CACHE.get(key) if key is not None else None
    if hit is not None:
        _CACHE.move_to_end(key)
        result = hit[1]
    else:
        try:
            result = _capture(score_mod, mask_mod)
        except Unsupported as e:
            result = e
        if key is not None:
            _CACHE[key] = ((hs, hm), result)
            if len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    if isinstance(result, Exception):
        raise result
    return result


def _check_output(gm, what):
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if isinstance(out, (tuple, list)):
        out = out[0] if len(out) == 1 else out
    if not isinstance(out, torch.fx.Node):
        # torch: vmap(...) "must only return Tensors"
        raise ValueError(
            f"flex_attention: the {what} must only return Tensors, got type {type(out)} "
            f"(torch's vmap of the mod refuses it too)"
        )
    return out


def _capture(score_mod, mask_mod) -> Mods:
    slots = tr.Slots()
    score = mask = None
    if score_mod is not None:
        gm = tr.trace(score_mod, SCORE_ARGS)
        _check_output(gm, "score_mod")
        score = tr.translate(gm, SCORE_ARGS, slots)
    if mask_mod is not None:
        gm = tr.trace(mask_mod, MASK_ARGS)
        out = _check_output(gm, "mask_mod")
        _, dtype = tr.node_meta(out)
        if dtype != torch.bool:
            raise RuntimeError(
                f"where expected condition to be a boolean tensor, but got a tensor with dtype "
                f"{_scalar_type(dtype)} (the mask_mod returns {dtype}; flex_attention needs a "
                "bool tensor)"
            )
        mask = tr.translate(gm, MASK_ARGS, slots)
        if mask.is_true():
            mask = None
    metas = tuple(slots.meta)
    if score is not None:
        score = Program(score.inputs, score.instrs, score.outputs, metas)
        if score.is_identity():
            score = None
    if mask is not None:
        mask = Program(mask.inputs, mask.instrs, mask.outputs, metas)
    return Mods(score, mask, tuple(slots.tensors))


def _scalar_type(dtype) -> str:
    """c10's name of a dtype, as torch's errors print it."""
    return {
        torch.int32: "Int",
        torch.int64: "Long",
        torch.float32: "Float",
        torch.float64: "Double",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.int8: "Char",
        torch.uint8: "Byte",
        torch.int16: "Short",
        torch.bool: "Bool",
    }.get(dtype, str(dtype))


# -- graphs from torch.compile ------------------------------------------------------------------------


def from_graphs(score_gm, mask_gm, score_bufs, mask_bufs) -> Mods:
    """The ``Mods`` of a flex_attention HOP's subgraphs; ``*_bufs``: ``(shape, dtype)`` of the
    captured buffers each takes after its arguments. 16-bit float values compute in fp32 (the
    subgraphs see the score in the inputs' dtype; torch's kernels and ours hold fp32 scores)."""
    slots = tr.Slots()
    sb = [slots.add(s, d) for s, d in score_bufs]
    mb = [slots.add(s, d) for s, d in mask_bufs]
    score = mask = None
    if score_gm is not None:
        score = tr.translate(score_gm, SCORE_ARGS, slots, sb, upcast=True)
    if mask_gm is not None:
        mask = tr.translate(mask_gm, MASK_ARGS, slots, mb, upcast=True)
    metas = tuple(slots.meta)
    if score is not None:
        score = Program(score.inputs, score.instrs, score.outputs, metas)
        if score.is_identity():
            score = None
    if mask is not None:
        mask = Program(mask.inputs, mask.instrs, mask.outputs, metas)
        if mask.is_true():
            mask = None
    return Mods(score, mask, (None,) * len(metas))


# -- derived programs -----------------------------------------------------------------------------------

_JOINTS: OrderedDict = OrderedDict()


def joint(score: Program, sites: tuple[int, ...] = ()) -> Program:
    """The score mod's gradient program: inputs ``score``, indices, ``grad_out``; outputs the
    gradient w.r.t. the score, then w.r.t. the value each site in ``sites`` gathers (the
    gradient of the mod's output times ``grad_out``). The instructions are the score program's
    followed by the derivative's (which read the sites' gathered values)."""
    key = (score, tuple(sites))
    hit = _JOINTS.get(key)
    if hit is not None:
        _JOINTS.move_to_end(key)
        return hit
    prog = _derive(score, tuple(sites))
    _JOINTS[key] = prog
    if len(_JOINTS) > _CACHE_SIZE:
        _JOINTS.popitem(last=False)
    return prog


def _derive(score: Program, sites) -> Program:
    from torch.fx.experimental.proxy_tensor import make_fx

    metas = score.tensors
    n_sites = len(sites)
    site_dtypes = [score.instrs[i][1] for i in sites]
    for d in site_dtypes:
        if d in ("int32", "bool"):
            raise Unsupported("a gradient through an integer value of a captured tensor")

    def joint_fn(s, b, h, q, kv, grad_out, *rest):
        gs, bufs = rest[:n_sites], rest[n_sites:]
        with torch.enable_grad():
            s = s.detach().requires_grad_(True)
            gs = [g.detach().requires_grad_(True) for g in gs]
            env = {"score": s, "b": b, "h": h, "q_idx": q, "kv_idx": kv}
            (out,) = evaluate(score, env, bufs, replace=dict(zip(sites, gs)))
            wrt = [s, *gs]
            if not out.requires_grad:
                return [torch.zeros_like(grad_out) for _ in wrt]
            grads = torch.autograd.grad(out, wrt, grad_out, allow_unused=True)
        return [torch.zeros_like(grad_out) if g is None else g.to(torch.float32) for g in grads]

    ex = [
        *tr.examples((*SCORE_ARGS, "grad_out")),
        *[torch.zeros((), dtype=torch.float32) for _ in sites],
        *[torch.zeros(shape, dtype=getattr(torch, d)) for shape, d in metas],
    ]
    if torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutogradCPU):
        # below autograd (a custom op's body): the trace would record no gradient
        raise Unsupported("the gradient program is derived above autograd, not in an op body")
    try:
        gm = make_fx(joint_fn, tracing_mode="fake")(*ex)
    except Exception as e:
        raise Unsupported(
            f"the score mod's gradient could not be traced ({type(e).__name__})"
        ) from e
    names = (*SCORE_ARGS, "grad_out", *[f"site{k}" for k in range(n_sites)])
    slots = tr.Slots()
    for shape, d in metas:
        slots.add(shape, getattr(torch, d))
    dtypes = {
        n: "fp32" if n in ("score", "grad_out") or n.startswith("site") else "int32" for n in names
    }
    part = tr.translate(gm, names, slots, list(range(len(metas))), upcast=True, dtypes=dtypes)
    # the derivative follows the score program; its site inputs read the sites' gathers
    base = len(score.instrs)
    sub = {("arg", f"site{k}"): ("v", i) for k, i in enumerate(sites)}

    def re(o):
        if o[0] == "v":
            return ("v", o[1] + base)
        return sub.get(o, o)

    instrs = list(score.instrs)
    for op, d, ops, cd in part.instrs:
        instrs.append((op, d, tuple(o if o[0] == "t" else re(o) for o in ops), cd))
    outs = tuple(re(o) for o in part.outputs)
    return Program((*SCORE_ARGS, "grad_out"), tuple(instrs), outs, metas)


def is_additive(j: Program) -> bool:
    """The gradient w.r.t. the score is ``grad_out`` itself."""
    o = j.outputs[0]
    while o[0] == "v" and j.instrs[o[1]][0] == "copy" and j.instrs[o[1]][1] == "fp32":
        o = j.instrs[o[1]][2][0]
    return o == ("arg", "grad_out")


def site_deps(score: Program, site: int) -> frozenset:
    """The index arguments a site's index depends on (raises when it depends on the score)."""
    deps = score.deps()
    d = frozenset()
    for o in score.instrs[site][2][1:]:
        d |= score.operand_deps(o, deps)
    # a gather of another tensor inside the index: its own index deps are already in ``d``
    d = frozenset(x for x in d if not x.startswith("t"))
    if "score" in d:
        raise Unsupported("a captured tensor indexed by a value computed from the score")
    return d


def with_block_state(mask: Program | None, metas: tuple, state_meta, block) -> Program:
    """The mask program of a re-blocked BlockMask: visible where the original block state
    (``state[b, h, q // BQ, kv // BKV]``: 0 skipped, 1 partial, 2 full) is full, or partial
    and ``mask`` holds. ``state_meta``: the state tensor's ``(shape, dtype)`` (the next slot)."""
    from .program import const

    bq, bkv = block
    slot = len(metas)
    metas = (*metas, state_meta)
    instrs = list(mask.instrs) if mask is not None else []
    out = mask.output if mask is not None else ("c", "b", "True")

    def emit(*ins):
        instrs.append(ins)
        return ("v", len(instrs) - 1)

    qb = emit("floordiv", "int32", (("arg", "q_idx"), const(bq)), "int32")
    kb = emit("floordiv", "int32", (("arg", "kv_idx"), const(bkv)), "int32")
    st = emit("gather", "int32", (("t", slot), ("arg", "b"), ("arg", "h"), qb, kb), "int32")
    full = emit("eq", "bool", (st, const(2)), "int32")
    part = emit("eq", "bool", (st, const(1)), "int32")
    pm = emit("and", "bool", (part, out), "bool")
    vis = emit("or", "bool", (full, pm), "bool")
    return Program(MASK_ARGS, tuple(instrs), (vis,), metas)


# -- kernel-side objects ------------------------------------------------------------------------------


def layout(metas) -> tuple:
    """Per slot ``(kernel tensor, offset, strides)``: the slots as they are when they fit the
    kernels' tensor slots (strides None), else packed per dtype into flat buffers."""
    n = len(metas)
    if n <= KERNEL_SLOTS:
        return tuple((i, 0, None) for i in range(n))
    groups: list[str] = []
    for _shape, d in metas:
        g = _pack_dtype(d)
        if g not in groups:
            groups.append(g)
    if len(groups) > KERNEL_SLOTS:
        raise Unsupported(f"captured tensors of {len(groups)} kinds (at most {KERNEL_SLOTS})")
    offsets = dict.fromkeys(groups, 0)
    out = []
    for shape, d in metas:
        g = _pack_dtype(d)
        strides, s = [], 1
        for size in reversed(shape):
            strides.append(s)
            s *= size
        out.append((groups.index(g), offsets[g], tuple(reversed(strides))))
        offsets[g] += max(math.prod(shape), 1)
    return tuple(out)


def _pack_dtype(d: str) -> str:
    if d in ("float32", "float64", "bfloat16", "float16"):
        return d if d != "float64" else "float32"
    if d == "bool":
        return "bool"
    return "int64" if d == "int64" else "int32"


def pack(tensors, lay, device) -> tuple:
    """The kernel's mod tensors for live captured ``tensors`` under layout ``lay``."""
    if all(s is None for _, _, s in lay):
        out = []
        for t in tensors:
            if t.device != device:
                raise Unsupported(f"a captured tensor on {t.device}, the inputs are on {device}")
            t = t.detach()
            out.append(t.reshape(1) if t.dim() == 0 else t)
        return tuple(out)
    n = 1 + max(a for a, _, _ in lay)
    parts: list[list] = [[] for _ in range(n)]
    for t, (a, _off, _s) in zip(tensors, lay):
        if t.device != device:
            raise Unsupported(f"a captured tensor on {t.device}, the inputs are on {device}")
        parts[a].append(t.detach().reshape(-1))
    out = []
    for ps in parts:
        dt = ps[0].dtype
        if dt == torch.float64:
            dt = torch.float32
        out.append(torch.cat([p.to(dt) for p in ps]))
    return tuple(out)


@dataclass(frozen=True)
class KernelMods:
    score_mod: object = None
    mask_mod: object = None
    sites: tuple = ()  # flydsl_kernels GradSite per site


_KMODS: dict = {}


def kernel_mods(
    score: Program | None, grad: Program | None, mask: Program | None, lay, sites=(), site_deps_=()
) -> KernelMods:
    """The FlyDSL mod objects for these programs and layout (one object per key: one compile)."""
    key = (score, grad, mask, lay, tuple(sites), tuple(site_deps_))
    hit = _KMODS.get(key)
    if hit is not None:
        return hit
    from flydsl_kernels.attention import MaskMod, ScoreMod
    from flydsl_kernels.attention.mod_grads import GradSite

    from .program import kernel_fn

    sm = mm = None
    if score is not None:
        fn = kernel_fn(score, lay)
        if grad is None:
            sm = ScoreMod(fn, name="flex_score_mod")
        elif is_additive(grad):
            sm = ScoreMod(fn, additive=True, name="flex_score_mod")
        else:
            g = kernel_fn(grad, lay, 0, names=("score", "out", "grad_out", *INDEX_ARGS))
            sm = ScoreMod(fn, g, name="flex_score_mod")
    if mask is not None:
        mm = MaskMod(kernel_fn(mask, lay), name="flex_mask_mod")
    gs = []
    for k, deps in enumerate(site_deps_):
        fn = kernel_fn(grad, lay, k + 1, names=("score", "out", "grad_out", *INDEX_ARGS))
        gs.append(GradSite(fn, tuple(a in deps for a in INDEX_ARGS), name=f"flex_site{k}"))
    km = KernelMods(sm, mm, tuple(gs))
    if len(_KMODS) > 4 * _CACHE_SIZE:
        _KMODS.clear()
    _KMODS[key] = km
    return km
