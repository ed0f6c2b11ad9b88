"""``scaled_mm`` / ``scaled_grouped_mm``: MX ``aten::_scaled_mm(_v2)`` and
``aten::_scaled_grouped_mm(_v2)`` on FlyDSL's MX GEMMs (``flydsl_kernels.mx``).

MX here: OCP MX v1.0 elements (``float8_e4m3fn`` / ``float8_e5m2`` mxfp8, ``float4_e2m1fn_x2``
mxfp4, and a8w4 mixes) with ``float8_e8m0fnu`` scales, one per 32 elements along K
(``BlockWise1x32``). Every other recipe (tensorwise, rowwise, 1x128, NVFP4) stays ATen's.

Scale layouts. FlyDSL's kernels read row-major ``(rows, K/32)`` scales. In torch 2.15:

* ``_scaled_mm`` (v1) has no swizzle argument and takes the layout of the device's
  library: ``SWIZZLE_32_4_4`` (128x4 blocks, padded) on CUDA builds, which the CPU meta
  check follows too, and unswizzled row-major (``NO_SWIZZLE``) on ROCm (the comment in
  torch's ``_meta_registrations.py``: gfx950 v1 scales are read unswizzled);
* ``_scaled_mm_v2`` names it (``swizzle_a`` / ``swizzle_b``): ``NO_SWIZZLE`` and
  ``SWIZZLE_32_4_4`` are taken, ``SWIZZLE_32_8`` stays ATen's (``layout``);
* ``_scaled_grouped_mm_v2``: ``NO_SWIZZLE`` only (``(rows, K/32)``, 3-D ``(G, rows, K/32)``);
  ``_scaled_grouped_mm`` (v1) MX scales are per-group blocked layouts: ATen's (``layout``).

A swizzled scale is unswizzled with a gather of views (``unswizzle_32_4_4``), a few KiB of
copy in front of the GEMM (traced into the graph under torch.compile).
``mat2`` is ``(K, N)`` column-major, so ``mat2.t()`` is the NT weight the kernels take.
``out_dtype`` must be bf16, fp16 or fp32 (an fp8 output stays ATen's). ``use_fast_accum``
is a speed hint; FlyDSL always accumulates in fp32. Ragged K (2-D x 2-D grouped) needs a
host check of ``offs`` (multiples of 32), so it runs in eager mode only.
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..spec import Calibration, OpSpec, Overload
from . import _sym
from ._calls import Call
from ._kernels import kernel

E8M0 = torch.float8_e8m0fnu
FORMATS = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.float4_e2m1fn_x2: "e2m1",
}
OUT_DTYPES = supported.MX_OUT
BLOCK = 32
#: ``torch.nn.functional.ScalingType.BlockWise1x32`` and ``SwizzleType`` values
BLOCKWISE_1X32 = 3
NO_SWIZZLE, SWIZZLE_32_4_4 = 0, 1


def _k(a, fmt) -> object:
    return a.shape[-1] * (2 if fmt == "e2m1" else 1)


def swizzled_numel(rows, kb):
    """Elements of a ``SWIZZLE_32_4_4`` scale: rows padded to 128, K blocks to 4."""
    return -(-rows // 128) * 128 * (-(-kb // 4) * 4)


def unswizzle_32_4_4(s, rows, kb):
    """Row-major ``(rows, kb)`` scales from the ``SWIZZLE_32_4_4`` layout (cuBLAS' block-
    scaling factor layout, torchao's ``to_blocked``): 128x4 blocks, each stored as 32 rows
    of ``4 x 4`` (row groups of 32 x the 4 K blocks), block after block along K."""
    rb, cb = -(-rows // 128), -(-kb // 4)
    t = s.reshape(rb, cb, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rb * 128, cb * 4)
    return t[:rows, :kb].contiguous()


def v1_swizzled() -> bool:
    """Whether ``_scaled_mm`` (v1) MX scales are ``SWIZZLE_32_4_4`` here (CUDA and CPU
    builds) rather than row-major (ROCm)."""
    return not torch.version.hip


# -- shared checks ------------------------------------------------------------------------------------


def _formats(ctx, a, b, sa, sb) -> tuple[str | None, tuple | None]:
    """``(reason, (fa, fb))``."""
    for t in (a, b, sa, sb):
        if not ctx.plain(t):
            return "subclass", None
    if sa.dtype != E8M0 or sb.dtype != E8M0:
        return "dtype", None  # not MX: tensorwise / rowwise / NVFP4 stay ATen's
    fa, fb = FORMATS.get(a.dtype), FORMATS.get(b.dtype)
    if fa is None or fb is None:
        return "dtype", None
    if not ctx.arch(a):
        return "arch", None
    if len({a.device, b.device, sa.device, sb.device}) != 1:
        return "params", None
    return None, (fa, fb)


def _scale_ok(s, rows, kb, swizzle) -> bool:
    if swizzle == NO_SWIZZLE:
        return s.dim() == 2 and _sym.eq(s.shape[0], rows) and _sym.fixed(s.shape[1]) == kb
    if swizzle == SWIZZLE_32_4_4:
        return _sym.eq(s.numel(), swizzled_numel(rows, kb)) and s.is_contiguous()
    return False


def _row_major(s, rows, kb, swizzle):
    return unswizzle_32_4_4(s, rows, kb) if swizzle == SWIZZLE_32_4_4 else s


def _mm_reason(ctx, a, b, sa, sb, bias, out_dtype, swz_a, swz_b) -> str | None:
    r, f = _formats(ctx, a, b, sa, sb)
    if r is not None:
        return r
    fa, fb = f
    if a.dim() != 2 or b.dim() != 2:
        return "params"
    if out_dtype not in OUT_DTYPES:
        return "dtype"  # None is a.dtype: an fp8 output
    k = _k(a, fa)
    if not _sym.eq(k, b.shape[0] * (2 if fb == "e2m1" else 1)):
        return "params"
    n, ks = _sym.fixed(b.shape[1]), _sym.fixed(k)
    if n is None or ks is None:
        return "dynamic"
    if ks % BLOCK:
        return "params"
    if swz_a not in (NO_SWIZZLE, SWIZZLE_32_4_4) or swz_b not in (NO_SWIZZLE, SWIZZLE_32_4_4):
        return "layout"
    if not _scale_ok(sa, a.shape[0], ks // BLOCK, swz_a) or not _scale_ok(
        sb, n, ks // BLOCK, swz_b
    ):
        return "params"
    if bias is not None and (
        not ctx.plain(bias)
        or bias.dim() != 1
        or not _sym.eq(bias.shape[0], n)
        or not bias.is_floating_point()
    ):
        return "params"
    if _sym.known_zero(a.shape[0]) or n == 0 or ks == 0:
        return "empty"
    if not ctx.table.allows(ctx.arch(a), "mx_gemm", a.dtype, _sym.hint(a.shape[0]), n, ks):
        return "gate"
    return None


def _mm_call(a, b, sa, sb, bias, out_dtype, swz_a, swz_b, mm):
    fa, fb = FORMATS[a.dtype], FORMATS[b.dtype]
    k = a.shape[1] * (2 if fa == "e2m1" else 1)
    kb = k // BLOCK
    sa = _row_major(sa, a.shape[0], kb, swz_a)
    sb = _row_major(sb, b.shape[1], kb, swz_b)
    return mm(a, sa, b.t(), sb, fa, fb, bias, out_dtype)


def _eager_mx_mm(ctx):
    def mm(a, sa, b, sb, fa, fb, bias, out_dtype):
        return kernel("mx_gemm")(
            a, sa, b, sb, fa, fb, bias=bias, out_dtype=out_dtype, target=ctx.target_of(a)
        )

    return mm


def _op_mx_mm(a, sa, b, sb, fa, fb, bias, out_dtype):
    return torch.ops.flydsl.mx_mm(a, sa, b, sb, fa, fb, bias, out_dtype)


# -- _scaled_mm (v1) ---------------------------------------------------------------------------------


def _v1_swizzle():
    return SWIZZLE_32_4_4 if v1_swizzled() else NO_SWIZZLE


def v1_reason(ctx, a, b, sa, sb, bias=None, scale_result=None, out_dtype=None, fast=False):
    if scale_result is not None:
        return "params"
    s = _v1_swizzle()
    return _mm_reason(ctx, a, b, sa, sb, bias, out_dtype, s, s)


def v1_impl(ctx, a, b, sa, sb, bias=None, scale_result=None, out_dtype=None, fast=False):
    s = _v1_swizzle()
    return ctx.run(a, _mm_call, a, b, sa, sb, bias, out_dtype, s, s, _eager_mx_mm(ctx))


def v1_lower(ctx, a, b, sa, sb, bias=None, scale_result=None, out_dtype=None, fast=False):
    s = _v1_swizzle()

    def build(a, b, sa, sb, bias=None, scale_result=None, out_dtype=None, fast=False):
        return _mm_call(a, b, sa, sb, bias, out_dtype, s, s, _op_mx_mm)

    return Call("mx_mm", build)


# -- _scaled_mm_v2 -----------------------------------------------------------------------------------


def _v2_recipe(ctx, sa, ra, za, sb, rb, zb, contraction) -> tuple[str | None, tuple]:
    if len(sa) != 1 or len(sb) != 1:
        return "params", ()
    if list(ra) != [BLOCKWISE_1X32] or list(rb) != [BLOCKWISE_1X32]:
        return "dtype", ()  # another recipe: ATen's
    if len(za) > 1 or len(zb) > 1:
        return "params", ()
    if list(contraction) not in ([], [1, 0], [-1, 0], [1, -2], [-1, -2]):
        return "params", ()
    return None, (sa[0], za[0] if za else NO_SWIZZLE, sb[0], zb[0] if zb else NO_SWIZZLE)


def v2_reason(ctx, a, b, sa, ra, za, sb, rb, zb, bias, out_dtype, contraction=(), fast=False):
    r, (s_a, z_a, s_b, z_b) = (lambda r: (r[0], r[1] or (None,) * 4))(
        _v2_recipe(ctx, sa, ra, za, sb, rb, zb, contraction)
    )
    if r is not None:
        return r
    return _mm_reason(ctx, a, b, s_a, s_b, bias, out_dtype, z_a, z_b)


def v2_impl(ctx, a, b, sa, ra, za, sb, rb, zb, bias, out_dtype, contraction=(), fast=False):
    _, (s_a, z_a, s_b, z_b) = _v2_recipe(ctx, sa, ra, za, sb, rb, zb, contraction)
    return ctx.run(a, _mm_call, a, b, s_a, s_b, bias, out_dtype, z_a, z_b, _eager_mx_mm(ctx))


def v2_lower(ctx, a, b, sa, ra, za, sb, rb, zb, bias, out_dtype, contraction=(), fast=False):
    z_a = za[0] if za else NO_SWIZZLE
    z_b = zb[0] if zb else NO_SWIZZLE

    def build(a, b, sa, ra, za, sb, rb, zb, bias, out_dtype, contraction=(), fast=False):
        return _mm_call(a, b, sa[0], sb[0], bias, out_dtype, z_a, z_b, _op_mx_mm)

    return Call("mx_mm", build)


# -- _scaled_grouped_mm (v1: ATen's) and _scaled_grouped_mm_v2 --------------------------------------
# (every function takes the ATen arguments in schema order; ``*_`` is the trailing ones it ignores:
# the contraction dims where the recipe has been checked, and use_fast_accum)


def gv1_reason(ctx, a, b, sa, sb, offs=None, bias=None, scale_result=None, out_dtype=None, f=False):
    r, _ = _formats(ctx, a, b, sa, sb)
    return r or "layout"  # v1 MX scales are per-group blocked (swizzled, padded): ATen's


def _never(ctx, *args):
    return None  # gv1_reason never passes: counted, never rewritten


def gv2_reason(
    ctx, a, b, sa, ra, za, sb, rb, zb, offs=None, bias=None, out_dtype=None, contraction=(), *_
):
    r, rest = _v2_recipe(ctx, sa, ra, za, sb, rb, zb, contraction)
    if r is not None:
        return r
    s_a, z_a, s_b, z_b = rest
    r, f = _formats(ctx, a, b, s_a, s_b)
    if r is not None:
        return r
    fa, fb = f
    if z_a != NO_SWIZZLE or z_b != NO_SWIZZLE:
        return "layout"
    out_dtype = out_dtype if out_dtype is not None else torch.bfloat16
    if out_dtype not in OUT_DTYPES:
        return "dtype"
    form = (a.dim(), b.dim())
    if form not in ((2, 3), (3, 3), (2, 2)):
        return "params"
    k = _k(a, fa)
    if not _sym.eq(k, b.shape[-2] * (2 if fb == "e2m1" else 1)):
        return "params"
    n, ks = _sym.fixed(b.shape[-1]), _sym.fixed(k)
    if n is None or ks is None:
        return "dynamic"
    if ks % BLOCK:
        return "params"
    groups = a.shape[0] if form == (3, 3) else (offs.shape[0] if offs is not None else None)
    if form == (3, 3):
        if offs is not None or not _sym.eq(a.shape[0], b.shape[0]):
            return "params"
    elif offs is None or offs.dtype != torch.int32 or offs.dim() != 1:
        return "params"
    if form == (2, 3) and not _sym.eq(b.shape[0], groups):
        return "params"
    g = _sym.fixed(groups)
    if g is None:
        return "dynamic"
    kb = ks // BLOCK
    lead_a = (a.shape[0],) if form == (3, 3) else ()
    lead_b = (b.shape[0],) if b.dim() == 3 else ()
    if s_a.dim() != a.dim() or s_b.dim() != b.dim():
        return "params"
    if (
        not _sym.shape_eq(tuple(s_a.shape[:-1]), (*lead_a, a.shape[-2]))
        or _sym.fixed(s_a.shape[-1]) != kb
    ):
        return "params"
    if not _sym.shape_eq(tuple(s_b.shape[:-1]), (*lead_b, n)) or _sym.fixed(s_b.shape[-1]) != kb:
        return "params"
    if bias is not None and (form == (2, 2) or not _sym.shape_eq(tuple(bias.shape), (g, n))):
        return "params"
    if _sym.known_zero(a.shape[-2]) or n == 0 or g == 0:
        return "empty"
    rows = _sym.hint(a.shape[-2]) // g if form == (2, 3) else _sym.hint(a.shape[-2])
    if not ctx.table.allows(ctx.arch(a), "mx_grouped_mm", a.dtype, max(1, rows), n, ks):
        return "gate"
    return None


def _grouped_call(a, b, sa, sb, offs, bias, out_dtype, run):
    fa, fb = FORMATS[a.dtype], FORMATS[b.dtype]
    out_dtype = out_dtype if out_dtype is not None else torch.bfloat16
    # b is (G, K, N) / (K, N) column-major per group: its transpose is the NT weight
    return run(a, sa, b.transpose(-2, -1), sb.contiguous(), fa, fb, offs, bias, out_dtype)


def gv2_impl(ctx, a, b, sa, ra, za, sb, rb, zb, offs=None, bias=None, out_dtype=None, *_):
    def run(a, sa, b, sb, fa, fb, offs, bias, out_dtype):
        return kernel("mx_grouped_mm")(
            a, sa, b, sb, fa, fb, offs, bias=bias, out_dtype=out_dtype, target=ctx.target_of(a)
        )

    return ctx.run(a, _grouped_call, a, b, sa[0], sb[0], offs, bias, out_dtype, run)


def gv2_lower(ctx, a, b, sa, ra, za, sb, rb, zb, offs=None, bias=None, out_dtype=None, *_):
    if a.dim() == 2 and b.dim() == 2:
        return None  # ragged K checks offs on the host: eager only

    def build(a, b, sa, ra, za, sb, rb, zb, offs=None, bias=None, out_dtype=None, *_):
        return _grouped_call(
            a, b, sa[0], sb[0], offs, bias, out_dtype, torch.ops.flydsl.mx_grouped_mm
        )

    return Call("mx_grouped_mm", build)


# -- calibration: M buckets of an mxfp4 (a4w4) and an mxfp8 linear at N = K = 4096 ------------------

MX_M = [(1, 32), (33, 256), (257, 4096)]


def _cases(dtypes, quick):
    for dt in dtypes:
        for m in MX_M[::2] if quick else MX_M:
            yield dt, m, (1, 1 << 20), (1, 1 << 20)


def _make(dt, m, n, k, device):
    from flydsl_kernels.mx import baseline, to_mx

    m, n, k = m[0], 4096, 4096
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device)
    aq, sa = to_mx(x, dt)
    wq, sw = to_mx(w, dt)
    fmt = FORMATS[dt]
    kind = baseline.choose(str(device), fmt, fmt)  # torch._scaled_mm where the device has it
    return (
        lambda: kernel("mx_gemm")(aq, sa, wq, sw, fmt, fmt),
        baseline.thunk(kind, aq, sa, wq, sw, fmt, fmt),
    )


#: the MX gates key on the A element dtype
_MX_GEMM = {"gate": "mx_gemm", "dtypes": tuple(FORMATS)}
_MX_GROUPED = {"gate": "mx_grouped_mm", "dtypes": tuple(FORMATS)}

SCALED_MM = OpSpec(
    name="scaled_mm",
    overloads=(
        Overload("_scaled_mm", v1_reason, v1_impl, lower=v1_lower, **_MX_GEMM),
        Overload("_scaled_mm_v2", v2_reason, v2_impl, lower=v2_lower, **_MX_GEMM),
    ),
    calibration=(
        Calibration("mx_gemm", _cases, _make, dtypes=("float8_e4m3fn", "float4_e2m1fn_x2")),
    ),
    aliases=("mx_mm", "mx_gemm"),
    summary="MX torch._scaled_mm / F.scaled_mm (mxfp8, mxfp4, a8w4), eager and torch.compile",
)

SCALED_GROUPED_MM = OpSpec(
    name="scaled_grouped_mm",
    overloads=(
        Overload("_scaled_grouped_mm", gv1_reason, lower=_never, eager=False, **_MX_GROUPED),
        Overload("_scaled_grouped_mm_v2", gv2_reason, gv2_impl, lower=gv2_lower, **_MX_GROUPED),
    ),
    aliases=("mx_grouped_mm",),
    summary="MX torch._scaled_grouped_mm_v2 / F.scaled_grouped_mm (MoE experts)",
)
