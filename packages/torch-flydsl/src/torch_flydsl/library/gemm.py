"""The GEMM ``flydsl::`` operators: what the torch.compile pass rewrites GEMMs into.

================  =========================================================================
op                computes
================  =========================================================================
``gemm``          ``act(alpha * a @ b + beta * c + bias) + residual`` (2-D or batched 3-D)
``swiglu``        ``silu(a @ w_gate) * (a @ w_up)`` (one kernel, ``a`` read once)
``grouped_mm``    ``torch._grouped_mm`` (all four forms)
``mx_mm``         MX ``a @ b.T`` (OCP MX elements and row-major E8M0 scales, ``b`` NT)
``mx_grouped_mm`` MX ``torch._grouped_mm`` (2-D x 3-D, 3-D x 3-D, 2-D x 2-D ragged K)
================  =========================================================================

Each is a ``torch.library.triton_op`` whose body calls the ``flydsl_kernels`` function API:

* **real tensors** (eager, or an Inductor graph that calls the op as an extern kernel): the
  API picks the config for these shapes and launches through FlyDSL's own launcher, on the
  GPU or, for CPU tensors, on FlyDSL's CPU backend (``FLYDSL_TORCH_CPU_TARGET``); the op's
  ``torch_flydsl.stats()`` entry (``flydsl::gemm`` ...) counts the launches;
* **traced GPU tensors** (AOTAutograd's functionalization, the pass's ``decompose``): the
  same API runs on the FakeTensors with its launches taken over by ``launch_sink``: each
  becomes ``torch.library.wrap_triton(<FlyDSL's generated @triton.jit>)[grid](...)``, so
  Inductor sees, schedules and packages real Triton kernels (``graph_launch.py``). A symbolic M
  becomes a ``cond`` over the M ranges where the eager config choice changes, so one graph
  picks each call's config at run time;
* **traced CPU tensors**: Inductor generates C++ for CPU graphs and cannot launch Triton
  kernels there (``wrap_triton`` needs a GPU driver even to analyse a kernel), so the
  decomposition calls the opaque ``flydsl::<op>_cpu`` twin instead: a
  ``torch.library.custom_op`` with a fake implementation, running the real-tensor path.

Importing this module registers the ops; it compiles nothing.
"""

from __future__ import annotations

import torch
from torch.library import custom_op, triton_op

from ..eligibility import plain, target
from ..graph_launch import (
    by_m,
    dense_ranges,
    grouped_ranges,
    mx_grouped_ranges,
    mx_ranges,
    sink,
    traces_cpu,
)
from ..ops._kernels import kernel
from ..stats import get as _stat

ACTIVATIONS = ("", "relu", "gelu", "gelu_tanh", "silu")
#: the namespace of every torch_flydsl custom op (``torch_flydsl.library``)
NAMESPACE = "flydsl"
Tensor = torch.Tensor


def _eager(name: str, fn):
    out = fn()
    _stat(f"{NAMESPACE}::{name}").hits += 1
    return out


def _opt(ts):
    """The tensors of ``ts`` that are not None, and a function putting them back in place."""
    where = [i for i, t in enumerate(ts) if t is not None]

    def unpack(vals):
        out = [None] * len(ts)
        for i, v in zip(where, vals):
            out[i] = v
        return out

    return tuple(ts[i] for i in where), unpack


# -- gemm -------------------------------------------------------------------------------------------


def _gemm_call(a, b, bias, c, residual, alpha, beta, activation, out_dtype, **kw):
    return kernel("gemm")(
        a,
        b,
        bias=bias,
        c=c,
        residual=residual,
        alpha=alpha,
        beta=beta,
        activation=activation or None,
        out_dtype=out_dtype,
        **kw,
    )


@triton_op(f"{NAMESPACE}::gemm", mutates_args=())
def gemm(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None,
    c: Tensor | None,
    residual: Tensor | None,
    alpha: float,
    beta: float,
    activation: str,
    out_dtype: torch.dtype | None,
) -> Tensor:
    args = (a, b, bias, c, residual, alpha, beta, activation, out_dtype)
    if plain(a):
        return _eager("gemm", lambda: _gemm_call(*args, target=target(a)))
    if a.device.type == "cpu" and not traces_cpu():
        return torch.ops.flydsl.gemm_cpu(*args)
    tensors, unpack = _opt((a, b, bias, c, residual))
    M, N, K = a.shape[-2], b.shape[-1], a.shape[-1]
    batch = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)

    def variant(cfg, split):
        def run(*ts):
            a_, b_, bias_, c_, r_ = unpack(ts)
            opts = {"target": sink.target_of(a_), "config": cfg, "split_k": split}
            with sink(a_):
                return _gemm_call(a_, b_, bias_, c_, r_, alpha, beta, activation, out_dtype, **opts)

        return run

    choice = dense_ranges(M, N, K, batch, target=sink.target_of(a))
    return by_m(M, choice, variant, tensors, lambda t: t[0].shape[-2])


# -- swiglu -----------------------------------------------------------------------------------------


@triton_op(f"{NAMESPACE}::swiglu", mutates_args=())
def swiglu(a: Tensor, w_gate: Tensor, w_up: Tensor, out_dtype: torch.dtype | None) -> Tensor:
    if plain(a):
        return _eager(
            "swiglu",
            lambda: kernel("swiglu")(a, w_gate, w_up, out_dtype=out_dtype, target=target(a)),
        )
    if a.device.type == "cpu" and not traces_cpu():
        return torch.ops.flydsl.swiglu_cpu(a, w_gate, w_up, out_dtype)
    M, N, K = a.shape[-2], w_gate.shape[-1], a.shape[-1]
    batch = max(a.shape[0] if a.dim() == 3 else 1, w_gate.shape[0] if w_gate.dim() == 3 else 1)

    def variant(cfg, _split):
        def run(a_, g_, u_):
            with sink(a_):
                return kernel("swiglu")(
                    a_, g_, u_, out_dtype=out_dtype, target=sink.target_of(a_), config=cfg
                )

        return run

    choice = dense_ranges(M, N, K, batch, swiglu=True, target=sink.target_of(a))
    return by_m(M, choice, variant, (a, w_gate, w_up), lambda t: t[0].shape[-2])


# -- grouped_mm ---------------------------------------------------------------------------------------


@triton_op(f"{NAMESPACE}::grouped_mm", mutates_args=())
def grouped_mm(
    a: Tensor,
    b: Tensor,
    offs: Tensor | None,
    bias: Tensor | None,
    out_dtype: torch.dtype | None,
) -> Tensor:
    if plain(a):
        return _eager(
            "grouped_mm",
            lambda: kernel("grouped_mm")(a, b, offs, bias, out_dtype, target=target(a)),
        )
    if a.device.type == "cpu" and not traces_cpu():
        return torch.ops.flydsl.grouped_mm_cpu(a, b, offs, bias, out_dtype)
    tensors, unpack = _opt((a, b, offs, bias))
    ragged_m = a.dim() == 2 and b.dim() == 3
    G = b.shape[0] if ragged_m else 1
    M, N, K = a.shape[-2], b.shape[-1], a.shape[-1]

    def variant(cfg, _split):
        def run(*ts):
            a_, b_, offs_, bias_ = unpack(ts)
            with sink(a_):
                return kernel("grouped_mm")(
                    a_, b_, offs_, bias_, out_dtype, target=sink.target_of(a_), config=cfg
                )

        return run

    choice = grouped_ranges(M, N, K, G if ragged_m else 0, sink.target_of(a))
    return by_m(M, choice, variant, tensors, lambda t: t[0].shape[-2])


# -- MX ----------------------------------------------------------------------------------------------


@triton_op(f"{NAMESPACE}::mx_mm", mutates_args=())
def mx_mm(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    a_format: str,
    b_format: str,
    bias: Tensor | None,
    out_dtype: torch.dtype,
) -> Tensor:
    args = (a, a_scale, b, b_scale, a_format, b_format)
    if plain(a):
        return _eager(
            "mx_mm",
            lambda: kernel("mx_gemm")(*args, bias=bias, out_dtype=out_dtype, target=target(a)),
        )
    if a.device.type == "cpu" and not traces_cpu():
        return torch.ops.flydsl.mx_mm_cpu(*args, bias, out_dtype)
    tensors, unpack = _opt((a, a_scale, b, b_scale, bias))

    def variant(cfg, _split):
        def run(*ts):
            a_, sa_, b_, sb_, bias_ = unpack(ts)
            opts = {"out_dtype": out_dtype, "target": sink.target_of(a_), "config": cfg}
            with sink(a_):
                return kernel("mx_gemm")(a_, sa_, b_, sb_, a_format, b_format, bias=bias_, **opts)

        return run

    M, N = a.shape[0], b.shape[0]
    K = a.shape[1] * (2 if a_format == "e2m1" else 1)
    choice = mx_ranges(M, N, K, a_format, b_format, sink.target_of(a))
    return by_m(M, choice, variant, tensors, lambda t: t[0].shape[0])


@triton_op(f"{NAMESPACE}::mx_grouped_mm", mutates_args=())
def mx_grouped_mm(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    a_format: str,
    b_format: str,
    offs: Tensor | None,
    bias: Tensor | None,
    out_dtype: torch.dtype,
) -> Tensor:
    args = (a, a_scale, b, b_scale, a_format, b_format, offs)
    if plain(a):
        return _eager(
            "mx_grouped_mm",
            lambda: kernel("mx_grouped_mm")(
                *args, bias=bias, out_dtype=out_dtype, target=target(a)
            ),
        )
    if a.device.type == "cpu" and not traces_cpu():
        return torch.ops.flydsl.mx_grouped_mm_cpu(*args, bias, out_dtype)
    tensors, unpack = _opt((a, a_scale, b, b_scale, offs, bias))
    ragged_m = a.dim() == 2 and b.dim() == 3
    G = b.shape[0] if ragged_m else 1
    M, N = a.shape[-2], b.shape[-2]
    K = a.shape[-1] * (2 if a_format == "e2m1" else 1)

    def variant(cfg, _split):
        def run(*ts):
            a_, sa_, b_, sb_, offs_, bias_ = unpack(ts)
            args_ = (a_, sa_, b_, sb_, a_format, b_format, offs_)
            opts = {"out_dtype": out_dtype, "target": sink.target_of(a_), "config": cfg}
            with sink(a_):
                return kernel("mx_grouped_mm")(*args_, bias=bias_, **opts)

        return run

    choice = mx_grouped_ranges(M, N, K, G if ragged_m else 0, a_format, b_format, sink.target_of(a))
    return by_m(M, choice, variant, tensors, lambda t: t[0].shape[-2])


# -- output metadata (fake implementations) ---------------------------------------------------------


def _empty(shape, dtype, like):
    return torch.empty(shape, dtype=dtype, device=like.device)


def _product(a, b, out_dtype):
    """The output of ``a @ b`` (2-D, or batched where either is 3-D)."""
    B = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else None)
    shape = (a.shape[-2], b.shape[-1]) if B is None else (B, a.shape[-2], b.shape[-1])
    return _empty(shape, out_dtype or a.dtype, a)


def gemm_meta(a, b, bias, c, residual, alpha, beta, activation, out_dtype):
    return _product(a, b, out_dtype)


def swiglu_meta(a, w_gate, w_up, out_dtype):
    return _product(a, w_gate, out_dtype)


def _grouped_shape(a, b, offs, n):
    if a.dim() == 2 and b.dim() == 3:
        return (a.shape[0], n)
    if a.dim() == 3 and b.dim() == 3:
        return (a.shape[0], a.shape[1], n)
    if a.dim() == 2 and b.dim() == 2:
        return (offs.shape[0], a.shape[0], n)
    return (a.shape[1], n)


def grouped_mm_meta(a, b, offs, bias, out_dtype):
    return _empty(_grouped_shape(a, b, offs, b.shape[-1]), out_dtype or a.dtype, a)


def mx_mm_meta(a, a_scale, b, b_scale, a_format, b_format, bias, out_dtype):
    return _empty((a.shape[0], b.shape[0]), out_dtype, a)


def mx_grouped_mm_meta(a, a_scale, b, b_scale, a_format, b_format, offs, bias, out_dtype):
    if b.dim() == 2:  # ragged K: (G, M, N)
        return _empty((offs.shape[0], a.shape[0], b.shape[0]), out_dtype, a)
    return _empty(_grouped_shape(a, b, offs, b.shape[-2]), out_dtype, a)


#: op name -> (triton_op, fake implementation)
OPS = {
    "gemm": (gemm, gemm_meta),
    "swiglu": (swiglu, swiglu_meta),
    "grouped_mm": (grouped_mm, grouped_mm_meta),
    "mx_mm": (mx_mm, mx_mm_meta),
    "mx_grouped_mm": (mx_grouped_mm, mx_grouped_mm_meta),
}


def _register_cpu_twins():
    """``flydsl::<op>_cpu``: opaque custom ops (fake impl: the metas above) running the real-
    tensor path; what a traced CPU call decomposes into (the module docstring says why)."""
    for name, (op, meta) in OPS.items():
        schema = str(op._opoverload._schema)
        schema = schema[schema.index("(") :]
        twin = custom_op(
            f"{NAMESPACE}::{name}_cpu",
            _eager_fn(op),
            mutates_args=(),
            schema=schema,
        )
        twin.register_fake(meta)
        # the triton_op's own fake impl is its body (trace-safe, but it generates Triton
        # source); shape-only metas keep fake propagation cheap
        op.register_fake(meta)


def _eager_fn(op):
    def fn(*args):
        return op._opoverload(*args)

    return fn


_register_cpu_twins()
