"""The evaluation's outputs: ``results.json``, ``report.md``, two PNG plots and the console tables.

Everything is rendered from the results dict, so ``report.md`` and the plots
can be rebuilt from a ``results.json`` (``write_all``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .coverage import FAMILIES

FORMAT = "flydsl_models.results/1"


def _ties(c) -> str:
    n = c.get("top1_ties", 0)  # older results.json files have none
    return f"; {n} within 1 ulp counted" if n else ""


def _fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0:
            return "0"
        # nd significant digits; whole numbers past them (tokens/s) print in full, not as 1e+04
        if abs(x) >= 10**nd:
            return f"{x:.0f}"
        return f"{x:.{nd}g}"
    return str(x)


def _unit(results) -> str:
    return "CPU" if results["machine"]["device_kind"] == "CPU" else "GPU"


def speedups(results) -> dict:
    """``{arm: {"prefill": x, "decode": y}}`` against off (tokens/s ratios)."""
    off = results["arms"].get("off", {}).get("timing")
    out = {}
    for name, arm in results["arms"].items():
        t = arm.get("timing")
        if name == "off" or not t or not off:
            continue
        out[name] = {
            ph: (t[f"{ph}_tokens_per_s"] / off[f"{ph}_tokens_per_s"])
            if t.get(f"{ph}_tokens_per_s") and off.get(f"{ph}_tokens_per_s")
            else None
            for ph in ("prefill", "decode")
        }
    return out


# -- markdown -------------------------------------------------------------------------------------


def markdown(results) -> str:
    m, w, mach = results["model"], results["workload"], results["machine"]
    unit = _unit(results)
    lines = [
        f"# FlyDSL on vs off: {m['name']}",
        "",
        f"- model: `{m['name']}` ({m['source']}{', ' + m['path'] if m.get('path') else ''}), "
        f"{m['params'] / 1e6:.1f}M parameters, {m['dtype']}, weights "
        f"{'from the checkpoint' if m['source'] == 'checkpoint' else 'random (seed ' + str(w['seed']) + ')'}",
        f"- config: {', '.join(f'{k}={v}' for k, v in m['summary'].items())}",
    ]
    if m.get("overrides"):
        lines.append(
            f"- size overrides: {', '.join(f'{k}={v}' for k, v in m['overrides'].items())}"
        )
    lines += [
        f"- device: {mach['device']} ({unit}); FlyDSL target: {mach['flydsl_target']}; "
        f"torch {mach['torch']}, transformers {mach['transformers']}",
        f"- workload: batch {w['batch']}, prompt {w['prompt_len']} tokens, {w['gen_len']} greedy "
        f"decode steps, {w['repeats']} timed repeats (medians)",
    ]
    if results.get("tp", {}).get("size", 1) > 1:
        lines.append(
            f"- tensor parallel: {results['tp']['size']} processes ({results['tp']['backend']})"
        )
    if unit == "CPU":
        lines.append(
            "- **All speeds are CPU figures** (FlyDSL's CPU backend runs kernels program by program; "
            "they say nothing about GPU speed)."
        )
    lines += ["", "## Arms", ""]
    for name, arm in results["arms"].items():
        if not arm.get("available", True):
            lines.append(f"- `{name}`: **unavailable**: {arm.get('reason')}")
        elif "error" in arm:
            lines.append(f"- `{name}`: **failed**: {arm['error']}")
        else:
            lines.append(f"- `{name}`: {arm.get('description', '')}")
    lines += ["", "## Correctness (against off)", ""]
    lines.append(
        "| arm | logits max abs err | max rel err | tolerance (rel) | top-1 agreement | greedy decode | verdict |"
    )
    lines.append("|---|---|---|---|---|---|---|")
    for name, arm in results["arms"].items():
        c = arm.get("correctness")
        if not c:
            continue
        d = c["decode"]
        dec = (
            f"identical ({c['decode_tokens']} tokens)"
            if d["identical"]
            else f"diverges at step {d['first_divergence_step']} (row {d['batch_row']}): off margin "
            f"{_fmt(d['off_margin'])}, arm margin {_fmt(d['arm_margin'])}"
        )
        lines.append(
            f"| {name} | {_fmt(c['logits_max_abs_error'])} | {_fmt(c['logits_max_rel_error'])} | "
            f"{_fmt(c['tolerance_rel'])} ({c['tolerance_basis']}) | {c['top1_agreement'] * 100:.2f}% "
            f"(min {c['top1_min'] * 100:.0f}%{_ties(c)}) | {dec} | "
            f"{'pass' if c['ok'] else '**FAIL**'} |"
        )
    lines += ["", f"## Speed ({unit} figures)", ""]
    lines.append(
        "| arm | prefill tok/s | decode tok/s | prefill speedup | decode speedup | warm-up / compile s |"
    )
    lines.append("|---|---|---|---|---|---|")
    sp = speedups(results)
    for name, arm in results["arms"].items():
        t = arm.get("timing")
        if not t:
            continue
        s = sp.get(name, {})
        lines.append(
            f"| {name} | {_fmt(t['prefill_tokens_per_s'], 4)} | {_fmt(t['decode_tokens_per_s'], 4)} | "
            f"{_fmt(s.get('prefill'))}{'x' if s.get('prefill') else ''} | "
            f"{_fmt(s.get('decode'))}{'x' if s.get('decode') else ''} | {_fmt(arm.get('warmup_s'))} |"
        )
    lines += ["", f"## Op coverage (torch.profiler, {unit} time)", ""]
    lines.append(
        "| arm | FlyDSL share | " + " | ".join(f"{f} (FlyDSL / all)" for f in FAMILIES) + " |"
    )
    lines.append("|---|---|" + "---|" * len(FAMILIES))
    for name, arm in results["arms"].items():
        cov = arm.get("coverage")
        if not cov:
            continue
        tot = cov["total_us"] or 1.0
        cells = [
            f"{cov['by_family'][f]['flydsl_us'] / tot * 100:.1f}% / {cov['by_family'][f]['total_us'] / tot * 100:.1f}%"
            for f in FAMILIES
        ]
        lines.append(f"| {name} | {cov['share'] * 100:.1f}% | " + " | ".join(cells) + " |")
    for name, arm in results["arms"].items():
        cov = arm.get("coverage")
        if not cov or name == "off":
            continue
        lines += ["", f"Biggest ops not in FlyDSL ({name}):", ""]
        lines += [
            f"- `{o['op']}` ({o['family']}): {o['share'] * 100:.1f}%" for o in cov["top_unrouted"]
        ]
        if not cov["module_context"]:
            lines.append("- (families from op names only: no module ranges under torch.compile)")
    lines += ["", "## Routes", ""]
    for name, arm in results["arms"].items():
        r = arm.get("routes")
        if not r:
            continue
        counts = ", ".join(f"{k} {v}" for k, v in r["counts"].items() if v) or "nothing"
        lines.append(f"- `{name}` replaced: {counts}")
        seen = set()
        for n in r["not_routed"]:
            key = (n["what"], n["cls"], n["reason"])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"  - not routed: {n['what']} `{n['cls']}` ({n['module']}): {n['reason']}")
        st = arm.get("stats") or {}
        hits = ", ".join(
            f"{k}: {v['hits']}/{v['calls']}"
            + (f" (fallbacks {v['fallbacks']})" if v["fallbacks"] else "")
            for k, v in st.items()
            if v["calls"]
        )
        if hits:
            lines.append(f"  - FlyDSL hits / calls during the arm: {hits}")
        break  # the arms share one patch
    tp = results.get("tp") or {}
    if tp.get("reference"):
        lines += ["", "## Tensor parallel vs single process", ""]
        for name, c in tp["reference"].items():
            lines.append(
                f"- `{name}`: logits max abs err {_fmt(c['logits_max_abs_error'])} (rel "
                f"{_fmt(c['logits_max_rel_error'])}, tolerance {_fmt(c['tolerance_rel'])}), top-1 "
                f"{c['top1_agreement'] * 100:.2f}%: {'pass' if c['ok'] else '**FAIL**'}"
            )
    lines += ["", "## Plots", "", "![speedup](speedup.png)", "", "![coverage](coverage.png)", ""]
    lines.append(f"Total time {results.get('elapsed_s', 0):.1f} s.")
    return "\n".join(lines) + "\n"


# -- plots ----------------------------------------------------------------------------------------


_COLORS = {
    "gemm": "#4C72B0",
    "attention": "#DD8452",
    "norm": "#55A868",
    "moe": "#C44E52",
    "other": "#8C8C8C",
}


def plot_speedup(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp = speedups(results)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    phases = ("prefill", "decode")
    arms = [a for a in sp if any(sp[a].get(p) for p in phases)]
    width = 0.8 / max(1, len(arms))
    for i, a in enumerate(arms):
        xs = [j + i * width for j in range(len(phases))]
        ys = [sp[a].get(p) or 0.0 for p in phases]
        bars = ax.bar(xs, ys, width, label=a)
        for b, y in zip(bars, ys):
            ax.annotate(
                f"{y:.2f}x",
                (b.get_x() + b.get_width() / 2, y),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(phases))])
    ax.set_xticklabels(phases)
    ax.set_ylabel("speedup vs off (tokens/s)")
    ax.set_title(f"{results['model']['name']}: speedup per phase ({_unit(results)} figures)")
    if arms:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no arm besides off ran", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_coverage(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [(n, a["coverage"]) for n, a in results["arms"].items() if a.get("coverage")]
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.6 * max(1, len(arms))))
    for y, (_name, cov) in enumerate(arms):
        left = 0.0
        tot = cov["total_us"] or 1.0
        for f in FAMILIES:
            fly = cov["by_family"][f]["flydsl_us"] / tot * 100
            rest = cov["by_family"][f]["total_us"] / tot * 100 - fly
            ax.barh(y, fly, left=left, color=_COLORS[f], label=f"{f} (FlyDSL)" if y == 0 else None)
            left += fly
            ax.barh(
                y,
                rest,
                left=left,
                color=_COLORS[f],
                alpha=0.35,
                hatch="//",
                label=f"{f} (not FlyDSL)" if y == 0 else None,
            )
            left += rest
    ax.set_yticks(range(len(arms)))
    ax.set_yticklabels([n for n, _ in arms])
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"share of profiled {_unit(results)} time (%)")
    ax.set_title(f"{results['model']['name']}: op coverage by family (solid = FlyDSL kernels)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_all(results, out: Path) -> dict[str, Path]:
    """``results.json``, ``report.md``, ``speedup.png``, ``coverage.png`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "results": out / "results.json",
        "report": out / "report.md",
        "speedup": out / "speedup.png",
        "coverage": out / "coverage.png",
    }
    paths["results"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    paths["report"].write_text(markdown(results))
    plot_speedup(results, paths["speedup"])
    plot_coverage(results, paths["coverage"])
    return paths


# -- console --------------------------------------------------------------------------------------


def print_console(results, console, paths=None) -> None:
    from rich.markdown import Markdown

    console.print(Markdown(markdown(results).split("## Plots")[0]))
    if paths:
        console.print("written: " + ", ".join(str(p) for p in paths.values()))
