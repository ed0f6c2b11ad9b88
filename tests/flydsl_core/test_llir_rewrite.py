"""``llir.hoist_buffer_rsrc``: buffer descriptors several loops build from one kernel argument
and the same constants are built once, at the kernel's entry (the ``hoist_rsrc`` AMD option)."""

from __future__ import annotations

import re

import pytest

from flydsl_core.backends.triton.llir import hoist_buffer_rsrc

RSRC = "call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1"

# two sibling loops' preheaders each build K's descriptor (argument %1); %2's is built once;
# %7's pointer is not an argument (a computed address): none of those two moves
IR = f"""\
define amdgpu_kernel void @k(ptr addrspace(1) inreg %0, ptr addrspace(1) inreg %1, ptr addrspace(1) inreg %2, i32 inreg %3) #0 !dbg !6 {{
  %5 = icmp sgt i32 %3, 0
  br i1 %5, label %.lr.ph, label %mid

.lr.ph:
  %6 = tail {RSRC}(ptr addrspace(1) %1, i16 0, i64 2147483646, i32 159744)
  %7 = getelementptr i8, ptr addrspace(1) %0, i32 %3
  %8 = tail {RSRC}(ptr addrspace(1) %7, i16 0, i64 2147483646, i32 159744)
  %9 = tail {RSRC}(ptr addrspace(1) %2, i16 0, i64 2147483646, i32 159744), !dbg !9
  %10 = tail call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %6, i32 %3, i32 0, i32 0)
  %11 = tail call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %8, i32 %3, i32 0, i32 0)
  %12 = tail call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %9, i32 %3, i32 0, i32 0)
  br label %mid

mid:
  %60 = tail {RSRC}(ptr addrspace(1) %1, i16 0, i64 2147483646, i32 159744)
  %61 = tail call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %60, i32 %3, i32 0, i32 0)
  %62 = tail call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %6, i32 0, i32 0, i32 0)
  ret void
}}

declare ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) readnone, i16, i64, i32)
"""


def _defs(text):
    return re.findall(r"^\s*(%[\w.]+) = (?:tail )?" + re.escape(RSRC) + r"\((.*)\)", text, re.M)


def test_a_descriptor_built_in_two_loops_is_built_once_at_the_entry():
    out = hoist_buffer_rsrc(IR)
    lines = out.split("\n")
    # at the entry, its constant words each from its own s_mov_b32 (never merged with another
    # descriptor's by LLVM)
    assert lines[1:5] == [
        '  %fly.rsrc.0.records = call i32 asm sideeffect "s_mov_b32 $0, 0x7ffffffe", "=s"()',
        '  %fly.rsrc.0.flags = call i32 asm sideeffect "s_mov_b32 $0, 0x27000", "=s"()',
        "  %fly.rsrc.0.records64 = zext i32 %fly.rsrc.0.records to i64",
        f"  %fly.rsrc.0 = {RSRC}(ptr addrspace(1) %1, i16 0, i64 %fly.rsrc.0.records64, "
        "i32 %fly.rsrc.0.flags)",
    ]
    defs = _defs(out)
    assert not any("%1," in a for _, a in defs[1:])  # built once
    # every use of the two old names reads the shared one; the old names are gone
    assert "@llvm.amdgcn.raw.ptr.buffer.load.v4i32(ptr addrspace(8) %fly.rsrc.0, i32 %3" in out
    assert "(ptr addrspace(8) %fly.rsrc.0, i32 0, i32 0" in out
    assert not re.search(r"%(6|60)\b", out)
    # a descriptor built once and one of a computed pointer stay where they were
    assert "  %9 = tail " in out and "  %8 = tail " in out and "(ptr addrspace(8) %8," in out
    # the rest of the text is untouched, in order
    want = [s for s in IR.split("\n") if not re.match(r"\s*%(6|60) = ", s)]
    want = [re.sub(r"%(6|60)\b", "%fly.rsrc.0", s) for s in want]
    assert lines == [*want[:1], *lines[1:5], *want[1:]]


def test_every_descriptor_of_an_argument_moves_with_all():
    # hoist_rsrc="all" (every=True): %2's descriptor, built once, moves too (its constant
    # words from their own s_mov_b32); the computed pointer's still stays
    out = hoist_buffer_rsrc(IR, every=True)
    defs = dict(_defs(out))
    assert set(defs) == {"%fly.rsrc.0", "%fly.rsrc.1", "%8"}
    assert defs["%fly.rsrc.1"].startswith("ptr addrspace(1) %2, i16 0, i64 %fly.rsrc.1.records64")
    assert "(ptr addrspace(8) %fly.rsrc.1, i32 %3" in out and not re.search(r"%9\b", out)
    entry = out.split("\n")[1:9]
    assert sum("s_mov_b32" in s for s in entry) == 4
    assert hoist_buffer_rsrc(out, every=True) == out


def test_the_option_takes_true_or_all():
    from flydsl_core.backends.triton.compiler import CompileError, triton_options
    from flydsl_core.targets import get_target

    gfx950 = get_target("gfx950")
    assert triton_options(gfx950, {"hoist_rsrc": "all"})["hoist_rsrc"] == "all"
    with pytest.raises(CompileError, match="True or 'all'"):
        triton_options(gfx950, {"hoist_rsrc": "some"})


def test_the_rewrite_is_idempotent_and_leaves_other_text_alone():
    once = hoist_buffer_rsrc(IR)
    assert hoist_buffer_rsrc(once) == once
    # no descriptor built twice: nothing moves
    single = IR.replace(
        "(ptr addrspace(1) %1, i16 0, i64 2147483646, i32 159744)\n  %61",
        "(ptr addrspace(1) %1, i16 0, i64 2147483644, i32 159744)\n  %61",
    )
    assert single != IR and hoist_buffer_rsrc(single) == single
    assert hoist_buffer_rsrc("declare void @f()\n") == "declare void @f()\n"
    # a record count past 32 bits stays a constant (an s_mov_b32 cannot write it)
    big = hoist_buffer_rsrc(IR.replace("i64 2147483646", "i64 4294967296"))
    assert big.split("\n")[1] == (
        f"  %fly.rsrc.0 = {RSRC}(ptr addrspace(1) %1, i16 0, i64 4294967296, i32 159744)"
    )
    two = IR + IR.replace("@k(", "@k2(")
    assert hoist_buffer_rsrc(two) == two  # one function per module only


@pytest.mark.compile
def test_the_option_reaches_the_llvm_ir_on_amd_only():
    from flydsl_core.backends.triton.compiler import CompileError, triton_options
    from flydsl_core.targets import get_target

    assert triton_options(get_target("gfx950"), {"hoist_rsrc": True})["hoist_rsrc"] is True
    with pytest.raises(CompileError, match="hoist_rsrc"):
        triton_options(get_target("sm90"), {"hoist_rsrc": True})


# -- buffer_soffset ------------------------------------------------------------------------------

from flydsl_core.backends.triton.llir import buffer_soffset  # noqa: E402

LOAD = "tail call <4 x i32> @llvm.amdgcn.raw.ptr.buffer.load.v4i32"
# a loop's K descriptor from argument %1 plus a per-trip element offset %x (load_at's folded
# base); %h's descriptor was built before the loop (invariant), %s's also feeds a store
SOFF_IR = f"""\
define amdgpu_kernel void @k(ptr addrspace(1) inreg %0, ptr addrspace(1) inreg %1, i32 inreg %2, i32 inreg %3) #0 {{
  %p1 = ptrtoint ptr addrspace(1) %1 to i64
  %hs = sext i32 %3 to i64
  %hb = shl nsw i64 %hs, 1
  %ha = add i64 %hb, %p1
  %hp = inttoptr i64 %ha to ptr addrspace(1)
  %h = tail {RSRC}(ptr addrspace(1) %hp, i16 0, i64 2147483646, i32 159744)
  br label %loop

loop:
  %i = phi i32 [ 0, %4 ], [ %n, %loop ]
  %x = mul i32 %i, %2
  %e = sext i32 %x to i64
  %b = shl nsw i64 %e, 1
  %a = add i64 %b, %p1
  %p = inttoptr i64 %a to ptr addrspace(1)
  %r = tail {RSRC}(ptr addrspace(1) %p, i16 0, i64 2147483646, i32 159744)
  %l0 = {LOAD}(ptr addrspace(8) %r, i32 %3, i32 0, i32 0)
  %l1 = {LOAD}(ptr addrspace(8) %r, i32 16, i32 0, i32 0)
  %l2 = {LOAD}(ptr addrspace(8) %h, i32 %3, i32 0, i32 0)
  %s = tail {RSRC}(ptr addrspace(1) %p, i16 0, i64 2147483646, i32 159744)
  %l3 = {LOAD}(ptr addrspace(8) %s, i32 %3, i32 0, i32 0)
  call void @llvm.amdgcn.raw.ptr.buffer.store.v4i32(<4 x i32> %l3, ptr addrspace(8) %s, i32 0, i32 0, i32 0)
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %2
  br i1 %c, label %loop, label %end

end:
  ret void
}}
"""


def test_a_per_trip_origin_becomes_the_loads_scalar_offset():
    out = buffer_soffset(SOFF_IR)
    lines = out.split("\n")
    # the argument's own descriptor at the entry, its constant words from inline asm that
    # touches no memory (a side-effecting one made LLVM read kernel data with vector loads)
    assert lines[1:5] == [
        '  %fly.soff.rsrc.0.records = call i32 asm "s_mov_b32 $0, 0x7ffffffe ; fly.soff.rsrc.0", '
        '"=s"() nounwind memory(none)',
        '  %fly.soff.rsrc.0.flags = call i32 asm "s_mov_b32 $0, 0x27000 ; fly.soff.rsrc.0", '
        '"=s"() nounwind memory(none)',
        "  %fly.soff.rsrc.0.records64 = zext i32 %fly.soff.rsrc.0.records to i64",
        f"  %fly.soff.rsrc.0 = {RSRC}(ptr addrspace(1) %1, i16 0, i64 "
        "%fly.soff.rsrc.0.records64, i32 %fly.soff.rsrc.0.flags)",
    ]
    # the loop's loads read through it at the origin's byte offset (X << 1: bf16)
    assert "  %fly.soff.0 = shl i32 %x, 1" in lines
    assert f"%l0 = {LOAD}(ptr addrspace(8) %fly.soff.rsrc.0, i32 %3, i32 %fly.soff.0, i32 0)" in out
    assert f"%l1 = {LOAD}(ptr addrspace(8) %fly.soff.rsrc.0, i32 16, i32 %fly.soff.0, i32 0)" in out
    # an origin LLVM already built before the loop, and a descriptor a store uses: left alone
    assert f"%l2 = {LOAD}(ptr addrspace(8) %h, i32 %3, i32 0, i32 0)" in out
    assert f"%l3 = {LOAD}(ptr addrspace(8) %s, i32 %3, i32 0, i32 0)" in out
    assert buffer_soffset(out) == out
    two = SOFF_IR + SOFF_IR.replace("@k(", "@k2(")
    assert buffer_soffset(two) == two  # one function per module only
    # a 64-bit origin (no i32 element offset) is left alone
    wide = SOFF_IR.replace("%e = sext i32 %x to i64", "%e = mul i64 %hs, %hs")
    assert "fly.soff" not in buffer_soffset(wide)


def test_the_soffset_option_is_amd_only():
    from flydsl_core.backends.triton.compiler import CompileError, triton_options
    from flydsl_core.targets import get_target

    assert triton_options(get_target("gfx950"), {"buffer_soffset": True})["buffer_soffset"]
    with pytest.raises(CompileError, match="buffer_soffset"):
        triton_options(get_target("sm90"), {"buffer_soffset": True})


# -- llir.split_buffer_offsets --------------------------------------------------------------------

SPLIT_LOAD = "tail call <4 x float> @llvm.amdgcn.raw.ptr.buffer.load.v4f32(ptr addrspace(8) %r"
# a loop (%loop) walking rows by a scalar step %i: an unmasked load of (i + base + lane) << 2,
# a second block 16 rows on (lane | 16), a masked one, and loads this leaves alone (a
# lanes' part computed in the loop, no shift, a nonzero soffset)
SPLIT_IR = f"""\
define amdgpu_kernel void @k(ptr addrspace(1) inreg %0, i32 inreg %1, i32 inreg %2) #0 {{
  %r = call ptr addrspace(8) @llvm.amdgcn.make.buffer.rsrc.p8.p1(ptr addrspace(1) %0, i16 0, i64 2147483646, i32 159744)
  %t = tail call i32 @llvm.amdgcn.workitem.id.x()
  %w = tail call i32 @llvm.amdgcn.workgroup.id.x()
  %lane = and i32 %t, 15
  %lane16 = or disjoint i32 %lane, 16
  %base = mul i32 %w, %2
  br label %loop

loop:
  %i = phi i32 [ 0, %0 ], [ %next, %loop ]
  %ib = add i32 %i, %base
  %a = add i32 %ib, %lane
  %a4 = shl i32 %a, 2
  %x = {SPLIT_LOAD}, i32 %a4, i32 0, i32 0), !dbg !7
  %b = add i32 %ib, %lane16
  %b4 = shl i32 %b, 2
  %y = {SPLIT_LOAD}, i32 %b4, i32 0, i32 0)
  %m = icmp slt i32 %i, %1
  %sel = select i1 %m, i32 %a4, i32 -2147483648
  %z = {SPLIT_LOAD}, i32 %sel, i32 0, i32 0)
  %tl = xor i32 %t, %i
  %d = add i32 %i, %tl
  %d4 = shl i32 %d, 2
  %u = {SPLIT_LOAD}, i32 %d4, i32 0, i32 0)
  %v = {SPLIT_LOAD}, i32 %a, i32 0, i32 0)
  %s = {SPLIT_LOAD}, i32 %a4, i32 %1, i32 0)
  %next = add i32 %i, 32
  %c = icmp slt i32 %next, %1
  br i1 %c, label %loop, label %exit

exit:
  ret void
}}
"""


def _loads(text):
    return re.findall(
        r"^\s*(%\w+) = " + re.escape(SPLIT_LOAD) + r", i32 ([^,]+), i32 ([^,]+), i32 0\)",
        text,
        re.M,
    )


def test_split_buffer_offsets_moves_the_uniform_part_to_soffset():
    from flydsl_core.backends.triton.llir import split_buffer_offsets

    out = split_buffer_offsets(SPLIT_IR)
    loads = {n: (vo, so) for n, vo, so in _loads(out)}
    defs = dict(re.findall(r"^\s*(%[\w.]+) = (.*)$", out, re.M))
    # the lanes' part shifted once, at its definition (before the loop), shared by both row
    # blocks and the masked load; the second block's 16 rows go to the scalar side
    vo = loads["%x"][0]
    assert defs[vo] == "shl i32 %lane, 2" and out.index(vo + " =") < out.index("loop:")
    assert loads["%y"][0] == vo
    assert defs[loads["%z"][0]] == f"select i1 %m, i32 {vo}, i32 -2147483648"

    def terms(v):  # the scalar offset's terms, expanded
        e = defs.get(v, v)
        if e.startswith("add i32 "):
            a, b = e[8:].split(", ")
            return terms(a) + terms(b)
        return [e]

    assert sorted(terms(loads["%x"][1])) == ["shl i32 %base, 2", "shl i32 %i, 2"]
    assert sorted(terms(loads["%y"][1])) == ["64", "shl i32 %base, 2", "shl i32 %i, 2"]
    assert sorted(terms(loads["%z"][1])) == ["shl i32 %base, 2", "shl i32 %i, 2"]
    # left alone: a lanes' part the loop computes, no shift, a soffset already there
    assert loads["%u"] == ("%d4", "0") and loads["%v"] == ("%a", "0")
    assert loads["%s"] == ("%a4", "%1")
    assert "!dbg !7" in out
    assert split_buffer_offsets(out) == out  # nothing left to split


def test_split_buffer_offsets_keeps_per_lane_phis_on_the_vector_side():
    from flydsl_core.backends.triton.llir import split_buffer_offsets

    # a divergent branch: phis may differ by lane, so %i is no longer uniform and the loads
    # keep their offsets; one function per module only
    div = SPLIT_IR.replace("%c = icmp slt i32 %next, %1", "%c = icmp slt i32 %next, %t")
    assert split_buffer_offsets(div) == div
    two = SPLIT_IR + SPLIT_IR.replace("@k(", "@k2(")
    assert split_buffer_offsets(two) == two


def test_split_buffer_offsets_refuses_a_negative_scalar_constant():
    from flydsl_core.backends.triton.llir import split_buffer_offsets

    # the lanes' part less 4 rows: moved to the unsigned scalar offset, the constant could
    # wrap it where the whole offset did not, so those loads keep their offsets
    neg = SPLIT_IR.replace("%lane16 = or disjoint i32 %lane, 16", "%lane16 = add i32 %lane, -4")
    out = split_buffer_offsets(neg)
    assert re.search(r"%y = .*, i32 %b4, i32 0, i32 0\)", out)
    assert not re.search(r"%x = .*, i32 %a4, i32 0, i32 0\)", out)  # the others still split


@pytest.mark.compile
def test_split_buffer_offsets_option_on_amd_only():
    from flydsl_core.backends.triton.compiler import CompileError, triton_options
    from flydsl_core.targets import get_target

    opts = triton_options(get_target("gfx950"), {"split_buffer_offsets": True})
    assert opts["split_buffer_offsets"] is True
    with pytest.raises(CompileError, match="split_buffer_offsets"):
        triton_options(get_target("sm90"), {"split_buffer_offsets": True})


# -- llir.wait_tr_reads ---------------------------------------------------------------------------

MFMA = "tail call <16 x float> @llvm.amdgcn.mfma.f32.32x32x16.bf16"
TR = "tail call <4 x bfloat> @llvm.amdgcn.ds.read.tr16.b64.v4bf16"
# two transposed reads make V's operand of two chained MFMAs; %q's MFMA (no LDS read) comes
# before them; a second tile's read after the first wait needs one of its own
TR_IR = f"""\
target triple = "amdgpu9.50-amd-amdhsa"

define amdgpu_kernel void @k(ptr addrspace(3) %p, <8 x bfloat> %q, <8 x bfloat> %b) #0 {{
  %r0 = {TR}(ptr addrspace(3) %p)
  %r1 = {TR}(ptr addrspace(3) %p)
  %s = {MFMA}(<8 x bfloat> %q, <8 x bfloat> %b, <16 x float> zeroinitializer, i32 0, i32 0, i32 0)
  %v = shufflevector <4 x bfloat> %r0, <4 x bfloat> %r1, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>
  %a0 = {MFMA}(<8 x bfloat> %v, <8 x bfloat> %b, <16 x float> %s, i32 0, i32 0, i32 0), !dbg !9
  %a1 = {MFMA}(<8 x bfloat> %v, <8 x bfloat> %b, <16 x float> %a0, i32 0, i32 0, i32 0)
  %r2 = {TR}(ptr addrspace(3) %p)
  %w = shufflevector <4 x bfloat> %r2, <4 x bfloat> %r1, <8 x i32> <i32 0, i32 1, i32 2, i32 3, i32 4, i32 5, i32 6, i32 7>
  %a2 = {MFMA}(<8 x bfloat> %b, <8 x bfloat> %w, <16 x float> %a1, i32 0, i32 0, i32 0)
  ret void
}}
"""
WAIT = "call void @llvm.amdgcn.s.waitcnt(i32 49279)"  # lgkmcnt(0) alone: 0xC07F


def test_one_lds_wait_before_the_mfmas_of_transposed_reads():
    from flydsl_core.backends.triton.llir import LGKMCNT0_GFX9, wait_tr_reads

    assert LGKMCNT0_GFX9 == 49279
    out = wait_tr_reads(TR_IR)
    lines = [ln.strip() for ln in out.splitlines()]
    waits = [i for i, ln in enumerate(lines) if ln == WAIT]
    at = {ln.split(" =")[0]: i for i, ln in enumerate(lines) if " = " in ln}
    # before %a0 (the first MFMA of %r0 / %r1) and %a2 (%r2's, a B operand), not %s or %a1
    assert waits == [at["%a0"] - 1, at["%a2"] - 1], out
    assert out.count("declare void @llvm.amdgcn.s.waitcnt(i32)") == 1
    kept = [ln for ln in lines if ln and ln != WAIT]  # nothing else changed
    assert kept == [ln.strip() for ln in TR_IR.splitlines() if ln.strip()] + [
        "declare void @llvm.amdgcn.s.waitcnt(i32)"
    ]
    assert wait_tr_reads(out) == out  # idempotent
    other = TR_IR.replace("amdgpu9.50", "amdgpu12.50")  # gfx1250's counters differ: untouched
    assert wait_tr_reads(other) == other
    plain = TR_IR.replace("ds.read.tr16.b64.v4bf16", "ds.read.b64.v4bf16")  # no transposed read
    assert wait_tr_reads(plain) == plain


@pytest.mark.compile
def test_wait_tr_reads_option_on_amd_only():
    from flydsl_core.backends.triton.compiler import CompileError, triton_options
    from flydsl_core.targets import get_target

    assert triton_options(get_target("gfx950"), {"wait_tr_reads": True})["wait_tr_reads"] is True
    with pytest.raises(CompileError, match="wait_tr_reads"):
        triton_options(get_target("sm90"), {"wait_tr_reads": True})
