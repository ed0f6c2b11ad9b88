"""Score and mask modifications, written in FlyDSL and inlined into the kernels when traced.

A mod is a plain Python function over FlyDSL tiles (flex_attention's shape of a mod):

    def rel_bias(score, b, h, q_idx, kv_idx, bias):       # bias: a tensor given at launch
        return score + bias[h].load()...                     # any FlyDSL ops

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx >= 0) & (q_idx - kv_idx < 128)

``score`` is the fp32 logit tile after the softmax scale (natural units), ``b`` the batch index
(a scalar), ``h`` the query head, ``q_idx`` and ``kv_idx`` the positions inside the sequence;
``h``/``q_idx``/``kv_idx`` are int32 tiles (or scalars) that broadcast against ``score``: write
mods elementwise, the kernel picks the orientation (the dK/dV kernel works keys x queries).
Extra tensors (``mod_tensors=`` at the API, at most ``MAX_MOD_TENSORS``) arrive as trailing
``TensorRef`` arguments: a mod gets as many of them, from the first, as it declares extra
positional parameters (all of them with ``*args``); ``t.gather(b, h, ...)`` reads them at
broadcast index tiles (elementwise, out-of-range indices read 0).

``ScoreMod(fn, grad=None)``: ``grad(score, out, grad_out, b, h, q_idx, kv_idx, *tensors)``
returns the gradient w.r.t. ``score`` given the gradient w.r.t. the mod's output ``out``
(the backward needs it unless ``fn`` is additive: ``additive=True`` passes ``grad_out``
through). ``MaskMod(fn)`` returns a bool tile (True = visible). Both are compile-time values:
two wrappers of the same functions share one compile; the disk cache key covers the functions'
source and the values they close over (``cache_key``).

The built-in mods below express causal, sliding window, ALiBi and softcap as mods; the tests
check that they agree with the kernels' native flags.
"""

from __future__ import annotations

from collections.abc import Callable

import flydsl_core as fly

#: extra tensor slots the kernels have for mods
MAX_MOD_TENSORS = 4


def _arity(fn, fixed: int) -> int | None:
    """How many mod tensors ``fn`` takes after its ``fixed`` index arguments (None: all, for
    ``*args``): a mod receives only the trailing tensors it declares."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return max(0, len(pos) - fixed)


def _take(tensors, n):
    ts = [t for t in tensors[:MAX_MOD_TENSORS] if t is not None]
    return ts if n is None else ts[:n]


def _fingerprint(fn):
    if fn is None:
        return None
    from flydsl_core.cache import source_fingerprint

    return source_fingerprint(fn)


class ScoreMod:
    """A FlyDSL score modification (see the module doc)."""

    def __init__(
        self, fn: Callable, grad: Callable | None = None, *, additive: bool = False, name=None
    ):
        if not callable(fn):
            raise TypeError(f"ScoreMod needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.grad = grad
        self.additive = additive
        self.name = name or getattr(fn, "__name__", "score_mod")
        self._n = _arity(fn, 5)
        self._ng = _arity(grad, 7) if grad is not None else None

    @property
    def differentiable(self) -> bool:
        return self.additive or self.grad is not None

    def apply(self, score, b, h, q_idx, kv_idx, tensors):
        out = self.fn(score, b, h, q_idx, kv_idx, *_take(tensors, self._n))
        return fly.broadcast_to(fly.cast(out, fly.fp32), score.shape)

    def backward(self, score, out, grad_out, b, h, q_idx, kv_idx, tensors):
        if self.grad is None:
            return grad_out  # additive: d(score + c)/d score = 1
        g = self.grad(score, out, grad_out, b, h, q_idx, kv_idx, *_take(tensors, self._ng))
        return fly.broadcast_to(fly.cast(g, fly.fp32), score.shape)

    def __eq__(self, other):
        return isinstance(other, ScoreMod) and (self.fn, self.grad, self.additive) == (
            other.fn,
            other.grad,
            other.additive,
        )

    def __hash__(self):
        return hash((ScoreMod, self.fn, self.grad, self.additive))

    def cache_key(self):
        return {
            "score_mod": _fingerprint(self.fn),
            "grad": _fingerprint(self.grad),
            "additive": self.additive,
        }

    def __repr__(self):
        return f"ScoreMod({self.name})"


class MaskMod:
    """A FlyDSL mask modification: ``fn(b, h, q_idx, kv_idx, *tensors)`` -> bool tile."""

    def __init__(self, fn: Callable, *, name=None):
        if not callable(fn):
            raise TypeError(f"MaskMod needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "mask_mod")
        self._n = _arity(fn, 4)

    def apply(self, b, h, q_idx, kv_idx, tensors):
        m = self.fn(b, h, q_idx, kv_idx, *_take(tensors, self._n))
        m = fly.cast(m, fly.bool_) if m.dtype != fly.bool_ else m
        shape = tuple(max(x, y) for x, y in zip(q_idx.shape, kv_idx.shape))
        return fly.broadcast_to(m, shape)

    def __eq__(self, other):
        return isinstance(other, MaskMod) and self.fn == other.fn

    def __hash__(self):
        return hash((MaskMod, self.fn))

    def cache_key(self):
        return {"mask_mod": _fingerprint(self.fn)}

    def __repr__(self):
        return f"MaskMod({self.name})"


def as_score_mod(m) -> ScoreMod | None:
    if m is None or isinstance(m, ScoreMod):
        return m
    if callable(m):
        return ScoreMod(m)
    raise TypeError(f"score_mod must be a ScoreMod or a function, got {type(m).__name__}")


def as_mask_mod(m) -> MaskMod | None:
    if m is None or isinstance(m, MaskMod):
        return m
    if callable(m):
        return MaskMod(m)
    raise TypeError(f"mask_mod must be a MaskMod or a function, got {type(m).__name__}")


# -- the native features as mods (the tests check both forms agree) --------------------------------
#
# ``q_idx`` / ``kv_idx`` are positions inside the sequence; with seqlen_q != seqlen_k the
# flash-attn alignment is bottom-right, so these mods take the offset ``sk - sq`` as a
# (closed-over) Python int, as a flex_attention mod would.


def causal_mask(offset: int = 0) -> MaskMod:
    """flash-attn's causal mask, bottom-right aligned (``offset = seqlen_k - seqlen_q``)."""

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return MaskMod(causal)


def window_mask(left: int, right: int, offset: int = 0) -> MaskMod:
    """flash-attn's ``window_size=(left, right)`` (-1: unbounded on that side)."""

    def window(b, h, q_idx, kv_idx):
        m = (kv_idx >= 0) & (q_idx >= 0)
        if right >= 0:
            m = m & (kv_idx <= q_idx + (offset + right))
        if left >= 0:
            m = m & (kv_idx >= q_idx + (offset - left))
        return m

    return MaskMod(window)


def alibi_mod(offset: int = 0) -> ScoreMod:
    """ALiBi with per-head slopes from the first mod tensor (fp32, ``(batch, nheads)``):
    ``score - slope[b, h] * |q_idx + offset - kv_idx|``."""

    def alibi(score, b, h, q_idx, kv_idx, slopes, *rest):
        slope = slopes.gather(b, h).load().to(fly.fp32)
        return score - slope * fly.abs(q_idx + offset - kv_idx).to(fly.fp32)

    return ScoreMod(alibi, additive=True)


def softcap_mod(cap: float) -> ScoreMod:
    """Gemma-2 / Grok softcap ``cap * tanh(score / cap)``, with its gradient."""
    inv = 1.0 / float(cap)
    cap = float(cap)

    def softcap(score, b, h, q_idx, kv_idx, *rest):
        return fly.tanh(score * inv) * cap

    def softcap_grad(score, out, grad_out, b, h, q_idx, kv_idx, *rest):
        t = out * inv
        return grad_out * (1.0 - t * t)

    return ScoreMod(softcap, softcap_grad)


# Torch versions of the same mods for the reference (elementwise over broadcast index tensors).


def torch_causal(offset: int = 0):
    return lambda b, h, q, kv: kv <= q + offset


def torch_window(left: int, right: int, offset: int = 0):
    def f(b, h, q, kv):
        import torch

        m = torch.ones_like(q + kv, dtype=torch.bool)
        if right >= 0:
            m = m & (kv <= q + offset + right)
        if left >= 0:
            m = m & (kv >= q + offset - left)
        return m

    return f


def torch_alibi(slopes, offset: int = 0):
    return lambda s, b, h, q, kv: s - slopes[b, h].to(s.dtype) * (q + offset - kv).abs().to(s.dtype)


def torch_softcap(cap: float):
    import torch

    return lambda s, b, h, q, kv: torch.tanh(s / cap) * cap


__all__ = [
    "MAX_MOD_TENSORS",
    "MaskMod",
    "ScoreMod",
    "alibi_mod",
    "as_mask_mod",
    "as_score_mod",
    "causal_mask",
    "softcap_mod",
    "torch_alibi",
    "torch_causal",
    "torch_softcap",
    "torch_window",
    "window_mask",
]
