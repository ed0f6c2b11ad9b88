"""RMSNorm kernels in FlyDSL: forward (rows / row / looped), backward, dweight reduction.

Addressing. Every tensor is passed as a 1-D *flat* view of the storage it
spans (``api._flat``), and row ``i`` of a ``(M, N)`` operand starts at
element ``i * S`` where the row stride ``S`` is a compile-time constant
(``SX``, ``SR``, ``SG``; outputs are allocated contiguous, so theirs is
``N``). A constant stride is what proves every row 16-byte aligned when
``N % 8 == 0`` but ``N % 16 != 0`` (bf16 ``N = 1000``, ``4104``...):
a run-time stride is only specialized on divisibility by 16 (Triton's
rule), which would make those rows fall back to 16-bit accesses. ``N`` is a
compile-time constant too, so a row that fills its block (``N == BLOCK``, or
full blocks of the looped kernels) carries no mask at all. The grids cover
exactly the rows there are (or the row kernels are told ``M``), so all
masks are written out here and views are read with ``bounds_check=False``.

Numerics. Accumulation is fp32; ``rstd = rsqrt(sum(h*h) * (1/N) + eps)``;
outputs are rounded to the output tensor's dtype on store. ``MODE``:

* 0: ``y = (h * rstd) * w`` in fp32 (``aten::_fused_rms_norm``);
* 1: ``y = (h * rstd).to(x.dtype) * w`` (transformers' LlamaRMSNorm: the
  normalized value is rounded to the input dtype *before* the weight);
* 2: ``y = (h * rstd) * (1 + w)`` in fp32 (transformers' GemmaRMSNorm).

Optional operands (``res``, ``res_out``, ``w``, ``rstd``, ``dx``...) may be
``None``, which makes them compile-time absent. With a residual, ``h = x +
res`` is computed in fp32 and rounded to the input dtype (what ``x +
residual`` gives in PyTorch), written to ``res_out``, and that rounded value
is normalized.
"""

from __future__ import annotations

import flydsl_core as fly
from flydsl_core.layout import Layout

MODE_ATEN, MODE_LLAMA, MODE_GEMMA = 0, 1, 2


# -- trace-time helpers (plain Python, inlined into the kernels that call them) ----------------------


def _row(t, row, S, BLOCK, k=0):
    """The ``BLOCK`` elements of flat tensor ``t`` from ``row * S + k``."""
    start = row.to(t.index_dtype) * S
    if not (isinstance(k, int) and k == 0):
        start = start + k
    return t[fly.ds(start, BLOCK)]


def _rows(t, row0, R, S, BLOCK, k=0):
    """Rows ``row0 .. row0+R-1``, columns ``k .. k+BLOCK-1`` of flat tensor ``t`` (row stride S)."""
    base = row0.to(t.index_dtype) * S
    if not (isinstance(k, int) and k == 0):
        base = base + k
    return t.view(Layout((R, BLOCK), (S, 1)), base)


def _load(view, mask):
    return view.load(mask=mask, bounds_check=False)


def _store(view, value, mask):
    view.store(value, mask=mask, bounds_check=False)


def _apply_weight(n, w, MODE, in_dtype):
    """``n`` is the fp32 ``h * rstd``; ``w`` the weight tile (broadcastable) or None."""
    if MODE == MODE_LLAMA:
        n = n.to(in_dtype).to(fly.fp32)
    if w is None:
        return n
    wf = w.to(fly.fp32)
    if MODE == MODE_GEMMA:
        return n * (wf + 1.0)
    return n * wf


def _col_mask(BLOCK, valid):
    """``arange(BLOCK) < valid``, or None when the whole block is valid."""
    return None if valid >= BLOCK else fly.arange(0, BLOCK) < valid


# -- forward -----------------------------------------------------------------------------------------


@fly.kernel
def rmsnorm_fwd_rows(
    x,
    res,
    w,
    y,
    res_out,
    rstd,
    M,
    eps,
    N: fly.constexpr,
    BLOCK: fly.constexpr,
    R: fly.constexpr,
    SX: fly.constexpr,
    SR: fly.constexpr,
    MODE: fly.constexpr,
):
    """Several rows per program: one ``(R, BLOCK)`` tile (``BLOCK >= N``), for short rows."""
    pid = fly.program_id(0)
    row0 = pid * R
    rows = row0 + fly.arange(0, R)
    rmask = rows < M
    cmask = _col_mask(BLOCK, N)
    mask = rmask[:, None] if cmask is None else rmask[:, None] & cmask[None, :]
    h = _load(_rows(x, row0, R, SX, BLOCK), mask).to(fly.fp32)
    if res is not None:
        hr = (h + _load(_rows(res, row0, R, SR, BLOCK), mask).to(fly.fp32)).to(x.dtype)
        _store(_rows(res_out, row0, R, N, BLOCK), hr, mask)
        h = hr.to(fly.fp32)
    r = fly.rsqrt(fly.sum(h * h, 1) * (1.0 / N) + eps)  # (R,)
    if rstd is not None:
        _store(rstd[fly.ds(row0.to(rstd.index_dtype), R)], r, rmask)
    wt = None
    if w is not None:
        wt = _load(w.tile((BLOCK,), 0), cmask)[None, :]
    out = _apply_weight(h * r[:, None], wt, MODE, x.dtype)
    _store(_rows(y, row0, R, N, BLOCK), out, mask)


@fly.kernel
def rmsnorm_fwd_row(
    x,
    res,
    w,
    y,
    res_out,
    rstd,
    s,
    eps,
    N: fly.constexpr,
    BLOCK: fly.constexpr,
    SX: fly.constexpr,
    SR: fly.constexpr,
    SY: fly.constexpr,
    MODE: fly.constexpr,
):
    """One row per program, held in registers as one ``(BLOCK,)`` tile (``BLOCK >= N``).

    Row strides: the constexpr ``SX``/``SR``/``SY`` where nonzero, else the one
    run-time stride ``s`` (``configs.row_stride_args`` picks): a run-time
    stride that is a multiple of 16 proves the same alignment, and LLVM then
    folds the row offset into the address shift (``v_add_lshl``) instead of
    the ``or`` it emits, and cannot fold, for ``row * 8192`` with a constant.
    """
    row = fly.program_id(0)
    m = _col_mask(BLOCK, N)
    h = _load(_row(x, row, SX or s, BLOCK), m).to(fly.fp32)
    if res is not None:
        hr = (h + _load(_row(res, row, SR or s, BLOCK), m).to(fly.fp32)).to(x.dtype)
        _store(_row(res_out, row, SY or s, BLOCK), hr, m)
        h = hr.to(fly.fp32)
    r = fly.rsqrt(fly.sum(h * h, 0) * (1.0 / N) + eps)
    if rstd is not None:
        _store(rstd[fly.ds(row.to(rstd.index_dtype), 1)], r, None)
    wt = None
    if w is not None:
        wt = _load(w.tile((BLOCK,), 0), m)
    _store(_row(y, row, SY or s, BLOCK), _apply_weight(h * r, wt, MODE, x.dtype), m)


@fly.kernel
def rmsnorm_fwd_looped(
    x,
    res,
    w,
    y,
    res_out,
    rstd,
    eps,
    N: fly.constexpr,
    BLOCK: fly.constexpr,
    SX: fly.constexpr,
    SR: fly.constexpr,
    MODE: fly.constexpr,
):
    """One row per program, looping over ``BLOCK``-column blocks: registers stay bounded.

    Pass 1 accumulates ``h*h`` elementwise in a ``(BLOCK,)`` fp32 tile (one
    reduction at the end); pass 2 re-reads the row (from L2 for rows that fit
    it) and writes ``y``. With a residual, pass 1 writes ``res_out`` and pass
    2 recomputes ``h = round(x + res)`` from the inputs instead of reading
    ``res_out`` back, so nothing relies on this program's own stores being
    visible to its later loads. The full blocks run in a ``fly.range`` loop
    without masks; a partial last block is peeled and masked.
    """
    row = fly.program_id(0)
    NFULL = (N // BLOCK) * BLOCK
    tail = _col_mask(BLOCK, N - NFULL)

    def h_at(k, m):
        h = _load(_row(x, row, SX, BLOCK, k), m).to(fly.fp32)
        if res is None:
            return h, None
        hr = (h + _load(_row(res, row, SR, BLOCK, k), m).to(fly.fp32)).to(x.dtype)
        return hr.to(fly.fp32), hr

    acc = fly.zeros((BLOCK,), fly.fp32)
    if NFULL > 0:
        for k in fly.range(0, NFULL, BLOCK):
            h, hr = h_at(k, None)
            if res is not None:
                _store(_row(res_out, row, N, BLOCK, k), hr, None)
            acc += h * h
    if NFULL < N:
        h, hr = h_at(NFULL, tail)
        if res is not None:
            _store(_row(res_out, row, N, BLOCK, NFULL), hr, tail)
        acc += h * h
    r = fly.rsqrt(fly.sum(acc, 0) * (1.0 / N) + eps)
    if rstd is not None:
        _store(rstd[fly.ds(row.to(rstd.index_dtype), 1)], r, None)

    def normalize(k, m):
        h, _ = h_at(k, m)
        wt = None if w is None else _load(w[fly.ds(k, BLOCK)], m)
        _store(_row(y, row, N, BLOCK, k), _apply_weight(h * r, wt, MODE, x.dtype), m)

    if NFULL > 0:
        for k in fly.range(0, NFULL, BLOCK):
            normalize(k, None)
    if NFULL < N:
        normalize(NFULL, tail)


# -- backward ----------------------------------------------------------------------------------------
#
# With xhat = x * rstd and gw = g * w (g without a weight):
#   dx = (gw - xhat * sum(xhat * gw) / N) * rstd     (ATen's decomposition, term for term)
#   dw = sum over rows of g * xhat
# dw is accumulated per program in fp32 registers over the program's rows and then either written
# to its row of ``dw_part`` (deterministic: rmsnorm_dw_reduce sums the partials in a fixed order)
# or atomically added to the fp32 ``dw_acc`` (ATOMIC).


@fly.kernel
def rmsnorm_bwd_rows(
    g,
    x,
    rstd,
    w,
    dx,
    dw_part,
    dw_acc,
    M,
    CHUNK,
    N: fly.constexpr,
    BLOCK: fly.constexpr,
    R: fly.constexpr,
    SG: fly.constexpr,
    SX: fly.constexpr,
):
    """Backward with whole rows in registers: program ``p`` handles rows ``[p*CHUNK, (p+1)*CHUNK)``,
    ``R`` at a time as ``(R, BLOCK)`` tiles (``BLOCK >= N``), and owns one dweight partial."""
    pid = fly.program_id(0)
    start = pid * CHUNK
    stop = fly.minimum(start + CHUNK, M)
    cmask = _col_mask(BLOCK, N)
    wt = None
    if w is not None:
        wt = _load(w.tile((BLOCK,), 0), cmask).to(fly.fp32)[None, :]
    want_dw = dw_part is not None or dw_acc is not None
    acc = fly.zeros((BLOCK,), fly.fp32)
    for row0 in fly.range(start, stop, R):
        rows = row0 + fly.arange(0, R)
        rmask = rows < stop
        mask = rmask[:, None] if cmask is None else rmask[:, None] & cmask[None, :]
        gt = _load(_rows(g, row0, R, SG, BLOCK), mask).to(fly.fp32)
        xt = _load(_rows(x, row0, R, SX, BLOCK), mask).to(fly.fp32)
        rs = _load(rstd[fly.ds(row0.to(rstd.index_dtype), R)], rmask)[:, None]
        xhat = xt * rs
        gw = gt if wt is None else gt * wt
        if dx is not None:
            c = fly.sum(xhat * gw, 1)[:, None] * (1.0 / N)
            _store(_rows(dx, row0, R, N, BLOCK), (gw - xhat * c) * rs, mask)
        if want_dw:
            acc += fly.sum(gt * xhat, 0)
    if dw_part is not None:
        _store(_row(dw_part, pid, N, BLOCK), acc, cmask)
    if dw_acc is not None:
        dw_acc.tile((BLOCK,), 0).atomic_add(acc, mask=cmask)


@fly.kernel
def rmsnorm_bwd_rowdot(
    g,
    x,
    rstd,
    w,
    coef,
    N: fly.constexpr,
    BLOCK: fly.constexpr,
    SG: fly.constexpr,
    SX: fly.constexpr,
):
    """Backward for long rows, step 1: ``coef[row] = sum(xhat * gw) / N``, looping over columns."""
    row = fly.program_id(0)
    rs = _load(rstd[fly.ds(row.to(rstd.index_dtype), 1)], None)
    NFULL = (N // BLOCK) * BLOCK

    def term(k, m):
        gw = _load(_row(g, row, SG, BLOCK, k), m).to(fly.fp32)
        if w is not None:
            gw = gw * _load(w[fly.ds(k, BLOCK)], m).to(fly.fp32)
        return gw * _load(_row(x, row, SX, BLOCK, k), m).to(fly.fp32)

    acc = fly.zeros((BLOCK,), fly.fp32)
    if NFULL > 0:
        for k in fly.range(0, NFULL, BLOCK):
            acc += term(k, None)
    if NFULL < N:
        acc += term(NFULL, _col_mask(BLOCK, N - NFULL))
    # sum(xhat * gw) = rstd * sum(x * gw)
    _store(coef[fly.ds(row.to(coef.index_dtype), 1)], fly.sum(acc, 0) * rs * (1.0 / N), None)


@fly.kernel
def rmsnorm_bwd_cols(
    g,
    x,
    rstd,
    coef,
    w,
    dx,
    dw_part,
    dw_acc,
    M,
    CHUNK,
    N: fly.constexpr,
    BLOCK: fly.constexpr,
    SG: fly.constexpr,
    SX: fly.constexpr,
):
    """Backward for long rows, step 2, on a (column blocks, row chunks) grid: program
    ``(j, p)`` computes ``dx`` for columns ``[j*BLOCK, (j+1)*BLOCK)`` of rows
    ``[p*CHUNK, (p+1)*CHUNK)`` and that block of program ``p``'s dweight partial."""
    j = fly.program_id(0)
    p = fly.program_id(1)
    k = j * BLOCK
    m = fly.arange(0, BLOCK) + k < N if N % BLOCK else None
    wt = None
    if w is not None:
        wt = _load(w[fly.ds(k, BLOCK)], m).to(fly.fp32)
    start = p * CHUNK
    stop = fly.minimum(start + CHUNK, M)
    acc = fly.zeros((BLOCK,), fly.fp32)
    for row in fly.range(start, stop, 1):
        gt = _load(_row(g, row, SG, BLOCK, k), m).to(fly.fp32)
        xt = _load(_row(x, row, SX, BLOCK, k), m).to(fly.fp32)
        rs = _load(rstd[fly.ds(row.to(rstd.index_dtype), 1)], None)
        xhat = xt * rs
        if dx is not None:
            c = _load(coef[fly.ds(row.to(coef.index_dtype), 1)], None)
            gw = gt if wt is None else gt * wt
            _store(_row(dx, row, N, BLOCK, k), (gw - xhat * c) * rs, m)
        if dw_part is not None or dw_acc is not None:
            acc += gt * xhat
    if dw_part is not None:
        _store(_row(dw_part, p, N, BLOCK, k), acc, m)
    if dw_acc is not None:
        dw_acc[fly.ds(k, BLOCK)].atomic_add(acc, mask=m)


@fly.kernel
def rmsnorm_dw_reduce(part, dw, P, N: fly.constexpr, BLOCK: fly.constexpr, RB: fly.constexpr):
    """``dw[cols] = sum_p part[p, cols]`` for a ``(P, N)`` fp32 partial buffer, in a fixed order.

    Each program owns ``BLOCK`` columns and walks the partials ``RB`` rows at a
    time in increasing ``p``, reducing each ``(RB, BLOCK)`` tile along its
    rows: the order depends only on ``(P, config)``, never on timing, so the
    result is bitwise reproducible (no atomics)."""
    j = fly.program_id(0)
    k = j * BLOCK
    cmask = fly.arange(0, BLOCK) + k < N if N % BLOCK else None
    acc = fly.zeros((BLOCK,), fly.fp32)
    for p0 in fly.range(0, P, RB):
        rmask = (p0 + fly.arange(0, RB)) < P
        mask = rmask[:, None] if cmask is None else rmask[:, None] & cmask[None, :]
        acc += fly.sum(_load(_rows(part, p0, RB, N, BLOCK, k), mask), 0)
    _store(dw[fly.ds(k, BLOCK)], acc, cmask)


#: every kernel of the family by a short name (configs.py keys its spaces by these)
KERNELS = {
    "fwd_rows": rmsnorm_fwd_rows,
    "fwd_row": rmsnorm_fwd_row,
    "fwd_looped": rmsnorm_fwd_looped,
    "bwd_rows": rmsnorm_bwd_rows,
    "bwd_rowdot": rmsnorm_bwd_rowdot,
    "bwd_cols": rmsnorm_bwd_cols,
    "dw_reduce": rmsnorm_dw_reduce,
}
