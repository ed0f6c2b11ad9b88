"""``grouped_mm``: ``torch._grouped_mm`` (``aten::_grouped_mm``, all four forms) on FlyDSL's
persistent grouped GEMM, in eager mode (transformers' MoE experts call it there) and under
torch.compile.

Predicate order (cheapest first, the gate before the stride and ``offs`` checks): subclass,
arch, dtype (bf16 / fp16, one dtype; ``out_dtype`` None or the input's), params (ranks,
``offs`` 1-D exactly where a 2-D operand needs it, group counts, contraction, ``bias`` (ATen:
not supported)), dynamic (compile: N, K and the group count fixed), empty, gate (op
``grouped_mm`` at (rows per group, N, K)), params (devices, 16-byte strides, ``offs`` int32 and
unit-stride: what ATen itself would reject stays ATen's, so its error is the user's). The
eager wrapper decides subclass / arch / dtype / a closed gate before calling it.
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..spec import Calibration, OpSpec, Overload
from . import _sym
from ._calls import Call
from ._kernels import kernel

DTYPES = supported.GEMM


def aten_strides_ok(t) -> bool:
    """ATen's ``_grouped_mm`` stride rule: one of the last two dims unit-stride, the other
    a multiple of 16 bytes (and at least the extent it steps over)."""
    end = t.dim() - 1
    align = 16 // t.element_size()
    st = [_sym.static(s) for s in t.stride()[-2:]]
    sh = [_sym.hint(s) for s in t.shape[-2:]]
    if st[0] is None or st[1] is None:
        return False
    if st[0] == 1 and st[1] >= max(1, sh[0]):
        return st[1] % align == 0
    if st[1] == 1 and st[0] >= max(1, sh[1]):
        return st[0] % align == 0
    return end < 1


def _offs_ok(ctx, offs) -> bool:
    return (
        ctx.plain(offs)
        and offs.dtype == torch.int32
        and offs.dim() == 1
        and _sym.eq(offs.stride()[0], 1)
    )


def reason(ctx, a, b, offs=None, bias=None, out_dtype=None) -> str | None:
    if not ctx.plain(a) or not ctx.plain(b):
        return "subclass"
    arch = ctx.arch(a)
    if not arch:
        return "arch"
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        return "dtype"
    if out_dtype is not None and out_dtype != a.dtype:
        return "params"  # ATen: the output dtype must match mat_a's
    da, db = a.dim(), b.dim()
    if da not in (2, 3) or db not in (2, 3) or bias is not None:
        return "params"
    sa, sb = a.shape, b.shape
    if (da, db) == (3, 3):
        if offs is not None or not _sym.eq(sa[0], sb[0]):
            return "params"
        groups = sa[0]
    else:
        if offs is None or offs.dim() != 1:
            return "params"
        groups = offs.shape[0]
        if (da, db) == (2, 3) and not _sym.eq(sb[0], groups):
            return "params"
        if (da, db) == (3, 2) and not _sym.eq(sa[0], groups):
            return "params"
    if (da, db) != (2, 2) and not _sym.eq(sa[-1], sb[-2]):
        return "params"
    n, k, g = _sym.fixed(sb[-1]), _sym.fixed(sa[-1]), _sym.fixed(groups)
    if (da, db) == (2, 2):
        k = 1  # ragged K: the contraction is split by offs, any length
    if n is None or k is None or g is None:
        return "dynamic"
    m = sa[-2]
    if _sym.known_zero(m) or n == 0 or g == 0 or _sym.known_zero(sa[-1]):
        return "empty"
    rows = _sym.hint(m) // g if (da, db) == (2, 3) else _sym.hint(m)
    if not ctx.table.allows(arch, "grouped_mm", a.dtype, max(1, rows), n, k):
        return "gate"
    # what ATen itself rejects stays ATen's, so its error is the user's
    if b.device != a.device or not aten_strides_ok(a) or not aten_strides_ok(b):
        return "params"
    if offs is not None and (not _offs_ok(ctx, offs) or offs.device != a.device):
        return "params"
    return None


def impl(ctx, a, b, offs=None, bias=None, out_dtype=None):
    return ctx.run(a, kernel("grouped_mm"), a, b, offs, bias, out_dtype, target=ctx.target_of(a))


def _build(a, b, offs=None, bias=None, out_dtype=None):
    return torch.ops.flydsl.grouped_mm(a, b, offs, bias, out_dtype)


def lower(ctx, a, b, offs=None, bias=None, out_dtype=None):
    return Call("grouped_mm", _build)


# -- calibration: rows per expert at Qwen3-30B-A3B's expert shapes (128 experts) -----------------

ROWS = [(1, 16), (17, 64), (65, 256), (257, 4096)]
EXPERTS, N, K = 128, 768, 2048


def _cases(dtypes, quick):
    for dt in dtypes:
        for m in ROWS[::2] if quick else ROWS:
            yield dt, m, (1, 1 << 20), (1, 1 << 20)


def _make(dt, m, n, k, device):
    per = m[0]
    a = torch.randn(per * EXPERTS, K, device=device).to(dt)
    w = torch.randn(EXPERTS, N, K, device=device).to(dt).transpose(1, 2)
    offs = torch.arange(1, EXPERTS + 1, device=device, dtype=torch.int32) * per
    return (
        lambda: kernel("grouped_mm")(a, w, offs),
        lambda: torch._grouped_mm(a, w, offs),
    )


SPEC = OpSpec(
    name="grouped_mm",
    overloads=(
        Overload("_grouped_mm", reason, impl, lower=lower, gate="grouped_mm", dtypes=DTYPES),
    ),
    calibration=(Calibration("grouped_mm", _cases, _make, dtypes=("bfloat16", "float16")),),
    summary="torch._grouped_mm (MoE experts), eager and torch.compile",
)
