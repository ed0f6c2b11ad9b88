#!/usr/bin/env bash
# One prepared GPU run of FlyDSL: env facts, pytest -m gpu, the kernel report with guard buffers
# and speedups, the benchmarks, launch overhead on the real driver, summary.md + plots.png.
#
#   tools/gpu_run.sh [OUTDIR] [--device cuda|cpu] [--budget SECONDS]
#
# OUTDIR defaults to $OUT. --device cpu is the dry run (same pipeline and files, small shapes).
# It keeps going past a failing part and prints the elapsed time of each (tools/gpu_run.py).
#
# On the lent H200 (docs/gpu-results.md): its image has python3 with torch 2.11 and Triton 3.6,
# rich, pytest, hypothesis and matplotlib, but no uv and no network, and this checkout's .venv
# (5 GB) cannot travel. So this script uses the repo's .venv only where it works, and otherwise
# the machine's python3 with the four workspace packages put on PYTHONPATH from packages/*/src
# (pure Python: nothing to build or download). The device tool's call, as one line:
#
#   run(command="bash tools/gpu_run.sh", timeout_s=560)
#
# after `git rev-parse HEAD > COMMIT` here (the copy that travels may have no .git; env.json
# reads COMMIT then),
# with no carry (nothing ignored is needed); the files come back from $OUT: summary.md,
# plots.png, report.json and gpu-run.tar.gz (everything else: logs, JSON, junit.xml, env.json).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${OUT:-}"
if [[ $# -gt 0 && "$1" != --* ]]; then OUTDIR="$1"; shift; fi
if [[ -z "$OUTDIR" ]]; then
  echo "usage: tools/gpu_run.sh OUTDIR [--device cuda|cpu] [--budget S] (or set \$OUT)" >&2
  exit 2
fi
PY=""
if [[ -x "$ROOT/.venv/bin/python" ]] && "$ROOT/.venv/bin/python" -c "import torch, flydsl_kernels" 2>/dev/null; then
  PY="$ROOT/.venv/bin/python"
else
  PY="$(command -v python3 || command -v python)"
  export PYTHONPATH="$ROOT/packages/flydsl-core/src:$ROOT/packages/flydsl-kernels/src:$ROOT/packages/torch-flydsl/src:$ROOT/packages/flydsl-models/src${PYTHONPATH:+:$PYTHONPATH}"
  # and their entry points (torch.compile's backend="flydsl", the settings, the exports), which
  # only an install declares: the second H200 run's compile tests found no "flydsl" backend
  META="$(mktemp -d)"
  if "$PY" "$ROOT/tools/dev_metadata.py" "$META" >/dev/null; then
    export PYTHONPATH="$PYTHONPATH:$META"
  else
    echo "tools/dev_metadata.py failed: no entry points (backend=\"flydsl\" will not be found)" >&2
  fi
fi
echo "python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1))"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
exec "$PY" "$ROOT/tools/gpu_run.py" --out "$OUTDIR" "$@"
