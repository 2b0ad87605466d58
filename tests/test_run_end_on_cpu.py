"""``run.run_end``: when the trainer's process dies or the run fails before the trainer printed its summary, the
driver prints one summary (what happened, the last complete checkpoint, the command line that resumes) and exits 1;
when the trainer printed its own, the driver prints none.

The driver side runs here, waiting in ``ray.get`` on a real Ray actor (a small local cluster, one CPU) that stands in
for the task runner: killed with SIGKILL, raising before its trainer exists, or ending through the recipe's real
tracker (the positive controls)."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe_dapo.run.run_end import TrainerEnd, driver_summary_lines, rerun_command, \
    summary_when_the_trainer_cannot, trainer_printed_summary

ARGV = ["platform=cpu", "trainer.total_training_steps=4", "trainer.experiment_name=dapo cpu"]
"""The driver's overrides (one with a space: the rerun line quotes it)."""


@pytest.fixture(scope="module")
def local_ray():
    import ray

    here = Path(__file__).resolve().parent  # the workers import the stand-in task runner from this module
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}})
    try:
        yield ray
    finally:
        ray.shutdown()


RAY_OWN_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\((raylet|pid=\d+)[^)]*\)")


def driver_lines(out: str) -> list[str]:
    """What the driver printed, less the lines Ray's own threads print into it at any moment (a worker an earlier test
    killed is reported by the raylet whenever Ray gets to it)."""
    return [line for line in out.splitlines() if not RAY_OWN_LINE.match(line)]


def checkpoints_as_verl_writes_them(folder: Path) -> Path:
    """Steps 1 and 2 saved (verl's tracker file names 2, written last), step 3 half-written when the process died."""
    for step in (1, 2, 3):
        actor = folder / f"global_step_{step}" / "actor"
        actor.mkdir(parents=True)
        (actor / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
        if step < 3:
            (folder / f"global_step_{step}" / "dapo_state.pt").write_bytes(b"state")
            (folder / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder / "global_step_2"


def driver_config(checkpoint_dir: Path, resume_mode: str = "auto"):
    return OmegaConf.create({"trainer": {"default_local_dir": str(checkpoint_dir), "resume_mode": resume_mode,
                                         "resume_from_path": None}})


def expected_rerun_line() -> str:
    return (f"    cd {os.getcwd()} && {sys.executable} -m recipe_dapo.main_dapo platform=cpu "
            "trainer.total_training_steps=4 'trainer.experiment_name=dapo cpu'")


class StandInTaskRunner:
    """The task runner's shape: ``run`` wraps the trainer's work in :class:`TrainerEnd`, as both task runners do."""

    def pid(self) -> int:
        return os.getpid()

    def hold_the_folder(self, config, workers) -> None:
        """What both trainers do once verl's workers exist: this process and each actor worker hold the writers' lock."""
        from recipe_dapo.run.recipe_run import RecipeRun

        RecipeRun(config).hold_folder_as_writers(workers)

    def run(self, what: str, config=None) -> str:
        with TrainerEnd() as end:
            if what == "train_forever":
                time.sleep(300)  # a step in progress when the process is killed
            if what == "segfault":
                import ctypes

                time.sleep(1.0)
                ctypes.string_at(0)  # reads address 0: SIGSEGV, as a crashing extension does
            if what == "fail_before_fit":
                raise FileNotFoundError("/data/train.parquet: no such file (data.train_files)")
            end.trainer = trainer = RecipeTrainer(config)
            return trainer.fit(fail=what == "fail_at_step", fail_in_worker=what == "fail_in_reward_worker")


class StandInRewardWorker:
    """A reward worker (another Ray actor) whose user's reward function breaks."""

    def score(self) -> float:
        raise KeyError("'answer': compute_score in /data/my_reward.py failed on every sample")


class RecipeTrainer:
    """The trainers' loop as far as the summary goes: the recipe's tracker opened through its ``RecipeRun``, the
    summary printed by the tracker when the loop ends or fails (then the error goes on)."""

    def __init__(self, config):
        from recipe_dapo.run.recipe_run import RecipeRun

        self.recipe = RecipeRun(config)

    def fit(self, fail: bool, fail_in_worker: bool = False) -> str:
        import ray

        from recipe_dapo.run.lifecycle import failed_outcome

        tracker = self.recipe.open_tracker(resumed_step=0, total_steps=2)
        try:
            if fail:
                raise ValueError("weights of step 1 do not fit")
            if fail_in_worker:  # the trainer meets the worker's error as Ray's copy of it (a RayTaskError)
                worker = ray.remote(num_cpus=0)(StandInRewardWorker).remote()
                ray.get(worker.score.remote())
        except Exception as error:
            tracker.finish(exit_code=1, outcome=failed_outcome(1, error))
            raise
        tracker.finish()
        return "trained"


@pytest.mark.parametrize("death", ["SIGKILL", "segfault"])
def test_a_trainer_process_that_dies_ends_with_the_drivers_summary_and_the_resume_line(
        death, local_ray, tmp_path, capsys):
    """SIGKILL of the actor's process from outside (what the kernel's OOM killer sends), or a segfault inside it."""
    ray = local_ray
    checkpoint = checkpoints_as_verl_writes_them(tmp_path / "checkpoints")
    runner = ray.remote(num_cpus=0, max_restarts=0)(StandInTaskRunner).remote()
    pid = ray.get(runner.pid.remote())
    killed = [time.monotonic() + 1.0]  # the segfault's moment: 1 s into run (at the earliest)
    if death == "SIGKILL":
        waiting = runner.run.remote("train_forever")

        def kill() -> None:
            killed[0] = time.monotonic()
            os.kill(pid, signal.SIGKILL)

        threading.Timer(1.0, kill).start()
    else:
        waiting = runner.run.remote("segfault")
    with pytest.raises(SystemExit) as exited:
        with summary_when_the_trainer_cannot(driver_config(tmp_path / "checkpoints"), argv=ARGV):
            ray.get(waiting)  # the driver waits here, as verl's run_ppo does
    took = time.monotonic() - killed[0]
    assert exited.value.code == 1
    output = capsys.readouterr().out
    assert output.count("run failed") == 1, output
    lines = driver_lines(output[output.index("run failed"):])  # after Ray's own line about the dead worker
    assert lines[0].startswith(f"run failed: the trainer's process died (StandInTaskRunner, pid {pid} on "), lines
    assert "killed by a signal (the kernel's OOM killer, kill -9) or crashed (a segfault)" in lines[0]
    assert lines[1:] == [
        f"  checkpoint: {checkpoint}",  # the last complete one: step 3 was never marked by verl's tracker file
        "  to resume: rerun the same command (trainer.resume_mode=auto continues from it):",
        expected_rerun_line(),
    ]
    assert took < 30, took
    print(f"{death} of the task runner's process: the driver's summary {took:.2f} s after "
          + ("the kill" if death == "SIGKILL" else "the earliest moment of the crash"))


def test_a_run_that_fails_before_its_trainer_exists_ends_with_the_drivers_summary(local_ray, tmp_path, capsys):
    ray = local_ray
    runner = ray.remote(num_cpus=0)(StandInTaskRunner).remote()
    with pytest.raises(SystemExit) as exited:
        with summary_when_the_trainer_cannot(driver_config(tmp_path / "checkpoints"), argv=ARGV):
            ray.get(runner.run.remote("fail_before_fit"))
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert "FileNotFoundError: /data/train.parquet: no such file" in captured.err  # the error, whole, first
    assert driver_lines(captured.out) == [
        "run failed during start-up, before the trainer printed a summary (FileNotFoundError: "
        "/data/train.parquet: no such file (data.train_files))",
        f"  checkpoint: none saved in {tmp_path / 'checkpoints'}",
        "  to resume: no checkpoint saved, a rerun starts from step 0 (trainer.save_freq sets how often to save):",
        expected_rerun_line(),
    ]
    ray.kill(runner)

    unbuildable = ray.remote(num_cpus=0)(TaskRunnerThatCannotStart).remote()  # the actor itself fails to start
    with pytest.raises(SystemExit):
        with summary_when_the_trainer_cannot(driver_config(tmp_path / "checkpoints"), argv=ARGV):
            ray.get(unbuildable.run.remote())
    headline = driver_lines(capsys.readouterr().out)[0]
    assert headline == ("run failed during start-up: the trainer's Ray actor could not be created (ModuleNotFoundError: "
                        "No module named 'recipe_dapo_missing')"), headline


class TaskRunnerThatCannotStart:
    def __init__(self):
        import recipe_dapo_missing  # noqa: F401  (as on a node whose environment lacks a module the runner needs)

    def run(self) -> None:
        pass


def test_when_the_trainer_printed_its_summary_the_driver_prints_none(local_ray, tmp_path, capsys):
    """Positive controls: the normal end, and a failure at a step (the trainer's summary, then its error)."""
    from conftest import compose_recipe_config

    ray = local_ray
    checkpoints_as_verl_writes_them(tmp_path / "checkpoints")
    config = compose_recipe_config([f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
                                    "trainer.logger=[console]"])
    runner = ray.remote(num_cpus=0)(StandInTaskRunner).remote()
    with summary_when_the_trainer_cannot(config, argv=ARGV):
        assert ray.get(runner.run.remote("finish", config)) == "trained"
    with pytest.raises(ValueError, match="weights of step 1 do not fit") as raised:
        with summary_when_the_trainer_cannot(config, argv=ARGV):
            ray.get(runner.run.remote("fail_at_step", config))
    assert raised.value.cause.recipe_dapo_summary_printed is True  # what the trainer's process told the driver
    assert capsys.readouterr().out == ""
    ray.kill(runner)


def test_an_error_from_another_worker_that_the_trainer_summarised_gets_no_second_summary(local_ray, tmp_path, capsys):
    """A reward function that breaks: the trainer meets Ray's copy of the reward worker's error, prints its summary
    and raises it; Ray re-wraps it on the way to the driver, keeping only the worker's original error. The driver must
    still see that the trainer printed the summary, and print none (it used to print a second one saying the run
    "failed during start-up, before the trainer printed a summary")."""
    from conftest import compose_recipe_config

    ray = local_ray
    config = compose_recipe_config([f"trainer.default_local_dir={tmp_path / 'checkpoints'}", "trainer.logger=[console]"])
    runner = ray.remote(num_cpus=0)(StandInTaskRunner).remote()
    with pytest.raises(KeyError, match="compute_score in /data/my_reward.py failed") as raised:
        with summary_when_the_trainer_cannot(config, argv=ARGV):
            ray.get(runner.run.remote("fail_in_reward_worker", config))
    assert trainer_printed_summary(raised.value)
    assert "before the trainer printed a summary" not in capsys.readouterr().out
    ray.kill(runner)


def test_the_run_lock_covers_the_folder_until_the_trainer_and_its_workers_have_ended(local_ray, tmp_path):
    """The driver is gone; its trainer and an actor worker live on (as they do for seconds after a kill): a new driver
    cannot take the folder until both have ended."""
    from conftest import compose_recipe_config
    from recipe_dapo.run.run_lock import FolderInUse, wait_for_writers

    ray = local_ray
    folder = tmp_path / "checkpoints"
    config = compose_recipe_config([f"trainer.default_local_dir={folder}"])
    trainer = ray.remote(num_cpus=0)(StandInTaskRunner).remote()
    worker = ray.remote(num_cpus=0)(StandInRewardWorker).remote()
    ray.get(trainer.hold_the_folder.remote(config, [worker]))
    for actor in (trainer, worker):
        with pytest.raises(FolderInUse, match="processes of an earlier run"):
            wait_for_writers(str(folder), wait_s=0.5)
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        ray.kill(actor)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}"):  # ray.kill returns before the process is gone
            assert time.monotonic() < deadline, f"pid {pid} outlived ray.kill"
            time.sleep(0.1)
    assert wait_for_writers(str(folder), wait_s=0.5) < 0.5  # the trainer's end alone did not free it: the worker's did


def test_a_signal_or_a_refusal_is_left_to_what_reports_it():
    from recipe_dapo.preflight import DAPOConfigError

    class SignalledGuard:
        signum = signal.SIGTERM

    config = driver_config(Path("/nonexistent"))
    with pytest.raises(RuntimeError, match="lost"):
        with summary_when_the_trainer_cannot(config, SignalledGuard(), argv=ARGV):  # the guard prints and exits 143
            raise RuntimeError("lost")
    with pytest.raises(DAPOConfigError):  # listed by main_dapo; the same command would be refused again
        with summary_when_the_trainer_cannot(config, refusals=(DAPOConfigError,), argv=ARGV):
            raise DAPOConfigError("data.train_batch_size: must be positive")


def test_the_rerun_line_resumes_in_every_resume_mode():
    argv = ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/old/global_step_5", "data.seed=1"]
    at = dict(cwd="/runs/a", python="/venv/bin/python")
    assert rerun_command(argv, "/ckpt/global_step_9", "resume_path", **at) == (
        "cd /runs/a && /venv/bin/python -m recipe_dapo.main_dapo trainer.resume_mode=resume_path data.seed=1 "
        "trainer.resume_from_path=/ckpt/global_step_9")
    assert rerun_command(["+trainer.resume_mode=disable", "x=1"], "/ckpt/global_step_9", "disable", **at) == (
        "cd /runs/a && /venv/bin/python -m recipe_dapo.main_dapo x=1 trainer.resume_mode=auto")
    assert rerun_command(["x=1"], "/ckpt/global_step_9", "auto", **at) == (
        "cd /runs/a && /venv/bin/python -m recipe_dapo.main_dapo x=1")
    assert rerun_command(["trainer.resume_mode=disable"], None, "disable", **at) == (  # nothing to resume from
        "cd /runs/a && /venv/bin/python -m recipe_dapo.main_dapo trainer.resume_mode=disable")
    lines = driver_summary_lines("failed: ...", "/nothing/here", "resume_path", "/old/global_step_5", argv=argv)
    assert lines[1:3] == ["  checkpoint: none saved in /nothing/here",  # nothing saved since the run began
                          "  to resume: rerun the same command (it resumes from "
                          "trainer.resume_from_path=/old/global_step_5 again):"]
    assert lines[3].endswith("-m recipe_dapo.main_dapo " + " ".join(argv))


def test_the_entry_point_prints_the_drivers_summary_when_verls_run_ppo_fails(tmp_path, monkeypatch, capsys):
    """``main_dapo.run`` puts the driver's summary around verl's ``run_ppo`` (here failing as ``ray.init`` does when
    it cannot reach the cluster); the start-up checks before it are stood in for."""
    from types import SimpleNamespace

    import verl.trainer.main_ppo

    from conftest import compose_recipe_config
    from recipe_dapo import main_dapo

    checkpoint = checkpoints_as_verl_writes_them(tmp_path / "checkpoints")
    config = compose_recipe_config([f"trainer.default_local_dir={tmp_path / 'checkpoints'}",
                                    "trainer.total_training_steps=10",  # steps left after the checkpoint of step 2
                                    "dapo.preemption.enable=false", "dapo.preflight.check_worker_plugins=false"])
    monkeypatch.setattr(main_dapo, "check_config", lambda config, where: SimpleNamespace(summary_lines=lambda: []))
    monkeypatch.setattr(main_dapo, "apply_cpu_kv_cache", lambda config: None)
    monkeypatch.setattr(main_dapo, "hold_run_folder", lambda config: None)

    def run_ppo(config, task_runner_class):
        raise ConnectionError("could not reach the Ray cluster at 10.0.0.7:6379")

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", run_ppo)
    monkeypatch.setattr(sys, "argv", ["main_dapo.py", *ARGV])
    with pytest.raises(SystemExit) as exited:
        main_dapo.run(config)
    assert exited.value.code == 1
    lines = driver_lines(capsys.readouterr().out)
    assert lines[-4:] == [
        "run failed during start-up, before the trainer printed a summary (ConnectionError: could not reach the Ray "
        "cluster at 10.0.0.7:6379)",
        f"  checkpoint: {checkpoint}",
        "  to resume: rerun the same command (trainer.resume_mode=auto continues from it):",
        expected_rerun_line(),
    ]


def test_after_a_dead_trainer_the_drivers_exit_is_bounded_even_when_the_shutdown_hangs(tmp_path):
    """A trainer's death can take the node's raylet with it, and Ray's shutdown at exit then waits on it for minutes.
    The driver's exit after its summary is bounded: a stand-in driver whose atexit handler hangs (as ray.shutdown does
    on a dead raylet) still exits 1 within the bound. Positive control: without the bound it is still running."""
    import subprocess
    import sys
    import textwrap
    import time

    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import atexit, sys, time
        from ray.exceptions import RayActorError
        from omegaconf import OmegaConf
        from recipe_dapo.run import run_end
        atexit.register(time.sleep, 120)  # the hung shutdown
        config = OmegaConf.create({"trainer": {"default_local_dir": sys.argv[1], "resume_mode": "auto",
                                               "resume_from_path": None}})
        bound = 2.0 if sys.argv[2] == "bounded" else None
        with run_end.summary_when_the_trainer_cannot(config, argv=["x"], exit_within_s=bound):
            raise RayActorError()
    """))
    began = time.monotonic()
    bounded = subprocess.run([sys.executable, str(script), str(tmp_path / "checkpoints"), "bounded"],
                             capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    assert bounded.returncode == 1, bounded.stderr[-2000:]
    assert "run failed" in bounded.stdout and "exiting now" in bounded.stderr
    assert took < 30, took
    unbounded = subprocess.Popen([sys.executable, str(script), str(tmp_path / "checkpoints"), "unbounded"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            unbounded.wait(timeout=took + 5)
    finally:
        unbounded.kill()
        unbounded.wait()
