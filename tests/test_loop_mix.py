"""tools/loop_mix.py: the per-loop instruction mix it prints is the report's own loop figure
(the same loop finder), for a cross-compiled attention forward (gfx950, no GPU)."""

from __future__ import annotations

import pytest


@pytest.mark.compile
def test_loop_mix_matches_the_report(tool, tmp_path, capsys):
    from flydsl_kernels.report import select_cases

    loop_mix = tool("loop_mix")
    term = "window(127, 0) sinks gpt-oss"
    rc = loop_mix.main(
        [f"attn_fwd_kernel/B4 S4096x4096 H64/8 D64 causal {term}", "--asm", str(tmp_path)]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "always" in out and "v_mfma" in out
    (listing,) = tmp_path.glob("*.s")
    (case,) = [c for c in select_cases([term])[0] if c.kernel == "attn_fwd_kernel"]
    report = case.compile("gfx950").executable.report
    rows = loop_mix.loop_rows(listing.read_text(), "gfx950", 4)
    # the main figure (the loop with the fewest instructions per trip) and the worst one
    main = min(rows, key=lambda r: r[1])
    assert main[1] / main[3] == pytest.approx(report.loop_per_mfma[0])
    assert max(r[1] / r[3] for r in rows) == pytest.approx(report.loop_per_mfma[1])
    assert all(len(r[5].split(", ")) <= 4 for r in rows)


def test_loop_mix_rejects_an_unknown_case(tool, capsys):
    loop_mix = tool("loop_mix")
    assert loop_mix.main(["no-such-case-anywhere"]) == 2
    assert "no case matches" in capsys.readouterr().err
