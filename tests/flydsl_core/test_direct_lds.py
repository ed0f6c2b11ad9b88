"""The gfx950 TTGIR rewrite that loads a matrix operand's tile straight into LDS
(``flydsl_core.backends.triton.direct_lds``): the layouts it builds, what it rewrites and what it
leaves alone, where it issues and waits for the copy, and its LLVM IR companions (the wait
kept behind a matrix product, the kernel's AGPR attribute, the LDS loads' split offsets). Its effect on compiled loops: ``tests/flydsl_kernels/test_attention_compile.py``
(``test_direct_lds_loads_k_and_v_without_lds_writes``)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flydsl_core.backends.triton import direct_lds as dl

# -- the layouts ------------------------------------------------------------------------------------

#: the padded layouts Triton 3.9's own pipeliner gave the gfx950 attention forward's K^T and V
#: tiles (64 x 64 bf16, read as the 32x32x16 MFMA's B operand: K^T with kWidth 8 by
#: ds_read_b128, V with kWidth 4 by ds_read_b64_tr_b16) when compiled with ``num_stages=2``
TRITON_K = (
    512,
    8,
    [
        [1, 0],
        [2, 0],
        [4, 0],
        [8, 0],
        [16, 0],
        [32, 0],
        [0, 8],
        [0, 16],
        [0, 32],
        [0, 1],
        [0, 2],
        [0, 4],
    ],
)
TRITON_V = (
    512,
    32,
    [
        [0, 1],
        [0, 2],
        [0, 4],
        [0, 8],
        [0, 16],
        [0, 32],
        [2, 0],
        [4, 0],
        [8, 0],
        [1, 0],
        [16, 0],
        [32, 0],
    ],
)


def test_padded_layouts_match_tritons_pipeliner():
    assert dl.padded_layout((64, 64), 0, 1, 8, 32, 2) == TRITON_K
    assert dl.padded_layout((64, 64), 1, 1, 4, 32, 2) == TRITON_V
    # and the write layouts Triton's pipeliner coalesced those copies to (2 warps)
    reg, lane, warp = dl.write_layout(TRITON_K[2], 2, 2)
    assert reg == [[1, 0], [2, 0], [4, 0], [0, 2], [0, 4]]
    assert lane == [[8, 0], [16, 0], [32, 0], [0, 8], [0, 16], [0, 32]]
    assert warp == [[0, 1]]


def test_no_layout_where_the_rule_has_none():
    assert dl.padded_layout((64, 64), 0, 1, 8, 32, 4) is None  # fp32
    assert dl.padded_layout((64, 64), 0, 1, 2, 32, 2) is None  # kWidth 2
    assert dl.padded_layout((64, 64), 0, 1, 8, 8, 2) is None  # an 8-row MFMA
    assert dl.padded_layout((64, 4), 1, 1, 8, 32, 2) is None  # rows shorter than 16 bytes
    assert dl.padded_layout((64, 64, 2), 0, 1, 8, 32, 2) is None  # not 2-D
    assert dl.write_layout(dl.padded_layout((32, 64), 1, 0, 8, 16, 2)[2], 2, 8) is None  # 8 warps


def _apply(bases, index):
    """The coordinate a linear layout's ``bases`` give an index (XOR of the set bits' bases)."""
    out = [0, 0]
    for bit, b in enumerate(bases):
        if index >> bit & 1:
            out = [out[0] ^ b[0], out[1] ^ b[1]]
    return tuple(out)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.sampled_from([16, 32, 64, 128, 256]),
    cols=st.sampled_from([16, 32, 64, 128, 256]),
    contig=st.integers(0, 1),
    op_idx=st.integers(0, 1),
    kwidth=st.sampled_from([4, 8, 16]),
    nonk=st.sampled_from([16, 32]),
    elem=st.sampled_from([1, 2]),
    warps=st.sampled_from([1, 2, 4, 8]),
)
def test_each_wave_instruction_writes_one_contiguous_kilobyte(
    rows, cols, contig, op_idx, kwidth, nonk, elem, warps
):
    # gfx950's LDS loads write a lane's 16 bytes at M0 + 16 * lane: a write layout is valid
    # only if every (register, warp) instruction's 64 lanes write consecutive 16-byte pieces
    # of the padded layout's unpadded order, and the tile's elements are each written once
    got = dl.padded_layout((rows, cols), contig, op_idx, kwidth, nonk, elem)
    if got is None:
        return
    interval, pad, bases = got
    assert interval == 64 * (16 // elem) and pad > 0
    assert sorted(_apply(bases, i) for i in range(rows * cols)) == [
        (r, c) for r in range(rows) for c in range(cols)
    ]
    wl = dl.write_layout(bases, elem, warps)
    if wl is None:
        assert rows * cols < 64 * (16 // elem) * warps
        return
    reg, lane, warp = wl
    offset = {_apply(bases, i): i for i in range(rows * cols)}
    vec = 16 // elem
    nv = vec.bit_length() - 1  # a lane's 16 bytes: the first register bases
    seen = set()
    for r_hi in range(1 << (len(reg) - nv)):  # each repeat: one load instruction
        for w in range(warps):
            starts = []
            for ln in range(64):
                idx = []
                for v in range(vec):
                    reg_index = v | (r_hi << nv)
                    coord = _xor(_apply(reg, reg_index), _apply(lane, ln), _apply(warp, w))
                    idx.append(offset[coord])
                    seen.add(coord)
                assert idx == list(range(idx[0], idx[0] + vec))  # a lane's 16 bytes in order
                starts.append(idx[0])
            assert starts == list(range(starts[0], starts[0] + 64 * vec, vec))
    assert len(seen) == rows * cols


def _xor(*coords):
    out = (0, 0)
    for c in coords:
        out = (out[0] ^ c[0], out[1] ^ c[1])
    return out


# -- the TTGIR rewrite ------------------------------------------------------------------------------

#: the shape of Triton 3.9's gfx950 TTGIR for a K^T tile loaded in a loop and read as a dot
#: operand from LDS (the attention forward's, cut down)
BODY = """\
#blocked2 = #ttg.blocked<{sizePerThread = [8, 1], threadsPerWarp = [8, 8], warpsPerCTA = [1, 2], order = [0, 1]}>
#mma = #ttg.amd_mfma<{version = 4, warpsPerCTA = [2, 1], instrShape = [32, 32, 16], isTransposed = true}>
#shared1 = #ttg.swizzled_shared<{vec = 8, perPhase = 2, maxPhase = 8, order = [0, 1]}>
module attributes {"ttg.num-warps" = 2 : i32, ttg.target = "hip:gfx950", "ttg.threads-per-warp" = 64 : i32} {
      %k = amdg.buffer_load %k_ptr[%off] {contiguity = 8 : i32} : !tt.ptr<bf16> -> tensor<64x64xbf16, #blocked2> loc(#l1)
      %s = tt.dot %q, %x, %z : tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 8}>> * tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> -> tensor<64x64xf32, #mma> loc(#l2)
      %a = ttg.local_alloc %k : (tensor<64x64xbf16, #blocked2>) -> !ttg.memdesc<64x64xbf16, #shared1, #smem> loc(#l3)
      %b = ttg.local_load %a : !ttg.memdesc<64x64xbf16, #shared1, #smem> -> tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> loc(#l3)
}
"""


def test_rewrites_the_load_into_an_async_copy_waited_for_at_the_alloc():
    out, n = dl.direct_lds(BODY)
    assert n == 1
    lines = [ln.strip() for ln in out.splitlines()]
    shared = next(ln for ln in lines if ln.startswith("#fly_d2l_shared0 = "))
    write = next(ln for ln in lines if ln.startswith("#fly_d2l_write0 = "))
    assert shared.endswith(
        "#ttg.padded_shared<[512:+8] {offset = [[1, 0], [2, 0], [4, 0], [8, 0], [16, 0], "
        "[32, 0], [0, 8], [0, 16], [0, 32], [0, 1], [0, 2], [0, 4]], block = []}>"
    )
    assert "lane = [[8, 0], [16, 0], [32, 0], [0, 8], [0, 16], [0, 32]], warp = [[0, 1]]" in write
    mem = "!ttg.memdesc<64x64xbf16, #fly_d2l_shared0, #smem, mutable>"
    i = lines.index(f"%a = ttg.local_alloc : () -> {mem} loc(#l3)")
    assert lines[i + 1] == (
        "%off_d2l0 = ttg.convert_layout %off : tensor<64x64xi32, #blocked2> -> "
        "tensor<64x64xi32, #fly_d2l_write0> loc(#l1)"
    )
    assert lines[i + 2] == (
        "%k_d2l = amdg.buffer_load_to_local %k_ptr[%off_d2l0] into %a {contiguity = 8 : i32} : "
        "!tt.ptr<bf16>[tensor<64x64xi32, #fly_d2l_write0>]  -> "
        "<64x64xbf16, #fly_d2l_shared0, #smem, mutable> loc(#l1)"
    )
    assert lines[i + 3] == "%k_d2l_c = ttg.async_commit_group tokens %k_d2l loc(#l1)"
    # the dot between them still runs while the copy is in flight; the wait is the alloc's
    assert lines[i + 4].startswith("%s = tt.dot")
    assert lines[i + 5] == "%k_d2l_w = ttg.async_wait %k_d2l_c {num = 0 : i32} loc(#l3)"
    assert lines[i + 6].startswith(f"%b = ttg.local_load %a token %k_d2l_w : {mem} -> ")
    assert "amdg.buffer_load %" not in out and "local_alloc %k" not in out


def test_a_masked_load_copies_under_its_mask():
    text = BODY.replace("%k_ptr[%off] {", "%k_ptr[%off], %m {")
    out, n = dl.direct_lds(text)
    assert n == 1
    assert (
        "%m_d2l0 = ttg.convert_layout %m : tensor<64x64xi1, #blocked2> -> "
        "tensor<64x64xi1, #fly_d2l_write0>"
    ) in out
    assert "amdg.buffer_load_to_local %k_ptr[%off_d2l0] mask = %m_d2l0 into %a" in out


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace('"hip:gfx950"', '"hip:gfx942"'),  # 4 bytes a lane there
        lambda t: t.replace("bf16", "f32"),  # 32-bit elements
        # the loaded tensor has a second use
        lambda t: t.replace("%s = tt.dot %q, %x", "%s = tt.dot %q, %k"),
        # the alloc in another block (deeper indentation), or the block closed before it
        lambda t: t.replace("      %a = ttg.local_alloc", "        %a = ttg.local_alloc"),
        lambda t: t.replace("      %a = ttg.local_alloc", "    }\n      %a = ttg.local_alloc"),
        # the buffer read other than by a local_load into a dot operand
        lambda t: t.replace("loc(#l3)\n}", "loc(#l3)\n      %t = ttg.memdesc_trans %a\n}"),
        lambda t: t.replace(
            "-> tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> loc(#l3)",
            "-> tensor<64x64xbf16, #blocked2> loc(#l3)",
        ),
        # the global load contiguous along the other dimension than the LDS layout
        lambda t: t.replace("order = [0, 1]}>\n#mma", "order = [1, 0]}>\n#mma"),
        # a load with an ``other`` value (not a plain form the rewrite knows)
        lambda t: t.replace("%k_ptr[%off] {", "%k_ptr[%off], %m, %o {"),
    ],
)
def test_leaves_other_shapes_alone(change):
    text = change(BODY)
    assert text != BODY
    out, n = dl.direct_lds(text)
    assert n == 0 and out == text


#: a loop body in the attention forward's order (cut down): K^T read from LDS into Q K^T, then
#: V's offsets, an op on the scores, V's load, and its alloc and read for P V
LOOP = """\
#blocked2 = #ttg.blocked<{sizePerThread = [8, 1], threadsPerWarp = [8, 8], warpsPerCTA = [1, 2], order = [0, 1]}>
#mma = #ttg.amd_mfma<{version = 4, warpsPerCTA = [2, 1], instrShape = [32, 32, 16], isTransposed = true}>
#shared1 = #ttg.swizzled_shared<{vec = 8, perPhase = 2, maxPhase = 8, order = [0, 1]}>
module attributes {"ttg.num-warps" = 2 : i32, ttg.target = "hip:gfx950", "ttg.threads-per-warp" = 64 : i32} {
    %q = ttg.local_load %qa : !ttg.memdesc<64x64xbf16, #shared1, #smem> -> tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 8}>> loc(#l0)
    %r = scf.for %i = %c0 to %n step %c64 iter_args(%acc = %z) -> (tensor<64x64xf32, #mma>) : i32 {
      %kt = ttg.local_load %ka : !ttg.memdesc<64x64xbf16, #shared1, #smem> -> tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> loc(#l1)
      %s = tt.dot %q, %kt, %z : tensor<64x64xbf16, #ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 8}>> * tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> -> tensor<64x64xf32, #mma> loc(#l2)
      %base = tt.splat %i : i32 -> tensor<64x64xi32, #blocked2> loc(#l3)
      %off = arith.addi %base, %lanes : tensor<64x64xi32, #blocked2> loc(#l3)
      %e = math.exp2 %s : tensor<64x64xf32, #mma> loc(#l4)
      %v = amdg.buffer_load %v_ptr[%off] {contiguity = 8 : i32} : !tt.ptr<bf16> -> tensor<64x64xbf16, #blocked2> loc(#l5)
      %m = arith.mulf %e, %e : tensor<64x64xf32, #mma> loc(#l6)
      %a = ttg.local_alloc %v : (tensor<64x64xbf16, #blocked2>) -> !ttg.memdesc<64x64xbf16, #shared1, #smem> loc(#l7)
      %b = ttg.local_load %a : !ttg.memdesc<64x64xbf16, #shared1, #smem> -> tensor<64x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 8}>> loc(#l7)
      scf.yield %acc : tensor<64x64xf32, #mma> loc(#l8)
    } loc(#l9)
}
"""


#: the loop body's own values (the copy's ops are named by their op)
NAMED = ("kt", "s", "base", "off", "e", "m", "b")


def _ops(text):
    """The loop body's ops, by result name (the copy's own by their op)."""
    body = [
        ln for ln in text.split("scf.for")[1].split("scf.yield")[0].splitlines()[1:] if ln.strip()
    ]
    out = []
    for ln in body:
        d = re.match(r"^ *%([\w.]+) = ([\w.]+)", ln)
        out.append(d.group(1) if d.group(1) in NAMED else d.group(2))
    return out


def test_the_copy_goes_up_over_the_product_before_it_and_is_waited_for_after_it():
    # V's copy runs under Q K^T's MFMAs: issued before the product, with the pure ops that
    # compute its offsets, and waited for right after it; the rest keeps its order
    out, n = dl.direct_lds(LOOP)
    assert n == 1
    assert _ops(out) == [
        "kt",
        "base",
        "off",
        "ttg.local_alloc",
        "ttg.convert_layout",
        "amdg.buffer_load_to_local",
        "ttg.async_commit_group",
        "s",
        "ttg.async_wait",
        "e",
        "m",
        "b",
    ]
    assert "%v_d2l = amdg.buffer_load_to_local %v_ptr[%off_d2l0] into %a" in out
    assert "%b = ttg.local_load %a token %v_d2l_w" in out


@pytest.mark.parametrize(
    "change",
    [
        # the product reads a tile loaded into registers (its loads would wait for the copy)
        lambda t: t.replace("%kt = ttg.local_load %ka", "%kt = ttg.convert_layout %ka"),
        # the offsets need an op that is not moved (a load), or the product's own result
        lambda t: t.replace("%base = tt.splat %i", "%base = tt.load %i"),
        lambda t: t.replace("%off = arith.addi %base, %lanes", "%off = arith.addi %base, %s"),
        # no product before the load in its block
        lambda t: t.replace("%s = tt.dot %q, %kt, %z", "%s = arith.mulf %q, %kt"),
    ],
)
def test_the_copy_stays_at_the_load_otherwise(change):
    text = change(LOOP)
    assert text != LOOP
    out, n = dl.direct_lds(text)
    assert n == 1
    ops = _ops(out)
    # issued where the load was, waited for where the alloc was
    assert ops.index("amdg.buffer_load_to_local") > ops.index("e")
    assert ops.index("ttg.async_wait") == ops.index("b") - 1 > ops.index("m")


# -- the LLVM IR companions -------------------------------------------------------------------------

LDS_LOAD = (
    "tail call void @llvm.amdgcn.raw.ptr.buffer.load.async.lds(ptr addrspace(8) %r, "
    "ptr addrspace(3) %l, i32 16"
)
LLIR = f"""\
define amdgpu_kernel void @k(ptr addrspace(1) inreg %0, i32 inreg %1) local_unnamed_addr #0 !dbg !6 {{
  {LDS_LOAD}, i32 %o, i32 0, i32 0, i32 0)
  ret void
}}

attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="1,512" }}
attributes #1 = {{ nounwind }}
"""


def _group(text: str) -> str:
    return re.search(r"^attributes #0 = \{ (.*) \}$", text, re.M).group(1)


def test_llir_attributes_give_back_what_inference_left_off():
    # the AGPR budget and the unused implicit inputs LLVM's inference marks on the same kernel
    # loading through registers (with them gfx950's kernel preloads 14 arguments, not 8)
    out = dl.llir_attributes(LLIR)
    group = _group(out)
    assert group.startswith('"amdgpu-agpr-alloc"="0" ') and group.endswith(
        'nounwind "amdgpu-flat-work-group-size"="1,512"'
    )
    for attr in (*dl._NO_INPUTS, *dl._IMPLICIT_ARGS):
        assert f'"{attr}"' in group, attr
    assert "attributes #1 = { nounwind }" in out
    assert dl.llir_attributes(out) == out  # already there
    # no LDS load: left as it was
    plain = LLIR.replace("async.lds", "v4i32")
    assert dl.llir_attributes(plain) == plain


def test_llir_attributes_leave_off_what_the_kernel_uses():
    uses = LLIR.replace(
        "  ret void",
        "  %y = call i32 @llvm.amdgcn.workitem.id.y()\n"
        "  %p = addrspacecast ptr addrspace(3) %l to ptr\n"
        "  %i = call ptr addrspace(4) @llvm.amdgcn.implicitarg.ptr()\n  ret void",
    )
    group = _group(dl.llir_attributes(uses))
    for gone in ("workitem-id-y", "queue-ptr", "flat-scratch-init", "implicitarg-ptr", "heap-ptr"):
        assert f'"amdgpu-no-{gone}"' not in group, gone
    assert '"amdgpu-no-workitem-id-z"' in group and '"amdgpu-no-dispatch-ptr"' in group
    # a call of another function may use any input: the AGPR budget alone
    called = LLIR.replace("  ret void", "  call void @helper()\n  ret void")
    assert _group(dl.llir_attributes(called)) == (
        '"amdgpu-agpr-alloc"="0" nounwind "amdgpu-flat-work-group-size"="1,512"'
    )
    # inline assembly asking for an AGPR: the inputs alone
    agpr = LLIR.replace(
        "  ret void", '  %v = call i32 asm "v_accvgpr_read $0", "=v,a"()\n  ret void'
    )
    group = _group(dl.llir_attributes(agpr))
    assert "amdgpu-agpr-alloc" not in group and '"amdgpu-no-dispatch-ptr"' in group


WAIT = "  tail call void @llvm.amdgcn.wait.asyncmark(i16 0), !dbg !9"
MFMA = (
    "  %p = tail call <16 x float> @llvm.amdgcn.mfma.f32.32x32x16.bf16(<8 x bfloat> %x, "
    "<8 x bfloat> %y, <16 x float> %z, i32 0, i32 0, i32 0)"
)


def test_pin_waits_keeps_a_wait_behind_the_product_before_it():
    text = (
        f"define void @k() {{\n{MFMA}\n  %e = extractelement <16 x float> %p, i64 0\n{WAIT}\n}}\n"
    )
    out = dl.pin_waits(text)
    lines = out.splitlines()
    i = lines.index(WAIT)
    assert lines[i - 1] == "  call void @llvm.amdgcn.sched.barrier(i32 0)"
    assert out.count("declare void @llvm.amdgcn.sched.barrier(i32 immarg)") == 1
    assert dl.pin_waits(out) == out  # the wait's nearest call is now the barrier
    # a wait after another call (the copy's own, or an exp2) stays free
    other = text.replace(MFMA, "  %p = tail call float @llvm.amdgcn.exp2.f32(float %x)")
    assert dl.pin_waits(other) == other
    assert dl.llir_rewrite(text) == dl.llir_attributes(out)


def test_split_buffer_offsets_splits_lds_loads_through_readfirstlane():
    from flydsl_core.backends.triton.llir import split_buffer_offsets

    text = f"""\
define amdgpu_kernel void @k(ptr addrspace(1) inreg %0, i32 inreg %1, i32 inreg %2) #0 {{
  %r = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %0, i16 0, i64 2147483646, i32 159744)
  %l = getelementptr i8, ptr addrspace(3) @global_smem, i32 0
  %t = tail call i32 @llvm.amdgcn.workitem.id.x()
  %lane = and i32 %t, 15
  br label %loop

loop:
  %i = phi i32 [ 0, %0 ], [ %next, %loop ]
  %a = add i32 %i, %lane
  %a4 = shl i32 %a, 2
  {LDS_LOAD}, i32 %a4, i32 0, i32 0, i32 0), !dbg !7
  %next = add i32 %i, 32
  %c = icmp slt i32 %next, %1
  br i1 %c, label %loop, label %exit

exit:
  ret void
}}
"""
    out = split_buffer_offsets(text)
    m = re.search(
        re.escape(LDS_LOAD) + r", i32 (%[\w.]+), i32 (%[\w.]+), i32 0, i32 0\), !dbg !7", out
    )
    assert m is not None
    defs = dict(re.findall(r"^\s*(%[\w.]+) = (.*)$", out, re.M))
    assert defs[m.group(1)] == "shl i32 %lane, 2"
    # the scalar offset read from lane 0 (uniform: the step), declared once
    rfl = defs[m.group(2)]
    assert rfl.startswith("call i32 @llvm.amdgcn.readfirstlane.i32(i32 %fly.so.")
    assert defs[rfl.split("i32 ")[-1].rstrip(")")] == "shl i32 %i, 2"
    assert out.count("declare i32 @llvm.amdgcn.readfirstlane.i32(i32)") == 1


def test_a_rewrite_that_does_not_parse_leaves_tritons_module(caplog):
    # rewrite_module parses the rewritten text back; where that (or the verifier, or a
    # surviving offset conversion) fails, Triton's own module is compiled, with a warning
    pytest.importorskip("triton")
    from triton._C.libtriton import ir

    class Module:  # the cut-down BODY is no whole module: its values are never defined
        context = ir.context()

        def __str__(self):
            return BODY

    mod = Module()
    with caplog.at_level("WARNING"):
        assert dl.rewrite_module(mod) is mod
    assert "direct-to-LDS loads: TTGIR rewrite dropped" in caplog.text
    plain = BODY.replace('"hip:gfx950"', '"hip:gfx942"')  # nothing to rewrite: no parse
    mod.__class__.__str__ = lambda self: plain
    caplog.clear()
    assert dl.rewrite_module(mod) is mod and not caplog.text
