"""PTX listings (Triton's ``asm['ptx']``, with the cubin): resources and an instruction classifier.

``parse_ptx(text, target, cubin)`` reports a kernel cross-compiled for an
NVIDIA target, on any machine:

* instruction mix from the PTX (virtual ISA: ``instruction_count`` counts PTX
  statements, not SASS): ``classify`` maps each opcode to an ``Instr``
  (matrix op, global or shared load or store with its width, ``ldmatrix``,
  ``cp.async`` into shared memory) and ``compile.resources.
  count_instructions`` counts them;
* registers per thread (``vgpr``), stack frame (``scratch_bytes``), static
  shared memory and code size from the cubin's ELF (``.nv.info``
  ``EIATTR_REGCOUNT`` / ``EIATTR_FRAME_SIZE``, ``.nv.shared.<kernel>``,
  ``.text.<kernel>``), parsed here without any tool;
* spills: a zero stack frame proves there are none; otherwise (or without a
  cubin) Triton's bundled ``ptxas -v`` is run on the PTX for
  ``spill_store_bytes`` / ``spill_load_bytes`` (and registers).

It reads the text and the ELF itself; only the spill fallback runs a tool (``ptxas``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
import subprocess
import tempfile

from ...compile.resources import (
    Instr,
    ResourceReport,
    count_instructions,
    limiter,
    nvidia_occupancy,
)
from ...helpers import cdiv
from ...targets import Target, get_target

__all__ = ["classify", "parse_ptx", "statements"]

# ---------------------------------------------------------------------------
# cubin (ELF) attributes
# ---------------------------------------------------------------------------

_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAX_STACK_SIZE = 0x23
_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def _cubin_attrs(cubin: bytes, kernel_name: str | None) -> dict[str, int]:
    """Registers, frame size, static shared memory and code size of a kernel in a cubin.

    Reads the ELF directly: the global ``.nv.info`` section holds
    ``EIATTR_REGCOUNT`` / ``EIATTR_FRAME_SIZE`` records (symbol index, value);
    ``.nv.shared.<kernel>`` and ``.text.<kernel>`` sizes give static shared
    memory and SASS bytes.
    """
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = []
    for i in range(shnum):
        secs.append(struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize))

    def cstr(off: int) -> str:
        return cubin[off : cubin.index(b"\0", off)].decode("latin-1")

    str_off = secs[shstrndx][4]
    named = {cstr(str_off + s[0]): s for s in secs}
    # symbol table: index -> name
    syms: dict[int, str] = {}
    symtab = named.get(".symtab")
    if symtab is not None:
        _, _, _, _, off, size, link, _, _, ent = symtab
        strtab_off = secs[link][4]
        for k in range(size // (ent or 24)):
            (st_name,) = struct.unpack_from("<I", cubin, off + k * (ent or 24))
            syms[k] = cstr(strtab_off + st_name) if st_name else ""
    funcs = sorted(n[len(".text.") :] for n in named if n.startswith(".text."))
    name = kernel_name or (funcs[0] if funcs else None)
    out: dict[str, int] = {}
    info = named.get(".nv.info")
    if info is not None:
        off, size = info[4], info[5]
        p = off
        while p + 4 <= off + size:
            fmt, attr = cubin[p], cubin[p + 1]
            if fmt == _EIFMT_SVAL:
                (sz,) = struct.unpack_from("<H", cubin, p + 2)
                payload = cubin[p + 4 : p + 4 + sz]
                p += 4 + sz
                if sz == 8:
                    sym, val = struct.unpack("<II", payload)
                    if name is not None and syms.get(sym, name) != name:
                        continue
                    key = {
                        _EIATTR_REGCOUNT: "regs",
                        _EIATTR_FRAME_SIZE: "frame_size",
                        _EIATTR_MIN_STACK_SIZE: "min_stack_size",
                        _EIATTR_MAX_STACK_SIZE: "max_stack_size",
                    }.get(attr)
                    if key:
                        out[key] = val
            else:
                p += 4
    if name is not None:
        text = named.get(f".text.{name}")
        if text is not None:
            out["code_bytes"] = text[5]
        shared = named.get(f".nv.shared.{name}")
        out["static_shared"] = shared[5] if shared is not None else 0
    return out


# ---------------------------------------------------------------------------
# ptxas
# ---------------------------------------------------------------------------


def _ptxas_path(arch: int | str | None) -> str | None:
    try:
        from triton import knobs

        # Mirrors triton.backends.nvidia.compiler.get_ptxas: sm90+ use the
        # newer ptxas Triton ships as 'ptxas-blackwell'.
        tool = knobs.nvidia.ptxas_blackwell if int(arch or 0) >= 90 else knobs.nvidia.ptxas
        path = tool.path
    except Exception:
        return None
    return path if path and os.path.exists(path) else None


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


def _run_ptxas(ptx: str, arch: int | str | None, kernel_name: str | None) -> tuple[dict, str]:
    """``ptxas -v`` on the PTX: ({regs, frame_size, spill_stores, spill_loads}, error)."""
    path = _ptxas_path(arch)
    if path is None:
        return {}, "Triton's bundled ptxas was not found"
    m = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.M)
    gpu = m.group(1) if m else f"sm_{arch}"
    with tempfile.TemporaryDirectory(prefix="flydsl-ptxas-") as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [path, "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}", src, "-o", src + ".o"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {}, f"ptxas failed to run: {e}"
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return {}, f"ptxas exited {proc.returncode}: {log.strip()[:300]}"
    # restrict to the kernel's block when several entries are compiled
    if kernel_name and f"'{kernel_name}'" in log:
        log = log[log.index(f"'{kernel_name}'") :]
    out: dict[str, int] = {}
    if m := _PTXAS_REGS.search(log):
        out["regs"] = int(m.group(1))
    if m := _PTXAS_FRAME.search(log):
        out["frame_size"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out, ""


# ---------------------------------------------------------------------------
# PTX
# ---------------------------------------------------------------------------

_PTX_TYPE = re.compile(r"^(?:[bsuf](\d+)|bf16|f16x2|bf16x2|e4m3x2|e5m2x2)$")
_PTX_PRED = re.compile(r"^@!?%?\w+\s+")
_PTX_LABEL = re.compile(r"^[$\w]+:")


def _width(parts: list[str]) -> int | None:
    vec = 1
    bits = None
    for p in parts:
        if re.fullmatch(r"v(\d+)", p):
            vec = int(p[1:])
        m = _PTX_TYPE.match(p)
        if m:
            bits = int(m.group(1)) if m.group(1) else (16 if p == "bf16" else 32)
    return None if bits is None else vec * bits


def statements(ptx: str):
    """Each label (a ``str``, before the statement it marks) and statement (``(opcode,
    operands)``) in the body of the (first) ``.entry``, in order."""
    lines = ptx.splitlines()
    start = next((i for i, l in enumerate(lines) if ".entry" in l.split("//")[0]), None)
    if start is not None:
        open_ = next((i for i in range(start, len(lines)) if lines[i].rstrip() == "{"), None)
        if open_ is not None:
            # Count braces: inline-asm blocks open indented but may close in column 0.
            close, depth = len(lines), 0
            for i in range(open_ + 1, len(lines)):
                code = lines[i].split("//", 1)[0]
                depth += code.count("{") - code.count("}")
                if depth < 0:
                    close = i
                    break
            lines = lines[open_ + 1 : close]
    kept = []
    for l in lines:
        code = l.split("//", 1)[0].strip()
        # Line directives (.loc, .file, ...) carry no ';' terminator.
        if code.startswith(".") and not code.endswith(";"):
            continue
        kept.append(code)
    text = re.sub(r"/\*.*?\*/", "", "\n".join(kept), flags=re.S)
    for stmt in text.split(";"):
        s = stmt.strip().lstrip("{}").strip()
        while m := _PTX_LABEL.match(s):
            yield m.group(0)[:-1]
            s = _PTX_LABEL.sub("", s, count=1).strip()
        s = s.lstrip("{}").strip()
        if not s or s.startswith("."):
            continue
        s = _PTX_PRED.sub("", s)
        op, _, rest = s.partition(" ")
        op = op.strip()
        if op and re.match(r"^[a-z]", op):
            yield op, rest.replace("\n", " ").strip()


def classify(op: str, ops: str) -> Instr:
    """What PTX statement ``op`` (with operand text ``ops``) is, for the counters."""
    parts = op.split(".")
    head = parts[0]
    spaces = [p.split("::")[0] for p in parts[1:]]
    branch_to = ops.strip() if head == "bra" else None
    if op.startswith(("wgmma.mma_async", "tcgen05.mma")) or head == "mma":
        return Instr("matrix", op, branch_to=branch_to)
    if head in ("ld", "st") and ("global" in spaces or "shared" in spaces):
        if "global" in spaces:
            kind = "load" if head == "ld" else "store"
        else:
            kind = "lds_read" if head == "ld" else "lds_write"
        return Instr(kind, op, _width(parts))
    if head in ("ldmatrix", "stmatrix"):
        n = next((int(p[1:]) for p in parts if re.fullmatch(r"x\d", p)), 1)
        return Instr("lds_read" if head == "ldmatrix" else "lds_write", op, 32 * n)
    if head == "cp" and len(parts) > 1 and parts[1] == "async" and "global" in spaces:
        if "shared" not in spaces:
            return Instr(None, op)
        if spaces.index("shared") > spaces.index("global"):  # shared -> global
            return Instr("store", op)
        # cp.async [dst], [src], cp-size: bytes per thread
        bits = None
        args = [a.strip() for a in ops.split(",")]
        if "bulk" not in parts and len(args) >= 3:
            with contextlib.suppress(ValueError):
                bits = int(args[2], 0) * 8
        return Instr("load", op, bits, to_lds=True)
    return Instr(None, op, branch_to=branch_to)


def parse_ptx(
    ptx_text: str,
    target: str | Target,
    cubin_bytes: bytes | None = None,
    *,
    num_warps: int | None = None,
    shared_bytes: int | None = None,
    kernel_name: str | None = None,
    run_ptxas: bool = True,
) -> ResourceReport:
    """Report the resources of a PTX kernel, with registers from its cubin or ``ptxas -v``.

    ``shared_bytes`` is the dynamic shared memory Triton launches with
    (``metadata.shared``); ``num_warps`` defaults to ``.reqntid``/``.maxntid``.
    """
    t = get_target(target)
    if t.backend != "cuda":
        raise ValueError(f"parse_ptx needs an NVIDIA target, got {t.name!r}")
    warnings: list[str] = []
    reasons: dict[str, str] = {
        "agpr": "no AGPRs on NVIDIA",
        "vgpr_total": "AMD-only figure",
        "accum_offset": "AMD-only figure",
        "sgpr": "no SGPRs on NVIDIA (uniform registers are not reported)",
        "vgpr_spill_count": "NVIDIA reports spill bytes (spill_store_bytes/spill_load_bytes)",
        "sgpr_spill_count": "NVIDIA reports spill bytes (spill_store_bytes/spill_load_bytes)",
        "compiler_occupancy": "ptxas does not report occupancy",
    }
    m = re.search(r"\.entry\s+([\w$]+)", ptx_text)
    name = kernel_name or (m.group(1) if m else None)
    if num_warps is None:
        m = re.search(r"^\s*\.(?:reqntid|maxntid)\s+([\d\s,]+)", ptx_text, re.M)
        if m:
            threads = math.prod(int(x) for x in m.group(1).replace(",", " ").split())
            num_warps = cdiv(threads, t.warp_size)
        else:
            reasons["num_warps"] = "no .reqntid/.maxntid and no num_warps given"

    regs = frame = static_shared = code_bytes = None
    spill_st = spill_ld = None
    if cubin_bytes:
        try:
            attrs = _cubin_attrs(cubin_bytes, name)
        except (ValueError, struct.error, IndexError) as e:
            attrs = {}
            warnings.append(f"cubin not readable: {e}")
        regs = attrs.get("regs")
        frame = attrs.get("frame_size")
        static_shared = attrs.get("static_shared")
        code_bytes = attrs.get("code_bytes")
        if frame == 0:
            # Spilled registers live in the stack frame: no frame, no spills.
            spill_st = spill_ld = 0
    if run_ptxas and (regs is None or spill_st is None):
        got, err = _run_ptxas(ptx_text, t.arch, name)
        if err:
            for f_ in ("vgpr", "scratch_bytes", "spill_store_bytes", "spill_load_bytes"):
                reasons.setdefault(f_, err)
        if regs is not None and "regs" in got and got["regs"] != regs:
            warnings.append(f"cubin has {regs} registers but ptxas -v says {got['regs']}")
        regs = regs if regs is not None else got.get("regs")
        frame = frame if frame is not None else got.get("frame_size")
        spill_st = got.get("spill_stores", spill_st)
        spill_ld = got.get("spill_loads", spill_ld)
    for f_, v in (
        ("vgpr", regs),
        ("scratch_bytes", frame),
        ("spill_store_bytes", spill_st),
        ("spill_load_bytes", spill_ld),
    ):
        if v is None:
            reasons.setdefault(
                f_, "no cubin given" + (" and ptxas not run" if not run_ptxas else "")
            )
        else:
            reasons.pop(f_, None)
    if code_bytes is None:
        reasons["code_bytes"] = "SASS size needs the cubin"

    if shared_bytes is None:
        lds = None
        reasons["lds_bytes"] = (
            "dynamic shared memory is not in the PTX; pass shared_bytes (Triton: metadata.shared)"
        )
    else:
        lds = (static_shared or 0) + shared_bytes
    if static_shared is None:
        reasons["lds_static_bytes"] = "static shared memory needs the cubin"

    limits, blocks = nvidia_occupancy(t, regs=regs, smem_bytes=lds, num_warps=num_warps)
    occ = min(limits.values()) if limits and "registers" in limits else None
    if occ is None:
        reasons["occupancy"] = "register count or num_warps unknown"
    elif lds is None:
        reasons["occupancy"] = "shared-memory limit not applied (dynamic shared memory unknown)"

    mix = count_instructions(
        item if isinstance(item, str) else classify(*item) for item in statements(ptx_text)
    )

    return ResourceReport(
        target=t.name,
        backend=t.backend,
        kernel_name=name,
        vgpr=regs,
        agpr=None,
        vgpr_total=None,
        accum_offset=None,
        sgpr=None,
        scratch_bytes=frame,
        vgpr_spill_count=None,
        sgpr_spill_count=None,
        spill_store_bytes=spill_st,
        spill_load_bytes=spill_ld,
        lds_bytes=lds,
        lds_static_bytes=static_shared,
        num_warps=num_warps,
        occupancy=occ,
        occupancy_unit="warps_per_sm",
        occupancy_max=t.registers.max_warps_per_sm,
        occupancy_limits=limits,
        occupancy_limiter=limiter(limits) if occ is not None else None,
        compiler_occupancy=None,
        workgroups_per_cu=blocks,
        code_bytes=code_bytes,
        **mix,
        reasons=reasons,
        warnings=tuple(warnings),
    )
