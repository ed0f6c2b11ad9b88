"""MX quantization (bit-exact vs the spec reference) and the MX GEMM, on the CPU targets."""

from __future__ import annotations

import pytest
import torch

from flydsl_kernels.mx import from_mx, mx_gemm, reference, to_mx
from flydsl_kernels.mx.configs import GemmConfig
from flydsl_kernels.mx.formats import E2M1_VALUES, elem_format

TARGETS = ("cpu-reference", "cpu-interpret")
ELEMS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2)
FP4 = torch.float4_e2m1fn_x2


def _grid(fmt) -> torch.Tensor:
    """Every non-negative finite element value of ``fmt``, ascending (float64)."""
    if fmt.per_byte == 2:
        return torch.tensor(E2M1_VALUES, dtype=torch.float64)
    v = torch.arange(0, fmt.max_bits + 1, dtype=torch.uint8).view(fmt.torch_dtype).double()
    return v


def hard_inputs(m: int, k: int, elem, seed: int = 0) -> torch.Tensor:
    """Random blocks with per-block magnitudes over a wide range, plus blocks of edge cases."""
    fmt = elem_format(elem)
    g = torch.Generator().manual_seed(seed)
    nb = k // 32
    x = torch.randn(m, nb, 32, generator=g, dtype=torch.float64)
    x *= torch.pow(2.0, torch.randint(-40, 40, (m, nb, 1), generator=g).double())
    flat = x.view(-1, 32)
    special = [
        torch.zeros(32),  # all zeros
        torch.full((32,), 1e-40),  # fp32 subnormals only
        torch.randn(32, generator=g) * 1e-39,  # mixed-sign subnormals
    ]
    # ties: amax 2^emax * 2^s puts the scale at 2^s; then every midpoint of the element grid
    grid = _grid(fmt)
    mids = (grid[:-1] + grid[1:]) / 2
    for s in (0, -5, 7):
        blk = torch.zeros(32, dtype=torch.float64)
        blk[0] = 2.0**fmt.emax
        blk[1 : 1 + min(31, len(mids))] = mids[-31:] if len(mids) > 31 else mids
        blk[1::2] *= -1
        special.append(blk * 2.0**s)
    # saturation edge: just below / at / above the largest finite value and its rounding midpoint
    edge = torch.tensor([fmt.max_value, fmt.max_value * (1 + 2.0 ** -(fmt.mbits + 2))])
    blk = torch.linspace(1, 2 ** (fmt.emax + 1) - 1e-3, 32, dtype=torch.float64)
    blk[:2] = edge
    special.append(blk)
    special.append(-blk)
    # NaN and +-Inf inside otherwise ordinary blocks, and -0
    for bad in (float("nan"), float("inf"), float("-inf")):
        blk = torch.randn(32, generator=g, dtype=torch.float64)
        blk[7] = bad
        special.append(blk)
    blk = torch.randn(32, generator=g, dtype=torch.float64) * 1e-3
    blk[3] = -0.0
    special.append(blk)
    rows = torch.randperm(flat.shape[0], generator=g)[: len(special)]
    for r, blk in zip(rows.tolist(), special):
        flat[r] = blk.double()
    return x.view(m, k).float()


def _bytes(t):
    return t.view(torch.uint8)


def assert_same_bits(got, want):
    (gq, gs), (wq, ws) = got, want
    assert gq.dtype == wq.dtype and gs.dtype == ws.dtype
    assert gq.shape == wq.shape and gs.shape == ws.shape
    bad = (_bytes(gs) != _bytes(ws)).nonzero()
    assert bad.numel() == 0, f"scales differ at {bad[:4].tolist()}"
    bad = (_bytes(gq) != _bytes(wq)).nonzero()
    assert bad.numel() == 0, (
        f"elements differ at {bad[:4].tolist()}: got {_bytes(gq)[tuple(bad[0])]:#x}, "
        f"want {_bytes(wq)[tuple(bad[0])]:#x}"
    )


# -- the reference against independent facts ---------------------------------------------------


@pytest.mark.parametrize("elem", ELEMS[:2])
def test_reference_fp8_matches_torch_conversion(elem):
    """Finite blocks: the reference's bits are torch's RNE cast of clamp(x / 2^X)."""
    fmt = elem_format(elem)
    x = hard_inputs(8, 256, elem, seed=3)
    q, s = reference.to_mx(x, elem)
    sc = reference.decode_scales(s).repeat_interleave(32, dim=-1)
    ok = torch.isfinite(sc)
    v = (x.double() / sc).clamp(-fmt.max_value, fmt.max_value).float()
    want = v.to(elem).view(torch.uint8)
    assert torch.equal(_bytes(q)[ok], want[ok])
    assert (~ok).any() and (_bytes(q)[~ok] == 0).all()  # NaN-scale blocks store +0 elements


def test_reference_scale_rule():
    """X = floor(log2 amax) - emax, clamped; zeros take 2^-127; NaN / Inf take 0xFF."""
    x = torch.zeros(1, 6 * 32)
    x[0, 0] = 448.0  # floor(log2 448) = 8 -> e4m3 X = 0 -> 127
    x[0, 32] = 0.5  # -1 - 8 -> 118
    x[0, 64 + 5] = float("nan")
    x[0, 96 + 9] = float("-inf")
    x[0, 128] = 2.0**127  # 127 - 8 -> 246
    # block 5 stays zero -> 0
    _, s = reference.to_mx(x, torch.float8_e4m3fn)
    assert _bytes(s).tolist() == [[127, 118, 255, 255, 246, 0]]
    _, s = reference.to_mx(x, FP4)
    assert _bytes(s).tolist() == [[133, 124, 255, 255, 252, 0]]


def test_reference_fp4_ties_and_packing():
    x = torch.zeros(1, 32)
    x[0, 0] = 4.0  # amax 4 -> X = 0
    x[0, 1:9] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25])
    x[0, 9] = 7.0  # saturates to 6
    q, s = reference.to_mx(x, FP4)
    assert _bytes(s).item() == 127
    nib = [(b >> (4 * h)) & 0xF for b in _bytes(q)[0].tolist() for h in (0, 1)]
    # 4->0x6; .25->0 (even); .75->1.0 (0x2); 1.25->1.0; 1.75->2.0 (0x4); 2.5->2 (0x4); 3.5->4 (0x6);
    # 5->4 (0x6); -.25 -> -0 (0x8); 7 -> 6 (0x7)
    assert nib[:10] == [0x6, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0x7]
    assert nib[10:] == [0] * 22


# -- the FlyDSL quantizer: bit-exact against the reference ----------------------------------------

SHAPES = ((3, 32), (5, 64), (4, 96), (2, 4096), (1, 4096), (1, 96))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("elem", ELEMS, ids=("e4m3", "e5m2", "e2m1"))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_to_mx_bit_exact(shape, elem, target):
    x = hard_inputs(*shape, elem, seed=shape[0] * 131 + shape[1])
    assert_same_bits(to_mx(x, elem, target=target), reference.to_mx(x, elem))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_to_mx_16bit_inputs_and_leading_dims(dtype, target):
    x = (hard_inputs(6, 64, "e4m3", seed=7).clamp(-6e4, 6e4)).to(dtype).view(2, 3, 64)
    for elem in (torch.float8_e4m3fn, FP4):
        got = to_mx(x, elem, target=target)
        assert got[0].shape == ((2, 3, 64) if elem != FP4 else (2, 3, 32))
        assert got[1].shape == (2, 3, 2) and got[1].dtype == torch.float8_e8m0fnu
        assert_same_bits(got, reference.to_mx(x, elem))


@pytest.mark.parametrize("shape", ((2, 0), (0, 64), (2, 0, 32)), ids=str)
def test_to_mx_empty(shape):
    for elem in ELEMS:
        x = torch.randn(*shape)
        assert_same_bits(to_mx(x, elem, target="cpu-reference"), reference.to_mx(x, elem))


def test_to_mx_rejects_what_it_does_not_support():
    with pytest.raises(ValueError, match="multiple of the block 32"):
        to_mx(torch.randn(2, 48), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="block size 16 is not supported"):
        to_mx(torch.randn(2, 64), torch.float8_e4m3fn, block=16)
    with pytest.raises(ValueError, match="unsupported MX element format"):
        to_mx(torch.randn(2, 64), torch.int8)
    with pytest.raises(ValueError, match="fp32, bf16 and fp16"):
        to_mx(torch.randn(2, 64).double(), torch.float8_e4m3fn)


@pytest.mark.parametrize("elem", ELEMS, ids=("e4m3", "e5m2", "e2m1"))
def test_round_trip_within_element_precision(elem):
    fmt = elem_format(elem)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(5)) * 3
    q, s = to_mx(x, elem)
    y = from_mx(q, s, elem)
    sc = reference.decode_scales(s).repeat_interleave(32, dim=-1)
    a = x.double().abs()
    # half an ulp relative, half the smallest subnormal step at the block scale, or the clip
    bound = a * 2.0 ** -(fmt.mbits + 1) + sc * 2.0 ** (-fmt.bias - fmt.mbits)
    bound = torch.maximum(bound, a - fmt.max_value * sc)
    assert ((y.double() - x.double()).abs() <= bound * (1 + 1e-12)).all()
    assert from_mx(q, s, elem, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    # a NaN scale decodes its whole block as NaN
    s2 = s.view(torch.uint8).clone()
    s2[0, 0] = 0xFF
    assert torch.isnan(from_mx(q, s2, elem)[0, :32]).all()


# -- the FlyDSL dequantizer: bit-exact against the reference -----------------------------------

OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def dequant_inputs(m: int, k: int, elem, seed: int = 0):
    """Random element and scale bytes (every code, NaN / Inf elements and 0xFF scales among
    them), with a row of edge cases when there is room: every element code under the extreme
    scales, blocks of zeros and -0."""
    fmt = elem_format(elem)
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (m, k // fmt.per_byte), generator=g, dtype=torch.uint8)
    s = torch.randint(0, 256, (m, k // 32), generator=g, dtype=torch.uint8)
    if m and k:
        edge = torch.tensor([0, 1, 2, 0xFE, 0xFF, 127, 127 - 16, 127 + 16], dtype=torch.uint8)
        s[0, : min(k // 32, 8)] = edge[: k // 32]
        codes = torch.arange(0, 256 if fmt.per_byte == 1 else 16, dtype=torch.uint8)
        if fmt.per_byte == 2:
            codes = codes[0::2] | (codes[1::2] << 4)
        row = q[0].view(-1)
        row[: min(len(row), len(codes))] = codes[: len(row)]
        if k >= 64:
            q[-1, : 32 // fmt.per_byte] = 0  # a block of zeros ...
            q[-1, 32 // fmt.per_byte : 64 // fmt.per_byte] = 0x80 if fmt.per_byte == 1 else 0x88
    return q.view(elem), s.view(torch.float8_e8m0fnu)


def assert_same_values(got, want):
    """Same dtype, shape and bits, except that NaNs need only sit at the same places."""
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = reference.mismatches(got, want).nonzero()
    assert bad.numel() == 0, (
        f"values differ at {bad[:4].tolist()}: got {got[tuple(bad[0])].item()!r}, "
        f"want {want[tuple(bad[0])].item()!r}"
    )


DEQUANT_SHAPES = ((1, 32), (3, 96), (5, 256), (2, 4096), (2, 3104), (0, 64), (2, 0))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=("fp32", "bf16", "fp16"))
@pytest.mark.parametrize("elem", ELEMS, ids=("e4m3", "e5m2", "e2m1"))
@pytest.mark.parametrize("shape", DEQUANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_from_mx_bit_exact(shape, elem, out_dtype, target):
    q, s = dequant_inputs(*shape, elem, seed=shape[0] * 7 + shape[1])
    got = from_mx(q, s, elem, out_dtype=out_dtype, target=target)
    want = reference.from_mx(q, s, elem, out_dtype=out_dtype)
    assert_same_values(got, want)
    if shape[0] and shape[1] >= 256:
        # the bytes reach what the test is about: NaN, Inf and subnormal results
        tiny = (want != 0) & (want.abs() < torch.finfo(out_dtype).tiny)
        assert torch.isnan(want).any() and torch.isinf(want).any() and tiny.any()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("elem", ELEMS, ids=("e4m3", "e5m2", "e2m1"))
def test_from_mx_of_to_mx_hard_inputs(elem, target):
    """Blocks of zeros, subnormals, ties and the saturation edge, as the quantizer stores them;
    leading dims and uint8 views are accepted."""
    x = hard_inputs(6, 128, elem, seed=11)
    q, s = reference.to_mx(x, elem)
    for out_dtype in OUT_DTYPES:
        got = from_mx(q.view(2, 3, -1), s.view(2, 3, -1), elem, out_dtype=out_dtype, target=target)
        want = reference.from_mx(q, s, elem, out_dtype=out_dtype).view(2, 3, 128)
        assert_same_values(got, want)
    got = from_mx(q.view(torch.uint8), s.view(torch.uint8), elem, target=target)
    assert_same_values(got, reference.from_mx(q, s, elem))


def test_from_mx_rejects_what_it_does_not_support():
    q, s = to_mx(torch.randn(2, 64), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="out_dtype must be fp32, bf16 or fp16"):
        from_mx(q, s, torch.float8_e4m3fn, out_dtype=torch.float64)
    with pytest.raises(ValueError, match="do not match elements"):
        from_mx(q, s[:, :1], torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="e2m1 elements must be"):
        from_mx(q, s, FP4)
    with pytest.raises(ValueError, match="block size 16 is not supported"):
        from_mx(q, s, torch.float8_e4m3fn, block=16)


# -- the MX GEMM ----------------------------------------------------------------------------------

GEMM_FORMATS = (("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1"), ("e5m2", "e4m3"))
_TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": FP4}


def gemm_inputs(m, n, k, fa, fb, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.1
    a[:, : min(k, 32)] *= 8.0  # blocks at different scales
    return (*to_mx(a, _TORCH[fa]), *to_mx(w, _TORCH[fb])), torch.randn(n, generator=g)


def assert_gemm_close(got, want):
    scale = float(want.float().abs().max()) or 1.0
    eps = {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-11}[got.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=eps, atol=4 * eps * scale)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fa, fb", GEMM_FORMATS)
@pytest.mark.parametrize(
    "m, n, k, cfg",
    [
        (1, 7, 64, None),  # M = 1, default tile (BK 256 masks K)
        (13, 17, 96, GemmConfig(BM=16, BN=16, BK=64)),  # primes; K tail of 32 masked
        (37, 29, 256, GemmConfig(BM=32, BN=32, BK=128)),  # two programs along M and N
    ],
    ids=("1x7x64", "13x17x96", "37x29x256"),
)
def test_mx_gemm_matches_reference(m, n, k, cfg, fa, fb, target):
    (aq, sa, bq, sb), bias = gemm_inputs(m, n, k, fa, fb, seed=m + n + k)
    for out_dtype, b in ((torch.float32, None), (torch.bfloat16, bias)):
        got = mx_gemm(
            aq, sa, bq, sb, fa, fb, bias=b, out_dtype=out_dtype, target=target, config=cfg
        )
        want = reference.mx_gemm(aq, sa, bq, sb, fa, fb, bias=b, out_dtype=out_dtype)
        assert got.shape == (m, n) and got.dtype == out_dtype
        assert_gemm_close(got, want)


def test_mx_gemm_fp16_out_and_errors():
    (aq, sa, bq, sb), bias = gemm_inputs(4, 8, 64, "e4m3", "e2m1")
    got = mx_gemm(aq, sa, bq, sb, "e4m3", "e2m1", bias=bias.half(), out_dtype=torch.float16)
    assert_gemm_close(
        got, reference.mx_gemm(aq, sa, bq, sb, "e4m3", "e2m1", bias=bias, out_dtype=torch.float16)
    )
    with pytest.raises(ValueError, match="a holds K=64 elements per row, b K=128"):
        mx_gemm(aq, sa, bq.view(torch.uint8).repeat(1, 2), sb, "e4m3", "e2m1")
    with pytest.raises(ValueError, match="scales must be"):
        mx_gemm(aq, sa[:, :1], bq, sb, "e4m3", "e2m1")
    with pytest.raises(ValueError, match="out_dtype must be"):
        mx_gemm(aq, sa, bq, sb, "e4m3", "e2m1", out_dtype=torch.int32)
    with pytest.raises(ValueError, match="e2m1 elements must be"):
        mx_gemm(aq, sa, aq, sa, "e4m3", "e2m1")


# -- the baseline of the report and the benchmark (mx/baseline.py) --------------------------------


@pytest.mark.parametrize("elem", ELEMS, ids=("e4m3", "e5m2", "e2m1"))
def test_baseline_dequant_is_the_reference_in_bf16(elem):
    from flydsl_kernels.mx import baseline

    q, s = dequant_inputs(4, 256, elem, seed=9)
    want = reference.from_mx(q, s, elem, out_dtype=torch.bfloat16)
    assert not reference.mismatches(baseline.dequant_bf16(q, s, elem), want).any()


def test_baseline_cublas_scale_layout_is_torchs():
    from torch.testing._internal.common_quantized import to_blocked

    from flydsl_kernels.mx import baseline

    for rows, cols in ((128, 4), (300, 7), (32, 128)):
        s = torch.randint(0, 256, (rows, cols), generator=torch.Generator().manual_seed(rows))
        s = s.to(torch.uint8)
        got = baseline.cublas_blocked_scales(s)
        assert got.dtype == torch.float8_e8m0fnu
        assert torch.equal(got.view(torch.uint8), to_blocked(s))


def test_baseline_on_cpu_is_dequant_matmul_and_correct():
    from flydsl_kernels.mx import FAMILY, baseline

    (aq, sa, bq, sb), _ = gemm_inputs(5, 24, 128, "e4m3", "e2m1", seed=4)
    assert baseline.choose("cpu", "e4m3", "e2m1") == "dequant_matmul"
    assert baseline.choose("cpu", "e4m3", "e4m3") == "dequant_matmul"  # no MX MMA on the CPU
    got = baseline.thunk("dequant_matmul", aq, sa, bq, sb, "e4m3", "e2m1")()
    assert got.dtype == torch.bfloat16
    assert_gemm_close(got, reference.mx_gemm(aq, sa, bq, sb, "e4m3", "e2m1"))
    with pytest.raises(ValueError, match="unknown MX GEMM baseline"):
        baseline.thunk("cublas", aq, sa, bq, sb, "e4m3", "e2m1")
    gemm_cases = [c for c in FAMILY.cases() if c.kernel == "mx_gemm_nt"]
    assert gemm_cases and all(c.aten is not None for c in gemm_cases)
    assert {c.baseline("cpu") for c in gemm_cases} == {baseline.NAMES["dequant_matmul"]}
    grouped = [c for c in FAMILY.cases() if c.kernel == "mx_grouped_gemm_nt"]
    assert grouped and all(c.aten is not None for c in grouped)
    assert {c.baseline("cpu") for c in grouped} == {"dequant + bf16 torch._grouped_mm"}


def test_family_checks_pass_on_cpu():
    from flydsl_kernels.mx import FAMILY

    cases = list(FAMILY.cases())
    assert cases and all(c.family == "mx" for c in cases)
    seen = set()
    for c in cases:  # one check per kernel and format pair keeps this short
        key = (c.kernel, c.shape.split(" ", 1)[1])
        if key in seen:
            continue
        seen.add(key)
        assert c.check("cpu") <= 1.0, c.shape
    assert c.check("cpu-interpret") <= 1.0
