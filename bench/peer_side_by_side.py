"""DAPO on CPU, side by side: the recipe on verl's classic trainer, the recipe on verl's v1 trainer, verl v1 as shipped.

Same tiny model, data and overrides for every arm (the default CPU run: ``platform=cpu size=cpu_tiny``, dynamic
sampling on ``acc``, the recipe's reward manager and ``dapo`` loss); only the trainer and its sampler differ:

- ``recipe_v0``: ``python -m recipe_dapo.main_dapo trainer.use_v1=false`` (deficit rounds, surplus carried over);
- ``recipe_v1``: ``python -m recipe_dapo.main_dapo trainer.use_v1=true`` (verl v1, the recipe's DAPOReplayBuffer:
  groups judged as they finish, refills sized to the deficit, surplus kept, 0.05 s poll);
- ``verl_v1``: verl's own v1 entry (``TaskRunnerV1``, trainer ``sync``, verl's ReplayBuffer with
  ``algorithm.filter_groups.enable=true``: refills of 2 prompts per filtered group, surplus deleted, 2 s poll);
- ``verl_v1_fast_poll``: the same, with verl's ReplayBuffer poll interval set to 0.05 s (the recipe's) inside the
  arm's task-runner process (``ReplayBuffer.poll_interval`` is hard-coded to 2 s and not reachable from the config;
  this arm sets it on every ReplayBuffer the process builds). The fair peer for per-step time.

Arms run one after another in each repeat, in rotated order (the machine is shared and noisy), each in its own
folder, process session and local Ray, under the same ``nice``. Per arm: seconds per step (mean over steps 2..N, the
first step pays for compilation and warm-up), generated groups per trained group and that over the ideal (1 / keep
rate, keep rate = qualifying / generated over the run: so ``gen/ideal`` = qualifying / trained, 1.000 when every
qualifying group was trained; the run's final pool counts against it), qualifying groups discarded (recipe: dropped
as older than max_staleness; verl: ``discarded_surplus_samples``), where a step's time goes, and peak memory (the
largest sum of PSS over every process of the run, sampled every 0.5 s). Each figure is the mean over the repeats that
completed, with [min-max] where it varies; the table says how many completed per arm. A repeat that failed is
reported, not skipped: the RESULT line carries ``failed_repeats=<count>`` (and which arm and repeat under the table),
and the bench exits with status 1.

Where a step's time goes (means over steps 2..N; ``COLUMNS`` says what each column measures, and the bench prints it
under the table): verl's own timers for every arm (``timing_s/gen``: sampling, from the step's start until the batch
is handed over; ``reward``, ``old_log_prob``, ``adv`` + ``update_actor``, ``update_weights``; ``other``: the step less
those), and for the v1 arms what verl does not time, measured in the trainer's process with the same code for the
recipe and verl (``recipe_dapo.trainers.v1.phase_timing``; the recipe's trainer logs it, the verl arms' task runner
installs it): the replay buffer asleep between polls (``poll_wait``: generation runs meanwhile), the trainer's
TransferQueue reads and writes (during sampling, and over the whole step), and the rest of sampling (judging groups,
fetching and dispatching refills); the drain (waiting, once the batch is full, for the prompts still in flight: the
recipe's ``dynamic_sampling/drain_s``, and for verl the bench's own ``timing_s/drain`` from the first poll that held a
full batch); prompt batches sent to generation per step (each about one generation wave on vLLM-CPU). Not split out:
the agent-loop workers' own TransferQueue writes while generating (part of generation).

Run (about 3 minutes per arm and repeat on 2 cores):

    python bench/peer_side_by_side.py                      # 10 steps, 3 repeats, 4 arms
    python bench/peer_side_by_side.py --steps 5 --repeats 1 --arms recipe_v1 verl_v1_fast_poll
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("recipe_v0", "recipe_v1", "verl_v1", "verl_v1_fast_poll")
FAST_POLL_S = 0.05
"""verl_v1_fast_poll's ReplayBuffer poll interval: the recipe's ``dapo.dynamic_sampling.poll_interval_s`` default."""
VERL_V1 = [
    # verl's own sampler and trainer: the recipe's custom sampler removed, verl's DAPO filter on.
    "trainer.use_v1=true",
    "trainer.v1.sampler.custom_sampler.path=null",
    "trainer.v1.sampler.custom_sampler.name=null",
    "algorithm.filter_groups.enable=true",
]


def run_verl_v1(overrides: list[str], poll_interval_s: float | None = None) -> None:
    """The ``verl_v1`` arm's process: the same composed config, trained by verl's TaskRunnerV1 (timed as
    :func:`timed_task_runner` says); with ``poll_interval_s`` (``verl_v1_fast_poll``), every verl ReplayBuffer the
    task runner builds polls that often."""
    from recipe_dapo.tracking.noise import attach_log_file, install_console_filter

    install_console_filter()
    from recipe_dapo.config.compose import compose
    from recipe_dapo.cpu.memory import apply_cpu_kv_cache

    config = compose(overrides)
    attach_log_file(config)
    apply_cpu_kv_cache(config)
    from verl.trainer.main_ppo import run_ppo

    run_ppo(config, task_runner_class=timed_task_runner(poll_interval_s))


def timed_task_runner(poll_interval_s: float | None):
    """verl's TaskRunnerV1 as a Ray actor whose process times verl's step as the recipe's v1 trainer times its own
    (``recipe_dapo.trainers.v1.phase_timing``: ``timing_s/tq_read``, ``tq_write``, ``gen_tq``, ``poll_wait``), plus
    ``timing_s/drain`` (the part of sampling after verl's buffer first held a full batch: its sync mode then waits
    for every prompt in flight) and ``bench/submissions``, ``bench/submitted_prompts`` (prompt batches sent to the
    agent loop in the step: the first batch and every refill). With ``poll_interval_s``, every verl ReplayBuffer the
    process builds polls that often (verl hard-codes 2 s: ``ReplayBuffer.__init__(poll_interval=2.0)``, not passed by
    its trainer)."""
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1

    @ray.remote
    class TimedTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):  # the plain class behind verl's @ray.remote
        def __init__(self):
            super().__init__()
            instrument_verl_v1(poll_interval_s)

    return TimedTaskRunnerV1


def instrument_verl_v1(poll_interval_s: float | None) -> None:
    """In this process: time verl v1's step (see :func:`timed_task_runner`); once."""
    from verl.trainer.ppo.v1 import replay_buffer, trainer_base

    from recipe_dapo.trainers.v1.phase_timing import CLOCK, POLL_WAIT, install_tq_timing, timed, timed_step

    buffer_class, trainer_class = replay_buffer.ReplayBuffer, trainer_base.PPOTrainer
    if getattr(trainer_class.step, "bench_timed", False):
        return
    install_tq_timing()
    counts = {"submissions": 0, "submitted_prompts": 0}
    verl_init, verl_sample, verl_sampleable = (buffer_class.__init__, buffer_class.sample,
                                                 buffer_class._sampleable_terminal_keys)
    verl_step, verl_submit = trainer_class.step, trainer_class._submit_batch_to_rollout

    def init(buffer, *args, **kwargs):
        verl_init(buffer, *args, **kwargs)
        if poll_interval_s is not None:
            buffer.poll_interval = poll_interval_s

    def sample(buffer, global_steps, partition_id, batch_size):
        buffer.bench_full_at, buffer.bench_batch_size = None, batch_size
        try:
            return verl_sample(buffer, global_steps, partition_id, batch_size)
        finally:
            if partition_id == "train" and buffer.bench_full_at is not None:
                CLOCK.add("drain", time.perf_counter() - buffer.bench_full_at)

    def sampleable(buffer, *args, **kwargs):
        keys = verl_sampleable(buffer, *args, **kwargs)
        if getattr(buffer, "bench_full_at", 0) is None and len(keys) >= buffer.bench_batch_size:
            buffer.bench_full_at = time.perf_counter()
        return keys

    def submit(trainer, batch):
        counts["submissions"] += 1
        counts["submitted_prompts"] += len(batch)
        return verl_submit(trainer, batch)

    def step(trainer, metrics, timing_raw):
        counts.update(submissions=0, submitted_prompts=0)
        try:
            return timed_step(lambda m, t: verl_step(trainer, m, t), trainer.replay_buffer, metrics, timing_raw)
        finally:
            metrics.update({f"bench/{name}": float(value) for name, value in counts.items()})

    step.bench_timed = True
    buffer_class.__init__, buffer_class.sample, buffer_class._sampleable_terminal_keys = init, sample, sampleable
    buffer_class._wait_for_next_poll = timed(buffer_class._wait_for_next_poll, POLL_WAIT)
    trainer_class.step, trainer_class._submit_batch_to_rollout = step, submit
    poll = "verl's 2 s" if poll_interval_s is None else f"set to {poll_interval_s} s"
    print(f"verl v1 timed by the bench; ReplayBuffer.poll_interval {poll}", flush=True)


def session_pss_bytes(sid: int) -> int:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != sid:
                continue
            with open(f"/proc/{entry}/smaps_rollup") as handle:
                for line in handle:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
    return total


def end_session(sid: int) -> None:
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.getsid(int(entry)) == sid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def run_arm(arm: str, repeat: int, args, assets: dict) -> dict:
    run_dir = args.work_dir / f"{arm}_r{repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = run_dir / "metrics.jsonl"
    metrics_file.unlink(missing_ok=True)
    overrides = [
        "platform=cpu",
        "size=cpu_tiny",
        f"data.train_files={assets['TRAIN_FILE']}",
        f"data.val_files={assets['VAL_FILE']}",
        f"actor_rollout_ref.model.path={assets['MODEL_PATH']}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        f"trainer.experiment_name={arm}",
        *args.overrides,
    ]
    if arm == "recipe_v0":
        command = [sys.executable, "-m", "recipe_dapo.main_dapo", *overrides, "trainer.use_v1=false"]
    elif arm == "recipe_v1":
        command = [sys.executable, "-m", "recipe_dapo.main_dapo", *overrides, "trainer.use_v1=true"]
    elif arm == "verl_v1":
        command = [sys.executable, __file__, "--run-verl-v1", *overrides, *VERL_V1]
    else:
        command = [sys.executable, __file__, "--run-verl-v1-fast-poll", *overrides, *VERL_V1]
    steps, peak, wall_s = run_logged(command, run_dir, metrics_file, args.timeout, arm)
    return summarize(arm, steps, args, peak, wall_s)


def run_logged(command: list[str], run_dir: Path, metrics_file: Path, timeout: float, label: str):
    """``command`` in its own process session and local Ray under ``nice``, logging to ``run_dir``/train.log and its
    metrics to ``metrics_file``; its steps (step, metrics) with a step time, its peak PSS (bytes) and its wall seconds.
    A non-zero exit raises RuntimeError naming ``label`` and the log."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", VERL_FILE_LOGGER_PATH=str(metrics_file))
    env.pop("RAY_ADDRESS", None)
    peak = [0]
    start = time.time()
    with open(run_dir / "train.log", "w") as log:
        process = subprocess.Popen(["nice", "-n", "5", *command], cwd=run_dir, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        done = threading.Event()

        def sample_memory():
            while not done.wait(0.5):
                peak[0] = max(peak[0], session_pss_bytes(process.pid))

        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        try:
            returncode = process.wait(timeout=timeout)
        finally:
            done.set()
            sampler.join()
            end_session(process.pid)
    if returncode != 0:
        raise RuntimeError(f"{label} failed with exit status {returncode}; see {run_dir / 'train.log'}")
    from recipe_dapo.tracking.run_log import read_metrics

    steps = [(step, data) for step, data in sorted(read_metrics(metrics_file).items()) if "timing_s/step" in data]
    return steps, peak[0], time.time() - start


def summarize(arm: str, steps: list[tuple[int, dict]], args, peak_pss: int, wall_s: float) -> dict:
    measured = [data for step, data in steps if step >= 2]
    trained = generated = discarded = qualifying = 0.0
    for _, data in steps:
        if arm.startswith("recipe"):
            trained += data.get("dynamic_sampling/trained_groups", 0.0)
            generated += data.get("dynamic_sampling/generated_groups", 0.0)
            qualifying += data.get("dynamic_sampling/kept_groups", 0.0)
            discarded += data.get("dynamic_sampling/dropped_stale_groups", 0.0)
        else:
            batch = args.train_batch_size
            trained += batch
            surplus = data.get("training/filter_groups/discarded_surplus_samples", 0.0)
            generated += batch + data.get("training/filter_groups/evicted_samples", 0.0) + surplus
            qualifying += batch + surplus
            discarded += surplus

    def phase(*keys: str) -> float:
        """Mean over steps 2..N of the keys' sum; NaN when no step logged any of them (the arm has no such phase)."""
        if not measured or not any(k in d for d in measured for k in keys):
            return float("nan")
        return statistics.mean(sum(d.get(k, 0.0) for k in keys) for d in measured)

    v1 = arm != "recipe_v0"
    result = {
        "arm": arm,
        "steps": len(steps),
        "step_s": phase("timing_s/step"),
        "gen_per_trained": generated / trained if trained else float("nan"),
        # generated per trained over the ideal 1 / keep rate (keep rate = qualifying / generated over the run)
        "gen_over_ideal": qualifying / trained if trained else float("nan"),
        "discarded": discarded,
        # prompt batches sent to generation per step (recipe: refills / rounds; verl: its first batch and refills)
        "submissions": phase("dynamic_sampling/num_gen_rounds") if arm.startswith("recipe") else phase(
            "bench/submissions"),
        "gen_s": phase("timing_s/gen"),
        "poll_s": phase("timing_s/poll_wait") if v1 else float("nan"),
        "gen_tq_s": phase("timing_s/gen_tq") if v1 else float("nan"),
        "drain_s": phase("dynamic_sampling/drain_s") if arm == "recipe_v1" else float("nan"),
        "reward_s": phase("timing_s/reward"),
        "old_log_prob_s": phase("timing_s/old_log_prob", "timing_s/ref"),
        "update_s": phase("timing_s/adv", "timing_s/update_actor"),
        "sync_s": phase("timing_s/update_weights"),
        "tq_read_s": phase("timing_s/tq_read") if v1 else float("nan"),
        "tq_write_s": phase("timing_s/tq_write") if v1 else float("nan"),
        "peak_pss_gb": peak_pss / 1e9,
        "wall_s": wall_s,
    }
    if arm.startswith("verl") and measured:  # the bench's timing_s/drain: logged only by a step that had a drain
        result["drain_s"] = statistics.mean(d.get("timing_s/drain", 0.0) for d in measured)
    # the trainer's own work during sampling: judging groups, the dataloader and dispatch of refills
    result["gen_rest_s"] = result["gen_s"] - result["poll_s"] - result["gen_tq_s"] if v1 else float("nan")
    known = [result[k] for k in ("gen_s", "reward_s", "old_log_prob_s", "update_s", "sync_s")]
    result["other_s"] = result["step_s"] - sum(v for v in known if v == v)
    return result


COLUMNS = (
    ("s/step", "step_s", ".2f", "seconds per step (timing_s/step)"),
    ("gen/trained", "gen_per_trained", ".2f", "groups generated per group trained"),
    ("gen/ideal", "gen_over_ideal", ".3f", "that over the ideal 1 / keep rate (= qualifying / trained)"),
    ("discarded", "discarded", ".1f", "qualifying groups discarded over the run"),
    ("subm.", "submissions", ".2f", "prompt batches sent to generation per step (classic: rounds; recipe v1: refills; "
                                    "verl: its first batch and refills)"),
    ("gen s", "gen_s", ".2f", "timing_s/gen: from the step's start until the batch is handed over (the generation "
                              "waves, judging, refills, the drain)"),
    ("poll wait s", "poll_s", ".2f", "of gen: the trainer asleep between polls while generation runs (timing_s/"
                                     "poll_wait)"),
    ("TQ in gen s", "gen_tq_s", ".2f", "of gen: the trainer's TransferQueue reads and writes (timing_s/gen_tq)"),
    ("gen rest s", "gen_rest_s", ".2f", "of gen: the rest (judging groups, fetching and dispatching refills)"),
    ("drain s", "drain_s", ".2f", "of gen: after the batch was full, waiting for the prompts still in flight "
                                  "(recipe: dynamic_sampling/drain_s; verl: timing_s/drain, measured by the bench)"),
    ("reward s", "reward_s", ".2f", "timing_s/reward (the reward itself is scored in the agent loop, inside gen)"),
    ("old lp s", "old_log_prob_s", ".2f", "timing_s/old_log_prob (+ ref)"),
    ("update s", "update_s", ".2f", "timing_s/adv + timing_s/update_actor"),
    ("sync s", "sync_s", ".2f", "timing_s/update_weights"),
    ("other s", "other_s", ".2f", "step less gen, reward, old lp, update and sync"),
    ("TQ read s", "tq_read_s", ".2f", "the trainer's TransferQueue reads over the whole step (timing_s/tq_read; "
                                      "inside gen, old lp, update)"),
    ("TQ write s", "tq_write_s", ".2f", "the same for writes (timing_s/tq_write)"),
    ("peak PSS GB", "peak_pss_gb", ".1f", "largest sum of PSS over the run's processes"),
)
"""The table's columns: header, result key, format, what it measures (printed under the table). Phase times are
means over steps 2..N; TransferQueue and poll times are those of the trainer's process (the agent-loop workers'
writes while generating are part of generation and not split out)."""


def spread(values: list[float], fmt: str) -> str:
    """Mean, with [min-max] when the repeats differ."""
    values = [v for v in values if v == v]  # no NaN
    if not values:
        return "-"
    mean = format(statistics.mean(values), fmt)
    low, high = format(min(values), fmt), format(max(values), fmt)
    return mean if low == high else f"{mean} [{low}-{high}]"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "peer_side_by_side")
    parser.add_argument("--train-batch-size", type=int, default=4, help="cpu_tiny's data.train_batch_size")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per arm")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every arm")
    args = parser.parse_args(argv)
    args.work_dir = args.work_dir.resolve()  # every arm runs in its own folder under it
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is warm-up)")
    args.overrides = [*args.overrides, f"data.train_batch_size={args.train_batch_size}"]

    assets = built_assets(args.work_dir / "assets")

    def so_far(results, repeats_done, failures):  # the figures so far, in case the run is cut short
        report({arm: runs for arm, runs in results.items() if runs}, args, repeats_done, failures)

    results, failures = interleaved(args.arms, args.repeats, lambda arm, repeat: run_arm(arm, repeat, args, assets),
                                    so_far)
    sys.exit(finish(results, args, failures))


def built_assets(out: Path, *task: str) -> dict[str, str]:
    """The default run's inputs in ``out`` (built once, reused after): MODEL_PATH, TRAIN_FILE and VAL_FILE."""
    build = subprocess.run([sys.executable, "-m", "recipe_dapo.cpu.assets", *task, "--out", str(out)],
                           capture_output=True, text=True, check=True)
    return dict(line.split("=", 1) for line in build.stdout.splitlines() if line.split("=", 1)[0] in
                ("MODEL_PATH", "TRAIN_FILE", "VAL_FILE"))


def interleaved(arms: list[str], repeats: int, run_one, after_repeat=None) -> tuple[dict[str, list[dict]], list[str]]:
    """``run_one(arm, repeat)`` for every arm in every repeat, the arms in rotated order (the machine is shared and
    noisy); a failed arm is printed and listed, the others' figures kept. ``after_repeat(results, repeats_done,
    failures)`` after each repeat but the last."""
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    failures: list[str] = []
    for repeat in range(repeats):
        order = arms[repeat % len(arms):] + arms[: repeat % len(arms)]
        for arm in order:
            try:
                result = run_one(arm, repeat)
            except (RuntimeError, subprocess.TimeoutExpired) as error:  # one arm's failure leaves the others' figures
                print(f"repeat {repeat} {arm}: FAILED: {error}", flush=True)
                failures.append(f"{arm} repeat {repeat}")
                continue
            results[arm].append(result)
            print(f"repeat {repeat} {arm}: " + ", ".join(f"{key}={value:.3f}" if isinstance(value, float)
                                                         else f"{key}={value}" for key, value in result.items()),
                  flush=True)
        if after_repeat is not None and repeat + 1 < repeats:
            after_repeat(results, repeat + 1, failures)
    return results, failures


def finish(results: dict[str, list[dict]], args, failures: list[str]) -> int:
    """The final table and RESULT line; the exit status: 1 when a repeat failed (its figures are missing), else 0."""
    report({arm: runs for arm, runs in results.items() if runs}, args, args.repeats, failures)
    return 1 if failures else 0


def report(results: dict[str, list[dict]], args, repeats: int, failures: list[str] = ()) -> None:
    """The table (mean [min-max] over the repeats that completed) and the RESULT line, with the failed repeats."""
    arms = [arm for arm in args.arms if arm in results]

    def mean(arm: str, key: str) -> float:
        return statistics.mean(r[key] for r in results[arm])

    print(f"\n{args.steps} steps per run (s/step over steps 2-{args.steps}), {repeats} repeat(s), arms interleaved;"
          " mean [min-max] over the repeats that completed")
    columns = [(name, key, fmt) for name, key, fmt, _ in COLUMNS]
    print("| arm | repeats | " + " | ".join(name for name, _, _ in columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    for arm in arms:
        cells = [spread([r[key] for r in results[arm]], fmt) for _, key, fmt in columns]
        print(f"| {arm} | {len(results[arm])} of {repeats} | " + " | ".join(cells) + " |")
    for arm in args.arms:
        if arm not in arms:
            print(f"| {arm} | 0 of {repeats} | " + " | ".join("failed" for _ in columns) + " |")
    if failures:
        print(f"FAILED repeats (their figures are missing above): {', '.join(failures)}")
    for name, _, _, meaning in COLUMNS:
        print(f"  {name}: {meaning}")
    line = []
    for name, arm, key, how in (
        ("recipe_v0_step_s", "recipe_v0", "step_s", "mean"),
        ("recipe_v1_step_s", "recipe_v1", "step_s", "mean"),
        ("verl_v1_step_s", "verl_v1", "step_s", "mean"),
        ("verl_v1_fast_poll_step_s", "verl_v1_fast_poll", "step_s", "mean"),
        ("recipe_v1_gen_over_ideal", "recipe_v1", "gen_over_ideal", "mean"),
        ("recipe_v1_discarded", "recipe_v1", "discarded", "max"),  # the worst repeat: the target is 0 in every one
        ("verl_v1_discarded", "verl_v1", "discarded", "mean"),
    ):
        if arm not in results:
            continue
        value = max(r[key] for r in results[arm]) if how == "max" else mean(arm, key)
        digits = 2 if key == "step_s" else 3 if key == "gen_over_ideal" else 1
        line.append(f"{name}={value:.{digits}f}")
    line.append(f"failed_repeats={len(failures)}")
    print(("RESULT " if repeats == args.repeats else f"PARTIAL after {repeats} repeat(s): ") + " ".join(line), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--run-verl-v1":
        run_verl_v1(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--run-verl-v1-fast-poll":
        run_verl_v1(sys.argv[2:], poll_interval_s=FAST_POLL_S)
    else:
        main()
