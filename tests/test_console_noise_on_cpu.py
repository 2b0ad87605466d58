"""The driver's console hides the known noise and nothing else (issue 17, item 5).

Worker lines are printed by Ray's own driver-side printer (``ray._private.worker.print_worker_logs``), and
the import-time warnings come from importing the real verl package in a fresh interpreter.
"""

from __future__ import annotations

import io
import subprocess
import sys

from ray._private.worker import print_worker_logs

from recipe_dapo.tracking.noise import NOISE, FilteredStream, NoiseFilter
from conftest import REPO_ROOT


def through_ray(lines: list[str], pid: int = 4242) -> str:
    """What the driver's console shows of ``lines`` printed by a worker actor, through the filter."""
    out = io.StringIO()
    stream = FilteredStream(out, NoiseFilter())
    data = {"pid": pid, "ip": "10.0.0.1", "localhost": "10.0.0.1", "actor_name": "WorkerDict", "lines": lines}
    print_worker_logs(data, stream)
    stream.flush()
    return out.getvalue()


def test_importing_verl_prints_no_engine_warnings_through_the_filter():
    code = (
        "from recipe_dapo.tracking.noise import install_console_filter\n"
        "install_console_filter()\n"
        "import verl.workers.engine\n"
        "import warnings; warnings.warn('a warning of the run itself')\n"
    )
    filtered = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    unfiltered = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
        env={**__import__("os").environ, "DAPO_CONSOLE_FILTER": "0"},
    )
    assert filtered.returncode == 0, filtered.stderr
    # Without the filter: 5 engines x (warning line + source line).
    assert unfiltered.stderr.count("engine is not available") == 10
    assert "engine is not available" not in filtered.stderr
    # Other warnings still show (code run with -c has no source line to print).
    assert filtered.stderr.splitlines() == ["<string>:4: UserWarning: a warning of the run itself"]
    assert "the console hid 10 known-noise line(s)" in filtered.stdout


def test_worker_noise_is_hidden_and_worker_errors_are_not():
    shown = through_ray(
        [
            "Warning: pynvml not available, skipping NUMA affinity setup",
            "WARNING 05-01 10:00:00 [cpu_worker.py:117] libtcmalloc is not found in LD_PRELOAD. For best performance...",
            "/x/site-packages/ray/util/state/util.py:55: DeprecationWarning: Ray state API is no longer experimental.",
            "  warnings.warn(",
            "test_gen_batch meta info: {'eos_token_id': 2}",
            "validation generation end",
            "ERROR: reward function failed on sample 3",
            "Traceback (most recent call last):",
            "  File \"reward.py\", line 1, in <module>",
        ]
    )
    lines = shown.splitlines()
    assert len(lines) == 3 and all(line.strip().startswith("(WorkerDict pid=4242") or "pid=4242" in line for line in lines)
    assert "ERROR: reward function failed on sample 3" in lines[0]
    assert "Traceback" in lines[1] and 'File "reward.py"' in lines[2]


def test_a_repeated_per_sample_warning_is_shown_once():
    message = "Prompt of 300 tokens exceeds rollout.prompt_length=128; left-truncating."
    shown = through_ray([message] * 576)
    assert shown.count("left-truncating") == 1


def test_progress_bar_updates_pass_through_on_flush():
    out = io.StringIO()
    stream = FilteredStream(out, NoiseFilter())
    stream.write("\rDAPO training steps:  50%|#####     | 2/4")
    stream.flush()
    assert out.getvalue() == "\rDAPO training steps:  50%|#####     | 2/4"


def test_every_noise_entry_says_who_prints_it_and_why():
    for entry in NOISE:
        assert entry.source and entry.why, entry.pattern
