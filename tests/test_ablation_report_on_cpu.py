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


def test_a_verdict_is_the_paired_difference_over_seeds_against_zero():
    verdict = ablation_report.paired_verdict
    # Every seed 0.07-0.09 ahead: the interval of the mean difference, 0.08 +/- 4.303 x 0.01 / sqrt(3), excludes zero.
    ahead = [(0, 0.63, 0.55), (1, 0.65, 0.57), (2, 0.60, 0.51)]
    assert verdict(ahead, True) == "reproduced"
    assert verdict([(s, c, t) for s, t, c in ahead], True) == "not reproduced"  # the other way round
    assert verdict(ahead, False) == "not reproduced"  # lower was the paper's direction
    # Ahead on average, but one seed behind: the interval of the differences straddles zero.
    assert verdict([(0, 0.63, 0.64), (1, 0.65, 0.54), (2, 0.61, 0.58)], True) == "inconclusive"
    # Entropy 1.2x the control's in every seed: the direction holds, the 1.5x target does not.
    higher = [(0, 1.2, 1.0), (1, 1.25, 1.04), (2, 1.18, 0.98)]
    assert verdict(higher, True, ratio=1.5) == "direction reproduced, target ratio missed"
    assert verdict([(s, 2 * t, c) for s, t, c in higher], True, ratio=1.5) == "reproduced"
    # Truncation: lower is better, at most half the control's.
    assert verdict([(0, 0.04, 0.2), (1, 0.05, 0.22), (2, 0.03, 0.19)], False, ratio=0.5) == "reproduced"
    assert verdict([(0, 0.04, 0.06), (1, 0.05, 0.065), (2, 0.045, 0.062)], False, ratio=0.5) == (
        "direction reproduced, target ratio missed")
    assert verdict([], True) == "inconclusive"
    # One seed: no interval, so no difference counts, whichever way it goes.
    assert verdict([(0, 0.9, 0.5)], True) == "inconclusive (one seed; in the paper's direction)"
    assert verdict([(0, 0.9, 0.5)], False) == "inconclusive (one seed; against the paper's direction)"


def test_pairing_finds_a_difference_every_seed_shows_that_the_arms_intervals_hide():
    """Seeds differ more from one another than the arms do within a seed: the arms' own intervals overlap, the paired
    differences do not straddle zero. Pairing is by seed, not by position."""
    treatment, control = {0: 0.634, 1: 0.648, 2: 0.606}, {2: 0.550, 0: 0.549, 1: 0.566}
    pairs = ablation_report.paired(treatment, control)
    assert pairs == [(0, 0.634, 0.549), (1, 0.648, 0.566), (2, 0.606, 0.550)]
    t, c = ablation_report.interval(treatment.values()), ablation_report.interval(control.values())
    assert t[1] < c[2]  # the unpaired intervals overlap
    assert ablation_report.paired_verdict(pairs, True) == "reproduced"
    # a seed one arm lacks is left out, not paired with another seed's run
    assert ablation_report.paired({0: 0.5, 1: 0.6}, {1: 0.4, 2: 0.3}) == [(1, 0.6, 0.4)]


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


# ----------------------------------------------------------------------------- the doc's prose, rendered from the runs

def _record(arm: str, seed: int, steps: int, val: dict, entropy: tuple[float, float]) -> dict:
    """A run record as ablation.json holds it: validation accuracy at the given steps, entropy at step 1 and at the end."""
    return {"arm": arm, "seed": seed, "steps": steps, "val_acc_start": val[0], "val_acc_end": val[max(val)],
            "entropy_end": entropy[1], "truncation_end": 0.02, "truncation_start": 0.1, "response_length_end": 30.0,
            "informative_share": 1.0 if arm == "dapo" else 0.6, "clipfrac_high": 0.001, "clipfrac_low": 0.005,
            "curves": {"step": list(range(1, steps + 1)), "entropy": [entropy[0]] + [entropy[1]] * (steps - 1)},
            "validation": {"step": sorted(val), "acc": [val[s] for s in sorted(val)]}}


def _study(runs: list[dict]) -> dict:
    return {"design": {"budget_tokens": 40000}, "arms": {"dapo": "none", "no_dynamic_sampling": "x"}, "runs": runs}


def test_the_dynamic_sampling_sentence_quotes_equal_steps_at_equal_steps_and_the_budgets_end_as_such():
    # Without dynamic sampling the arm takes 24 steps for the same tokens: at step 16 it is behind in every seed, at
    # the end of its budget ahead in every seed. The sentence must not quote the latter as "at equal gradient steps".
    runs = [_record("dapo", s, 16, {0: 0.45, 16: 0.60 + 0.01 * s}, (0.08, 0.07)) for s in (0, 1, 2)]
    runs += [_record("no_dynamic_sampling", s, 24, {0: 0.45, 16: 0.50 + 0.01 * s, 24: 0.70 + 0.01 * s}, (0.08, 0.07))
             for s in (0, 1, 2)]
    (sentence,) = [line for line in ablation_report.findings(_study(runs)) if "Dynamic sampling" in line]
    equal_steps, budget_end = sentence.split("at the end of the equal token budget")
    assert "step 16" in equal_steps and "ahead in seeds 0, 1 and 2 (0.600 against 0.500" in equal_steps
    assert "0.700" not in equal_steps and ": reproduced" in equal_steps
    assert "24 steps" in budget_end and "behind in seeds 0, 1 and 2 (0.600 against 0.700" in budget_end
    (claim,) = [c for c in ablation_report.claims(_study(runs)) if c["claim"].startswith("Dynamic sampling")]
    assert claim["verdict"] == "reproduced" and "validation accuracy at step 16" in claim["evidence"]


def test_the_entropy_sentence_counts_the_runs_where_entropy_rose_and_fell_from_the_first_step():
    runs = [_record("dapo", 0, 4, {0: 0.4, 4: 0.5}, (0.08, 0.10)),  # +25%
            _record("dapo", 1, 4, {0: 0.4, 4: 0.5}, (0.10, 0.11)),  # +10%
            _record("no_dynamic_sampling", 0, 4, {0: 0.4, 4: 0.5}, (0.10, 0.09))]  # -10%
    (sentence,) = [line for line in ablation_report.findings(_study(runs)) if "**Entropy**" in line]
    assert "rose in 2 (by 10-25%) and fell in 1 (by 10%) of the 3 runs" in sentence


def test_the_ablation_doc_is_the_rendering_of_its_runs():
    """Every figure docs/learning/ablation.md quotes about the study is rendered from ablation.json: re-rendering
    changes nothing, and the hand-written part quotes none of the runs' figures."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "learning"
    study = json.loads((docs / "ablation.json").read_text())
    text = (docs / "ablation.md").read_text()
    rendered = ablation_report.generated(study, list(ablation_report.FIGURES))
    assert rendered in text, "run: python bench/learning/ablation.py --collect"
    assert "### What it shows, seed by seed" in rendered and "rose in 18" in rendered
    hand_written = text.split(ablation_report.BEGIN)[0]
    run_figures = {f"{run[key]:.3f}" for run in study["runs"] for key in ("val_acc_end", "entropy_end", "truncation_end")}
    assert not {figure for figure in run_figures if figure in hand_written}
    assert "0.572" in run_figures and "0.572" in rendered  # positive control: the scan reads figures the runs hold
