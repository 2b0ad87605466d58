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


# ----------------------------------------------------------------------------- the prompt-skipping pair

run_learning = pytest.importorskip("run_learning")
SKIP = "dynamic_sampling/skip/"


def synthetic_run(folder, steps, tokens_per_step, val_every=10, skipped_per_step=0, keep_rate=0.7, wall=100):
    """A run's metrics.jsonl: validation = step / 100 every ``val_every`` steps (0.25 before training)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(0, {"val/synthetic_arithmetic/mean@4": 0.25})]
    for step in range(1, steps + 1):
        data = {"reward/acc_mean": 0.3, "actor/entropy": 0.2, "response_length/mean": 14.0,
                "dynamic_sampling/generated_groups": 10, "dynamic_sampling/generated_tokens": tokens_per_step,
                "dynamic_sampling/keep_rate": keep_rate}
        if skipped_per_step:
            data.update({SKIP + "skipped_fraction": 0.2, SKIP + "total_skipped_prompts": skipped_per_step * step,
                         SKIP + "total_generated_after_skip": 2 * step, SKIP + "total_qualified_after_skip": step})
        rows.append((step, data))
        if step % val_every == 0:
            rows.append((step, {"val/synthetic_arithmetic/mean@4": step / 100}))
    write_jsonl(folder / "metrics.jsonl", rows)
    (folder / "wall_seconds.txt").write_text(f"{wall}\n")


def test_the_skip_table_compares_the_arms_at_the_baselines_steps_and_at_its_tokens(tmp_path):
    # dapo: 60 steps x 1000 tokens = 60k. dapo_skip: 800 tokens a step for 80 steps = 64k; at equal tokens (60k,
    # step 75) its last validation is step 70 (56k tokens, 0.70); at equal steps (60) it has spent 48k.
    synthetic_run(tmp_path / "dapo_s0", 60, 1000)
    synthetic_run(tmp_path / "dapo_skip_s0", 80, 800, skipped_per_step=3, keep_rate=0.8, wall=150)
    pair = summarize.PAIRS["skip"]
    runs = summarize.load_runs(tmp_path, [0], n=8, train_batch_size=8, pair=pair)
    baseline, skipping = runs[("dapo", 0)], runs[("dapo_skip", 0)]
    f = summarize.skipping_figures(skipping, budget=60_000, baseline_steps=60)
    assert (f["val_at_budget"], f["tokens_at_budget"]) == (0.70, 56_000)
    assert (f["val_at_steps"], f["tokens_at_steps"]) == (0.60, 48_000)
    assert f["skipped_prompts"] == 240 and f["later_qualified"] == 0.5 and f["keep_rate_mean"] == pytest.approx(0.8)
    base = summarize.skipping_figures(baseline, budget=60_000, baseline_steps=60)
    assert (base["val_at_budget"], base["val_at_steps"], base["skipped_prompts"]) == (0.60, 0.60, 0)
    assert np.isnan(base["later_qualified"])
    table = summarize.skipping_table(runs, pair)
    assert "| DAPO + prompt skipping | 0 | 80 | 64000 | 0.250 | 0.600 (48000) | 0.700 (56000) |" in table
    assert table.index("DAPO (recipe defaults)") < table.index("DAPO + prompt skipping")  # baseline first


def test_both_pairs_write_their_own_block_into_the_one_learning_doc_and_keep_everything_around_them(tmp_path):
    # The pairs share one folder: the dapo arm they both compare against is one set of runs.
    for seed in (0, 1):
        synthetic_run(tmp_path / "runs" / f"dapo_s{seed}", 20, 1000)
        synthetic_run(tmp_path / "runs" / f"grpo_s{seed}", 25, 800)
        synthetic_run(tmp_path / "runs" / f"dapo_skip_s{seed}", 25, 800, skipped_per_step=2)
    docs = tmp_path / "docs"
    docs.mkdir()
    ablation = "<!-- BEGIN GENERATED (bench/learning/ablation.py) -->\nthe ablation's tables\n" + summarize.END
    skip, pair = summarize.PAIRS["skip"], summarize.PAIRS["dapo-grpo"]
    (docs / "ablation.md").write_text(f"# Findings\n\nWritten by hand.\n\n{ablation}\n\nBetween.\n\n"
                                      f"{skip.begin}\nold\n{summarize.END}\ntail\n")
    for each in (skip, pair):  # the second pair's block does not exist yet: it is appended
        summarize.write_outputs(tmp_path / "runs", docs, [0, 1], 8, 8, f"python bench/learning/run_learning.py --pair "
                                f"{each.name}", pair=each)
    text = (docs / "ablation.md").read_text()
    assert text.startswith(f"# Findings\n\nWritten by hand.\n\n{ablation}\n\nBetween.\n\n{skip.begin}")
    assert "\nold\n" not in text and "\ntail\n" in text and text.rstrip().endswith(summarize.END)
    assert text.count(skip.begin) == text.count(pair.begin) == 1 and text.count(summarize.END) == 3
    assert "![learning curves](skipping_curves.png)" in text and "![learning curves](learning_curves.png)" in text
    assert text.index("DAPO + prompt skipping") < text.index(pair.begin) < text.index("GRPO baseline")
    assert (docs / "skipping_curves.png").stat().st_size > 10_000 and (docs / "learning_curves.png").exists()
    assert {p.name for p in docs.glob("*.md")} == {"ablation.md"}


def test_the_skipping_arm_trains_until_it_has_generated_the_baselines_tokens(tmp_path, monkeypatch):
    # The arm generates 800 tokens a step: 60 steps give 48k of a 60k budget, so it resumes for
    # ceil(12k / 800) = 15 more steps (75 in all) and then stops.
    calls = []

    def fake_train_arm(arm, seed, steps, args, assets, resumable=False, fresh=False):
        calls.append((arm, steps, resumable, fresh))
        synthetic_run(args.work_dir / f"{arm}_s{seed}", steps, 800)
        return args.work_dir / f"{arm}_s{seed}"

    monkeypatch.setattr(run_learning, "train_arm", fake_train_arm)
    args = run_learning.build_parser().parse_args(["--pair", "skip", "--work-dir", str(tmp_path)])
    run_learning.train_to_budget("dapo_skip", 0, 60_000, 60, args, assets={})
    assert calls == [("dapo_skip", 60, True, False), ("dapo_skip", 75, True, False)]
    calls.clear()  # invoked again: it continues from the 75 steps already run, which meet the budget
    run_learning.train_to_budget("dapo_skip", 0, 60_000, 60, args, assets={})
    assert calls == [("dapo_skip", 75, True, False)]


def test_every_arms_config_passes_the_start_up_rules(tmp_path):
    from conftest import compose_recipe_config
    from recipe_dapo.cpu.assets import write_dataset
    from recipe_dapo.preflight import check_config

    train, val = write_dataset(tmp_path, num_train=16, num_val=4, seed=0)
    assets = {"train_file": str(train), "val_file": str(val), "model_path": str(tmp_path / "absent_model")}
    args = run_learning.build_parser().parse_args(["--pair", "skip"])
    for arm in ("dapo", "grpo", "dapo_skip"):
        overrides = run_learning.arm_overrides(arm, 0, 60, args, assets, tmp_path / arm, resumable=arm == "dapo_skip")
        config = compose_recipe_config([*run_learning.GROUPS, *overrides])
        check_config(config, absent_inputs_ok=True, dry_run=True)
        assert config.dapo.dynamic_sampling.skip.enable == (arm == "dapo_skip")
        assert config.trainer.save_freq == (60 if arm == "dapo_skip" else -1)
        assert config.algorithm.filter_groups.enable == (arm != "grpo")
        assert (config.data.train_batch_size, config.actor_rollout_ref.rollout.n) == (8, 8)
