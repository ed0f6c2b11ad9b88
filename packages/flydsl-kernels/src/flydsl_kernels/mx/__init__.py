"""The MX (OCP Microscaling v1.0) family: quantization, the block-scaled GEMM and its grouped form.

    from flydsl_kernels.mx import to_mx, from_mx, mx_gemm, mx_grouped_mm

    q, s = to_mx(x, torch.float8_e4m3fn)          # or torch.float8_e5m2, torch.float4_e2m1fn_x2
    x2 = from_mx(q, s, torch.float8_e4m3fn)       # fp32 (or out_dtype=bf16 / fp16)
    c = mx_gemm(aq, sa, wq, sw, "e4m3", "e2m1", bias=None, out_dtype=torch.bfloat16)  # a8w4, NT
    y = mx_grouped_mm(xq, sx, wq3, sw3, "e4m3", "e4m3", offs)  # MoE forward: (G, N, K) experts

Kernels (kernels.py): ``mx_quantize`` (integer bit manipulation on the fp32
bits; one program per row chunk of 32-blocks), ``mx_dequantize`` (the same
tiling; elements and scales decoded and the product rounded to fp32 / bf16 /
fp16 with integer ops), ``mx_gemm_nt`` (tiles with ``fly.dot_scaled`` in a K
loop: the native scaled MFMA on gfx950) and ``mx_grouped_gemm_nt`` (the same
K loop in one persistent launch over all groups' tiles, ``torch._grouped_mm``
forms). The semantics are pinned by reference.py (the spec, in float64 PyTorch).

Parts (the layout every family shares; docs/architecture.md): ``kernels``, ``plan`` (the
operands of a problem -> the launch), ``configs`` (the kernels' configs, per-target tables
``TABLES``, ``select`` and ``m_choice``), ``model`` (config spaces, the static model and the
compile helpers), ``api``, ``reference``, the report cases (``cases``), plus
``formats`` (the element formats) and ``baseline`` (what PyTorch offers, the report's baseline).
"""

from __future__ import annotations

from . import baseline, configs, model, plan, reference
from .api import from_mx, mx_gemm, mx_grouped_mm, to_mx
from .cases import FAMILY
from .formats import BLOCK, SCALE_DTYPE, elem_format
from .kernels import KERNELS

__all__ = [
    "BLOCK",
    "FAMILY",
    "KERNELS",
    "SCALE_DTYPE",
    "baseline",
    "configs",
    "elem_format",
    "from_mx",
    "model",
    "mx_gemm",
    "mx_grouped_mm",
    "plan",
    "reference",
    "to_mx",
]
