"""One LDS copy for a tile that two matrix products read, one of them transposed (AMD TTGIR).

A tile loaded once and used both as ``dot(a, x)``'s operand and as ``dot(b, x.T)``'s (the
attention backward's Q and dO: ``dK += dS^T Q`` and ``S^T = K Q^T``) reaches Triton 3.9's
AMD TTGIR as two trips through LDS: a ``local_alloc`` / ``local_load`` for the direct operand
and a layout conversion (its own LDS scratch: a write, a barrier pair and a read) feeding a
register ``tt.trans`` for the transposed one. Every such buffer shares the same LDS offset
(their live ranges do not overlap), so each costs a barrier before its write and one after:
the gfx950 dK/dV main loop ran 8 barriers and 6 LDS writes per query step.

``share_transposed(text)`` rewrites the TTGIR so that the transposed operand reads the direct
operand's buffer through ``ttg.memdesc_trans`` (what upstream Triton's AMD
``ReuseShmemForDirectAndTransposedUse`` pattern does; 3.9's pass has no such pattern): the
``local_alloc`` moves up to the conversion's place, the conversion goes, and the ``tt.trans``
becomes a ``ttg.local_load`` of the transposed view. One write per tile and trip; both
buffers' live ranges then span the loop body, so they get their own offsets and the loop needs
one barrier pair in all. The buffer's swizzle vector widens to the transposed operand's
``kWidth`` so that its reads stay 128-bit (gfx950: ``ds_read_b128`` one way,
``ds_read_b64_tr_b16`` the other). Same values either way: both layouts are Triton's own
lowering of a shared-memory read, only the staging changes.

The rewrite works on the printed module and is deliberately narrow: it takes only the exact
op shapes above, in one block (the MLIR printer's indentation), with every other use of the
buffer a ``local_load``; anything else stays as it was. ``triton_compile`` applies it where a
kernel asks (the compile option ``SHARE_TRANSPOSED``) and keeps the unrewritten module if the
result does not parse and verify, or compiles again without it if a later stage fails."""

from __future__ import annotations

import logging
import re

from .ttgir_text import aliases, only_use_line, parse, rewrite_each, same_block, uses

#: the compile option (popped before Triton sees the options) that turns the rewrite on
SHARE_TRANSPOSED = "share_transposed_operands"

log = logging.getLogger(__name__)

_SWZ = re.compile(
    r"^#ttg\.swizzled_shared<\{vec = (\d+), perPhase = (\d+), maxPhase = (\d+), "
    r"order = \[(\d+), (\d+)\]\}>$"
)
_CVT = re.compile(
    r"^(?P<ind> *)%(?P<c>[\w.]+) = ttg\.convert_layout %(?P<x>[\w.]+) : "
    r"tensor<(?P<r>\d+)x(?P<k>\d+)x(?P<t>\w+), (?P<src>#[\w.]+)> -> "
    r"tensor<(?P=r)x(?P=k)x(?P=t), #[\w.]+> (?P<loc>loc\([^\n]*\))$",
    re.M,
)


def share_transposed(text: str) -> tuple[str, int]:
    """``text`` (a printed TTGIR module) with every matching direct / transposed operand pair
    staged once (module docstring), and how many pairs were rewritten."""
    layouts = aliases(text)
    return rewrite_each(text, _CVT, lambda t, m, n: _rewrite_one(t, m, layouts))


def _rewrite_one(text: str, m: re.Match, layouts: dict[str, str]) -> str | None:
    ind, c, x, r, k, t = (m.group(g) for g in ("ind", "c", "x", "r", "k", "t"))
    src = m.group("src")
    # the conversion's one use: a [1, 0] transpose into a dot operand, in the same block
    use = only_use_line(text, c)
    if use is None:
        return None
    ts, te = use
    tr = re.match(
        rf"^(?P<ind> *)%(?P<tv>[\w.]+) = tt\.trans %{re.escape(c)} "
        rf"\{{order = array<i32: 1, 0>\}} : tensor<{r}x{k}x{t}, #[\w.]+> -> "
        rf"(?P<ty>tensor<{k}x{r}x{t}, #ttg\.dot_op<\{{opIdx = \d, parent = #[\w.]+, "
        rf"kWidth = (?P<kw>\d+)\}}>>) (?P<loc>loc\([^\n]*\))$",
        text[ts:te],
    )
    if tr is None or tr.group("ind") != ind or not same_block(text, m.end(), ts, len(ind)):
        return None
    # the direct operand's buffer: a local_alloc of the same tile, later in the same block
    al = re.compile(
        rf"^{ind}%(?P<a>[\w.]+) = ttg\.local_alloc %{re.escape(x)} : "
        rf"\(tensor<{r}x{k}x{t}, {re.escape(src)}>\) -> "
        rf"!ttg\.memdesc<{r}x{k}x{t}, (?P<enc>#[\w.]+), #smem> (?P<loc>loc\([^\n]*\))$",
        re.M,
    ).search(text, m.end())
    if al is None or not same_block(text, m.end(), al.start(), len(ind)):
        return None
    a, enc = al.group("a"), al.group("enc")
    sw = _SWZ.match(layouts.get(enc, enc))
    if sw is None:
        return None
    vec, per, mx, o0, o1 = (int(v) for v in sw.groups())
    ld_re = re.compile(
        rf"ttg\.local_load %{re.escape(a)} : !ttg\.memdesc<{r}x{k}x{t}, {re.escape(enc)}, #smem>"
    )
    a_uses = uses(text, a)
    if not a_uses or len(ld_re.findall(text)) != len(a_uses):
        return None
    vec = max(vec, int(tr.group("kw")))
    shared = f"#ttg.swizzled_shared<{{vec = {vec}, perPhase = {per}, maxPhase = {mx}, order = [{o0}, {o1}]}}>"
    shared_t = f"#ttg.swizzled_shared<{{vec = {vec}, perPhase = {per}, maxPhase = {mx}, order = [{o1}, {o0}]}}>"
    mem = f"!ttg.memdesc<{r}x{k}x{t}, {shared}, #smem>"
    mem_t = f"!ttg.memdesc<{k}x{r}x{t}, {shared_t}, #smem>"
    # edit back to front so that earlier offsets stay valid
    edits = [
        (al.start(), al.end() + 1, ""),  # the alloc (and its newline) moves up
        (
            ts,
            te,
            f"{ind}%{tr.group('tv')} = ttg.local_load %{c} : {mem_t} -> {tr.group('ty')} {tr.group('loc')}",
        ),
        (
            m.start(),
            m.end(),
            f"{ind}%{a} = ttg.local_alloc %{x} : (tensor<{r}x{k}x{t}, {src}>) -> {mem} {al.group('loc')}\n"
            f"{ind}%{c} = ttg.memdesc_trans %{a} {{order = array<i32: 1, 0>}} : {mem} -> {mem_t} {m.group('loc')}",
        ),
    ]
    for s, e, rep in sorted(edits, reverse=True):
        text = text[:s] + rep + text[e:]
    return ld_re.sub(f"ttg.local_load %{a} : {mem}", text)


def rewrite_module(mod):
    """``mod`` (Triton's TTGIR module) with ``share_transposed`` applied: printed, rewritten,
    parsed back in its context and verified; ``mod`` itself where nothing matched or the
    rewritten module does not parse or verify (``stage_hook`` runs it as the TTGIR stage)."""
    text, n = share_transposed(str(mod))
    if n == 0:
        return mod
    try:
        new = parse(text, mod.context)
        if not new.verify():
            raise ValueError("the rewritten module does not verify")
    except Exception as e:  # a pattern the rewrite mis-read: Triton's own module stands
        log.warning("shared transposed operands: TTGIR rewrite dropped (%s)", e)
        return mod
    log.debug("shared transposed operands: %d tile(s) staged once", n)
    return new
