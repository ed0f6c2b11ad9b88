"""The dtypes each kernel family's API takes, in one module that imports only torch.

Each family's ``api`` takes its ``SUPPORTED_DTYPES`` (and the like) from here, and
torch-flydsl reads the same tuples to decide eligibility: importing this module imports no
family (importing ``torch_flydsl`` must compile and import no kernel; a family is imported on
the first eligible call). Order matters only for display: the first dtype is the one a
family's report and calibration list first.
"""

from __future__ import annotations

import torch

__all__ = [
    "ATTENTION",
    "ATTENTION_MAX_HEAD_DIM",
    "GEMM",
    "GEMM_OUT",
    "MX_INPUTS",
    "MX_OUT",
    "RMSNORM",
    "TOPK",
]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)

#: RMSNorm's x / weight dtypes (fp32 included: the kernel computes in fp32)
RMSNORM = _FLOATS
#: TopK's (and the MoE router's) input dtypes; 16-bit floats rank on their own 16 bits
TOPK = _FLOATS
#: dense and grouped GEMM operands (a and b share one)
GEMM = (torch.bfloat16, torch.float16)
#: dense and grouped GEMM outputs (``out_dtype``)
GEMM_OUT = (torch.bfloat16, torch.float16, torch.float32)
#: ``to_mx``'s inputs
MX_INPUTS = _FLOATS
#: ``from_mx``'s and the MX GEMMs' outputs
MX_OUT = (torch.bfloat16, torch.float16, torch.float32)
#: attention's q, k, v (bf16 / fp16 as flash-attn; fp32 for flex_attention's inputs)
ATTENTION = (torch.bfloat16, torch.float16, torch.float32)
#: the largest head dim of attention's q / k and of v
ATTENTION_MAX_HEAD_DIM = 256
