"""FlyDSL kernels of the MX family: quantization to MX, the block-scaled GEMM and its grouped form.

The quantizer works on the fp32 bits with integer ops only (no float divide
or multiply by the scale): the result is the same on every backend whatever
its denormal mode, and one routine covers FP8 and FP4 (the language has no
float -> fp8 conversion with saturation, and none at all to fp4).
"""

from __future__ import annotations

import flydsl_core as fly

from ..gemm.kernels import RAGGED_K, group_schedule, group_tile, persistent_tiles
from .formats import BLOCK


def _fp32_bits(x):
    """The fp32 bits of a float tile, as int32 (bf16 widened by a shift: exact everywhere; the
    Triton interpreter's bf16 -> fp32 conversion mangles bf16 subnormals)."""
    if x.dtype == fly.bf16:
        return (x.to(fly.int16, bitcast=True).to(fly.int32) & 0xFFFF) << 16
    return x.to(fly.fp32).to(fly.int32, bitcast=True)


def _round_to_format(sig, ev, MB, BIAS):
    """``sig * 2^ev`` (``sig`` an int32 tile in ``[1, 2^24)``) rounded to nearest-even in the
    float format with ``MB`` mantissa bits and exponent bias ``BIAS``: ``(magnitude bits,
    floor(log2 value))``, without saturation or overflow handling (the callers add them).

    The quantum of the value in the format is ``2^q`` with ``q = max(floor(log2 v), 1 - BIAS)
    - MB``, so the rounded significand is ``n = RNE(sig / 2^sh)``, ``sh = q - ev``, and the
    bits are ``((q + MB + BIAS - 1) << MB) + n`` (valid for subnormals, normals and a rounding
    carry into the next binade alike). A ``sig = 0`` gives no meaningful bits.
    """
    # floor(log2 sig) from the exponent of its exact fp32 conversion
    top = (sig.to(fly.fp32).to(fly.int32, bitcast=True) >> 23) - 127 + ev
    q = fly.maximum(top, 1 - BIAS) - MB
    sh = q - ev
    shr = fly.minimum(fly.maximum(sh, 0), 30)  # sig < 2^24: any shift >= 25 rounds to 0
    n0 = sig >> shr
    rem = sig - (n0 << shr)
    half = (1 << shr) >> 1
    up = (rem > half) | ((rem == half) & (shr > 0) & ((n0 & 1) == 1))
    n = fly.where(up, n0 + 1, n0)
    # fewer significant bits than the format holds: an exact left shift (-sh <= MB)
    n = fly.where(sh < 0, sig << fly.minimum(-sh, MB), n)
    return ((q + MB + BIAS - 1) << MB) + n, top


def _quantize(bits, EMAX, MB, BIAS, MAXB, SIGN):
    """``bits`` the fp32 bits (int32) of an ``(R, NB, 32)`` tile -> ``(element bits (R, NB, 32), scale bytes (R, NB))``.

    With the magnitude ``|x| = sig * 2^(E2 - 150)`` (``sig`` the significand
    with its hidden bit, ``E2 = max(exponent field, 1)``), ``v = x / 2^X`` is
    the value ``sig * 2^(E2 - 150 - X)``: ``_round_to_format`` rounds it to the
    element format (a zero ``sig`` gives 0 there: its log2 is -127 and ``X >= -127``).
    """
    mag = bits & 0x7FFFFFFF
    # non-negative floats order like their bits: the int max is the amax (NaN above Inf)
    amax = fly.max(mag, 2)
    special = amax >= 0x7F800000  # Inf or NaN in the block
    # floor(log2(amax)) - EMAX clamped to >= -127, plus the bias 127 (fp32 subnormal amax -> 0)
    sbyte = fly.maximum((amax >> 23) - EMAX, 0)
    X = (sbyte - 127)[:, :, None]
    e = mag >> 23
    frac = mag & 0x7FFFFF
    sig = fly.where(e == 0, frac, frac | 0x800000)
    # v = sig * 2^(max(e, 1) - 150 - X)
    out, _ = _round_to_format(sig, fly.maximum(e, 1) - 150 - X, MB, BIAS)
    out = fly.minimum(out, MAXB)  # saturate to the largest finite
    out = out | (((bits >> 31) & 1) << SIGN)
    out = fly.where(special[:, :, None], 0, out)
    return out, fly.where(special, 255, sbyte)


@fly.kernel
def mx_quantize(
    x,
    q,
    s,
    K: fly.constexpr,
    R: fly.constexpr,
    NB: fly.constexpr,
    EMAX: fly.constexpr,
    MB: fly.constexpr,
    BIAS: fly.constexpr,
    MAXB: fly.constexpr,
    PACK: fly.constexpr,
):
    """Program ``(i, j)`` quantizes rows ``[i*R, (i+1)*R)``, blocks ``[j*NB, (j+1)*NB)``.

    ``x`` is ``(M, K)`` (any float dtype), ``q`` ``(M, K / PACK)`` uint8 (PACK = 2
    packs two E2M1 nibbles per byte, the even element low), ``s`` ``(M, K / 32)``.
    """
    i, j = fly.program_id(0), fly.program_id(1)
    C = NB * BLOCK
    xt = _fp32_bits(x.tile((R, C), (i, j)).load())
    elems, sb = _quantize(xt.reshape(R, NB, BLOCK), EMAX, MB, BIAS, MAXB, 3 if PACK == 2 else 7)
    s.tile((R, NB), (i, j)).store(sb.to(fly.uint8))
    if PACK == 2:
        pairs = elems.reshape(R, C // 2, 2)
        shift = (fly.arange(0, 2) * 4)[None, None, :]
        packed = fly.sum(pairs << shift, 2)  # disjoint nibbles: the sum is the OR
        q.tile((R, C // 2), (i, j)).store(packed.to(fly.uint8))
    else:
        q.tile((R, C), (i, j)).store(elems.reshape(R, C).to(fly.uint8))


#: float outputs of the dequantizer: (mantissa bits, exponent bias, int dtype of the bits, sign bit)
_OUT_FORMATS = {
    "fp32": (23, 127, "int32", 31),
    "bf16": (7, 127, "int16", 15),
    "fp16": (10, 15, "int16", 15),
}


def _dequantize(u, sx, MB, BIAS, MAXB, SIGN, INF, OM, OB, OS):
    """Element bytes ``u`` (int32, one element each) times ``2^sx`` (``sx`` the scale byte,
    broadcast) -> the bits (int32) of the product rounded once, to nearest-even, in the float
    format with ``OM`` mantissa bits, bias ``OB`` and sign bit ``OS``: overflow gives Inf, a NaN scale (0xFF)
    or a NaN element NaN, an Inf element (e5m2) Inf; signs kept (``-0`` too).

    The element is ``sig * 2^(max(e, 1) - BIAS - MB)`` (``sig`` the significand with its hidden
    bit), so the product is ``sig * 2^ev`` with ``ev = max(e, 1) - BIAS - MB + sx - 127``.
    """
    mag = u & ((1 << SIGN) - 1)
    e = mag >> MB
    m = mag & ((1 << MB) - 1)
    sig = fly.where(e == 0, m, m | (1 << MB))
    out, top = _round_to_format(sig, fly.maximum(e, 1) - BIAS - MB + sx - 127, OM, OB)
    inf = (2 * OB + 1) << OM
    out = fly.where(sig == 0, 0, fly.where(top > OB, inf, out))
    if INF:
        out = fly.where(mag == MAXB + 1, inf, out)
    out = out | (((u >> SIGN) & 1) << OS)
    nan = (mag > MAXB + (1 if INF else 0)) | (sx == 255)
    return fly.where(nan, inf | (1 << (OM - 1)), out)


@fly.kernel
def mx_dequantize(
    q,
    s,
    y,
    R: fly.constexpr,
    NB: fly.constexpr,
    MB: fly.constexpr,
    BIAS: fly.constexpr,
    MAXB: fly.constexpr,
    PACK: fly.constexpr,
    INF: fly.constexpr,
):
    """Program ``(i, j)`` dequantizes rows ``[i*R, (i+1)*R)``, blocks ``[j*NB, (j+1)*NB)``.

    ``q`` is ``(M, K / PACK)`` uint8 (PACK = 2: two E2M1 nibbles per byte, the even element
    low), ``s`` ``(M, K / 32)`` E8M0 bytes, ``y`` ``(M, K)`` fp32, bf16 or fp16. Integer ops
    only: the result is the same on every backend, whatever its denormal handling.
    """
    i, j = fly.program_id(0), fly.program_id(1)
    C = NB * BLOCK
    OM, OB, OI, OS = _OUT_FORMATS[y.dtype.name]
    if PACK == 2:
        b = q.tile((R, C // 2), (i, j)).load().to(fly.int32)
        shift = (fly.arange(0, 2) * 4)[None, None, :]
        u = ((b[:, :, None] >> shift) & 0xF).reshape(R, C)
    else:
        u = q.tile((R, C), (i, j)).load().to(fly.int32)
    sx = s.tile((R, NB), (i, j)).load().to(fly.int32)[:, :, None]
    sign = 3 if PACK == 2 else 7
    bits = _dequantize(u.reshape(R, NB, BLOCK), sx, MB, BIAS, MAXB, sign, INF, OM, OB, OS)
    out = bits.reshape(R, C).to(getattr(fly, OI))
    y.tile((R, C), (i, j)).store(out.to(y.dtype, bitcast=True))


def _mx_tile(a, sa, b, sb, m0, n0, k0, k1, MASK_K, FA, FB, BM, BN, BK, STAGES):
    """The fp32 tile ``(a * sa)[m0:+BM, k0:k1] @ (b * sb)[n0:+BN, k0:k1].T``, from 2-D views.

    a is ``(rows, K / epb)`` (fp8, or uint8 holding two fp4 per byte along K),
    b ``(cols, K / epb)`` (the NT layout of weights), scales ``(rows, K/32)``
    and ``(cols, K/32)`` E8M0 bytes; ``k0`` and ``k1`` are multiples of 32. The
    views mask rows, columns and the tail of the tensors' K: a masked element
    reads 0 and a masked scale 2^-127, so it adds exactly 0. ``MASK_K`` also
    masks elements and scales at ``k1`` (a K chunk that ends inside the tensor,
    ragged K): a scale too, since 0 times a NaN scale would not add 0.
    """
    EA = 2 if FA == "e2m1" else 1
    EB = 2 if FB == "e2m1" else 1
    acc = fly.zeros((BM, BN), fly.fp32)
    if MASK_K:
        # the K chunk's ends are multiples of 32 (the host checks): say so, so that the compiler
        # sees aligned, 32-element constant-mask runs and keeps wide loads
        k0, k1 = (k0 // BLOCK) * BLOCK, (k1 // BLOCK) * BLOCK
    for k in fly.range(k0, k1, BK, stages=STAGES):
        ma = mb = ms = None
        if MASK_K:
            ma = (k + fly.arange(0, BK // EA) * EA < k1)[None, :]
            mb = (k + fly.arange(0, BK // EB) * EB < k1)[None, :]
            ms = (k + fly.arange(0, BK // BLOCK) * BLOCK < k1)[None, :]
        at = a[fly.ds(m0, BM), fly.ds(k // EA, BK // EA)].load(ma)
        bt = b[fly.ds(n0, BN), fly.ds(k // EB, BK // EB)].load(mb)
        sat = sa[fly.ds(m0, BM), fly.ds(k // BLOCK, BK // BLOCK)].load(ms)
        sbt = sb[fly.ds(n0, BN), fly.ds(k // BLOCK, BK // BLOCK)].load(ms)
        acc.set(fly.dot_scaled(at, sat, FA, bt.T, sbt, FB, acc))
    return acc


@fly.kernel
def mx_gemm_nt(
    a,
    sa,
    b,
    sb,
    bias,
    c,
    K,
    FA: fly.constexpr,
    FB: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
    STAGES: fly.constexpr,
):
    """``c = (a * sa) @ (b * sb).T (+ bias)`` with fp32 accumulation, one (BM, BN) tile per program
    (operands as ``_mx_tile``'s)."""
    pm, pn = fly.program_id(0), fly.program_id(1)
    acc = _mx_tile(a, sa, b, sb, pm * BM, pn * BN, 0, K, False, FA, FB, BM, BN, BK, STAGES)
    if bias is not None:
        acc += bias.tile((BN,), pn).load().to(fly.fp32)[None, :]
    c.tile((BM, BN), (pm, pn)).store(acc)


@fly.kernel
def mx_grouped_gemm_nt(
    a,
    sa,
    b,
    sb,
    out,
    offs,
    bias,
    G,
    M,
    N,
    K,
    FA: fly.constexpr,
    FB: fly.constexpr,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
    GB: fly.constexpr,
    RAGGED: fly.constexpr,
    STAGES: fly.constexpr,
    HAS_BIAS: fly.constexpr,
    XCDS: fly.constexpr = 1,
):
    """The MX grouped GEMM: every group's tiles in one persistent launch.

    Program ``p`` of ``P`` takes global tiles ``v, v + P, ...`` (``v`` its
    XCD-remapped id, ``gemm.kernels.persistent_tiles``) of all groups' tile grids laid end to end (``gemm.kernels.group_schedule``: ``offs`` is
    loaded in-kernel, a tile's group comes from prefix sums; no host loop, no
    host sync). Operands are 3-D: ``a (Ga, M, K/epb)``, ``b (Gb, N, K/epb)``
    (NT), scales ``(Ga, M, K/32)`` and ``(Gb, N, K/32)``; ``RAGGED_M`` (the MoE
    forward) passes ``Ga = 1``, ``Gb = G`` and ``offs`` splits its ``M`` rows;
    ``RAGGED_NONE`` is batched (``Ga = Gb = G``); ``RAGGED_K`` (the weight
    gradient) passes ``Ga = Gb = 1``, ``offs`` (multiples of 32) splits K and
    group ``g`` writes ``out[g]`` (an empty group's K loop is empty: zeros).
    A ragged-M tile reads the rows past its group's end (or past ``M``:
    masked to 0) but stores only its group's rows: each output row depends on
    its own row of ``a`` only. ``bias`` is ``(G, N)``.
    """
    s = group_schedule(offs, G, M, N, BM, BN, GB, RAGGED, K)
    for t in persistent_tiles(s.total, XCDS):
        w = group_tile(t, s, M, N, K, BM, BN, RAGGED)
        acc = _mx_tile(
            a[w.ab],
            sa[w.ab],
            b[w.bb],
            sb[w.bb],
            w.m0,
            w.n0,
            w.k0,
            w.k1,
            RAGGED == RAGGED_K,
            FA,
            FB,
            BM,
            BN,
            BK,
            STAGES,
        )
        if HAS_BIAS:
            acc += bias[w.g, fly.ds(w.n0, BN)].load().to(fly.fp32)[None, :]
        rmask = w.m0 + fly.arange(0, BM) < w.m_end
        out[w.ob, fly.ds(w.m0, BM), fly.ds(w.n0, BN)].store(acc, rmask[:, None])


KERNELS = {
    "quantize": mx_quantize,
    "dequantize": mx_dequantize,
    "gemm": mx_gemm_nt,
    "grouped": mx_grouped_gemm_nt,
}
