"""Render the ablation's doc, table and figures from ``docs/learning/ablation.json`` (nothing else is read).

``write(study, docs_dir)`` replaces the generated part of ``docs_dir/ablation.md`` (between the markers; the text
around them is kept) and draws one figure per effect; ``table`` and ``result_line`` are what the bench prints.

Statistics: per arm, the mean over seeds and a 95% interval, mean +/- t(0.975, k-1) x sd / sqrt(k) over the k seeds
(Student's t: with 3 seeds the half-width is 2.48 standard deviations). Every claim's verdict follows one rule, a paired
comparison over seeds: the runs of one seed share their model, data and first rollouts, so the claim is judged on the
per-seed differences (treatment minus control) and the 95% t-interval of their mean. ``reproduced`` when that interval
lies wholly on the paper's side of zero (and, where a target ratio is named, the arms' means meet it: else ``direction
reproduced, target ratio missed``), ``not reproduced`` when it lies wholly on the other side, ``inconclusive``
otherwise; with fewer than two paired seeds there is no interval, and the verdict says which way the one difference
went.
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


def interval_side(stats, pairs: int) -> str | None:
    """Where a paired difference's 95% interval ``stats`` (mean, low, high) lies against zero: ``"above"``,
    ``"below"`` or ``"includes"``; None when fewer than two seeds were paired (one is no evidence, and gives no
    interval)."""
    mean, low, high = stats
    if pairs < 2 or mean is None or math.isnan(mean):
        return None
    return "above" if low > 0 else "below" if high < 0 else "includes"


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


def paired(treatment: dict, control: dict) -> list[tuple[int, float, float]]:
    """(seed, treatment value, control value) for every seed both arms have a value for, in seed order."""
    seeds = sorted(seed for seed in set(treatment) & set(control)
                   if treatment[seed] is not None and control[seed] is not None
                   and not math.isnan(treatment[seed]) and not math.isnan(control[seed]))
    return [(seed, treatment[seed], control[seed]) for seed in seeds]


def paired_verdict(pairs: list[tuple[int, float, float]], higher_is_better: bool, ratio: float | None = None) -> str:
    """The verdict of a claim from its per-seed pairs (see the module docstring): the 95% t-interval of the mean
    per-seed difference, treatment minus control, against zero."""
    if not pairs:
        return "inconclusive"
    differences = [t - c for _, t, c in pairs]
    mean, low, high = interval(differences)
    if len(pairs) < 2:
        if round(mean, 3) == 0:
            return "inconclusive (one seed; no difference)"
        return f"inconclusive (one seed; {'in' if (mean > 0) == higher_is_better else 'against'} the paper's direction)"
    better = low > 0 if higher_is_better else high < 0
    worse = high < 0 if higher_is_better else low > 0
    if better:
        if ratio is None:
            return "reproduced"
        treated = float(np.mean([t for _, t, _ in pairs]))
        base = float(np.mean([c for _, _, c in pairs]))
        met = treated >= ratio * base if higher_is_better else treated <= ratio * base
        return "reproduced" if met else "direction reproduced, target ratio missed"
    return "not reproduced" if worse else "inconclusive"


def per_seed(runs: list[dict], key) -> dict:
    """seed -> the run's value: ``key`` is a record field, or a function of the run."""
    return {run["seed"]: (key(run) if callable(key) else run.get(key)) for run in runs}


def _paired_text(pairs, fmt: str, higher_is_better: bool) -> str:
    """'difference +0.074 [0.034, 0.114], paired over 3 seeds, 3 of 3 in the paper's direction'."""
    if not pairs:
        return "no paired seeds"
    differences = [t - c for _, t, c in pairs]
    along = sum((d > 0) == higher_is_better and d != 0 for d in differences)
    signed = fmt.replace("{:", "{:+")
    mean, low, high = interval(differences)
    shown = signed.format(mean) if low == high else f"{signed.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"
    return (f"difference {shown}, paired over {len(pairs)} seed{'s' if len(pairs) != 1 else ''}, {along} of "
            f"{len(pairs)} in the paper's direction")


def common_steps(study: dict, *names: str) -> int:
    """The fewest gradient steps any run of these arms took."""
    arms = by_arm(study)
    return min([run["steps"] for name in names for run in arms.get(name, [])], default=0)


def claims(study: dict) -> list[dict]:
    """The paper's four claims (and DAPO against GRPO), each with its figures and verdict (one rule: paired)."""
    arms = by_arm(study)
    stat = lambda arm, key: interval([r.get(key) for r in arms.get(arm, [])])  # noqa: E731
    pairs = lambda a, b, key: paired(per_seed(arms.get(a, []), key), per_seed(arms.get(b, []), key))  # noqa: E731
    out = []

    high, sym = stat("dapo", "entropy_end"), stat("no_clip_higher", "entropy_end")
    entropy = pairs("dapo", "no_clip_higher", "entropy_end")
    out.append({
        "name": "Clip-higher",
        "claim": "Clip-higher keeps entropy from collapsing (paper Fig. 2): end entropy at least 1.5x the symmetric "
                 "clip's",
        "evidence": f"entropy at the end (mean of the last 3 steps): DAPO {_cell('{:.3f}', high)}, no clip-higher "
                    f"{_cell('{:.3f}', sym)}; {_paired_text(entropy, '{:.3f}', True)}; ratio of means "
                    f"{_ratio(high, sym)}; validation accuracy at the end "
                    f"{_cell('{:.3f}', stat('dapo', 'val_acc_end'))} against "
                    f"{_cell('{:.3f}', stat('no_clip_higher', 'val_acc_end'))}",
        "verdict": paired_verdict(entropy, True, ratio=1.5),
    })

    tok, seq = stat("dapo", "entropy_end"), stat("no_token_loss", "entropy_end")
    entropy = pairs("dapo", "no_token_loss", "entropy_end")
    out.append({
        "name": "Token-level loss",
        "claim": "Token-level loss keeps entropy and length growth healthy (paper Fig. 4): sample-level loss ends "
                 "with higher entropy",
        "evidence": f"entropy at the end: token-mean {_cell('{:.3f}', tok)}, seq-mean-token-mean {_cell('{:.3f}', seq)}"
                    f"; {_paired_text(entropy, '{:.3f}', False)}; response length at the end "
                    f"{_cell('{:.1f}', stat('dapo', 'response_length_end'))} against "
                    f"{_cell('{:.1f}', stat('no_token_loss', 'response_length_end'))}",
        "verdict": paired_verdict(entropy, False),
    })

    shaped, unshaped = stat("dapo", "truncation_end"), stat("no_overlong_shaping", "truncation_end")
    cut = pairs("dapo", "no_overlong_shaping", "truncation_end")
    out.append({
        "name": "Overlong shaping",
        "claim": "Overlong shaping cuts truncation (paper Fig. 5, Table 1): at most half the no-shaping arm's "
                 "truncation rate",
        "evidence": f"truncated share of generated responses at the end (last 3 steps): DAPO "
                    f"{_cell('{:.3f}', shaped)}, no overlong shaping {_cell('{:.3f}', unshaped)} (both started at "
                    f"{_cell('{:.3f}', stat('dapo', 'truncation_start'))} and "
                    f"{_cell('{:.3f}', stat('no_overlong_shaping', 'truncation_start'))}); "
                    f"{_paired_text(cut, '{:.3f}', False)}",
        "verdict": paired_verdict(cut, False, ratio=0.5),
    })

    common = common_steps(study, "dapo", "no_dynamic_sampling")
    at_common = lambda run: val_at_step(run, common)  # noqa: E731
    ds = interval([at_common(r) for r in arms.get("dapo", [])])
    plain = interval([at_common(r) for r in arms.get("no_dynamic_sampling", [])])
    accuracy = pairs("dapo", "no_dynamic_sampling", at_common)
    out.append({
        "name": "Dynamic sampling",
        "claim": "Dynamic sampling reaches higher accuracy in as many gradient steps (paper Fig. 6), training only "
                 "informative groups",
        "evidence": f"validation accuracy at step {common} (the fewest steps any of these runs took): DAPO "
                    f"{_cell('{:.3f}', ds)}, no dynamic sampling {_cell('{:.3f}', plain)}; "
                    f"{_paired_text(accuracy, '{:.3f}', True)}; share of trained groups that carry gradient "
                    f"{_cell('{:.2f}', stat('dapo', 'informative_share'))} against "
                    f"{_cell('{:.2f}', stat('no_dynamic_sampling', 'informative_share'))}",
        "verdict": paired_verdict(accuracy, True),
    })

    full, base = stat("dapo", "val_acc_end"), stat("grpo", "val_acc_end")
    accuracy = pairs("dapo", "grpo", "val_acc_end")
    out.append({
        "name": "Full DAPO",
        "claim": "Full DAPO reaches at least GRPO's accuracy at equal generated tokens (paper Table 1)",
        "evidence": f"validation accuracy at the end of the budget: DAPO {_cell('{:.3f}', full)}, GRPO "
                    f"{_cell('{:.3f}', base)}; {_paired_text(accuracy, '{:.3f}', True)}",
        "verdict": paired_verdict(accuracy, True),
    })
    return out


def _seedwise(pairs, fmt: str = "{:.3f}") -> str:
    """'0.634 against 0.549, 0.648 against 0.566' (seed order)."""
    return ", ".join(f"{fmt.format(t)} against {fmt.format(c)}" for _, t, c in pairs)


def _directions(pairs, higher_is_better: bool) -> str:
    """Which seeds went which way: 'ahead in seeds 1 and 2, level in seed 0' (level: equal to three decimals)."""
    groups: dict[str, list[str]] = {}
    for seed, t, c in pairs:
        word = ("level" if round(t, 3) == round(c, 3) else
                "ahead" if (t > c) == higher_is_better else "behind")
        groups.setdefault(word, []).append(str(seed))
    parts = []
    for word in ("ahead", "level", "behind"):
        if word in groups:
            seeds = groups[word]
            named = seeds[0] if len(seeds) == 1 else ", ".join(seeds[:-1]) + " and " + seeds[-1]
            parts.append(f"{word} in seed{'s' if len(seeds) > 1 else ''} {named}")
    return ", ".join(parts)


def entropy_change(run: dict) -> float | None:
    """Relative change of token entropy from the first step to the run's end (the mean of its last three steps)."""
    first = next((e for e in run["curves"].get("entropy", []) if e is not None), None)
    end = run.get("entropy_end")
    return None if first in (None, 0) or end is None else end / first - 1


def _span(values, fmt: str = "{:.3f}") -> str:
    low, high = min(values), max(values)
    return fmt.format(low) if fmt.format(low) == fmt.format(high) else f"{fmt.format(low)}-{fmt.format(high)}"


def findings(study: dict) -> list[str]:
    """The seed-by-seed reading of the study, every figure taken from its runs (the doc's 'What it shows')."""
    arms = by_arm(study)
    runs = study["runs"]
    if not runs:
        return []
    verdict = {c["name"]: c["verdict"] for c in claims(study)}

    def pairs(a: str, b: str, key) -> list:
        return paired(per_seed(arms.get(a, []), key), per_seed(arms.get(b, []), key))

    def mean(arm: str, key: str) -> float:
        return interval([r.get(key) for r in arms.get(arm, [])])[0]

    lines = []
    starts = [r["val_acc_start"] for r in runs if r.get("val_acc_start") is not None]
    ends = [r["val_acc_end"] for r in runs if r.get("val_acc_end") is not None]
    dapo = sorted(arms.get("dapo", []), key=lambda r: r["seed"])
    if starts and ends:
        text = (f"- **Learning.** Every run starts at {_span(starts, '{:.2f}')} validation accuracy (mean@4, T=1) and "
                f"ends at {_span(ends, '{:.2f}')} after {study['design']['budget_tokens']:,} generated tokens "
                f"({_span([r['steps'] for r in runs], '{}')} gradient steps)")
        if dapo:
            text += "; full DAPO, seed by seed: " + ", ".join(
                "{:.3f} to {:.3f}".format(r["val_acc_start"], r["val_acc_end"]) for r in dapo)
        lines.append(text + ".")
    grpo = pairs("dapo", "grpo", "val_acc_end")
    if grpo:
        lines.append(f"- **DAPO against GRPO** at the end of the same generated-token budget: DAPO "
                     f"{_directions(grpo, True)} ({_seedwise(grpo)}); {_paired_text(grpo, '{:.3f}', True)}: "
                     f"{verdict.get('Full DAPO', '-')}.")
    cut = pairs("dapo", "no_overlong_shaping", "truncation_end")
    if cut:
        ratio = _ratio(interval([t for _, t, _ in cut]), interval([c for _, _, c in cut]))
        lines.append(f"- **Overlong shaping**: truncated share of generated responses over the last three steps, "
                     f"with shaping against without, seed by seed: {_seedwise(cut)}; ratio of the means {ratio}, "
                     f"against the 0.5 the claim asks for; {_paired_text(cut, '{:.3f}', False)}: "
                     f"{verdict.get('Overlong shaping', '-')}.")
    common = common_steps(study, "dapo", "no_dynamic_sampling")
    at_common = pairs("dapo", "no_dynamic_sampling", lambda run: val_at_step(run, common))
    at_end = pairs("dapo", "no_dynamic_sampling", "val_acc_end")
    if at_common:
        plain_steps = [r["steps"] for r in arms.get("no_dynamic_sampling", [])]
        lines.append(
            f"- **Dynamic sampling** trains only groups with gradient ({mean('dapo', 'informative_share'):.2f} of the "
            f"trained groups, against {mean('no_dynamic_sampling', 'informative_share'):.2f} without it). At equal "
            f"gradient steps (validation at step {common}) DAPO is {_directions(at_common, True)} "
            f"({_seedwise(at_common)}; {_paired_text(at_common, '{:.3f}', True)}: "
            f"{verdict.get('Dynamic sampling', '-')}); at the end of the equal token budget, where the arm without it "
            f"has taken {_span(plain_steps, '{}')} steps, it is {_directions(at_end, True)} ({_seedwise(at_end)}).")
    for arm, name, higher in (("no_clip_higher", "Clip-higher", True), ("no_token_loss", "Token-level loss", False)):
        entropy = pairs("dapo", arm, "entropy_end")
        if not entropy:
            continue
        accuracy = pairs("dapo", arm, "val_acc_end")
        text = (f"- **{name}**: end entropy {mean('dapo', 'entropy_end'):.3f} against {mean(arm, 'entropy_end'):.3f} "
                f"without it ({_paired_text(entropy, '{:.3f}', higher)}: {verdict.get(name, '-')})")
        if arm == "no_clip_higher":
            text += (f"; upper clip fraction {mean('dapo', 'clipfrac_high'):.4f} of tokens against "
                     f"{mean(arm, 'clipfrac_high'):.4f} without it")
        else:
            text += (f"; response length at the end {mean('dapo', 'response_length_end'):.1f} against "
                     f"{mean(arm, 'response_length_end'):.1f} tokens")
        lines.append(text + f"; validation accuracy at the end {_directions(accuracy, True)} ({_seedwise(accuracy)}).")
    changes = [c for c in (entropy_change(r) for r in runs) if c is not None]
    if changes:
        rose, fell = [c for c in changes if c > 0], [-c for c in changes if c <= 0]
        parts = ([f"rose in {len(rose)} (by {_span([100 * c for c in rose], '{:.0f}')}%)"] if rose else []) + (
            [f"fell in {len(fell)} (by {_span([100 * c for c in fell], '{:.0f}')}%)"] if fell else [])
        lines.append(f"- **Entropy**, from the first step to the end (the mean of the last three steps), "
                     f"{' and '.join(parts)} of the {len(changes)} runs.")
    return lines


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
                                  ("without dynamic sampling", [r for r in runs if r["arm"] in unfiltered])):
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
             "### What it shows, seed by seed", "", *findings(study), "",
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
