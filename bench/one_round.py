"""One round per step on CPU: the mode against the same trainer without it, and against v1 streaming and the classic
trainer's deficit rounds, on the chain task (whose responses vary 2-6x in length).

Arms (the default CPU run: ``platform=cpu size=cpu_chain`` on the chain task's inputs; only the trainer and its
sampling differ):

- ``v1_one_round``: verl's v1 trainer, ``colocate_async``, ``dapo.dynamic_sampling.one_round=true``: the step's
  submission sized to fill the batch at ``one_round_confidence``, the step ended when full, the unfinished responses
  resumed under the new weights in the next step;
- ``v1_async``: the same trainer and mode without it (refills sized to the deficit, the step ended when full);
- ``v1_streaming``: v1 ``sync`` (refills sized to the deficit; once full, the prompts in flight are drained into the
  pool);
- ``classic_rounds``: the classic trainer (blocking rounds sized to the deficit).

Arms run one after another in each repeat, in rotated order (the machine is shared and noisy), each in its own folder,
process session and local Ray, under the same ``nice``. Per arm, from the run's metrics file (steps 2..N: step 1 pays
for compilation): seconds per step, generated tokens per trained group, generated groups over the ideal (qualifying
over trained: 1.000 when every qualifying group was trained; what is still pooled when the run ends counts against
it), the Kolmogorov-Smirnov distance between trained and finished response lengths (``selection/length_ks``), the
relative shift of the trained mean length (``selection/length_shift``), the recycled responses trained per step, and
the mean of ``reward/acc_mean`` over the steps (training accuracy; an accuracy at equal generated tokens over seeds
needs ``--repeats 3`` with longer runs, and is not what the default invocation measures).

Last line: ``RESULT cpu_step_ratio=... gen_over_ideal=... length_ks=...`` (``cpu_step_ratio``: v1_one_round's
s/step over v1_async's, the same trainer without the mode, at equal trained groups per step; ``gen_over_ideal`` and
``length_ks``: v1_one_round's).

    python bench/one_round.py                                  # 8 steps, 3 repeats, the three v1 arms
    python bench/one_round.py --steps 6 --repeats 1 --arms v1_one_round v1_async
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_side_by_side import built_assets, interleaved, run_logged  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "v1_one_round": ("trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async",
                     "dapo.dynamic_sampling.one_round=true"),
    "v1_async": ("trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"),
    "v1_streaming": ("trainer.use_v1=true", "trainer.v1.trainer_mode=sync"),
    "classic_rounds": ("trainer.use_v1=false",),
}
DEFAULT_ARMS = ("v1_one_round", "v1_async", "v1_streaming")


def run_arm(arm: str, repeat: int, args, assets: dict) -> dict:
    run_dir = args.work_dir / f"{arm}_r{repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "recipe_dapo.main_dapo", "platform=cpu", "size=cpu_chain",
        f"data.train_files={assets['TRAIN_FILE']}", f"data.val_files={assets['VAL_FILE']}",
        f"actor_rollout_ref.model.path={assets['MODEL_PATH']}", f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=false", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}", f"trainer.experiment_name={arm}", f"data.seed={repeat}",
        *ARMS[arm], *args.overrides,
    ]
    steps, peak, wall_s = run_logged(command, run_dir, metrics_file, args.timeout, arm)
    return summarize(steps, peak, wall_s)


def summarize(steps: list[tuple[int, dict]], peak_pss: int, wall_s: float) -> dict:
    """One run's figures (the module docstring)."""
    measured = [data for step, data in steps if step >= 2]
    if not measured:
        raise RuntimeError("the run logged no step after the first")

    def total(key: str) -> float:
        return sum(data.get(key, 0.0) for _, data in steps)

    def mean(key: str) -> float:
        values = [data[key] for data in measured if key in data]
        return statistics.fmean(values) if values else float("nan")

    trained = total("dynamic_sampling/trained_groups")
    return {
        "s_per_step": mean("timing_s/step"),
        "gen_s_per_step": mean("timing_s/gen"),
        "tokens_per_trained_group": total("dynamic_sampling/generated_tokens") / max(trained, 1.0),
        "gen_over_ideal": total("dynamic_sampling/kept_groups") / max(trained, 1.0),
        "trained_per_step": trained / len(steps),
        "length_ks": mean("selection/length_ks"),
        "length_shift": mean("selection/length_shift"),
        "recycled_per_step": mean("selection/recycled_responses"),
        "overdue_per_step": mean("dynamic_sampling/overdue_at_full"),
        "train_acc": mean("reward/acc_mean"),
        "peak_pss_gb": peak_pss / 1e9,
        "wall_s": wall_s,
    }


COLUMNS = ("s_per_step", "gen_s_per_step", "tokens_per_trained_group", "gen_over_ideal", "trained_per_step",
           "length_ks", "length_shift", "recycled_per_step", "overdue_per_step", "train_acc", "peak_pss_gb")


def spread(values: list[float]) -> str:
    values = [value for value in values if value == value]  # NaN: not logged by that arm
    if not values:
        return "-"
    middle = statistics.fmean(values)
    if len(values) == 1 or max(values) - min(values) < 1e-9:
        return f"{middle:.3f}"
    return f"{middle:.3f} [{min(values):.3f}-{max(values):.3f}]"


def report(results: dict[str, list[dict]], failures: list[str]) -> dict[str, float]:
    print("| arm | runs | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 2) + "|")
    for arm, runs in results.items():
        print(f"| {arm} | {len(runs)} | " + " | ".join(spread([run[c] for run in runs]) for c in COLUMNS) + " |")
    for failure in failures:
        print(f"failed: {failure}")

    def arm_mean(arm: str, column: str) -> float:
        runs = results.get(arm) or []
        values = [run[column] for run in runs if run[column] == run[column]]
        return statistics.fmean(values) if values else float("nan")

    return {
        "cpu_step_ratio": arm_mean("v1_one_round", "s_per_step") / arm_mean("v1_async", "s_per_step"),
        "gen_over_ideal": arm_mean("v1_one_round", "gen_over_ideal"),
        "length_ks": arm_mean("v1_one_round", "length_ks"),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=list(ARMS))
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "one_round")
    parser.add_argument("--assets", type=Path, default=None, help="a built assets folder (default: build one)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per arm")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm")
    args = parser.parse_args(argv)
    args.work_dir = args.work_dir.resolve()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is warm-up)")
    assets = built_assets(args.assets or args.work_dir / "assets", "--task", "chain")
    results, failures = interleaved(args.arms, args.repeats, lambda arm, repeat: run_arm(arm, repeat, args, assets))
    headline = report(results, failures)
    print(f"RESULT cpu_step_ratio={headline['cpu_step_ratio']:.3f} gen_over_ideal={headline['gen_over_ideal']:.3f} "
          f"length_ks={headline['length_ks']:.3f} failed_repeats={len(failures)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
