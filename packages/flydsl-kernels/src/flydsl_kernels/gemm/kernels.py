"""GEMM kernels in FlyDSL: dense (batched, split-K), the split-K reduce, grouped (persistent).

Layouts. Operands are 3-D ``(batch, rows, cols)`` tensor arguments with
run-time strides; a transposed operand is just a strided view. The launcher
specializes a stride equal to 1 into a constant (and the others on
divisibility by 16), so the unit-stride dimension of each operand is a
compile-time fact: Triton then sees contiguous, 16-byte aligned runs along
it and emits 128-bit loads, whichever of the four layouts (NN/NT/TN/TT) the
caller has. No layout is a kernel parameter.

Masks. Every load and store is written with ``bounds_check=False`` and an
explicit mask: the M/N row/column masks are loop-invariant, and the K mask
exists only when ``EVEN_K`` is false (``EVEN_K`` is the compile-time fact
``K % (BK * SPLIT_K) == 0`` the host checks), so an evenly divisible K loop
carries no K mask at all (the compile tests check the generated source).

Numerics. fp32 accumulation (``fly.dot``); the epilogue (``_epilogue``)
computes ``act(alpha * acc + beta * C + bias) + residual`` in fp32 and rounds
once to the output dtype on store.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flydsl_core as fly

from .._masks import and_masks as _and

#: activation codes of the ``ACT`` constexpr
ACT_NONE, ACT_RELU, ACT_GELU_TANH, ACT_GELU_ERF, ACT_SILU = 0, 1, 2, 3, 4
ACTIVATIONS = {
    None: ACT_NONE,
    "relu": ACT_RELU,
    "gelu_tanh": ACT_GELU_TANH,
    "gelu": ACT_GELU_ERF,  # torch.nn.functional.gelu's default (approximate="none")
    "gelu_erf": ACT_GELU_ERF,
    "silu": ACT_SILU,
}
#: bias modes of the ``BIAS`` constexpr: none, one per column (N), one per row (M)
BIAS_NONE, BIAS_COL, BIAS_ROW = 0, 1, 2
#: gfx950 has 8 XCDs; consecutive workgroups are dispatched round-robin across them
NUM_XCDS = 8


# -- trace-time helpers (plain Python, inlined into the kernels that call them) --------------------


def _xcd_remap(pid, n, XCDS):
    """Permute ``pid`` in ``[0, n)`` so each XCD's workgroups get one contiguous chunk of tiles.

    The hardware sends workgroup ``pid`` to XCD ``pid % XCDS``; XCD ``x`` thus
    runs ``x, x + XCDS, ...`` and would share no L2 lines with its neighbours.
    Here XCD ``x``'s ``j``-th workgroup takes tile ``start(x) + j``, where the
    first ``n % XCDS`` XCDs own ``ceil(n / XCDS)`` tiles and the rest one fewer
    (the same bijection as ``Layout((XCDS, per), (per, 1))`` applied to
    ``(pid % XCDS, pid // XCDS)`` when ``XCDS`` divides ``n``, written as index math
    so that it also holds for ragged ``n``).
    """
    if XCDS <= 1:
        return pid
    per = (n + (XCDS - 1)) // XCDS
    tall = n % XCDS
    tall = fly.where(tall == 0, XCDS, tall)
    xcd = pid % XCDS
    local = pid // XCDS
    return fly.where(
        xcd < tall,
        xcd * per + local,
        tall * per + (xcd - tall) * (per - 1) + local,
    )


def persistent_tiles(total, XCDS):
    """The tiles of a persistent program: ``v, v + P, ...`` below ``total`` (``P`` programs),
    with ``v`` the program id XCD-remapped so that at every step each XCD's programs take one
    contiguous run of tiles (neighbours share operand rows in L2) rather than every 8th."""
    v = _xcd_remap(fly.program_id(0), fly.num_programs(0), XCDS)
    return fly.range(v, total, fly.num_programs(0))


def _grouped_pid(pid, num_m, num_n, GROUP_M):
    """Tile ``(pm, pn)`` of program ``pid``, ``GROUP_M`` row tiles per column sweep (L2 reuse)."""
    if GROUP_M <= 1:
        return pid // num_n, pid % num_n
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = fly.minimum(num_m - first_m, GROUP_M)
    r = pid % in_group
    return first_m + r % size_m, r // size_m


def _activation(x, ACT):
    if ACT == ACT_RELU:
        return fly.maximum(x, 0.0)
    if ACT == ACT_GELU_TANH:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + fly.tanh(inner))
    if ACT == ACT_GELU_ERF:
        return 0.5 * x * (1.0 + fly.erf(x * (1.0 / math.sqrt(2.0))))
    if ACT == ACT_SILU:
        return x * fly.sigmoid(x)
    return x


def _epilogue(
    acc, out, bz, m0, n0, rmask, cmask, c, bias, res, alpha, beta, BM, BN, HAS_ALPHA, BIAS, ACT
):
    """Store ``act(alpha * acc + beta * c + bias) + res`` to ``out[bz, m0:+BM, n0:+BN]``."""
    mask = rmask[:, None] & cmask[None, :]
    if HAS_ALPHA:
        acc = acc * alpha
    if c is not None:
        ct = c[bz, fly.ds(m0, BM), fly.ds(n0, BN)].load(mask, bounds_check=False)
        acc = acc + beta * ct.to(fly.fp32)
    if BIAS == BIAS_COL:
        acc = acc + bias[fly.ds(n0, BN)].load(cmask, bounds_check=False).to(fly.fp32)[None, :]
    elif BIAS == BIAS_ROW:
        acc = acc + bias[fly.ds(m0, BM)].load(rmask, bounds_check=False).to(fly.fp32)[:, None]
    acc = _activation(acc, ACT)
    if res is not None:
        rt = res[bz, fly.ds(m0, BM), fly.ds(n0, BN)].load(mask, bounds_check=False)
        acc = acc + rt.to(fly.fp32)
    out[bz, fly.ds(m0, BM), fly.ds(n0, BN)].store(acc, mask, bounds_check=False)


def _rows(t, dim, start, size, end, mask):
    """Index and load mask of ``size`` rows (or columns) from ``start`` along ``dim`` of ``t``.

    Off the contiguous axis the indices are clamped to ``end - 1``: the reads stay in bounds,
    the rows past ``end`` compute values the store masks off, and the K loop carries no mask
    (on gfx950 a masked buffer load costs a ``v_cndmask`` per load per K tile). Along the
    unit-stride axis clamping would break the 128-bit loads, so that axis keeps its mask.
    """
    if end is None or t.static_stride(dim) == 1:
        return fly.ds(start, size), mask
    return fly.minimum(start + fly.arange(0, size), end - 1), None


def _mainloop(
    acc,
    a,
    b,
    ab,
    bb,
    m0,
    n0,
    rmask,
    cmask,
    k0,
    k1,
    K,
    BM,
    BN,
    BK,
    EVEN_K,
    STAGES,
    m_end=None,
    n_end=None,
):
    """``acc += a[ab, m0:+BM, k0:k1] @ b[bb, k0:k1, n0:+BN]`` (masks: rows, columns, K tail).

    With ``m_end`` / ``n_end`` (the row / column bounds) the operand rows are clamped
    instead of masked where that keeps the loads wide (``_rows``).
    """
    ri, ma0 = _rows(a, 1, m0, BM, m_end, rmask)
    ci, mb0 = _rows(b, 2, n0, BN, n_end, cmask)
    for k in fly.range(k0, k1, BK, stages=STAGES):
        ma = None if ma0 is None else ma0[:, None]
        mb = None if mb0 is None else mb0[None, :]
        if not EVEN_K:
            kk = k + fly.arange(0, BK)
            ma = _and(ma, (kk < K)[None, :])
            mb = _and(mb, (kk < K)[:, None])
        at = a[ab, ri, fly.ds(k, BK)].load(ma, bounds_check=False)
        bt = b[bb, fly.ds(k, BK), ci].load(mb, bounds_check=False)
        acc += fly.dot(at, bt)


# -- dense ----------------------------------------------------------------------------------------


@fly.kernel
def gemm_kernel(
    a,
    b,
    out,
    c,
    bias,
    res,
    M,
    N,
    K,
    alpha,
    beta,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
    GROUP_M: fly.constexpr,
    XCDS: fly.constexpr,
    EVEN_K: fly.constexpr,
    SPLIT_K: fly.constexpr,
    STAGES: fly.constexpr,
    HAS_ALPHA: fly.constexpr,
    BIAS: fly.constexpr,
    ACT: fly.constexpr,
):
    """``out[z] = epilogue(a[z] @ b[z])``; grid ``(tiles_m * tiles_n, batch, SPLIT_K)``.

    ``a`` is ``(batch, M, K)``, ``b`` ``(batch, K, N)`` (batch stride 0
    broadcasts). With ``SPLIT_K > 1`` program ``(.., z, s)`` sums the ``s``-th
    ``K / SPLIT_K`` chunk into the fp32 partial ``out[z * SPLIT_K + s]`` and the
    epilogue runs in ``splitk_reduce_kernel``.
    """
    num_m = (M + (BM - 1)) // BM
    num_n = (N + (BN - 1)) // BN
    pid = _xcd_remap(fly.program_id(0), num_m * num_n, XCDS)
    pm, pn = _grouped_pid(pid, num_m, num_n, GROUP_M)
    bz = fly.program_id(1)
    m0, n0 = pm * BM, pn * BN
    rmask = m0 + fly.arange(0, BM) < M
    cmask = n0 + fly.arange(0, BN) < N
    acc = fly.zeros((BM, BN), fly.fp32)
    if SPLIT_K == 1:
        _mainloop(
            acc, a, b, bz, bz, m0, n0, rmask, cmask, 0, K, K, BM, BN, BK, EVEN_K, STAGES, M, N
        )
        _epilogue(
            acc,
            out,
            bz,
            m0,
            n0,
            rmask,
            cmask,
            c,
            bias,
            res,
            alpha,
            beta,
            BM,
            BN,
            HAS_ALPHA,
            BIAS,
            ACT,
        )
    else:
        s = fly.program_id(2)
        # whole BK tiles per split, so that only the last tile of K can be partial
        chunk = (((K + (BK - 1)) // BK + (SPLIT_K - 1)) // SPLIT_K) * BK
        k0 = s * chunk
        k1 = fly.minimum(k0 + chunk, K)
        _mainloop(
            acc, a, b, bz, bz, m0, n0, rmask, cmask, k0, k1, K, BM, BN, BK, EVEN_K, STAGES, M, N
        )
        mask = rmask[:, None] & cmask[None, :]
        out[bz * SPLIT_K + s, fly.ds(m0, BM), fly.ds(n0, BN)].store(acc, mask, bounds_check=False)


@fly.kernel
def splitk_reduce_kernel(
    part,
    out,
    c,
    bias,
    res,
    M,
    N,
    alpha,
    beta,
    BM: fly.constexpr,
    BN: fly.constexpr,
    SPLIT_K: fly.constexpr,
    HAS_ALPHA: fly.constexpr,
    BIAS: fly.constexpr,
    ACT: fly.constexpr,
):
    """Sum the ``SPLIT_K`` fp32 partials of a tile in a fixed order (deterministic), then the
    epilogue; grid ``(tiles_m * tiles_n, batch)``."""
    num_n = (N + (BN - 1)) // BN
    pid = fly.program_id(0)
    bz = fly.program_id(1)
    m0, n0 = (pid // num_n) * BM, (pid % num_n) * BN
    rmask = m0 + fly.arange(0, BM) < M
    cmask = n0 + fly.arange(0, BN) < N
    mask = rmask[:, None] & cmask[None, :]
    acc = fly.zeros((BM, BN), fly.fp32)
    for s in fly.static_range(SPLIT_K):
        acc += part[bz * SPLIT_K + s, fly.ds(m0, BM), fly.ds(n0, BN)].load(mask, bounds_check=False)
    _epilogue(
        acc,
        out,
        bz,
        m0,
        n0,
        rmask,
        cmask,
        c,
        bias,
        res,
        alpha,
        beta,
        BM,
        BN,
        HAS_ALPHA,
        BIAS,
        ACT,
    )


@fly.kernel
def swiglu_kernel(
    a,
    bg,
    bu,
    out,
    M,
    N,
    K,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
    GROUP_M: fly.constexpr,
    XCDS: fly.constexpr,
    EVEN_K: fly.constexpr,
    STAGES: fly.constexpr,
):
    """``out[z] = silu(a[z] @ bg[z]) * (a[z] @ bu[z])`` (the gated MLP of Llama, Qwen, gpt-oss);
    grid ``(tiles_m * tiles_n, batch)``.

    Both GEMMs share the A operand: each K step loads the A tile once and feeds two dots, so
    A is read once instead of twice and the gate / up products never leave registers (no
    ``(M, 2N)`` intermediate in memory). Two fp32 accumulators: the configs halve BN where
    one accumulator would already fill the register file (``configs.select("swiglu", ...)``).
    """
    num_m = (M + (BM - 1)) // BM
    num_n = (N + (BN - 1)) // BN
    pid = _xcd_remap(fly.program_id(0), num_m * num_n, XCDS)
    pm, pn = _grouped_pid(pid, num_m, num_n, GROUP_M)
    bz = fly.program_id(1)
    m0, n0 = pm * BM, pn * BN
    rmask = m0 + fly.arange(0, BM) < M
    cmask = n0 + fly.arange(0, BN) < N
    ri, ma0 = _rows(a, 1, m0, BM, M, rmask)
    gi, mg0 = _rows(bg, 2, n0, BN, N, cmask)
    ui, mu0 = _rows(bu, 2, n0, BN, N, cmask)
    acc_g = fly.zeros((BM, BN), fly.fp32)
    acc_u = fly.zeros((BM, BN), fly.fp32)
    for k in fly.range(0, K, BK, stages=STAGES):
        ma = None if ma0 is None else ma0[:, None]
        mg = None if mg0 is None else mg0[None, :]
        mu = None if mu0 is None else mu0[None, :]
        if not EVEN_K:
            kk = k + fly.arange(0, BK)
            ma = _and(ma, (kk < K)[None, :])
            mg = _and(mg, (kk < K)[:, None])
            mu = _and(mu, (kk < K)[:, None])
        at = a[bz, ri, fly.ds(k, BK)].load(ma, bounds_check=False)
        gt = bg[bz, fly.ds(k, BK), gi].load(mg, bounds_check=False)
        ut = bu[bz, fly.ds(k, BK), ui].load(mu, bounds_check=False)
        acc_g += fly.dot(at, gt)
        acc_u += fly.dot(at, ut)
    h = _activation(acc_g, ACT_SILU) * acc_u
    mask = rmask[:, None] & cmask[None, :]
    out[bz, fly.ds(m0, BM), fly.ds(n0, BN)].store(h, mask, bounds_check=False)


# -- grouped ----------------------------------------------------------------------------------------

#: which dimension ``offs`` splits, per torch._grouped_mm form (the ``RAGGED`` constexpr)
RAGGED_NONE, RAGGED_M, RAGGED_K, RAGGED_N = 0, 1, 2, 3


class GroupSchedule(NamedTuple):
    """Every group's tile grid, laid end to end (trace-time values, see ``group_schedule``)."""

    gi: object  # (GB,) group indices
    gmask: object  # (GB,) g < G
    starts: object  # (GB,) first row / column / K index of each group along the ragged dim
    ends: object  # (GB,) its end (offs)
    tiles_n: object  # (GB,) tiles along N per group
    tiles: object  # (GB,) tiles per group (0 for an empty group or g >= G)
    tile_end: object  # (GB,) inclusive prefix sum of ``tiles``
    total: object  # scalar: the tiles of all groups


class GroupTile(NamedTuple):
    """Where global tile ``t`` of a ``GroupSchedule`` lies (see ``group_tile``)."""

    g: object  # its group
    m0: object  # first row / column of the tile in the (3-D) operands' coordinates
    n0: object
    m_end: object  # row / column bounds of the group (masks)
    n_end: object
    k0: object  # the group's K range
    k1: object
    ab: object  # batch of a, b and out the tile reads / writes
    bb: object
    ob: object


def group_schedule(offs, G, M, N, BM, BN, GB, RAGGED, K=0) -> GroupSchedule:
    """Load ``offs`` once (``GB >= G``, a power of two) and derive every group's tile count and
    their prefix sum: a tile's group is then found by counting prefix ends (``group_tile``),
    with no host loop and no host sync on ``offs``. Empty groups own no tiles.

    Every group's bounds are clamped to ``[0, extent]`` of the ragged dimension (``M``,
    ``N`` or ``K``) and a start never passes its end, so whatever ``offs`` holds (it is
    not checked on the host for GPU tensors, ``flydsl_kernels._offs``) no tile reaches
    outside the operands; for valid ``offs`` the clamps change nothing."""
    gi = fly.arange(0, GB)
    gmask = gi < G
    if RAGGED == RAGGED_NONE:
        ends = fly.zeros((GB,), fly.int32)
        starts = ends
    else:
        extent = M if RAGGED == RAGGED_M else N if RAGGED == RAGGED_N else K
        raw = offs[fly.ds(0, GB)].load(gmask, bounds_check=False).to(fly.int32)
        ends = fly.minimum(fly.maximum(raw, 0), extent)
        # a group's start is the previous group's end (0 for the first): a gather of offs[g - 1]
        prev = offs[fly.maximum(gi - 1, 0)].load(gmask & (gi >= 1), bounds_check=False)
        starts = fly.minimum(fly.maximum(prev.to(fly.int32), 0), ends)
    sizes = ends - starts
    gm = sizes if RAGGED == RAGGED_M else fly.full((GB,), 0, fly.int32) + M
    gn = sizes if RAGGED == RAGGED_N else fly.full((GB,), 0, fly.int32) + N
    tiles_n = (gn + (BN - 1)) // BN
    tiles = fly.where(gmask, ((gm + (BM - 1)) // BM) * tiles_n, 0)
    tile_end = fly.cumsum(tiles, 0)
    return GroupSchedule(gi, gmask, starts, ends, tiles_n, tiles, tile_end, fly.sum(tiles, 0))


def group_tile(t, s: GroupSchedule, M, N, K, BM, BN, RAGGED, GROUP_M=1) -> GroupTile:
    """Tile ``t`` of schedule ``s``: its group, origin, the group's bounds and operand batches.

    Group ``g`` reads batch ``g`` of a 3-D operand and batch 0 of a 2-D one
    (passed as ``(1, rows, cols)``); the ragged dimension's origin is offset
    by the group's start and bounded by its end. Inside a group the tiles go
    ``GROUP_M`` row tiles per column sweep, as the dense kernel's (L2 reuse).
    """
    # the group of tile t: how many groups end at or before it
    g = fly.sum(fly.where(s.gmask & (s.tile_end <= t), 1, 0), 0)
    sel = s.gi == g
    first = fly.sum(fly.where(sel, s.tile_end - s.tiles, 0), 0)
    tn = fly.sum(fly.where(sel, s.tiles_n, 0), 0)
    g0 = fly.sum(fly.where(sel, s.starts, 0), 0)
    g1 = fly.sum(fly.where(sel, s.ends, 0), 0)
    local = t - first
    tm = fly.sum(fly.where(sel, s.tiles, 0), 0) // fly.maximum(tn, 1)
    pm, pn = _grouped_pid(local, tm, tn, GROUP_M)
    m0, n0 = pm * BM, pn * BN
    m_end, n_end, k0, k1 = M, N, 0, K
    ab, bb, ob = g, g, g
    if RAGGED == RAGGED_M:
        m0, m_end, ab, ob = m0 + g0, g1, 0, 0
    elif RAGGED == RAGGED_N:
        n0, n_end, bb, ob = n0 + g0, g1, 0, 0
    elif RAGGED == RAGGED_K:
        k0, k1, ab, bb = g0, g1, 0, 0
    return GroupTile(g, m0, n0, m_end, n_end, k0, k1, ab, bb, ob)


@fly.kernel
def grouped_gemm_kernel(
    a,
    b,
    out,
    offs,
    bias,
    G,
    M,
    N,
    K,
    BM: fly.constexpr,
    BN: fly.constexpr,
    BK: fly.constexpr,
    GB: fly.constexpr,
    RAGGED: fly.constexpr,
    EVEN_K: fly.constexpr,
    STAGES: fly.constexpr,
    HAS_BIAS: fly.constexpr,
    XCDS: fly.constexpr = 1,
    GROUP_M: fly.constexpr = 1,
):
    """Every group's tiles in one persistent launch: program ``p`` of ``P`` takes global tiles
    ``v, v + P, ...`` (``v`` its XCD-remapped id, ``persistent_tiles``) of the concatenation of all groups' tile grids (``group_schedule``).

    Operands are 3-D; group ``g`` reads batch ``g`` of a 3-D operand and
    batch 0 of a 2-D one (passed as ``(1, rows, cols)``). ``offs`` (int32,
    ``G`` cumulative end offsets) splits the ``RAGGED`` dimension; ``M``, ``N``,
    ``K`` are the full extents (the ragged one is the total). Empty groups
    own no tiles; a group smaller than a tile is masked.
    """
    s = group_schedule(offs, G, M, N, BM, BN, GB, RAGGED, K)
    for t in persistent_tiles(s.total, XCDS):
        w = group_tile(t, s, M, N, K, BM, BN, RAGGED, GROUP_M)
        rmask = w.m0 + fly.arange(0, BM) < w.m_end
        cmask = w.n0 + fly.arange(0, BN) < w.n_end
        acc = fly.zeros((BM, BN), fly.fp32)
        # ragged K: the group's K chunk ends anywhere, so its tail is masked against k1
        _mainloop(
            acc,
            a,
            b,
            w.ab,
            w.bb,
            w.m0,
            w.n0,
            rmask,
            cmask,
            w.k0,
            w.k1,
            w.k1,
            BM,
            BN,
            BK,
            EVEN_K,
            STAGES,
            w.m_end,
            w.n_end,
        )
        mask = rmask[:, None] & cmask[None, :]
        if HAS_BIAS:
            # bias is (G, N): one row per group (2-D x 3-D and 3-D x 3-D forms)
            acc += bias[w.g, fly.ds(w.n0, BN)].load(cmask, bounds_check=False).to(fly.fp32)[None, :]
        out[w.ob, fly.ds(w.m0, BM), fly.ds(w.n0, BN)].store(acc, mask, bounds_check=False)


KERNELS = {
    "gemm": gemm_kernel,
    "splitk_reduce": splitk_reduce_kernel,
    "swiglu": swiglu_kernel,
    "grouped": grouped_gemm_kernel,
}
