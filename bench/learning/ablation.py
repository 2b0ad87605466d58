"""The DAPO ablation in miniature, on CPU: each of the four techniques switched off in turn, and the GRPO baseline.

One command trains every arm and seed, writes every run's figures to ``docs/learning/ablation.json`` and renders
``docs/learning/ablation.md`` and its figures from that file (``ablation_report.py``)::

    python bench/learning/ablation.py                       # 6 arms x 3 seeds, the JSON, the doc, the figures
    python bench/learning/ablation.py --summarize-only      # the doc and figures again from the JSON
    python bench/learning/ablation.py --smoke               # 2 steps of the grpo arm: the pipeline works (CI)

The task (``recipe_dapo.cpu.chain_task``): chains of 2-6 one-digit additions and subtractions, solved one operation a
line, so the needed response length varies several-fold across problems. The tiny Qwen2 is warmed up on worked
solutions in two styles (concise, and a verbose one about 1.5x as long), so the starting policy writes either.
Why each setting gives each technique something to act on is in ``docs/learning/ablation.md``.

Arms (the recipe's own ``ablation=`` config group, everything else equal):

    dapo                 ablation=none                  the recipe's defaults: all four techniques
    no_clip_higher       ablation=no_clip_higher        clip 0.2 / 0.2
    no_dynamic_sampling  ablation=no_dynamic_sampling   every group trained, including all-right / all-wrong ones
    no_token_loss        ablation=no_token_level_loss   seq-mean-token-mean instead of token-mean
    no_overlong_shaping  ablation=no_overlong_shaping   no soft overlong punishment, no overlong filter
    grpo                 ablation=grpo_baseline         all four off

Budget: every run trains until it has generated ``--budget-tokens`` response tokens (every token of every round,
kept or dropped, as ``dynamic_sampling/generated_tokens`` counts them) and stops at the first validation at or past
that point (validation every ``test_freq`` steps), so every arm spends the same generation and ends on a validation.
Seeds 0, 1 and 2 were fixed before any run of this design; every run is reported.

Runs go to ``runs/ablation/<arm>_s<seed>/`` (metrics.jsonl, train.log, command.txt); an existing finished run is
reused (``--force`` retrains), and ablation.json is rewritten after every run, so a study stopped part-way reports
every run it finished. The last line printed is ``RESULT ...`` with the headline figures and the wall time (the sum
of the runs' wall times, start-up included).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ablation_report  # noqa: E402  (bench/learning/ablation_report.py)
from run_learning import _end_session  # noqa: E402

from recipe_dapo.tracking.run_log import read_metrics  # noqa: E402

logger = logging.getLogger("ablation")

ARMS = {
    "dapo": "none",
    "no_clip_higher": "no_clip_higher",
    "no_dynamic_sampling": "no_dynamic_sampling",
    "no_token_loss": "no_token_level_loss",
    "no_overlong_shaping": "no_overlong_shaping",
    "grpo": "grpo_baseline",
}
"""Arm name -> the recipe's ``ablation=`` config (``recipe_dapo/config/ablation/``)."""
SEEDS = (0, 1, 2)
SMOKE_OVERRIDES = ("dapo.health.max_steps_all_wrong=0", "objective=grpo_process",
                   "actor_rollout_ref.actor.use_kl_loss=false", "actor_rollout_ref.actor.kl_loss_coef=0")
"""The smoke's model, warmed up for seconds, answers (almost) nothing right: the run must not stop for a policy that
scores nothing (``dapo.health.max_steps_all_wrong``), since the smoke checks the pipeline, not learning. It runs with
process supervision (``objective=grpo_process``: a reward per chain step, so a group whose final answers are all wrong
still has advantages), which puts the recipe's own advantage estimator through a real launch; without the preset's KL
to the reference model, which verl 0.9.1 cannot build on CPU (the start-up rules refuse it there)."""


@dataclass(frozen=True)
class Design:
    """Every setting of the study (written into ablation.json beside the runs)."""

    # the task and the model
    num_train: int = 512
    num_val: int = 128
    num_warmup: int = 4096
    hidden_size: int = 128
    num_hidden_layers: int = 2
    warmup_steps: int = 2500  # at most: the warm-up stops once sampled accuracy reaches warmup_target_acc
    warmup_lr: float = 3e-3
    warmup_target_acc: Optional[float] = 0.45
    # the RL run
    max_prompt_length: int = 32
    max_response_length: int = 48
    overlong_buffer: int = 16
    train_batch_size: int = 8
    mini_batch_size: int = 2
    n: int = 8
    lr: float = 2e-4
    max_gen_batches: int = 6
    val_n: int = 4
    test_freq: int = 2
    budget_tokens: int = 40000
    max_steps: int = 200
    repeat_steps: int = 4  # the reproducibility check reruns dapo's first seed for this many steps


def model_spec(design: Design):
    """The tiny model the design warms up (head_dim 32, one key-value head, an MLP twice the width)."""
    from recipe_dapo.cpu import assets as da

    return replace(da.TinyModelSpec(), hidden_size=design.hidden_size, num_hidden_layers=design.num_hidden_layers,
                   num_attention_heads=design.hidden_size // 32, num_key_value_heads=1,
                   intermediate_size=2 * design.hidden_size, warmup_steps=design.warmup_steps,
                   warmup_lr=design.warmup_lr, warmup_target_acc=design.warmup_target_acc)


def build_assets(design: Design, out: Path) -> dict[str, str]:
    from recipe_dapo.cpu import assets as da

    return da.build_default_assets(out, None, num_train=design.num_train, num_val=design.num_val, seed=0,
                                   spec=model_spec(design), task="chain", num_warmup=design.num_warmup)


def overrides(arm: str, seed: int, design: Design, assets: dict[str, str], run_dir: Path, steps: int,
              extra: tuple[str, ...] = ()) -> list[str]:
    """The run's command-line overrides: the arm's ``ablation=`` config, the design, the seed; ``extra`` last."""
    rows = design.mini_batch_size * design.n  # one micro-batch per mini-batch
    return [
        "platform=cpu", "size=cpu_tiny", f"ablation={ARMS[arm]}",
        f"data.train_files={assets['train_file']}",
        f"data.val_files={assets['val_file']}",
        f"actor_rollout_ref.model.path={assets['model_path']}",
        f"data.max_prompt_length={design.max_prompt_length}",
        f"data.max_response_length={design.max_response_length}",
        f"reward.reward_kwargs.overlong_buffer_cfg.len={design.overlong_buffer}",
        f"data.train_batch_size={design.train_batch_size}",
        f"data.gen_batch_size={design.train_batch_size}",
        f"data.val_batch_size={design.num_val}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={design.mini_batch_size}",
        f"actor_rollout_ref.rollout.n={design.n}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={rows}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={rows}",
        f"actor_rollout_ref.actor.optim.lr={design.lr}",
        f"algorithm.filter_groups.max_num_gen_batches={design.max_gen_batches}",
        f"actor_rollout_ref.rollout.val_kwargs.n={design.val_n}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "trainer.val_before_train=true",
        f"trainer.test_freq={design.test_freq}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"trainer.experiment_name={arm}_s{seed}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        *extra,
    ]


def generated_tokens(step_metrics: dict) -> float:
    return float(step_metrics.get("dynamic_sampling/generated_tokens", 0.0))


def budget_reached(metrics: dict[int, dict], budget: float) -> int | None:
    """The first step with a validation at which the run has generated ``budget`` tokens, else None."""
    spent = 0.0
    for step in sorted(s for s in metrics if s > 0):
        spent += generated_tokens(metrics[step])
        if spent >= budget and any(k.startswith(("val/", "val-core/")) for k in metrics[step]):
            return step
    return None


def train(arm: str, seed: int, design: Design, assets: dict[str, str], work_dir: Path, budget: float,
          max_steps: int, force: bool = False, name: str | None = None, extra: tuple[str, ...] = ()) -> Path:
    """One run, stopped at the first validation past ``budget`` generated tokens (or after ``max_steps``)."""
    run_dir = work_dir / (name or f"{arm}_s{seed}")
    metrics_path = run_dir / "metrics.jsonl"
    done = run_dir / "stop.json"
    if done.exists() and not force:
        logger.info("%s seed %d: reusing %s", arm, seed, run_dir)
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in (metrics_path, done):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "recipe_dapo.main_dapo",
               *overrides(arm, seed, design, assets, run_dir, max_steps, extra)]
    (run_dir / "command.txt").write_text(shlex.join(command) + "\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0",
               VERL_FILE_LOGGER_PATH=str(metrics_path))
    env.pop("RAY_ADDRESS", None)  # a fresh local Ray per run
    # Ray lowers its workers' priority (niceness 15) by default: on a shared machine the run would then wait behind
    # every other process. The run's workers keep the bench's own priority instead (results do not depend on it).
    env.setdefault("RAY_worker_niceness", "0")
    logger.info("%s seed %d: training to %s generated tokens -> %s", arm, seed, f"{budget:.0f}", run_dir)
    start = time.time()
    stop_step, reason = None, "finished"
    with open(run_dir / "train.log", "w") as log:
        process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            while process.poll() is None:
                time.sleep(2)
                if metrics_path.exists():
                    stop_step = budget_reached(read_metrics(metrics_path), budget)
                    if stop_step is not None:
                        reason = "budget"
                        break
        finally:
            _end_session(process.pid)
            process.wait()
    wall = time.time() - start
    if reason != "budget" and process.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed ({process.returncode}); see {run_dir / 'train.log'}")
    done.write_text(json.dumps({"reason": reason, "step": stop_step, "wall_s": round(wall, 1)}) + "\n")
    return run_dir


def _series(metrics: dict[int, dict], steps: list[int], key: str) -> list[float | None]:
    return [float(metrics[s][key]) if key in metrics[s] else None for s in steps]


def _tail_mean(values: list[float | None], last: int = 3) -> float | None:
    kept = [v for v in values if v is not None][-last:]
    return float(np.mean(kept)) if kept else None


def informative(step_metrics: dict, filtered: bool) -> float | None:
    """Share of the step's trained groups whose responses do not all score the same (they carry gradient)."""
    if filtered:
        return 1.0 if "dynamic_sampling/trained_groups" in step_metrics else None
    all_same = [step_metrics.get(f"dynamic_sampling/{k}") for k in ("solve_all_ratio", "solve_none_ratio")]
    if any(v is None for v in all_same):
        return None
    return 1.0 - all_same[0] - all_same[1]


def run_record(arm: str, seed: int, run_dir: Path, design: Design) -> dict:
    """The figures of one run (ablation.json's entry), with its per-step curves."""
    stop = json.loads((run_dir / "stop.json").read_text())
    metrics = read_metrics(run_dir / "metrics.jsonl")
    last = stop["step"] or max(metrics)
    steps = [s for s in sorted(metrics) if 0 < s <= last]
    val_key = next((k for k in sorted({k for m in metrics.values() for k in m})
                    if k.startswith("val-core/") and "/acc/mean@" in k), None)
    tokens = np.cumsum([generated_tokens(metrics[s]) for s in steps]).tolist()
    filtered = arm not in ("no_dynamic_sampling", "grpo")
    curves = {
        "step": steps,
        "generated_tokens": tokens,
        "entropy": _series(metrics, steps, "actor/entropy"),
        "truncation": _series(metrics, steps, "overlong/truncated_ratio"),
        "response_length": _series(metrics, steps, "reward/response_length_mean")
        if any("reward/response_length_mean" in metrics[s] for s in steps)
        else _series(metrics, steps, "response_length/mean"),
        "train_acc": _series(metrics, steps, "reward/acc_mean"),
        "clipfrac_low": _series(metrics, steps, "actor/pg_clipfrac_eps_low"),
        "clipfrac_high": _series(metrics, steps, "actor/pg_clipfrac_eps_high"),
        "informative": [informative(metrics[s], filtered) for s in steps],
    }
    val_steps = [s for s in sorted(metrics) if s <= last and val_key and val_key in metrics[s]]
    cumulative = dict(zip([0, *steps], [0.0, *tokens]))
    validation = {"step": val_steps, "generated_tokens": [cumulative[s] for s in val_steps],
                  "acc": [float(metrics[s][val_key]) for s in val_steps]}
    overall = lambda key: float(np.mean([v for v in curves[key] if v is not None])) if any(  # noqa: E731
        v is not None for v in curves[key]) else None
    return {
        "arm": arm,
        "seed": seed,
        "steps": last,
        "generated_tokens": tokens[-1] if tokens else 0.0,
        "val_acc_start": validation["acc"][0] if val_steps and val_steps[0] == 0 else None,
        "val_acc_end": validation["acc"][-1] if val_steps else None,
        "val_metric": val_key,
        "validation_seeded": True,  # the study runs platform=cpu, whose seeded rollouts seed validation too
        "entropy_start": _tail_mean(curves["entropy"][:3]),
        "entropy_end": _tail_mean(curves["entropy"]),
        "truncation_start": _tail_mean(curves["truncation"][:3]),
        "truncation_end": _tail_mean(curves["truncation"]),
        "response_length_end": _tail_mean(curves["response_length"]),
        "informative_share": overall("informative"),
        "clipfrac_low": overall("clipfrac_low"),
        "clipfrac_high": overall("clipfrac_high"),
        "wall_s": stop["wall_s"],
        "stop": stop["reason"],
        "curves": curves,
        "validation": validation,
    }


def arm_study(name: str, doc: str, argv: list[str] | None, arms, default_arms, default_budget: int, extra_for,
              record_for, render, result_line, describe) -> int:
    """The command line of a study whose arms are the ablation's DAPO run with overrides
    (``bench/learning/<name>.py``): ``--seeds``, ``--arms``, ``--work-dir``, ``--docs-dir``, ``--budget-tokens``,
    ``--summarize-only``. Seed-major (a stopped study holds whole seeds); after every run ``<name>.json`` and
    ``<name>.md`` are rewritten. ``extra_for(arm, run_dir)`` gives an arm's overrides, ``record_for(run_dir, steps)``
    the study's own figures of a run, ``describe(arms)`` what the JSON records of the arms chosen (``{"arms": ...}``
    and any other entries). Prints the doc and ``result_line(study)``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--arms", nargs="+", default=list(default_arms), choices=list(arms))
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / name)
    parser.add_argument("--docs-dir", type=Path, default=ROOT / "docs" / "learning")
    parser.add_argument("--budget-tokens", type=int, default=default_budget)
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    json_path, doc_path = args.docs_dir / f"{name}.json", args.docs_dir / f"{name}.md"
    if args.summarize_only:
        study = json.loads(json_path.read_text())
    else:
        design = replace(Design(), budget_tokens=args.budget_tokens)
        work_dir = args.work_dir.resolve()
        assets = build_assets(design, work_dir / "assets")
        study = {"design": asdict(design), "model_sha256": model_sha256(assets), **describe(args.arms),
                 "seeds": args.seeds,
                 "command": f"python bench/learning/{name}.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
                 "wall_s": 0.0, "runs": []}
        for seed in args.seeds:
            for arm in args.arms:
                run_name = f"{arm}_s{seed}"
                run_dir = train("dapo", seed, design, assets, work_dir, design.budget_tokens, design.max_steps,
                                name=run_name, extra=extra_for(arm, work_dir / run_name))
                record = run_record("dapo", seed, run_dir, design)
                record.update(arm=arm, **record_for(run_dir, record["steps"]))
                record.pop("curves"), record.pop("validation")
                study["runs"].append(record)
                study["wall_s"] = round(sum(r["wall_s"] for r in study["runs"]), 1)
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(study, indent=1) + "\n")
                doc_path.write_text(render(study))
    doc_path.write_text(render(study))
    print(render(study))
    print(result_line(study))
    return 0


def model_sha256(assets: dict[str, str]) -> str | None:
    """The warmed-up model's sha256, as the assets' manifest records it."""
    manifest = Path(assets["model_path"]).parent / "manifest.json"
    return json.loads(manifest.read_text()).get("model_sha256") if manifest.exists() else None


def recorded_runs(json_path: Path, design: Design, model: str | None) -> dict[tuple[str, int], dict]:
    """The run records an earlier invocation wrote to ``json_path`` for this same design and model, by (arm, seed). The
    model is compared too: the same design warmed up on another machine is another model (docs/learning/ablation.md)."""
    if not json_path.exists():
        return {}
    study = json.loads(json_path.read_text())
    if study.get("design") != asdict(design):
        logger.info("%s holds another design: its runs are not reused", json_path)
        return {}
    if study.get("model_sha256") not in (None, model):
        logger.info("%s holds runs of another model (sha256 %s, here %s): they are not reused", json_path,
                    study.get("model_sha256"), model)
        return {}
    return {(run["arm"], run["seed"]): run for run in study.get("runs", [])}


RECORDED_CURVES = {"entropy": "actor/entropy", "train_acc": "reward/acc_mean",
                   "clipfrac_low": "actor/pg_clipfrac_eps_low", "clipfrac_high": "actor/pg_clipfrac_eps_high"}


def record_metrics(record: dict) -> dict[int, dict]:
    """A run record's per-step curves back as per-step metrics (what a reproducibility check can compare)."""
    curves = record["curves"]
    metrics: dict[int, dict] = {}
    spent = 0.0
    for i, step in enumerate(curves["step"]):
        row = metrics.setdefault(step, {})
        row["dynamic_sampling/generated_tokens"] = curves["generated_tokens"][i] - spent
        spent = curves["generated_tokens"][i]
        for curve, key in RECORDED_CURVES.items():
            if curves[curve][i] is not None:
                row[key] = curves[curve][i]
    return metrics


def reproducibility(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """Two runs of one arm and seed compared step by step: identical, or where and how much they differ."""
    keys = ("dynamic_sampling/generated_tokens", "reward/acc_mean", "actor/entropy", "actor/pg_loss",
            "actor/grad_norm", "actor/pg_clipfrac_eps_low", "actor/pg_clipfrac_eps_high")
    common = sorted(set(a) & set(b) - {0})
    first_diff = None
    max_rel = {}
    for key in keys:
        diffs = []
        for s in common:
            if key in a[s] and key in b[s]:
                x, y = float(a[s][key]), float(b[s][key])
                diffs.append(abs(x - y) / max(abs(x), abs(y), 1e-12))
                if x != y and (first_diff is None or s < first_diff[0]):
                    first_diff = (s, key)
        max_rel[key] = max(diffs) if diffs else None
    return {"steps_compared": len(common), "identical": first_diff is None,
            "first_difference": {"step": first_diff[0], "metric": first_diff[1]} if first_diff else None,
            "max_relative_difference": max_rel}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "ablation")
    parser.add_argument("--docs-dir", type=Path, default=ROOT / "docs" / "learning")
    parser.add_argument("--budget-tokens", type=int, default=None, help="generated tokens per run (default: the design's)")
    parser.add_argument("--no-repeat", action="store_true",
                        help="skip the reproducibility rerun of the dapo arm's first seed (its first repeat_steps steps)")
    parser.add_argument("--smoke", action="store_true",
                        help="2 steps of the grpo arm with process supervision, seed 0: the pipeline works")
    parser.add_argument("--force", action="store_true", help="retrain runs that already finished")
    parser.add_argument("--summarize-only", action="store_true", help="the doc and figures again from ablation.json")
    parser.add_argument("--collect", action="store_true",
                        help="train nothing: ablation.json, the doc and the figures from the runs that finished")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    design = Design()
    if args.budget_tokens:
        design = replace(design, budget_tokens=args.budget_tokens)
    if args.smoke:
        design = replace(design, warmup_steps=20, warmup_target_acc=None, num_warmup=256, num_train=64, num_val=16,
                         test_freq=1, max_steps=2, budget_tokens=1 << 40)
        # The GRPO arm: a model warmed up for seconds answers (almost) nothing right, so the dapo arm's dynamic
        # sampling would find no group to keep; the smoke checks the pipeline, not learning.
        args.arms, args.seeds, args.no_repeat = ["grpo"], [0], True
    work_dir = args.work_dir.resolve()
    json_path = (work_dir if args.smoke else args.docs_dir) / "ablation.json"
    if not args.summarize_only:
        assets = build_assets(design, work_dir / "assets")
        model = model_sha256(assets)
        study = {"design": asdict(design), "model_sha256": model, "arms": ARMS, "seeds": args.seeds,
                 "command": "python bench/learning/ablation.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
                 "wall_s": 0.0, "repeat": None, "runs": []}
        # Runs an earlier invocation of this same design and model recorded: reused where their run folder is gone, so
        # a study continues in a later session without retraining (--force retrains).
        recorded = {} if args.force or args.smoke else recorded_runs(json_path, design, model)

        def save() -> None:
            # After every run, so that a study stopped part-way keeps (and reports) every run it finished.
            study["wall_s"] = round(sum(run["wall_s"] for run in study["runs"]), 1)
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(study, indent=1) + "\n")

        for seed in args.seeds:  # seed-major, so that a stopped study holds whole seeds of every arm
            for arm in args.arms:
                finished = (work_dir / f"{arm}_s{seed}" / "stop.json").exists()
                if not finished and (arm, seed) in recorded:
                    logger.info("%s seed %d: reusing the record in %s", arm, seed, json_path)
                    study["runs"].append(recorded[arm, seed])
                    save()
                    continue
                if args.collect and not finished:
                    continue
                run_dir = train(arm, seed, design, assets, work_dir, design.budget_tokens, design.max_steps,
                                force=args.force, extra=SMOKE_OVERRIDES if args.smoke else ())
                study["runs"].append(run_record(arm, seed, run_dir, design))
                save()
        if args.collect:
            study["command"] = "python bench/learning/ablation.py"  # what trains them all
            save()
        repeated = (work_dir / f"dapo_s{args.seeds[0]}_repeat" / "stop.json").exists()
        if not args.no_repeat and not (args.collect and not repeated):
            # The first repeat_steps steps again: enough to see whether and where two runs part.
            again = train("dapo", args.seeds[0], design, assets, work_dir, float("inf"), design.repeat_steps,
                          force=args.force, name=f"dapo_s{args.seeds[0]}_repeat")
            first = work_dir / f"dapo_s{args.seeds[0]}"
            if (first / "stop.json").exists():
                compared, where = read_metrics(first / "metrics.jsonl"), "the same machine"
            else:  # the first run was recorded by an earlier invocation: compare with its recorded curves
                compared, where = record_metrics(recorded["dapo", args.seeds[0]]), "the recorded run"
            study["repeat"] = {"arm": "dapo", "seed": args.seeds[0], "against": where,
                               **reproducibility(compared, read_metrics(again / "metrics.jsonl"))}
            save()
    study = json.loads(json_path.read_text())
    if not args.smoke:
        ablation_report.write(study, args.docs_dir)
    print(ablation_report.table(study))
    print(ablation_report.result_line(study))
    return 0


if __name__ == "__main__":
    sys.exit(main())
