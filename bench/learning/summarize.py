"""Read the runs of run_learning.py (verl's ``file`` logger JSONL), plot them and write the results table.

Each JSONL line is ``{"step": N, "data": {metric: value}}`` (verl.utils.tracking.FileLogger); step 0 holds
the validation before training. The curves:

    train reward    reward/acc_mean: accuracy over *every* response generated in the step, before the
                    dynamic-sampling filter (so both arms are measured on the same population)
    val reward      val/<source>/mean@k (recipe metric), falling back to verl's val-core/<source>/acc/mean@k
    entropy         actor/entropy (old-policy token entropy of the trained batch)
    length          response_length/mean (trained batch)
    clip fractions  actor/pg_clipfrac, actor/pg_clipfrac_eps_high (ratio above 1 + eps_high, A > 0)

Generated tokens (the x axis and the budget): ``dynamic_sampling/generated_tokens`` when the run logged it
(every response token of every round, kept or dropped: exact). Older runs: generated responses x mean
response length, where generated responses = ``dynamic_sampling/generated_groups`` x n (``train_batch_size``
x n when the sampler logged nothing) and the mean length is ``reward/response_length_mean`` (over every
generated response) or else ``response_length/mean`` of the trained batch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ARMS = ("grpo", "dapo")
COLOURS = {"grpo": "tab:blue", "dapo": "tab:red"}
LABELS = {"grpo": "GRPO baseline", "dapo": "DAPO (recipe defaults)"}
BEGIN, END = "<!-- BEGIN GENERATED (bench/learning/run_learning.py) -->", "<!-- END GENERATED -->"
VAL_PATTERNS = (re.compile(r"^val/[^/]+/mean@\d+$"), re.compile(r"^val-core/[^/]+/acc/mean@\d+$"))


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


def read_jsonl(path: Path) -> dict[int, dict[str, float]]:
    """step -> merged metrics (a step may be logged in several lines)."""
    metrics: dict[int, dict[str, float]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            metrics.setdefault(int(row["step"]), {}).update(row["data"])
    return metrics


def last_step(path: Path) -> int:
    return max(read_jsonl(path), default=0)


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
    metrics = read_jsonl(path)
    steps = np.array(sorted(s for s in metrics if s > 0 and "actor/entropy" in metrics[s]))
    responses, tokens = generation_budget(metrics, steps, n, train_batch_size)
    keys = {k for m in metrics.values() for k in m}
    val_key = next((k for pattern in VAL_PATTERNS for k in sorted(keys) if pattern.match(k)), None)
    wall = Path(path).parent / "wall_seconds.txt"
    return Run(steps, metrics, responses, tokens, val_key,
               float(wall.read_text()) if wall.exists() else None)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` points (shorter at the start), same length as ``values``."""
    values = np.asarray(values, dtype=float)
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (cumulative[idx] - cumulative[lo]) / (idx - lo)


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


def plot(runs: dict[tuple[str, int], Run], out: Path, smooth: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("reward/acc_mean", "train accuracy (all generated responses)"),
        ("val", "validation accuracy (mean@4, T=1)"),
        ("actor/entropy", "entropy of the trained batch (nats/token)"),
        ("response_length/mean", "mean response length (tokens)"),
        ("actor/pg_clipfrac", "clip fraction (all clipped tokens)"),
        ("actor/pg_clipfrac_eps_high", "clip fraction, upper bound (A>0, ratio>1+eps_high)"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    seeds = sorted({seed for _, seed in runs})
    styles = ["-", "--", ":", "-."]
    for ax, (key, title) in zip(axes.flat, panels):
        for (arm, seed), run in sorted(runs.items()):
            style = dict(color=COLOURS[arm], linestyle=styles[seeds.index(seed) % len(styles)])
            label = f"{LABELS[arm]}, seed {seed}"
            if key == "val":
                steps, values = run.val_series()
                ax.plot(run.tokens_at(steps) / 1e3, values, marker="o", label=label, **style)
                continue
            steps, values = run.series(key)
            if not len(steps):
                continue
            x = run.tokens_at(steps) / 1e3
            ax.plot(x, values, alpha=0.25, linewidth=0.8, color=style["color"], linestyle=style["linestyle"])
            ax.plot(x, moving_average(values, smooth), label=label, **style)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("generated tokens (thousands)")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(
        "DAPO vs GRPO on synthetic one-digit arithmetic, tiny Qwen2 on CPU, equal generated-token budget "
        f"(thin: per step, thick: trailing mean of {smooth} steps)",
        fontsize=11,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def results_table(runs: dict[tuple[str, int], Run]) -> str:
    header = (
        "| arm | seed | steps | generated responses | generated tokens | val acc start -> end | "
        "train acc first 5 -> last 5 steps | entropy first 5 -> last 5 | length, last 5 | clipfrac | "
        "clipfrac high | wall (s) |"
    )
    lines = [header, "|" + "---|" * 12]
    rows: dict[str, list[dict]] = {}
    for (arm, seed), run in sorted(runs.items(), key=lambda item: (ARMS.index(item[0][0]), item[0][1])):
        f = final_figures(run)
        rows.setdefault(arm, []).append(f)
        lines.append(_row(LABELS[arm], str(seed), f))
    if any(len(r) > 1 for r in rows.values()):
        for arm, figs in rows.items():
            mean = {k: float(np.nanmean([f[k] for f in figs])) for k in figs[0]}
            lines.append(_row(f"**{LABELS[arm]}**", f"mean of {len(figs)}", mean))
    return "\n".join(lines)


def _row(arm: str, seed: str, f: dict) -> str:
    return (
        f"| {arm} | {seed} | {f['steps']:.0f} | {f['generated_responses']:.0f} | {f['generated_tokens']:.0f} | "
        f"{f['val_start']:.3f} -> {f['val_end']:.3f} | {f['train_acc_first']:.3f} -> {f['train_acc_last']:.3f} | "
        f"{f['entropy_first']:.3f} -> {f['entropy_last']:.3f} | {f['length_last']:.1f} | {f['clipfrac_mean']:.4f} | "
        f"{f['clipfrac_high_mean']:.4f} | {f['wall_seconds']:.0f} |"
    )


def write_outputs(work_dir: Path, docs_dir: Path, seeds, n: int, train_batch_size: int, command: str) -> None:
    """learning_curves.png and the generated part of results.md (text outside the markers is kept)."""
    runs = {}
    for arm in ARMS:
        for seed in seeds:
            path = Path(work_dir) / f"{arm}_s{seed}" / "metrics.jsonl"
            if path.exists():
                runs[(arm, seed)] = load_run(path, n, train_batch_size)
    if not runs:
        raise FileNotFoundError(f"no runs under {work_dir}")
    plot(runs, Path(docs_dir) / "learning_curves.png")
    commands = "\n".join(
        f"# {arm} seed {seed}\n" + (Path(work_dir) / f"{arm}_s{seed}" / "command.txt").read_text().strip()
        for arm, seed in sorted(runs)
        if (Path(work_dir) / f"{arm}_s{seed}" / "command.txt").exists()
    )
    generated = "\n".join(
        [
            BEGIN,
            "![learning curves](learning_curves.png)",
            "",
            "Made by:",
            "",
            "```bash",
            command,
            "```",
            "",
            results_table(runs),
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
    results = Path(docs_dir) / "results.md"
    text = results.read_text() if results.exists() else f"# DAPO vs GRPO on CPU: does the recipe learn?\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + generated + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    results.write_text(text)
