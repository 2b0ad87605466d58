"""The ablation bench end to end on its own task, two steps of one arm: the pipeline works (no learning claim).

``python bench/learning/ablation.py --smoke`` builds the chain-arithmetic task and its tiny model (a short warm-up),
trains the ``grpo`` arm for 2 steps through the recipe's entry point with ``ablation=grpo_baseline`` and process
supervision (``objective=grpo_process``), and writes the run's record. The checks are on what the study's doc is
generated from: every field the doc reads is present and consistent with the run's own metrics file; and on the
process-supervised advantages: every response's steps were scored by the chain task's step scorer.
"""

from __future__ import annotations

import json

import pytest

from recipe_dapo.tracking.run_log import read_metrics

pytestmark = pytest.mark.e2e

FIELDS = ("arm", "seed", "steps", "generated_tokens", "val_acc_end", "entropy_end", "truncation_end",
          "informative_share", "clipfrac_low", "clipfrac_high", "wall_s")


def test_ablation_smoke_trains_two_steps_and_writes_every_field_the_doc_reads(ablation_smoke_run):
    # `python bench/learning/ablation.py --smoke --work-dir DIR`, run in the background while the unit tests ran
    # (tests/e2e/e2e_runs.py COMMANDS)
    folder, done = ablation_smoke_run
    work = folder / "ablation"
    log = work / "grpo_s0" / "train.log"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
    assert done.stdout.strip().splitlines()[-1].startswith("RESULT runs=1 ")

    study = json.loads((work / "ablation.json").read_text())
    (run,) = study["runs"]
    missing = [field for field in FIELDS if field not in run]
    assert not missing, missing
    assert (run["arm"], run["seed"], run["steps"], run["stop"]) == ("grpo", 0, 2, "finished")

    # The record agrees with the run's own metrics file: the generated tokens are the sum of what the sampler
    # logged, validation ran before training and after each step, and the informative share is what the sampler's
    # all-right and all-wrong ratios leave.
    metrics = read_metrics(work / "grpo_s0" / "metrics.jsonl")
    logged = sum(metrics[s]["dynamic_sampling/generated_tokens"] for s in (1, 2))
    assert run["generated_tokens"] == pytest.approx(logged) and logged > 0
    assert run["validation"]["step"] == [0, 1, 2]
    assert 0.0 <= run["val_acc_end"] <= 1.0 and run["val_acc_start"] is not None
    assert run["entropy_end"] > 0
    assert 0.0 <= run["truncation_end"] <= 1.0
    expected = [1 - metrics[s]["dynamic_sampling/solve_all_ratio"] - metrics[s]["dynamic_sampling/solve_none_ratio"]
                for s in (1, 2)]
    assert run["informative_share"] == pytest.approx(sum(expected) / 2)
    assert study["design"]["max_steps"] == 2
    # Process supervision ran: the chain scorer found steps in the responses and scored each (grpo_process).
    for step in (1, 2):
        assert metrics[step]["process/steps_per_response_mean"] > 0
        assert 0.0 <= metrics[step]["process/step_right_fraction"] <= 1.0
    assert "objective=grpo_process" in (work / "grpo_s0" / "command.txt").read_text()
