"""The TopK static model: config spaces, the model's launches, the ranking that chose the tables.

No gfx950 was available to time on, so the gfx950 table (``configs.TABLES``) was picked per
bucket without timing (``derive``): every config of a kernel's space (``SPACES``) is compiled
for gfx950 at the bucket's worst case (``model_launch``) through
``flydsl_core.autotune.prune`` (configs holding more than ``MAX_ELEMS_PER_LANE`` tile elements
per lane are not tried), which rejects any that uses scratch or spills SGPRs/VGPRs or overflows
LDS; among survivors the model (``score``) prefers (1) the highest occupancy (waves per SIMD),
then (2) the fewest instructions issued per element, ``instruction_count * num_warps /
elements per program or loop iteration`` (a proxy for issue slots at full occupancy), then (3)
the fewest VGPRs. ``flydsl-kernels model topk`` re-derives and prints the table; the
compile tests compile every shipped entry (``shipped_compiles``, ``compile_report``).
"""

from __future__ import annotations

import torch

from flydsl_core import cdiv

from . import plan as P
from .configs import BUCKETS, SMALL_K_MAX, TARGET, entry

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


def space(kernel: str) -> dict:
    """The searched space of ``kernel``: ``{"num_warps": ..., ("BLOCK": ...)}``."""
    return SPACES[kernel]


# -- the model's launches --------------------------------------------------------------------------

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
        x, w, v, i = (
            _spec(f32, (_M, 32768)),
            _spec(i32, (_M, kp)),
            _spec(f32, (_M, kp)),
            _spec(i64, (_M, kp)),
        )
        return P.sort_tile_launch(x, w, _spec(i32, (_M, kp)), v, i, kp, KP=kp, options=opts), kp
    if kernel == "merge":
        (b,) = bucket
        return _merge_launch(b, True, opts), b
    if kernel == "router":
        (block,) = bucket
        ng = 8 if block >= 64 else 1
        rp = P.plan_router(
            block,
            8,
            scoring="sigmoid",
            renormalize=True,
            has_bias=True,
            n_group=ng,
            topk_group=4 if ng > 1 else 1,
            routed_scaling_factor=2.5,
        )
        args = (
            _spec(torch.bfloat16, (_M, block)),
            _spec(f32, (block,)),
            _spec(f32, (_M, 8)),
            _spec(i64, (_M, 8)),
        )
        return P.router_launch(*args, rp.constexprs, opts), block
    raise ValueError(f"unknown kernel {kernel!r}")


def _merge_launch(b: int, final: bool, opts: dict):
    """A merge pass over 65536 survivors (runs of 4B) of 262144-element rows."""
    k = 65536
    w = [_spec(torch.int32, (_M, k)) for _ in range(4)]
    v, i = _spec(torch.float32, (_M, k)), _spec(torch.int64, (_M, k))
    x = _spec(torch.float32, (_M, 262144))
    return P.merge_pass_launch(x, *w, v, i, k, 4 * b, cdiv(k, b), B=b, FINAL=final, options=opts)


# -- the ranking -----------------------------------------------------------------------------------


def figures(ck, kind=None, cfg=None, problem=None) -> dict:
    """The figures ``score`` reads, from a ``CompiledKernel``: its resource report, and with
    ``kind`` and ``problem`` (a bucket) the elements a program (or loop iteration) of
    ``model_launch(kind, problem)`` handles. ``cfg``: unused here (the one signature of every
    family's model)."""
    fig = ck.executable.report.to_dict()
    if kind is not None and problem is not None:
        fig["elements"] = model_launch(kind, problem, cfg)[1]
    return fig


def score(cfg: dict, fig: dict) -> tuple:
    """Larger is better: (occupancy, -instructions issued per element, -VGPRs); ``fig`` holds
    the report and ``elements`` (``figures``)."""
    per_elem = (
        (fig.get("instruction_count") or 1 << 30) * cfg["num_warps"] / max(1, fig["elements"])
    )
    return ((fig.get("occupancy") or 0), -round(per_elem, 4), -(fig.get("vgpr") or 1 << 30))


def rank(kernel: str, bucket: tuple, target: str = TARGET, candidates=None, *, jobs=None):
    """The candidates of ``kernel`` at ``bucket`` (default: its space, at most
    ``MAX_ELEMS_PER_LANE`` elements per lane) compiled and judged, best first:
    ``[(config dict, figures, None)]`` of the survivors (rejected ones are left out)."""
    from flydsl_core.autotune import ConfigSpace, prune

    sp = space(kernel)
    out = []
    for block in sp.get("BLOCK", (None,)):
        over = {"BLOCK": block} if block is not None else {}
        launch, elems = model_launch(kernel, bucket, over)
        warps = [w for w in sp["num_warps"] if elems <= MAX_ELEMS_PER_LANE * 64 * w]
        if candidates is not None:
            warps = [w for w in warps if {**over, "num_warps": w} in candidates]
        cx = launch.constexprs
        res = prune(
            launch.kernel,
            launch.args,
            ConfigSpace(**{k: [v] for k, v in cx.items()}, num_warps=warps),
            target,
            jobs=jobs,
        )
        for c in res.survivors:
            cfg = {**over, "num_warps": c.config["num_warps"]}
            out.append((cfg, {**c.report, "elements": elems}, None))
    # sorted() is stable: among equal scores the first compiled stays first
    return sorted(out, key=lambda r: score(r[0], r[1]), reverse=True)


def derive(
    *, jobs: int | None = None, kernels=None, progress=None, target: str = TARGET, buckets=None
) -> dict[tuple, dict]:
    """Re-run the static model for every bucket: ``{(kernel, *bucket): config}`` (no GPU needed)."""
    out: dict[tuple, dict] = {}
    for kernel in BUCKETS:
        if kernels is not None and kernel not in kernels:
            continue
        for bucket in BUCKETS[kernel] if buckets is None else buckets.get(kernel, ()):
            ranked = rank(kernel, bucket, target, jobs=jobs)
            if not ranked:
                raise RuntimeError(f"no config of {kernel} {bucket} survives static pruning")
            best, fig, _ = ranked[0]
            out[(kernel, *bucket)] = best
            if progress:
                progress(kernel, bucket, best, fig, len(ranked))
    return out


def main(argv=None):  # pragma: no cover - the offline derivation of configs.TABLES["gfx950"]
    import argparse

    argparse.ArgumentParser(
        prog="flydsl-kernels model topk",
        description="re-derive the gfx950 TopK table with the static model and print it",
    ).parse_args(argv)

    def _show(kernel, bucket, best, rep, n):
        print(
            f"    ({kernel!r}, {', '.join(map(repr, bucket))}): {best!r},  # vgpr {rep['vgpr']}, "
            f"sgpr {rep['sgpr']}, occ {rep['occupancy']}, instr {rep['instruction_count']}; "
            f"{n} survivors",
            flush=True,
        )

    derive(progress=_show)


# -- compiling the shipped configs (the compile-tier tests use these) ------------------------------

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
        return P.sort_runs_launch(w, w, w, w, cdiv(65536, b), B=b, options=opts)
    return _merge_launch(b, False, opts)


def shipped_compiles(target=None) -> list[tuple[str, str, tuple, dict]]:
    """Every (label, kernel, bucket, config) compile ``target``'s shipped table stands for."""
    out = []
    for kernel, buckets in BUCKETS.items():
        for bucket in buckets:
            cfg = entry(kernel, bucket, target)
            out.append((kernel, kernel, bucket, cfg))
            out += [(c, kernel, bucket, cfg) for c in COMPANIONS.get(kernel, ())]
    return out


def compile_report(label: str, kernel: str, bucket: tuple, config: dict, target: str = "gfx950"):
    """Compile one shipped config for ``target``; its ResourceReport as a dict (picklable)."""
    launch = model_launch(kernel, bucket, config)[0] if label == kernel else None
    launch = launch or _companion_launch(label, bucket, config)
    return {"kernel": launch.name, **launch.compile(target).executable.report.to_dict()}


if __name__ == "__main__":  # pragma: no cover
    main()
