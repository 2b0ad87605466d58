"""The console of a run: a short line per step and per validation, a summary at the end.

The metrics are shaped like a real step's (numpy scalars, ~200 keys); the backend runs inside verl's real
``Tracking`` (``DAPOTracking``) next to the metrics file, which still receives every metric.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

from recipe_dapo.tracking.console import format_step_line, format_validation, validation_headlines
from recipe_dapo.tracking.tracker import DAPOTracking


def producer_metrics() -> dict:
    """What the recipe's producers really emit for one step: the dapo loss (one token clipped low, one high), a
    sampler step (two rounds, keep 5/8), the reward metrics of the scored responses. A rename in a producer
    changes these keys, and the console tests below fail."""
    import torch
    from test_dapo_loss_on_cpu import actor_config, loss_inputs
    from test_dynamic_sampling_on_cpu import ALL_RIGHT, ALL_WRONG, MIXED, make_config, run_step

    from recipe_dapo.dynamic_sampling import DATAPROTO_OPS, DynamicSampler
    from recipe_dapo.loss.dapo import compute_policy_loss_dapo
    from recipe_dapo.reward.metrics import reward_metrics

    inputs = loss_inputs([1.0, 1.5, 0.5, 1.0], [1.0, 1.0, -1.0, -1.0], [True] * 4)
    _, loss_metrics = compute_policy_loss_dapo(**inputs, loss_agg_mode="token-mean", config=actor_config())
    sampler = DynamicSampler(make_config(train_batch_size=4), DATAPROTO_OPS)
    rounds = [{"a": MIXED, "b": ALL_RIGHT, "c": ALL_WRONG, "d": MIXED}, {"e": MIXED, "f": MIXED, "g": MIXED, "h": ALL_RIGHT}]
    _, sampler_metrics = run_step(sampler, 1, rounds, tokens=[1000, 2000])
    scored = {"acc": np.array([True] * 7 + [False] * 9), "score": np.array([1.0] * 7 + [-1.0] * 9)}
    for key in ("pred", "verify_error"):
        scored[key] = np.array([""] * 16, dtype=object)
    metrics = {**loss_metrics, **sampler_metrics, **reward_metrics(scored)}
    return {key: np.float64(value.item() if isinstance(value, torch.Tensor) else value) for key, value in metrics.items()}


PRODUCED = None


def step_metrics(step: int) -> dict:
    global PRODUCED
    if PRODUCED is None:
        PRODUCED = producer_metrics()
    metrics = {f"perf/extra_{i}": np.float64(i / 7) for i in range(180)}  # what verl adds besides
    metrics.update(PRODUCED)
    metrics.update(
        {  # verl's own names (its metric_utils)
            "training/global_step": step,
            "response_length/mean": np.float64(27.25),
            "response_length/clip_ratio": np.float64(0.1),
            "timing_s/step": np.float64(41.23),
            # tokens that carried loss (the trainers count them after the overlong filter), and that filter's share
            "training/response_tokens": 750,
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
        "step 3/40 | acc 0.438 | keep 0.62 in 2 rounds | clip low 0.2500 high 0.2500 | len 27.2 (10.0% cut) | 41.2 s"
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


def test_the_module_docstring_shows_the_summary_lines_as_printed(run_dir):
    """The example at the top of ``tracking/console.py`` has the summary's lines, labelled as the console prints them."""
    import re

    import recipe_dapo.tracking.console as console

    def labels(lines: list[str]) -> list[str]:
        return [re.sub(r"\d+", "N", line.split(":", 1)[0].strip()) for line in lines]

    example = console.__doc__.split("run finished:", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    output, _ = run_four_steps(run_dir)
    assert labels(example) == labels(output.split("run finished:", 1)[1].splitlines()[1:])


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
    # The final validation's line came just before (it is not repeated); the best mean ends the change line.
    assert "validation, final" not in summary
    assert ("validation, step 2 -> step 4: synthetic_arithmetic 0.300 -> 0.200 (-0.100); best mean "
            "synthetic_arithmetic 0.300 (step 2)") in summary
    assert f"checkpoint: {run_dir / 'checkpoints' / 'global_step_4'}" in summary
    assert f"metrics file: {tracking.logger['file'].filepath}" in summary
    # 4 x 3000 generated (the sampler's two rounds); 4 x 750 carried loss, counted once (not less the filter's share
    # again: the trainers count after the overlong filter).
    assert lines[6].endswith(" | tokens: 12.00k generated, 3.00k trained (25%)")


def test_the_summary_says_what_training_changed_from_the_validation_before_it(run_dir):
    stream = io.StringIO()
    tracking = DAPOTracking("recipe_dapo", "dapo_cpu", default_backend=["console"], total_steps=2,
                            checkpoint_dir=str(run_dir / "checkpoints"), console_stream=stream)
    tracking.log(validation_metrics(0.25), step=0)  # trainer.val_before_train
    tracking.log(step_metrics(1), step=1)
    tracking.log({**step_metrics(2), **validation_metrics(0.5)}, step=2)
    tracking.finish()
    output = stream.getvalue()
    assert "validation at step 0 | synthetic_arithmetic: mean@4 0.250" in output
    assert "  validation, before training -> step 2: synthetic_arithmetic 0.250 -> 0.500 (+0.250)" in output.splitlines()


def test_one_validation_gives_no_change_line(run_dir):
    stream = io.StringIO()
    tracking = DAPOTracking("recipe_dapo", "dapo_cpu", default_backend=["console"], total_steps=1,
                            checkpoint_dir=str(run_dir / "checkpoints"), console_stream=stream)
    tracking.log({**step_metrics(1), **validation_metrics(0.5)}, step=1)
    tracking.finish()
    assert "validation, final (step 1)" in stream.getvalue() and " -> " not in stream.getvalue()


def test_the_full_metrics_still_go_to_the_metrics_file(run_dir):
    _, tracking = run_four_steps(run_dir)
    records = [json.loads(line) for line in open(tracking.logger["file"].filepath)]
    assert len(records) == 4 and all(len(r["data"]) >= 190 for r in records)


def test_summary_is_printed_once(run_dir):
    output, tracking = run_four_steps(run_dir)
    tracking.finish()
    assert output.count("run finished") == 1


def test_summary_ends_with_how_to_continue_from_the_last_checkpoint(run_dir):
    output, _ = run_four_steps(run_dir)
    assert output.splitlines()[-1] == (
        "  to train further: raise trainer.total_training_steps and rerun the same command "
        "(trainer.resume_mode=auto continues from it)"
    )


def test_a_failed_or_stopped_run_ends_with_the_summary_and_the_resume_line(run_dir):
    for outcome, expected in (("failed at step 3 (RuntimeError)", "run failed at step 3 (RuntimeError): steps 1-2"),
                              ("stopped by SIGTERM after step 2", "run stopped by SIGTERM after step 2: steps 1-2")):
        stream = io.StringIO()
        tracking = DAPOTracking("recipe_dapo", "dapo_cpu", default_backend=["console"], total_steps=4,
                                checkpoint_dir=str(run_dir / "checkpoints"), console_stream=stream,
                                resume_mode="disable")
        for step in (1, 2):
            tracking.log(step_metrics(step), step=step)
        tracking.finish(exit_code=1, outcome=outcome)
        lines = stream.getvalue().splitlines()
        assert lines[2].startswith(expected + " in ")
        assert f"  checkpoint: {run_dir / 'checkpoints' / 'global_step_4'}" in lines
        assert lines[-1] == "  to resume: rerun with trainer.resume_mode=auto (trainer.resume_mode=disable starts over)"


def test_summary_without_a_checkpoint_says_so_and_prints_no_verl_noise(tmp_path, capsys):
    from recipe_dapo.tracking.console import RunConsole

    stream = io.StringIO()
    console = RunConsole(total_steps=2, checkpoint_dir=str(tmp_path / "none_yet"), stream=stream)
    console.finish()
    assert "  checkpoint: none saved (trainer.save_freq)" in stream.getvalue()
    assert stream.getvalue().splitlines()[-1].startswith("  to resume: no checkpoint saved, a rerun starts from step 0")
    captured = capsys.readouterr()
    assert "Checkpoint tracker file does not exist" not in captured.out + captured.err


def console_output(make):
    """What ``make()`` prints through the console logger (the stream every recipe line of the process goes to)."""
    from recipe_dapo.tracking.console import _ensure_handler

    stream = io.StringIO()
    _ensure_handler(stream)
    made = make()
    return made, [line for line in stream.getvalue().splitlines() if line]


def test_a_rerun_says_in_one_plain_line_that_it_starts_fresh_and_where_the_earlier_metrics_went(run_dir, monkeypatch):
    """The default run saves no checkpoint: a rerun starts fresh and moves the earlier run's metrics aside. The line
    comes from the task runner (a Ray actor); the driver's console shows it without Ray's prefix or colours."""
    from recipe_dapo.tracking.noise import TAG, ConsoleRouter
    from recipe_dapo.tracking.run_log import superseded_path

    run_four_steps(run_dir)  # the first run: 4 steps in the metrics file
    monkeypatch.setenv("DAPO_CONSOLE_TAG", "1")  # as in a worker of a run whose driver routes the console
    rerun, printed = console_output(lambda: DAPOTracking(
        "recipe_dapo", "dapo_cpu", default_backend=["file"], resumed_step=0))
    assert len(printed) == 1 and printed[0].startswith(TAG), printed
    metrics_file = os.path.abspath(rerun.logger["file"].filepath)
    # Through Ray's printer (prefix, colours) and the driver's console router: one plain line.
    router = ConsoleRouter()
    router.route("\x1b[36m(DAPOTaskRunner pid=29834)\x1b[0m Using dataset class: RLHFDataset")  # start-up's line
    shown = router.route(f"\x1b[36m(DAPOTaskRunner pid=29834)\x1b[0m {printed[0]}")
    assert shown == (f"metrics: a fresh start (no checkpoint to resume from); the 4 lines of steps 1-4 already in "
                     f"{metrics_file} were moved to {superseded_path(metrics_file)}")
    rerun.finish()
    assert os.path.getsize(metrics_file) == 0 and len(open(superseded_path(metrics_file)).readlines()) == 4


def test_a_resume_says_which_steps_stay_and_which_are_logged_again(run_dir):
    run_four_steps(run_dir)
    resumed, printed = console_output(lambda: DAPOTracking("recipe_dapo", "dapo_cpu", default_backend=["file"],
                                                           resumed_step=2))
    path = os.path.abspath(resumed.logger["file"].filepath)
    assert printed == [f"metrics: resuming from the checkpoint of step 2; steps 1-2 stay in {path}, the 2 lines of "
                       f"steps 3-4 (logged after that checkpoint, trained again now) were moved to "
                       f"{path[:-len('.jsonl')]}.superseded.jsonl"]
    resumed.finish()
    first, printed = console_output(lambda: DAPOTracking("recipe_dapo", "other", default_backend=["file"]))
    assert printed == []  # a first run: nothing to resume, nothing set aside (the summary names the file)
    first.finish()
    again, printed = console_output(lambda: DAPOTracking("recipe_dapo", "other", default_backend=["file"]))
    assert printed == [f"metrics: a fresh start (no checkpoint to resume from), logging to "
                       f"{os.path.abspath(again.logger['file'].filepath)}"]
    again.finish()


def test_once_a_stop_signal_came_the_console_shows_the_recipes_lines_and_not_the_aborted_rollouts_errors():
    """A pre-empted v1 run aborts its engines' requests: its agent-loop workers then print an error and a traceback
    per aborted prompt (about 2000 lines in a CPU run). Before the signal such an error is shown (a real failure);
    after it (``quiet_workers``, called by the driver's guard) only the recipe's lines are, worker or driver."""
    from recipe_dapo.tracking.noise import TAG, ConsoleRouter

    worker = "\x1b[36m(_DAPOAgentLoopWorkerTQ pid=5312)\x1b[0m "
    error = [worker + "ERROR:2026-11-26 21:20:24,426:Error in _run_prompt for uid=a63d689b",
             worker + "Traceback (most recent call last):",
             worker + '  File "/verl/experimental/agent_loop/agent_loop.py", line 695, in _run_agent_loop',
             worker + "ray.exceptions.RayTaskError(IndexError): ray::RewardLoopWorker.compute_score()"]
    summary = "\x1b[36m(DAPOTaskRunner pid=29834)\x1b[0m " + TAG + "run stopped by SIGTERM in step 3's generation"
    router = ConsoleRouter()
    router.starting = False
    assert [router.route(line) for line in error] == [line for line in error]  # (the control: shown while training)
    router.stopping = True
    assert [router.route(line) for line in error] == [None] * len(error)
    assert router.route(summary) == "run stopped by SIGTERM in step 3's generation"
    assert router.route(TAG + "recipe_dapo: stopped by SIGTERM; last checkpoint: none", driver_stderr=True) == (
        "recipe_dapo: stopped by SIGTERM; last checkpoint: none")
