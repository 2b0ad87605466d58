"""The console of a run: a short line per step and per validation, a summary at the end (issue 17, item 5).

The metrics are shaped like a real step's (numpy scalars, ~200 keys); the backend runs inside verl's real
``Tracking`` (``DAPOTracking``) next to the metrics file, which still receives every metric.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from recipe_dapo.tracking.console import format_step_line, format_validation, validation_headlines
from recipe_dapo.tracking.tracker import DAPOTracking


def step_metrics(step: int) -> dict:
    metrics = {f"perf/extra_{i}": np.float64(i / 7) for i in range(180)}  # what verl adds besides
    metrics.update(
        {
            "training/global_step": step,
            "reward/acc_mean": np.float64(0.4375),
            "dynamic_sampling/keep_rate": np.float64(0.5),
            "dynamic_sampling/num_gen_rounds": np.float64(2.0),
            "dynamic_sampling/generated_tokens": np.float64(3000.0),
            "actor/pg_clipfrac_low": np.float64(0.00123),
            "actor/pg_clipfrac_high": np.float64(0.015),
            "response_length/mean": np.float64(27.25),
            "response_length/clip_ratio": np.float64(0.1),
            "timing_s/step": np.float64(41.23),
            "training/response_tokens": 1000,
            "overlong/filtered_token_ratio": np.float64(0.25),
        }
    )
    return metrics


def validation_metrics(mean: float) -> dict:
    return {
        "val/synthetic_arithmetic/mean@4": np.float64(mean),
        "val/synthetic_arithmetic/pass@1": np.float64(mean),
        "val/synthetic_arithmetic/pass@2": np.float64(0.1),
        "val/synthetic_arithmetic/pass@4": np.float64(0.125),
        "val/synthetic_arithmetic/num_problems": 31.0,
        "val/synthetic_arithmetic/response_length_mean": 20.0,
        "val-core/synthetic_arithmetic/acc/mean@4": np.float64(mean),
    }


def test_step_line_is_short_and_has_the_named_fields():
    line = format_step_line(3, 40, step_metrics(3))
    assert line == (
        "step 3/40 | acc 0.438 | keep 0.50 in 2 rounds | clip low 0.0012 high 0.0150 | len 27.2 (10.0% cut) | 41.2 s"
    )


def test_step_line_leaves_out_fields_whose_metrics_are_missing():
    # A step without an update (train_partial with nothing qualifying) has no actor or length metrics.
    assert format_step_line(5, None, {"dynamic_sampling/keep_rate": 0.0, "dynamic_sampling/num_gen_rounds": 1}) == (
        "step 5 | keep 0.00 in 1 round"
    )


def test_validation_line_shows_mean_and_the_largest_pass_per_source():
    headlines = validation_headlines({**validation_metrics(0.044), **{"val/aime24/mean@32": 0.2, "val/aime24/pass@32": 0.5}})
    assert format_validation(headlines) == (
        "synthetic_arithmetic: mean@4 0.044 pass@4 0.125 (31 problems) | aime24: mean@32 0.200 pass@32 0.500"
    )


def test_validation_falls_back_to_verls_core_means_without_per_problem_metrics():
    headlines = validation_headlines({"val-core/gsm8k/reward/mean@1": 0.5, "val-aux/gsm8k/reward/std@1": 0.1})
    assert format_validation(headlines) == "gsm8k: reward mean@1 0.500"


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / "global_step_4").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("4")
    return tmp_path


def run_four_steps(run_dir) -> tuple[str, DAPOTracking]:
    stream = io.StringIO()
    tracking = DAPOTracking(
        "recipe_dapo", "dapo_cpu", default_backend=["console", "file"], total_steps=4,
        checkpoint_dir=str(run_dir / "checkpoints"), console_stream=stream,
    )
    for step in (1, 2, 3, 4):
        metrics = step_metrics(step)
        if step in (2, 4):
            metrics.update(validation_metrics({2: 0.3, 4: 0.2}[step]))
        tracking.log(metrics, step=step)
    tracking.finish()
    return stream.getvalue(), tracking


def test_console_prints_one_short_line_per_step_and_validation_and_a_summary(run_dir):
    output, tracking = run_four_steps(run_dir)
    lines = output.splitlines()
    assert [line.split(" |")[0] for line in lines[:6]] == [
        "step 1/4", "step 2/4", "validation at step 2", "step 3/4", "step 4/4", "validation at step 4",
    ]
    assert max(len(line) for line in lines) < 200
    assert "np.float64" not in output and "perf/extra" not in output
    summary = "\n".join(lines[6:])
    assert lines[6].startswith("run finished: steps 1-4 in ")
    assert "validation, final (step 4): synthetic_arithmetic: mean@4 0.200 pass@4 0.125 (31 problems)" in summary
    assert "validation, best mean: synthetic_arithmetic 0.300 (step 2)" in summary
    assert f"checkpoint: {run_dir / 'checkpoints' / 'global_step_4'}" in summary
    assert f"metrics file: {tracking.logger['file'].filepath}" in summary
    # 4 x 3000 generated; 4 x 1000 in the trained batches, of which the overlong filter masked 25%.
    assert "tokens: 12.00k generated, 3.00k trained (25%)" in summary


def test_the_full_metrics_still_go_to_the_metrics_file(run_dir):
    _, tracking = run_four_steps(run_dir)
    records = [json.loads(line) for line in open(tracking.logger["file"].filepath)]
    assert len(records) == 4 and all(len(r["data"]) >= 190 for r in records)


def test_summary_is_printed_once(run_dir):
    output, tracking = run_four_steps(run_dir)
    tracking.finish()
    assert output.count("run finished") == 1
