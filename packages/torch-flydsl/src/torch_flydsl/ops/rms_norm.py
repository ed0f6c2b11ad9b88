"""``rms_norm``: ``F.rms_norm`` / ``torch.rms_norm`` through ``aten::_fused_rms_norm`` and its backward.

``aten::rms_norm`` is CompositeImplicitAutograd; in torch 2.15 it calls ``_fused_rms_norm``
when that op has a kernel for the input's backend (CUDA always; CPU once ours is registered:
stock CPU has none and decomposes) and the weight's dtype matches. Autograd is
``_fused_rms_norm``'s own formula (``FusedRmsNormBackward0``), which calls
``_fused_rms_norm_backward``. ATen has no CPU kernel for that one: the CPU fallback is torch's
registered decomposition (``torch._decomp``), the same math.

On the CPU key the group is opt-in (``enable(ops=["rms_norm"], device="cpu")``; ``enable()``
without ``ops=`` leaves it off there, ``OpSpec.default``): registering ``_fused_rms_norm`` at
the CPU key reroutes every CPU ``F.rms_norm`` through it, and its fallbacks through the
composite ``_fused_rms_norm`` and the Python backward decomposition, where stock CPU torch
decomposes ``rms_norm`` itself: a cost on every CPU call that FlyDSL does not take. The test
backend opts in to exercise the GPU's dispatch path.

Predicate order (the gate before the weight, stride and span checks): subclass, arch, dtype,
params (``normalized_shape`` a suffix), empty, gate, params (weight of that shape, ``eps >= 0``),
layout (contiguous), span; the backward's gradient may be any layout the kernels address (rows
of contiguous elements one stride apart, ``_row_layout``): ``layout`` where a row is not
contiguous, ``row_stride`` where the rows are not one stride apart (a permuted view). The eager wrapper decides subclass / arch / dtype / a closed gate
before calling it (``dispatch.make_kernel``).
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..eligibility import PLAIN
from ..spec import Calibration, OpSpec, Overload
from ._kernels import kernel

_SPAN = (1 << 32) - 1
_I32 = (1 << 31) - 1
DTYPES = supported.RMSNORM
_DTYPES = frozenset(DTYPES)
_FP32 = torch.float32


def _rows(x, ns) -> tuple[int, int] | None:
    """(m, n) of ``x`` normalized over ``ns``, or None when ``ns`` is not a suffix of its shape."""
    nd, kd = x.dim(), len(ns)
    if kd == 0 or kd > nd:
        return None
    shape = x.shape
    off = nd - kd
    n = 1
    for i in range(kd):
        s = ns[i]
        if shape[off + i] != s:
            return None
        n *= s
    return x.numel() // n if n else 0, n


def _weight_reason(x, w, ns) -> str | None:
    if w is None:
        return None
    if type(w) not in PLAIN:
        return "subclass"
    if w.dtype != x.dtype:
        return "dtype"
    if w.device != x.device or w.dim() != len(ns):
        return "params"
    shape = w.shape
    for i in range(len(ns)):
        if shape[i] != ns[i]:
            return "params"
    return None


def _reason(b, op, x, ns, w, eps) -> str | None:
    if type(x) not in PLAIN:
        return "subclass"
    arch = b.arch(x)
    if not arch:
        return "arch"
    if x.dtype not in _DTYPES:
        return "dtype"
    mn = _rows(x, ns)
    if mn is None:
        return "params"
    m, n = mn
    if m == 0 or n == 0:
        return "empty"
    if not b.table.allows(arch, op, x.dtype, m, n):
        return "gate"
    r = _weight_reason(x, w, ns)
    if r is not None:
        return r
    if eps is not None and not eps >= 0.0:  # NaN and negative eps stay on ATen
        return "params"
    if not x.is_contiguous() or (w is not None and not w.is_contiguous()):
        return "layout"
    if m * n * x.element_size() > _SPAN or n > _I32 or m > _I32:
        return "span"
    return None


def reason(b, x, ns, w, eps) -> str | None:
    return _reason(b, "rms_norm", x, ns, w, eps)


def impl(b, x, ns, w, eps):
    return b.run(x, kernel("rms_norm"), x, ns, w, eps, target=b.target_of(x))


def _n(ns) -> int:
    n = 1
    for s in ns:
        n *= s
    return n


def backward_reason(b, g, x, ns, rstd, w, mask) -> str | None:
    if type(g) not in PLAIN or type(rstd) not in PLAIN:
        return "subclass"
    if g.dtype != x.dtype or rstd.dtype != _FP32:
        return "dtype"
    if not mask[0] or g.shape != x.shape or g.device != x.device or rstd.device != x.device:
        return "params"
    r = _reason(b, "rms_norm_backward", x, ns, w, None)
    if r is not None:
        return r
    n = _n(ns)
    if rstd.numel() * n != x.numel():  # one rstd per row
        return "params"
    why = _row_layout(g, len(ns))
    if why is None and g.stride() != x.stride():  # rows of a wider buffer: their span
        m = x.numel() // n
        if ((m - 1) * _row_stride(g, len(ns)) + n) * g.element_size() > _SPAN:
            return "span"
    return why


def _row_stride(t, kd: int) -> int:
    """The stride between the rows of ``t`` (``_row_layout``: one), 0 for a single row."""
    for i in range(t.dim() - kd - 1, -1, -1):
        if t.shape[i] != 1:
            return t.stride(i)
    return 0


def _row_layout(t, kd: int) -> str | None:
    """None where ``t`` has the layout the kernels address: each row (the last ``kd`` dims) one
    run of contiguous elements, row ``i`` at ``i * stride`` (contiguous tensors, slices of wider
    rows); ``layout`` where a row's elements are not contiguous (a broadcast gradient);
    ``row_stride`` where the rows are not one stride apart: a permuted view, such as the
    gradient transformers' Qwen3 ``q_norm`` / ``k_norm`` receive through the ``transpose(1, 2)``
    after them (rows over ``(batch, seq, head)`` laid out ``(batch, head, seq)``). The kernels
    take one row stride (a compile-time constant), so such a view goes to ATen."""
    shape, stride, nd = t.shape, t.stride(), t.dim()
    expect = 1
    for i in range(nd - 1, nd - kd - 1, -1):
        if shape[i] != 1:
            if stride[i] != expect:
                return "layout"
            expect *= shape[i]
    row = None
    for i in range(nd - kd - 1, -1, -1):
        if shape[i] == 1:
            continue
        if row is None:
            row = stride[i]
            if row < 0:
                return "layout"
        elif stride[i] != expect:
            return "row_stride"
        expect = stride[i] * shape[i]
    return None


def backward_impl(b, g, x, ns, rstd, w, mask):
    return b.run(
        x,
        kernel("rms_norm_backward"),
        g,
        x,
        rstd,
        w,
        torch.are_deterministic_algorithms_enabled(),
        normalized_shape=ns,
        output_mask=mask,
        target=b.target_of(x),
    )


def backward_decomposition(*args):
    """Where the key has no ATen kernel (CPU): torch's registered decomposition."""
    from torch._decomp.decompositions import _fused_rms_norm_backward

    return _fused_rms_norm_backward(*args)


# -- calibration: row-length buckets and row-count buckets ----------------------------------------

RMS_N = [(1 << j, (1 << (j + 1)) - 1) for j in range(7, 17)] + [(131072, 262144)]
RMS_M = [(1, 255), (256, 1023), (1024, 4095), (4096, 16383), (16384, 65536)]
#: the largest input calibrate allocates (bytes), so buckets stay within memory
MAX_BYTES = 1 << 31


def _cases(dtypes, quick):
    ms = RMS_M[::2] if quick else RMS_M
    for dt in dtypes:
        size = torch.empty((), dtype=dt).element_size()
        for n in RMS_N:
            for m in ms:
                if m[0] * n[0] * size <= MAX_BYTES:
                    yield dt, m, n, None


def _make_fwd(dt, m, n, k, device):
    m, n = m[0], n[0]  # the bucket's lower corner
    x = torch.randn(m, n, device=device).to(dt)
    w = torch.randn(n, device=device).to(dt)
    return (
        lambda: kernel("rms_norm")(x, (n,), w, 1e-6),
        lambda: torch.ops.aten._fused_rms_norm.default(x, [n], w, 1e-6),
    )


def _make_bwd(dt, m, n, k, device):
    m, n = m[0], n[0]
    x = torch.randn(m, n, device=device).to(dt)
    w = torch.randn(n, device=device).to(dt)
    g = torch.randn_like(x)
    _, rstd = torch.ops.aten._fused_rms_norm.default(x, [n], w, 1e-6)
    det = torch.are_deterministic_algorithms_enabled()
    return (
        lambda: kernel("rms_norm_backward")(g, x, rstd, w, det),
        lambda: torch.ops.aten._fused_rms_norm_backward.default(g, x, [n], rstd, w, [True, True]),
    )


SPEC = OpSpec(
    name="rms_norm",
    overloads=(
        Overload("_fused_rms_norm", reason, impl, gate="rms_norm", dtypes=DTYPES, numel_mn=True),
        Overload(
            "_fused_rms_norm_backward",
            backward_reason,
            backward_impl,
            fallback=backward_decomposition,
            gate="rms_norm_backward",
            dtypes=DTYPES,
            key=1,  # the input x (argument 0 is the gradient)
            numel_mn=True,
        ),
    ),
    calibration=(
        Calibration("rms_norm", _cases, _make_fwd),
        Calibration("rms_norm_backward", _cases, _make_bwd),
    ),
    aliases=("rmsnorm",),
    summary="F.rms_norm / torch.rms_norm (aten::_fused_rms_norm and its backward)",
    default=("cuda",),  # opt-in on the CPU key (the module docstring)
)
