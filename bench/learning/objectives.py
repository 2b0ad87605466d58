"""The policy objectives on CPU, under DAPO's sampler: does the objective change what the recipe learns?

Arms are the recipe's ``objective=`` presets (``recipe_dapo/config/objective/``, ``docs/objectives.md``) on top of
the ablation study's DAPO arm (``bench/learning/ablation.py``: ``ablation=none``, the same chain-arithmetic task, tiny
model, design and seeds; dynamic sampling and overlong shaping stay DAPO's), everything else
equal, each stopped at the first validation past the same generated-token budget::

    grpo          objective=grpo           clip 0.2/0.2, seq-mean-token-mean, std-normalised outcome advantages
    grpo_process  objective=grpo_process   grpo's loss with process-supervised advantages (a reward per chain step)
    dr_grpo       objective=dr_grpo        seq-mean-token-sum-norm (constant normaliser), advantages not / std
    dapo          objective=dapo           the recipe's default: clip 0.2/0.28, token-mean
    clip_cov      objective=clip_cov       DAPO's surrogate, a random share of high-covariance tokens detached
    kl_cov        objective=kl_cov         the unclipped surrogate, a KL penalty on the top-covariance tokens
    gspo          objective=gspo           (with --arms) sequence-level ratio and clip
    cispo         objective=cispo          (with --arms) clipped, detached importance weight, every token's gradient

The two GRPO presets put the k3 KL to a reference model in the loss (beta 0.04). On CPU, verl 0.9.1's FSDP2 engine
builds the reference model with ``CPUOffloadPolicy(pin_memory=True)``, which needs an accelerator ("Cannot access
accelerator device when none is available"), so those two arms run here without the KL term (``KL_FREE``:
``use_kl_loss=false``, ``kl_loss_coef=0``); every other setting is the preset's. The doc says so.

    python bench/learning/objectives.py --budget-tokens 12000  # 6 arms x 3 seeds -> docs/learning/objectives.{json,md}
    python bench/learning/objectives.py --summarize-only          # the doc again from the JSON

Per run it records the ablation's figures (validation accuracy at the budget, entropy, clip fractions), the share of
correct intermediate lines and the mean length of wrong responses. Both come from the trained rollouts each run dumps
(``trainer.rollout_data_dir``), scored after the run by the chain step scorer (``recipe_dapo.cpu.chain_task``), so
every arm has them, process or outcome supervised; the process arm's own ``process/step_right_fraction`` is recorded
beside them as a check. The doc gives each arm's mean and 95% t-interval over the seeds that finished, and the paired
differences per seed (same seed, same prompts until the runs part) for the three questions. The last line is
``RESULT ...``.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ablation  # noqa: E402  (bench/learning/ablation.py)
from ablation_report import interval, interval_side  # noqa: E402

from recipe_dapo.tracking.run_log import read_metrics  # noqa: E402

ROOT = ablation.ROOT
logger = logging.getLogger("objectives")

ARMS = ("grpo", "grpo_process", "dr_grpo", "dapo", "clip_cov", "kl_cov", "gspo", "cispo")
"""Every arm: the recipe's ``objective=`` preset of that name."""
DEFAULT_ARMS = ("grpo", "grpo_process", "dr_grpo", "dapo", "clip_cov", "kl_cov")
KL_FREE = {"grpo", "grpo_process"}
"""Presets with the KL to a reference model in the loss: run without it on CPU (the module docstring says why)."""
KL_FREE_OVERRIDES = ("actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.kl_loss_coef=0")
DEFAULT_BUDGET = 12000
TAIL_STEPS = 3
"""The rollout figures are means over the run's last ``TAIL_STEPS`` trained steps (as the entropy is)."""

QUESTIONS = (
    # (title, arm a, arm b, figure, format, what a positive difference means)
    ("Process against outcome supervision", "grpo_process", "grpo", "val_acc_end", "{:+.3f}",
     "validation accuracy"),
    ("Process against outcome supervision", "grpo_process", "grpo", "step_right", "{:+.3f}",
     "share of correct intermediate lines"),
    ("Dr.GRPO against GRPO", "dr_grpo", "grpo", "wrong_length", "{:+.2f}", "mean length of wrong responses (tokens)"),
    ("Dr.GRPO against GRPO", "dr_grpo", "grpo", "response_length_end", "{:+.2f}", "mean response length (tokens)"),
    ("Clip-Cov / KL-Cov against clip-higher", "clip_cov", "dapo", "entropy_end", "{:+.4f}", "entropy"),
    ("Clip-Cov / KL-Cov against clip-higher", "kl_cov", "dapo", "entropy_end", "{:+.4f}", "entropy"),
)
COLUMNS = (
    ("val_acc_end", "validation mean@4 at the budget", "{:.3f}"),
    ("step_right", "correct lines (trained rollouts)", "{:.3f}"),
    ("wrong_length", "wrong-response length", "{:.2f}"),
    ("response_length_end", "response length", "{:.2f}"),
    ("entropy_end", "entropy (last 3 steps)", "{:.4f}"),
    ("clipfrac_low", "clip low", "{:.4f}"),
    ("clipfrac_high", "clip high", "{:.4f}"),
)


def arm_overrides(arm: str, run_dir: Path) -> tuple[str, ...]:
    """The arm's overrides on top of the ablation study's DAPO arm (``ablation=none``)."""
    return (f"objective={arm}", *(KL_FREE_OVERRIDES if arm in KL_FREE else ()),
            f"trainer.experiment_name={arm}", f"trainer.rollout_data_dir={run_dir / 'rollouts'}")


def _tail(values: list[float]) -> float | None:
    return float(np.mean(values[-TAIL_STEPS:])) if values else None


def rollout_record(run_dir: Path, last: int) -> dict:
    """The chain step scorer's share of correct lines and the mean token length of wrong responses, per trained step
    (from the dumped rollouts of steps ``1..last``), averaged over the last ``TAIL_STEPS`` steps."""
    from recipe_dapo.cpu.chain_task import score_response

    step_right, wrong_length, wrong_share = [], [], []
    for step in range(1, last + 1):
        path = run_dir / "rollouts" / f"{step}.jsonl"
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        right = total = 0
        wrong = []
        for row in rows:
            steps = score_response(row["input"], row["output"])
            right += sum(reward > 0 for _, reward in steps)
            total += len(steps)
            if not correct(row):
                wrong.append(float(row["response_length"]))
        step_right.append(right / max(total, 1))
        wrong_share.append(len(wrong) / len(rows))
        if wrong:
            wrong_length.append(float(np.mean(wrong)))
    return {"step_right": _tail(step_right), "wrong_length": _tail(wrong_length), "wrong_share": _tail(wrong_share),
            "rollout_steps": len(step_right)}


def correct(row: dict) -> bool:
    """A dumped response's final answer is right: the reward's ``acc`` where it is dumped, else a positive score."""
    if "acc" in row and row["acc"] is not None:
        return bool(float(row["acc"]) > 0)
    return float(row["score"]) > 0


def logged_process(run_dir: Path, last: int) -> float | None:
    """The process estimator's own ``process/step_right_fraction`` (the last ``TAIL_STEPS`` steps that logged it)."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    key = "process/step_right_fraction"
    return _tail([float(metrics[s][key]) for s in sorted(metrics) if 0 < s <= last and key in metrics[s]])


def paired(study: dict, key: str, a: str, b: str) -> tuple[list[float], tuple[float, float, float]]:
    """Per seed (both arms finished, both figures present), ``a``'s figure minus ``b``'s, and the 95% t-interval."""
    by = {(r["arm"], r["seed"]): r.get(key) for r in study["runs"]}
    diffs = [by[a, s] - by[b, s] for s in study["seeds"]
             if by.get((a, s)) is not None and by.get((b, s)) is not None]
    return diffs, interval(diffs) if diffs else (math.nan,) * 3


def verdict(stats, pairs: int, a: str, b: str, what: str) -> str:
    """One sentence from the paired interval: a difference only where the interval (of two or more seeds) excludes
    zero."""
    side = interval_side(stats, pairs)
    if side is None:
        return (f"No verdict: {pairs} paired seed{'s' if pairs != 1 else ''} (fewer than two is no evidence, "
                "and gives no interval).")
    if side == "above":
        return f"{a} is higher than {b} in {what} (the paired 95% interval is above zero)."
    if side == "below":
        return f"{a} is lower than {b} in {what} (the paired 95% interval is below zero)."
    return (f"Null: no difference in {what} between {a} and {b} could be shown at this size (the paired 95% "
            "interval includes zero).")


def _fmt(value, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _cell(fmt: str, stats, n: int = 2) -> str:
    mean, low, high = stats
    if mean is None or math.isnan(mean):
        return "-"
    if n < 2:
        return f"{fmt.format(mean)} (one seed: no interval)"
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def arm_order(study: dict) -> list[str]:
    return [arm for arm in ARMS if any(r["arm"] == arm for r in study["runs"])]


def render(study: dict) -> str:
    runs = study["runs"]
    seeds_done = sorted({r["seed"] for r in runs})
    lines = ["# The policy objectives on CPU, under DAPO's sampler", "",
             f"Generated by `{study['command']}` (`bench/learning/objectives.py`; rerun with `--summarize-only` to "
             "render this page again from `objectives.json`).", "",
             "Arms: the recipe's `objective=` presets (`docs/objectives.md`) on top of the ablation study's DAPO run "
             "(`docs/learning/ablation.md`: `ablation=none`, dynamic sampling and overlong shaping on, the same "
             "chain-arithmetic task, tiny model and seeds), everything else equal, each stopped at the first "
             f"validation past {study['design']['budget_tokens']} generated tokens. Seeds planned: "
             f"{', '.join(map(str, study['seeds']))}; {len(runs)} run(s) finished.", ""]
    kl_free = sorted(set(study.get("kl_free", [])) & {r["arm"] for r in runs})
    if kl_free:
        lines += [f"Deviation: {', '.join(f'`{a}`' for a in kl_free)} ran without the preset's KL to the reference "
                  "model (`use_kl_loss=false`, `kl_loss_coef=0`): on CPU, verl 0.9.1's FSDP2 engine builds the "
                  "reference with `CPUOffloadPolicy(pin_memory=True)`, which needs an accelerator. Every other setting "
                  "is the preset's, so the GRPO comparisons below are between KL-free GRPO variants.", ""]
    lines += ["The correct-line share and the wrong-response length are computed after each run from its dumped "
              "trained rollouts (`trainer.rollout_data_dir`) with the chain step scorer, for every arm alike; lengths "
              "are the responses' token counts as the reward records them (`response_length`); both are means over "
              f"the last {TAIL_STEPS} trained steps. The process arm's logged `process/step_right_fraction` (same "
              "scorer, same batches) is in the every-run table as a check.", "",
              "Clip low / high are `actor/pg_clipfrac_eps_low` / `_eps_high`; verl's `clip_cov` and `kl_cov` losses "
              "log only `actor/pg_clipfrac`, so their cells are `-`. The budget is checked at validations (every "
              f"{study['design']['test_freq']} steps), so a run's generated tokens exceed it by up to two steps' worth "
              "(every-run table).", "",
              "Mean and 95% t-interval over the seeds that finished:", "",
              "| arm | runs | " + " | ".join(title for _, title, _ in COLUMNS) + " |",
              "|---|---|" + "---|" * len(COLUMNS)]
    for arm in arm_order(study):
        arm_runs = [r for r in runs if r["arm"] == arm]
        cells = []
        for key, _, fmt in COLUMNS:
            values = [r.get(key) for r in arm_runs if r.get(key) is not None]
            cells.append(_cell(fmt, interval(values), len(values)))
        lines.append(f"| {arm} | {len(arm_runs)} | " + " | ".join(cells) + " |")
    lines += ["", "Every run:", "",
              "| arm | seed | steps | generated tokens | validation at start | validation at the budget "
              "| correct lines | logged process/step_right_fraction | wrong share | wrong length | response length "
              "| entropy | wall s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["seed"], ARMS.index(r["arm"]))):
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['generated_tokens']:.0f} | "
            f"{_fmt(r.get('val_acc_start'), '{:.3f}')} | {_fmt(r.get('val_acc_end'), '{:.3f}')} | "
            f"{_fmt(r.get('step_right'), '{:.3f}')} | {_fmt(r.get('process_logged'), '{:.3f}')} | "
            f"{_fmt(r.get('wrong_share'), '{:.3f}')} | {_fmt(r.get('wrong_length'), '{:.2f}')} | "
            f"{_fmt(r.get('response_length_end'), '{:.2f}')} | {_fmt(r.get('entropy_end'), '{:.4f}')} | "
            f"{r['wall_s']:.0f} |")
    lines += ["", "## The three questions, paired by seed", "",
              "Each difference is arm a minus arm b at the same seed; the interval is the 95% t-interval of the "
              "per-seed differences. A difference is claimed only where that interval, over two or more seeds, "
              "excludes zero.", ""]
    title = None
    for q_title, a, b, key, fmt, what in QUESTIONS:
        if q_title != title:
            lines += [f"### {q_title}", ""]
            title = q_title
        diffs, stats = paired(study, key, a, b)
        shown = ", ".join(fmt.format(d) for d in diffs) if diffs else "none"
        lines += [f"- {what}, {a} - {b}: per seed {shown}; mean {_cell(fmt, stats, len(diffs))}. "
                  + verdict(stats, len(diffs), a, b, what), ""]
    if len(seeds_done) < len(study["seeds"]):
        lines += [f"Seeds that finished at least one arm: {', '.join(map(str, seeds_done)) or 'none'} of "
                  f"{', '.join(map(str, study['seeds']))} (the study was stopped at its time limit; every run that "
                  "finished is above).", ""]
    return "\n".join(lines).rstrip() + "\n"


def result_line(study: dict) -> str:
    mean = lambda arm, key: interval([r.get(key) for r in study["runs"] if r["arm"] == arm])[0]  # noqa: E731
    parts = ["RESULT", f"runs={len(study['runs'])}"]
    for arm in arm_order(study):
        parts.append(f"{arm}_val={mean(arm, 'val_acc_end'):.3f}")
    for label, a, b, key in (("process_acc", "grpo_process", "grpo", "val_acc_end"),
                             ("process_lines", "grpo_process", "grpo", "step_right"),
                             ("drgrpo_wrong_len", "dr_grpo", "grpo", "wrong_length"),
                             ("clipcov_entropy", "clip_cov", "dapo", "entropy_end"),
                             ("klcov_entropy", "kl_cov", "dapo", "entropy_end")):
        diffs, (m, low, high) = paired(study, key, a, b)
        parts.append(f"{label}={m:+.4f}[{low:+.4f},{high:+.4f}]n={len(diffs)}")
    parts.append(f"wall_s={study['wall_s']:.0f}")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    def record_for(run_dir: Path, steps: int) -> dict:
        return {"process_logged": logged_process(run_dir, steps), **rollout_record(run_dir, steps)}

    def describe(arms) -> dict:
        return {"arms": {arm: list(arm_overrides(arm, Path("<run_dir>"))) for arm in arms},
                "kl_free": sorted(KL_FREE & set(arms))}

    return ablation.arm_study("objectives", __doc__, argv, ARMS, DEFAULT_ARMS, DEFAULT_BUDGET, arm_overrides, record_for, render,
                              result_line, describe)


if __name__ == "__main__":
    sys.exit(main())
