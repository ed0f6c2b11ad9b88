"""Every command the READMEs show runs in a test, so a documented command cannot silently break.

``documented()`` extracts the commands from ``README.md`` and ``packages/*/README.md``: the
lines of their shell blocks and the inline code that starts like a command (``uv run``,
``torchrun``, ``tools/...``). ``COMMANDS`` says, for each, which test runs it at its smallest
size: a test elsewhere in the suite (``"test"``: its node id, checked to exist), a run here
(``"run"``: the argv at the smallest sizes that take the same path), or why no test can
(``"setup"``: the commands that make the environment these tests run in). A README command
without an entry fails ``test_every_readme_command_has_a_test``; an entry no README shows any
more fails it too.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READMES = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]
_STARTS = ("uv run ", "uv sync", "torchrun ", "tools/", "python tools/", "pip install ")

EVAL = "tests/flydsl_models/test_eval.py::"
DRY_RUN = "tests/test_gpu_run.py::test_dry_run_writes_every_file"  # runs the benchmarks --quick
PY = sys.executable

#: documented command -> how a test runs it
COMMANDS: dict[str, tuple] = {
    # -- setting up: these make the environment the suite runs in
    "uv sync": ("setup", "the environment of this suite (.ci/run: uv sync --frozen)"),
    "pip install uv": ("setup", "installs the tool that runs this suite"),
    'uv run pytest -m "not gpu"': ("setup", "this suite"),
    "uv run pytest -m gpu": ("test", DRY_RUN),  # the dry run collects and runs tests/gpu
    # -- flydsl-eval (packages/flydsl-models/README.md, and the root README's main job)
    "uv run flydsl-eval": ("test", EVAL + "test_readme_default_command"),
    "uv run flydsl-eval --arms off,eager,compile,train": ("test", EVAL + "test_readme_train_command"),
    "uv run flydsl-eval --model qwen3-30b-a3b --layers 2 --hidden 256 --moe-intermediate 128 "
    "--experts 16 --top-k 4 --heads 4 --kv-heads 2 --head-dim 64 --vocab 4096": (
        "test",
        EVAL + "test_readme_qwen3_moe_command",
    ),
    "uv run flydsl-eval --model gpt-oss-20b --layers 2 --hidden 256 --moe-intermediate 256 "
    "--experts 8 --top-k 2 --heads 4 --kv-heads 2 --head-dim 64 --vocab 4096": (
        "test",
        EVAL + "test_readme_gpt_oss_command",
    ),
    "uv run flydsl-eval --model llama-3.1-8b --device cuda --arms off,eager,compile": (
        "test",
        EVAL + "test_readme_cuda_command",
    ),
    "uv run flydsl-eval --model path/to/config.json": ("test", EVAL + "test_readme_config_command"),
    "uv run flydsl-eval --model path/to/checkpoint_dir": (
        "test",
        EVAL + "test_readme_checkpoint_command",
    ),
    "torchrun --nproc-per-node 2 -m flydsl_models.eval --tp 2 --tp-reference ...": (
        "test",
        "tests/flydsl_models/test_tp.py::test_tp2_on_gloo_matches_one_process",
    ),
    "torchrun --nproc-per-node N -m flydsl_models.eval --tp N": (
        "test",
        "tests/flydsl_models/test_tp.py::test_tp2_on_gloo_matches_one_process",
    ),
    # -- flydsl (flydsl-core)
    "uv run flydsl check": ("test", "tests/flydsl_core/test_cli.py::test_check_passes_and_ir_prints"),
    "uv run flydsl check --target cpu-interpret": (
        "run",
        ["-m", "flydsl_core.cli", "check", "vector_add", "--target", "cpu-interpret", "--dtypes", "fp32"],
    ),
    "uv run flydsl inspect matmul --target gfx950 [--stage amdgcn]": (
        "test",
        "tests/flydsl_core/test_cli.py::test_inspect_reports_mfma_for_gfx950",
    ),
    "uv run flydsl ir matmul --locs": ("test", "tests/flydsl_core/test_cli.py::test_check_passes_and_ir_prints"),
    "uv run flydsl targets": ("test", "tests/flydsl_core/test_cli.py::test_targets_and_cache"),
    "uv run flydsl settings": ("run", ["-m", "flydsl_core.cli", "settings"]),
    "uv run flydsl export KERNEL_OR_FAMILY --target gfx950 --out DIR": (
        "test",
        "tests/flydsl_core/test_cli.py::test_export_writes_standalone_triton",
    ),
    "uv run flydsl cache info|clear": (
        "run",
        ["-m", "flydsl_core.cli", "cache", "info"],
        ["-m", "flydsl_core.cli", "cache", "clear"],
    ),
    # -- flydsl-kernels and torch-flydsl
    "uv run flydsl-kernels report": (
        "test",
        "tests/flydsl_kernels/test_report.py::test_one_topk_case_compiles_for_gfx950_and_json_matches",
    ),
    "uv run flydsl-kernels report topk": (
        "test",
        "tests/flydsl_kernels/test_report.py::test_one_topk_case_compiles_for_gfx950_and_json_matches",
    ),
    "uv run flydsl-kernels report --no-check --target sm90": (
        "run",
        ["-m", "flydsl_kernels.report", "topk_small/256x1024", "--no-check", "--target", "sm90"],
    ),
    "uv run torch_flydsl calibrate": (
        "test",
        "tests/torch_flydsl/test_dispatch.py::test_calibrate_refuses_without_gpu",
    ),
    # -- tools/
    "uv run python tools/bench_reference.py": ("run", ["tools/bench_reference.py", "--repeats", "1", "--skip-budget"]),
    "tools/bench_compile.py": ("run", ["tools/bench_compile.py", "--targets", "gfx950", "--examples", "vector_add"]),
    "tools/bench_launch.py": ("test", DRY_RUN),
    "tools/bench_host.py": ("test", "tests/test_bench_host.py::test_host_rows_and_the_ops_besides_our_kernels"),
    "tools/bench_attention.py": ("test", DRY_RUN),
    "tools/tune_attention.py": ("test", "tests/test_gpu_run.py::test_tune_part_and_its_summary"),
    "uv run python tools/loop_mix.py gpt-oss": (
        "test",
        "tests/test_loop_mix.py::test_loop_mix_matches_the_report",
    ),
    "uv run python tools/bench_ops.py": ("test", DRY_RUN),
    "tools/bench_dispatch.py": ("test", DRY_RUN),
    "tools/bench_gemm.py": ("test", DRY_RUN),
    "tools/bench_flex.py": (
        "run",
        ["tools/bench_flex.py", "--quick", "--reps", "1", "--device", "cpu", "--mode", "fwd"],
    ),
    "tools/bench_compile_gemm.py": ("run", ["tools/bench_compile_gemm.py", "--m", "16", "--reps", "1"]),
    "tools/gpu_run.sh OUTDIR": ("test", DRY_RUN),  # the same pipeline; on a GPU, the real run
    "tools/gpu_run.sh /tmp/dry --device cpu": ("test", DRY_RUN),
}  # fmt: skip


def _normalize(text: str) -> str:
    return " ".join(text.split())


def documented() -> dict[str, str]:
    """``{command: README}``: shell-block lines (backslash continuations joined, trailing
    comments dropped) and inline code that starts like a command."""
    out: dict[str, str] = {}
    for readme in READMES:
        text = readme.read_text()
        where = str(readme.relative_to(ROOT))
        for block in re.findall(r"```(?:bash|sh|console|shell)\n(.*?)```", text, re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith(_STARTS):
                    out.setdefault(_normalize(line), where)
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose):
            span = _normalize(span)
            if span.startswith(_STARTS) or re.match(r"tools/\w+\.(py|sh)\b", span):
                out.setdefault(span, where)
    return out


def test_every_readme_command_has_a_test():
    docs = documented()
    assert len(docs) >= 20, docs  # the extraction still finds the READMEs' commands
    missing = sorted(set(docs) - set(COMMANDS))
    assert not missing, f"README commands without a test (add them to COMMANDS): {missing}"
    stale = sorted(set(COMMANDS) - set(docs))
    assert not stale, f"COMMANDS entries no README shows any more: {stale}"


def _test_exists(node: str) -> bool:
    path, name = node.split("::")
    tree = ast.parse((ROOT / path).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


@pytest.mark.parametrize("command", sorted(c for c, v in COMMANDS.items() if v[0] == "test"))
def test_the_named_test_exists(command):
    node = COMMANDS[command][1]
    assert _test_exists(node), f"{command!r}: {node} does not exist"


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [PY, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )


@pytest.mark.compile
@pytest.mark.parametrize("command", sorted(c for c, v in COMMANDS.items() if v[0] == "run"))
def test_readme_command_runs(command):
    """The command at its smallest sizes, in a fresh process: exit status 0, no traceback."""
    for argv in COMMANDS[command][1:]:
        p = _run(argv)
        assert p.returncode == 0, (argv, p.stdout[-2000:], p.stderr[-3000:])
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
