"""The driver's console shows the recipe, its warnings and errors; the log file keeps every line.

The main test replays a real run: ``tests/fixtures/console_cpu_run.txt`` is every line the driver of
``DAPO_CONSOLE_FILTER=0 DAPO_CONSOLE_RECORD=... bash scripts/run_dapo_cpu.sh trainer.total_training_steps=2`` wrote
(``1|`` stdout, ``2|`` stderr; worker lines as Ray's printer forwarded them). Worker lines in the other tests are
printed by Ray's own driver-side printer (``ray._private.worker.print_worker_logs``), and the import-time warnings
come from importing the real verl package in a fresh interpreter.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from ray._private.worker import print_worker_logs

from recipe_dapo.tracking.noise import (
    HEARTBEAT_S,
    NOISE,
    STARTUP_PHASES,
    TAG,
    ConsoleRouter,
    LogFile,
    RoutedStream,
    level_of,
    log_file_path,
    hydra_shows_instead_of_running,
    recipe_line,
)
from recipe_dapo.trainers.table import TRAINERS
from conftest import REPO_ROOT, compose_recipe_config

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "console_cpu_run.txt"

# The noise found on the default run's console, each as it appears in the run's output.
DEFAULT_RUN_NOISE = (
    "'--gpu_memory_utilization',",  # vLLM's argv, one line per argument
    "Initializing a V1 LLM engine with config",  # the 3,233-character engine config line
    "Failed to import the DeepSelect extension",
    "Model Runner V2 requires Triton",
    "`triton.backends` could not be imported",
    "If you are using Ascend NPUs",
    "Token authentication is enabled for this Ray cluster",
    "LoRA dynamic loading & unloading is enabled in the API server",
    "Class 'verl.trainer.ppo.ray_trainer.RayPPOTrainer' is deprecated",
    "Checkpoint tracker file does not exist",
    "engine is not available",
    "test_gen_batch meta info",
)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _no_recording(monkeypatch):
    monkeypatch.delenv("DAPO_CONSOLE_RECORD", raising=False)


def recorded_run() -> list[tuple[bool, str]]:
    """(written on stderr, line) for every line the driver of the recorded run wrote."""
    lines = []
    with open(FIXTURE, encoding="utf-8", newline="") as handle:  # newline="": a progress bar's \r stays in its line
        entries = handle.read().split("\n")[:-1]
    for entry in entries:
        stream, _, line = entry.partition("|")
        lines.append((stream == "2", line))
    return lines


def replay(lines, log_path, show_all=False, attach_after=0):
    """What the console and the log file get of ``lines`` written on the driver's stdout/stderr."""
    router, log_file, console = ConsoleRouter(show_all=show_all), LogFile(), io.StringIO()
    streams = {False: RoutedStream(console, router, log_file, False), True: RoutedStream(console, router, log_file, True)}
    for index, (is_stderr, line) in enumerate(lines):
        if index == attach_after:
            log_file.attach(str(log_path))
        streams[is_stderr].write(line + "\n")
    log_file.close()
    with open(log_path, encoding="utf-8", newline="") as handle:
        logged = handle.read().split("\n")[1:-1]
    return console.getvalue().split("\n")[:-1], logged, router


def through_ray(lines: list[str], pid: int = 4242) -> list[str]:
    """What the driver's console shows of ``lines`` printed by a worker actor."""
    out = io.StringIO()
    stream = RoutedStream(out, ConsoleRouter(), LogFile(), is_stderr=False)
    data = {"pid": pid, "ip": "10.0.0.1", "localhost": "10.0.0.1", "actor_name": "WorkerDict", "lines": lines}
    print_worker_logs(data, stream)
    stream.flush()
    return out.getvalue().splitlines()


def test_a_real_cpu_runs_console_is_the_recipes_lines_and_its_log_file_every_line(tmp_path):
    lines = recorded_run()
    console, logged, _ = replay(lines, tmp_path / "run.log", attach_after=3)

    # Nothing lost: the file holds every line, in order (colours removed), including those held before attaching.
    assert logged == [ANSI.sub("", line) for _, line in lines]
    # The console: exactly the recipe's marked lines (its step, validation and summary lines, the start-up lines)
    # and the driver's recipe_dapo log lines (this recording's CPU KV cache); not the trainer's step bar.
    expected = []
    for _, line in lines:
        plain = ANSI.sub("", line)
        if TAG in plain:
            expected.append(plain[plain.index(TAG) + len(TAG):])
        elif "][recipe_dapo." in plain and "][INFO] - " in plain:
            expected.append(plain.split("][INFO] - ", 1)[1])
    assert any("DAPO training steps:" in line for _, line in lines)
    # Besides those, one line when the start-up ends, with each phase's time
    # (test_start_up_is_a_status_line_on_a_terminal_and_a_line_a_minute_elsewhere).
    phases = [line for line in console if line.startswith("start-up")]
    assert len(phases) == 1 and phases[0].startswith("start-up: "), phases
    assert [line for line in console if not line.startswith("start-up")] == expected
    text = "\n".join(console)
    for noise in DEFAULT_RUN_NOISE:
        assert noise in "\n".join(line for _, line in lines), f"the recorded run no longer prints {noise!r}"
        assert noise not in text, noise
    steps = [line for line in console if re.match(r"step \d+/2 \| acc ", line)]
    assert len(steps) == 2 and all("| clip low " in line for line in steps), console
    assert any(line.startswith("validation at step 2 | synthetic_arithmetic: mean@4 ") for line in console)
    # The trainer line explains verl's deprecation of the classic trainer in the recipe's words.
    trainer = next(line for line in console if line.startswith("trainer: "))
    assert "deprecated" in trainer and "trainer.use_v1=true" in trainer
    # Absolute paths: the log file named at the start, the metrics file in the summary.
    log_line = next(line for line in console if line.startswith("log file: "))
    assert os.path.isabs(log_line.split()[2].rstrip(":"))
    metrics = next(line for line in console if line.strip().startswith("metrics file: "))
    assert os.path.isabs(metrics.split("metrics file: ")[1].split()[0]), metrics
    # The default run's budget, the first build included, is test_first_run_console_on_cpu's.


def test_warnings_errors_and_tracebacks_that_need_the_user_reach_the_console(tmp_path):
    lines = recorded_run()
    at = next(index for index, (_, line) in enumerate(lines) if "step 1/2 | " in line)
    worker = "\x1b[36m(RewardLoopWorker pid=18745)\x1b[0m "
    real = [
        (False, worker + "WARNING:2026-11-24 03:18:50,001:reward: 3 of 64 responses failed to score (timeout); "
                         "scored 0 and counted in reward/failures"),
        (True, worker + "Traceback (most recent call last):"),
        (True, worker + '  File "/x/recipe_dapo/reward/manager.py", line 10, in run_single'),
        (True, worker + "    raise RuntimeError('verifier crashed')"),
        (True, worker + "RuntimeError: verifier crashed"),
        (False, "\x1b[36m(vLLMHttpServer pid=18853)\x1b[0m (EngineCore pid=19027) ERROR 11-24 03:18:50 "
                "[core.py:1] EngineCore encountered a fatal error."),
        (True, "/x/site-packages/torch/cuda/memory.py:10: UserWarning: host memory is low"),
        (True, "  warnings.warn("),
    ]
    console, logged, _ = replay(lines[:at] + real + lines[at:], tmp_path / "run.log")
    for _, line in real:
        assert line in console, line
        assert ANSI.sub("", line) in logged
    # The same kinds of lines, when known noise, stay in the file only (the warning's source line with it).
    noise = [(True, "/x/site-packages/verl/workers/engine/__init__.py:32: UserWarning: torchtitan engine is not "
                    "available: ModuleNotFoundError(\"No module named 'torchtitan'\")"),
             (True, "  warnings.warn(f\"torchtitan engine is not available: {e!r}\", stacklevel=1)")]
    console, logged, _ = replay(noise, tmp_path / "noise.log")
    assert console == [] and logged == [line for _, line in noise]


def test_with_the_filter_off_the_console_shows_every_line(tmp_path):
    lines = recorded_run()
    console, logged, router = replay(lines, tmp_path / "run.log", show_all=True)
    assert len(console) == len(lines) == len(logged) == router.shown
    assert not any(TAG in line for line in console)  # the recipe's mark is removed, the rest as printed


def test_importing_verl_prints_its_warnings_to_the_log_file_only(tmp_path):
    log_path = tmp_path / "run.log"
    code = (
        "from recipe_dapo.tracking.noise import install_console_filter, attach_log_file\n"
        "install_console_filter()\n"
        "import verl.workers.engine\n"
        "from omegaconf import OmegaConf\n"
        "attach_log_file(OmegaConf.create({'trainer': {'project_name': 'p', 'experiment_name': 'e'}}))\n"
        "import warnings; warnings.warn('a warning of the run itself')\n"
    )
    pythonpath = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "DAPO_LOG_FILE": str(log_path), "PYTHONPATH": pythonpath}
    filtered = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                              timeout=300, env=env)
    unfiltered = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                                timeout=300, env={**env, "DAPO_CONSOLE_FILTER": "0"})
    assert filtered.returncode == 0, filtered.stderr
    # Without the filter: 5 engines x (warning line + source line), on the console and in the file.
    assert unfiltered.stderr.count("engine is not available") == 10
    assert "engine is not available" not in filtered.stderr
    # Other warnings still show (code run with -c has no source line to print).
    assert filtered.stderr.splitlines() == ["<string>:6: UserWarning: a warning of the run itself"]
    # The log file is named at the start and at the end, with the lines the console did not show.
    stdout = filtered.stdout.splitlines()
    assert stdout[0].startswith(f"log file: {log_path}: every line of verl, vLLM and Ray")
    assert re.fullmatch(rf"log file: {re.escape(str(log_path))} \(\d+ lines, 10 not shown here; "
                        r"DAPO_CONSOLE_FILTER=0 shows them\)", stdout[-1]), stdout
    logged = log_path.read_text()
    assert logged.count("engine is not available") == 10 + 10  # both processes appended to the same file
    assert logged.count("a warning of the run itself") == 2


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
            "ZeroDivisionError: division by zero",
            "Using dataset class: RLHFDataset",
        ]
    )
    assert len(shown) == 4 and all("pid=4242" in line for line in shown), shown
    assert "ERROR: reward function failed on sample 3" in shown[0]
    assert "Traceback" in shown[1] and 'File "reward.py"' in shown[2] and "ZeroDivisionError" in shown[3]


def test_a_recipe_line_from_a_worker_loses_rays_prefix_and_its_mark(monkeypatch):
    monkeypatch.setenv("DAPO_CONSOLE_TAG", "1")
    line = recipe_line("step 1/4 | acc 0.039")
    assert line == TAG + "step 1/4 | acc 0.039"
    assert through_ray([line]) == ["step 1/4 | acc 0.039"]
    monkeypatch.delenv("DAPO_CONSOLE_TAG")
    assert recipe_line("step 1/4") == "step 1/4"  # no router: printed as is


def test_a_repeated_per_sample_warning_is_shown_once():
    message = "WARNING:2026-11-24 03:18:50,001:Prompt of 300 tokens exceeds rollout.prompt_length=128; left-truncating."
    shown = through_ray([message] * 576)
    assert "\n".join(shown).count("left-truncating") == 1


def test_progress_bar_updates_pass_through_on_flush_and_reach_the_file_whole(tmp_path):
    out, log_file = io.StringIO(), LogFile()
    log_file.attach(str(tmp_path / "run.log"))
    stream = RoutedStream(out, ConsoleRouter(), log_file, is_stderr=True)
    stream.write("\rWriting shards:  50%|#####     | 1/2")
    stream.flush()
    assert out.getvalue() == "\rWriting shards:  50%|#####     | 1/2"
    stream.write("\rWriting shards: 100%|##########| 2/2\n")
    assert out.getvalue().endswith("2/2\n")
    log_file.close()
    assert open(tmp_path / "run.log", newline="").read().split("\n")[1:] == [
        "\rWriting shards:  50%|#####     | 1/2\rWriting shards: 100%|##########| 2/2", ""]


def test_lines_written_before_a_log_file_is_named_are_not_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(LogFile, "MEMORY_LINES", 3)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    log_file = LogFile()
    for index in range(5):
        log_file.write(f"line {index}")
    assert log_file.path == str(tmp_path / f"recipe_dapo-{os.getpid()}.log")  # past MEMORY_LINES, a file
    assert open(log_file.path).read().split("\n")[1:] == [f"line {index}" for index in range(5)] + [""]


def test_levels_of_the_formats_a_run_prints():
    assert level_of("WARNING:2026-11-24 03:17:33,662:IPC is not supported") == "WARNING"
    assert level_of("(EngineCore pid=1) WARNING 11-24 03:18:16 [vllm.py:1706] Enforce eager") == "WARNING"
    assert level_of("2026-11-24 03:17:00,614\tWARNING authentication_token_setup.py:85 -- Token") == "WARNING"
    assert level_of("2026-11-24 03:17:08,446\tINFO worker.py:2029 -- Started a local Ray instance.") == "INFO"
    assert level_of("[2026-11-24 03:16:52,268][recipe_dapo.cpu.memory][INFO] - vLLM-CPU KV cache") == "INFO"
    assert level_of("[rank0]:W1124 03:18:51.858000 18479 torch/fx/_symbolic_trace.py:56] is_fx_tracing") == "WARNING"
    assert level_of("[W1124 03:18:15.709193024 utils.cpp:68] Warning: NUMA binding") == "WARNING"
    assert level_of("/x.py:3: FutureWarning: old") == "WARNING"
    assert level_of("ray.exceptions.RayTaskError(ValueError): ray::DAPOTaskRunner.run()") == "ERROR"
    assert level_of("Using dataset class: RLHFDataset") is None


def test_the_log_file_sits_beside_the_metrics_file(tmp_path, monkeypatch):
    monkeypatch.delenv("DAPO_LOG_FILE", raising=False)
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.delenv("VERL_FILE_LOGGER_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    config = OmegaConf.create({"trainer": {"project_name": "recipe_dapo", "experiment_name": "dapo_cpu"}})
    assert log_file_path(config) == str(tmp_path / "recipe_dapo" / "dapo_cpu.log")
    monkeypatch.setenv("DAPO_LOG_FILE", "elsewhere.log")
    assert log_file_path(config) == str(tmp_path / "elsewhere.log")


def test_the_classic_trainer_line_says_why_it_is_the_default_despite_verls_deprecation():
    classic = TRAINERS[0]
    assert not classic.use_v1
    line = classic.log_line()
    assert "deprecated" in line and "trainer.use_v1=true" in line and "bench/peer_side_by_side.py" in line
    deprecation = next(entry for entry in NOISE if "RayPPOTrainer" in entry.pattern)
    assert "trainer line" in deprecation.why


def test_every_noise_entry_says_who_prints_it_and_why():
    for entry in NOISE:
        assert entry.source and entry.why, entry.pattern


def test_a_refusal_before_the_run_is_named_leaves_no_stray_log_file(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    log_file, router, console = LogFile(), ConsoleRouter(), io.StringIO()
    stream = RoutedStream(console, router, log_file, is_stderr=True)
    stream.write("Could not override 'trainer.total_training_stepz'.\nKey 'total_training_stepz' is not in struct\n")
    log_file.close()
    assert console.getvalue().count("\n") == 2 and log_file.path is None and not list(tmp_path.iterdir())
    # A line the console did not show is kept in a file in the temporary folder.
    stream.write("INFO:2026-11-24 03:17:16,137:Platform override from VERL_PLATFORM: cpu\n")
    log_file.close()
    assert log_file.path == str(tmp_path / f"recipe_dapo-{os.getpid()}.log")
    assert "Platform override" in open(log_file.path).read()


# -------------------------------------------------------------------------------------------------- start-up

_CLOCK = re.compile(r"(?:\d{4}-\d\d-\d\d |\d\d-\d\d |[IWEF]\d{4} )(\d\d):(\d\d):(\d\d)")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def timed_replay(lines, phases=STARTUP_PHASES, heartbeat=True, tty=False) -> list[tuple[float, str]]:
    """(seconds, console line) for ``lines`` replayed at the times their own timestamps give (a line without one
    comes with the line before it), the heartbeat asked once a second as the driver's thread asks it (on a terminal:
    the status line rewritten, each rewrite a (seconds, status) entry)."""
    now = [0.0]
    router = ConsoleRouter(clock=lambda: now[0])
    router.tty = tty
    router._phases = [(re.compile(phase.pattern), phase) for phase in phases]
    console = Terminal() if tty else io.StringIO()
    streams = {False: RoutedStream(console, router, LogFile(), False),
               True: RoutedStream(console, router, LogFile(), True)}
    shown, start = [], None
    for is_stderr, line in lines:
        stamp = _CLOCK.search(ANSI.sub("", line))
        if stamp:
            seconds = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3])
            start = seconds if start is None else start
            while now[0] + 1 <= seconds - start:
                now[0] += 1
                beat = router.heartbeat() if heartbeat else None
                if beat:
                    shown.append((now[0], beat))
                if tty and heartbeat:
                    before = len(console.getvalue())
                    streams[False].redraw()
                    shown += [(now[0], text.split("\r")[-1]) for text in console.getvalue()[before:].split("\x1b[K")
                              if text.strip("\r")]
            now[0] = max(now[0], seconds - start)
        before = len(console.getvalue())
        streams[is_stderr].write(line + "\n")
        written = console.getvalue()[before:].replace("\r\x1b[K", "\n")
        shown += [(now[0], text) for text in written.splitlines() if text.strip()]
    return shown


def silences_before_the_first_step(shown) -> list[float]:
    first_step = next(index for index, (_, line) in enumerate(shown) if re.match(r"step 1/", line))
    times = [when for when, _ in shown[: first_step + 1]]
    return [later - earlier for earlier, later in zip(times, times[1:])]


def test_start_up_is_a_status_line_on_a_terminal_and_a_line_a_minute_elsewhere():
    lines = recorded_run()
    # On a terminal: the status line, rewritten every second with what the run is doing, never silent.
    on_terminal = timed_replay(lines, tty=True)
    statuses = [(when, line) for when, line in on_terminal if line.startswith("start-up, ")]
    assert max(silences_before_the_first_step(on_terminal)) <= 1, on_terminal
    said = {line.split(": ", 1)[1] for _, line in statuses}
    assert said <= {ConsoleRouter().doing} | {phase.next for phase in STARTUP_PHASES}
    assert len(said) >= len(STARTUP_PHASES) - 1, said  # each phase's words in turn (one lasted under a second)
    # It ends with one line: the start-up's time and each phase's, in the order the recorded run reached them.
    (end,) = [line for _, line in on_terminal if line.startswith("start-up: ")]
    names = [phase.short for phase in STARTUP_PHASES if phase.done]
    assert re.fullmatch(r"start-up: \d+ s \(" + ", ".join(name + r" \d+ s" for name in names) + "; .+\\)", end), end
    first_step = next(when for when, line in on_terminal if line.startswith("step 1/"))
    assert all(when <= first_step for when, _ in statuses)
    # Elsewhere: a line after each minute without one, and the same closing line.
    elsewhere = timed_replay(lines)
    beats = [line for _, line in elsewhere if line.startswith("start-up, ")]
    assert beats and all(" s: still " in line for line in beats)
    assert max(silences_before_the_first_step(elsewhere)) <= HEARTBEAT_S + 1
    assert [line for _, line in elsewhere if line.startswith("start-up: ")] == [end]
    # Control: the same run without the heartbeat was silent for most of its start-up.
    assert max(silences_before_the_first_step(timed_replay(lines, heartbeat=False))) > 45


def test_a_phase_does_not_hide_the_line_it_is_keyed_on_when_it_needs_the_user():
    router = ConsoleRouter()
    shown = router.route("\x1b[36m(vLLMHttpServer pid=7)\x1b[0m ERROR 11-24 03:18:50 [core.py:1] engine failed")
    assert shown.endswith("ERROR 11-24 03:18:50 [core.py:1] engine failed")
    assert router.doing == "loading the model into vLLM and sizing its KV cache"
    # Each phase once.
    router.route("(vLLMHttpServer pid=7) INFO something else")
    assert router.route(f"(DAPOTaskRunner pid=1) {TAG}step 1/4 | acc 0.039").startswith("start-up: ")


def test_no_heartbeat_after_the_first_step_on_a_terminal_or_with_the_filter_off():
    now = [0.0]
    router = ConsoleRouter(clock=lambda: now[0])
    now[0] = HEARTBEAT_S + 1
    assert router.heartbeat() == "start-up, 61 s: still checking the configuration and the data"
    router.route("ray init kwargs: {'num_cpus': 16}")  # verl's line before ray.init: no console line, new words
    now[0] += HEARTBEAT_S
    assert router.heartbeat() == "start-up, 121 s: still starting Ray"
    assert router.heartbeat() is None  # the silence starts again
    router.route(f"(DAPOTaskRunner pid=1) {TAG}step 1/4 | acc 0.039")
    now[0] += 10 * HEARTBEAT_S
    assert router.heartbeat() is None
    assert ConsoleRouter(show_all=True, clock=lambda: 100.0).heartbeat() is None
    clock = [0.0]
    terminal = ConsoleRouter(clock=lambda: clock[0])
    terminal.tty, clock[0] = True, 100.0  # the status line says it, rewritten in place
    assert terminal.heartbeat() is None and terminal.status() == "start-up, 100 s: checking the configuration and the data"


# ------------------------------------------------------------------------------------------ Hydra's commands


def hydra_command(*args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("DAPO_CONSOLE_FILTER", "DAPO_CONSOLE_TAG")}
    return subprocess.run([sys.executable, "-m", "recipe_dapo.main_dapo", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO_ROOT)


@pytest.fixture(scope="module")
def composed():
    return OmegaConf.to_container(compose_recipe_config([]), resolve=False)


def test_hydra_cfg_job_prints_the_composed_config(composed):
    import yaml

    result = hydra_command("--cfg", "job")
    assert result.returncode == 0, result.stderr
    assert "log file:" not in result.stdout
    assert yaml.safe_load(result.stdout) == composed


def test_hydra_cfg_package_prints_that_section(composed):
    import yaml

    result = hydra_command("--cfg", "job", "--package", "dapo")
    assert result.returncode == 0, result.stderr
    first, rest = result.stdout.split("\n", 1)
    assert first == "# @package dapo"
    assert yaml.safe_load(rest) == composed["dapo"]


@pytest.mark.parametrize("args, shows", [
    (("--cfg", "hydra"), "hydra:\n  run:\n"),
    (("--cfg", "all"), "hydra:\n"),
    (("--cfg", "job", "--resolve"), "dapo:\n"),
    (("--help",), "The recipe's groups"),  # the recipe's page (hydra.help in dapo_trainer.yaml)
    (("--hydra-help",), "Hydra ("),
    (("--info",), "Config search path"),
])
def test_hydras_other_commands_print_what_hydra_prints(args, shows):
    result = hydra_command(*args)
    assert result.returncode == 0, result.stderr
    assert shows in result.stdout and "log file:" not in result.stdout, result.stdout[-500:]
    if "--resolve" in args:
        assert "${" not in result.stdout
    if args == ("--cfg", "all"):
        assert "\ndapo:\n" in result.stdout


def test_only_hydras_printing_options_bypass_the_filter():
    assert hydra_shows_instead_of_running(["--cfg", "job"]) and hydra_shows_instead_of_running(["-c", "all"])
    assert hydra_shows_instead_of_running(["--info", "defaults"]) and hydra_shows_instead_of_running(["-h"])
    assert hydra_shows_instead_of_running(["--hydra-help"]) and hydra_shows_instead_of_running(["--cfg=job"])
    assert not hydra_shows_instead_of_running([])
    assert not hydra_shows_instead_of_running(["size=cpu_tiny", "trainer.total_training_steps=2", "-m"])
    assert not hydra_shows_instead_of_running(["-cn", "dapo_trainer", "--config-dir", "/x"])
