"""A run report: a PNG dashboard and a short markdown summary from the metrics files of one or several runs.

    python -m recipe_dapo.report RUN [RUN ...] [--out DIR] [--x step|tokens] [--smooth N]

``RUN`` is a run folder (its metrics JSONL is found in it or one folder down, e.g. ``WORK_DIR`` of
``scripts/run_dapo_cpu.sh`` holds ``recipe_dapo/dapo_cpu.jsonl``) or the JSONL itself. The report writes
``run_report.png`` and ``run_report.md`` into ``--out`` (default: the first run's folder) and prints both paths
(without matplotlib, only the markdown, and the one command that adds the plots).
Several runs share the axes, one colour per run: by training step, or with ``--x tokens`` by cumulative generated
tokens (every response token generated, kept or filtered: the cost of dynamic sampling). ``--smooth N`` adds a
trailing mean of N steps over thin per-step lines.

The panels (:data:`PANELS`) and the metrics each reads; a panel whose metrics no run logged says "not logged":

    training accuracy    reward/acc_mean (every response generated in the step, before the filter)
    validation           val/<source>/mean@k and the largest pass@j (verl's val-core/... when absent)
    keep rate, rounds    dynamic_sampling/keep_rate, dynamic_sampling/num_gen_rounds (right axis)
    tokens per step      dynamic_sampling/generated_tokens; trained: training/response_tokens (tokens that carried
                         loss, counted after the overlong filter), as the end-of-run console line counts it
    entropy              actor/entropy
    clip fractions       actor/pg_clipfrac_eps_low, actor/pg_clipfrac_eps_high, actor/pg_clipfrac_lower (dual clip)
    response length      response_length/mean (trained batch)
    overlong share       overlong/truncated_ratio (all generated), overlong/filtered_ratio (dropped from the loss)
    step time            timing_s/gen, and timing_s/step less it
    policy lag           policy_lag/stale_group_frac (groups an older policy generated), and the mean |log w| of the
                         behaviour weights pi_old / pi_rollout at lag 0 and 1 (right axis; recipe_dapo.policy_lag)

Names are imported from the modules that log them; verl's own (entropy, response length, timing) are spelled here.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from recipe_dapo.tracking.console import format_validation, number, validation_headlines
from recipe_dapo.loss.clip import CLIPFRAC_DUAL, CLIPFRAC_EPS_HIGH, CLIPFRAC_EPS_LOW
from recipe_dapo.overlong.metrics import FILTERED_RATIO, TRUNCATED_RATIO
from recipe_dapo.policy_lag.names import STALE_GROUP_FRAC, lag_key
from recipe_dapo.reward.metrics import ACC_MEAN
from recipe_dapo.tracking.run_log import SUPERSEDED_SUFFIX, read_metrics

from recipe_dapo.dynamic_sampling.sampler import GENERATED_TOKENS, KEEP_RATE, NUM_GEN_ROUNDS
from recipe_dapo.dynamic_sampling.selection import LENGTH_KS, LENGTH_SHIFT, RECYCLED
from recipe_dapo.run.step_metrics import (
    ENTROPY,
    GEN_TIME,
    RESPONSE_LENGTH_MEAN,
    RESPONSE_TOKENS_METRIC,
    STEP_TIME,
    VALIDATION_TIME,
)

REPORT_PNG, REPORT_MD = "run_report.png", "run_report.md"
MATPLOTLIB = "matplotlib>=3.7"
"""The plots' one requirement (setup.py's install_requires holds the same: every install draws)."""


def install_hint() -> str:
    """The one command that adds the plots to the environment this report runs in (its own interpreter's pip)."""
    python = sys.executable or "python"
    relative = os.path.relpath(python)
    shown = relative if not relative.startswith("..") else python
    return f"{shown} -m pip install '{MATPLOTLIB}'"


INSTALL_HINT = "the run report's plots need matplotlib, which this environment lacks"

Reader = Callable[[Mapping[str, Any]], Optional[float]]


class ReportError(Exception):
    """A run the report cannot read; the command line prints it as one line."""


class MissingMatplotlib(ReportError, ImportError):
    """matplotlib is not installed (every install of the recipe has it; an environment made otherwise may not)."""

    markdown: Optional[Path] = None
    """The summary written without the plots."""


# ----------------------------------------------------------------------------------------------- runs


def metric(key: str) -> Reader:
    """A reader of one logged metric (None when the step did not log it or it is not a number)."""
    return lambda metrics: number(metrics.get(key))


# Response tokens that carried loss (the trainers count them after the overlong filter).
trained_tokens = metric(RESPONSE_TOKENS_METRIC)


def time_besides_generation(metrics: Mapping[str, Any]) -> Optional[float]:
    step, gen = number(metrics.get(STEP_TIME)), number(metrics.get(GEN_TIME))
    return None if step is None or gen is None else step - gen


@dataclass
class Run:
    """One run's metrics (step -> {metric: value}) and how its lines look."""

    name: str
    metrics: dict[int, dict[str, Any]]
    path: Optional[Path] = None
    colour: Optional[str] = None
    style: dict = field(default_factory=dict)  # plot keywords for every line of the run (e.g. a linestyle per seed)
    tokens: Optional[dict[int, float]] = None  # cumulative generated tokens after each step; from the metrics if None

    @property
    def training_steps(self) -> list[int]:
        """Steps that logged training metrics (validation-only records, e.g. before training at step 0, are not)."""
        return sorted(step for step, data in self.metrics.items() if any(not _is_validation(key) for key in data))

    def series(self, read: Reader) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) over the steps where ``read`` finds a finite-or-not number."""
        pairs = [(step, read(self.metrics[step])) for step in sorted(self.metrics)]
        pairs = [(step, value) for step, value in pairs if value is not None]
        return np.array([p[0] for p in pairs], dtype=int), np.array([p[1] for p in pairs], dtype=float)

    def total(self, read: Reader) -> Optional[float]:
        _, values = self.series(read)
        return float(values.sum()) if values.size else None

    def cumulative_tokens(self) -> dict[int, float]:
        """Generated tokens after each step (0 at step 0), summed from ``dynamic_sampling/generated_tokens``."""
        if self.tokens is not None:
            return self.tokens
        steps, values = self.series(metric(GENERATED_TOKENS))
        if not steps.size:
            raise ReportError(f"{self.name}: --x tokens needs {GENERATED_TOKENS}, which this run did not log")
        per_step = dict(zip(steps.tolist(), values.tolist()))
        cumulative, total = {0: 0.0}, 0.0
        for step in sorted(set(self.metrics) | {0}):
            total += per_step.get(step, 0.0)
            cumulative[step] = total
        self.tokens = cumulative
        return cumulative

    def x(self, steps: np.ndarray, axis: str) -> np.ndarray:
        if axis == "step":
            return np.asarray(steps, dtype=float)
        cumulative = self.cumulative_tokens()
        return np.array([cumulative.get(int(step), np.nan) for step in steps], dtype=float)


def _is_validation(key: str) -> bool:
    return key.split("/", 1)[0] in ("val", "val-core", "val-aux")


def is_metrics_file(path: Path) -> bool:
    """Whether a JSONL file is a metrics file (verl's file logger: ``{"step": N, "data": {...}}`` per line), and not,
    say, an evaluation's generations beside the run (``--out runs/dapo_cpu/eval``); an empty file counts as one."""
    import json

    try:
        with open(path, encoding="utf-8") as stream:
            first = stream.readline().strip()
        if not first:
            return True
        line = json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(line, dict) and "step" in line and isinstance(line.get("data"), dict)


def find_metrics_file(path: str | Path) -> Path:
    """The run's metrics JSONL: ``path`` itself, or the one JSONL in the folder or one folder down."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise ReportError(f"{path}: no such file or folder")
    for pattern in ("*.jsonl", "*/*.jsonl"):
        found = sorted(p for p in path.glob(pattern) if not p.name.endswith(SUPERSEDED_SUFFIX) and is_metrics_file(p))
        if len(found) == 1:
            return found[0]
        if found:
            raise ReportError(f"{path}: several metrics files ({', '.join(map(str, found))}); pass one of them")
    raise ReportError(f"{path}: no metrics file (*.jsonl) in the folder or one folder down")


def load_run(path: str | Path, name: Optional[str] = None) -> Run:
    """A run from its folder or metrics file (named after the folder given, or the file)."""
    file = find_metrics_file(path)
    metrics = read_metrics(file)
    if not metrics:
        raise ReportError(f"{file}: no metrics record in it")
    if name is None:  # bench/learning's runs are <arm>_s<seed>/metrics.jsonl
        name = Path(path).name if Path(path).is_dir() else file.parent.name if file.stem == "metrics" else file.stem
    return Run(name=name, metrics=metrics, path=file)


# ----------------------------------------------------------------------------------------------- panels


@dataclass(frozen=True)
class Curve:
    """One line of a panel, drawn for every run that logged it."""

    label: str  # what this line style stands for in the panel's own legend ("" for a panel of one curve)
    read: Reader
    keys: tuple[str, ...]  # the metrics it reads (the "not logged" text names them)
    linestyle: str = "-"
    marker: Optional[str] = None
    right: bool = False  # against the panel's second y axis


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    curves: tuple[Curve, ...] | Callable[[Sequence[Run]], tuple[Curve, ...]]
    right_ylabel: str = ""
    ymin: Optional[float] = None  # e.g. 0 for counts and fractions, so an all-zero line sits on the floor

    def curves_for(self, runs: Sequence[Run]) -> tuple[Curve, ...]:
        return self.curves(runs) if callable(self.curves) else self.curves


def single(title: str, ylabel: str, key: str, ymin: Optional[float] = None) -> Panel:
    """A panel of one logged metric."""
    return Panel(title, ylabel, (Curve("", metric(key), (key,)),), ymin=ymin)


def validation_curves(runs: Sequence[Run], passes: bool = True) -> tuple[Curve, ...]:
    """Per data source: mean@k (solid) and the largest pass@j (dashed), the console's validation headline."""
    names: dict[tuple[str, str], None] = {}
    for run in runs:
        for data in run.metrics.values():
            for source, values in validation_headlines(data).items():
                names.update({(source, name): None for name in values if name != "num_problems"})
    sources = list(dict.fromkeys(source for source, _ in names))
    markers = "osD^v<>p"
    curves = []
    for source, name in names:
        if "pass@" in name and not passes:
            continue
        read = lambda data, source=source, name=name: validation_headlines(data).get(source, {}).get(name)  # noqa: E731
        curves.append(Curve(f"{source} {name}", read, (f"val/{source}/{name}",), "--" if "pass@" in name else "-",
                            markers[sources.index(source) % len(markers)]))
    return tuple(curves) or (Curve("", lambda data: None, ("val/<source>/mean@k", "pass@k")),)


TRAIN_ACCURACY = single("Training accuracy (all generated responses)", "accuracy", ACC_MEAN)
VALIDATION = Panel("Validation per data source", "accuracy", validation_curves)
KEEP_RATE_AND_ROUNDS = Panel(
    "Keep rate and generation rounds per step",
    "keep rate (qualifying / generated groups)",
    (
        Curve("keep rate (left)", metric(KEEP_RATE), (KEEP_RATE,)),
        Curve("rounds (right)", metric(NUM_GEN_ROUNDS), (NUM_GEN_ROUNDS,), linestyle=":", marker=".", right=True),
    ),
    right_ylabel="generation rounds",
    ymin=0.0,
)
TOKENS = Panel(
    "Generated vs trained tokens per step",
    "response tokens",
    (
        Curve("generated (kept or filtered)", metric(GENERATED_TOKENS), (GENERATED_TOKENS,)),
        Curve("trained (carried loss)", trained_tokens, (RESPONSE_TOKENS_METRIC,), linestyle="--"),
    ),
    ymin=0.0,
)
ENTROPY_PANEL = single("Entropy of the trained batch", "nats / token", ENTROPY)
CLIP_FRACTIONS = Panel(
    "Clip fractions",
    "fraction of tokens",
    (
        Curve("low (A<0, r<1-eps_low)", metric(CLIPFRAC_EPS_LOW), (CLIPFRAC_EPS_LOW,)),
        Curve("high (A>0, r>1+eps_high)", metric(CLIPFRAC_EPS_HIGH), (CLIPFRAC_EPS_HIGH,), linestyle="--"),
        Curve("dual (A<0, r>c)", metric(CLIPFRAC_DUAL), (CLIPFRAC_DUAL,), linestyle=":"),
    ),
    ymin=0.0,
)
RESPONSE_LENGTH_PANEL = single("Response length (trained batch)", "tokens", RESPONSE_LENGTH_MEAN)
OVERLONG = Panel(
    "Overlong share",
    "fraction of responses",
    (
        Curve("truncated (all generated)", metric(TRUNCATED_RATIO), (TRUNCATED_RATIO,)),
        Curve("filtered from the loss", metric(FILTERED_RATIO), (FILTERED_RATIO,), linestyle="--"),
    ),
    ymin=0.0,
)
STEP_TIME_PANEL = Panel(
    "Step time",
    "seconds",
    (
        Curve("generation", metric(GEN_TIME), (GEN_TIME,)),
        Curve("rest of the step", time_besides_generation, (STEP_TIME, GEN_TIME), linestyle="--"),
    ),
    ymin=0.0,
)
LAG0_LOG_WEIGHT, LAG1_LOG_WEIGHT = (lag_key(lag, "log_is_weight_abs_mean") for lag in (0, 1))
POLICY_LAG_PANEL = Panel(
    "Policy lag: stale groups and the behaviour weights",
    "share of trained groups",
    (
        Curve("stale groups (lag >= 1, left)", metric(STALE_GROUP_FRAC), (STALE_GROUP_FRAC,)),
        Curve("mean |log w|, lag 0 (right)", metric(LAG0_LOG_WEIGHT), (LAG0_LOG_WEIGHT,), linestyle=":", right=True),
        Curve("mean |log w|, lag 1 (right)", metric(LAG1_LOG_WEIGHT), (LAG1_LOG_WEIGHT,), linestyle="--",
              right=True),
    ),
    right_ylabel="|log pi_old / pi_rollout|",
    ymin=0.0,
)
SELECTION_PANEL = Panel(
    "What was trained against what finished",
    "KS distance, relative shift",
    (
        Curve("response-length KS distance", metric(LENGTH_KS), (LENGTH_KS,)),
        Curve("trained / finished mean length - 1", metric(LENGTH_SHIFT), (LENGTH_SHIFT,), linestyle="--"),
        Curve("recycled responses trained (right)", metric(RECYCLED), (RECYCLED,), linestyle=":", right=True),
    ),
    right_ylabel="responses",
)
PANELS = (
    TRAIN_ACCURACY, VALIDATION, KEEP_RATE_AND_ROUNDS,
    TOKENS, ENTROPY_PANEL, CLIP_FRACTIONS,
    RESPONSE_LENGTH_PANEL, OVERLONG, STEP_TIME_PANEL,
    POLICY_LAG_PANEL, SELECTION_PANEL,
)  # fmt: skip


# ----------------------------------------------------------------------------------------------- drawing


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` points (shorter at the start), same length as ``values``."""
    values = np.asarray(values, dtype=float)
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(idx - window, 0)
    return (cumulative[idx] - cumulative[lo]) / (idx - lo)


def draw_panel(ax, panel: Panel, runs: Sequence[Run], axis: str = "step", smooth: int = 1) -> None:
    """One panel on ``ax``: each curve for each run that logged it, "not logged" where none did."""
    from matplotlib.lines import Line2D

    curves = panel.curves_for(runs)
    right = ax.twinx() if any(curve.right for curve in curves) else None
    missing = []
    for curve in curves:
        target = right if curve.right else ax
        drawn = False
        for run in runs:
            steps, values = run.series(curve.read)
            if not steps.size:
                continue
            drawn = True
            x = run.x(steps, axis)
            style = {"color": run.colour, "linestyle": curve.linestyle, "marker": curve.marker, "markersize": 4,
                     **run.style}
            if smooth > 1 and curve.marker is None and values.size > 1:
                target.plot(x, values, alpha=0.25, linewidth=0.8, **style)
                target.plot(x, moving_average(values, smooth), **style)
            else:
                target.plot(x, values, **style)
        if not drawn:
            missing.append(curve)
    ax.set_title(panel.title, fontsize=11)
    ax.set_ylabel(panel.ylabel, fontsize=9)
    ax.grid(alpha=0.3)
    for target in (ax, right) if right is not None else (ax,):
        low, high = target.get_ylim()
        if high - low < 1e-6 * max(1.0, abs(low), abs(high)):  # a flat line: a readable range, not "1e-12+0.7"
            pad = 0.05 * max(1.0, abs(high))
            target.set_ylim(low - pad, high + pad)
    if right is not None:
        right.set_ylabel(panel.right_ylabel, fontsize=9)
    if panel.ymin is not None:
        for target in (ax, right) if right is not None else (ax,):
            top = max(target.get_ylim()[1], panel.ymin + 1e-3)
            target.set_ylim(bottom=panel.ymin - 0.02 * (top - panel.ymin), top=top)  # a line at ymin stays visible
    if len(missing) == len(curves):
        keys = "\n".join(key for curve in curves for key in curve.keys)
        ax.text(0.5, 0.5, f"not logged\n({keys})", transform=ax.transAxes, ha="center", va="center",
                color="grey", fontsize=10)
        return
    if missing:
        labels = ", ".join(curve.label or "/".join(curve.keys) for curve in missing)
        ax.text(0.01, 0.01, f"not logged: {labels}", transform=ax.transAxes, fontsize=7, color="grey", va="bottom")
    if len(curves) > 1:
        handles = [Line2D([], [], color="black", linestyle=c.linestyle, marker=c.marker, markersize=4, label=c.label)
                   for c in curves if c not in missing]
        (right or ax).legend(handles=handles, fontsize=7, loc="best", framealpha=0.8, handlelength=3)


def build_figure(runs: Sequence[Run], panels: Sequence[Panel] = PANELS, axis: str = "step", smooth: int = 1,
                 title: Optional[str] = None, ncols: int = 3):
    """The dashboard as a matplotlib ``Figure`` (Agg canvas): one panel per entry of ``panels``, shared x axis."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import EngFormatter
    except ImportError as error:
        raise MissingMatplotlib(INSTALL_HINT) from error
    if axis not in ("step", "tokens"):
        raise ReportError(f"--x must be 'step' or 'tokens', got {axis!r}")
    for index, run in enumerate(runs):
        run.colour = run.colour or f"C{index % 10}"
    nrows = math.ceil(len(panels) / ncols)
    figure = Figure(figsize=(5.4 * ncols, 3.9 * nrows + 0.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(nrows, ncols, sharex=True, squeeze=False).flat)
    for ax, panel in zip(axes, panels):
        draw_panel(ax, panel, runs, axis, smooth)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax in axes[: len(panels)]:
        if axis == "tokens":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        if ax.get_subplotspec().is_last_row() or not _below_is_drawn(ax, len(panels), ncols):
            ax.set_xlabel("training step" if axis == "step" else "generated tokens (cumulative)", fontsize=9)
            ax.xaxis.set_tick_params(labelbottom=True)
    x_name = "training step" if axis == "step" else "generated tokens"
    figure.suptitle(title or f"Run report: {', '.join(run.name for run in runs)} (by {x_name})", fontsize=13)
    handles = [Line2D([], [], color=run.colour, label=run.name, linewidth=2, **run.style) for run in runs]
    figure.legend(handles=handles, loc="outside lower center", ncols=min(len(runs), 4), fontsize=10)
    return figure


def _below_is_drawn(ax, num_panels: int, ncols: int) -> bool:
    """Whether the grid cell under ``ax`` holds a panel (else ``ax`` is the lowest of its column)."""
    spec = ax.get_subplotspec()
    return (spec.rowspan.start + 1) * ncols + spec.colspan.start < num_panels


# ----------------------------------------------------------------------------------------------- summary


def run_figures(run: Run) -> dict[str, Any]:
    """What the summary says about one run (each None when the run did not log what it needs)."""
    steps = run.training_steps
    acc_steps, acc = run.series(metric(ACC_MEAN))
    _, keep = run.series(metric(KEEP_RATE))
    val_steps = [step for step in sorted(run.metrics) if validation_headlines(run.metrics[step])]
    step_time, val_time = run.total(metric(STEP_TIME)), run.total(metric(VALIDATION_TIME))
    best = int(np.argmax(acc)) if acc.size else None
    return {
        "steps": len(steps),
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "acc_final": float(acc[-1]) if acc.size else None,
        "acc_best": float(acc[best]) if best is not None else None,
        "acc_best_step": int(acc_steps[best]) if best is not None else None,
        "validation_step": val_steps[-1] if val_steps else None,
        "validation": validation_headlines(run.metrics[val_steps[-1]]) if val_steps else {},
        "keep_rate_mean": float(keep.mean()) if keep.size else None,
        "generated_tokens": run.total(metric(GENERATED_TOKENS)),
        "trained_tokens": run.total(trained_tokens),
        "time_s": None if step_time is None else step_time + (val_time or 0.0),
    }


def summary_markdown(runs: Sequence[Run], png: Optional[str], axis: str = "step") -> str:
    """The markdown summary: the dashboard (``png``; None: drawn without matplotlib, so none), then one table row
    per run."""
    picture = f"![run report]({png})" if png else f"No plots: matplotlib is not installed ({install_hint()})."
    lines = [
        f"# Run report: {', '.join(run.name for run in runs)}",
        "",
        picture,
        "",
        "| run | steps | training accuracy final / best (step) | validation, last | mean keep rate | "
        "generated tokens | trained tokens | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        f = run_figures(run)
        steps = f"{f['steps']} ({f['first_step']}-{f['last_step']})" if f["steps"] else "0"
        acc = "not logged" if f["acc_final"] is None else (
            f"{f['acc_final']:.3f} / {f['acc_best']:.3f} (step {f['acc_best_step']})")
        validation = "none" if not f["validation"] else (
            f"step {f['validation_step']}: " + format_validation(f["validation"]).replace(" | ", "; "))
        lines.append(
            f"| {run.name} | {steps} | {acc} | {validation} | {_fmt(f['keep_rate_mean'], '.3f')} | "
            f"{_fmt(f['generated_tokens'], ',.0f')} | {_trained(f)} | {_duration(f['time_s'])} |"
        )
    lines += [
        "",
        f"Training accuracy: `{ACC_MEAN}`, every response generated in a step, before the dynamic-sampling filter. "
        "Validation: per data source, mean@k and the largest pass@j. Tokens: response tokens summed over the "
        "steps, generated (kept or filtered) and trained (that carried loss). Time: training steps plus "
        f"validations (`{STEP_TIME}`, `{VALIDATION_TIME}`). The figure's x axis: "
        f"{'training step' if axis == 'step' else 'generated tokens'}.",
        "",
        "Metrics files:",
        "",
        *[f"- {run.name}: `{run.path}`" for run in runs if run.path is not None],
        "",
    ]
    return "\n".join(lines)


def _fmt(value: Optional[float], spec: str) -> str:
    return "not logged" if value is None else format(value, spec)


def _trained(f: Mapping[str, Any]) -> str:
    if f["trained_tokens"] is None:
        return "not logged"
    share = f" ({100 * f['trained_tokens'] / f['generated_tokens']:.0f}%)" if f["generated_tokens"] else ""
    return f"{f['trained_tokens']:,.0f}{share}"


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "not logged"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def write_report(paths: Sequence[str | Path], out: Optional[str | Path] = None, axis: str = "step",
                 smooth: int = 1) -> tuple[Path, Path]:
    """Read the runs, write the PNG and the markdown into ``out`` (default: the first run's folder)."""
    runs = [load_run(path) for path in paths]
    for index, run in enumerate(runs):  # one legend entry per run, even for runs of the same name
        if [r.name for r in runs[:index]].count(run.name):
            run.name = f"{run.name} ({index + 1})"
    if out is None:
        out = Path(paths[0]) if Path(paths[0]).is_dir() else runs[0].path.parent
    out = Path(out)
    png, markdown = out / REPORT_PNG, out / REPORT_MD
    try:
        figure = build_figure(runs, axis=axis, smooth=smooth)
    except MissingMatplotlib as missing:  # the summary needs no plot: write it, then say how to get the plots
        out.mkdir(parents=True, exist_ok=True)
        markdown.write_text(summary_markdown(runs, None, axis))
        missing.markdown = markdown
        raise
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=110)
    markdown.write_text(summary_markdown(runs, REPORT_PNG, axis))
    return png, markdown


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipe_dapo.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="a run folder or its metrics JSONL")
    parser.add_argument("--out", help="folder for run_report.png and run_report.md (default: the first run's folder)")
    parser.add_argument("--x", choices=("step", "tokens"), default="step",
                        help="x axis: training step, or cumulative generated tokens")
    parser.add_argument("--smooth", type=int, default=1, help="trailing mean over N steps (thin lines: per step)")
    args = parser.parse_args(argv)
    try:
        png, markdown = write_report(args.runs, args.out, args.x, args.smooth)
    except MissingMatplotlib as missing:
        print(f"wrote {missing.markdown} (no plots: {INSTALL_HINT}; to add them: {install_hint()})")
        return
    except ReportError as error:
        raise SystemExit(f"recipe_dapo.report: {error}") from None
    print(f"wrote {png}\nwrote {markdown}")


if __name__ == "__main__":
    main()
