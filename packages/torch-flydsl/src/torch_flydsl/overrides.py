"""The dispatcher overrides: a cheap eligibility predicate, then FlyDSL or the captured kernel.

For each op group and device (``CUDA`` key, which ROCm uses too, or ``CPU``
for the test backend) ``install`` captures the kernel registered at the key
(``torch.library.get_kernel``), then registers a Python kernel over it with
``torch.library.Library("aten", "IMPL")``. The kernel runs the predicate
(checks in cost order: arch; dtype and parameters; layout; 32-bit span; gate)
and either launches FlyDSL or calls the captured kernel (``call_boxed`` with
the backend's keyset), so a fallback is exactly what ran before us. Kernel exceptions
never escape: they are logged at warning, counted as ``error`` and answered
by the captured kernel.

Groups:

* ``rms_norm``: ``aten::_fused_rms_norm`` and ``aten::_fused_rms_norm_backward``
  at the key. ``F.rms_norm`` / ``torch.rms_norm`` reach them through
  ``aten::rms_norm``, a CompositeImplicitAutograd op that in torch 2.15
  calls ``_fused_rms_norm`` when that op has a kernel for the input's
  backend (CUDA always; CPU once ours is registered: stock CPU has none and
  decomposes into pow/mean/rsqrt/mul) and the weight's dtype matches the
  input's. Autograd is ``_fused_rms_norm``'s own formula
  (``FusedRmsNormBackward0``), which calls ``_fused_rms_norm_backward``.
  ATen has no CPU kernel for that one: the CPU fallback is torch's
  registered decomposition (``torch._decomp``), the same math.
* ``topk``: ``aten::topk`` and ``aten::topk.values`` (``out=``).
"""

from __future__ import annotations

import logging
import warnings

import torch

from . import _runtime, gates
from .stats import OpStats
from .stats import get as _stat

log = logging.getLogger("torch_flydsl")

_SPAN = (1 << 32) - 1  # bytes one AMD buffer descriptor addresses
_I32 = (1 << 31) - 1  # int32 element offsets
_RMS_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
_TOPK_DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
_INT64 = torch.int64
_FP32 = torch.float32
#: plain tensor types: anything else (FakeTensor, subclasses) goes to the captured kernel
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})

GROUPS = ("rms_norm", "topk")


def group_ops(group: str, device: str) -> tuple[tuple[str, str], ...]:
    """``(aten overload, dispatch key)`` pairs a group overrides on ``device``."""
    key = _runtime.dispatch_key(device)
    if group == "topk":
        return (("topk", key), ("topk.values", key))
    if group == "rms_norm":
        return (("_fused_rms_norm", key), ("_fused_rms_norm_backward", key))
    raise ValueError(f"unknown op group {group!r}: expected one of {GROUPS}")


def is_aten_kernel(kernel) -> bool:
    """Whether a captured kernel is ATen's own (a C++ registration in PyTorch's build)."""
    d = repr(kernel)
    return "aten/src/ATen" in d or "torch/csrc" in d


def capture(op: str, key: str):
    """The kernel now at ``aten::op`` for ``key``, or None when there is none."""
    try:
        return torch.library.get_kernel(f"aten::{op}", key)
    except RuntimeError:
        return None


# -- lazy kernel imports (importing torch_flydsl compiles nothing) ------------------------------

_K: dict[str, object] = {}


def _kernel(name: str):
    fn = _K.get(name)
    if fn is None:
        if name == "topk":
            from flydsl_kernels.topk import topk as fn
        elif name == "rms_norm":
            from flydsl_kernels.rmsnorm import rms_norm as fn
        else:
            from flydsl_kernels.rmsnorm import rms_norm_backward as fn
        _K[name] = fn
    return fn


def _decomposed_rms_norm_backward(*args):
    from torch._decomp.decompositions import _fused_rms_norm_backward

    return _fused_rms_norm_backward(*args)


# -- the backend context: arch of a tensor's device, the target, the gates ----------------------


class Backend:
    """What a registered kernel needs about its device: the arch check, the target, the gates."""

    def __init__(self, device: str, table: gates.GateTable):
        self.device = device
        self.cpu = device == "cpu"
        self.table = table
        self.target = _runtime.cpu_target() if self.cpu else None
        self.allowed = _runtime.allowed_archs()
        #: the keyset the captured kernels are called with (kernels registered without one
        #: are cheaper to enter: about 0.6 us a call on the CPU here)
        self.keyset = torch._C.DispatchKeySet(
            torch._C.DispatchKey.CPU if self.cpu else torch._C.DispatchKey.CUDA
        )
        self._arch: dict[int | None, str] = {}  # device index -> arch, "" when not allowed

    def arch(self, t: torch.Tensor) -> str:
        """The arch name for ``t``'s device, or "" when FlyDSL may not run there."""
        if self.cpu:
            return _runtime.CPU_ARCH
        idx = t.device.index
        a = self._arch.get(idx)
        if a is None:
            a = _runtime.resolve_arch(idx) or ""
            if a not in self.allowed:
                a = ""
            self._arch[idx] = a
        return a

    def run(self, t: torch.Tensor, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` under a device guard: Python kernels get none."""
        if not self.cpu:
            idx = t.device.index
            if idx is not None and idx != torch.cuda.current_device():
                with torch.cuda.device(idx):
                    return fn(*args, **kwargs)
        return fn(*args, **kwargs)


def _error(st: OpStats, e: Exception) -> None:
    log.warning(
        "%s: the FlyDSL kernel raised %s: %s; returning ATen's result",
        st.name,
        type(e).__name__,
        e,
    )
    st.fallback("error")


# -- predicates (a reason string, or None when FlyDSL runs) -------------------------------------


def topk_reason(b: Backend, x, k, dim, largest, sorted_) -> str | None:
    if type(x) not in _PLAIN:
        return "subclass"
    arch = b.arch(x)
    if not arch:
        return "arch"
    if x.dtype not in _TOPK_DTYPES:
        return "dtype"
    nd = x.dim()
    if nd == 0:
        return "empty"
    if dim < 0:
        dim += nd
    if not 0 <= dim < nd:
        return "params"
    n = x.shape[dim]
    if not 0 < k <= n:
        return "params"
    if dim != nd - 1 or not x.is_contiguous():
        return "layout"
    numel = x.numel()
    if numel == 0:
        return "empty"
    m = numel // n
    if numel * x.element_size() > _SPAN or m * k * 8 > _SPAN or n > _I32 or m > _I32:
        return "span"
    if not b.table.allows(arch, "topk", x.dtype, m, n, k, largest, sorted_):
        return "gate"
    return None


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
    if type(w) not in _PLAIN:
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


def rms_norm_reason(b: Backend, op: str, x, ns, w, eps) -> str | None:
    if type(x) not in _PLAIN:
        return "subclass"
    arch = b.arch(x)
    if not arch:
        return "arch"
    if x.dtype not in _RMS_DTYPES:
        return "dtype"
    mn = _rows(x, ns)
    if mn is None:
        return "params"
    r = _weight_reason(x, w, ns)
    if r is not None:
        return r
    if eps is not None and not eps >= 0.0:  # NaN and negative eps stay on ATen
        return "params"
    m, n = mn
    if m == 0 or n == 0:
        return "empty"
    if not x.is_contiguous() or (w is not None and not w.is_contiguous()):
        return "layout"
    if m * n * x.element_size() > _SPAN or n > _I32 or m > _I32:
        return "span"
    if not b.table.allows(arch, op, x.dtype, m, n):
        return "gate"
    return None


def rms_norm_backward_reason(b: Backend, g, x, ns, rstd, w, mask) -> str | None:
    if type(g) not in _PLAIN or type(rstd) not in _PLAIN:
        return "subclass"
    if g.dtype != x.dtype or rstd.dtype != _FP32:
        return "dtype"
    if not mask[0] or g.shape != x.shape or g.device != x.device or rstd.device != x.device:
        return "params"
    r = rms_norm_reason(b, "rms_norm_backward", x, ns, w, None)
    if r is not None:
        return r
    if rstd.numel() * _n(ns) != x.numel():  # one rstd per row
        return "params"
    if not g.is_contiguous():
        return "layout"
    return None


def _n(ns) -> int:
    n = 1
    for s in ns:
        n *= s
    return n


# -- kernels ------------------------------------------------------------------------------------


def _run_topk(b: Backend, x, k, dim, largest, sorted_):
    """The FlyDSL topk for an eligible call (deterministic variant under torch's flag)."""
    det = torch.are_deterministic_algorithms_enabled()
    return b.run(
        x, _kernel("topk"), x, k, dim, largest, sorted_, deterministic=det, target=b.target
    )


def make_topk(b: Backend, orig):
    st = _stat("topk")
    keyset = b.keyset

    def topk(x, k, dim=-1, largest=True, sorted=True):
        st.calls += 1
        reason = topk_reason(b, x, k, dim, largest, sorted)
        if reason is None:
            try:
                out = _run_topk(b, x, k, dim, largest, sorted)
                st.hits += 1
                return out
            except Exception as e:
                _error(st, e)
        else:
            st.fallback(reason)
        return orig.call_boxed(keyset, x, k, dim, largest, sorted)

    return topk


def make_topk_out(b: Backend, orig):
    st = _stat("topk.values")
    keyset = b.keyset

    def topk_out(x, k, dim=-1, largest=True, sorted=True, *, values, indices):
        st.calls += 1
        reason = topk_reason(b, x, k, dim, largest, sorted)
        if reason is None and (
            type(values) not in _PLAIN
            or type(indices) not in _PLAIN
            or values.dtype != x.dtype
            or indices.dtype != _INT64
            or values.device != x.device
            or indices.device != x.device
            or values.shape[:-1] != x.shape[:-1]  # ATen resizes (and warns): leave it that
            or values.dim() != x.dim()
            or values.shape[-1] != k
            or indices.shape != values.shape
        ):
            reason = "params"
        if reason is None:
            try:
                v, i = _run_topk(b, x, k, dim, largest, sorted)
                values.copy_(v)
                indices.copy_(i)
                st.hits += 1
                return values, indices
            except Exception as e:
                _error(st, e)
        else:
            st.fallback(reason)
        return orig.call_boxed(keyset, x, k, dim, largest, sorted, values=values, indices=indices)

    return topk_out


def make_fused_rms_norm(b: Backend, orig):
    st = _stat("_fused_rms_norm")
    keyset = b.keyset

    def fused_rms_norm(x, normalized_shape, weight, eps):
        st.calls += 1
        reason = rms_norm_reason(b, "rms_norm", x, normalized_shape, weight, eps)
        if reason is None:
            try:
                out = b.run(
                    x, _kernel("rms_norm"), x, normalized_shape, weight, eps, target=b.target
                )
                st.hits += 1
                return out
            except Exception as e:
                _error(st, e)
        else:
            st.fallback(reason)
        return orig.call_boxed(keyset, x, normalized_shape, weight, eps)

    return fused_rms_norm


def make_fused_rms_norm_backward(b: Backend, orig):
    st = _stat("_fused_rms_norm_backward")

    keyset = b.keyset

    def fallback(*args):
        if orig is None:  # no ATen kernel at this key (CPU): torch's decomposition
            return _decomposed_rms_norm_backward(*args)
        return orig.call_boxed(keyset, *args)

    def fused_rms_norm_backward(grad_out, x, normalized_shape, rstd, weight, output_mask):
        st.calls += 1
        reason = rms_norm_backward_reason(
            b, grad_out, x, normalized_shape, rstd, weight, output_mask
        )
        if reason is None:
            try:
                out = b.run(
                    x,
                    _kernel("rms_norm_backward"),
                    grad_out,
                    x,
                    rstd,
                    weight,
                    torch.are_deterministic_algorithms_enabled(),
                    normalized_shape=normalized_shape,
                    output_mask=output_mask,
                    target=b.target,
                )
                st.hits += 1
                return out
            except Exception as e:
                _error(st, e)
        else:
            st.fallback(reason)
        return fallback(grad_out, x, normalized_shape, rstd, weight, output_mask)

    return fused_rms_norm_backward


_MAKERS = {
    "topk": make_topk,
    "topk.values": make_topk_out,
    "_fused_rms_norm": make_fused_rms_norm,
    "_fused_rms_norm_backward": make_fused_rms_norm_backward,
}


class Installed:
    """One op group registered on one device: its library (destroy to remove) and what it holds."""

    def __init__(self, group, device, lib, captured):
        self.group = group
        self.device = device
        self.lib = lib
        self.captured = captured  # {(op, key): repr of the kernel we captured, or None}

    def remove(self) -> None:
        self.lib._destroy()


def prior_registrations(group: str, device: str) -> dict[tuple[str, str], str]:
    """Non-ATen kernels already at the group's (op, key) pairs: ``{(op, key): repr}``."""
    out = {}
    for op, key in group_ops(group, device):
        k = capture(op, key)
        if k is not None and not is_aten_kernel(k):
            out[(op, key)] = repr(k)
    return out


def install(group: str, backend: Backend) -> Installed:
    """Capture the current kernels of ``group``, then register ours over them."""
    pairs = group_ops(group, backend.device)
    origs = {(op, key): capture(op, key) for op, key in pairs}  # all captured before any impl
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*operators may also be overridden.*")
            for op, key in pairs:
                orig = origs[(op, key)]
                if orig is None and op != "_fused_rms_norm_backward":
                    raise RuntimeError(f"aten::{op} has no kernel for {key} to fall back to")
                name = op.split(".")[0] if op != "topk.values" else op
                lib.impl(name, _MAKERS[op](backend, orig), key)
    except BaseException:
        lib._destroy()
        raise
    return Installed(
        group, backend.device, lib, {p: (None if k is None else repr(k)) for p, k in origs.items()}
    )
