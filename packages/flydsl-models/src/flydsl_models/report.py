"""The evaluation's outputs: ``results.json``, ``report.md``, PNG plots and the console tables.

Everything is rendered from the results dict, so ``report.md`` and the plots
can be rebuilt from a ``results.json`` (``write_all``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .coverage import FAMILIES

FORMAT = "flydsl_models.results/2"


def _fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if x == float("inf"):
            return "inf"
        # nd significant digits; whole numbers past them (tokens/s) print in full, not as 1e+04
        if abs(x) >= 10**nd:
            return f"{x:.0f}"
        return f"{x:.{nd}g}"
    return str(x)


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _unit(results) -> str:
    return "CPU" if results["machine"]["device_kind"] == "CPU" else "GPU"


def arm_state(arm: dict) -> str:
    """``ran``, ``failed`` (raised, or failed its checks) or ``unavailable``."""
    if not arm.get("available", True):
        return "unavailable"
    if "error" in arm or not arm.get("correctness", {}).get("ok", True):
        return "failed"
    return "ran"


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


def _correctness_row(name, c) -> str:
    d = c["decode"]
    dec = (
        f"identical ({c['decode_tokens']} tokens)"
        if d["identical"]
        else f"diverges at step {d['first_divergence_step']} (row {d['batch_row']}): reference margin "
        f"{_fmt(d['off_margin'])}, arm margin {_fmt(d['arm_margin'])}"
    )
    return (
        f"| {name} | {c.get('reference', 'off')} | {_fmt(c['logits_max_abs_error'])} | "
        f"{_fmt(c['logits_max_rel_error'])} (max {_fmt(c['tolerance_rel'])}, {c['tolerance_basis']}) | "
        f"{c['top1_agreement'] * 100:.2f}% (min {c['top1_min'] * 100:.0f}%) | "
        f"{c.get('top1_ties', 0)} / {c.get('top1_flips', '-')} of {c.get('positions', '-')} | {dec} | "
        f"{_verdict(c)} |"
    )


def _verdict(c) -> str:
    if not c["ok"]:
        return "**FAIL**"
    return "pass (against the fp32 model: see below)" if c.get("verdict_basis") else "pass"


_CORRECTNESS_HEAD = [
    "| arm | against | logits max abs diff | max rel diff (threshold) | top-1 agreement (threshold) "
    "| ties / flips of positions | greedy decode | verdict |",
    "|---|---|---|---|---|---|---|---|",
]


def _header(results) -> list[str]:
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
    return lines


def markdown(results) -> str:
    unit = _unit(results)
    lines = _header(results)
    lines += ["", "## Arms", ""]
    for name, arm in results["arms"].items():
        state = arm_state(arm)
        if state == "unavailable":
            lines.append(f"- `{name}`: **unavailable**: {arm.get('reason')}")
        elif "error" in arm:
            lines.append(f"- `{name}`: **failed**: {arm['error']}")
        else:
            attn = f" (attention: `{arm['attention']}`)" if arm.get("attention") else ""
            lines.append(f"- `{name}`: {arm.get('description', '')}{attn}")
    lines += ["", "## Correctness", ""]
    lines.append(
        "Each arm against its reference: logits of every prompt position (max abs and relative "
        "difference, relative to the reference's largest |logit|), top-1 agreement (a flip within "
        "one ulp of the reference's top logit is a tie: counted as agreeing, and shown), greedy "
        "decoding. Thresholds in brackets."
    )
    lines += ["", *_CORRECTNESS_HEAD]
    for name, arm in results["arms"].items():
        if arm.get("correctness"):
            lines.append(_correctness_row(name, arm["correctness"]))
    f32 = results.get("fp32_reference") or {}
    if f32.get("off_vs_fp32"):
        lines += [
            "",
            "### Against the model's fp32 math",
            "",
            "The off model upcast to fp32 (the same weights). An arm outside the thresholds "
            "against off passes when it is within them against this, i.e. when the off arm's "
            "own low-precision numerics are what differs (gpt-oss's eager attention, for one, "
            "takes its softmax in bf16):",
            "",
            *_CORRECTNESS_HEAD,
            _correctness_row("off", f32["off_vs_fp32"]).replace("**FAIL**", "outside (reported)"),
        ]
        for name, arm in results["arms"].items():
            if (arm.get("correctness") or {}).get("vs_fp32"):
                lines.append(_correctness_row(name, arm["correctness"]["vs_fp32"]))
    elif f32.get("skipped"):
        lines += ["", f"No fp32 reference: {f32['skipped']}."]
    mxr = results.get("mx_reference")
    if mxr:
        reported = "outside the thresholds (reported, not judged)"
        lines += [
            "",
            "### The MX route: kernels and format apart",
            "",
            "An arm that runs the MX experts route is judged against itself run again with its MX "
            "op (`flydsl::hf_mx_grouped_mm`) computed by `flydsl_kernels.mx.reference`, the "
            "format's float64 specification: the same forwards or compiled graph, the same "
            "quantization of the same inputs, so its row above tests the kernels. Reported, not "
            "judged: the arm against `off`, and the format's own error (`mx_reference:off`: the off "
            f"arm with {mxr['description']}, against `off`): e4m3 activations keep 3 mantissa "
            "bits, and a random model's flat logits flip near-tie tokens and expert choices.",
            "",
            *_CORRECTNESS_HEAD,
        ]
        for name, arm in results["arms"].items():
            if arm.get("correctness_vs_off"):
                lines.append(
                    _correctness_row(name, arm["correctness_vs_off"]).replace("**FAIL**", reported)
                )
        lines.append(
            _correctness_row("mx_reference:off (format)", mxr["format_error"]).replace(
                "**FAIL**", reported
            )
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
    lines += _coverage_table(
        [(n, a.get("coverage")) for n, a in results["arms"].items() if a.get("coverage")]
    )
    for name, arm in results["arms"].items():
        cov = arm.get("coverage")
        if not cov or name == "off":
            continue
        lines += ["", f"Biggest ops not in FlyDSL ({name}):", ""]
        lines += [
            f"- `{o['op']}` ({o['family']}): {o['share'] * 100:.1f}%" for o in cov["top_unrouted"]
        ]
        if not cov["module_context"]:
            lines.append(
                "- (families from op names only: no module ranges under torch.compile, so the "
                "experts' grouped GEMMs count as GEMM here)"
            )
    lines += _routes(results)
    lines += _train_md(results)
    tp = results.get("tp") or {}
    if tp.get("reference"):
        lines += ["", "## Tensor parallel vs single process", "", *_CORRECTNESS_HEAD]
        for name, c in tp["reference"].items():
            lines.append(_correctness_row(name, c))
    lines += ["", "## Plots", "", "![speedup](speedup.png)", "", "![coverage](coverage.png)", ""]
    if results.get("train"):
        lines += ["![loss](loss.png)", ""]
    lines.append(f"Total time {results.get('elapsed_s', 0):.1f} s.")
    return "\n".join(lines) + "\n"


def _coverage_table(rows) -> list[str]:
    lines = [
        "| arm | FlyDSL share | " + " | ".join(f"{f} (FlyDSL / all)" for f in FAMILIES) + " |",
        "|---|---|" + "---|" * len(FAMILIES),
    ]
    for name, cov in rows:
        tot = cov["total_us"] or 1.0
        cells = [
            f"{cov['by_family'][f]['flydsl_us'] / tot * 100:.1f}% / {cov['by_family'][f]['total_us'] / tot * 100:.1f}%"
            for f in FAMILIES
        ]
        lines.append(f"| {name} | {cov['share'] * 100:.1f}% | " + " | ".join(cells) + " |")
    return lines


def _routes(results) -> list[str]:
    lines = ["", "## Routes", ""]
    for name, arm in results["arms"].items():
        r = arm.get("routes")
        if not r:
            continue
        counts = ", ".join(f"{k} {v}" for k, v in r["counts"].items() if v) or "nothing"
        lines.append(f"- `{name}` patch replaced: {counts}")
        if arm.get("attention"):
            lines.append(f"  - attention: attn_implementation `{arm['attention']}`")
        seen = set()
        for n in r["not_routed"]:
            if n["what"] == "attention":
                continue  # the arm's attention line above says what runs
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
    return lines


def _train_md(results) -> list[str]:
    tr = results.get("train")
    if not tr:
        return []
    unit = _unit(results)
    lines = [
        "",
        "## Training",
        "",
        f"- {tr['steps']} steps of {tr['optimizer']}, batch {tr['batch']} x {tr['seq_len']} tokens "
        f"of a synthetic corpus ({tr['corpus']}); every variant starts from the same seeded weights",
        '- agreement (packages/flydsl-models/README.md, "Training tolerance"): the largest '
        f"relative loss difference against off over the steps, at most {_fmt(tr['tolerance_rel'])}; "
        "the first step's gradients (the same weights in every variant; estimated from 16 random "
        "projections), as a whole and per parameter",
    ]
    for v, why in (tr.get("unavailable") or {}).items():
        lines.append(f"- `{v}`: **unavailable**: {why}")
    lines += [
        "",
        "| variant | first loss | last loss | loss: max rel diff vs off (threshold) | step-1 "
        "gradients: rel diff (threshold) | worst parameter (threshold) | "
        f"tokens/s ({unit}) | step 1 s (warm-up) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, e in tr["variants"].items():
        if "error" in e:
            lines.append(f"| {v} | - | - | - | - | - | - | - | **failed**: {e['error']} |")
            continue
        a, g = e.get("agreement"), e.get("gradients")
        diff = (
            f"{_fmt(a['max_rel_diff'])} at step {a['step_of_max']} (max {_fmt(a['tolerance_rel'])})"
            if a
            else "-"
        )
        grad = f"{_fmt(g['rel_diff'])} (max {_fmt(g['tolerance_rel'])})" if g else "-"
        worst = (
            f"{_fmt(g['max_param_rel_diff'])} `{g['parameter']}` (max {_fmt(g['param_tolerance_rel'])})"
            if g
            else "-"
        )
        ok = a is None or (a["ok"] and (g or {}).get("ok", True))
        verdict = "reference" if a is None else ("pass" if ok else "**FAIL**")
        lines.append(
            f"| {v} | {_fmt(e['losses'][0], 5)} | {_fmt(e['losses'][-1], 5)} | {diff} | {grad} | "
            f"{worst} | {_fmt(e['tokens_per_s'], 4)} | {_fmt(e['warmup_s'])} | {verdict} |"
        )
    lines += [
        "",
        "Loss per step:",
        "",
        "| step | " + " | ".join(v for v, e in tr["variants"].items() if "losses" in e) + " |",
    ]
    curves = [e["losses"] for e in tr["variants"].values() if "losses" in e]
    lines.append("|---|" + "---|" * len(curves))
    for i in range(tr["steps"]):
        lines.append(f"| {i + 1} | " + " | ".join(f"{c[i]:.5f}" for c in curves) + " |")
    lines += [
        "",
        f"Coverage of one more step, by phase ({unit} time; FlyDSL / all of the step):",
        "",
    ]
    lines.append(
        "| variant | phase | FlyDSL share of the phase | "
        + " | ".join(f"{f} (FlyDSL / all)" for f in FAMILIES)
        + " |"
    )
    lines.append("|---|---|---|" + "---|" * len(FAMILIES))
    for v, e in tr["variants"].items():
        cov = e.get("coverage")
        if not cov:
            continue
        for ph, p in cov["by_phase"].items():
            tot = p["total_us"] or 1.0
            cells = [
                f"{p['by_family'][f]['flydsl_us'] / tot * 100:.1f}% / {p['by_family'][f]['total_us'] / tot * 100:.1f}%"
                for f in FAMILIES
            ]
            lines.append(
                f"| {v} | {ph} | {_pct(p['flydsl_us'] / tot)} | " + " | ".join(cells) + " |"
            )
    for v, e in tr["variants"].items():
        if e.get("routes"):
            lines.append("")
            lines.append(f"Routes of `{v}`: " + "; ".join(e["routes"]))
        st = e.get("stats") or {}
        hits = ", ".join(
            f"{k}: {s['hits']}/{s['calls']}"
            + (f" (fallbacks {s['fallbacks']})" if s["fallbacks"] else "")
            for k, s in st.items()
        )
        if hits:
            lines.append(f"FlyDSL hits / calls over the steps (`{v}`): {hits}")
    return lines


# -- plots ----------------------------------------------------------------------------------------


_COLORS = {
    "gemm": "#4C72B0",
    "attention": "#DD8452",
    "norm": "#55A868",
    "moe": "#C44E52",
    "other": "#8C8C8C",
}
_ARM_COLORS = {"eager": "#4C72B0", "compile": "#DD8452", "off": "#555555"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(results, path: Path) -> None:
    plt = _plt()
    sp = speedups(results)
    phases = ("prefill", "decode")
    arms = [n for n in results["arms"] if n not in ("off", "train")]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.8 / max(1, len(arms))
    top = max([1.0] + [y for a in sp.values() for y in a.values() if y])
    for i, a in enumerate(arms):
        xs = [j + i * width for j in range(len(phases))]
        state = arm_state(results["arms"][a])
        if a not in sp or state == "unavailable" or "error" in results["arms"][a]:
            for x in xs:
                ax.bar(x, top * 0.15, width, color="none", edgecolor="#C44E52", hatch="xx")
                ax.text(x, top * 0.17, f"{state.upper()}: no figure", ha="center", va="bottom", fontsize=7,
                        color="#C44E52", rotation=90)  # fmt: skip
            ax.bar(0, 0, 0, color="none", edgecolor="#C44E52", hatch="xx", label=f"{a} ({state})")
            continue
        ys = [sp[a].get(p) or 0.0 for p in phases]
        label = a if state == "ran" else f"{a} (FAILED its checks)"
        bars = ax.bar(xs, ys, width, label=label, color=_ARM_COLORS.get(a),
                      hatch="xx" if state == "failed" else None)  # fmt: skip
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.2f}x", (b.get_x() + b.get_width() / 2, y), ha="center",
                        va="bottom", fontsize=8)  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.text(len(phases) - 0.5, 1.0, "  off = 1", va="bottom", fontsize=7)
    ax.set_xticks([j + width * (len(arms) - 1) / 2 for j in range(len(phases))])
    ax.set_xticklabels(phases)
    ax.set_ylabel("speedup over off (x)")
    ax.set_title(
        f"{results['model']['name']}: tokens/s of each arm / tokens/s of off\n"
        f"({_unit(results)} figures; above 1 = faster than off)",
        fontsize=10,
    )
    if arms:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no arm besides off ran", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_coverage(results, path: Path) -> None:
    plt = _plt()
    rows = []
    for n, a in results["arms"].items():
        if n == "train":
            continue
        state = arm_state(a)
        rows.append((n if state == "ran" else f"{n} ({state.upper()})", a.get("coverage"), state))
    tr = results.get("train") or {}
    for v, e in tr.get("variants", {}).items():
        bwd = (e.get("coverage") or {}).get("by_phase", {}).get("backward")
        good = e.get("agreement", {}).get("ok", True) and e.get("gradients", {}).get("ok", True)
        state = "failed" if "error" in e or not good else "ran"
        label = f"train {v}: backward" + ("" if state == "ran" else " (FAILED)")
        rows.append((label, bwd, state))
    fig, ax = plt.subplots(figsize=(9, 1.8 + 0.55 * max(1, len(rows))))
    for y, (_name, cov, state) in enumerate(rows):
        if not cov:
            ax.barh(y, 100, color="none", edgecolor="#C44E52", hatch="xx")
            ax.text(50, y, "no profile (" + state + ")", ha="center", va="center", fontsize=8)
            continue
        left = 0.0
        tot = cov["total_us"] or 1.0
        fams = cov.get("by_family") or {}
        for f in FAMILIES:
            fly = fams[f]["flydsl_us"] / tot * 100
            rest = fams[f]["total_us"] / tot * 100 - fly
            ax.barh(y, fly, left=left, color=_COLORS[f], label=f"{f}: FlyDSL" if y == 0 else None)
            left += fly
            ax.barh(y, rest, left=left, color=_COLORS[f], alpha=0.3, hatch="//",
                    label=f"{f}: not FlyDSL" if y == 0 else None)  # fmt: skip
            left += rest
        ax.text(101, y, f"{cov['flydsl_us'] / tot * 100:.0f}% FlyDSL", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([n for n, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(f"share of the arm's profiled {_unit(results)} time (%)")
    ax.set_title(
        f"{results['model']['name']}: where the time goes, by op family\n"
        "(solid: FlyDSL kernels; hatched: ATen and other code)",
        fontsize=10,
    )
    fig.tight_layout()
    handles, labels = ax.get_legend_handles_labels()
    # below the axes and their label, whatever the number of rows (bbox_inches keeps it)
    fig.legend(handles, labels, fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 0.0))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_loss(results, path: Path) -> None:
    plt = _plt()
    tr = results["train"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    off = tr["variants"]["off"].get("losses")
    for v, e in tr["variants"].items():
        if "losses" not in e:
            ax.plot([], [], label=f"{v} (FAILED: raised)", color="#C44E52")
            continue
        a, g = e.get("agreement"), e.get("gradients")
        bad = a is not None and not (a["ok"] and (g or {}).get("ok", True))
        steps = range(1, len(e["losses"]) + 1)
        style = "--" if v != "off" else "-"
        ax.plot(steps, e["losses"], style, marker="o", markersize=3, color=_ARM_COLORS.get(v),
                label=v + (" (FAILED)" if bad else ""))  # fmt: skip
        if v != "off" and off:
            rel = [abs(b - x) / max(abs(x), 1e-12) for x, b in zip(off, e["losses"])]
            ax2.plot(steps, rel, marker="o", markersize=3, color=_ARM_COLORS.get(v),
                     label=v + (" (FAILED)" if bad else ""))  # fmt: skip
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.set_title("loss per step: FlyDSL off vs on", fontsize=10)
    ax.legend(fontsize=8)
    ax2.axhline(tr["tolerance_rel"], color="#C44E52", linewidth=1, linestyle=":",
                label=f"threshold {tr['tolerance_rel']:g}")  # fmt: skip
    ax2.set_yscale("log")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("|loss - off loss| / off loss")
    ax2.set_title("relative difference from off", fontsize=10)
    ax2.legend(fontsize=8)
    fig.suptitle(f"{results['model']['name']}: training ({_unit(results)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(results, out: Path) -> dict[str, Path]:
    """``results.json``, ``report.md``, ``speedup.png``, ``coverage.png`` (and ``loss.png`` with
    a train arm) under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "results": out / "results.json",
        "report": out / "report.md",
        "speedup": out / "speedup.png",
        "coverage": out / "coverage.png",
    }
    if results.get("train"):
        paths["loss"] = out / "loss.png"
    paths["results"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    paths["report"].write_text(markdown(results))
    plot_speedup(results, paths["speedup"])
    plot_coverage(results, paths["coverage"])
    if "loss" in paths:
        plot_loss(results, paths["loss"])
    return paths


# -- console --------------------------------------------------------------------------------------


def print_console(results, console, paths=None) -> None:
    from rich.markdown import Markdown

    console.print(Markdown(markdown(results).split("## Plots")[0]))
    if paths:
        console.print("written: " + ", ".join(str(p) for p in paths.values()))
