"""The objectives study's pure parts: the paired differences, the no-verdict rule, the rendered doc and the arms'
overrides. No training: a small synthetic study JSON goes through ``--summarize-only``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "learning"))

import objectives  # noqa: E402


def _run(arm: str, seed: int, **figures) -> dict:
    base = {"arm": arm, "seed": seed, "steps": 4, "generated_tokens": 12345.0, "val_acc_start": 0.4,
            "val_acc_end": 0.5, "step_right": 0.8, "process_logged": None, "wrong_share": 0.5, "wrong_length": 30.0,
            "response_length_end": 28.0, "entropy_end": 0.1, "clipfrac_low": 0.0, "clipfrac_high": 0.0,
            "wall_s": 100.0}
    return {**base, **figures}


def _study(runs: list[dict], seeds=(0, 1, 2)) -> dict:
    return {"design": {"budget_tokens": 12000, "test_freq": 2}, "seeds": list(seeds), "kl_free": ["grpo", "grpo_process"],
            "command": "python bench/learning/objectives.py --budget-tokens 12000",
            "wall_s": sum(r["wall_s"] for r in runs), "runs": runs}


def _three_seeds() -> dict:
    # grpo_process ahead of grpo by 0.10, 0.12, 0.08 in accuracy; dr_grpo's wrong responses 5, 6, 4 tokens shorter;
    # clip_cov's entropy 0.01 above dapo's with one seed below zero (a null).
    runs = []
    for seed, (acc_gap, len_gap, ent) in enumerate([(0.10, 5.0, 0.02), (0.12, 6.0, -0.01), (0.08, 4.0, 0.02)]):
        runs += [_run("grpo", seed, val_acc_end=0.5, wrong_length=30.0),
                 _run("grpo_process", seed, val_acc_end=0.5 + acc_gap, process_logged=0.85),
                 _run("dr_grpo", seed, wrong_length=30.0 - len_gap),
                 _run("dapo", seed, entropy_end=0.1),
                 _run("clip_cov", seed, entropy_end=0.1 + ent)]
    return _study(runs)


def test_paired_differences_and_their_t_interval():
    diffs, (mean, low, high) = objectives.paired(_three_seeds(), "val_acc_end", "grpo_process", "grpo")
    assert diffs == pytest.approx([0.10, 0.12, 0.08])
    assert mean == pytest.approx(0.10)
    # sample sd of (0.10, 0.12, 0.08) is 0.02; half-width t(0.975, 2) * 0.02 / sqrt(3)
    assert high - mean == pytest.approx(4.303 * 0.02 / math.sqrt(3))
    assert low > 0
    diffs, (mean, _, high) = objectives.paired(_three_seeds(), "wrong_length", "dr_grpo", "grpo")
    assert diffs == pytest.approx([-5.0, -6.0, -4.0]) and mean == pytest.approx(-5.0) and high < 0


def test_verdicts_positive_negative_null_and_none_from_one_seed():
    study = _three_seeds()
    assert "is higher than grpo" in objectives.verdict(
        objectives.paired(study, "val_acc_end", "grpo_process", "grpo")[1], 3, "grpo_process", "grpo", "accuracy")
    assert "is lower than grpo" in objectives.verdict(
        objectives.paired(study, "wrong_length", "dr_grpo", "grpo")[1], 3, "dr_grpo", "grpo", "length")
    assert objectives.verdict(objectives.paired(study, "entropy_end", "clip_cov", "dapo")[1], 3,
                              "clip_cov", "dapo", "entropy").startswith("Null:")
    # Positive control of the rule: the same large, clean gap from one seed gives no verdict at all.
    one_seed = _study([r for r in study["runs"] if r["seed"] == 0])
    diffs, stats = objectives.paired(one_seed, "val_acc_end", "grpo_process", "grpo")
    assert diffs == pytest.approx([0.10])
    text = objectives.verdict(stats, len(diffs), "grpo_process", "grpo", "accuracy")
    assert text.startswith("No verdict") and "higher" not in text
    # An arm missing at a seed drops that seed from the pairs (kl_cov never ran): no pairs, no verdict.
    assert objectives.paired(study, "entropy_end", "kl_cov", "dapo")[0] == []


def test_summarize_only_renders_the_doc_and_the_result_line(tmp_path, capsys):
    study = _three_seeds()
    study["runs"] = [r for r in study["runs"] if not (r["seed"] == 2 and r["arm"] == "clip_cov")]  # stopped mid-seed
    (tmp_path / "objectives.json").write_text(json.dumps(study))
    assert objectives.main(["--summarize-only", "--docs-dir", str(tmp_path)]) == 0
    doc = (tmp_path / "objectives.md").read_text()
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith("RESULT runs=14 ")
    assert "process_acc=+0.1000[" in printed[-1] and "n=3" in printed[-1]
    assert "klcov_entropy=+nan" in printed[-1] and "n=0" in printed[-1]
    assert "| grpo_process | 3 | 0.600 [" in doc  # arm mean over its seeds
    assert "| clip_cov | 2 |" in doc  # only the seeds that finished
    assert "per seed +0.0200, -0.0100;" in doc  # clip_cov - dapo entropy, seeds 0 and 1
    assert "No verdict: 2 paired seeds" not in doc and "No verdict: 0 paired seeds" in doc  # kl_cov
    assert "ran without the preset's KL" in doc
    assert doc.count("| grpo | ") == 4  # the mean table and every run (3 seeds)
    one = _study([r for r in study["runs"] if r["seed"] == 0])
    (tmp_path / "objectives.json").write_text(json.dumps(one))
    assert objectives.main(["--summarize-only", "--docs-dir", str(tmp_path)]) == 0
    doc = (tmp_path / "objectives.md").read_text()
    assert "| grpo_process | 1 | 0.600 (one seed: no interval) |" in doc
    assert "is higher than" not in doc and doc.count("No verdict: 1 paired seed ") == 5


def test_arm_overrides_put_the_preset_last_and_drop_the_kl_only_for_the_grpo_presets():
    run_dir = Path("/runs/x")
    grpo = objectives.arm_overrides("grpo_process", run_dir)
    assert grpo[0] == "objective=grpo_process"
    assert "actor_rollout_ref.actor.use_kl_loss=false" in grpo and "actor_rollout_ref.actor.kl_loss_coef=0" in grpo
    assert f"trainer.rollout_data_dir={run_dir / 'rollouts'}" in grpo
    assert not any("kl_loss" in o for o in objectives.arm_overrides("clip_cov", run_dir))
    assert set(objectives.DEFAULT_ARMS) <= set(objectives.ARMS) and {"gspo", "cispo"} <= set(objectives.ARMS)
