"""``topk``: ``torch.topk`` / ``Tensor.topk`` (``aten::topk``, ``aten::topk.values``) on FlyDSL's TopK.

Predicate order (cost order, the gate before the stride and span checks): subclass, arch,
dtype, params (dim, ``0 < k <= N``), layout (last dim), empty, gate, layout (contiguous), span
(32-bit buffer descriptors). The eager wrapper decides subclass / arch / dtype / a closed
gate before calling it (``dispatch.make_kernel``). ``out=``: the out
tensors must have exactly the result's shape and dtypes (ATen's resize-and-warn stays ATen's).
Under ``torch.use_deterministic_algorithms(True)`` the kernel runs its deterministic variant.
"""

from __future__ import annotations

import torch

from flydsl_kernels import supported

from ..eligibility import PLAIN
from ..spec import Calibration, OpSpec, Overload
from ._kernels import kernel

_SPAN = (1 << 32) - 1  # bytes one AMD buffer descriptor addresses
_I32 = (1 << 31) - 1  # int32 element offsets
DTYPES = supported.TOPK
_DTYPES = frozenset(DTYPES)
_INT64 = torch.int64


def reason(b, x, k, dim, largest, sorted_) -> str | None:
    if type(x) not in PLAIN:
        return "subclass"
    arch = b.arch(x)
    if not arch:
        return "arch"
    if x.dtype not in _DTYPES:
        return "dtype"
    shape = x.shape
    nd = len(shape)
    if nd == 0:
        return "empty"
    if dim < 0:
        dim += nd
    if not 0 <= dim < nd:
        return "params"
    n = shape[dim]
    if not 0 < k <= n:
        return "params"
    if dim != nd - 1:
        return "layout"
    numel = x.numel()
    if numel == 0:
        return "empty"
    m = numel // n
    if not b.table.allows(arch, "topk", x.dtype, m, n, k, largest, sorted_):
        return "gate"
    if not x.is_contiguous():
        return "layout"
    if numel * x.element_size() > _SPAN or m * k * 8 > _SPAN or n > _I32 or m > _I32:
        return "span"
    return None


def impl(b, x, k, dim, largest, sorted_):
    """The FlyDSL topk for an eligible call (deterministic variant under torch's flag)."""
    det = torch.are_deterministic_algorithms_enabled()
    return b.run(
        x, kernel("topk"), x, k, dim, largest, sorted_, deterministic=det, target=b.target_of(x)
    )


def out_reason(b, x, k, dim, largest, sorted_, values, indices) -> str | None:
    r = reason(b, x, k, dim, largest, sorted_)
    if r is None and (
        type(values) not in PLAIN
        or type(indices) not in PLAIN
        or values.dtype != x.dtype
        or indices.dtype != _INT64
        or values.device != x.device
        or indices.device != x.device
        or values.shape[:-1] != x.shape[:-1]  # ATen resizes (and warns): leave it that
        or values.dim() != x.dim()
        or values.shape[-1] != k
        or indices.shape != values.shape
    ):
        return "params"
    return r


def out_impl(b, x, k, dim, largest, sorted_, values, indices):
    v, i = impl(b, x, k, dim, largest, sorted_)
    values.copy_(v)
    indices.copy_(i)
    return values, indices


# -- calibration: k buckets, power-of-two N buckets, row-count buckets ---------------------------

TOPK_K = [(1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 255), (256, 1024)]
TOPK_N = [(1 << j, (1 << (j + 1)) - 1) for j in range(10, 18)]
TOPK_M = [(1, 63), (64, 255), (256, 1023), (1024, 8192)]


def _cases(dtypes, quick):
    ms = TOPK_M[1::2] if quick else TOPK_M
    ks = TOPK_K[::2] if quick else TOPK_K
    for dt in dtypes:
        for n in TOPK_N:
            for k in ks:
                if k[0] <= n[0]:
                    for m in ms:
                        yield dt, m, n, k


def _make(dt, m, n, k, device):
    m, n, k = m[0], n[0], k[0]  # the bucket's lower corner
    x = torch.randn(m, n, device=device).to(dt)
    return (lambda: kernel("topk")(x, k)), (lambda: torch.ops.aten.topk.default(x, k))


def _extra(k):
    extra = {"k": list(k), "largest": True, "sorted": True}
    if k[0] == k[1]:
        extra["k_in"] = [k[0]]
    return extra


SPEC = OpSpec(
    name="topk",
    overloads=(
        Overload("topk", reason, impl, gate="topk", dtypes=DTYPES, numel_mn=True),
        Overload("topk.values", out_reason, out_impl, gate="topk", dtypes=DTYPES, numel_mn=True),
    ),
    calibration=(Calibration("topk", _cases, _make, rule_extra=_extra),),
    summary="torch.topk / Tensor.topk (out= too)",
)
