"""Read the runs of run_learning.py (verl's ``file`` logger JSONL), plot them and write the results table.

Each JSONL line is ``{"step": N, "data": {metric: value}}`` (verl.utils.tracking.FileLogger); step 0 holds
the validation before training. The curves are drawn by the run report's panels (``recipe_dapo.report``,
``PAIRS`` picks them) against generated tokens, one colour per arm and one line style per seed:

    train reward    reward/acc_mean: accuracy over *every* response generated in the step, before the
                    dynamic-sampling filter (so both arms are measured on the same population)
    val reward      val/<source>/mean@k (recipe metric), falling back to verl's val-core/<source>/acc/mean@k
    entropy         actor/entropy (old-policy token entropy of the trained batch)
    length          response_length/mean (trained batch)
    clip fractions  actor/pg_clipfrac, actor/pg_clipfrac_eps_high (ratio above 1 + eps_high, A > 0)

Two pairs of arms (``PAIRS``): ``dapo-grpo`` (learning_curves.png) and ``skip``, DAPO with prompt skipping against
without (skipping_curves.png; its table puts both arms at the baseline's step count and at its generated tokens, and
adds the keep rate and the skip counts ``dynamic_sampling/skip/*``). Both write their block into the one learning doc,
docs/learning/ablation.md, each between markers of its own; both read the same folder, so the ``dapo`` arm they share
is one set of runs.

Generated tokens (the x axis and the budget): ``dynamic_sampling/generated_tokens`` when the run logged it
(every response token of every round, kept or dropped: exact). Older runs: generated responses x mean
response length, where generated responses = ``dynamic_sampling/generated_groups`` x n (``train_batch_size``
x n when the sampler logged nothing) and the mean length is ``reward/response_length_mean`` (over every
generated response) or else ``response_length/mean`` of the trained batch.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recipe_dapo import report
from recipe_dapo.dynamic_sampling import SKIP_METRIC_PREFIX as SKIP
from recipe_dapo.tracking.run_log import read_metrics
from recipe_dapo.loss.clip import CLIPFRAC, CLIPFRAC_EPS_HIGH

from ablation_report import END, write_block  # the one writer of a doc's generated blocks (bench/learning)

COLOURS = {"grpo": "tab:blue", "dapo": "tab:red", "dapo_skip": "tab:green"}
LABELS = {"grpo": "GRPO baseline", "dapo": "DAPO (recipe defaults)", "dapo_skip": "DAPO + prompt skipping"}
VAL_PATTERNS = (re.compile(r"^val/[^/]+/mean@\d+$"), re.compile(r"^val-core/[^/]+/acc/mean@\d+$"))
# The panels are the run report's (recipe_dapo.report), drawn against generated tokens; validation shows mean@k only.
VALIDATION_MEAN = report.Panel(
    "Validation accuracy (mean@4, T=1)", "accuracy", lambda runs: report.validation_curves(runs, passes=False)
)


@dataclass(frozen=True)
class Pair:
    """Two arms compared at an equal generated-token budget, and where their plot and table go."""

    arms: tuple[str, str]  # (baseline, treatment); the first arm's generated tokens set the budget
    name: str  # the bench's --pair
    markdown: str
    figure: str
    title: str
    panels: tuple[report.Panel, ...]

    @property
    def begin(self) -> str:
        """The marker that opens this pair's generated block (the doc holds other generated blocks)."""
        return f"<!-- BEGIN GENERATED (bench/learning/run_learning.py --pair {self.name}) -->"


PAIRS = {
    "dapo-grpo": Pair(
        arms=("grpo", "dapo"),
        name="dapo-grpo",
        markdown="ablation.md",
        figure="learning_curves.png",
        title="DAPO vs GRPO on synthetic one-digit arithmetic, tiny Qwen2 on CPU, equal generated-token budget",
        panels=(
            report.TRAIN_ACCURACY,
            VALIDATION_MEAN,
            report.ENTROPY_PANEL,
            report.RESPONSE_LENGTH_PANEL,
            report.single("Clip fraction (all clipped tokens)", "fraction of tokens", CLIPFRAC),
            report.single("Clip fraction, upper (A>0, ratio>1+eps_high)", "fraction of tokens", CLIPFRAC_EPS_HIGH),
        ),
    ),
    "skip": Pair(
        arms=("dapo", "dapo_skip"),
        name="skip",
        markdown="ablation.md",
        figure="skipping_curves.png",
        title="DAPO with and without prompt skipping, tiny Qwen2 on CPU, equal generated-token budget",
        panels=(
            report.TRAIN_ACCURACY,
            VALIDATION_MEAN,
            report.single("Keep rate (qualifying / generated groups)", "keep rate", report.KEEP_RATE),
            report.single("Skipped prompts (share of those taken)", "fraction", SKIP + "skipped_fraction"),
            report.single("Generated tokens per step", "response tokens", report.GENERATED_TOKENS),
            report.ENTROPY_PANEL,
        ),
    ),
}
ARMS = PAIRS["dapo-grpo"].arms


@dataclass
class Run:
    """One run's per-step metrics and its generation budget."""

    steps: np.ndarray  # training steps 1..N
    metrics: dict[int, dict[str, float]]  # step -> metrics (step 0: validation before training)
    generated_responses: np.ndarray  # per training step
    generated_tokens: np.ndarray  # per training step (exact when the sampler logged it, see module docstring)
    val_key: str | None = None
    wall_seconds: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def total_generated_responses(self) -> int:
        return int(self.generated_responses.sum())

    @property
    def cumulative_tokens(self) -> np.ndarray:
        return np.cumsum(self.generated_tokens)

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of ``key`` over the training steps that logged it."""
        pairs = [(s, self.metrics[s][key]) for s in self.steps if key in self.metrics.get(s, {})]
        return (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=float))

    def tokens_at(self, steps: np.ndarray) -> np.ndarray:
        """Cumulative generated tokens after each of ``steps`` (0 for step 0)."""
        cumulative = np.concatenate([[0.0], self.cumulative_tokens])
        return cumulative[np.asarray(steps, dtype=int)]

    def val_series(self) -> tuple[np.ndarray, np.ndarray]:
        if self.val_key is None:
            return np.array([]), np.array([])
        pairs = sorted((s, m[self.val_key]) for s, m in self.metrics.items() if self.val_key in m)
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=float)


def last_step(path: Path) -> int:
    return max(read_metrics(path), default=0)


def generation_budget(metrics: dict[int, dict[str, float]], steps, n: int, train_batch_size: int):
    """Per-step generated responses and tokens (see the module docstring for what is exact)."""
    responses, tokens = [], []
    for step in steps:
        m = metrics[step]
        groups = m.get("dynamic_sampling/generated_groups", train_batch_size)
        length = m.get("reward/response_length_mean", m.get("response_length/mean", 0.0))
        responses.append(groups * n)
        tokens.append(m.get("dynamic_sampling/generated_tokens", groups * n * length))
    return np.array(responses, dtype=float), np.array(tokens, dtype=float)


def load_run(path: Path, n: int, train_batch_size: int) -> Run:
    metrics = read_metrics(path)
    steps = np.array(sorted(s for s in metrics if s > 0 and "actor/entropy" in metrics[s]))
    responses, tokens = generation_budget(metrics, steps, n, train_batch_size)
    keys = {k for m in metrics.values() for k in m}
    val_key = next((k for pattern in VAL_PATTERNS for k in sorted(keys) if pattern.match(k)), None)
    wall = Path(path).parent / "wall_seconds.txt"
    return Run(steps, metrics, responses, tokens, val_key,
               float(wall.read_text()) if wall.exists() else None)


moving_average = report.moving_average


def final_figures(run: Run, last: int = 5) -> dict[str, float]:
    """The table row of one run: budget, validation start/end, and the mean of the last ``last`` steps."""
    def tail(key):
        _, values = run.series(key)
        return float(values[-last:].mean()) if len(values) else float("nan")

    def head(key):
        _, values = run.series(key)
        return float(values[:last].mean()) if len(values) else float("nan")

    def overall(key):
        _, values = run.series(key)
        return float(np.nanmean(values)) if values.size else float("nan")

    val_steps, val_values = run.val_series()
    return {
        "steps": int(run.steps[-1]) if len(run.steps) else 0,
        "generated_responses": run.total_generated_responses,
        "generated_tokens": float(run.generated_tokens.sum()),
        "val_start": float(val_values[0]) if len(val_values) and val_steps[0] == 0 else float("nan"),
        "val_end": float(val_values[-1]) if len(val_values) else float("nan"),
        "train_acc_first": head("reward/acc_mean"),
        "train_acc_last": tail("reward/acc_mean"),
        "entropy_first": head("actor/entropy"),
        "entropy_last": tail("actor/entropy"),
        "length_last": tail("response_length/mean"),
        "clipfrac_mean": overall("actor/pg_clipfrac"),
        "clipfrac_high_mean": overall("actor/pg_clipfrac_eps_high"),
        "wall_seconds": run.wall_seconds if run.wall_seconds is not None else float("nan"),
    }


def plot(runs: dict[tuple[str, int], Run], out: Path, smooth: int = 5, pair: Pair = PAIRS["dapo-grpo"]) -> None:
    """The pair's panels with the run report's drawing: one colour per arm, one line style per seed."""
    seeds = sorted({seed for _, seed in runs})
    styles = ["-", "--", ":", "-."]
    curves = [
        report.Run(
            name=f"{LABELS[arm]}, seed {seed}",
            metrics=run.metrics,
            colour=COLOURS[arm],
            style={"linestyle": styles[seeds.index(seed) % len(styles)]},
            tokens=dict(zip([0, *run.steps.tolist()], run.tokens_at([0, *run.steps.tolist()]).tolist())),
        )
        for (arm, seed), run in sorted(runs.items())
    ]
    title = f"{pair.title} (thin: per step, thick: trailing mean of {smooth} steps)"
    figure = report.build_figure(curves, pair.panels, axis="tokens", smooth=smooth, title=title)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)


def results_table(runs: dict[tuple[str, int], Run]) -> str:
    header = (
        "| arm | seed | steps | generated responses | generated tokens | val acc start -> end | "
        "train acc first 5 -> last 5 steps | entropy first 5 -> last 5 | length, last 5 | clipfrac | "
        "clipfrac high | wall (s) |"
    )
    return _table(header, runs, ARMS, lambda arm, seed, run: final_figures(run), _row)


def _table(header: str, runs: dict[tuple[str, int], Run], arms, figures, row) -> str:
    """A Markdown table: one ``row`` of ``figures(arm, seed, run)`` per run (arms in order, then seeds), then the
    mean row of each arm that has several seeds."""
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    rows: dict[str, list[dict]] = {}
    for (arm, seed), run in sorted(runs.items(), key=lambda item: (arms.index(item[0][0]), item[0][1])):
        f = figures(arm, seed, run)
        rows.setdefault(arm, []).append(f)
        lines.append(row(LABELS[arm], str(seed), f))
    if any(len(r) > 1 for r in rows.values()):
        for arm, figs in rows.items():
            with warnings.catch_warnings():  # a figure no seed of the arm has (skips of the baseline) stays nan
                warnings.simplefilter("ignore", RuntimeWarning)
                mean = {k: float(np.nanmean([f[k] for f in figs])) for k in figs[0]}
            lines.append(row(f"**{LABELS[arm]}**", f"mean of {len(figs)}", mean))
    return "\n".join(lines)


def _row(arm: str, seed: str, f: dict) -> str:
    return (
        f"| {arm} | {seed} | {f['steps']:.0f} | {f['generated_responses']:.0f} | {f['generated_tokens']:.0f} | "
        f"{f['val_start']:.3f} -> {f['val_end']:.3f} | {f['train_acc_first']:.3f} -> {f['train_acc_last']:.3f} | "
        f"{f['entropy_first']:.3f} -> {f['entropy_last']:.3f} | {f['length_last']:.1f} | {f['clipfrac_mean']:.4f} | "
        f"{f['clipfrac_high_mean']:.4f} | {f['wall_seconds']:.0f} |"
    )


def val_at_tokens(run: Run, budget: float) -> tuple[float, float]:
    """(validation accuracy, generated tokens) at the last validation within ``budget`` generated tokens."""
    steps, values = run.val_series()
    tokens = run.tokens_at(steps) if len(steps) else np.array([])
    within = np.flatnonzero(tokens <= budget * (1 + 1e-9))
    if not within.size:
        return float("nan"), float("nan")
    return float(values[within[-1]]), float(tokens[within[-1]])


def val_at_step(run: Run, step: int) -> tuple[float, float]:
    """(validation accuracy, generated tokens) at the last validation at or before training step ``step``."""
    steps, values = run.val_series()
    before = np.flatnonzero(steps <= step)
    if not before.size:
        return float("nan"), float("nan")
    return float(values[before[-1]]), float(run.tokens_at(steps[before[-1:]])[0])


def skipping_figures(run: Run, budget: float, baseline_steps: int) -> dict[str, float]:
    """A skip-pair table row: the common figures, validation at the budget and at the baseline's step count, skips."""
    figures = final_figures(run)
    figures["val_at_budget"], figures["tokens_at_budget"] = val_at_tokens(run, budget)
    figures["val_at_steps"], figures["tokens_at_steps"] = val_at_step(run, baseline_steps)
    _, keep = run.series("dynamic_sampling/keep_rate")
    figures["keep_rate_mean"] = float(keep.mean()) if keep.size else float("nan")
    last = run.metrics.get(int(run.steps[-1]), {}) if len(run.steps) else {}
    figures["skipped_prompts"] = float(last.get(SKIP + "total_skipped_prompts", 0.0))
    after = last.get(SKIP + "total_generated_after_skip", 0.0)
    figures["later_qualified"] = last.get(SKIP + "total_qualified_after_skip", 0.0) / after if after else float("nan")
    return figures


def skipping_table(runs: dict[tuple[str, int], Run], pair: Pair = PAIRS["skip"]) -> str:
    """Per arm and seed, and the mean per arm: both arms at the baseline's generated tokens and at its step count."""
    baseline, _ = pair.arms
    header = (
        "| arm | seed | steps | generated tokens | val acc start | val acc at equal steps (tokens) | "
        "val acc at equal tokens (tokens) | train acc last 5 steps | keep rate | skipped prompts | "
        "skipped, later qualified | wall (s) |"
    )

    def figures(arm: str, seed: int, run: Run) -> dict[str, float]:
        reference = runs.get((baseline, seed), run)
        return skipping_figures(run, float(reference.generated_tokens.sum()), int(reference.steps[-1]))

    return _table(header, runs, pair.arms, figures, _skipping_row)


def _skipping_row(arm: str, seed: str, f: dict) -> str:
    return (
        f"| {arm} | {seed} | {f['steps']:.0f} | {f['generated_tokens']:.0f} | {f['val_start']:.3f} | "
        f"{f['val_at_steps']:.3f} ({f['tokens_at_steps']:.0f}) | {f['val_at_budget']:.3f} ({f['tokens_at_budget']:.0f}) | "
        f"{f['train_acc_last']:.3f} | {f['keep_rate_mean']:.3f} | {f['skipped_prompts']:.0f} | "
        f"{f['later_qualified']:.2f} | {f['wall_seconds']:.0f} |"
    )


def load_runs(work_dir: Path, seeds, n: int, train_batch_size: int, pair: Pair) -> dict[tuple[str, int], Run]:
    runs = {}
    for arm in pair.arms:
        for seed in seeds:
            path = Path(work_dir) / f"{arm}_s{seed}" / "metrics.jsonl"
            if path.exists():
                runs[(arm, seed)] = load_run(path, n, train_batch_size)
    if not runs:
        raise FileNotFoundError(f"no runs of {pair.arms} under {work_dir}")
    return runs


def write_outputs(
    work_dir: Path, docs_dir: Path, seeds, n: int, train_batch_size: int, command: str, pair: Pair = PAIRS["dapo-grpo"]
) -> None:
    """The pair's figure and the generated part of its markdown file (text outside the markers is kept)."""
    runs = load_runs(work_dir, seeds, n, train_batch_size, pair)
    plot(runs, Path(docs_dir) / pair.figure, pair=pair)
    commands = "\n".join(
        f"# {arm} seed {seed}\n" + (Path(work_dir) / f"{arm}_s{seed}" / "command.txt").read_text().strip()
        for arm, seed in sorted(runs)
        if (Path(work_dir) / f"{arm}_s{seed}" / "command.txt").exists()
    )
    generated = "\n".join(
        [
            pair.begin,
            f"![learning curves]({pair.figure})",
            "",
            "Made by:",
            "",
            "```bash",
            command,
            "```",
            "",
            results_table(runs) if pair is PAIRS["dapo-grpo"] else skipping_table(runs, pair),
            "",
            "<details><summary>The training commands it ran</summary>",
            "",
            "```bash",
            commands.replace(str(Path(work_dir).resolve().parents[1]) + "/", ""),
            "```",
            "</details>",
            END,
        ]
    )
    write_block(Path(docs_dir) / pair.markdown, pair.begin, generated, pair.title)
