"""Config spaces, the static model that ranks them, and the shipped gfx950 defaults.

No gfx950 was available to time on, so every shipped default below was
chosen by a *static model*, not by measurement: each candidate of a
kernel's config space is cross-compiled for gfx950 (``flydsl_core.autotune.
prune``: a candidate that spills, needs scratch or too much LDS, or fails to
compile is rejected) and the survivors are ranked from their
``ResourceReport`` by, in order:

1. the widest global load (128-bit ``buffer_load_dwordx4`` where the
   candidate allows it; RMSNorm is bandwidth-bound);
2. the occupancy (waves per SIMD, at most 8 on gfx950): enough waves in
   flight hide HBM latency, and a row kernel has nothing else to hide it with;
3. the issue cost per element, ``instruction_count * num_warps /
   elements`` (elements = the ``R * BLOCK`` a program moves per pass): the
   fewest wave-instructions spent on each element (index math and the
   cross-wave reduction amortized over more elements per lane);
4. fewer warps (a smaller workgroup waits less at its reduction barrier).

``python -m flydsl_kernels.rmsnorm.configs`` re-derives the tables with
this model and prints them; the compile-tier tests check that the shipped
entries are what the model picks for a sample of them and that none spills.
The model prefers the same block sizes as upstream FlyDSL's measured gfx950
RMSNorm (256 threads per row below N = 12288, 512 up to 24576, 1024
above), which is some evidence for it, not proof: retune on hardware.

Kernels (``kernels.KERNELS`` keys) and where they apply, with
``BLOCK = next_pow2(N)``:

* ``fwd_rows``   BLOCK <= 1024: ``R`` rows per program as one (R, BLOCK) tile;
* ``fwd_row``    1024 < BLOCK <= ROW_MAX_BLOCK[bytes]: one row per program in registers;
* ``fwd_looped`` larger: one row per program, two passes over column blocks;
* ``bwd_rows``   BLOCK <= BWD_ROW_MAX_BLOCK[bytes]: whole rows in registers, R at a time;
* ``bwd_rowdot`` + ``bwd_cols`` larger: a per-row dot product, then a
  (column blocks x row chunks) grid for dx and the dweight partials;
* ``dw_reduce``  the fixed-order dweight reduction of the partials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: the GPU target the shipped defaults are for
TARGET = "gfx950"
#: gfx950's compute units (the grids of the backward kernels are sized in programs per CU)
NUM_CUS = 256


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def elem_bytes(dtype) -> int:
    """2 for bf16/fp16, 4 for fp32 (a torch dtype, a FlyDSL dtype or its name)."""
    name = str(dtype).removeprefix("torch.")
    if name in ("bfloat16", "float16", "bf16", "fp16", "half"):
        return 2
    if name in ("float32", "fp32", "float"):
        return 4
    raise ValueError(f"RMSNorm kernels support fp32, bf16 and fp16, got {dtype}")


@dataclass(frozen=True)
class Config:
    """One point of a kernel's config space: its tile constexprs and ``num_warps``."""

    kernel: str  # a key of kernels.KERNELS
    BLOCK: int
    R: int = 1  # rows per tile (fwd_rows, bwd_rows) or partial rows per step (dw_reduce: RB)
    num_warps: int = 4
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def constexprs(self) -> dict:
        d = {"BLOCK": self.BLOCK}
        if self.kernel in ("fwd_rows", "bwd_rows"):
            d["R"] = self.R
        elif self.kernel == "dw_reduce":
            d["RB"] = self.R
        return d

    def options(self) -> dict:
        return {"num_warps": self.num_warps}

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, **self.constexprs(), "num_warps": self.num_warps}


# -- the config spaces -----------------------------------------------------------------------------

WARPS = (1, 2, 4, 8, 16)


def space(kernel: str, N: int, nbytes: int) -> list[Config]:
    """Every candidate the static model considers for ``kernel`` at row length ``N``."""
    b = next_pow2(N)
    out = []
    if kernel in ("fwd_rows", "bwd_rows"):
        rs = (1, 2, 4, 8, 16, 32, 64)
        for r in rs:
            for w in WARPS:
                # at least one element per lane, and tiles of at most 32K elements
                if 64 * w <= r * b <= 32768:
                    out.append(Config(kernel, b, r, w))
    elif kernel == "fwd_row":
        out = [Config(kernel, b, 1, w) for w in WARPS if 64 * w <= b]
    elif kernel in ("fwd_looped", "bwd_rowdot"):
        # 8 or 16 warps per row: long rows come in small batches, and one row per program must
        # then bring several waves per SIMD (upstream's gfx950 RMSNorm uses 1024 threads here)
        for blk in (1024, 2048, 4096, 8192, 16384):
            for w in (8, 16):
                if blk <= max(b // 2, 1024) and 64 * w <= blk:
                    out.append(Config(kernel, blk, 1, w))
    elif kernel == "bwd_cols":
        for blk in (256, 512, 1024, 2048, 4096):
            for w in (1, 2, 4, 8):
                if 64 * w <= blk:
                    out.append(Config(kernel, blk, 1, w))
    elif kernel == "dw_reduce":
        # 64 columns per program: the grid is N / BLOCK programs, and 64 fp32 columns are the
        # narrowest block whose rows are still whole 256-byte segments (16 lanes x 128 bits)
        for blk in (64,):
            for rb in (8, 16, 32, 64, 128):
                for w in (1, 2, 4, 8):
                    if 64 * w <= blk * rb <= 8192:
                        out.append(Config(kernel, blk, rb, w))
    else:
        raise KeyError(f"unknown RMSNorm kernel {kernel!r}")
    return out


# -- compile arguments ------------------------------------------------------------------------------


def row_stride_args(sx: int, sr: int, n: int, nbytes: int):
    """``(s, {SX, SR, SY})`` for ``rmsnorm_fwd_row``, whose outputs have row stride ``n``.

    For 16-bit rows with ``n % 16 == 0`` the output stride goes in at run time
    as ``s`` (its constexpr 0), and so does each input stride equal to it; any
    other stride stays a constant, which alone proves 16-byte rows for ``N % 8
    == 0`` (see the kernel's docstring). fp32 rows keep constants: there the
    run-time stride cost registers (N = 2048, 1 warp: 75 VGPRs instead of 61)."""
    rt = nbytes == 2 and n % 16 == 0
    const = {"SX": 0 if rt and sx == n else sx, "SR": 0 if rt and sr == n else sr}
    return n, {**const, "SY": 0 if rt else n}


def compile_config(cfg: Config, N: int, dtype, target: str = TARGET, **kw):
    """Compile one config for ``target`` (``plan.model_launch``: contiguous rows; ``kw``:
    ``weight``, ``residual``, ``mode``); returns the ``CompiledKernel``."""
    from .plan import model_launch

    return model_launch(cfg, N, dtype, **kw).compile(target)


# -- the static model ------------------------------------------------------------------------------


def _elements(cfg: Config) -> int:
    if cfg.kernel in ("fwd_rows", "bwd_rows", "dw_reduce"):
        return cfg.R * cfg.BLOCK
    return cfg.BLOCK


def score(cfg: Config, report: dict) -> tuple:
    """The static model's sort key for a surviving candidate (larger is better)."""
    widths = report.get("load_widths_bits") or {}
    widest = max((int(k) for k in widths), default=0)
    occ = report.get("occupancy") or 0
    # "enough" occupancy: every wave slot on AMD (8 per SIMD); half the warp slots on NVIDIA,
    # where each thread's 128-bit loads keep more bytes in flight than a CDNA lane's
    cap = 8 if report.get("occupancy_unit") != "warps_per_sm" else (report["occupancy_max"] // 2)
    cost = report["instruction_count"] * cfg.num_warps / _elements(cfg)
    return (widest, min(occ, cap), -cost, -cfg.num_warps)


def rank(kernel: str, N: int, dtype, target: str = TARGET, *, candidates=None, jobs=None, **kw):
    """All candidates of ``kernel`` at ``N`` compiled and judged, best first.

    Returns ``[(Config, report dict or None, rejected reason or None)]``.
    """
    from flydsl_core.autotune import config as at
    from flydsl_core.autotune.prune import prune

    from .plan import model_launch

    cands = list(candidates) if candidates is not None else space(kernel, N, elem_bytes(dtype))
    by_key = {}
    spaces = []
    launch = None
    for c in cands:
        launch = model_launch(c, N, dtype, **kw)  # the run-time arguments are the same for all
        ac = at.Config.make(**launch.constexprs, **launch.options)
        by_key[ac] = c
        spaces.append(ac)
    if launch is None:
        return []
    res = prune(launch.kernel, launch.args, spaces, target, jobs=jobs)
    rows = [(by_key[c.config], c.report, c.rejected) for c in res.candidates]
    ok = sorted((r for r in rows if r[2] is None), key=lambda r: score(r[0], r[1]), reverse=True)
    return ok + [r for r in rows if r[2] is not None]


def best(kernel: str, N: int, dtype, target: str = TARGET, **kw) -> Config:
    ranked = rank(kernel, N, dtype, target, **kw)
    if not ranked or ranked[0][2] is not None:
        raise RuntimeError(f"no config of {kernel} at N={N} {dtype} survives on {target}")
    return ranked[0][0]


# -- the shipped gfx950 defaults (derived with the model above; see the module docstring) -----------
# Keys: (element bytes, BLOCK). Each entry notes the report figures the model saw.

#: largest BLOCK the one-row forward kernel keeps in registers (beyond: fwd_looped)
ROW_MAX_BLOCK = {2: 32768, 4: 16384}
#: largest BLOCK the register-resident backward handles (beyond: bwd_rowdot + bwd_cols)
BWD_ROW_MAX_BLOCK = {2: 16384, 4: 8192}
#: the multi-row forward kernel handles BLOCK up to this
ROWS_MAX_BLOCK = 1024

# generated by `python -m flydsl_kernels.rmsnorm.configs` (Triton 3.9, gfx950); notes = the
# figures the model saw (VGPR, instructions, waves per SIMD)
SHIPPED_FWD: dict[tuple[int, int], Config] = {
    (2, 1): Config("fwd_rows", 1, 64, 1, notes={"vgpr": 6, "instr": 38, "occ": 8}),
    (2, 2): Config("fwd_rows", 2, 64, 1, notes={"vgpr": 7, "instr": 48, "occ": 8}),
    (2, 4): Config("fwd_rows", 4, 64, 1, notes={"vgpr": 11, "instr": 57, "occ": 8}),
    (2, 8): Config("fwd_rows", 8, 64, 1, notes={"vgpr": 19, "instr": 74, "occ": 8}),
    (2, 16): Config("fwd_rows", 16, 64, 1, notes={"vgpr": 34, "instr": 143, "occ": 8}),
    (2, 32): Config("fwd_rows", 32, 64, 1, notes={"vgpr": 56, "instr": 222, "occ": 8}),
    (2, 64): Config("fwd_rows", 64, 32, 1, notes={"vgpr": 58, "instr": 223, "occ": 8}),
    (2, 128): Config("fwd_rows", 128, 16, 1, notes={"vgpr": 57, "instr": 228, "occ": 8}),
    (2, 256): Config("fwd_rows", 256, 8, 1, notes={"vgpr": 58, "instr": 264, "occ": 8}),
    (2, 512): Config("fwd_rows", 512, 4, 1, notes={"vgpr": 56, "instr": 241, "occ": 8}),
    (2, 1024): Config("fwd_rows", 1024, 2, 1, notes={"vgpr": 56, "instr": 225, "occ": 8}),
    (2, 2048): Config("fwd_row", 2048, 1, 1, notes={"vgpr": 58, "instr": 221, "occ": 8}),
    (2, 4096): Config("fwd_row", 4096, 1, 2, notes={"vgpr": 58, "instr": 237, "occ": 8}),
    (2, 8192): Config("fwd_row", 8192, 1, 4, notes={"vgpr": 58, "instr": 239, "occ": 8}),
    (2, 16384): Config("fwd_row", 16384, 1, 8, notes={"vgpr": 58, "instr": 242, "occ": 8}),
    (2, 32768): Config("fwd_row", 32768, 1, 16, notes={"vgpr": 58, "instr": 243, "occ": 8}),
    (4, 1): Config("fwd_rows", 1, 64, 1, notes={"vgpr": 4, "instr": 33, "occ": 8}),
    (4, 2): Config("fwd_rows", 2, 64, 1, notes={"vgpr": 7, "instr": 42, "occ": 8}),
    (4, 4): Config("fwd_rows", 4, 64, 1, notes={"vgpr": 10, "instr": 46, "occ": 8}),
    (4, 8): Config("fwd_rows", 8, 64, 1, notes={"vgpr": 24, "instr": 95, "occ": 8}),
    (4, 16): Config("fwd_rows", 16, 64, 1, notes={"vgpr": 37, "instr": 137, "occ": 8}),
    (4, 32): Config("fwd_rows", 32, 64, 1, notes={"vgpr": 60, "instr": 232, "occ": 8}),
    (4, 64): Config("fwd_rows", 64, 32, 1, notes={"vgpr": 61, "instr": 247, "occ": 8}),
    (4, 128): Config("fwd_rows", 128, 16, 1, notes={"vgpr": 62, "instr": 289, "occ": 8}),
    (4, 256): Config("fwd_rows", 256, 8, 1, notes={"vgpr": 59, "instr": 274, "occ": 8}),
    (4, 512): Config("fwd_rows", 512, 4, 1, notes={"vgpr": 64, "instr": 211, "occ": 8}),
    (4, 1024): Config("fwd_rows", 1024, 4, 2, notes={"vgpr": 60, "instr": 232, "occ": 8}),
    (4, 2048): Config("fwd_row", 2048, 1, 1, notes={"vgpr": 61, "instr": 177, "occ": 8}),
    (4, 4096): Config("fwd_row", 4096, 1, 2, notes={"vgpr": 62, "instr": 189, "occ": 8}),
    (4, 8192): Config("fwd_row", 8192, 1, 4, notes={"vgpr": 62, "instr": 191, "occ": 8}),
    (4, 16384): Config("fwd_row", 16384, 1, 8, notes={"vgpr": 62, "instr": 195, "occ": 8}),
}
SHIPPED_FWD_LOOPED: dict[int, Config] = {
    2: Config("fwd_looped", 8192, 1, 8, notes={"vgpr": 44, "instr": 310, "occ": 8}),
    4: Config("fwd_looped", 8192, 1, 16, notes={"vgpr": 64, "instr": 383, "occ": 8}),
}
SHIPPED_BWD: dict[tuple[int, int], Config] = {
    (2, 1): Config("bwd_rows", 1, 64, 1, notes={"vgpr": 13, "instr": 86, "occ": 8}),
    (2, 2): Config("bwd_rows", 2, 64, 1, notes={"vgpr": 20, "instr": 113, "occ": 8}),
    (2, 4): Config("bwd_rows", 4, 64, 1, notes={"vgpr": 33, "instr": 153, "occ": 8}),
    (2, 8): Config("bwd_rows", 8, 64, 1, notes={"vgpr": 59, "instr": 234, "occ": 8}),
    (2, 16): Config("bwd_rows", 16, 32, 1, notes={"vgpr": 65, "instr": 284, "occ": 7}),
    (2, 32): Config("bwd_rows", 32, 16, 1, notes={"vgpr": 64, "instr": 272, "occ": 8}),
    (2, 64): Config("bwd_rows", 64, 8, 1, notes={"vgpr": 64, "instr": 248, "occ": 8}),
    (2, 128): Config("bwd_rows", 128, 4, 1, notes={"vgpr": 63, "instr": 197, "occ": 8}),
    (2, 256): Config("bwd_rows", 256, 2, 1, notes={"vgpr": 61, "instr": 219, "occ": 8}),
    (2, 512): Config("bwd_rows", 512, 1, 1, notes={"vgpr": 50, "instr": 180, "occ": 8}),
    (2, 1024): Config("bwd_rows", 1024, 1, 2, notes={"vgpr": 52, "instr": 180, "occ": 8}),
    (2, 2048): Config("bwd_rows", 2048, 1, 4, notes={"vgpr": 52, "instr": 183, "occ": 8}),
    (2, 4096): Config("bwd_rows", 4096, 1, 8, notes={"vgpr": 52, "instr": 187, "occ": 8}),
    (2, 8192): Config("bwd_rows", 8192, 1, 16, notes={"vgpr": 52, "instr": 188, "occ": 8}),
    (2, 16384): Config("bwd_rows", 16384, 1, 16, notes={"vgpr": 96, "instr": 277, "occ": 5}),
    (4, 1): Config("bwd_rows", 1, 64, 1, notes={"vgpr": 11, "instr": 77, "occ": 8}),
    (4, 2): Config("bwd_rows", 2, 64, 1, notes={"vgpr": 21, "instr": 109, "occ": 8}),
    (4, 4): Config("bwd_rows", 4, 64, 1, notes={"vgpr": 33, "instr": 138, "occ": 8}),
    (4, 8): Config("bwd_rows", 8, 64, 1, notes={"vgpr": 55, "instr": 205, "occ": 8}),
    (4, 16): Config("bwd_rows", 16, 32, 1, notes={"vgpr": 54, "instr": 190, "occ": 8}),
    (4, 32): Config("bwd_rows", 32, 32, 1, notes={"vgpr": 61, "instr": 255, "occ": 8}),
    (4, 64): Config("bwd_rows", 64, 16, 1, notes={"vgpr": 63, "instr": 222, "occ": 8}),
    (4, 128): Config("bwd_rows", 128, 4, 1, notes={"vgpr": 52, "instr": 213, "occ": 8}),
    (4, 256): Config("bwd_rows", 256, 2, 1, notes={"vgpr": 42, "instr": 127, "occ": 8}),
    (4, 512): Config("bwd_rows", 512, 1, 1, notes={"vgpr": 50, "instr": 128, "occ": 8}),
    (4, 1024): Config("bwd_rows", 1024, 1, 2, notes={"vgpr": 52, "instr": 149, "occ": 8}),
    (4, 2048): Config("bwd_rows", 2048, 1, 4, notes={"vgpr": 52, "instr": 151, "occ": 8}),
    (4, 4096): Config("bwd_rows", 4096, 1, 8, notes={"vgpr": 52, "instr": 155, "occ": 8}),
    (4, 8192): Config("bwd_rows", 8192, 1, 16, notes={"vgpr": 52, "instr": 158, "occ": 8}),
}
SHIPPED_BWD_ROWDOT: dict[int, Config] = {
    2: Config("bwd_rowdot", 8192, 1, 8, notes={"vgpr": 56, "instr": 179, "occ": 8}),
    4: Config("bwd_rowdot", 8192, 1, 8, notes={"vgpr": 63, "instr": 187, "occ": 8}),
}
SHIPPED_BWD_COLS: dict[int, Config] = {
    2: Config("bwd_cols", 1024, 1, 2, notes={"vgpr": 46, "instr": 155, "occ": 8}),
    4: Config("bwd_cols", 1024, 1, 1, notes={"vgpr": 62, "instr": 183, "occ": 8}),
}
SHIPPED_DW_REDUCE: dict[int, Config] = {
    2: Config("dw_reduce", 64, 32, 1, notes={"vgpr": 57, "instr": 119, "occ": 8}),
    4: Config("dw_reduce", 64, 32, 1, notes={"vgpr": 57, "instr": 119, "occ": 8}),
}


#: waves that fill gfx950 at 8 waves per SIMD (256 CUs x 4 SIMDs x 8)
FULL_WAVES = NUM_CUS * 4 * 8


# -- the other targets' tables ---------------------------------------------------------------------
# gfx942 has gfx950's wave64 and register file (512 unified VGPRs per lane, 8 waves per SIMD), so
# it ships gfx950's table (not re-ranked there; its report compiles every RMSNorm case clean with
# it); sm90 and gfx1250 run warps of 32 lanes, so their table is gfx950's at equal
# elements per lane: num_warps x 2 (``_target.lane_factor``), at most 32 warps (1024 threads).
# The model re-run on sm90 at sampled buckets (``rank(kernel, N, bf16, target="sm90",
# candidates=...)``, Triton 3.9, cross-compiled, untimed) ranks the derived entry first at each;
# ``EVIDENCE`` holds what it saw, (num_warps, registers, warps per SM, PTX statements), best
# first, no candidate with a stack frame. One entry is adjusted (``ADJUSTED``): at (bf16, 8192)
# the derived 8 warps spill 4 bytes in the fused-residual variant at N = 5120 (40 registers,
# 8 B stack), so sm90 takes the model's second, 16 warps (36 registers; the residual variant
# 32, no stack): an entry must compile clean for every variant it serves.
EVIDENCE: dict[str, dict] = {
    "sm90": {
        "fwd_row N=8192 bf16": [
            (8, 59, 32, 332),
            (16, 36, 48, 190),
            (32, 24, 64, 116),
            (4, 100, 16, 618),
        ],
        "fwd_row N=4096 bf16": [
            (4, 58, 32, 328),
            (8, 32, 64, 186),
            (16, 24, 64, 116),
            (2, 98, 16, 614),
        ],
        "bwd_rows N=4096 bf16": [(16, 58, 32, 227), (8, 98, 16, 378), (32, 32, 64, 141)],
        "fwd_row N=5120 bf16 +residual (BLOCK 8192)": [
            (4, 64, 32, 718),
            (8, 40, 48, 386),
            (16, 32, 64, 218),
        ],
    },
}
#: per target, (table, key) -> num_warps where the derived entry is not shipped (see above)
ADJUSTED: dict[str, dict[tuple, int]] = {"sm90": {("fwd", (2, 8192)): 16}}


def _derived(table: dict, factor: int) -> dict:
    return {
        k: Config(c.kernel, c.BLOCK, c.R, min(32, c.num_warps * factor), notes={"from": "gfx950"})
        for k, c in table.items()
    }


_TABLES: dict[str, dict[str, dict]] = {}


def tables(target=None) -> dict[str, dict]:
    """``{"fwd", "fwd_looped", "bwd", "bwd_rowdot", "bwd_cols", "dw_reduce"}`` of ``target``'s
    table (None and the CPU backends: gfx950's)."""
    from .._target import lane_factor, table_target

    name = table_target(None, target)
    got = _TABLES.get(name)
    if got is None:
        base = {
            "fwd": SHIPPED_FWD,
            "fwd_looped": SHIPPED_FWD_LOOPED,
            "bwd": SHIPPED_BWD,
            "bwd_rowdot": SHIPPED_BWD_ROWDOT,
            "bwd_cols": SHIPPED_BWD_COLS,
            "dw_reduce": SHIPPED_DW_REDUCE,
        }
        f = lane_factor(name)
        got = base if f == 1 else {k: _derived(v, f) for k, v in base.items()}
        for (table, key), warps in ADJUSTED.get(name, {}).items():
            c = got[table][key]
            got[table] = {**got[table], key: Config(c.kernel, c.BLOCK, c.R, warps, notes={"from": "model, adjusted"})}  # fmt: skip
        _TABLES[name] = got
    return got


def select_forward(N: int, dtype, M: int | None = None, target=None) -> Config:
    """The shipped forward kernel and config of ``target``'s table for rows of ``N`` elements
    of ``dtype``.

    ``M`` (the number of rows), when given, only matters to the multi-row
    kernel: its ``R`` is halved (and ``num_warps`` with it, keeping at least
    one element per lane) while the grid would bring fewer warps than the
    GPU keeps resident (``FULL_WAVES`` on gfx950), so short batches still
    spread over every CU.
    """
    from .._target import lane_factor, resident_warps

    t = tables(target)
    nb, b = elem_bytes(dtype), next_pow2(max(N, 1))
    if b > ROW_MAX_BLOCK[nb]:
        return t["fwd_looped"][nb]
    cfg = t["fwd"][(nb, b)]
    if M is None or cfg.kernel != "fwd_rows":
        return cfg
    full, lanes = resident_warps(target), 64 // lane_factor(target)
    r, w = cfg.R, cfg.num_warps
    while r > 1 and math.ceil(M / r) * w < full:
        r //= 2
        if r * b < lanes * w and w > 1:
            w //= 2
    return cfg if (r, w) == (cfg.R, cfg.num_warps) else Config("fwd_rows", b, r, w)


def select_backward(N: int, dtype, target=None) -> tuple[Config, ...]:
    """``(bwd_rows,)`` or ``(bwd_rowdot, bwd_cols)``: the shipped backward kernels for ``N``."""
    t = tables(target)
    nb, b = elem_bytes(dtype), next_pow2(max(N, 1))
    if b <= BWD_ROW_MAX_BLOCK[nb]:
        return (t["bwd"][(nb, b)],)
    return (t["bwd_rowdot"][nb], t["bwd_cols"][nb])


def select_dw_reduce(dtype, target=None) -> Config:
    return tables(target)["dw_reduce"][elem_bytes(dtype)]


def _cus(target) -> int:
    from .._target import num_cus

    return num_cus(target)


def backward_programs(M: int, R: int, target=None) -> tuple[int, int]:
    """``(programs, rows per program)`` for the register-resident backward.

    At most two programs per CU (each then walks its chunk of rows, keeping
    its dweight partial in registers), and chunks are whole ``R``-row tiles."""
    groups = math.ceil(M / R)
    p = max(1, min(groups, 2 * _cus(target)))
    chunk = math.ceil(groups / p) * R
    return math.ceil(M / chunk), chunk


def cols_programs(M: int, N: int, BLOCK: int, target=None) -> tuple[int, int, int]:
    """``(column blocks, row chunks, rows per chunk)`` for ``bwd_cols``: about four programs
    per CU in all, each with at least 8 rows where there are that many."""
    nb = math.ceil(N / BLOCK)
    p = max(1, min(math.ceil(M / 8), math.ceil(4 * _cus(target) / nb)))
    chunk = math.ceil(M / p)
    return nb, math.ceil(M / chunk), chunk


def _print_tables(jobs=None):  # pragma: no cover - a developer tool
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        nb = elem_bytes(dtype)
        for b in [1 << k for k in range(0, 17)]:
            for kern in ("fwd_rows",) if b <= ROWS_MAX_BLOCK else ("fwd_row",):
                r = rank(kern, b, dtype, jobs=jobs)
                c, rep, why = r[0]
                print(kern, nb, b, c.as_dict(), _fig(rep) if rep else why)
        for kern, n in (("fwd_looped", 131072), ("bwd_rowdot", 131072), ("bwd_cols", 131072)):
            c, rep, _ = rank(kern, n, dtype, jobs=jobs)[0]
            print(kern, nb, c.as_dict(), _fig(rep))
        for b in [1 << k for k in range(0, 16)]:
            c, rep, why = rank("bwd_rows", b, dtype, jobs=jobs)[0]
            print("bwd_rows", nb, b, c.as_dict(), _fig(rep) if rep else why)
        c, rep, _ = rank("dw_reduce", 8192, dtype, jobs=jobs)[0]
        print("dw_reduce", nb, c.as_dict(), _fig(rep))


def _fig(rep: dict) -> str:
    return (
        f"vgpr={rep['vgpr']} sgpr={rep['sgpr']} instr={rep['instruction_count']} "
        f"occ={rep['occupancy']} ld={rep['load_widths_bits']} st={rep['store_widths_bits']}"
    )


if __name__ == "__main__":  # pragma: no cover
    _print_tables()
