"""Report cases of the MX family (``FAMILY``): quantization, dequantization, the GEMM and the
grouped GEMM at model shapes.

Each case compiles its kernel through the plan (``model.compile_*`` build ``plan.py``'s
launches on ``TensorSpec`` operands), so the report shows what the API launches with the
target's shipped config; ``check`` runs the function API on fresh random inputs against
``reference.py``.
"""

from __future__ import annotations

import torch

from .. import registry
from .._target import check_device as _dev
from .._target import check_target as _check_target
from ..registry import gen
from . import baseline, configs, reference
from .api import from_mx, mx_gemm, mx_grouped_mm, to_mx
from .formats import BLOCK, SCALE_DTYPE, elem_format
from .kernels import KERNELS
from .model import compile_dequant, compile_gemm, compile_grouped, compile_quant

_TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2}
_NAME = {"e4m3": "mxfp8", "e5m2": "mxfp8 e5m2", "e2m1": "mxfp4"}
#: (M, K) of the CPU checks: the reference backend runs one program per Python loop iteration
_CHECK_QUANT = (4, 256)
_CHECK_GEMM = (5, 48, 256)
#: (rows, experts, N, K) of the grouped CPU check
_CHECK_GROUPED = (24, 5, 40, 160)


def _randn(shape, device, seed):
    return torch.randn(*shape, generator=gen(device, seed), device=device)


def _emulated(target) -> str | None:
    """Why ``target`` runs the MX GEMMs only by emulation (None where it has MX MMA)."""
    from flydsl_core.targets import get_target

    tg = get_target(target)
    if not tg.is_gpu or tg.supports_native_mx:
        return None
    return f"emulated: {tg.name} has no MX matrix instructions (Triton upcasts to bf16 MMA)"


def _quant_case(m, k, fmt, in_dtype=torch.bfloat16):
    elem = _TORCH[fmt]

    def check(device, target=None):
        x = _randn(_CHECK_QUANT, _dev(device), 1).mul_(4).to(in_dtype)
        cfg = (
            configs.select("quant", *_CHECK_QUANT, target=target) if _dev(device) == "cpu" else None
        )
        q, s = to_mx(x, elem, target=_check_target(device), config=cfg)
        rq, rs = reference.to_mx(x.cpu(), elem)
        # bit-exact semantics: any differing byte is a failure (error 2), else 0
        same = torch.equal(q.view(torch.uint8).cpu(), rq.view(torch.uint8)) and torch.equal(
            s.view(torch.uint8).cpu(), rs.view(torch.uint8)
        )
        return 0.0 if same else 2.0

    def run(device):
        x = _randn((m, k), device, 0).to(in_dtype)
        return lambda: to_mx(x, elem)

    return registry.ReportCase(
        family="mx",
        kernel=KERNELS["quantize"].name,
        shape=f"{m}x{k} bf16 -> {_NAME[fmt]}",
        config=lambda target: configs.select("quant", m, k, target=target).as_dict(),
        compile=lambda target: compile_quant(m, k, fmt, target=target),
        check=check,
        run=run,
        notes="OCP MX v1.0 quantization (E8M0 scale per 32), bit-exact vs reference.py; untimed",
        bytes=m * k * 2 + m * k / elem_format(fmt).per_byte + m * k / 32,
    )


def _dequant_case(m, k, fmt, out_dtype=torch.bfloat16):
    elem = _TORCH[fmt]
    fmt_ = elem_format(fmt)
    oname = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[out_dtype]

    def operands(shape, device, seed):
        mm, kk = shape
        g = torch.Generator().manual_seed(seed)
        q = torch.randint(0, 256, (mm, kk // fmt_.per_byte), generator=g, dtype=torch.uint8)
        s = torch.randint(0, 256, (mm, kk // BLOCK), generator=g, dtype=torch.uint8)
        return q.view(elem).to(device), s.view(SCALE_DTYPE).to(device)

    def check(device, target=None):
        # random bytes: every element code and scale, NaN / Inf and subnormal results among them
        q, s = operands(_CHECK_QUANT, _dev(device), 3)
        cfg = (
            configs.select("dequant", *_CHECK_QUANT, target=target)
            if _dev(device) == "cpu"
            else None
        )
        got = from_mx(q, s, elem, out_dtype=out_dtype, target=_check_target(device), config=cfg)
        want = reference.from_mx(q.cpu(), s.cpu(), elem, out_dtype=out_dtype)
        return 2.0 if reference.mismatches(got.cpu(), want).any() else 0.0

    def run(device):
        q, s = operands((m, k), device, 0)
        return lambda: from_mx(q, s, elem, out_dtype=out_dtype)

    return registry.ReportCase(
        family="mx",
        kernel=KERNELS["dequantize"].name,
        shape=f"{m}x{k} {_NAME[fmt]} -> {oname}",
        config=lambda target: configs.select("dequant", m, k, target=target).as_dict(),
        compile=lambda target: compile_dequant(m, k, fmt, out_dtype=oname, target=target),
        check=check,
        run=run,
        notes="OCP MX v1.0 dequantization, bit-exact vs reference.py; untimed",
        bytes=m * k / fmt_.per_byte
        + m * k / 32
        + m * k * torch.empty((), dtype=out_dtype).element_size(),
    )


def _mx_operands(a_shape, w_shape, fa, fb, device, seed):
    """``(a_q, a_scale, w_q, w_scale)`` of random activations and 0.05-scaled weights."""
    a = _randn(a_shape, device, seed)
    w = _randn(w_shape, device, seed + 1).mul_(0.05)
    return (
        *to_mx(a, _TORCH[fa], target="cpu-reference" if a.is_cpu else None),
        *to_mx(w, _TORCH[fb], target="cpu-reference" if w.is_cpu else None),
    )


def _check_error(got, want):
    """One bf16 rounding of an fp32 sum that matches to fp32 precision: error <= 1 passes."""
    want = want.to(got.device)
    tol = 2**-8 * want.abs() + 1e-2 * float(want.abs().max())
    return float(((got.float() - want).abs() / tol).max()) if want.numel() else 0.0


def _gemm_case(m, n, k, fa, fb):
    def cfg_of(target):
        return configs.select("gemm", m, n, k, fa, fb, target=target)

    def operands(shape, device, seed):
        mm, nn, kk = shape
        return _mx_operands((mm, kk), (nn, kk), fa, fb, device, seed)

    def check(device, target=None):
        ops = operands(_CHECK_GEMM, _dev(device), 2)
        cfg = cfg_of(target) if _dev(device) == "cpu" else None
        got = mx_gemm(
            *ops, fa, fb, out_dtype=torch.bfloat16, target=_check_target(device), config=cfg
        )
        want = reference.mx_gemm(*(t.cpu() for t in ops), fa, fb, out_dtype=torch.float32)
        return _check_error(got, want)

    def run(device):
        ops = operands((m, n, k), device, 0)
        return lambda: mx_gemm(*ops, fa, fb)

    def aten(device):
        kind = baseline.choose(_dev(device), fa, fb)
        return baseline.thunk(kind, *operands((m, n, k), device, 0), fa, fb)

    return registry.ReportCase(
        family="mx",
        kernel=KERNELS["gemm"].name,
        shape=f"{m}x{n}x{k} {_NAME[fa]} x {_NAME[fb]} (NT)",
        config=lambda target: cfg_of(target).as_dict(),
        compile=lambda target: compile_gemm(m, n, k, fa, fb, cfg=cfg_of(target), target=target),
        emulated=_emulated,
        flops=2.0 * m * n * k,
        bytes=(m / elem_format(fa).per_byte + n / elem_format(fb).per_byte + (m + n) / 32) * k
        + 2 * m * n,
        check=check,
        run=run,
        aten=aten,
        baseline=lambda device: baseline.NAMES[baseline.choose(_dev(device), fa, fb)],
        notes="MX GEMM (fly.dot_scaled, fp32 accumulation, bf16 out); baseline "
        "torch._scaled_mm where the device has MX MMA, else torch dequant + bf16 matmul "
        "(mx/baseline.py); untimed defaults",
    )


def _grouped_case(tokens, top, experts, n, k, fa, fb, model):
    rows = tokens * top

    def cfg_of(target):
        return configs.select("grouped", max(1, rows // experts), n, k, fa, fb, target=target)

    def inputs(device, rows, experts, nn, kk, seed):
        ops = _mx_operands((rows, kk), (experts, nn, kk), fa, fb, device, seed)
        # ragged routing: expert sizes from a seeded multinomial, some empty
        g = gen(device, seed)
        counts = torch.randint(0, experts, (rows,), generator=g, device=device)
        return ops, torch.bincount(counts, minlength=experts).cumsum(0).to(torch.int32)

    def check(device, target=None):
        cpu = _dev(device) == "cpu"
        shape = _CHECK_GROUPED if cpu else (rows, experts, n, k)
        ops, offs = inputs(_dev(device), *shape, seed=3)
        got = mx_grouped_mm(
            *ops,
            fa,
            fb,
            offs,
            out_dtype=torch.bfloat16,
            target=_check_target(device),
            config=cfg_of(target) if cpu else None,
        )
        # the reference where the operands are: float64 on the GPU at the case's full shape
        want = reference.mx_grouped_mm(*ops, fa, fb, offs, out_dtype=torch.float32)
        return _check_error(got, want)

    def run(device):
        ops, offs = inputs(device, rows, experts, n, k, seed=0)
        return lambda: mx_grouped_mm(*ops, fa, fb, offs)

    def aten(device):
        # no ATen MX grouped GEMM: bf16 torch._grouped_mm of the dequantized operands
        (aq, sa, wq, sw), offs = inputs(device, rows, experts, n, k, seed=0)
        ad = from_mx(aq, sa, _TORCH[fa], out_dtype=torch.bfloat16)
        wd = from_mx(wq, sw, _TORCH[fb], out_dtype=torch.bfloat16).transpose(1, 2)
        return lambda: torch._grouped_mm(ad, wd, offs)

    return registry.ReportCase(
        family="mx",
        kernel=KERNELS["grouped"].name,
        shape=f"{tokens} tokens x top-{top} of {experts} experts, N={n} K={k} "
        f"{_NAME[fa]} x {_NAME[fb]} (NT)",
        config=lambda target: {**cfg_of(target).as_dict(), "kernel": "grouped"},
        compile=lambda target: compile_grouped(
            rows, experts, n, k, fa, fb, cfg=cfg_of(target), target=target
        ),
        emulated=_emulated,
        flops=2.0 * rows * n * k,
        bytes=(rows / elem_format(fa).per_byte + experts * n / elem_format(fb).per_byte) * k
        + (rows + experts * n) * k / 32
        + 2 * rows * n,
        check=check,
        run=run,
        aten=aten,
        baseline=lambda device: "dequant + bf16 torch._grouped_mm",
        notes=f"{model}; persistent MX grouped GEMM, ragged M (MoE forward); "
        "static-model default (cross-compiled), untimed",
    )


#: MX shapes (M, N, K) from ../shared/reference/gfx950.md's models: Llama-3.1-8B projections
GEMM_CASES = (
    (32, 4096, 4096, "e4m3", "e4m3"),
    (32, 14336, 4096, "e4m3", "e4m3"),
    (32, 4096, 4096, "e2m1", "e2m1"),
    (32, 14336, 4096, "e2m1", "e2m1"),
    (32, 14336, 4096, "e4m3", "e2m1"),  # a8w4
    (1024, 8192, 8192, "e2m1", "e2m1"),
)
#: MoE expert GEMMs (tokens, top-k, experts, N, K, formats, model) from gfx950.md: Qwen3-30B-A3B
#: (hidden 2048, moe_intermediate 768: gate+up N = 1536, down K = 768) and gpt-oss-120b (hidden
#: = intermediate = 2880, MXFP4 experts), decode and prefill token counts
GROUPED_CASES = (
    (64, 8, 128, 1536, 2048, "e4m3", "e4m3", "Qwen3-30B-A3B gate_up"),
    (4096, 8, 128, 1536, 2048, "e4m3", "e4m3", "Qwen3-30B-A3B gate_up"),
    (4096, 8, 128, 2048, 768, "e4m3", "e4m3", "Qwen3-30B-A3B down"),
    (64, 4, 128, 5760, 2880, "e2m1", "e2m1", "gpt-oss-120b gate_up"),
    (4096, 4, 128, 5760, 2880, "e4m3", "e2m1", "gpt-oss-120b gate_up"),  # a8w4
)
QUANT_CASES = ((32, 4096, "e4m3"), (32, 4096, "e2m1"), (8192, 4096, "e4m3"), (8192, 4096, "e2m1"))
DEQUANT_CASES = ((8192, 4096, "e4m3"), (8192, 4096, "e2m1"))


def _cases():
    for m, k, f in QUANT_CASES:
        yield _quant_case(m, k, f)
    for m, k, f in DEQUANT_CASES:
        yield _dequant_case(m, k, f)
    for m, n, k, fa, fb in GEMM_CASES:
        yield _gemm_case(m, n, k, fa, fb)
    for case in GROUPED_CASES:
        yield _grouped_case(*case)


FAMILY = registry.Family(
    "mx",
    _cases,
    description="OCP MX quantization (mxfp8 / mxfp4), the block-scaled MX GEMM and its grouped (MoE) form",
    tags=("quantization", "gemm", "mx"),
)
