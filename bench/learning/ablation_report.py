"""Render the ablation's doc, table and figures from ``docs/learning/ablation.json`` (nothing else is read).

``write(study, docs_dir)`` replaces the generated part of ``docs_dir/ablation.md`` (between the markers; the text
around them is kept) and draws one figure per effect; ``table`` and ``result_line`` are what the bench prints.

Statistics: per arm, the mean over seeds and a 95% interval, mean +/- t(0.975, k-1) x sd / sqrt(k) over the k seeds
(Student's t: with 3 seeds the half-width is 2.48 standard deviations). A claim's verdict compares two arms' intervals:
``reproduced`` when they do not overlap in the paper's direction (and, where a target ratio is named, the means meet
it), ``not reproduced`` when they do not overlap in the other direction, ``inconclusive`` otherwise.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

BEGIN, END = "<!-- BEGIN GENERATED (bench/learning/ablation.py) -->", "<!-- END GENERATED -->"
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
LABELS = {
    "dapo": "DAPO (all four)",
    "no_clip_higher": "no clip-higher",
    "no_dynamic_sampling": "no dynamic sampling",
    "no_token_loss": "no token-level loss",
    "no_overlong_shaping": "no overlong shaping",
    "grpo": "GRPO (all four off)",
}
COLOURS = {"dapo": "tab:red", "no_clip_higher": "tab:purple", "no_dynamic_sampling": "tab:green",
           "no_token_loss": "tab:orange", "no_overlong_shaping": "tab:brown", "grpo": "tab:blue"}
COLUMNS = (  # (key, header, format)
    ("val_acc_start", "val acc start", "{:.3f}"),
    ("val_acc_end", "val acc end", "{:.3f}"),
    ("entropy_end", "entropy end", "{:.3f}"),
    ("clipfrac_low", "clipfrac low", "{:.4f}"),
    ("clipfrac_high", "clipfrac high", "{:.4f}"),
    ("response_length_end", "length end", "{:.1f}"),
    ("truncation_end", "truncated end", "{:.3f}"),
    ("informative_share", "informative groups", "{:.2f}"),
    ("steps", "steps", "{:.0f}"),
    ("generated_tokens", "generated tokens", "{:.0f}"),
    ("wall_s", "wall (s)", "{:.0f}"),
)


def interval(values) -> tuple[float, float, float]:
    """(mean, low, high) of the 95% t-interval of the mean; a single value is its own (degenerate) interval."""
    values = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if values.size == 0:
        return (math.nan, math.nan, math.nan)
    mean = float(values.mean())
    if values.size == 1:
        return (mean, mean, mean)
    half = T_975.get(values.size - 1, 1.96) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return (mean, mean - half, mean + half)


def by_arm(study: dict) -> dict[str, list[dict]]:
    arms: dict[str, list[dict]] = {}
    for run in study["runs"]:
        arms.setdefault(run["arm"], []).append(run)
    return {arm: arms[arm] for arm in study["arms"] if arm in arms}


def _fmt(fmt: str, value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _cell(fmt: str, stats: tuple[float, float, float]) -> str:
    mean, low, high = stats
    if math.isnan(mean):
        return "-"
    if low == high:
        return _fmt(fmt, mean)
    return f"{_fmt(fmt, mean)} [{_fmt(fmt, low)}, {_fmt(fmt, high)}]"


def table(study: dict) -> str:
    """Per arm: the mean and 95% interval over seeds of every column."""
    header = "| arm | seeds | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for arm, runs in by_arm(study).items():
        cells = [_cell(fmt, interval([r.get(key) for r in runs])) for key, _, fmt in COLUMNS]
        lines.append(f"| {LABELS.get(arm, arm)} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def runs_table(study: dict) -> str:
    """Every run, one row each."""
    header = "| arm | seed | " + " | ".join(h for _, h, _ in COLUMNS) + " | stopped by |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 3)]
    for run in study["runs"]:
        cells = [_fmt(fmt, run.get(key)) for key, _, fmt in COLUMNS]
        lines.append(f"| {LABELS.get(run['arm'], run['arm'])} | {run['seed']} | " + " | ".join(cells)
                     + f" | {run.get('stop', '-')} |")
    return "\n".join(lines)


def val_at_step(run: dict, step: int) -> float | None:
    """Validation accuracy at the last validation at or before ``step``."""
    pairs = [(s, a) for s, a in zip(run["validation"]["step"], run["validation"]["acc"]) if s <= step]
    return pairs[-1][1] if pairs else None


def _verdict(treatment, control, higher_is_better: bool, ratio: float | None = None) -> str:
    """Compare two (mean, low, high) intervals in the paper's direction (see the module docstring)."""
    if any(math.isnan(x) for x in (*treatment, *control)):
        return "inconclusive"
    if treatment[1] == treatment[2] or control[1] == control[2]:
        # One seed (or seeds that agree exactly) gives no interval: a difference of one run is not evidence.
        if round(treatment[0], 3) == round(control[0], 3):
            return "inconclusive (one seed; no difference)"
        direction = (treatment[0] > control[0]) == higher_is_better
        return f"inconclusive (one seed; {'in' if direction else 'against'} the paper's direction)"
    better = (treatment[1] > control[2]) if higher_is_better else (treatment[2] < control[1])
    worse = (treatment[2] < control[1]) if higher_is_better else (treatment[1] > control[2])
    if better:
        if ratio is None:
            return "reproduced"
        met = treatment[0] >= ratio * control[0] if higher_is_better else treatment[0] <= ratio * control[0]
        return "reproduced" if met else "direction reproduced, target ratio missed"
    return "not reproduced" if worse else "inconclusive"


def claims(study: dict) -> list[dict]:
    """The paper's four claims (and DAPO against GRPO), each with its figures and verdict."""
    arms = by_arm(study)
    stat = lambda arm, key: interval([r.get(key) for r in arms.get(arm, [])])  # noqa: E731
    out = []

    high, sym = stat("dapo", "entropy_end"), stat("no_clip_higher", "entropy_end")
    out.append({
        "claim": "Clip-higher keeps entropy from collapsing (paper Fig. 2): end entropy at least 1.5x the symmetric "
                 "clip's",
        "evidence": f"entropy at the end (mean of the last 3 steps): DAPO {_cell('{:.3f}', high)}, no clip-higher "
                    f"{_cell('{:.3f}', sym)}; ratio of means {_ratio(high, sym)}; validation accuracy at the end "
                    f"{_cell('{:.3f}', stat('dapo', 'val_acc_end'))} against "
                    f"{_cell('{:.3f}', stat('no_clip_higher', 'val_acc_end'))}",
        "verdict": _verdict(high, sym, True, ratio=1.5),
    })

    tok, seq = stat("dapo", "entropy_end"), stat("no_token_loss", "entropy_end")
    out.append({
        "claim": "Token-level loss keeps entropy and length growth healthy (paper Fig. 4): sample-level loss ends "
                 "with higher entropy",
        "evidence": f"entropy at the end: token-mean {_cell('{:.3f}', tok)}, seq-mean-token-mean {_cell('{:.3f}', seq)}; "
                    f"response length at the end {_cell('{:.1f}', stat('dapo', 'response_length_end'))} against "
                    f"{_cell('{:.1f}', stat('no_token_loss', 'response_length_end'))}",
        "verdict": _verdict(tok, seq, False),
    })

    shaped, unshaped = stat("dapo", "truncation_end"), stat("no_overlong_shaping", "truncation_end")
    out.append({
        "claim": "Overlong shaping cuts truncation (paper Fig. 5, Table 1): at most half the no-shaping arm's "
                 "truncation rate",
        "evidence": f"truncated share of generated responses at the end (last 3 steps): DAPO "
                    f"{_cell('{:.3f}', shaped)}, no overlong shaping {_cell('{:.3f}', unshaped)} (both started at "
                    f"{_cell('{:.3f}', stat('dapo', 'truncation_start'))} and "
                    f"{_cell('{:.3f}', stat('no_overlong_shaping', 'truncation_start'))})",
        "verdict": _verdict(shaped, unshaped, False, ratio=0.5),
    })

    ds_runs, plain_runs = arms.get("dapo", []), arms.get("no_dynamic_sampling", [])
    common = min([r["steps"] for r in ds_runs + plain_runs], default=0)
    ds = interval([val_at_step(r, common) for r in ds_runs])
    plain = interval([val_at_step(r, common) for r in plain_runs])
    out.append({
        "claim": "Dynamic sampling reaches higher accuracy in as many gradient steps (paper Fig. 6), training only "
                 "informative groups",
        "evidence": f"validation accuracy at step {common} (the fewest steps any of these runs took): DAPO "
                    f"{_cell('{:.3f}', ds)}, no dynamic sampling {_cell('{:.3f}', plain)}; share of trained groups "
                    f"that carry gradient {_cell('{:.2f}', stat('dapo', 'informative_share'))} against "
                    f"{_cell('{:.2f}', stat('no_dynamic_sampling', 'informative_share'))}",
        "verdict": _verdict(ds, plain, True),
    })

    full, base = stat("dapo", "val_acc_end"), stat("grpo", "val_acc_end")
    verdict = _verdict(full, base, True)
    if verdict == "inconclusive" and full[0] >= base[0] and full[1] != full[2] and base[1] != base[2]:
        verdict = "reproduced (at least equal; intervals overlap)"
    out.append({
        "claim": "Full DAPO reaches at least GRPO's accuracy at equal generated tokens (paper Table 1)",
        "evidence": f"validation accuracy at the end of the budget: DAPO {_cell('{:.3f}', full)}, GRPO "
                    f"{_cell('{:.3f}', base)}",
        "verdict": verdict,
    })
    return out


def _ratio(a, b) -> str:
    return "-" if math.isnan(a[0]) or math.isnan(b[0]) or b[0] == 0 else f"{a[0] / b[0]:.2f}"


def result_line(study: dict) -> str:
    arms = by_arm(study)
    mean = lambda arm, key: interval([r.get(key) for r in arms.get(arm, [])])[0]  # noqa: E731
    parts = {
        "runs": len(study["runs"]),
        "val_acc_dapo": mean("dapo", "val_acc_end"),
        "val_acc_grpo": mean("grpo", "val_acc_end"),
        "entropy_ratio_clip_higher": mean("dapo", "entropy_end") / mean("no_clip_higher", "entropy_end")
        if arms.get("no_clip_higher") else math.nan,
        "truncation_ratio_shaping": mean("dapo", "truncation_end") / mean("no_overlong_shaping", "truncation_end")
        if arms.get("no_overlong_shaping") and mean("no_overlong_shaping", "truncation_end") else math.nan,
        "reproduced": sum(c["verdict"].startswith("reproduced") for c in claims(study)) if len(arms) > 1 else 0,
        "wall_s": study.get("wall_s", math.nan),
    }
    return "RESULT " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in parts.items())


def _curve_mean(runs: list[dict], x_key: str, y_key: str, source: str = "curves"):
    """The seeds' mean of ``y_key`` against ``x_key`` on the x values every seed has (steps) or on a common grid."""
    series = []
    for run in runs:
        data = run[source]
        pairs = [(x, y) for x, y in zip(data[x_key], data[y_key]) if y is not None]
        if pairs:
            series.append((np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)))
    if not series:
        return None
    top = min(s[0][-1] for s in series)
    grid = np.linspace(min(s[0][0] for s in series), top, 50) if x_key == "generated_tokens" else np.array(
        sorted(set.intersection(*[set(s[0].tolist()) for s in series])))
    if grid.size == 0:
        return None
    return grid, np.mean([np.interp(grid, x, y) for x, y in series], axis=0)


def _panel(ax, arms: dict, names, x_key: str, y_key: str, title: str, source: str = "curves"):
    for arm in names:
        for run in arms.get(arm, []):
            data = run[source]
            xs = [x for x, y in zip(data[x_key], data[y_key]) if y is not None]
            ys = [y for y in data[y_key] if y is not None]
            ax.plot(xs, ys, color=COLOURS[arm], alpha=0.25, linewidth=0.8)
        mean = _curve_mean(arms.get(arm, []), x_key, y_key, source)
        if mean is not None:
            ax.plot(*mean, color=COLOURS[arm], linewidth=2, label=LABELS[arm])
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("generated tokens" if x_key == "generated_tokens" else "gradient step")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


FIGURES = {  # file -> (title, [(arms, x, y, panel title, source)])
    "ablation_clip_higher.png": ("Clip-higher", [
        (("dapo", "no_clip_higher"), "step", "entropy", "token entropy", "curves"),
        (("dapo", "no_clip_higher"), "step", "clipfrac_high", "upper clip fraction (A>0)", "curves"),
        (("dapo", "no_clip_higher"), "step", "acc", "validation accuracy", "validation")]),
    "ablation_token_loss.png": ("Token-level loss", [
        (("dapo", "no_token_loss"), "step", "entropy", "token entropy", "curves"),
        (("dapo", "no_token_loss"), "step", "response_length", "mean response length", "curves"),
        (("dapo", "no_token_loss"), "step", "acc", "validation accuracy", "validation")]),
    "ablation_overlong.png": ("Overlong shaping", [
        (("dapo", "no_overlong_shaping"), "step", "truncation", "truncated share of responses", "curves"),
        (("dapo", "no_overlong_shaping"), "step", "response_length", "mean response length", "curves"),
        (("dapo", "no_overlong_shaping"), "step", "acc", "validation accuracy", "validation")]),
    "ablation_dynamic_sampling.png": ("Dynamic sampling", [
        (("dapo", "no_dynamic_sampling"), "step", "acc", "validation accuracy", "validation"),
        (("dapo", "no_dynamic_sampling", "grpo"), "generated_tokens", "acc", "validation accuracy", "validation"),
        (("dapo", "no_dynamic_sampling"), "step", "informative", "share of trained groups with gradient", "curves")]),
}


def draw(study: dict, docs_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = by_arm(study)
    design = study["design"]
    settings = (f"tiny Qwen2 (hidden {design['hidden_size']}, {design['num_hidden_layers']} layers) on chain "
                f"arithmetic, {design['train_batch_size']} prompts x {design['n']} responses, "
                f"{design['train_batch_size'] // design['mini_batch_size']} updates/step, lr {design['lr']}, "
                f"max response {design['max_response_length']} (buffer {design['overlong_buffer']}), "
                f"{design['budget_tokens']} generated tokens per run; thin: each seed, thick: mean of seeds")
    written = []
    for name, (title, panels) in FIGURES.items():
        figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
        for ax, (names, x, y, panel_title, source) in zip(axes, panels):
            _panel(ax, arms, names, x, y, panel_title, source)
        figure.suptitle(f"{title}: {settings}", fontsize=8)
        figure.tight_layout()
        figure.savefig(Path(docs_dir) / name, dpi=100)
        plt.close(figure)
        written.append(name)
    return written


def validation_seeded(runs: list[dict]) -> bool:
    """Whether every run sampled its validation with seeds (runs recorded before the recipe seeded it did not)."""
    return bool(runs) and all(run.get("validation_seeded") for run in runs)


def same_start(study: dict) -> list[str]:
    """What the runs themselves say about repeatability: every run of a seed starts from the same model with the same
    seeded rollouts, so their first step (before any update) must match; so must their first validation, where it was
    seeded."""
    lines = []
    unfiltered = ("no_dynamic_sampling", "grpo")  # one round of train_batch_size prompts, not deficit rounds
    for seed in sorted({run["seed"] for run in study["runs"]}):
        runs = [run for run in study["runs"] if run["seed"] == seed and run["curves"]["step"][:1] == [1]]
        for sampling, members in (("dynamic sampling", [r for r in runs if r["arm"] not in unfiltered]),
                                  ("one round per step", [r for r in runs if r["arm"] in unfiltered])):
            if len(members) < 2:
                continue
            firsts = {(r["curves"]["train_acc"][0], r["curves"]["generated_tokens"][0]) for r in members}
            verdict = "identical in every run" if len(firsts) == 1 else f"{len(firsts)} different values"
            lines.append(f"- Seed {seed}, the {len(members)} runs with {sampling} "
                         f"({', '.join(r['arm'] for r in members)}): step 1, generated by the same model with the same "
                         f"seeded rollouts before any update, has training accuracy and generated tokens {verdict}.")
        starts = [run["val_acc_start"] for run in runs if run["val_acc_start"] is not None]
        if len(starts) > 1:
            reading = ("validation is seeded: every run draws the same samples)." if validation_seeded(runs) else
                       "validation samples are not seeded): the noise of a single validation, as large as most "
                       "differences between the arms above.")
            lines.append(f"- Seed {seed}: validation of that same model before training gave {min(starts):.3f} to "
                         f"{max(starts):.3f} over {len(starts)} runs ({reading}")
    return lines


def generated(study: dict, figures: list[str]) -> str:
    design = study["design"]
    repeat = study.get("repeat")
    if repeat:
        against = {"the recorded run": " (the rerun on another machine, in a later session, against the run recorded "
                                       "in ablation.json)"}.get(repeat.get("against"), "")
        if repeat["identical"]:
            same = (f"identical: {repeat['steps_compared']} steps of `{repeat['arm']}` seed {repeat['seed']} "
                    f"run twice gave the same training figures to the last digit ("
                    + ", ".join(f"`{key}`" for key in repeat["max_relative_difference"])
                    + f"{'' if validation_seeded(study['runs']) else '; validation samples are not seeded'})"
                    + against)
        else:
            first = repeat["first_difference"]
            worst = ", ".join(f"`{k}` {v:.2g}" for k, v in repeat["max_relative_difference"].items() if v is not None)
            same = (f"not identical: `{repeat['arm']}` seed {repeat['seed']} run twice first differs at step "
                    f"{first['step']} (`{first['metric']}`); largest relative differences over "
                    f"{repeat['steps_compared']} common steps: {worst}{against}")
    else:
        same = "not measured in this study (`python bench/learning/ablation.py` reruns the first seed's dapo arm)"
    lines = [BEGIN, "", "Made by:", "", "```bash", study["command"].strip(), "```", "",
             f"{len(study['runs'])} runs, {study.get('wall_s', 0) / 60:.0f} minutes in all. Design: `"
             + json.dumps(design) + "`.", "",
             "### The four claims", "", "| claim | evidence (mean [95% interval] over seeds) | verdict |",
             "|---|---|---|"]
    lines += [f"| {c['claim']} | {c['evidence']} | **{c['verdict']}** |" for c in claims(study)]
    lines += ["", "### Per arm (mean [95% interval] over seeds)", "", table(study), "",
              "### Every run", "", runs_table(study), "", "### Reproducibility", "",
              f"Same arm, same seed, run twice: {same}.", "", *same_start(study), "", "### Figures", ""]
    lines += [f"![{name}]({name})" for name in figures]
    lines += ["", END]
    return "\n".join(lines)


def write(study: dict, docs_dir: Path) -> None:
    docs_dir = Path(docs_dir)
    docs_dir.mkdir(parents=True, exist_ok=True)
    figures = draw(study, docs_dir)
    write_block(docs_dir / "ablation.md", BEGIN, generated(study, figures), "The DAPO ablation in miniature")


def write_block(doc: Path, begin: str, block: str, title: str) -> None:
    """``block`` (which opens with ``begin`` and closes with END) in place of the doc's block that opens with
    ``begin``, up to that block's own END (a doc may hold several generated blocks); appended where the doc has no
    such block, a new doc titled ``title``. Text outside the block is kept."""
    text = doc.read_text() if doc.exists() else f"# {title}\n"
    if begin in text and END in text[text.index(begin):]:
        start = text.index(begin)
        text = text[:start] + block + text[text.index(END, start) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.write_text(text)
