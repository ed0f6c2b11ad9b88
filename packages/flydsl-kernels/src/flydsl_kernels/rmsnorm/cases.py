"""Report cases of the RMSNorm family: the shipped kernels at model shapes (``FAMILY``).

Each case compiles its kernel through the plan (``model.model_launch``, ``TensorSpec``
operands), so the report shows what the API launches with the target's shipped config; its
``check`` runs the function API on fresh random inputs against ``reference.py``.
"""

from __future__ import annotations

import torch

from .. import registry
from .._target import check_device as _dev
from .._target import check_target as _check_target
from . import configs, reference
from .api import fused_add_rms_norm, rms_norm, rms_norm_backward
from .kernels import KERNELS
from .model import model_launch

#: (rtol, atol) of the function API against the PyTorch references, by input dtype: fp32 keeps
#: fp32 rounding (sums in a different order); 16-bit outputs are one rounding of a value that
#: matches to fp32 precision, so about one ulp of the output dtype
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float16: (2e-3, 2e-3),
}

_DNAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
#: rows the CPU check runs (the reference backend runs one program per Python loop iteration)
_CHECK_ROWS = 4


def _err(out, ref, dtype) -> float:
    rtol, atol = TOLERANCE[dtype]
    out, ref = out.double(), ref.double()
    return float(((out - ref).abs() / (atol + rtol * ref.abs())).max()) if out.numel() else 0.0


def _inputs(m, n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g).mul_(2).to(dtype).to(device)
    w = torch.randn(n, generator=g).to(dtype).to(device)
    r = torch.randn(m, n, generator=g).to(dtype).to(device)
    return x, w, r


def _size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _forward_case(m, n, dtype, mode=None):
    def cfg_of(target):
        return configs.select("fwd", n, dtype, m, target)

    kern = KERNELS[cfg_of(None).kernel]  # the kernel follows N and the dtype, not the target
    kw = {} if mode is None else {"llama_numerics": mode == 1, "gemma": mode == 2}

    def compile_(target):
        launch = model_launch(cfg_of(target), n, dtype, residual=mode is not None, mode=mode or 0)
        return launch.compile(target)

    def ours(x, w, r, target, config=None):
        if mode is None:
            return rms_norm(x, (n,), w, 1e-6, target=target, config=config)[0]
        return fused_add_rms_norm(x, r, w, 1e-6, target=target, config=config, **kw)[0]

    def theirs(x, w, r):
        if mode is None:
            return reference.rms_norm(x, (n,), w, 1e-6)[0]
        return reference.fused_add_rms_norm(x, r, w, 1e-6, **kw)[0]

    def check(device, target=None):
        rows = m if _dev(device) != "cpu" else min(m, _CHECK_ROWS)
        x, w, r = _inputs(rows, n, dtype, _dev(device), seed=1)
        # the CPU runs the target's config on the reference backend; a GPU its own table
        cfg = configs.select("fwd", n, dtype, rows, target) if _dev(device) == "cpu" else None
        return _err(ours(x, w, r, _check_target(device), cfg), theirs(x, w, r), dtype)

    def run(device):
        x, w, r = _inputs(m, n, dtype, device)
        return lambda: ours(x, w, r, None)

    def aten(device):
        x, w, r = _inputs(m, n, dtype, device)
        if mode is None:
            return lambda: torch.ops.aten._fused_rms_norm(x, [n], w, 1e-6)
        return lambda: theirs(x, w, r)  # eager PyTorch: the add, then the norm

    name = (
        "rmsnorm"
        if mode is None
        else ("fused add (aten)", "fused add (llama)", "fused add (gemma)")[mode]
    )
    variant = "" if mode is None else (" +res", " +res llama", " +res gemma")[mode]
    return registry.ReportCase(
        family="rmsnorm",
        kernel=kern.name,
        shape=f"{m}x{n} {_DNAME[dtype]}{variant}",
        config=lambda target: cfg_of(target).as_dict(),
        compile=compile_,
        check=check,
        run=run,
        aten=aten,
        notes=f"{name}; shipped default of the target's table (configs.py, static model), untimed",
        # read x (and the residual), write y (and the new residual), read the weight once
        bytes=float(_size(dtype) * (m * n * (2 if mode is None else 4) + n) + 4 * m),
    )


def _backward_case(m, n, dtype):
    def main_of(target):
        return configs.select("bwd", n, dtype, target=target)[-1]  # bwd_rows, or bwd_cols

    kern = KERNELS[main_of(None).kernel]

    def compile_(target):
        return model_launch(main_of(target), n, dtype).compile(target)

    def grads(device, rows, target):
        x, w, g = _inputs(rows, n, dtype, device, seed=2)
        return x, w, g, rms_norm(x, (n,), w, 1e-6, target=target)[1]

    def check(device, target=None):
        cpu = _dev(device) == "cpu"
        rows = m if not cpu else min(m, _CHECK_ROWS)
        x, w, g, rstd = grads(_dev(device), rows, _check_target(device))
        bwd = configs.select("bwd", n, dtype, target=target)
        cfgs = (*bwd, configs.select("dw_reduce", n, dtype, target=target))
        dx, dw = rms_norm_backward(
            g,
            x,
            rstd,
            w,
            deterministic=True,
            target=_check_target(device),
            config=cfgs if cpu else None,
        )
        dxr, dwr = reference.rms_norm_backward(g, x, w, 1e-6)
        # dweight sums `rows` products: its rounding grows with them (fp32 accumulation)
        return max(_err(dx, dxr, dtype), _err(dw, dwr, dtype) / max(1.0, rows / 64))

    def run(device):
        x, w, g, rstd = grads(device, m, None)
        return lambda: rms_norm_backward(g, x, rstd, w, deterministic=True)

    def aten(device):
        x, w, g, rstd = grads(device, m, None)
        return lambda: torch.ops.aten._fused_rms_norm_backward(g, x, [n], rstd, w, [True, True])

    return registry.ReportCase(
        family="rmsnorm",
        kernel=kern.name,
        shape=f"{m}x{n} {_DNAME[dtype]}",
        config=lambda target: {
            "kernels": [c.as_dict() for c in configs.select("bwd", n, dtype, target=target)],
            "dw_reduce": configs.select("dw_reduce", n, dtype, target=target).as_dict(),
        },
        compile=compile_,
        check=check,
        run=run,
        aten=aten,
        notes="backward, deterministic dweight; static-model defaults, untimed",
        # read grad_y, x, the weight and rstd; write dx and dweight
        bytes=float(_size(dtype) * (3 * m * n + 2 * n) + 4 * m),
    )


#: the report's cases: model shapes from ../shared/reference/gfx950.md, one or more per variant
FORWARD_CASES = (
    (65536, 128, torch.bfloat16),  # per-head QK norm (Qwen3, head dim 128): fwd_rows
    (4096, 2880, torch.bfloat16),  # gpt-oss hidden (not a power of two): fwd_row
    (4096, 4096, torch.bfloat16),  # Llama-3.1-8B hidden: fwd_row
    (4096, 7168, torch.bfloat16),  # DeepSeek-V3 hidden: fwd_row
    (4096, 8192, torch.bfloat16),  # Llama-3.3-70B hidden: fwd_row
    (4096, 4096, torch.float16),
    (4096, 4096, torch.float32),
    (2048, 65536, torch.bfloat16),  # a long row: fwd_looped
    (2048, 65536, torch.float32),
)
FUSED_CASES = (
    (4096, 4096, torch.bfloat16, 1),
    (4096, 2304, torch.bfloat16, 2),
    (4096, 5120, torch.bfloat16, 0),
)
BACKWARD_CASES = (
    (4096, 4096, torch.bfloat16),
    (4096, 8192, torch.float32),
    (512, 65536, torch.bfloat16),
)


def _cases():
    for m, n, d in FORWARD_CASES:
        yield _forward_case(m, n, d)
    for m, n, d, mode in FUSED_CASES:
        yield _forward_case(m, n, d, mode)
    for m, n, d in BACKWARD_CASES:
        yield _backward_case(m, n, d)


FAMILY = registry.Family(
    "rmsnorm",
    _cases,
    description="RMSNorm forward (aten::_fused_rms_norm), backward, fused residual add",
    tags=("norm", "memory-bound"),
)
