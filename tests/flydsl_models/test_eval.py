"""flydsl-eval end to end on the CPU: every documented command, at its smallest sizes.

Each test runs one command of ``packages/flydsl-models/README.md`` (the list in
``tests/test_readme_commands.py`` names the test of every README command) with a
shipped config scaled down, seeded random weights, FlyDSL's CPU backend and the
smallest workload (batch 1 or 2, prompt 8, 2 to 3 greedy steps, one timed repeat),
once per module (``scope="module"`` fixtures); the tests around a run read its
``results.json``. Asserted: the correctness figures against their thresholds, that
FlyDSL kernels really ran (coverage above zero in each routed family, attention
included, and the stats' hit counts), the MX route checked against the same
quantization, the training curves and gradients, and the report files.
"""

from __future__ import annotations

import json

import pytest
import torch

from flydsl_models import eval as ev

pytestmark = pytest.mark.cpu

SMALL = ["--prompt-len", "8", "--gen-len", "3", "--repeats", "1", "--profile-steps", "1"]
#: the default model (llama-tiny: 8 / 2 heads) at 1 layer, hidden 128 (head dim 16)
DEFAULT = ["--layers", "1", "--hidden", "128", "--intermediate", "224", "--vocab", "512"]
QWEN_MOE = [
    "--model", "qwen3-30b-a3b", "--layers", "1", "--hidden", "64", "--moe-intermediate", "32",
    "--experts", "6", "--top-k", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
    "--vocab", "512",
]  # fmt: skip
GPT_OSS = [
    "--model", "gpt-oss-20b", "--layers", "2", "--hidden", "64", "--moe-intermediate", "64",
    "--experts", "4", "--top-k", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
    "--vocab", "512",
]  # fmt: skip
#: Qwen3 (dense): no shipped preset; a config.json, as the README's config command takes
QWEN3_CONFIG = {
    "model_type": "qwen3",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def _run(out, *args) -> tuple[int, dict]:
    rc = ev.main([*args, "--out", str(out)])
    return rc, json.loads((out / "results.json").read_text())


def _flydsl(cov, family) -> float:
    return cov["by_family"][family]["flydsl_us"]


def _check_correct(entry, *, reference="off"):
    c = entry["correctness"]
    assert c["reference"] == reference and c["ok"] and "verdict_basis" not in c, c
    assert c["top1_agreement"] >= c["top1_min"] == 0.99
    assert c["logits_max_rel_error"] <= c["tolerance_rel"] == 3e-2
    assert c["top1_flips"] == 0 and c["positions"] > 0


def _check_files(out, *pngs):
    md = (out / "report.md").read_text()
    for head in ("## Correctness", "## Speed (CPU figures)", "## Op coverage", "## Routes"):
        assert head in md
    import matplotlib.image

    for png in ("speedup.png", "coverage.png", *pngs):
        img = matplotlib.image.imread(out / png)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


# -- `uv run flydsl-eval` and `--arms off,eager,compile,train` (one run covers both) ---------------


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("default")
    args = [*DEFAULT, *SMALL, "--arms", "off,eager,compile,train", "--train-steps", "3",
            "--train-batch", "2", "--train-seq-len", "16"]  # fmt: skip
    rc, r = _run(out, *args)
    return out, rc, r


def test_readme_default_command(default_run):
    """The default model: eager (attention on attn_implementation="flydsl") and compile
    (GEMMs under backend="flydsl", attention on the SDPA override) against off."""
    out, rc, r = default_run
    assert rc == 0 and r["ok"], r
    assert r["model"]["name"] == "llama-tiny" and r["format"] == "flydsl_models.results/2"
    eager, comp, off = r["arms"]["eager"], r["arms"]["compile"], r["arms"]["off"]
    _check_correct(eager)
    _check_correct(comp)
    assert off["coverage"]["share"] == 0 and off["attention"] == "sdpa"
    # eager: norms and attention on FlyDSL, the linear layers on ATen (gemm not FlyDSL)
    assert eager["attention"] == "flydsl"
    assert eager["stats"]["hf.attention"]["hits"] == eager["stats"]["hf.attention"]["calls"] > 0
    cov = eager["coverage"]
    assert _flydsl(cov, "attention") > 0 and _flydsl(cov, "norm") > 0 and _flydsl(cov, "gemm") == 0
    assert (
        "flydsl::hf_rms_norm" in cov["flydsl_ops"] and "flydsl::hf_attention" in cov["flydsl_ops"]
    )
    # attention is set before patch, so patch reports what each arm runs
    assert eager["routes"]["counts"]["attention"] > 0
    assert comp["routes"]["counts"]["attention"] == 0 and comp["attention"] == "sdpa"
    # compile: the GEMMs are GEMM (not "other"), attention is the SDPA override's
    assert comp["stats"]["compile:mm"]["hits"] > 0 and comp["stats"]["flydsl::gemm"]["hits"] > 0
    sdpa = "_scaled_dot_product_flash_attention_for_cpu"
    assert comp["stats"][sdpa]["hits"] == comp["stats"][sdpa]["calls"] > 0
    cov = comp["coverage"]
    assert cov["module_context"] is False
    assert _flydsl(cov, "gemm") > 0 and _flydsl(cov, "attention") > 0
    assert _flydsl(cov, "other") < 0.05 * cov["total_us"]
    assert (
        eager["routes"]["counts"]["rms_norm"] == 3
        and eager["routes"]["counts"]["add_rms_norm"] == 1
    )
    _check_files(out, "loss.png")


def test_readme_train_command(default_run):
    """The train arm: off, eager and compile variants from the same weights; losses and the
    first step's gradients agree; the backward runs FlyDSL kernels (coverage, stats)."""
    out, _rc, r = default_run
    tr = r["train"]
    assert tr["ok"] and set(tr["variants"]) == {"off", "eager", "compile"}
    off = tr["variants"]["off"]["losses"]
    assert len(off) == 3 and off[-1] < off[0]  # it learns
    for v in ("eager", "compile"):
        e = tr["variants"][v]
        assert e["agreement"]["ok"] and e["agreement"]["max_rel_diff"] <= tr["tolerance_rel"]
        assert e["gradients"]["ok"] and not e["gradients"]["missing"], e["gradients"]
        assert e["tokens_per_s"] > 0
        bwd = e["coverage"]["by_phase"]["backward"]
        assert bwd["flydsl_us"] > 0 and bwd["by_family"]["attention"]["flydsl_us"] > 0, bwd
        assert e["stats"]["hf.attention"]["hits"] > 0
    eager = tr["variants"]["eager"]
    assert eager["stats"]["_fused_rms_norm_backward"]["hits"] > 0
    assert eager["coverage"]["by_phase"]["backward"]["by_family"]["norm"]["flydsl_us"] > 0
    comp = tr["variants"]["compile"]
    assert comp["stats"]["flydsl::gemm"]["hits"] > 0  # forward and backward graphs' GEMMs
    assert comp["coverage"]["by_phase"]["backward"]["by_family"]["gemm"]["flydsl_us"] > 0
    md = (out / "report.md").read_text()
    assert "## Training" in md and "![loss](loss.png)" in md


# -- the Qwen3-MoE and gpt-oss commands --------------------------------------------------------


def test_readme_qwen3_moe_command(tmp_path):
    rc, r = _run(tmp_path, *QWEN_MOE, *SMALL, "--batch", "2")
    assert rc == 0 and r["ok"], r
    eager, comp = r["arms"]["eager"], r["arms"]["compile"]
    for arm in (eager, comp):
        _check_correct(arm)
        for key in ("hf.rms_norm", "hf.moe_router", "hf.experts"):
            assert arm["stats"][key]["hits"] > 0, key
    assert eager["attention"] == "flydsl" and eager["stats"]["hf.attention"]["hits"] > 0
    assert _flydsl(eager["coverage"], "moe") > 0 and _flydsl(eager["coverage"], "attention") > 0
    assert _flydsl(comp["coverage"], "gemm") > 0 and _flydsl(comp["coverage"], "moe") > 0


def test_readme_gpt_oss_command(tmp_path):
    """MX experts: each MX arm is judged against itself with the MX op computed by the
    format's reference (the kernels' check: exact here), the format's own error is
    reported apart; sinks and a sliding layer on FlyDSL attention."""
    rc, r = _run(tmp_path, *GPT_OSS, *SMALL)
    assert rc == 0 and r["ok"], r
    assert r["model"]["mxfp4_experts"]
    for name in ("eager", "compile"):
        arm = r["arms"][name]
        _check_correct(arm, reference=f"{name}, MX op by the reference")
        assert arm["correctness"]["logits_max_abs_error"] < 1e-2
        assert arm["routes"]["counts"]["mx_experts"] == 2
        assert arm["stats"]["hf.mx_experts"]["hits"] > 0
        assert "correctness_vs_off" in arm  # reported
    eager = r["arms"]["eager"]
    assert eager["stats"]["hf.attention"]["hits"] > 0 and eager["attention"] == "flydsl"
    fmt = r["mx_reference"]["format_error"]
    assert fmt["reference"] == "off" and fmt["logits_max_abs_error"] > 0  # the format is lossy
    md = (tmp_path / "report.md").read_text()
    assert "The MX route: kernels and format apart" in md and "mx_reference:off (format)" in md


def test_gpt_oss_bf16_experts(tmp_path):
    """gpt-oss's eager attention takes its softmax in bf16: on a random model the off arm is
    about 40% (of the largest logit) from the model's fp32 math, FlyDSL's attention under 1%.
    So the eager arm fails against off and passes against the fp32 model, both reported."""
    rc, r = _run(tmp_path, *GPT_OSS, *SMALL, "--mx-experts", "off", "--arms", "off,eager")
    assert rc == 0 and r["ok"]
    eager = r["arms"]["eager"]
    c = eager["correctness"]
    assert c["ok"] and c["verdict_basis"].startswith("fp32 model")
    assert not c["logits_ok"] and c["vs_fp32"]["ok"] and c["vs_fp32"]["logits_max_rel_error"] < 0.01
    off = r["fp32_reference"]["off_vs_fp32"]
    assert off["logits_max_rel_error"] > c["vs_fp32"]["logits_max_rel_error"]
    assert "### Against the model's fp32 math" in (tmp_path / "report.md").read_text()
    for key in ("hf.rms_norm", "hf.add_rms_norm", "hf.moe_router", "hf.experts", "hf.attention"):
        assert eager["stats"][key]["hits"] > 0, key
    assert "mx_reference" not in r


# -- config.json, checkpoint, --device cuda ------------------------------------------------------


def test_readme_config_command(tmp_path):
    """``--model path/to/config.json``: Qwen3 (dense) from a config file, with FlyDSL attention
    in inference and in training (q_norm / k_norm on the RMSNorm route too)."""
    cfg = tmp_path / "qwen3.json"
    cfg.write_text(json.dumps(QWEN3_CONFIG))
    args = ["--model", str(cfg), *SMALL, "--arms", "off,eager,train", "--train-steps", "2",
            "--train-batch", "2", "--train-seq-len", "16"]  # fmt: skip
    rc, r = _run(tmp_path / "out", *args)
    assert rc == 0 and r["ok"], r
    assert r["model"]["source"] == "config" and r["model"]["summary"]["model_type"] == "qwen3"
    eager = r["arms"]["eager"]
    _check_correct(eager)
    assert (
        eager["stats"]["hf.attention"]["hits"] > 0 and _flydsl(eager["coverage"], "attention") > 0
    )
    assert eager["routes"]["counts"]["rms_norm"] == 9  # 2 x (input, post, q_norm, k_norm) + final
    tr = r["train"]["variants"]["eager"]
    assert tr["gradients"]["ok"] and tr["stats"]["hf.attention"]["hits"] > 0


def test_readme_checkpoint_command(tmp_path):
    from flydsl_models import models

    spec = models.resolve(None, {"layers": 1, "hidden": 128, "intermediate": 224, "vocab": 256})
    models.build(spec, torch.bfloat16, "cpu", seed=5).save_pretrained(tmp_path / "ckpt")
    rc, r = _run(tmp_path / "out", "--model", str(tmp_path / "ckpt"), *SMALL, "--arms", "off,eager")
    assert rc == 0 and r["ok"], r
    assert (
        r["model"]["source"] == "checkpoint"
        and "from the checkpoint" in (tmp_path / "out" / "report.md").read_text()
    )
    _check_correct(r["arms"]["eager"])


def test_readme_cuda_command(tmp_path, capsys):
    """``--device cuda``: where torch sees no GPU, one line and exit status 2 before any model
    is built; with a GPU, the same run at small sizes."""
    argv = ["--model", "llama-3.1-8b", "--device", "cuda", "--arms", "off,eager,compile"]
    if not torch.cuda.is_available():
        assert ev.main([*argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("flydsl-eval: error: --device cuda: no GPU") and err.count("\n") == 1
        return
    small = ["--layers", "2", "--hidden", "256", "--intermediate", "512", "--vocab", "1024"]
    rc, r = _run(tmp_path, *argv, *small, *SMALL)
    assert rc == 0 and r["ok"], r


# -- report details ------------------------------------------------------------------------------


def test_a_failed_arm_is_marked_failed(default_run, tmp_path):
    """A results.json whose eager arm raised and whose compile arm failed its checks renders
    with both marked (report and plots), and does not count as passing."""
    from flydsl_models import report

    _out, _, r = default_run
    r = json.loads(json.dumps(r))
    r["arms"]["eager"] = {"available": True, "description": "x", "error": "RuntimeError: boom"}
    r["arms"]["compile"]["correctness"]["ok"] = False
    r["train"]["variants"]["eager"]["agreement"]["ok"] = False
    assert (
        report.arm_state(r["arms"]["eager"]) == report.arm_state(r["arms"]["compile"]) == "failed"
    )
    md = report.markdown(r)
    assert "`eager`: **failed**: RuntimeError: boom" in md and "**FAIL**" in md
    paths = report.write_all(r, tmp_path)
    assert {p.name for p in paths.values()} >= {"speedup.png", "coverage.png", "loss.png"}


def test_progress_lines_in_a_log(default_run, tmp_path, capsys):
    """Output that is not a terminal gets one line per phase with its time."""
    rc = ev.main([*DEFAULT, *SMALL, "--arms", "off", "--out", str(tmp_path)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert rc == 0 and any("build llama-tiny: done in" in ln for ln in lines)
    assert any(ln.startswith("[") and "off: profile: done in" in ln for ln in lines)


def test_top1_counts_ties_at_the_dtype_resolution():
    """A flip between two tokens within one bf16 ulp of off's top logit is a tie (counted, and
    reported); a flip across a wider margin is a disagreement."""
    from flydsl_models import measure

    torch.manual_seed(0)
    bf16 = torch.bfloat16
    ref = torch.randn(1, 200, 64).to(bf16)
    top = ref.float().argmax(-1)
    got = ref.clone()
    ulp = torch.finfo(bf16).eps * 2.0 ** torch.floor(torch.log2(ref.float().amax(-1).abs()))
    # position 0: a token 1 ulp below the top becomes the arm's top (a tie)
    v = ref[0, 0].float()
    other = (int(top[0, 0]) + 1) % 64
    ref[0, 0, other] = (v.max() - ulp[0, 0]).to(bf16)
    got[0, 0] = ref[0, 0]
    got[0, 0, other] = ref[0, 0, top[0, 0]] + 1
    toks = torch.zeros(1, 2, dtype=torch.long)
    steps = torch.zeros(2, 1, 64)
    c = measure.compare((ref, toks, steps), (got, toks, steps), bf16)
    assert c["top1_ties"] == 1 and c["top1_agreement"] == 1.0 and c["top1_flips"] == 0
    # positions 1 to 3: the arm picks a token 4 ulp and more below off's top (disagreements)
    for p in (1, 2, 3):
        v = ref[0, p].float()
        low = int(v.argmin())
        got[0, p, low] = v.max() + 1
    c = measure.compare((ref, toks, steps), (got, toks, steps), bf16)
    assert c["top1_ties"] == 1 and c["top1_flips"] == 3
    assert c["top1_agreement"] == pytest.approx(197 / 200) and not c["top1_ok"]
