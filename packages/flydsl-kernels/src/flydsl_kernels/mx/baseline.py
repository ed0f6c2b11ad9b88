"""What PyTorch offers for an MX GEMM: the baseline of the report and tools/bench_gemm.py.

* ``scaled_mm``: ``torch._scaled_mm`` with E8M0 1x32 block scales, where the device has
  block-scaled MMA and torch exposes it: NVIDIA sm_100+ (cuBLAS, the scales in its
  swizzled 128x4 layout) and AMD gfx950 (hipBLASLt, the scales as they are). Both
  operands must be fp8 or both fp4. Not on sm_90 (H100 / H200) or the CPU.
* ``dequant_matmul``: dequantize both operands with torch ops to bf16 (exact: an MX
  element times its power-of-two scale is a bf16 value unless it under- or overflows)
  and ``torch.matmul`` in bf16.

``choose(device, fa, fb)`` picks one; on a device that should take ``_scaled_mm`` one
small probe call decides, and a torch error there falls back (logged) to
``dequant_matmul``, so the row names what it really times. ``NAMES`` are the labels.
"""

from __future__ import annotations

import functools
import logging

import torch

from flydsl_core import cdiv

from .formats import BLOCK, E2M1_VALUES, elem_bytes, elem_format, scale_bytes

log = logging.getLogger(__name__)

NAMES = {
    "scaled_mm": "torch._scaled_mm (MX e8m0)",
    "dequant_matmul": "torch dequant + bf16 matmul",
}


def dequant_bf16(q: torch.Tensor, s: torch.Tensor, fmt) -> torch.Tensor:
    """``q * 2^(s - 127)`` in bf16 with torch ops (fp8 by its own conversion, fp4 by table)."""
    fmt = elem_format(fmt)
    u = elem_bytes(q, fmt)
    if fmt.per_byte == 1:
        v = u.view(fmt.torch_dtype).to(torch.bfloat16)
    else:
        table = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16, device=u.device)
        table = torch.cat([table, -table])  # the sign is bit 3 of each nibble
        nib = torch.stack([u & 0xF, u >> 4], dim=-1).flatten(-2)
        v = table[nib.long()]
    sc = scale_bytes(s).view(torch.float8_e8m0fnu).to(torch.bfloat16)
    return v * sc.repeat_interleave(BLOCK, dim=-1)


def cublas_blocked_scales(s: torch.Tensor) -> torch.Tensor:
    """``(rows, K/32)`` E8M0 scales in cuBLAS's block-scaling layout (flat): 128 x 4 tiles,
    zero-padded, each stored as 32 rows of ``(row % 32)`` holding 4 x 4 bytes of rows
    ``row % 32 + 32 j`` (cuBLAS documentation, "1D block scaling factors layout")."""
    rows, cols = s.shape
    rt, ct = cdiv(rows, 128), cdiv(cols, 4)
    padded = torch.zeros(rt * 128, ct * 4, dtype=torch.uint8, device=s.device)
    padded[:rows, :cols] = scale_bytes(s)
    blocks = padded.view(rt, 4, 32, ct, 4).permute(0, 3, 2, 1, 4)
    return blocks.flatten().view(torch.float8_e8m0fnu)


def _scaled_mm_expected(device, fa: str, fb: str) -> bool:
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False
    if (fa == "e2m1") != (fb == "e2m1"):
        return False  # one element kind for both operands
    from flydsl_core.targets import device_arch

    arch = device_arch(dev.index) or ""  # the one arch probe: "gfx950", "sm100", ...
    if arch.startswith("gfx"):
        return arch == "gfx950"
    return arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= 100


def thunk(kind, a_q, a_scale, b_q, b_scale, fa, fb, out_dtype=torch.bfloat16):
    """A callable computing ``dequant(a) @ dequant(b).T`` the ``kind`` way (see the doc)."""
    if kind == "dequant_matmul":
        return lambda: torch.matmul(
            dequant_bf16(a_q, a_scale, fa), dequant_bf16(b_q, b_scale, fb).T
        ).to(out_dtype)
    if kind != "scaled_mm":
        raise ValueError(f"unknown MX GEMM baseline {kind!r}; known: {sorted(NAMES)}")
    a, b = (
        elem_bytes(t, elem_format(f)).view(elem_format(f).torch_dtype)
        for t, f in ((a_q, fa), (b_q, fb))
    )
    if torch.version.hip:  # hipBLASLt takes the (rows, K/32) scales as they are
        sa, sb = (scale_bytes(t).view(torch.float8_e8m0fnu) for t in (a_scale, b_scale))
    else:
        sa, sb = cublas_blocked_scales(a_scale), cublas_blocked_scales(b_scale)
    return lambda: torch._scaled_mm(a, b.T, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


@functools.cache
def choose(device: str, fa: str, fb: str) -> str:
    """The baseline kind on ``device`` for these formats (see the module doc)."""
    if not _scaled_mm_expected(device, fa, fb):
        return "dequant_matmul"
    m, n, k = 128, 128, 256
    g = torch.Generator().manual_seed(0)

    def operand(rows, fmt):
        q = torch.randint(0, 127, (rows, k // elem_format(fmt).per_byte), generator=g)
        s = torch.full((rows, k // BLOCK), 127)
        return q.to(torch.uint8).to(device), s.to(torch.uint8).to(device)

    try:
        thunk("scaled_mm", *operand(m, fa), *operand(n, fb), fa, fb)()
    except (RuntimeError, NotImplementedError) as e:
        log.warning(
            "torch._scaled_mm refuses MX %s x %s on %s (%s); baseline: %s",
            fa,
            fb,
            device,
            e,
            NAMES["dequant_matmul"],
        )
        return "dequant_matmul"
    return "scaled_mm"
