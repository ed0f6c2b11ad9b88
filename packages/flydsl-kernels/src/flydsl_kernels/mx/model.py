"""The MX static model: candidate tiles, the model's launches and the ranking that chose the tiles.

The grouped MX GEMM's defaults (``configs.TABLES[t]["grouped"]``) and the non-gfx950 dense
tiles come from a static model, untimed: every tile of ``space(kind, ...)`` is cross-compiled
for the target (no GPU needed) and ranked from its code object's resource report as the GEMM
family's model does (``gemm.model``: no spills / scratch, LDS within the target's limit, 2+
waves per SIMD; widest loads, then instructions of the inner K loop per MAC, then
occupancy). ``flydsl-kernels model mx [--target T]`` reprints the grouped ranking
(``--wgrad``: the ragged-K form; ``--dense``: the dense tiles per class). The ``compile_*``
helpers compile one kernel through ``plan.py`` with ``TensorSpec`` operands: what the model,
the report cases and the compile tests compile.
"""

from __future__ import annotations

from ..gemm import model as gemm_model
from ..gemm.kernels import RAGGED_K, RAGGED_M
from .configs import TARGET, DequantConfig, GemmConfig, QuantConfig, select
from .formats import elem_format
from .plan import plan_dequantize, plan_gemm, plan_grouped, plan_quantize

# -- the model's launches --------------------------------------------------------------------------

_EPB = {"e4m3": 1, "e5m2": 1, "e2m1": 2}
_FP8 = {"e4m3": "fp8e4m3", "e5m2": "fp8e5m2"}


def _elems(rows: tuple, k: int, fmt: str):
    """The ``TensorSpec`` of MX elements ``(*rows, K / epb)``: fp8 as itself, fp4 as bytes."""
    from flydsl_core import TensorSpec

    return TensorSpec(_FP8.get(fmt, "uint8"), (*rows, k // _EPB[fmt]))


def model_gemm(m, n, k, a_format, b_format, cfg: GemmConfig, out_dtype="bf16"):
    """The ``plan.plan_gemm`` launch with contiguous ``TensorSpec`` operands of these shapes, no
    bias: what the static model, the report and the compile tests compile."""
    from flydsl_core import TensorSpec

    sa, sb = TensorSpec("uint8", (m, k // 32)), TensorSpec("uint8", (n, k // 32))
    a, b, c = _elems((m,), k, a_format), _elems((n,), k, b_format), TensorSpec(out_dtype, (m, n))
    return plan_gemm(a, sa, b, sb, None, c, a_format, b_format, config=cfg)


def compile_gemm(m, n, k, a_format, b_format, cfg: GemmConfig | None = None, target=TARGET):
    cfg = cfg or select("gemm", m, n, k, a_format, b_format, target=target)
    return model_gemm(m, n, k, a_format, b_format, cfg).compile(target)


def compile_quant(m, k, elem, cfg: QuantConfig | None = None, in_dtype="bf16", target=TARGET):
    from flydsl_core import TensorSpec

    fmt = elem_format(elem)
    cfg = cfg or select("quant", m, k, target=target)
    x = TensorSpec(in_dtype, (m, k))
    q, s = TensorSpec("uint8", (m, k // fmt.per_byte)), TensorSpec("uint8", (m, k // 32))
    return plan_quantize(x, q, s, fmt, config=cfg).compile(target)


def compile_dequant(m, k, elem, cfg: DequantConfig | None = None, out_dtype="bf16", target=TARGET):
    from flydsl_core import TensorSpec

    fmt = elem_format(elem)
    cfg = cfg or select("dequant", m, k, target=target)
    q, s = TensorSpec("uint8", (m, k // fmt.per_byte)), TensorSpec("uint8", (m, k // 32))
    y = TensorSpec(out_dtype, (m, k))
    return plan_dequantize(q, s, y, fmt, config=cfg).compile(target)


def model_grouped(
    tokens,
    experts,
    n,
    k,
    a_format,
    b_format,
    cfg: GemmConfig,
    out_dtype="bf16",
    ragged_k=False,
    target=TARGET,
):
    """The ``plan.plan_grouped`` launch with ``TensorSpec`` operands, no bias: ragged M (2-D a
    ``(tokens, k)``, 3-D weights ``(experts, n, k)``), or with ``ragged_k`` the weight gradient
    (``a (tokens, k)``, ``b (n, k)``, ``experts`` K groups, out ``(experts, tokens, n)``)."""
    from flydsl_core import TensorSpec

    gb = 1 if ragged_k else experts
    a, sa = _elems((1, tokens), k, a_format), TensorSpec("uint8", (1, tokens, k // 32))
    b, sb = _elems((gb, n), k, b_format), TensorSpec("uint8", (gb, n, k // 32))
    out = TensorSpec(out_dtype, (experts if ragged_k else 1, tokens, n))
    offs = TensorSpec("int32", (experts,))
    return plan_grouped(
        a,
        sa,
        b,
        sb,
        out,
        offs,
        None,
        a_format,
        b_format,
        RAGGED_K if ragged_k else RAGGED_M,
        config=cfg,
        target=target,
    )


def compile_grouped(
    tokens,
    experts,
    n,
    k,
    a_format,
    b_format,
    cfg: GemmConfig | None = None,
    target=TARGET,
    ragged_k=False,
):
    cfg = cfg or select(
        "grouped", max(1, tokens // experts), n, k, a_format, b_format, target=target
    )
    launch = model_grouped(
        tokens, experts, n, k, a_format, b_format, cfg, ragged_k=ragged_k, target=target
    )
    return launch.compile(target)


# -- the candidate spaces --------------------------------------------------------------------------

#: the model's shape: Qwen3-30B-A3B's expert gate+up projection (N = 2 x 768, K = 2048, 128
#: experts), 4096 tokens x top-8 (gfx950.md); the tile, not the shape, decides the code
GROUPED_MODEL_SHAPE = (4096 * 8, 128, 1536, 2048)


#: the weight-gradient model shape: Qwen3-30B-A3B's gate_up dW, (M, experts, N, K) =
#: (hidden 2048, 128 experts, 1536, 32768 routed rows split into 128 K groups)
WGRAD_MODEL_SHAPE = (2048, 128, 1536, 4096 * 8)


#: the dense MX GEMM's model shapes per class: Llama-3.1-8B's decode projection and the large
#: 1024x8192x8192 case of the report
GEMM_MODEL_SHAPES = {"decode": (32, 4096, 4096), "large": (1024, 8192, 8192)}


#: the bounded candidates of the targets that only emulate MX (Triton upcasts the operands to
#: bf16 in registers, so tiles that fit gfx950's scaled MFMA spill there): smaller BN / BK
_EMULATED_TILES = (
    (16, 256, 128, 8),
    (16, 128, 128, 4),
    (64, 128, 128, 4),
    (64, 256, 64, 4),
    (64, 128, 64, 4),
    (128, 128, 128, 8),
    (128, 128, 64, 8),
    (128, 64, 128, 4),
    (64, 128, 128, 8),
    (256, 128, 64, 8),
)


def space(kind: str, cls: str | None = None, target: str = TARGET) -> list[GemmConfig]:
    """The candidate tiles of ``kind``: ``"grouped"``: on gfx950 BK 128 / 256 (one or two K
    steps of the scaled MFMA per 32x32x64 or 16x16x128 op), at least one 16x16 MFMA tile per
    wave, at most 64K fp32 accumulators; on the other targets a bounded list
    (``_EMULATED_TILES``). ``"gemm"``: bounded dense candidates of a class ``cls`` (decode: BM
    <= 32; large: BM >= 64)."""
    if kind == "grouped":
        return _grouped_space(target)
    if kind == "gemm":
        return _gemm_space(cls, target)
    raise ValueError(f"the MX model ranks the gemm and grouped tiles, not {kind!r}")


def _grouped_space(target: str = TARGET) -> list[GemmConfig]:
    """The grouped MX GEMM's candidate tiles: on gfx950 BK 128 / 256 (one or two K steps of
    the scaled MFMA per 32x32x64 or 16x16x128 op), at least one 16x16 MFMA tile per wave, at
    most 64K fp32 accumulators; on the other targets a bounded list (``_EMULATED_TILES``)."""
    if target != TARGET:
        st = 3 if target == "sm90" else 2
        return [
            GemmConfig(BM=m, BN=n, BK=k, STAGES=st, num_warps=w) for m, n, k, w in _EMULATED_TILES
        ]
    out = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (64, 128, 256):
            for bk in (128, 256):
                for w in (4, 8):
                    if bm * bn > 65536 or bm * bn < 256 * w:
                        continue
                    out.append(GemmConfig(BM=bm, BN=bn, BK=bk, STAGES=2, num_warps=w))
    return out


def _gemm_space(cls: str, target: str = TARGET) -> list[GemmConfig]:
    """Bounded dense MX GEMM candidates of a class (decode: BM <= 32; large: BM >= 64)."""
    st = 3 if target == "sm90" else 2
    if cls == "decode":
        tiles = (
            (32, 64, 256, 4),
            (32, 64, 128, 4),
            (32, 64, 64, 4),
            (32, 128, 128, 8),
            (16, 64, 128, 4),
            (32, 64, 128, 8),
        )
    else:
        tiles = (
            (64, 128, 256, 4),
            (64, 128, 128, 4),
            (64, 128, 64, 4),
            (128, 128, 64, 8),
            (64, 128, 128, 8),
            (128, 64, 128, 8),
        )
    return [GemmConfig(BM=m, BN=n, BK=k, STAGES=st, num_warps=w) for m, n, k, w in tiles]


# -- the ranking -----------------------------------------------------------------------------------

#: the figures and the score of the GEMM family's model (the MX tiles are ranked alike)
figures, score = gemm_model.figures, gemm_model.score


def rank(
    kind: str,
    cls: str | None = None,
    target=TARGET,
    candidates=None,
    *,
    fmt=("e4m3", "e4m3"),
    ragged_k=False,
):
    """The static model over ``space(kind, cls, target)`` (or ``candidates``), ranked as the
    GEMM family's (``gemm.model.rank``), untimed: ``"grouped"`` at ``GROUPED_MODEL_SHAPE``
    (``WGRAD_MODEL_SHAPE`` with ``ragged_k``), the K loop being the persistent kernel's inner
    loop; ``"gemm"`` at ``GEMM_MODEL_SHAPES[cls]``. ``fmt``: the element formats (mxfp8)."""
    if kind == "grouped":
        shape = WGRAD_MODEL_SHAPE if ragged_k else GROUPED_MODEL_SHAPE

        def compile_fn(cfg, target):
            return compile_grouped(*shape, *fmt, cfg=cfg, target=target, ragged_k=ragged_k)

    elif kind == "gemm":
        m, n, k = GEMM_MODEL_SHAPES[cls]

        def compile_fn(cfg, target):
            return compile_gemm(m, n, k, *fmt, cfg=cfg, target=target)

    else:
        raise ValueError(f"the MX model ranks the gemm and grouped tiles, not {kind!r}")
    cands = space(kind, cls, target) if candidates is None else candidates
    return gemm_model.rank(kind, target, cands, compile_fn=compile_fn)


def main(argv=None):  # pragma: no cover - a developer tool
    import argparse

    ap = argparse.ArgumentParser(
        prog="flydsl-kernels model mx",
        description="rank MX GEMM configs with the static model (grouped by default)",
    )
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--dense", action="store_true", help="rank the dense MX GEMMs instead")
    ap.add_argument("--wgrad", action="store_true", help="grouped: the ragged-K weight gradient")
    a = ap.parse_args(argv)
    tgt = a.target
    if a.dense:
        for cls in GEMM_MODEL_SHAPES:
            for fmt in (("e4m3", "e4m3"), ("e2m1", "e2m1")):
                for cfg, fig, why in rank("gemm", cls, tgt, fmt=fmt):
                    print(cls, fmt, cfg, fig if fig else why)
    else:
        ranked = rank("grouped", None, tgt, ragged_k=a.wgrad)
        for cfg, fig, why in ranked:
            print(cfg, fig if fig else why)
        print("per class:", gemm_model.best_per_class(ranked))


if __name__ == "__main__":  # pragma: no cover
    main()
