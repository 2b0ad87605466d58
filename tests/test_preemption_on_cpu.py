"""SIGTERM to the driver while the run starts (issue 26 item 4): the launch stops at once, non-zero, even inside
``ray.init`` (where Ray's own handler raises ``SystemExit(15)``, which ``ray.init`` swallows: the run then trained on).

Starts a real single-node Ray for a few seconds (run it under ``flock /tmp/train.lock`` beside other Ray users). The
training side (finish the step, save, stop) is tested on the real trainer in ``test_trainer_on_cpu`` and end to end in
``tests/e2e/test_e2e_dapo_cpu_on_cpu.py``.
"""

from __future__ import annotations

import os
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

    config = compose_recipe_config(["trainer.default_local_dir={checkpoints}"])
    with preemption_guard(config):
        import ray
        print("calling ray.init", flush=True)
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
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


def test_a_checkpoint_write_error_from_the_task_runner_ends_the_driver_with_its_one_line(capsys):
    """The trainer's CheckpointWriteError reaches the driver as Ray's copy (with the worker's traceback in its text):
    the driver prints the one line and exits 1."""
    from ray.exceptions import RayTaskError

    from recipe_dapo.main_dapo import refusals_exit_cleanly
    from recipe_dapo.trainers.checkpoint_state import CheckpointWriteError

    line = "checkpoint /ckpt/global_step_2 not written (disk full: ...); last good checkpoint: /ckpt/global_step_1"
    cause = CheckpointWriteError(line)
    from_worker = RayTaskError("DAPOTaskRunner.run", "Traceback (most recent call last):\n  ...", cause)
    from_worker = from_worker.as_instanceof_cause()
    with pytest.raises(SystemExit) as exited:
        with refusals_exit_cleanly():
            raise from_worker
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == f"recipe_dapo: {line}"
