"""``torch_flydsl.flex_attention``: torch's ``flex_attention`` on the FlyDSL attention kernels.

Each call either runs ``flydsl_kernels.attention.flash_attn_func`` with the mods translated
into FlyDSL (``_fx``, ``_program``) and the ``BlockMask`` as its block-sparse lists, or, for
anything outside that, torch's own ``flex_attention`` with the reason counted under
``torch_flydsl.stats()["flex_attention"]`` and logged (INFO). Under dynamo tracing the call is
torch's, so a compiled graph holds torch's flex_attention HOP (no graph break), which
``backend="flydsl"`` rewrites.

Checks, in order: subclass, arch (the device must run FlyDSL: ``torch_flydsl.eligibility``,
an allowed GPU target or the CPU test backend), dtype (bf16 / fp16, one
dtype), params (4-D, head dims <= 256, batch sizes equal, GQA as torch allows it, no
``max_scores``), empty, block_mask (its lengths are the call's, block sizes multiples of 16,
transposed lists present when a gradient is needed), grad (an LSE output under autograd, or a
captured tensor that requires grad: torch computes those gradients, our kernels do not), mod
(``mod: <why>``: the translation's reason).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict

import torch

from ..eligibility import PLAIN as _PLAIN
from ..eligibility import device_reason as _device_reason
from ..eligibility import target as _target
from ..stats import get as _stat
from . import _fx, _program

log = logging.getLogger("torch_flydsl")

STAT = "flex_attention"
_DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256


def _torch_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


# -- mod capture, cached per callable ----------------------------------------------------------

_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 128


def _unwrap(fn):
    inner = getattr(fn, "fn", None)
    return inner if type(fn).__name__ == "_MaskModWrapper" and callable(inner) else fn


def _key(fn, kind):
    """A cache key for ``fn``'s capture, or None (not cached): the function, and the objects
    its closure cells and global names hold (held by the entry, so their ids stay unique).
    Tensors read by the mod are passed live at each call; rebinding a name misses."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None, ()
    cells = tuple(c.cell_contents for c in (fn.__closure__ or ()))
    g = fn.__globals__
    globs = tuple(g.get(n) for n in code.co_names)
    held = (fn, cells, globs)
    return (kind, id(fn), tuple(map(id, cells)), tuple(map(id, globs))), held


def _captured(fn, kind):
    """``(program, tensors, grad_tensors)`` for ``fn`` with its own slot numbering; raises
    ``_fx.Unsupported`` (cached too)."""
    key, held = _key(fn, kind)
    hit = _CACHE.get(key) if key is not None else None
    if hit is not None:
        _CACHE.move_to_end(key)
        result = hit[1]
    else:
        slots = _fx.Slots()
        try:
            prog, grad_tensors = _fx.capture(fn, kind, slots)
            result = (prog, tuple(slots.tensors), tuple(grad_tensors))
        except _fx.Unsupported as e:
            result = e
        if key is not None:
            _CACHE[key] = (held, result)
            if len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
    if isinstance(result, Exception):
        raise result
    return result


def _renumber(prog, mapping):
    def op(o):
        return ("t", mapping[o[1]], o[2]) if o[0] == "t" else o

    return tuple((i[0], i[1], tuple(op(o) for o in i[2]), i[3]) for i in prog)


_MODS: dict = {}  # programs -> ScoreMod / MaskMod (one object per program: one compile)


def _score_mod(prog, gprog):
    key = ("score", prog, gprog.prog if gprog is not None else None,
           gprog is not None and gprog.additive)  # fmt: skip
    m = _MODS.get(key)
    if m is None:
        from flydsl_kernels.attention import ScoreMod

        if gprog is None:
            m = ScoreMod(_program.score_fn(prog), name="flex_score_mod")
        elif gprog.additive:
            m = ScoreMod(_program.score_fn(prog), additive=True, name="flex_score_mod")
        else:
            m = ScoreMod(_program.score_fn(prog), _program.grad_fn(gprog.prog),
                         name="flex_score_mod")  # fmt: skip
        _MODS[key] = m
    return m


def _mask_mod(prog):
    key = ("mask", prog)
    m = _MODS.get(key)
    if m is None:
        from flydsl_kernels.attention import MaskMod

        m = _MODS[key] = MaskMod(_program.mask_fn(prog), name="flex_mask_mod")
    return m


def _kernel_tensor(t, device):
    """A captured tensor as the kernels read it: fp32 for floats, int32 for ints and bools."""
    if t.device != device:
        raise _fx.Unsupported(f"a captured tensor on {t.device}, the inputs are on {device}")
    t = t.detach()
    if t.dtype.is_floating_point:
        return t.float().contiguous()
    if t.dtype == torch.int64 and t.numel():
        lo, hi = t.aminmax()
        if int(lo) < -(1 << 31) or int(hi) >= 1 << 31:
            raise _fx.Unsupported("a captured int64 tensor with values beyond int32")
    return t.to(torch.int32).contiguous()


def translate_mods(score_mod, mask_mod, need_grad: bool, device):
    """``(ScoreMod | None, MaskMod | None, mod_tensors, grad_tensors)`` for torch mods;
    raises ``_fx.Unsupported``. ``score_mod``/``mask_mod`` None (or torch's identity / noop)
    are left out."""
    from torch.nn.attention.flex_attention import _identity, noop_mask

    score_mod = None if score_mod is _identity else score_mod
    mask_mod = None if mask_mod is None or _unwrap(mask_mod) is noop_mask else mask_mod
    tensors: list = []
    grad_tensors: list = []

    def merge(local):
        mapping = {}
        for i, t in enumerate(local):
            j = next((k for k, u in enumerate(tensors) if u is t), None)
            if j is None:
                if len(tensors) >= _fx.MAX_TENSORS:
                    raise _fx.Unsupported(
                        f"the mods read more than {_fx.MAX_TENSORS} captured tensors"
                    )
                tensors.append(t)
                j = len(tensors) - 1
            mapping[i] = j
        return mapping

    sm = mm = None
    if score_mod is not None:
        prog, local, gt = _captured(score_mod, "score")
        grad_tensors += gt
        sp = _renumber(prog.prog, merge(local))
        gp = None
        if need_grad:
            gprog, glocal, _ = _captured(score_mod, "grad")
            gp = _fx.Program(_renumber(gprog.prog, merge(glocal)), additive=gprog.additive)
        sm = _score_mod(sp, gp)
    if mask_mod is not None:
        prog, local, gt = _captured(_unwrap(mask_mod), "mask")
        grad_tensors += gt
        mm = _mask_mod(_renumber(prog.prog, merge(local)))
    mt = tuple(_kernel_tensor(t, device) for t in tensors)
    return sm, mm, mt, grad_tensors


# -- the call ----------------------------------------------------------------------------------


def _block_reason(bm, sq, sk, device, need_grad) -> str | None:
    if bm is None:
        return None
    if tuple(bm.seq_lengths) != (sq, sk):
        return "block_mask: its seq_lengths differ from the inputs' (torch adjusts them)"
    bs = bm.BLOCK_SIZE
    bq, bkv = (bs, bs) if isinstance(bs, int) else bs
    if bq % 16 or bkv % 16 or bq < 16 or bkv < 16:
        return f"block_mask: BLOCK_SIZE {bs} (the kernels take multiples of 16)"
    if bm.kv_num_blocks.device != device:
        return "block_mask: on another device"
    if need_grad and (bm.q_num_blocks is None or bm.q_indices is None):
        return "block_mask: no transposed q_* lists for the backward"
    return None


def _plan(query, key, value, score_mod, block_mask, scale, enable_gqa, want_lse, return_aux):
    """The kernel arguments, or a fallback reason (a string)."""
    for t in (query, key, value):
        if type(t) not in _PLAIN:
            return "subclass"
    r = _device_reason(query)
    if r:
        return r
    if query.dtype not in _DTYPES or not (query.dtype == key.dtype == value.dtype):
        return "dtype"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "params"
    B, H, Sq, D = query.shape
    Bk, Hk, Sk, _ = key.shape
    if (
        Bk != B or value.shape[0] != B or value.shape[1] != Hk or value.shape[2] != Sk
        or key.shape[3] != D or not 0 < D <= MAX_HEAD_DIM or not 0 < value.shape[3] <= MAX_HEAD_DIM
        or Hk == 0 or H % Hk or (Hk != H and not enable_gqa)
        or (return_aux is not None and getattr(return_aux, "max_scores", False))
        or not (query.device == key.device == value.device)
    ):  # fmt: skip
        return "params"
    if query.numel() == 0 or key.numel() == 0:
        return "empty"
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    r = _block_reason(block_mask, Sq, Sk, query.device, need_grad)
    if r:
        return r
    if need_grad and want_lse:
        return "grad: the LSE output under autograd (our LSE has no gradient)"
    mask_mod = block_mask.mask_mod if block_mask is not None else None
    try:
        sm, mm, mt, grad_tensors = translate_mods(score_mod, mask_mod, need_grad, query.device)
    except _fx.Unsupported as e:
        return f"mod: {e}"
    if grad_tensors and torch.is_grad_enabled():
        return "grad: a captured tensor requires grad (" + ", ".join(grad_tensors) + ")"
    return {
        "score_mod": sm,
        "mask_mod": mm,
        "mod_tensors": mt,
        "block_sparse": block_mask,
        "softmax_scale": float(scale) if scale is not None else 1.0 / math.sqrt(D),
    }


def _run(query, key, value, kw):
    from flydsl_kernels.attention import flash_attn_func

    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, target=_target(query), **kw)
    # rows with no visible key: flash-attn's LSE is +inf, torch's flex_attention's -inf
    lse = torch.where(lse == math.inf, -math.inf, lse)
    return out.transpose(1, 2), lse


def flex_attention(
    query,
    key,
    value,
    score_mod=None,
    block_mask=None,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    kernel_options=None,
    *,
    return_aux=None,
):
    """torch's ``flex_attention`` (same signature and results) on FlyDSL kernels where they
    apply, torch's otherwise (see the module doc). ``kernel_options`` tune torch's Triton
    kernels; ours ignore them (they pick their own configs)."""
    args = (query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
            kernel_options)  # fmt: skip
    if torch.compiler.is_compiling():
        return _torch_flex()(*args, return_aux=return_aux)
    want_lse = bool(return_lse or (return_aux is not None and return_aux.lse))
    st = _stat(STAT)
    plan = _plan(query, key, value, score_mod, block_mask, scale, enable_gqa, want_lse,
                 return_aux)  # fmt: skip
    if isinstance(plan, str):
        st.fallback(plan)
        log.info("torch_flydsl.flex_attention: torch's flex_attention (%s)", plan)
        return _torch_flex()(*args, return_aux=return_aux)
    try:
        out, lse = _run(query, key, value, plan)
    except Exception as e:
        log.warning(
            "torch_flydsl.flex_attention: the FlyDSL kernel raised %s: %s; using torch's",
            type(e).__name__, e,
        )  # fmt: skip
        st.fallback("error")
        return _torch_flex()(*args, return_aux=return_aux)
    st.hits += 1
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput

        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=None)
    if return_lse:
        return out, lse
    return out
