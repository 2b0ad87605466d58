"""The driver's pre-emption guard on real processes, with a stand-in trainer where the real one would train: SIGTERM
while the run starts stops the launch at once, non-zero, even inside ``ray.init`` (where Ray's own handler raises
``SystemExit(15)``, which ``ray.init`` swallows: the run then trained on); SIGTERM and SIGINT to the driver's whole
process group, as schedulers send them, reach the driver alone and the trainer saves; a second signal, the grace
running out and a Ray that does not answer the flag's look-up each end the driver at once, saying which.

Starts a real single-node Ray for a few seconds (run it under ``flock /tmp/train.lock`` beside other Ray users). The
training side (finish the step, save, stop) is tested on the real trainer in ``test_trainer_on_cpu`` and end to end in
``tests/e2e/test_e2e_dapo_cpu_on_cpu.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.timeout(300)

DRIVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import compose_recipe_config
    from recipe_dapo.main_dapo import preemption_guard

    config = compose_recipe_config(["trainer.default_local_dir={checkpoints}", "dapo.preemption.enable=true"])
    with preemption_guard(config):
        import ray
        print("calling ray.init", flush=True)
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        print("ray.init returned", flush=True)
        time.sleep(120)  # stands for the workers' start-up
    print("the launch went on", flush=True)
""")


def test_sigterm_while_the_driver_is_inside_ray_init_stops_the_launch_at_once(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=str(REPO_ROOT / "tests"), checkpoints=str(tmp_path / "checkpoints")))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env, cwd=tmp_path)
    lines = []
    for line in driver.stdout:
        lines.append(line)
        if "calling ray.init" in line:
            break
    time.sleep(1.0)  # ray.init takes several seconds: the signal lands inside it
    inside = "ray.init returned" not in "".join(lines)
    ray_processes = psutil.Process(driver.pid).children(recursive=True)
    signalled = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    output, _ = driver.communicate(timeout=60)
    took = time.monotonic() - signalled
    output = "".join(lines) + output
    assert driver.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert took < 15, (took, output[-3000:])
    assert "the launch went on" not in output
    assert "SIGTERM during start-up (no training step in this launch): stopped" in output
    assert "last checkpoint: none; to resume: no checkpoint saved" in output
    _, alive = psutil.wait_procs(ray_processes, timeout=20)  # Ray's processes share the driver's fate
    assert not alive, [process.name() for process in alive]
    print(f"SIGTERM {'inside' if inside else 'after'} ray.init: exit {driver.returncode} in {took:.2f} s, "
          f"{len(ray_processes)} Ray processes gone")


STUCK_TRAINER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import compose_recipe_config
    from recipe_dapo.main_dapo import preemption_guard
    import ray

    @ray.remote(num_cpus=0)
    class StuckTrainer:
        def run(self):
            from recipe_dapo.run.preemption import TrainerWatch
            # training began: the driver will wait for it (the trainer keeps its watch, as the trainers do: the flag
            # actor lives as long as a handle to it does)
            self.watch = TrainerWatch.open()
            print("training", flush=True)
            time.sleep(120)  # a step that never ends (a hung collective, a stuck save)

    config = compose_recipe_config(["trainer.default_local_dir={checkpoints}", "dapo.preemption.enable=true",
                                    "dapo.preemption.grace_s={grace}"])
    with preemption_guard(config):
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        ray.get(StuckTrainer.remote().run.remote())
    print("the launch went on", flush=True)
""")


def start_driver(tmp_path, script: str, until: str) -> tuple[subprocess.Popen, list]:
    """``script`` as a driver in a process group of its own (as a scheduler starts a job), read until a line ends with
    ``until``."""
    path = tmp_path / "driver.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    driver = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env, cwd=tmp_path, start_new_session=True)
    lines = []
    for line in driver.stdout:
        lines.append(line)
        if line.rstrip().endswith(until):
            break
    assert lines and lines[-1].rstrip().endswith(until), "".join(lines)[-3000:]
    return driver, lines


def end_of(driver: subprocess.Popen, lines: list, ray_processes: list, signalled: float,
           timeout: float = 60) -> tuple[str, float]:
    """The driver's whole output once it exited and the seconds from ``signalled`` to its exit; its Ray processes are
    gone within 20 s after (they share its fate)."""
    try:
        output, _ = driver.communicate(timeout=timeout)
        took = time.monotonic() - signalled
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(ray_processes, timeout=20)
    for process in alive:  # (a leftover must not outlive the test)
        process.kill()
    assert not alive, [process.name() for process in alive]
    return "".join(lines) + output, took


def test_a_trainer_that_does_not_stop_within_the_grace_is_left_and_the_driver_exits(tmp_path):
    """dapo.preemption.grace_s bounds the exit: a trainer stuck in its step does not hold the driver past it."""
    script = STUCK_TRAINER.format(tests=str(REPO_ROOT / "tests"), checkpoints=str(tmp_path / "checkpoints"), grace=3)
    driver, lines = start_driver(tmp_path, script, "training")
    ray_processes = psutil.Process(driver.pid).children(recursive=True)
    signalled = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    output, took = end_of(driver, lines, ray_processes, signalled)
    assert driver.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "SIGTERM: the trainer did not stop within dapo.preemption.grace_s=3 s; last checkpoint: none" in output, output[-1500:]
    assert 3 <= took < 10, took
    assert "the launch went on" not in output
    print(f"stuck trainer: exit {driver.returncode} {took:.2f} s after SIGTERM (grace 3 s)")


def test_a_second_signal_to_the_process_group_exits_at_once_with_the_first_signals_status(tmp_path):
    """Ctrl-C twice, or a scheduler's SIGTERM then its SIGINT: the driver does not wait out the grace for the trainer
    (60 s here) after the second."""
    script = STUCK_TRAINER.format(tests=str(REPO_ROOT / "tests"), checkpoints=str(tmp_path / "checkpoints"), grace=60)
    driver, lines = start_driver(tmp_path, script, "training")
    ray_processes = psutil.Process(driver.pid).children(recursive=True)
    os.killpg(driver.pid, signal.SIGTERM)
    time.sleep(5)  # the guard raised the flag and waits for the trainer
    assert driver.poll() is None, "the driver did not wait for the trainer after the first signal"
    signalled = time.monotonic()
    os.killpg(driver.pid, signal.SIGINT)
    output, took = end_of(driver, lines, ray_processes, signalled)
    assert driver.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "SIGTERM received: stopping the run (a second SIGTERM exits at once)" in output, output[-3000:]
    assert ("the trainer gives up a step in generation (finishes one in its update) and saves (up to "
            "dapo.preemption.grace_s=60 s)") in output
    assert "second SIGINT: exiting now without waiting for the trainer; last checkpoint: none" in output, output[-3000:]
    assert took < 5, took
    print(f"second signal: exit {driver.returncode} {took:.2f} s after it")


STOPPING_TRAINER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from conftest import compose_recipe_config
    from recipe_dapo.main_dapo import preemption_guard
    import ray

    @ray.remote(num_cpus=0)
    class Trainer:
        # the trainers' protocol (run.recipe_run): open the watch when the loop begins, read it at each step
        # boundary, save and return once it is raised
        def run(self, checkpoint):
            from recipe_dapo.run.preemption import TrainerWatch
            watch = TrainerWatch.open()
            print("training", flush=True)
            for step in range(1, 600):
                time.sleep(0.2)  # a step
                if watch.requested():
                    with open(checkpoint, "w") as out:
                        out.write(f"{{step}} {{watch.requested()}}")
                    return step
            return None

    config = compose_recipe_config(["trainer.default_local_dir={checkpoints}", "dapo.preemption.enable=true"])
    with preemption_guard(config):
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        step = ray.get(Trainer.remote().run.remote({checkpoint!r}))
        print("the trainer saved step", step, flush=True)
    print("the launch went on", flush=True)
""")


@pytest.mark.parametrize("signum, to", [(signal.SIGTERM, "group"), (signal.SIGINT, "group"),
                                        (signal.SIGTERM, "driver")])
def test_a_signal_to_the_process_group_or_the_driver_reaches_the_driver_alone_and_the_trainer_saves(
        tmp_path, signum, to):
    """A signal to the job's process group (``kill -TERM -PGID``, Ctrl-C in a terminal) reaches the driver and not
    the processes of its Ray node (GCS, raylet, workers, in a session of their own): the trainer, in a Ray worker, sees
    the flag, saves and returns, and the driver exits 128 + signal."""
    checkpoint = tmp_path / "saved"
    script = STOPPING_TRAINER.format(tests=str(REPO_ROOT / "tests"), checkpoints=str(tmp_path / "checkpoints"),
                                     checkpoint=str(checkpoint))
    driver, lines = start_driver(tmp_path, script, "training")
    ray_processes = psutil.Process(driver.pid).children(recursive=True)
    in_the_group = [process.name() for process in ray_processes if os.getpgid(process.pid) == driver.pid]
    signalled = time.monotonic()
    (os.killpg if to == "group" else os.kill)(driver.pid, signum)
    output, took = end_of(driver, lines, ray_processes, signalled)
    name = signal.Signals(signum).name
    assert driver.returncode == 128 + signum, output[-3000:]
    assert checkpoint.exists(), f"the trainer did not save (Ray processes in the driver's group: {in_the_group}):\n" \
                                + output[-3000:]
    assert checkpoint.read_text().split()[1] == name
    assert "the trainer saved step" in output and f"stopped by {name}; last checkpoint: none" in output
    assert "the launch went on" not in output
    assert not in_the_group, in_the_group
    assert took < 15, took
    print(f"{name} to the {to}: the trainer saved, exit {driver.returncode} in {took:.2f} s")


FROZEN_GCS = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from conftest import compose_recipe_config
    from recipe_dapo.main_dapo import preemption_guard
    import ray

    config = compose_recipe_config(["trainer.default_local_dir={checkpoints}", "dapo.preemption.enable=true"])
    with preemption_guard(config):
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        print("ray started", flush=True)
        time.sleep(120)
    print("the launch went on", flush=True)
""")


def test_a_flag_look_up_that_ray_does_not_answer_is_named_as_such_not_as_start_up(tmp_path):
    """Ray's GCS stopped (SIGSTOP: a node that does not answer): the look-up of the stop flag gets no answer, and the
    driver exits within FLAG_TIMEOUT_S saying so, not that the run was starting."""
    from recipe_dapo.run.preemption import FLAG_TIMEOUT_S

    script = FROZEN_GCS.format(tests=str(REPO_ROOT / "tests"), checkpoints=str(tmp_path / "checkpoints"))
    driver, lines = start_driver(tmp_path, script, "ray started")
    ray_processes = psutil.Process(driver.pid).children(recursive=True)
    gcs = [process for process in ray_processes if "gcs_server" in process.name()]
    assert gcs, [process.name() for process in ray_processes]
    for process in gcs:
        process.suspend()
    try:
        signalled = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        output, took = end_of(driver, lines, ray_processes, signalled, timeout=FLAG_TIMEOUT_S + 30)
    finally:
        for process in gcs:
            if process.is_running():
                process.kill()
    assert driver.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "during start-up" not in output, output[-3000:]
    assert re.search(r"SIGTERM: (Ray did not answer the look-up of the stop flag \(recipe_dapo.preemption_flag\) "
                     r"within 10 s|looking up the stop flag failed \(\w+: .+\)): stopped without a final save; "
                     r"last checkpoint: none", output), output[-3000:]
    assert took < FLAG_TIMEOUT_S + 5, took
    print(f"GCS frozen: exit {driver.returncode} {took:.2f} s after SIGTERM")


def test_a_checkpoint_write_error_from_the_task_runner_ends_the_driver_with_its_one_line(capsys):
    """The trainer's CheckpointWriteError reaches the driver as Ray's copy (with the worker's traceback in its text):
    the driver prints the one line and exits 1."""
    from ray.exceptions import RayTaskError

    from recipe_dapo.main_dapo import refusals_exit_cleanly
    from recipe_dapo.run.checkpoint_state import CheckpointWriteError

    line = "checkpoint /ckpt/global_step_2 not written (disk full: ...); last good checkpoint: /ckpt/global_step_1"
    cause = CheckpointWriteError(line)
    from_worker = RayTaskError("DAPOTaskRunner.run", "Traceback (most recent call last):\n  ...", cause)
    from_worker = from_worker.as_instanceof_cause()
    with pytest.raises(SystemExit) as exited:
        with refusals_exit_cleanly():
            raise from_worker
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == f"recipe_dapo: {line}"


# --------------------------------------------------------------------------------- the v1 trainer's hooks


class SignalNow:
    """The trainer's view of the driver's flag, raised (``run.preemption.TrainerWatch``)."""

    def requested(self):
        return "SIGTERM"


def v1_trainer(tmp_path, monkeypatch, saves: list):
    """The recipe's sync v1 trainer class around verl's hooks; verl's own checkpoint writer stands in (it needs the
    worker groups) and writes the step folder and the tracker file as verl's does."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from conftest import compose_recipe_config
    from recipe_dapo.run.step_metrics import UpdateGuard
    from recipe_dapo.trainers.v1.trainer import DAPOTrainerV1

    def verls_save(trainer):
        folder = tmp_path / "ckpt" / f"global_step_{trainer.global_steps}" / "actor"
        folder.mkdir(parents=True)
        (folder / "model.pt").write_bytes(b"weights")
        (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text(str(trainer.global_steps))
        saves.append(trainer.global_steps)

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", verls_save)

    class ReplayBuffer:
        def state_dict(self):
            return {"pooled": 3}

    class CheckpointManager:
        synced = []

        def update_weights(self, step):
            self.synced.append(step)

    trainer = object.__new__(DAPOTrainerV1)
    trainer.config = compose_recipe_config(["trainer.use_v1=true", f"trainer.default_local_dir={tmp_path / 'ckpt'}"])
    trainer.global_steps, trainer.timing_raw, trainer.stopped_by = 2, {}, None
    trainer.replay_buffer, trainer.checkpoint_manager = ReplayBuffer(), CheckpointManager()
    trainer.preemption = SignalNow()
    trainer.update_guard = UpdateGuard(trainer.config.dapo.health.max_skipped_updates)
    return trainer


def test_v1_trainer_saves_the_step_where_verl_saves_then_skips_validation_and_stops(tmp_path, monkeypatch):
    import torch

    from recipe_dapo.run.preemption import Preempted

    saves = []
    trainer = v1_trainer(tmp_path, monkeypatch, saves)
    trainer.on_step_end()
    assert saves == [2] and trainer.checkpoint_manager.synced == [2]  # saved, then verl's weight sync as usual
    assert torch.load(tmp_path / "ckpt" / "global_step_2" / "dapo_state.pt")["replay_buffer"] == {"pooled": 3}
    assert trainer._validate() == {}
    trainer.global_steps = 3
    with pytest.raises(Preempted):
        trainer.on_step_begin()


def test_v1_trainer_does_not_save_a_step_twice(tmp_path, monkeypatch):
    saves = []
    trainer = v1_trainer(tmp_path, monkeypatch, saves)
    trainer._save_checkpoint()  # trainer.save_freq hit this step
    trainer.on_step_end()
    assert saves == [2]


def test_v1_trainer_reports_a_full_disk_in_one_line_and_removes_the_step(tmp_path, monkeypatch):
    import errno

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipe_dapo.run.checkpoint_state import CheckpointWriteError

    trainer = v1_trainer(tmp_path, monkeypatch, [])

    def full_disk(trainer):
        (tmp_path / "ckpt" / "global_step_2" / "actor").mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"global_step_2 not written \(disk full: \[Errno 28\] No space"):
        trainer.on_step_end()
    assert not (tmp_path / "ckpt" / "global_step_2").exists()


# --------------------------------------------------------------------------------- a step given up in generation


class Flag:
    """The stop flag as the trainer reads it: raised ``after_s`` seconds from now (None: never)."""

    def __init__(self, after_s=None):
        self.at = None if after_s is None else time.monotonic() + after_s
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return "SIGTERM" if self.at is not None and time.monotonic() >= self.at else None


def test_a_blocking_call_in_generation_is_interrupted_within_the_poll_interval_and_the_handler_is_put_back():
    from recipe_dapo.run.preemption import GenerationWindow, GiveUpCheck, StepGivenUp

    before = signal.getsignal(signal.SIGINT)
    check = GiveUpCheck(Flag(after_s=0.3), poll_s=0.2).armed_for(7)
    began = time.monotonic()
    with pytest.raises(StepGivenUp) as given_up:
        with GenerationWindow(check):
            time.sleep(30)  # a C call the interrupt must break into, as Ray's ray.get
    assert time.monotonic() - began < 2.0
    assert (given_up.value.signal_name, given_up.value.step) == ("SIGTERM", 7)
    assert signal.getsignal(signal.SIGINT) is before

    # The positive control: without a request the call runs to its end, and the flag was read meanwhile.
    flag = Flag(after_s=None)
    with GenerationWindow(GiveUpCheck(flag, poll_s=0.05).armed_for(8)):
        time.sleep(0.4)
    assert flag.reads >= 3 and signal.getsignal(signal.SIGINT) is before


def test_a_request_as_the_window_closes_gives_the_step_up_there_and_never_later_in_the_step():
    """The flag read just as the rollout call returns: the interrupt is on its way while the window closes. It must
    surface inside the ``with`` (the step is given up), never as a stray KeyboardInterrupt in the update after it."""
    from recipe_dapo.run.preemption import GenerationWindow, GiveUpCheck, StepGivenUp

    before = signal.getsignal(signal.SIGINT)
    outcomes = {"inside": 0, "stray": 0}
    for attempt in range(40):
        check = GiveUpCheck(Flag(after_s=0.0), poll_s=0.0).armed_for(1)
        try:
            try:
                with GenerationWindow(check):
                    end = time.monotonic() + attempt * 0.0005  # the body ends around when the thread fires
                    while time.monotonic() < end:
                        pass
            except StepGivenUp:
                outcomes["inside"] += 1
            end = time.monotonic() + 0.05  # "the update": no interrupt may arrive here
            while time.monotonic() < end:
                pass
        except KeyboardInterrupt:
            outcomes["stray"] += 1
    assert outcomes == {"inside": 40, "stray": 0}
    assert signal.getsignal(signal.SIGINT) is before  # however early the interrupt came, the window put it back


def test_a_real_sigint_in_the_window_still_reaches_the_previous_handler_and_outside_the_main_thread_nothing_fires():
    import threading

    from recipe_dapo.run.preemption import GenerationWindow, GiveUpCheck

    flag = Flag(after_s=None)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever the session set
    try:
        with pytest.raises(KeyboardInterrupt) as interrupted:
            with GenerationWindow(GiveUpCheck(flag, poll_s=0.05).armed_for(1)):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
        assert type(interrupted.value) is KeyboardInterrupt  # the previous handler's, not a given-up step
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)

    finished = []

    def elsewhere():
        with GenerationWindow(GiveUpCheck(Flag(after_s=0.0), poll_s=0.0).armed_for(1)):
            time.sleep(0.3)
        finished.append(True)

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    assert finished == [True]


def test_the_check_reads_the_flag_at_most_once_per_interval_and_never_when_disarmed():
    from recipe_dapo.run.preemption import GiveUpCheck, StepGivenUp

    now = [100.0]
    flag = Flag(after_s=None)
    check = GiveUpCheck(flag, poll_s=1.0, clock=lambda: now[0])
    check()
    assert flag.reads == 0  # not armed: the step is past its update
    check.armed_for(4)
    check(), check()
    assert flag.reads == 1
    now[0] += 1.0
    check()
    assert flag.reads == 2
    flag.at = 0.0
    now[0] += 1.0
    with pytest.raises(StepGivenUp, match="SIGTERM in step 4's generation"):
        check()
    check.disarm()
    now[0] += 1.0
    check()


def test_v1_a_step_saved_whose_weight_sync_fails_is_logged_before_the_error_ends_the_run(tmp_path, monkeypatch):
    """verl's v1 loop saves a step, then syncs the weights (``on_step_end``), then logs it: a dead engine failing the
    sync would leave a saved step that was never logged (and a rerun resumes after it). The step's metrics reach the
    metrics file first; a step that was not saved is not logged from there (its rerun logs it)."""
    from recipe_dapo.run.rollout_health import RolloutDied

    class NoSignal:
        def requested(self):
            return None

    class Tracker:
        def __init__(self):
            self.logged = []

        def log(self, data, step):
            self.logged.append((step, data))

    def failing_sync(step):
        raise RolloutDied("the vLLM engine of rollout replica 0 is dead")

    for saved in (True, False):
        trainer = v1_trainer(tmp_path / str(saved), monkeypatch, [])
        trainer.preemption, trainer.logger = NoSignal(), Tracker()
        trainer.checkpoint_manager.update_weights = failing_sync
        trainer._step_metrics = {"actor/pg_loss": 0.5}
        if saved:
            trainer._save_checkpoint()  # verl's scheduled save of step 2
        with pytest.raises(RolloutDied):
            trainer.on_step_end()
        expected = [(2, {"actor/pg_loss": 0.5, "training/global_step": 2})] if saved else []
        assert trainer.logger.logged == expected
