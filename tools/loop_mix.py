"""Where a kernel's matrix-loop instructions go: the per-trip instruction mix of every innermost
matrix loop of the report's cases, cross-compiled for an AMD target (no GPU needed).

    uv run python tools/loop_mix.py attn_fwd_kernel/B4 [--target gfx950]
        [--top 12] [--asm DIR]

The ``SELECT`` terms are the report's (``flydsl-kernels report``): a case is chosen when its
``family/kernel/shape`` contains a term (``attn_fwd_kernel/B4``: the prefill forward cases;
``gpt-oss``: gpt-oss's forward and backward). Per loop: the instructions every trip runs
(``always``, the figure the report's ``loop / MFMA`` column divides), those a trip may skip
(``skippable``: the lazy rescale's block), the 32x32x16-equivalent MFMAs and the commonest
mnemonics, all from the core's loop finder (``flydsl_core.backends.triton.amdgcn``).
``--asm DIR`` also writes each case's listing there, to read the loops themselves.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flydsl_core.backends.triton import amdgcn
from flydsl_kernels.report import SelectionError, case_key, select_cases


def loop_rows(asm: str, target: str, top: int) -> list[tuple]:
    """``(header, always, skippable, mfma, per MFMA, mix)`` per innermost matrix loop."""
    rows = []
    for lp in amdgcn.matrix_loops(asm, None, target):
        mix = Counter(m for m, _ in lp.instructions).most_common(top)
        per = lp.per_matrix_op
        rows.append(
            (
                lp.header,
                lp.always,
                lp.conditional,
                lp.matrix,
                None if per is None else round(per, 2),
                ", ".join(f"{m} {n}" for m, n in mix),
            )
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("select", nargs="+", help="report case terms, e.g. attention/attn_fwd_kernel")
    ap.add_argument("--target", default="gfx950", help="an AMD target (default gfx950)")
    ap.add_argument("--top", type=int, default=12, help="mnemonics listed per loop")
    ap.add_argument("--asm", type=Path, default=None, help="write each case's listing here")
    a = ap.parse_args(argv)
    try:
        cases, _ = select_cases(a.select)
    except SelectionError as e:
        print(f"loop_mix: error: {e}", file=sys.stderr)
        return 2
    console = Console(width=None if sys.stdout.isatty() else 160)
    for case in cases:
        ck = case.compile(a.target)
        asm = ck.executable.stages().get("amdgcn")
        if asm is None:
            console.print(f"{case_key(case)}: no AMDGCN listing for {a.target}")
            continue
        if a.asm is not None:
            a.asm.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", case_key(case)) + ".s"
            (a.asm / name).write_text(asm)
        table = Table(title=f"{case_key(case)} ({a.target}, {case.config_for(a.target)})")
        for col in ("loop", "always", "skippable", "MFMA", "per MFMA", "commonest instructions"):
            table.add_column(col, overflow="fold")
        for row in loop_rows(asm, a.target, a.top):
            table.add_row(*(str(x) for x in row))
        console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
