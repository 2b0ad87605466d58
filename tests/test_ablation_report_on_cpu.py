"""The ablation bench's pure parts: when a run stops, what a run record holds, and how a claim's verdict is drawn."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "learning"))

import ablation  # noqa: E402
import ablation_report  # noqa: E402


def test_interval_is_the_t_interval_of_the_mean():
    # Three seeds 0.4, 0.5, 0.6: mean 0.5, sample sd 0.1, half-width t(0.975, 2) * 0.1 / sqrt(3) = 4.303 * 0.05774.
    mean, low, high = ablation_report.interval([0.4, 0.5, 0.6])
    assert mean == pytest.approx(0.5)
    assert high - mean == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert ablation_report.interval([0.7]) == (0.7, 0.7, 0.7)  # one seed: no interval
    assert all(math.isnan(x) for x in ablation_report.interval([None]))


def test_verdict_needs_non_overlapping_intervals_and_the_target_ratio():
    verdict = ablation_report._verdict
    assert verdict((0.9, 0.8, 1.0), (0.5, 0.4, 0.6), True) == "reproduced"
    assert verdict((0.9, 0.5, 1.3), (0.5, 0.4, 0.6), True) == "inconclusive"  # overlapping
    assert verdict((0.5, 0.4, 0.6), (0.9, 0.8, 1.0), True) == "not reproduced"  # the other way round
    # Entropy 1.2x the control's, intervals apart: the direction holds, the 1.5x target does not.
    assert verdict((1.2, 1.15, 1.25), (1.0, 0.95, 1.05), True, ratio=1.5) == "direction reproduced, target ratio missed"
    # Truncation: lower is better, at most half the control's.
    assert verdict((0.04, 0.03, 0.05), (0.2, 0.15, 0.25), False, ratio=0.5) == "reproduced"
    assert verdict((0.04, 0.03, 0.05), (0.06, 0.055, 0.065), False, ratio=0.5) == "direction reproduced, target ratio missed"
    assert verdict((math.nan,) * 3, (0.5, 0.4, 0.6), True) == "inconclusive"
    # One seed per arm: no interval, so no difference counts, whichever way it goes.
    assert verdict((0.9, 0.9, 0.9), (0.5, 0.5, 0.5), True) == "inconclusive (one seed; in the paper's direction)"
    assert verdict((0.9, 0.9, 0.9), (0.5, 0.5, 0.5), False) == "inconclusive (one seed; against the paper's direction)"


def test_a_run_stops_at_the_first_validation_past_the_budget():
    val = {"val-core/x/acc/mean@4": 0.5}
    metrics = {0: dict(val), 1: {"dynamic_sampling/generated_tokens": 600.0},
               2: {"dynamic_sampling/generated_tokens": 600.0, **val},
               3: {"dynamic_sampling/generated_tokens": 600.0},  # past 1,500 here, but no validation
               4: {"dynamic_sampling/generated_tokens": 600.0, **val}}
    assert ablation.budget_reached(metrics, 1500) == 4
    assert ablation.budget_reached(metrics, 1200) == 2
    assert ablation.budget_reached(metrics, 10_000) is None


def _run(tmp_path: Path, arm: str, seed: int, accs, entropy: float) -> dict:
    run_dir = tmp_path / f"{arm}_s{seed}"
    run_dir.mkdir()
    lines = [{"step": 0, "data": {"val-core/chain/acc/mean@4": accs[0]}}]
    for step in (1, 2):
        lines.append({"step": step, "data": {
            "dynamic_sampling/generated_tokens": 1000.0, "actor/entropy": entropy, "overlong/truncated_ratio": 0.1,
            "reward/acc_mean": 0.5, "actor/pg_clipfrac_eps_low": 0.01, "actor/pg_clipfrac_eps_high": 0.002,
            "response_length/mean": 30.0, "dynamic_sampling/trained_groups": 8.0,
            "dynamic_sampling/solve_all_ratio": 0.25, "dynamic_sampling/solve_none_ratio": 0.25,
            **({"val-core/chain/acc/mean@4": accs[1]} if step == 2 else {})}})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    (run_dir / "stop.json").write_text(json.dumps({"reason": "budget", "step": 2, "wall_s": 10.0}))
    return ablation.run_record(arm, seed, run_dir, ablation.Design())


def test_run_records_read_the_metrics_file_and_the_doc_renders_from_them_alone(tmp_path):
    runs = [_run(tmp_path, "dapo", seed, (0.5, 0.7 + 0.01 * seed), 0.3) for seed in (0, 1, 2)]
    runs += [_run(tmp_path, "no_dynamic_sampling", seed, (0.5, 0.6 + 0.01 * seed), 0.2) for seed in (0, 1, 2)]
    dapo, plain = runs[0], runs[3]
    assert (dapo["steps"], dapo["generated_tokens"], dapo["val_acc_start"], dapo["val_acc_end"]) == (2, 2000.0, 0.5, 0.7)
    assert dapo["informative_share"] == 1.0  # filtered: only groups with spread are trained
    assert plain["informative_share"] == pytest.approx(0.5)  # kept all: a quarter all right, a quarter all wrong
    study = {"design": ablation.asdict(ablation.Design()),
             "arms": ablation.ARMS, "seeds": [0, 1, 2], "command": "python bench/learning/ablation.py",
             "wall_s": 60.0, "repeat": None, "runs": runs}
    (ds_claim,) = [c for c in ablation_report.claims(study) if c["claim"].startswith("Dynamic sampling")]
    assert ds_claim["verdict"] == "reproduced"  # 0.71 [0.685, 0.735] against 0.61 [0.585, 0.635]
    text = ablation_report.generated(study, [])
    assert text.startswith(ablation_report.BEGIN) and text.endswith(ablation_report.END)
    assert "| DAPO (all four) | 3 |" in text and "| no dynamic sampling | 3 |" in text
    assert ablation_report.result_line(study).startswith("RESULT runs=6 val_acc_dapo=0.71 ")
    # Validation is seeded now: the first validations of a seed's runs are one draw, not a measure of its noise; runs
    # recorded before (no such field) are reported as unseeded.
    assert all(run["validation_seeded"] for run in runs)
    assert "validation is seeded" in "\n".join(ablation_report.same_start(study)) and "not seeded" not in text
    older = dict(study, runs=[{k: v for k, v in run.items() if k != "validation_seeded"} for run in runs])
    assert "validation samples are not seeded" in "\n".join(ablation_report.same_start(older))


# ----------------------------------------------------------------------------- the default run is the study's DAPO arm

STUDY_ASSETS = {"train_file": "/in/train.parquet", "val_file": "/in/val.parquet", "model_path": "/in/model"}
# What only says which run this is and how long it trains: its seeds, steps, validation and save cadence, folders.
RUN_KEYS = {"trainer.save_freq", "trainer.total_training_steps", "trainer.default_local_dir", "trainer.test_freq",
            "trainer.experiment_name", "trainer.v1.sampler.sampler_kwargs.seed", "data.seed", "dapo.name.size",
            "actor_rollout_ref.rollout.trace.experiment_name", "actor_rollout_ref.rollout.seed",
            "actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.actor.checkpoint.load_contents",
            "actor_rollout_ref.actor.checkpoint.save_contents"}


def _differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return {key for k in set(a) | set(b) for key in _differences(a.get(k), b.get(k), f"{path}.{k}".lstrip("."))}
    return {path} if a != b else set()


def test_the_default_run_trains_the_studys_dapo_arm_on_the_studys_inputs():
    from omegaconf import OmegaConf

    from conftest import compose_recipe_config
    from recipe_dapo.cpu.assets import TASK_INPUTS

    design = ablation.Design()
    chain = TASK_INPUTS["chain"]  # what scripts/run_dapo_cpu.sh builds
    assert (chain.num_train, chain.num_val, chain.num_warmup) == (design.num_train, design.num_val, design.num_warmup)
    assert chain.spec == ablation.model_spec(design)
    study = compose_recipe_config(ablation.overrides("dapo", 0, design, STUDY_ASSETS, Path("/run"), 200))
    default = compose_recipe_config(["platform=cpu", "size=cpu_chain", "data.train_files=/in/train.parquet",
                                     "data.val_files=/in/val.parquet", "actor_rollout_ref.model.path=/in/model"])
    differences = _differences(OmegaConf.to_container(study, resolve=True),
                               OmegaConf.to_container(default, resolve=True))
    assert differences <= RUN_KEYS, sorted(differences - RUN_KEYS)
    # positive control: the study's no-clip-higher arm differs from the default run beyond those keys
    other = compose_recipe_config(ablation.overrides("no_clip_higher", 0, design, STUDY_ASSETS, Path("/run"), 200))
    assert _differences(OmegaConf.to_container(other, resolve=True),
                        OmegaConf.to_container(default, resolve=True)) - RUN_KEYS
    # the default run validates before training and saves the model it trained, for the evaluation command
    assert default.trainer.val_before_train and default.trainer.save_freq == default.trainer.total_training_steps
    assert "hf_model" in default.actor_rollout_ref.actor.checkpoint.save_contents


def test_recorded_runs_are_reused_only_for_the_same_design_and_model(tmp_path):
    design = ablation.Design()
    path = tmp_path / "ablation.json"
    run = {"arm": "dapo", "seed": 1, "val_acc_end": 0.6}
    path.write_text(json.dumps({"design": ablation.asdict(design), "model_sha256": "aa", "runs": [run]}))
    assert ablation.recorded_runs(path, design, "aa") == {("dapo", 1): run}
    assert ablation.recorded_runs(path, design, "bb") == {}  # the same design warmed up into another model
    assert ablation.recorded_runs(path, ablation.replace(design, lr=1e-3), "aa") == {}
    assert ablation.recorded_runs(tmp_path / "absent.json", design, "aa") == {}


def test_a_recorded_runs_curves_read_back_as_the_metrics_they_came_from():
    record = {"curves": {"step": [1, 2], "generated_tokens": [100.0, 250.0], "entropy": [0.5, None],
                         "train_acc": [0.25, 0.5], "clipfrac_low": [0.01, 0.02], "clipfrac_high": [0.0, 0.001]}}
    metrics = ablation.record_metrics(record)
    assert metrics[1]["dynamic_sampling/generated_tokens"] == 100.0 and metrics[2]["dynamic_sampling/generated_tokens"] == 150.0
    assert metrics[1]["actor/entropy"] == 0.5 and "actor/entropy" not in metrics[2]
    same = ablation.reproducibility(metrics, ablation.record_metrics(record))
    assert same["identical"] and same["steps_compared"] == 2
    changed = ablation.record_metrics({"curves": {**record["curves"], "train_acc": [0.25, 0.75]}})
    differs = ablation.reproducibility(metrics, changed)
    assert not differs["identical"] and differs["first_difference"] == {"step": 2, "metric": "reward/acc_mean"}
