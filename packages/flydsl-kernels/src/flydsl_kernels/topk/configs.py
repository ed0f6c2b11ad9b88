"""Kernel selection by (M, N, k), the config space, and the shipped gfx950 defaults.

Selection rule
--------------
Seeded from the upstream dispatch regions published for MI355X (gfx950.md:
small-K register kernel for K in {2,4,8,16} and power-of-two N in [1024,
8192]; radix kernel for K 64-1024 over N 8k-256k), and extended to every
(k, N) by a stated cost model (vector operations per element per program):

* ``small`` when k <= 16 and N <= 16384: k rounds of (argmax, mask) over a
  register-resident row, about 3k ops per element: cheaper than the
  ~log2(N)^2/2 compare-exchange stages of a bitonic tile sort (84 at
  N = 8192) and the radix select's ~9 ops per element per pass (5 passes
  over fp32 keys) while k <= 16. Also k <= 8 at any N (the chunked variant
  takes 2 argmax per round per chunk, ~6k ops per element, below the radix
  select's ~45 for fp32).
* ``sort`` when N <= 8192 (any k): one bitonic tile top-k of the row (<= 8192
  (key, index) pairs). The upstream radix region starts at N = 8k: the switch.
* ``radix`` otherwise: one program per row, all passes fused, deterministic,
  when M >= CUs / 2 (256 CUs on gfx950); with fewer rows, ``radix_split``
  spreads each row over S = min(chunks, CUs // M) programs to fill the GPU
  (NPASS + 2 launches; NPASS = 4 for fp32 keys, 2 for 16-bit keys).
* radix survivors are sorted by ``sort_tile`` when k <= 4096, else by the
  stable merge sort (``sort_runs`` + ``merge_pass``); ``sorted=False`` skips it.

Config space and the static model
---------------------------------
``SPACES`` lists the warps (and the radix chunk size) tried per kernel;
``BUCKETS`` the problem sizes each choice is made for (a problem uses the
smallest bucket at least its tile). No gfx950 was available to time on, so
``derive()`` picks per bucket without timing: every config is compiled for
gfx950 through ``flydsl_core.autotune.prune`` (configs holding more than
``MAX_ELEMS_PER_LANE`` tile elements per lane are not tried), which rejects
any that uses scratch or spills SGPRs/VGPRs or overflows LDS; among survivors the model
prefers (1) the highest occupancy (waves per SIMD), then (2) the fewest
instructions issued per element, ``instruction_count * num_warps /
elements per program or loop iteration`` (a proxy for issue slots at full
occupancy), then (3) the fewest VGPRs. ``SHIPPED`` holds the result;
``python -m flydsl_kernels.topk.configs`` re-derives and prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: key bits per supported dtype: 16-bit floats rank on their own 16 bits (2 radix passes)
KEY_BITS = {torch.float32: 32, torch.bfloat16: 16, torch.float16: 16}

SMALL_K_MAX = 16
SMALL_K_ANY_N = 8  # k at or below which the chunked small-k kernel serves any N
SMALL_TILE_MAX = 16384  # largest register-resident row of the small-k kernel
SMALL_CHUNK = 4096  # chunk of the chunked small-k kernel
SORT_N_DEFAULT = 8192  # the rule's switch from tile sort to radix select
SORT_TILE_MAX = 16384  # largest row topk_sort accepts (method="sort")
SURVIVOR_TILE_MAX = 4096  # sort_tile up to this k, merge sort above
MERGE_B = 1024  # merge sort block (runs of MERGE_B; 2*MERGE_B-element tile sorts)
GFX950_CUS = 256
METHODS = ("small", "sort", "radix", "radix_split")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Plan:
    """The kernel chosen for a problem and its config (constexprs and launch options)."""

    kernel: str  # one of METHODS, or "router"
    KP: int = 1  # k rounded up to a power of two (small / sort)
    BLOCK: int = 1024  # row tile (small / sort / router) or chunk (radix)
    CHUNKED: bool = False  # small: loop over chunks of BLOCK
    num_warps: int = 4
    split: int = 1  # radix_split: programs per row
    deterministic: bool = True
    sorter: str | None = None  # "tile" | "merge" (radix survivors), None: unsorted or k == 1
    SORT_KP: int = 1
    MERGE_B: int = MERGE_B
    sort_warps: int = 4  # warps of the survivor sort

    def slices(self, n: int) -> tuple[int, int]:
        """(programs per row, elements per program) for radix_split; spans are whole chunks."""
        chunks = -(-n // self.BLOCK)
        per = -(-chunks // max(1, self.split))
        return -(-chunks // per), per * self.BLOCK

    def as_dict(self) -> dict:
        d = {"kernel": self.kernel, "num_warps": self.num_warps, "BLOCK": self.BLOCK}
        if self.kernel in ("small", "sort"):
            d["KP"] = self.KP
            if self.kernel == "small":
                d["CHUNKED"] = self.CHUNKED
        if self.kernel == "radix_split":
            d.update(split=self.split, deterministic=self.deterministic)
        if self.sorter:
            d.update(sorter=self.sorter, sort_warps=self.sort_warps)
            d.update(
                {"SORT_KP": self.SORT_KP} if self.sorter == "tile" else {"MERGE_B": self.MERGE_B}
            )
        return d


# -- the searched space, the buckets and the shipped picks ---------------------------------------

#: warps (and, for radix, chunk sizes) tried per kernel; every bucket of a kernel uses its space
SPACES = {
    "small": {"num_warps": (1, 2, 4, 8)},
    "sort": {"num_warps": (2, 4, 8, 16)},
    "radix": {"BLOCK": (1024, 2048, 4096), "num_warps": (4, 8, 16)},
    "sort_tile": {"num_warps": (2, 4, 8, 16)},
    "merge": {"num_warps": (4, 8, 16)},
    "router": {"num_warps": (1, 2, 4)},
}

#: register-resident tiles hold at most this many elements per lane (a config holding more
#: cannot keep keys and indices in 512 VGPRs with the reductions' temporaries; LLVM also
#: takes minutes on it): such configs are not compiled
MAX_ELEMS_PER_LANE = 64

#: the buckets each kernel's config is chosen for (a problem uses the smallest one >= its tile)
BUCKETS = {
    "small": [(b, False) for b in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    + [(SMALL_CHUNK, True)],
    "sort": [(b,) for b in (512, 1024, 2048, 4096, 8192, 16384)],
    "radix": [(32,), (16,)],  # key bits
    "sort_tile": [(b,) for b in (256, 512, 1024, 2048, 4096)],
    "merge": [(MERGE_B,)],
    "router": [(b,) for b in (64, 128, 256, 512, 1024, 2048, 4096)],
}

#: gfx950 static picks, (kernel, *bucket) -> config, as printed by ``main()`` (``derive()``);
#: the comment is the chosen compile's report (see model_launch for each bucket's worst case)
# fmt: off
SHIPPED: dict[tuple, dict] = {
    ('small', 256, False): {'num_warps': 1},  # vgpr 17, sgpr 34, occ 8, instr 1898; 4 survivors
    ('small', 512, False): {'num_warps': 1},  # vgpr 28, sgpr 34, occ 8, instr 2404; 4 survivors
    ('small', 1024, False): {'num_warps': 1},  # vgpr 52, sgpr 34, occ 8, instr 3451; 4 survivors
    ('small', 2048, False): {'num_warps': 2},  # vgpr 60, sgpr 34, occ 8, instr 3748; 4 survivors
    ('small', 4096, False): {'num_warps': 4},  # vgpr 60, sgpr 34, occ 8, instr 3900; 4 survivors
    ('small', 8192, False): {'num_warps': 8},  # vgpr 55, sgpr 34, occ 8, instr 4110; 3 survivors
    ('small', 16384, False): {'num_warps': 8},  # vgpr 100, sgpr 46, occ 4, instr 5852; 2 survivors
    ('small', 4096, True): {'num_warps': 4},  # vgpr 61, sgpr 86, occ 8, instr 4827; 2 survivors
    ('sort', 512): {'num_warps': 2},  # vgpr 34, sgpr 50, occ 8, instr 1454; 4 survivors
    ('sort', 1024): {'num_warps': 2},  # vgpr 52, sgpr 70, occ 8, instr 3448; 4 survivors
    ('sort', 2048): {'num_warps': 4},  # vgpr 62, sgpr 74, occ 8, instr 4392; 4 survivors
    ('sort', 4096): {'num_warps': 16},  # vgpr 50, sgpr 65, occ 8, instr 2902; 4 survivors
    ('sort', 8192): {'num_warps': 16},  # vgpr 72, sgpr 83, occ 7, instr 6507; 4 survivors
    ('sort', 16384): {'num_warps': 16},  # vgpr 108, sgpr 82, occ 4, instr 15472; 3 survivors
    ('radix', 32): {'BLOCK': 1024, 'num_warps': 4},  # vgpr 62, sgpr 89, occ 8, instr 2478; 8 survivors
    ('radix', 16): {'BLOCK': 1024, 'num_warps': 4},  # vgpr 61, sgpr 90, occ 8, instr 1499; 7 survivors
    ('sort_tile', 256): {'num_warps': 2},  # vgpr 24, sgpr 46, occ 8, instr 732; 4 survivors
    ('sort_tile', 512): {'num_warps': 2},  # vgpr 34, sgpr 50, occ 8, instr 1475; 4 survivors
    ('sort_tile', 1024): {'num_warps': 2},  # vgpr 52, sgpr 68, occ 8, instr 3485; 4 survivors
    ('sort_tile', 2048): {'num_warps': 4},  # vgpr 62, sgpr 70, occ 8, instr 4427; 4 survivors
    ('sort_tile', 4096): {'num_warps': 16},  # vgpr 50, sgpr 64, occ 8, instr 2921; 3 survivors
    ('merge', 1024): {'num_warps': 8},  # vgpr 45, sgpr 69, occ 8, instr 2563; 3 survivors
    ('router', 64): {'num_warps': 1},  # vgpr 21, sgpr 34, occ 8, instr 432; 3 survivors
    ('router', 128): {'num_warps': 1},  # vgpr 23, sgpr 37, occ 8, instr 646; 3 survivors
    ('router', 256): {'num_warps': 1},  # vgpr 33, sgpr 48, occ 8, instr 1034; 3 survivors
    ('router', 512): {'num_warps': 1},  # vgpr 41, sgpr 66, occ 8, instr 1853; 3 survivors
    ('router', 1024): {'num_warps': 1},  # vgpr 54, sgpr 59, occ 8, instr 3573; 3 survivors
    ('router', 2048): {'num_warps': 2},  # vgpr 60, sgpr 61, occ 8, instr 3984; 3 survivors
    ('router', 4096): {'num_warps': 4},  # vgpr 60, sgpr 72, occ 8, instr 4365; 2 survivors
}
# fmt: on


def bucket_of(kernel: str, size: int, chunked: bool = False) -> tuple:
    """The bucket of ``kernel`` for a tile of ``size`` (the smallest at least it)."""
    if kernel == "radix":
        return (size,)
    if kernel == "small" and chunked:
        return (SMALL_CHUNK, True)
    sizes = [b[0] for b in BUCKETS[kernel] if len(b) == 1 or b[1] is False]
    b = next((s for s in sizes if s >= size), sizes[-1])
    return (b, False) if kernel == "small" else (b,)


# The other targets' tables. gfx942 has gfx950's wave64 and register file, so it ships gfx950's
# table (not re-ranked there; its report compiles every TopK case clean with it); sm90 and
# gfx1250 run warps of 32 lanes: their table is gfx950's at equal elements per lane, num_warps x 2
# (``_target.lane_factor``), at most 32 warps. ``EVIDENCE`` holds the sm90 compile report of
# the derived entries at the report's cases (Triton 3.9, cross-compiled, untimed): (num_warps,
# registers per thread, warps per SM, PTX statements), none with a stack frame. The model's
# full re-ranking on sm90 (``derive(target="sm90")``) was not run: on the shared 2-core
# machine its unrolled small-k candidates alone took over 15 minutes; RMSNorm's re-ranking on
# sm90 picked the derived entry at every sampled bucket (rmsnorm/configs.py).
EVIDENCE: dict[str, dict] = {
    "sm90": {
        "small 256x4096 k=8": (8, 56, 32, 1636),
        "small 256x1024 k=2": (2, 48, 40, 506),
        "sort 256x8192 k=64": (32, 54, 32, 4584),
        "radix fp32 keys (N 16k-256k)": (8, 64, 32, 1032),
        "sort_tile k=256": (4, 32, 64, 898),
        "sort_tile k=1024": (4, 56, 36, 4115),
        "radix_hist_split 4x262144": (8, 34, 48, 340),
        "router 128 experts": (2, 30, 64, 583),
        "router 256 experts (DeepSeek-V3)": (2, 32, 64, 1002),
    },
}


def shipped(kernel: str, bucket: tuple, target=None) -> dict:
    """The shipped config of a bucket in ``target``'s table (a plain fallback where the table
    has no entry)."""
    from .._target import lane_factor

    got = SHIPPED.get((kernel, *bucket))
    if got is not None:
        cfg = dict(got)
    elif kernel == "radix":
        cfg = {"BLOCK": 2048, "num_warps": 8}
    else:
        cfg = {"num_warps": max(1, min(8, bucket[0] // 512))}
    f = lane_factor(target)
    if f > 1:
        cfg["num_warps"] = min(32, cfg["num_warps"] * f)
    return cfg


def router_config(block: int, target=None) -> Plan:
    return Plan(
        "router",
        BLOCK=block,
        num_warps=shipped("router", bucket_of("router", block), target)["num_warps"],
    )


def select(
    m: int,
    n: int,
    k: int,
    dtype,
    *,
    sorted: bool = True,
    deterministic: bool = True,
    method: str | None = None,
    cus: int | None = None,
    target=None,
) -> Plan:
    """The kernel and config of ``target``'s table for M rows of N elements, 1 <= k <= N (see
    the module doc); ``cus`` defaults to the target's CUs / SMs."""
    if cus is None:
        from .._target import num_cus

        cus = num_cus(target)
    if not 1 <= k <= n:
        raise ValueError(f"select needs 1 <= k <= n, got k={k}, n={n}")
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    kb = KEY_BITS[dtype]
    kp = next_pow2(k)
    tile = next_pow2(n)
    if method is None:
        if (k <= SMALL_K_MAX and n <= SMALL_TILE_MAX) or k <= SMALL_K_ANY_N:
            method = "small"
        elif n <= SORT_N_DEFAULT:
            method = "sort"
        else:
            chunk = shipped("radix", (kb,), target)["BLOCK"]
            method = "radix_split" if (m < cus // 2 and n > chunk) else "radix"
    if method == "small":
        if k > SMALL_K_MAX:
            raise ValueError(f"the small-k kernel unrolls k rounds: k={k} > {SMALL_K_MAX}")
        chunked = tile > SMALL_TILE_MAX
        block = SMALL_CHUNK if chunked else max(tile, kp)
        cfg = shipped("small", bucket_of("small", block, chunked), target)
        return Plan("small", KP=kp, BLOCK=block, CHUNKED=chunked, num_warps=cfg["num_warps"])
    if method == "sort":
        if tile > SORT_TILE_MAX:
            raise ValueError(f"the sort kernel holds a row in one tile: N={n} > {SORT_TILE_MAX}")
        cfg = shipped("sort", bucket_of("sort", tile), target)
        return Plan("sort", KP=kp, BLOCK=tile, num_warps=cfg["num_warps"])
    cfg = shipped("radix", (kb,), target)
    sorter, skp, sw = None, 1, 4
    if sorted and k > 1:
        if k <= SURVIVOR_TILE_MAX:
            sorter, skp = "tile", next_pow2(k)
            sw = shipped("sort_tile", bucket_of("sort_tile", skp), target)["num_warps"]
        else:
            sorter = "merge"
            sw = shipped("merge", (MERGE_B,), target)["num_warps"]
    split = 1
    if method == "radix_split":
        split = max(1, min(-(-n // cfg["BLOCK"]), cus // max(1, m)))
    return Plan(
        method,
        BLOCK=cfg["BLOCK"],
        num_warps=cfg["num_warps"],
        split=split,
        deterministic=bool(deterministic),
        sorter=sorter,
        SORT_KP=skp,
        sort_warps=sw,
    )


# -- the static model ------------------------------------------------------------------------------

_M = 256  # rows of the compile-time problems (the size facts are what matters)
_DT = {32: torch.float32, 16: torch.bfloat16}


def _spec(dtype, shape):
    from flydsl_core import TensorSpec

    return TensorSpec(dtype, shape)


def model_launch(kernel: str, bucket: tuple, config: dict | None = None):
    """``(Launch, elements per program / iteration)``: what the model compiles for a bucket.

    Each bucket compiles at its worst case: small at k = 16, sort at k = N
    (a full sort), sort_tile at k = its tile, radix sorted with fp32 or
    16-bit keys, the router with every DeepSeek-V3 option on. ``config``'s
    ``num_warps`` (4 without one) and radix ``BLOCK`` (2048) set the launch's.
    """
    from . import plan as P

    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    cfg = dict(config or {})
    opts = {"num_warps": cfg.get("num_warps", 4)}
    if kernel == "small":
        block, chunked = bucket
        n = 262144 if chunked else block
        kp = min(SMALL_K_MAX, block)
        x, v, i = _spec(f32, (_M, n)), _spec(f32, (_M, kp)), _spec(i64, (_M, kp))
        tile = dict(k=kp, KP=kp, BLOCK=block, LARGEST=True, KEY_BITS=32, options=opts)
        return P.small_launch(x, v, i, CHUNKED=chunked, **tile), block
    if kernel == "sort":
        (block,) = bucket
        x, v, i = _spec(f32, (_M, block)), _spec(f32, (_M, block)), _spec(i64, (_M, block))
        tile = dict(k=block, KP=block, BLOCK=block, LARGEST=True, KEY_BITS=32, options=opts)
        return P.sort_launch(x, v, i, **tile), block
    if kernel == "radix":
        (kb,) = bucket
        block = cfg.get("BLOCK", 2048)
        n, k = 32768, 256
        x, v, i = _spec(_DT[kb], (_M, n)), _spec(_DT[kb], (_M, k)), _spec(i64, (_M, k))
        w = _spec(i32, (_M, k))
        sel = dict(BLOCK=block, LARGEST=True, KEY_BITS=kb, SORTED=True, options=opts)
        return P.radix_launch(x, v, i, w, _spec(i32, (_M, k)), k, **sel), block
    if kernel == "sort_tile":
        (kp,) = bucket
        x, w, v, i = (_spec(f32, (_M, 32768)), _spec(i32, (_M, kp)), _spec(f32, (_M, kp)),
                      _spec(i64, (_M, kp)))  # fmt: skip
        return P.sort_tile_launch(x, w, _spec(i32, (_M, kp)), v, i, kp, KP=kp, options=opts), kp
    if kernel == "merge":
        (b,) = bucket
        return _merge_launch(b, True, opts), b
    if kernel == "router":
        (block,) = bucket
        ng = 8 if block >= 64 else 1
        rp = P.plan_router(
            block, 8, scoring="sigmoid", renormalize=True, has_bias=True, n_group=ng,
            topk_group=4 if ng > 1 else 1, routed_scaling_factor=2.5,
        )  # fmt: skip
        args = (_spec(torch.bfloat16, (_M, block)), _spec(f32, (block,)), _spec(f32, (_M, 8)),
                _spec(i64, (_M, 8)))  # fmt: skip
        return P.router_launch(*args, rp.constexprs, opts), block
    raise ValueError(f"unknown kernel {kernel!r}")


def _merge_launch(b: int, final: bool, opts: dict):
    """A merge pass over 65536 survivors (runs of 4B) of 262144-element rows."""
    from . import plan as P

    k = 65536
    w = [_spec(torch.int32, (_M, k)) for _ in range(4)]
    v, i = _spec(torch.float32, (_M, k)), _spec(torch.int64, (_M, k))
    x = _spec(torch.float32, (_M, 262144))
    return P.merge_pass_launch(x, *w, v, i, k, 4 * b, -(-k // b), B=b, FINAL=final, options=opts)


def static_score(report: dict, num_warps: int, elements: int) -> tuple:
    """Lower is better: (-occupancy, instructions issued per element, VGPRs)."""
    per_elem = (report.get("instruction_count") or 1 << 30) * num_warps / max(1, elements)
    return (-(report.get("occupancy") or 0), round(per_elem, 4), report.get("vgpr") or 1 << 30)


def derive(
    *, jobs: int | None = None, kernels=None, progress=None, target: str = "gfx950", buckets=None
) -> dict[tuple, dict]:
    """Re-run the static model for every bucket: ``{(kernel, *bucket): config}`` (no GPU needed)."""
    from flydsl_core.autotune import ConfigSpace, prune

    out: dict[tuple, dict] = {}
    for kernel in BUCKETS:
        if kernels is not None and kernel not in kernels:
            continue
        space = SPACES[kernel]
        for bucket in BUCKETS[kernel] if buckets is None else buckets.get(kernel, ()):
            cands = []
            blocks = space.get("BLOCK", (None,))
            for block in blocks:
                over = {"BLOCK": block} if block is not None else {}
                launch, elems = model_launch(kernel, bucket, over)
                warps = [w for w in space["num_warps"] if elems <= MAX_ELEMS_PER_LANE * 64 * w]
                cx = launch.constexprs
                res = prune(
                    launch.kernel,
                    launch.args,
                    ConfigSpace(**{k: [v] for k, v in cx.items()}, num_warps=warps),
                    target,
                    jobs=jobs,
                )
                for c in res.survivors:
                    w = c.config["num_warps"]
                    cands.append(
                        (static_score(c.report, w, elems), {**over, "num_warps": w}, c.report)
                    )
            if not cands:
                raise RuntimeError(f"no config of {kernel} {bucket} survives static pruning")
            _, best, rep = min(cands, key=lambda t: t[0])
            out[(kernel, *bucket)] = best
            if progress:
                progress(kernel, bucket, best, rep, len(cands))
    return out


def main():  # pragma: no cover - the offline derivation of SHIPPED
    def _show(kernel, bucket, best, rep, n):
        print(
            f"    ({kernel!r}, {', '.join(map(repr, bucket))}): {best!r},  # vgpr {rep['vgpr']}, "
            f"sgpr {rep['sgpr']}, occ {rep['occupancy']}, instr {rep['instruction_count']}; "
            f"{n} survivors",
            flush=True,
        )

    derive(progress=_show)


if __name__ == "__main__":  # pragma: no cover
    main()


# -- compiling the shipped configs (the compile-tier tests and the report use these) ------------------

#: kernels that run with a bucket's config besides the one it is chosen on
COMPANIONS = {
    "radix": (
        "radix_hist_split",
        "radix_count_split",
        "radix_compact_split",
        "radix_compact_split_atomic",
    ),
    "merge": ("sort_runs", "merge_pass_inner"),
}


def _companion_launch(name: str, bucket: tuple, config: dict):
    """The launch of a kernel that runs with a bucket's config besides its own (``COMPANIONS``):
    the split radix kernels on 4 rows of 262144 in 64 slices, the merge sort's other kernels."""
    from . import plan as P

    opts = {"num_warps": config["num_warps"]}
    i32, i64 = torch.int32, torch.int64
    if name.startswith("radix_"):
        (kb,) = bucket
        m, n, k, s = 4, 262144, 1024, 64
        span = n // s
        dt = _DT[kb]
        x, h = _spec(dt, (m, n)), _spec(i32, (m, kb // 8, 256))
        sel = dict(BLOCK=config["BLOCK"], LARGEST=True, KEY_BITS=kb, options=opts)
        if name == "radix_hist_split":
            return P.hist_split_launch(x, h, k, span, s, PASS=kb // 8 - 1, **sel)
        if name == "radix_count_split":
            return P.count_split_launch(x, h, _spec(i32, (m, s, 2)), k, span, s, **sel)
        det = name == "radix_compact_split"
        counts = _spec(i32, (m, s, 2) if det else (m, 2))
        out = (_spec(dt, (m, k)), _spec(i64, (m, k)), _spec(i32, (m, k)), _spec(i32, (m, k)))
        return P.compact_split_launch(
            x, *out, h, counts, k, span, s, SP=s, SORTED=True, DETERMINISTIC=det, **sel
        )
    (b,) = bucket
    if name == "sort_runs":
        w = _spec(i32, (_M, 65536))
        return P.sort_runs_launch(w, w, w, w, -(-65536 // b), B=b, options=opts)
    return _merge_launch(b, False, opts)


def shipped_compiles(target=None) -> list[tuple[str, str, tuple, dict]]:
    """Every (label, kernel, bucket, config) compile ``target``'s shipped table stands for."""
    out = []
    for kernel, buckets in BUCKETS.items():
        for bucket in buckets:
            cfg = shipped(kernel, bucket, target)
            out.append((kernel, kernel, bucket, cfg))
            out += [(c, kernel, bucket, cfg) for c in COMPANIONS.get(kernel, ())]
    return out


def compile_report(label: str, kernel: str, bucket: tuple, config: dict, target: str = "gfx950"):
    """Compile one shipped config for ``target``; its ResourceReport as a dict (picklable)."""
    launch = model_launch(kernel, bucket, config)[0] if label == kernel else None
    launch = launch or _companion_launch(label, bucket, config)
    return {"kernel": launch.name, **launch.compile(target).executable.report.to_dict()}
