"""The AMD TTGIR rewrite that stages a tile read both directly and transposed once
(``flydsl_core.backends.triton.shared_operands``): what it rewrites and what it leaves alone.
Its effect on a compiled loop: ``tests/flydsl_kernels/test_attention_compile.py``
(``test_dkdv_stages_q_and_do_once``)."""

from __future__ import annotations

import pytest

from flydsl_core.backends.triton.shared_operands import share_transposed

#: the shape of Triton 3.9's TTGIR for ``dot(k, q.T)`` and ``dot(p, q)`` of one loaded tile
#: (the dK/dV kernel's loop body, cut down)
BODY = """\
#shared1 = #ttg.swizzled_shared<{vec = 4, perPhase = 1, maxPhase = 16, order = [1, 0]}>
module {
    %q = amdg.buffer_load %p[%o] : !tt.ptr<bf16> -> tensor<32x128xbf16, #blocked> loc(#l1)
    %c = ttg.convert_layout %q : tensor<32x128xbf16, #blocked> -> tensor<32x128xbf16, #linear1> loc(#l2)
    %c_1 = tt.trans %c {order = array<i32: 1, 0>} : tensor<32x128xbf16, #linear1> -> tensor<128x32xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> loc(#l2)
    %s = tt.dot %k, %c_1, %z : tensor<128x128xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 8}>> * tensor<128x32xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> -> tensor<128x32xf32, #mma> loc(#l3)
    %a = ttg.local_alloc %q : (tensor<32x128xbf16, #blocked>) -> !ttg.memdesc<32x128xbf16, #shared1, #smem> loc(#l4)
    %a_1 = ttg.local_load %a : !ttg.memdesc<32x128xbf16, #shared1, #smem> -> tensor<32x128xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 4}>> loc(#l4)
    %d = tt.dot %pt, %a_1, %acc : tensor<128x32xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 4}>> * tensor<32x128xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 4}>> -> tensor<128x128xf32, #mma> loc(#l5)
}
"""


def test_rewrites_the_pair_into_one_buffer_read_both_ways():
    out, n = share_transposed(BODY)
    assert n == 1
    lines = [ln.strip() for ln in out.splitlines()]
    shared = "#ttg.swizzled_shared<{vec = 8, perPhase = 1, maxPhase = 16, order = [1, 0]}>"
    shared_t = "#ttg.swizzled_shared<{vec = 8, perPhase = 1, maxPhase = 16, order = [0, 1]}>"
    # the alloc (its swizzle widened to the transposed read's kWidth) takes the conversion's
    # place, the transposed view follows, the trans becomes a local_load of it
    i = next(k for k, ln in enumerate(lines) if ln.startswith("%a = ttg.local_alloc %q"))
    assert f"!ttg.memdesc<32x128xbf16, {shared}, #smem> loc(#l4)" in lines[i]
    assert lines[i + 1] == (
        f"%c = ttg.memdesc_trans %a {{order = array<i32: 1, 0>}} : !ttg.memdesc<32x128xbf16, "
        f"{shared}, #smem> -> !ttg.memdesc<128x32xbf16, {shared_t}, #smem> loc(#l2)"
    )
    assert lines[i + 2].startswith(
        f"%c_1 = ttg.local_load %c : !ttg.memdesc<128x32xbf16, {shared_t}, #smem> -> "
        "tensor<128x32xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>>"
    )
    assert sum(ln.startswith("%a = ttg.local_alloc") for ln in lines) == 1
    assert not any("convert_layout" in ln or "tt.trans" in ln for ln in lines)
    assert any(
        ln.startswith(f"%a_1 = ttg.local_load %a : !ttg.memdesc<32x128xbf16, {shared}")
        for ln in lines
    )
    # the alloc comes before every read of the buffer
    assert i < next(k for k, ln in enumerate(lines) if ln.startswith("%a_1 ="))


@pytest.mark.parametrize(
    "change",
    [
        # the conversion has a second use: it stays
        lambda t: t.replace(
            "%s = tt.dot %k, %c_1, %z", "%s = tt.dot %k, %c_1, %z\n    %u = foo %c"
        ),
        # the alloc sits in another block (deeper indentation)
        lambda t: t.replace("    %a = ttg.local_alloc", "      %a = ttg.local_alloc"),
        # the block closes between the conversion and the alloc
        lambda t: t.replace("    %a = ttg.local_alloc", "  }\n    %a = ttg.local_alloc"),
        # the buffer has a use other than a local_load
        lambda t: t.replace("%d = tt.dot", "%w = ttg.memdesc_index %a\n    %d = tt.dot"),
        # not a [1, 0] transpose
        lambda t: t.replace(
            "tt.trans %c {order = array<i32: 1, 0>}", "tt.trans %c {order = array<i32: 0, 1>}"
        ),
        # another tile
        lambda t: t.replace("ttg.local_alloc %q", "ttg.local_alloc %r"),
        # a shared encoding the rewrite does not know
        lambda t: t.replace("#ttg.swizzled_shared<{vec = 4,", "#ttg.padded_shared<{vec = 4,"),
    ],
)
def test_leaves_other_shapes_alone(change):
    text = change(BODY)
    assert text != BODY
    out, n = share_transposed(text)
    assert n == 0 and out == text


def test_hook_acts_only_inside_its_compile():
    # Triton's stages hook is process-wide: outside ``stage_hook.rewrites`` (another thread's
    # compile, or after it) it changes neither the cache key nor the stages; inside, each
    # rewrite wraps its stage, and a hook installed before it keeps being called
    pytest.importorskip("triton")
    from triton import knobs

    from flydsl_core.backends.triton import stage_hook

    calls = []

    def user_hook(*args):
        calls.append(len(args))
        return ("-user", "") if not args else None

    saved = knobs.runtime.add_stages_inspection_hook
    saved_prev = stage_hook._hook.previous
    knobs.runtime.add_stages_inspection_hook = user_hook
    try:
        stages = {"ttgir": lambda src, md: src, "llir": lambda src, md: src}
        before = dict(stages)
        with stage_hook.rewrites(set()):  # nothing asked: nothing installed
            assert knobs.runtime.add_stages_inspection_hook is user_hook
        with stage_hook.rewrites({"share_transposed_operands"}):
            hook = knobs.runtime.add_stages_inspection_hook
            assert hook is stage_hook._hook
            key = hook()[0]
            assert key.startswith("-user-fly-share_transposed_operands-")
            hook(None, stages, None, None, None)
            assert stages["ttgir"] is not before["ttgir"] and stages["llir"] is before["llir"]
        with stage_hook.rewrites({"hoist_rsrc", "share_transposed_operands"}):
            assert "hoist_rsrc+share_transposed_operands" in hook()[0]
            stages = dict(before)
            hook(None, stages, None, None, None)
            assert all(stages[k] is not before[k] for k in before)
        assert hook() == ("-user", "")  # outside: the user's answer alone
        stages = dict(before)
        hook(None, stages, None, None, None)
        assert stages == before and calls == [0, 5, 0, 5, 0, 5]
        with pytest.raises(ValueError, match="unknown rewrites"), stage_hook.rewrites({"nope"}):
            pass
    finally:
        knobs.runtime.add_stages_inspection_hook = saved
        stage_hook._hook.previous = saved_prev
