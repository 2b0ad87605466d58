"""The learning experiment's summary (bench/learning/summarize.py): budget accounting and table figures."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "learning"))
summarize = pytest.importorskip("summarize")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps({"step": step, "data": data}) + "\n" for step, data in rows))


def test_generation_budget_counts_every_generated_group_of_a_filtered_step():
    # Step 1 (DAPO): 12 groups generated x n=4 = 48 responses; length 10 -> 480 tokens.
    # Step 2 (no sampler metric, GRPO): train_batch_size 8 x 4 = 32 responses; the exact all-response length
    # (reward/response_length_mean = 5) wins over the trained-batch one (7) -> 160 tokens.
    metrics = {
        1: {"dynamic_sampling/generated_groups": 12, "response_length/mean": 10.0},
        2: {"response_length/mean": 7.0, "reward/response_length_mean": 5.0},
    }
    responses, tokens = summarize.generation_budget(metrics, [1, 2], n=4, train_batch_size=8)
    assert responses.tolist() == [48, 32]
    assert tokens.tolist() == [480, 160]


def test_generation_budget_prefers_the_exact_token_count_the_sampler_logged():
    # 12 groups x n=4, trained-batch length 10 would estimate 480; the sampler counted 530 generated tokens.
    metrics = {1: {"dynamic_sampling/generated_groups": 12, "dynamic_sampling/generated_tokens": 530.0,
                   "response_length/mean": 10.0}}
    responses, tokens = summarize.generation_budget(metrics, [1], n=4, train_batch_size=8)
    assert responses.tolist() == [48] and tokens.tolist() == [530]


def test_moving_average_is_trailing_and_shorter_at_the_start():
    # window 2: [1], [1,3], [3,5], [5,7] -> 1, 2, 4, 6
    assert summarize.moving_average(np.array([1, 3, 5, 7]), 2).tolist() == [1, 2, 4, 6]


def test_load_run_reads_validation_before_training_and_places_it_at_zero_tokens(tmp_path):
    rows = [(0, {"val/synthetic_arithmetic/mean@4": 0.25})]
    for step in range(1, 7):  # acc 0.1 .. 0.6, entropy 1.0 .. 0.5, 8 groups x n=2 x length 4 = 64 tokens a step
        rows.append((step, {"reward/acc_mean": step / 10, "actor/entropy": 1.1 - step / 10,
                            "response_length/mean": 4.0, "actor/pg_clipfrac": 0.01}))
    rows.append((6, {"val/synthetic_arithmetic/mean@4": 0.5}))
    write_jsonl(tmp_path / "metrics.jsonl", rows)
    run = summarize.load_run(tmp_path / "metrics.jsonl", n=2, train_batch_size=8)
    assert run.val_key == "val/synthetic_arithmetic/mean@4"
    assert run.tokens_at(run.val_series()[0]).tolist() == [0, 6 * 64]
    f = summarize.final_figures(run, last=5)
    # first 5 steps: acc mean(0.1..0.5) = 0.3; last 5: mean(0.2..0.6) = 0.4
    assert f["train_acc_first"] == pytest.approx(0.3) and f["train_acc_last"] == pytest.approx(0.4)
    assert (f["val_start"], f["val_end"], f["generated_responses"], f["steps"]) == (0.25, 0.5, 96, 6)
    assert np.isnan(f["clipfrac_high_mean"])
