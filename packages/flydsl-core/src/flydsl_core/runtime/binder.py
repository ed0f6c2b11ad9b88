"""The launch fast path: a per-kernel function computing a call's exact cache key.

A cache hit must cost a few microseconds of Python, so the key function is
generated for the kernel's own signature: one expression per parameter, no
loops, no type dispatch where annotations say what an argument is.
Tensors contribute dtype, shape, strides and pointer alignment (the first
one also its device, which picks the backend); ints the facts they
specialize on; constexprs their value. Equal keys imply equal
specializations, so the key maps straight to a compiled kernel.

``generic_key`` is the plain-Python equivalent, used when code generation
is turned off (``FLYDSL_GENERIC_BINDER=1``) and for debugging.
"""

from __future__ import annotations

from .. import settings
from .spec import is_tensor_annotation, typed

_MISSING = object()


def _tensor_expr(n: str, first: bool) -> str:
    dev = f", {n}.device" if first else ""
    return f"({n}.dtype, {n}.shape, {n}.stride(), {n}.data_ptr() & 15{dev})"


def _int_expr(n: str) -> str:
    return f"({n} == 1, {n} % 16 == 0, -2147483648 <= {n} < 2147483648)"


def _any_expr(n: str) -> str:
    """An unannotated parameter: ``_generic_part``'s value, with its common cases (None, an
    exact ``torch.Tensor``, int, float) inline. A kernel with 30 unannotated parameters
    (attention's) spent more time in the calls to ``_generic_part`` than in the rest of the
    key; anything else still goes through it."""
    return (
        f"(_NONE if {n} is None else "
        f"({n}.dtype, {n}.shape, {n}.stride(), {n}.data_ptr() & 15, {n}.device) "
        f"if {n}.__class__ is _Tensor else {_int_expr(n)} if {n}.__class__ is int else "
        f"0 if {n}.__class__ is float else _generic({n}))"
    )


def generic_key(kernel, args, kwargs):
    """The same key as the generated function, computed by a loop (slower)."""
    key = []
    for i, a in enumerate(args):
        t = type(a)
        if i in kernel._constexpr_pos:
            key.append(a if type(a) is int else typed(a))
        elif t is int:
            key.append((a == 1, a % 16 == 0, -2147483648 <= a < 2147483648))
        elif t is float:
            key.append(float)
        elif hasattr(a, "data_ptr"):
            key.append((a.dtype, a.shape, a.stride(), a.data_ptr() & 15, a.device))
        else:
            key.append((t, a))
    if kwargs:
        key.append(tuple(sorted((k, typed(v)) for k, v in kwargs.items())))
    return tuple(key)


def make_key_fn(kernel):
    """A function ``key(*args, **kwargs)`` for this kernel, or ``generic_key`` bound to it."""
    if settings.get("FLYDSL_GENERIC_BINDER"):
        return lambda *a, **k: generic_key(kernel, a, k)
    params = list(kernel.signature.parameters.values())
    if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        return lambda *a, **k: generic_key(kernel, a, k)
    env = {"_MISSING": _MISSING, "_generic": _generic_part, "_typed": typed, "_NONE": _NONE}
    env["_Tensor"] = _tensor_class()
    sig, parts = [], []
    first_tensor = True
    for p in params:
        n = p.name
        sig.append(f"{n}=_MISSING")
        ann = p.annotation
        if p.name in kernel.constexpr_params:
            # 2, 2.0 and True are equal but trace differently; a plain int skips the call
            parts.append(f"({n} if {n}.__class__ is int else _typed({n}))")
        elif is_tensor_annotation(ann):
            parts.append(_tensor_expr(n, first_tensor))
            first_tensor = False
        elif ann is int or ann == "int":
            parts.append(_int_expr(n))
        elif ann is float or ann == "float":
            parts.append("0")
        else:
            parts.append(_any_expr(n))
    # a kernel may take no parameters: every item ends in its own comma
    src = (
        f"def key({''.join(s + ', ' for s in sig)}**_kw):\n"
        f"    return ({''.join(p + ', ' for p in parts)}tuple(_kw.items()) if _kw else None,)\n"
    )
    exec(compile(src, f"<flydsl binder {kernel.name}>", "exec"), env)
    fn = env["key"]
    fn.__flydsl_source__ = src
    return fn


#: ``_generic_part(None)``
_NONE = (type(None), None)


def _tensor_class():
    """``torch.Tensor`` where torch is importable (the inline test of ``_any_expr``), else a
    class no argument has (every argument then takes ``_generic_part``)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch backs the core's CPU backend
        return type("_NoTensor", (), {})
    return torch.Tensor


def _generic_part(a):
    t = type(a)
    if a is _MISSING:
        return _MISSING
    if t is int:
        return (a == 1, a % 16 == 0, -2147483648 <= a < 2147483648)
    if t is float:
        return 0
    if hasattr(a, "data_ptr"):
        return (a.dtype, a.shape, a.stride(), a.data_ptr() & 15, a.device)
    hash(a)  # unhashable arguments take the slow path (TypeError)
    return (t, a)
