"""bench/gpu_one_gpu.py stops an arm that hangs (as the first GPU attempt did) instead of waiting forever.

The arm here is a real process tree (a parent that prints, a child that then hangs silently): the watchdog must
notice the silence, record the tree, stop every process in it and say why; an arm that runs to completion on
time is left alone.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
gpu_bench = pytest.importorskip("gpu_one_gpu")

HANGING_ARM = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"CHILD {child.pid}", flush=True)
time.sleep(600)
"""


def test_a_silent_arm_is_stopped_with_its_whole_process_tree(tmp_path):
    start = time.time()
    with pytest.raises(gpu_bench.ArmFailed, match="stalled: no output") as failure:
        gpu_bench.run_arm("hang", [sys.executable, "-c", HANGING_ARM], dict(os.environ), tmp_path,
                          stall_after_s=3, time_limit_s=120)
    assert time.time() - start < 60
    log = (tmp_path / "train.log").read_text()
    child_pid = int(log.split("CHILD ")[1].split()[0])
    assert not gpu_bench.running(child_pid), "the arm's child process survived the stop"
    stacks = (tmp_path / "stacks.txt").read_text()
    assert f"=== pid {child_pid}:" in stacks and "time.sleep(600)" in stacks  # the tree was recorded
    assert "stacks.txt" in str(failure.value) and "CHILD" in str(failure.value)  # says where to look
    assert not (tmp_path / "run.json").exists()  # a stopped arm is never reported as a finished one


def test_an_arm_over_its_time_limit_is_stopped_even_while_it_prints(tmp_path):
    chatty = "import time\nwhile True:\n    print('tick', flush=True); time.sleep(1)"
    with pytest.raises(gpu_bench.ArmFailed, match="arm-time-limit"):
        gpu_bench.run_arm("chatty", [sys.executable, "-c", chatty], dict(os.environ), tmp_path,
                          stall_after_s=60, time_limit_s=4)


def test_an_arm_that_finishes_is_loaded_from_its_metrics(tmp_path):
    writes_metrics = (
        "import json, os\n"
        "with open(os.environ['VERL_FILE_LOGGER_PATH'], 'w') as f:\n"
        "    for step in (1, 2):\n"
        "        f.write(json.dumps({'step': step, 'data': {'timing_s/step': float(step)}}) + '\\n')\n"
    )
    run = gpu_bench.run_arm("ok", [sys.executable, "-c", writes_metrics], dict(os.environ), tmp_path,
                            stall_after_s=60, time_limit_s=60)
    assert [row["timing_s/step"] for row in run["steps"]] == [1.0, 2.0]
    assert run["peak_gpu_gib"] == 0.0  # no nvidia-smi on this machine: nothing sampled, nothing crashed
