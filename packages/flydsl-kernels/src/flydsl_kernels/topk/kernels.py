"""TopK kernels in FlyDSL: small-k registers, tile sort, radix select, merge sort.

Order keys
----------
Every kernel ranks elements by an int32 *selection key* computed from the
value, so that all comparisons are exact integer comparisons:

* fp32: the float's bits with the magnitude bits flipped for negatives
  (integer order == float order); fp16/bf16: the same on their own 16 bits
  (sign-extended), so a 16-bit input needs only 16 key bits, i.e. two radix
  passes instead of four;
* -0.0 and +0.0 share key 0 (torch treats them as equal), and every NaN gets
  the one key above +inf (torch ranks NaN highest, whatever its payload);
* for ``largest=False`` the key is negated. Keys never reach INT32_MIN
  (the smallest real key is that of -inf, -(2**31 - 2**23 - 1) for fp32),
  so INT32_MIN is free as the sentinel of padding and of taken elements.

Kernels select the elements with the largest selection keys, ties by the
lowest index, which is exactly ``torch.sort(x, descending=largest,
stable=True)`` restricted to the first k. Values are always read back from
the input at the selected index (its own bits, -0.0 and NaN payloads
included), so ``x.gather(-1, idx) == values`` holds by construction.

Kernels (one program per row unless stated)
-------------------------------------------
``topk_small``   k <= 16: K rounds of argmax-and-mask over a row tile in
                 registers; rows longer than the tile loop over chunks and
                 merge each chunk's winners with the running top-k.
``topk_sort``    N <= tile (16384): one tile top-k (bitonic) on the keys.
``topk_radix``   radix select, fused: one 8-bit digit pass per key byte
                 (a histogram of the digits of the elements that still match
                 the threshold's prefix; ``fly.histogram``), which fixes the
                 threshold key T and how many elements equal to T are needed;
                 then one compaction pass writes the survivors (keys > T, and
                 the first ones == T by index) in index order.
``radix_hist_split`` / ``radix_count_split`` / ``radix_compact_split``
                 the same with each row split over S programs (grid (M, S))
                 for few long rows: per-pass histograms are summed with
                 atomics (integer adds: the sums are deterministic); the
                 compaction is deterministic (per-slice counts + prefix) or
                 uses atomic counters (faster, arbitrary survivor order and
                 tie choice: only with deterministic algorithms off).
``sort_tile``    sorts up to 4096 survivors of a row (stable, so ties keep
                 index order) and writes values/int64 indices.
``sort_runs`` + ``merge_pass``
                 stable merge sort for more survivors: sorted runs of B, then
                 log2(k/B) merge passes; an output block finds its split by
                 a merge-path binary search and sorts the 2B candidates.
``moe_router_kernel``  fused MoE routing (see api.py's ``moe_router``).

``KERNELS`` (at the end) names them all.
"""

from __future__ import annotations

import flydsl_core as fly

INT32_MIN = -(2**31)
RADIX_BITS = 8
RADIX = 1 << RADIX_BITS


def order_key(v, LARGEST, KEY_BITS):
    """int32 selection keys of the tile ``v`` (fp32 if KEY_BITS == 32, else fp16/bf16)."""
    if KEY_BITS == 32:
        bits = v.to(fly.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        top = 0x7FFFFFFF
    else:
        bits = v.to(fly.int16, bitcast=True).to(fly.int32)
        key = bits ^ ((bits >> 15) & 0x7FFF)
        top = 0x7FFF
    key = fly.where(v == 0, 0, key)
    key = fly.where(v != v, top, key)
    return key if LARGEST else -key


def _digit_pattern(key, KEY_BITS):
    """The key as an unsigned KEY_BITS-bit pattern (in the low bits): digit order == key order."""
    return key ^ (INT32_MIN if KEY_BITS == 32 else 1 << (KEY_BITS - 1))


def _pick_digit(hist, need, bins):
    """The digit D holding the ``need``-th largest remaining element, and the count above D."""
    above_or_at = fly.cumsum(hist, 0, reverse=True)  # elements with digit >= d
    digit = fly.sum(fly.where(above_or_at >= need, 1, 0), 0) - 1
    above = fly.sum(fly.where(bins > digit, hist, 0), 0)
    return digit, above


def _threshold(prefix, digit, KEY_BITS):
    """Signed selection key of the threshold from its unsigned digits (int64 math: no wrap)."""
    t = prefix.to(fly.int64) * RADIX + digit.to(fly.int64) - (1 << (KEY_BITS - 1))
    return t.to(fly.int32)


def _keys(v, valid, LARGEST, KEY_BITS):
    """Selection keys of a loaded row tile; lanes past the row get the INT32_MIN sentinel."""
    return fly.where(valid, order_key(v, LARGEST, KEY_BITS), INT32_MIN)


def _store_selected(x, vals, idx, row, sel, K, KP):
    """Write row ``row``'s K results: values re-read from ``x`` at the chosen indices ``sel``."""
    keep = fly.arange(0, KP) < K
    vals[row].tile((KP,), 0).store(x[row][sel].load(mask=keep), mask=keep)
    idx[row].tile((KP,), 0).store(sel.to(fly.int64), mask=keep)


# -- (a) small k: argmax rounds in registers ------------------------------------------------


@fly.kernel
def topk_small(
    x: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    K: fly.constexpr,
    KP: fly.constexpr,
    BLOCK: fly.constexpr,
    CHUNKED: fly.constexpr,
    LARGEST: fly.constexpr,
    KEY_BITS: fly.constexpr,
):
    """Top K (<= 16 or so) of each row: K rounds of argmax (first max wins) and mask-out."""
    row = fly.program_id(0)
    n = x.shape[1]
    lane = fly.arange(0, BLOCK)
    slot = fly.arange(0, KP)
    sel = fly.zeros((KP,), fly.int32)
    if not CHUNKED:
        v = x[row].tile((BLOCK,), 0).load()
        s = _keys(v, lane < n, LARGEST, KEY_BITS)
        for j in fly.static_range(K):
            m = fly.argmax(s, 0)
            sel = fly.where(slot == j, m, sel)
            s = fly.where(lane == m, INT32_MIN, s)
    else:
        # Running top-K (keys descending, ties by index) merged with each chunk's best:
        # a round takes the better of the two heads; candidates come from earlier chunks,
        # so they win ties (lower indices).
        ckey = fly.full((KP,), INT32_MIN, fly.int32)
        for start in fly.range(0, n, BLOCK):
            v = x[row, fly.ds(start, BLOCK)].load()
            s = _keys(v, start + lane < n, LARGEST, KEY_BITS)
            ck = ckey
            nkey = fly.full((KP,), INT32_MIN, fly.int32)
            nsel = fly.zeros((KP,), fly.int32)
            for j in fly.static_range(K):
                cm = fly.argmax(ck, 0)
                cv = fly.max(ck, 0)
                bm = fly.argmax(s, 0)
                bv = fly.max(s, 0)
                take_c = cv >= bv
                ci = fly.sum(fly.where(slot == cm, sel, 0), 0)
                nkey = fly.where(slot == j, fly.where(take_c, cv, bv), nkey)
                nsel = fly.where(slot == j, fly.where(take_c, ci, start + bm), nsel)
                ck = fly.where(take_c & (slot == cm), INT32_MIN, ck)
                s = fly.where(~take_c & (lane == bm), INT32_MIN, s)
            ckey.set(nkey)
            sel.set(nsel)
    _store_selected(x, vals, idx, row, sel, K, KP)


# -- (b) moderate k: one tile top-k -----------------------------------------------------------


@fly.kernel
def topk_sort(
    x: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    K: fly.constexpr,
    KP: fly.constexpr,
    BLOCK: fly.constexpr,
    LARGEST: fly.constexpr,
    KEY_BITS: fly.constexpr,
):
    """Top K of rows of N <= BLOCK: a stable tile top-k (bitonic) of the keys."""
    row = fly.program_id(0)
    n = x.shape[1]
    lane = fly.arange(0, BLOCK)
    v = x[row].tile((BLOCK,), 0).load()
    s = _keys(v, lane < n, LARGEST, KEY_BITS)
    _, sel = fly.topk(s, KP, 0, largest=True)
    _store_selected(x, vals, idx, row, sel, K, KP)


# -- (c) radix select -----------------------------------------------------------------------------


def _radix_chunk(x, row, start, lane, n, LARGEST, KEY_BITS):
    v = x[row, fly.ds(start, lane.shape[0])].load()
    return v, order_key(v, LARGEST, KEY_BITS), start + lane < n


def _digit_hist(s, live, p, prefix, KEY_BITS):
    """Histogram of pass ``p``'s digit over elements whose higher digits equal ``prefix``."""
    shift = KEY_BITS - RADIX_BITS * (p + 1)
    u = _digit_pattern(s, KEY_BITS)
    if p > 0:
        high = (u >> (shift + RADIX_BITS)) & ((1 << (RADIX_BITS * p)) - 1)
        live = live & (high == prefix)
    return fly.histogram((u >> shift) & (RADIX - 1), RADIX, mask=live)


def _compact_chunk(s, v, cols, live, thr, need, taken, eqseen):
    """Which elements of a chunk survive (> thr, or == thr within the first ``need``), and where."""
    gt = live & (s > thr)
    eq = live & (s == thr)
    eqi = fly.where(eq, 1, 0)
    rank = eqseen + fly.cumsum(eqi, 0) - eqi
    take = gt | (eq & (rank < need))
    ti = fly.where(take, 1, 0)
    pos = taken + fly.cumsum(ti, 0) - ti
    return take, pos, fly.sum(ti, 0), fly.sum(eqi, 0)


def _emit_survivors(row, pos, take, s, v, cols, vals, idx, wkey, widx, SORTED):
    if SORTED:  # to the workspace, for sort_tile / merge sort
        wkey[row][pos].store(s, mask=take)
        widx[row][pos].store(cols, mask=take)
    else:  # straight to the result, in index order
        vals[row][pos].store(v, mask=take)
        idx[row][pos].store(cols.to(fly.int64), mask=take)


@fly.kernel
def topk_radix(
    x: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    wkey: fly.Tensor,
    widx: fly.Tensor,
    k,
    BLOCK: fly.constexpr,
    LARGEST: fly.constexpr,
    KEY_BITS: fly.constexpr,
    SORTED: fly.constexpr,
):
    """Radix select of the top k of a row (one program per row), survivors in index order."""
    row = fly.program_id(0)
    n = x.shape[1]
    lane = fly.arange(0, BLOCK)
    bins = fly.arange(0, RADIX)
    npass = KEY_BITS // RADIX_BITS
    prefix = fly.zeros((), fly.int32)
    need = fly.full((), k, fly.int32)
    thr = fly.zeros((), fly.int32)
    for p in fly.static_range(npass):
        hist = fly.zeros((RADIX,), fly.int32)
        for start in fly.range(0, n, BLOCK):
            _, s, live = _radix_chunk(x, row, start, lane, n, LARGEST, KEY_BITS)
            hist += _digit_hist(s, live, p, prefix, KEY_BITS)
        digit, above = _pick_digit(hist, need, bins)
        need = need - above
        if p < npass - 1:
            prefix = prefix * RADIX + digit
        else:
            thr = _threshold(prefix, digit, KEY_BITS)
    taken = fly.zeros((), fly.int32)
    eqseen = fly.zeros((), fly.int32)
    for start in fly.range(0, n, BLOCK):
        v, s, live = _radix_chunk(x, row, start, lane, n, LARGEST, KEY_BITS)
        cols = start + lane
        take, pos, nt, ne = _compact_chunk(s, v, cols, live, thr, need, taken, eqseen)
        _emit_survivors(row, pos, take, s, v, cols, vals, idx, wkey, widx, SORTED)
        taken += nt
        eqseen += ne


def _replay(hist, row, k, upto, KEY_BITS):
    """Prefix, remaining count and (after all passes) threshold from the pass histograms."""
    bins = fly.arange(0, RADIX)
    npass = KEY_BITS // RADIX_BITS
    prefix = fly.zeros((), fly.int32)
    need = fly.full((), k, fly.int32)
    thr = fly.zeros((), fly.int32)
    for q in fly.static_range(upto):
        h = hist[row, q].tile((RADIX,), 0).load()
        digit, above = _pick_digit(h, need, bins)
        need = need - above
        if q < npass - 1:
            prefix = prefix * RADIX + digit
        else:
            thr = _threshold(prefix, digit, KEY_BITS)
    return prefix, need, thr


@fly.kernel
def radix_hist_split(
    x: fly.Tensor,
    hist: fly.Tensor,
    k,
    span,
    PASS: fly.constexpr,
    BLOCK: fly.constexpr,
    LARGEST: fly.constexpr,
    KEY_BITS: fly.constexpr,
):
    """Pass PASS of a split radix select: slice ``program_id(1)`` adds its digit histogram."""
    row = fly.program_id(0)
    lo = fly.program_id(1) * span
    n = x.shape[1]
    lane = fly.arange(0, BLOCK)
    prefix, _, _ = _replay(hist, row, k, PASS, KEY_BITS)
    acc = fly.zeros((RADIX,), fly.int32)
    for start in fly.range(lo, fly.minimum(lo + span, n), BLOCK):
        _, s, live = _radix_chunk(x, row, start, lane, n, LARGEST, KEY_BITS)
        acc += _digit_hist(s, live, PASS, prefix, KEY_BITS)
    hist[row, PASS].tile((RADIX,), 0).atomic_add(acc)


@fly.kernel
def radix_count_split(
    x: fly.Tensor,
    hist: fly.Tensor,
    counts: fly.Tensor,
    k,
    span,
    BLOCK: fly.constexpr,
    LARGEST: fly.constexpr,
    KEY_BITS: fly.constexpr,
):
    """Deterministic split compaction, step 1: each slice counts its keys > T and == T."""
    row = fly.program_id(0)
    sl = fly.program_id(1)
    lo = sl * span
    n = x.shape[1]
    lane = fly.arange(0, BLOCK)
    _, _, thr = _replay(hist, row, k, KEY_BITS // RADIX_BITS, KEY_BITS)
    ngt = fly.zeros((), fly.int32)
    neq = fly.zeros((), fly.int32)
    for start in fly.range(lo, fly.minimum(lo + span, n), BLOCK):
        _, s, live = _radix_chunk(x, row, start, lane, n, LARGEST, KEY_BITS)
        ngt += fly.sum(fly.where(live & (s > thr), 1, 0), 0)
        neq += fly.sum(fly.where(live & (s == thr), 1, 0), 0)
    two = fly.arange(0, 2)
    counts[row, sl].tile((2,), 0).store(fly.where(two == 0, ngt, neq))


@fly.kernel
def radix_compact_split(
    x: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    wkey: fly.Tensor,
    widx: fly.Tensor,
    hist: fly.Tensor,
    counts: fly.Tensor,
    k,
    span,
    nslices,
    BLOCK: fly.constexpr,
    SP: fly.constexpr,
    LARGEST: fly.constexpr,
    KEY_BITS: fly.constexpr,
    SORTED: fly.constexpr,
    DETERMINISTIC: fly.constexpr,
):
    """Split compaction, step 2: write the slice's survivors.

    Deterministic: positions from the counts of the slices before this one, so
    survivors land in index order. Otherwise ``counts[row]`` holds two atomic
    counters (taken, seen == T) and chunks claim positions as they come.
    """
    row = fly.program_id(0)
    sl = fly.program_id(1)
    lo = sl * span
    n = x.shape[1]
    lane = fly.arange(0, BLOCK)
    _, need, thr = _replay(hist, row, k, KEY_BITS // RADIX_BITS, KEY_BITS)
    taken = fly.zeros((), fly.int32)
    eqseen = fly.zeros((), fly.int32)
    if DETERMINISTIC:
        sar = fly.arange(0, SP)
        before = sar < fly.minimum(sl, nslices)
        c = fly.where(before[:, None], counts[row].tile((SP, 2), (0, 0)).load(), 0)
        col = fly.arange(0, 2)[None, :]
        gt_before = fly.sum(fly.sum(fly.where(col == 0, c, 0), 1), 0)
        eq_before = fly.sum(fly.sum(fly.where(col == 1, c, 0), 1), 0)
        taken += gt_before + fly.minimum(eq_before, need)
        eqseen += eq_before
    for start in fly.range(lo, fly.minimum(lo + span, n), BLOCK):
        v, s, live = _radix_chunk(x, row, start, lane, n, LARGEST, KEY_BITS)
        cols = start + lane
        if DETERMINISTIC:
            take, pos, nt, ne = _compact_chunk(s, v, cols, live, thr, need, taken, eqseen)
            taken += nt
            eqseen += ne
        else:
            eq = live & (s == thr)
            eqi = fly.where(eq, 1, 0)
            base_eq = counts[row, 1].atomic_add(fly.sum(eqi, 0))
            rank = base_eq + fly.cumsum(eqi, 0) - eqi
            take = (live & (s > thr)) | (eq & (rank < need))
            ti = fly.where(take, 1, 0)
            base = counts[row, 0].atomic_add(fly.sum(ti, 0))
            pos = base + fly.cumsum(ti, 0) - ti
        _emit_survivors(row, pos, take, s, v, cols, vals, idx, wkey, widx, SORTED)


# -- sorting the survivors ---------------------------------------------------------------------------


@fly.kernel
def sort_tile(
    x: fly.Tensor,
    wkey: fly.Tensor,
    widx: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    k,
    KP: fly.constexpr,
):
    """Sort a row's k <= KP survivors by key (stable: ties keep index order); write the result."""
    row = fly.program_id(0)
    s = wkey[row].tile((KP,), 0).load(other=INT32_MIN)
    _, perm = fly.sort(s, 0, descending=True, return_indices=True)
    keep = fly.arange(0, KP) < k
    src = widx[row][perm].load(mask=keep)
    vals[row].tile((KP,), 0).store(x[row][src].load(mask=keep), mask=keep)
    idx[row].tile((KP,), 0).store(src.to(fly.int64), mask=keep)


@fly.kernel
def sort_runs(
    ikey: fly.Tensor,
    iidx: fly.Tensor,
    okey: fly.Tensor,
    oidx: fly.Tensor,
    B: fly.constexpr,
):
    """Merge sort, step 1: sort each run of B (key, index) pairs (stable, keys descending)."""
    row = fly.program_id(0)
    r = fly.program_id(1)
    s = ikey[row].tile((B,), r).load(other=INT32_MIN)
    ks, perm = fly.sort(s, 0, descending=True, return_indices=True)
    okey[row].tile((B,), r).store(ks)
    oidx[row].tile((B,), r).store(iidx[row][r * B + perm].load())


@fly.kernel
def merge_pass(
    x: fly.Tensor,
    ikey: fly.Tensor,
    iidx: fly.Tensor,
    okey: fly.Tensor,
    oidx: fly.Tensor,
    vals: fly.Tensor,
    idx: fly.Tensor,
    k,
    run,
    B: fly.constexpr,
    FINAL: fly.constexpr,
):
    """Merge sort, one pass: merge sorted runs of ``run`` pairs into runs of 2*run.

    Program (row, o) writes merged positions [o*B, o*B + B). A merge-path
    binary search finds how many of them come from the left run (ties go left,
    which keeps the sort stable); the next B of each run are the only
    candidates, and a stable tile sort of the 2B of them orders the block.
    """
    row = fly.program_id(0)
    out0 = fly.program_id(1) * B
    a0 = (out0 // (2 * run)) * (2 * run)
    b0 = a0 + run
    la = fly.maximum(fly.minimum(k - a0, run), 0)
    lb = fly.maximum(fly.minimum(k - b0, run), 0)
    d = out0 - a0
    lo = fly.maximum(d - lb, 0)
    hi = fly.minimum(d, la)
    for _ in fly.while_(lambda: lo < hi):
        mid = (lo + hi) // 2
        a_first = ikey[row, a0 + mid].load() >= ikey[row, b0 + d - 1 - mid].load()
        lo.set(fly.where(a_first, mid + 1, lo))
        hi.set(fly.where(a_first, hi, mid))
    i = lo
    j = d - lo
    p = fly.arange(0, 2 * B)
    from_a = p < B
    src = fly.where(from_a, a0 + i + p, b0 + j + (p - B))
    valid = fly.where(from_a, i + p < la, j + (p - B) < lb)
    key = ikey[row][src].load(mask=valid, other=INT32_MIN)
    ks, perm = fly.sort(key, 0, descending=True, return_indices=True)
    srcp = fly.where(perm < B, a0 + i + perm, b0 + j + (perm - B))
    keep = (p < B) & (out0 + p < k)
    oi = iidx[row][srcp].load(mask=keep)
    if FINAL:
        vals[row, fly.ds(out0, 2 * B)].store(x[row][oi].load(mask=keep), mask=keep)
        idx[row, fly.ds(out0, 2 * B)].store(oi.to(fly.int64), mask=keep)
    else:
        okey[row, fly.ds(out0, 2 * B)].store(ks, mask=keep)
        oidx[row, fly.ds(out0, 2 * B)].store(oi, mask=keep)


# -- fused MoE router ----------------------------------------------------------------------------------


def _decode_key(key):
    """fp32 value of a (largest) fp32 selection key (NaN and -0 come back canonical)."""
    bits = key ^ ((key >> 31) & 0x7FFFFFFF)
    return bits.to(fly.fp32, bitcast=True)


@fly.kernel
def moe_router_kernel(
    logits: fly.Tensor,
    bias: fly.Tensor,
    weights: fly.Tensor,
    ids: fly.Tensor,
    TOPK: fly.constexpr,
    KP: fly.constexpr,
    BLOCK: fly.constexpr,
    SCORING: fly.constexpr,
    HAS_BIAS: fly.constexpr,
    RENORM: fly.constexpr,
    NGROUP: fly.constexpr,
    TOPK_GROUP: fly.constexpr,
    SCALE: fly.constexpr,
):
    """One token per program: scores, (grouped, biased) selection, weights.

    SCORING 0 = softmax then top-k (Qwen3-MoE), 1 = sigmoid with selection
    bias (DeepSeek-V3), 2 = top-k on the logits then softmax over the chosen
    (gpt-oss). Softmax is monotone, so selection uses the logits' keys
    (exact, and the same ties as selecting on the probabilities).
    """
    row = fly.program_id(0)
    e = logits.shape[1]
    lane = fly.arange(0, BLOCK)
    valid = lane < e
    l = logits[row].tile((BLOCK,), 0).load().to(fly.fp32)
    keep = fly.arange(0, KP) < TOPK
    if SCORING == 1:
        score = fly.sigmoid(l)
        choice = score
        if HAS_BIAS:
            choice = score + bias.tile((BLOCK,), 0).load().to(fly.fp32)
        if NGROUP > 1:
            # DeepSeek-V3 group-limited routing: a group's score is the sum of its top-2
            # choices; only experts of the TOPK_GROUP best groups stay (others read -inf).
            eg = BLOCK // NGROUP
            g2 = choice.reshape(NGROUP, eg)
            col = fly.arange(0, eg)[None, :]
            first = fly.argmax(g2, 1)
            m1 = fly.max(g2, 1)
            m2 = fly.max(fly.where(col == first[:, None], float("-inf"), g2), 1)
            gk = order_key(m1 + m2, True, 32)
            gi = fly.arange(0, NGROUP)
            better = (gk[None, :] > gk[:, None]) | (
                (gk[None, :] == gk[:, None]) & (gi[None, :] < gi[:, None])
            )
            gsel = fly.sum(fly.where(better, 1, 0), 1) < TOPK_GROUP
            emask = fly.broadcast_to(gsel[:, None], (NGROUP, eg)).reshape(BLOCK)
            choice = fly.where(emask, choice, float("-inf"))
        _, sel = fly.topk(fly.where(valid, order_key(choice, True, 32), INT32_MIN), KP, 0)
        w = fly.sigmoid(logits[row][sel].load(mask=keep).to(fly.fp32))
    else:
        kl, sel = fly.topk(fly.where(valid, order_key(l, True, 32), INT32_MIN), KP, 0)
        top = _decode_key(kl)
        if SCORING == 0:
            mx = fly.max(fly.where(valid, l, float("-inf")), 0)
            denom = fly.sum(fly.where(valid, fly.exp(l - mx), 0.0), 0)
            w = fly.exp(top - mx) / denom
        else:
            ex = fly.where(
                keep, fly.exp(top - fly.max(fly.where(keep, top, float("-inf")), 0)), 0.0
            )
            w = ex / fly.sum(ex, 0)
    w = fly.where(keep, w, 0.0)
    if RENORM:
        w = w / (fly.sum(w, 0) + (1e-20 if SCORING == 1 else 0.0))
    if SCALE != 1.0:
        w = w * SCALE
    weights[row].tile((KP,), 0).store(w, mask=keep)
    ids[row].tile((KP,), 0).store(sel, mask=keep)


#: every kernel of the family by a short name (``plan.py`` launches them by it; the names of
#: ``configs.select``'s methods where a kernel is one)
KERNELS = {
    "small": topk_small,
    "sort": topk_sort,
    "radix": topk_radix,
    "radix_hist_split": radix_hist_split,
    "radix_count_split": radix_count_split,
    "radix_compact_split": radix_compact_split,
    "sort_tile": sort_tile,
    "sort_runs": sort_runs,
    "merge_pass": merge_pass,
    "router": moe_router_kernel,
}
