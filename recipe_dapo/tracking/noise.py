"""The run's console and its log file: the console shows the recipe, the log file keeps every line.

Every Ray worker's stdout and stderr reach the driver, which prints them line by line on its own ``sys.stdout`` /
``sys.stderr`` (``ray._private.worker.print_worker_logs``); :func:`install_console_filter` (called first by
``python -m recipe_dapo.main_dapo``, before verl is imported) wraps those two streams, so one router sees the
driver, every worker, vLLM's engine processes and Python's warnings. Every line goes to the **log file**
(:func:`attach_log_file`: ``<experiment>.log`` beside the metrics file, ``$DAPO_LOG_FILE`` to choose; ANSI colours
removed; lines written before the run's name is known are kept in memory until then). The **console** shows only
(:class:`ConsoleRouter`, an allow-list):

- the recipe's own lines: a line marked by :func:`recipe_line` / :class:`RecipeLineFormatter` (the step, validation
  and summary lines of ``recipe_dapo.tracking.console``, the trainer line), shown without Ray's ``(Actor pid=...)``
  prefix, and the driver's ``recipe_dapo.*`` log lines;
- warnings and errors (a logging level of WARNING or above in any of the formats verl, vLLM, Ray, Hydra, glog and
  Python's ``warnings`` print), unless :data:`NOISE` lists them as known noise; a Python warning's source line goes
  with it;
- tracebacks, whole, and exception lines; the driver's own stderr (a refused configuration, a 'did you mean');
  Ray's ``(raylet)`` lines (a worker died, memory ran low);
- the start-up as one status line: the phases (:data:`STARTUP_PHASES`: Ray up, task runner, training workers,
  rollout engines, weights), each keyed on a line verl, Ray or vLLM prints at that point, and what the run is doing
  now, with the time since the driver started. On a terminal the line is rewritten in place (every second, and at
  each phase); anywhere else (a pipe, a file) a line is printed after every :data:`HEARTBEAT_S` seconds without
  one. When the start-up ends (the first validation or step line) one line gives its time and each phase's.

Everything else (verl's prints, vLLM's argv and engine config, INFO logs, progress bars, the trainer's step bar
included: each step has its line) is in the log file only. ``DAPO_CONSOLE_FILTER=0`` shows every line on the console too. At exit the console names the log file again,
with how many lines it holds and how many the console did not show.

Hydra's own commands (``--cfg``, ``--help``, ``--hydra-help``, ``--info``, ...: :func:`hydra_shows_instead_of_running`)
print what Hydra prints: the filter is not installed for them.

A warning that is noise on this recipe's runs is a new :class:`Noise` entry below, with who prints it and why it is
noise here; a line the recipe prints for the user goes through ``recipe_line`` (or the console logger).
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from recipe_dapo.tracking.lines import TAG, TAG_ENV, RecipeLineFormatter, recipe_line  # noqa: F401  (the router's marks)

DISABLE_ENV = "DAPO_CONSOLE_FILTER"
"""``0`` shows every line on the console (the log file is written either way)."""
LOG_FILE_ENV = "DAPO_LOG_FILE"
"""The log file's path, instead of ``<experiment>.log`` beside the metrics file."""
RECORD_ENV = "DAPO_CONSOLE_RECORD"
"""A path: every line the router sees is also appended there as it came, ``1|`` or ``2|`` (stdout/stderr) first;
what ``tests/fixtures/console_cpu_run.txt`` was recorded with."""


@dataclass(frozen=True)
class Noise:
    pattern: str
    """Regular expression searched in each warning line (after Ray's ``(Actor pid=...)`` prefix)."""
    source: str
    """Who prints it, and how."""
    why: str
    """Why it is noise on this recipe's runs."""
    once: bool = False
    """Show the first occurrence, hide the repeats (for messages worth seeing once)."""


NOISE: tuple[Noise, ...] = (
    Noise(
        r"target_num_threads \d+ should not exceed total physical CPU cores",
        "transfer_queue.utils.common, logger.warning on every TransferQueue call (trainer.use_v1=true)",
        "TransferQueue sizes its thread pool for a big node and caps it at the cores it finds, as intended",
    ),
    Noise(
        r"(torchtitan|veomni|automodel|mindspeed|megatron) engine is not available",
        "verl.workers.engine, warnings.warn at import, in every process (5 engines x 2 lines each)",
        "optional training engines the recipe never uses (it trains with FSDP)",
    ),
    Noise(
        r"Warning: pynvml not available, skipping NUMA affinity setup|Warning: Failed to set NUMA affinity",
        "verl.utils.distributed.set_numa_affinity, print, in every worker",
        "GPU NUMA pinning; nothing to pin on a CPU run, and verl goes on without it",
    ),
    Noise(
        r"is not in available memory nodes|is not a valid memory node\. Falling back",
        "vllm.v1.worker.cpu_worker, logger.warning",
        "containers report NUMA nodes they cannot allocate on; vLLM falls back to an allowed node",
    ),
    Noise(
        r"is not found in LD_PRELOAD",
        "vllm.v1.worker.cpu_worker, logger.warning (libtcmalloc, libiomp)",
        "a vLLM-CPU speed hint about optional allocator/OpenMP libraries",
    ),
    Noise(
        r"CPU backend doesn't allow to use `torch\.set_num_threads`",
        "vllm.v1.worker.cpu_worker, logger.warning on every set_num_threads call",
        "vLLM pins its own threads; the call is skipped as intended",
    ),
    Noise(
        r"Triton is not installed\. triton-cpu is expected",
        "vllm.platforms.cpu, logger.warning_once per process",
        "an optional CPU kernel backend",
    ),
    Noise(
        r"This model does not officially support disabling chunked prefill",
        "vllm.engine.arg_utils, logger.warning when enable_chunked_prefill=false",
        "platform=cpu turns chunked prefill off on purpose (seeded rollouts on CPU need whole prefills: "
        "config/platform/cpu.yaml); checked by the CPU runs, whose seeded rollouts match across replicas",
    ),
    Noise(
        r"sleep mode is not supported on CPU",
        "vllm.v1.worker.cpu_worker, logger.warning",
        "platform/cpu.yaml turns sleep mode off; verl still calls sleep/wake",
    ),
    Noise(
        r"requires torchvision \(not installed\); falling back to",
        "transformers, logger.warning_once",
        "image processors, unused by a text-only model",
    ),
    Noise(
        r"site-packages/\S+:\d+: (Deprecation|PendingDeprecation|Future)Warning: ",
        "any installed library, warnings.warn",
        "deprecations inside libraries (verl, Ray, vLLM, transformers), not in the run's settings",
    ),
    Noise(
        r"Disabled critic as algorithm\.adv_estimator != gae",
        "verl.trainer.ppo.utils.need_critic, warnings.warn on every call",
        "GRPO has no critic by design (the start-up check refuses a critic)",
    ),
    Noise(
        r"test_gen_batch meta info: |validation generation end\s*$",
        "verl RayPPOTrainer._validate, print per validation batch",
        "debug prints; the recipe prints one validation line with the results",
    ),
    Noise(
        r"Prompt of \d+ tokens exceeds rollout\.prompt_length=\d+; left-truncating",
        "verl agent loop, logger.warning per sample",
        "only with data.truncation=left, which the start-up check allows and counts (it refuses the rest)",
        once=True,
    ),
    Noise(
        r"Class 'verl\.trainer\.ppo\.ray_trainer\.RayPPOTrainer' is deprecated",
        "verl's @deprecated on RayPPOTrainer, FutureWarning when the classic trainer is built",
        "the trainer line at start-up says it in the recipe's words: why the recipe keeps the classic trainer as "
        "its default on verl 0.9.1, and trainer.use_v1=true to switch",
    ),
    Noise(
        r"Failed to import the DeepSelect extension",
        "vllm.v1.attention.backends.mla (indexer_topk), logger.warning in every process that imports it",
        "a top-k kernel for sparse-attention (MLA) models; the recipe's models do not use it",
    ),
    Noise(
        r"Model Runner V2 requires Triton|Triton is installed, but `triton\.backends` could not be imported",
        "vllm.config.vllm and vllm.triton_utils, logger.warning / print per engine process",
        "vLLM-CPU runs without Triton and falls back to the V1 model runner, as intended",
    ),
    Noise(
        r"IPC is not supported on your devices\. Falling back to shared memory",
        "verl.workers.rollout.vllm_rollout, logger.warning per worker",
        "CPU has no device IPC; the shared-memory transfer is the CPU path (the Ascend advice does not apply)",
    ),
    Noise(
        r"Token authentication is enabled for this Ray cluster",
        "ray._private.authentication, logger.warning in the driver at ray.init",
        "the local Ray cluster verl starts for the run; RAY_AUTH_MODE=disabled turns it off",
    ),
    Noise(
        r"LoRA dynamic loading & unloading is enabled in the API server",
        "vllm.entrypoints.serve.lora, logger.warning when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set",
        "verl's runtime env sets it for every run; the server listens on the node only, for verl's agent loop",
    ),
    Noise(
        r"Enforce eager set, disabling torch\.compile|Inductor compilation was disabled by user settings|"
        r"Reset SSM cache type to float32",
        "vllm.config / vllm.platforms.cpu, logger.warning per engine process",
        "platform=cpu runs vLLM eager on purpose (enforce_eager); SSM caches are unused by the recipe's models",
    ),
    Noise(
        r"Default vLLM sampling parameters have been overridden by the model's `generation_config\.json`",
        "vllm.config.model, logger.warning per server",
        "verl passes its own sampling parameters (rollout.temperature, top_p, ...) with every request",
    ),
    Noise(
        r"Passing raw prompts to InputProcessor is deprecated",
        "vllm.v1.engine.input_processor, logger.warning_once per server",
        "how verl 0.9.1's vLLM server calls vLLM; a library deprecation, not the run's",
    ),
    Noise(
        r"agent loop only support torch and npu profiler, got None",
        "verl.experimental.agent_loop, logger.warning per server",
        "no profiler configured (global_profiler.tool unset), as on every run that does not profile",
    ),
    Noise(
        r"WARNING: val_batch_size is deprecated",
        "verl.utils.config.validate_config, print",
        "verl sends the validation set to vLLM whole; the recipe still uses data.val_batch_size to size the CPU KV "
        "cache (recipe_dapo.cpu.memory)",
    ),
    Noise(
        r"NUMA binding: Using MEMBIND policy",
        "torch c10 (utils.cpp), glog warning when vLLM-CPU binds its worker",
        "vLLM-CPU pins its worker's memory to its NUMA node, as intended",
    ),
    Noise(
        r"is_fx_tracing will return true for both fx\.symbolic_trace and torch\.export",
        "torch.fx._symbolic_trace, glog-style warning once per process",
        "a torch API deprecation inside torch's own code",
    ),
    Noise(
        r"\[shutdown\] (Process manager: force killing remaining process|Executor: workers still running after "
        r"grace period)",
        "vllm.v1 engine shutdown (utils.py, multiproc_executor.py), logger.warning at the evaluator's exit",
        "the evaluation has written its report; vLLM stops its engine processes at exit, as intended",
    ),
    Noise(
        r"^Loading safetensors checkpoint shards: ",
        "vllm.model_executor.model_loader, a progress bar in the engine process (its stderr, no prefix)",
        "the evaluator's 'starting vLLM' line says the engine is starting; the weights of a small model load in a "
        "second",
    ),
    Noise(
        r"'set_vital' is deprecated",
        "torchdata.stateful_dataloader, warnings.warn",
        "a torch API deprecation inside torchdata",
    ),
)


@dataclass(frozen=True)
class Phase:
    """A start-up phase, recognised by a line verl, Ray or vLLM prints when it is reached."""

    pattern: str
    """Regular expression searched in the line (``in_prefix``: in Ray's ``(Actor pid=...)`` prefix instead)."""
    done: str
    """What is now up or under way ("": not a phase of its own, only what the status line says changes)."""
    next: str
    """What the run does until the next phase (said by the heartbeat when it takes long)."""
    source: str
    """Who prints the line."""
    in_prefix: bool = False
    short: str = ""
    """Its name in the start-up's closing line (the time from the previous phase to this one)."""


STARTUP_PHASES: tuple[Phase, ...] = (
    Phase(r"^ray init kwargs: ", "", "starting Ray", "verl.trainer.main_ppo, print before ray.init (no console line: "
          "the heartbeat's words change)"),
    Phase(r"Started a local Ray instance|Connected to Ray cluster", "Ray cluster up",
          "starting the task runner (a Ray actor)", "ray.init, an INFO line on the driver's stderr", short="Ray"),
    Phase(r"TaskRunner", "task runner started", "reading the data and building the trainer",
          "the first line of the task runner actor (Ray's prefix)", in_prefix=True, short="task runner"),
    Phase(r"^colocated worker base class", "starting the training workers", "building the model and optimizer (FSDP)",
          "verl.single_controller.ray.base, print when the worker group is created", short="worker group"),
    Phase(r"^Total steps: \d+, num_warmup_steps", "training workers ready", "starting the rollout engines (vLLM)",
          "verl.workers.engine.fsdp, print when the optimizer's schedule is built", short="training workers"),
    Phase(r"vLLM\w*Server", "rollout engine starting (vLLM)", "loading the model into vLLM and sizing its KV cache",
          "the first line of verl's vLLM server actor (Ray's prefix)", in_prefix=True, short="vLLM server"),
    Phase(r"^LLMServerManager: ", "rollout engines up", "loading the weights into the rollout engines",
          "verl.workers.rollout.llm_server, print with the servers' addresses", short="vLLM engines"),
    Phase(r"update_weights done", "weights loaded into the rollout engines",
          "starting the first step (its agent-loop workers start with it)",
          "verl.workers.rollout.vllm_rollout, logger.info after each weight sync (the first one here)", short="weights"),
    Phase(r"AgentLoopWorker", "agent-loop workers starting (first step)", "generating the first step's responses",
          "the first line of verl's agent-loop worker actor (Ray's prefix)", in_prefix=True, short="agent loop"),
)
"""The start-up phases the console names, in the order a run reaches them (a phase is named once, when its line
first appears, whatever the order)."""

HEARTBEAT_S = 60.0
"""During start-up, off a terminal: seconds without a console line before a line says what the run is still doing
(on a terminal the status line is rewritten every second instead)."""
CLEAR_LINE = "\r\x1b[K"
"""What a terminal is sent to erase the status line before a line is printed where it was."""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Ray's prefix of a forwarded worker line, colours removed: "(Actor pid=123, ip=...) ", or Ray's own "(raylet) ".
_RAY_PREFIX = re.compile(r"^\((?:[^()]*pid=[^()]*|raylet[^()]*)\) ?")
# vLLM's prefix of its engine processes' lines, inside Ray's: "(EngineCore pid=19027) ".
_PROCESS_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\) ")
_PYTHON_WARNING = re.compile(r":\d+: \w*Warning: ")
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LEVEL_PATTERNS = (
    re.compile(r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b"),  # logging's default, vLLM, verl
    re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:,.]+\s+(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\b"),  # Ray
    re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\]"),  # Hydra's job logging
    re.compile(r"^(?:\[rank\d+\]:)?\[?(?P<glog>[IWEF])\d{4} \d\d:\d\d:\d\d"),  # glog / torch c10
    re.compile(r"^(?P<level>Warning|Error)\b"),  # print("Warning: ...")
    re.compile(r"^(?P<level>[A-Za-z_][\w.]*(?:Error|Exception))(?:\(|:|$)"),  # an exception's last line
)
_GLOG = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
# The driver's own log lines of the recipe's loggers, in Hydra's job-logging format.
_DRIVER_RECIPE_LOG = re.compile(r"^\[[^\]]*\]\[recipe_dapo[\w.]*\]\[INFO\] - (?P<message>.*)$")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def level_of(body: str) -> Optional[str]:
    """The logging level a line was printed at (WARNING for a Python warning), None when it shows none."""
    body = _PROCESS_PREFIX.sub("", body, count=1)
    if _PYTHON_WARNING.search(body):
        return "WARNING"
    for pattern in _LEVEL_PATTERNS:
        match = pattern.match(body)
        if match:
            if match.groupdict().get("glog"):
                return _GLOG[match.group("glog")]
            level = match.group("level").upper()
            return {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(level, level if level in _LEVELS else "ERROR")
    return None


class ConsoleRouter:
    """Decides line by line what the console shows (the rules are in the module docstring)."""

    def __init__(self, noise: tuple[Noise, ...] = NOISE, show_all: bool = False, clock=time.monotonic):
        self.noise = noise
        self.show_all = show_all
        self._patterns = [re.compile(entry.pattern) for entry in noise]
        self.hidden_noise = [0] * len(noise)
        self._seen = [False] * len(noise)
        self.lines = 0
        self.shown = 0
        # Per source (Ray prefix): what the next line continues (a warning's source line, a traceback).
        self._warning_source: dict[str, bool] = {}
        self._traceback: dict[str, str] = {}
        self._lock = threading.Lock()  # Ray prints worker lines from its own thread
        # Start-up (until the first step line): phase lines and the heartbeat.
        self._clock = clock
        self.started = self._last_phase = self._last_shown = clock()
        self.starting = not show_all
        self.doing = "checking the configuration and the data"
        self._phases = [(re.compile(phase.pattern), phase) for phase in STARTUP_PHASES]
        self._phases_seen: set[int] = set()
        self._phase_times: list[tuple[str, float]] = []  # (short name, seconds since the previous phase)
        self.tty = False
        """The console is a terminal: the start-up is a status line rewritten in place (set by the installer)."""
        self.status_drawn = False
        """The status line is on the terminal now (to be erased before the next line)."""
        self.stopping = False  # set once a stop signal came: see ``_route``

    def route(self, line: str, driver_stderr: bool = False) -> Optional[str]:
        """The text the console shows for ``line`` (one line, no newline), or None: the log file only.

        ``driver_stderr``: the line was written on the driver's ``sys.stderr`` (a forwarded worker line carries
        Ray's prefix and is told apart by it)."""
        with self._lock:
            self.lines += 1
            plain = _ANSI.sub("", line)
            match = _RAY_PREFIX.match(plain)
            prefix, body = (match.group(0), plain[match.end():]) if match else ("", plain)
            ended = self._phase(prefix, body) if self.starting else None
            shown = self._route(line, prefix, body, driver_stderr)
            if ended is not None:
                shown = ended if shown is None else f"{ended}\n{shown}"
            if shown is not None:
                self.shown += 1
                self._last_shown = self._clock()
            return shown

    def _phase(self, prefix: str, body: str) -> Optional[str]:
        """Notes the start-up phase ``body`` (from ``prefix``) marks, the first time; at the start-up's end (the
        first validation or step line, or the run's end) the line that sums it up, else None."""
        if body.startswith((TAG + "step ", TAG + "validation at step ", TAG + "run ", _TRACEBACK)):
            self.starting = False  # the first validation or step (or the end): start-up is over
            return self._startup_line() if self._phase_times else None
        for index, (pattern, phase) in enumerate(self._phases):
            if index not in self._phases_seen and pattern.search(prefix if phase.in_prefix else body):
                self._phases_seen.add(index)
                now = self._clock()
                self.doing = phase.next
                if phase.done:
                    self._phase_times.append((phase.short or phase.done, now - self._last_phase))
                    self._last_phase = now
                return None
        return None

    def _startup_line(self) -> str:
        phases = ", ".join(f"{name} {took:.0f} s" for name, took in self._phase_times)
        return f"start-up: {self._clock() - self.started:.0f} s ({phases}; the log file has every line)"

    def status(self) -> Optional[str]:
        """During start-up, the status line: the time since the driver started and what the run is doing."""
        with self._lock:
            if not self.starting:
                return None
            import shutil

            text = f"start-up, {self._clock() - self.started:.0f} s: {self.doing}"
            return text[: max(shutil.get_terminal_size().columns - 1, 20)]  # a wrapped line cannot be rewritten

    def heartbeat(self) -> Optional[str]:
        """During start-up, off a terminal, after :data:`HEARTBEAT_S` seconds without a console line: what the run
        is still doing (on a terminal the status line says it)."""
        with self._lock:
            now = self._clock()
            if self.tty or not self.starting or now - self._last_shown < HEARTBEAT_S:
                return None
            self._last_shown = now
            self.lines += 1
            self.shown += 1
            return f"start-up, {now - self.started:.0f} s: still {self.doing}"

    def _route(self, line: str, prefix: str, body: str, driver_stderr: bool) -> Optional[str]:
        if body.startswith(TAG):
            return body[len(TAG):]
        if self.show_all:
            return line
        if self.stopping and prefix:
            # A run being stopped (pre-emption): the rollout workers' errors about the requests it aborted, and
            # whatever else Ray's processes print as they go, are the log file's; the console keeps the recipe's
            # lines (the summary, where to resume from).
            return None
        if prefix.startswith("(raylet"):
            return line  # Ray's node manager: a worker died, memory ran low, objects spilled
        continued = self._continuation(prefix, body)
        if continued is not None:
            return line if continued else None
        if body.startswith(_TRACEBACK):
            self._traceback[prefix] = "frames"
            return line
        recipe_log = None if prefix else _DRIVER_RECIPE_LOG.match(body)
        if recipe_log:
            return recipe_log.group("message")
        level = level_of(body)
        if level in ("WARNING", "ERROR", "CRITICAL"):
            shown = self._not_noise(body)
            if _PYTHON_WARNING.search(body):
                self._warning_source[prefix] = shown
            return line if shown else None
        if level is None and not prefix and driver_stderr and body.strip():
            return line if self._not_noise(body) else None
        return None

    def _continuation(self, prefix: str, body: str) -> Optional[bool]:
        """True/False when ``body`` continues what its source printed before (shown/hidden); None otherwise."""
        if prefix in self._warning_source:
            shown = self._warning_source.pop(prefix)
            if body[:1].isspace() and body.strip():
                return shown
        state = self._traceback.get(prefix)
        if state == "frames":
            if not body.strip() or body[:1].isspace():
                return True
            self._traceback[prefix] = "raised"  # the exception's line; a chained exception may follow
            return True
        if state == "raised":
            if not body.strip() or body.startswith(_CHAINED) or body[:1].isspace():
                return True
            del self._traceback[prefix]
        return None

    def _not_noise(self, body: str) -> bool:
        for index, pattern in enumerate(self._patterns):
            if pattern.search(body):
                if self.noise[index].once and not self._seen[index]:
                    self._seen[index] = True
                    return True
                self.hidden_noise[index] += 1
                return False
        return True


class LogFile:
    """Where every line goes: held in memory until :meth:`attach` names the file (then appended to it)."""

    MEMORY_LINES = 20_000
    """Lines held before a file is attached; past that they go to a file in the temporary folder."""

    def __init__(self):
        self.path: Optional[str] = None
        self.lines = 0
        self._held: list[str] = []
        self._held_not_shown = 0
        self._file = None
        self._lock = threading.RLock()

    def write(self, line: str, shown: bool = False) -> None:
        """Append ``line``; ``shown``: the console showed it too (held lines all shown need no file at exit)."""
        line = _ANSI.sub("", line) + "\n"
        with self._lock:
            self.lines += 1
            if self._file is not None:
                self._file.write(line)
                return
            self._held.append(line)
            self._held_not_shown += not shown
            if len(self._held) > self.MEMORY_LINES:
                self.attach(_fallback_path())

    def attach(self, path: str) -> str:
        """Append to ``path`` from now on, after a header and the lines held so far; the absolute path."""
        path = os.path.abspath(path)
        with self._lock:
            if self._file is not None:
                if path == self.path:
                    return path
                self._file.close()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._file = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
            self._file.write(f"===== {time.strftime('%Y-%m-%d %H:%M:%S %z')} pid {os.getpid()}: "
                             f"{' '.join(sys.argv)}\n")
            self._file.writelines(self._held)
            self._held, self._held_not_shown = [], 0
            self.path = path
        return path

    def close(self) -> None:
        """Flush; lines still held (no file was named) go to a file in the temporary folder unless the console
        showed every one of them (a refused configuration before the run's name was known)."""
        with self._lock:
            if self._file is None and self._held_not_shown:
                self.attach(_fallback_path())
            if self._file is not None:
                self._file.flush()


def _fallback_path() -> str:
    return os.path.join(tempfile.gettempdir(), f"recipe_dapo-{os.getpid()}.log")


class RoutedStream(io.TextIOBase):
    """A text stream that writes every whole line to the :class:`LogFile` and the lines the
    :class:`ConsoleRouter` keeps to the console; a partial line (a progress bar's ``\\r`` updates in this
    process) reaches the console on ``flush``, unrouted, and the file when its line ends."""

    def __init__(self, stream, router: ConsoleRouter, log_file: LogFile, is_stderr: bool):
        self.stream = stream
        self.router = router
        self.log_file = log_file
        self.is_stderr = is_stderr
        self._pending = ""
        self._flushed = 0  # characters of the pending line already on the console
        self._lock = threading.RLock()
        record = os.environ.get(RECORD_ENV)
        self._record = open(record, "a", buffering=1, encoding="utf-8") if record else None

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                if self._record is not None:
                    self._record.write(f"{2 if self.is_stderr else 1}|{line}\n")
                if self._flushed:
                    self.stream.write(line[self._flushed:] + "\n")
                    self._flushed = 0
                    self.log_file.write(line, shown=True)
                    continue
                shown = self.router.route(line, driver_stderr=self.is_stderr)
                self.log_file.write(line, shown=shown is not None)
                if shown is not None:
                    self._show(shown + "\n")
        return len(text)

    def _show(self, text: str) -> None:
        """``text`` on the console; on a terminal, in place of the start-up status line, which follows it."""
        if not self.router.tty:
            self.stream.write(text)
            return
        if self.router.status_drawn:
            self.stream.write(CLEAR_LINE)
        self.stream.write(text)
        status = self.router.status()
        self.router.status_drawn = status is not None
        if status is not None:
            self.stream.write(status)
        self.stream.flush()

    def emit(self, line: str) -> None:
        """A line of the router's own (a start-up heartbeat): to the console and the log file, between lines."""
        with self._lock:
            self._show(line + "\n")
            self.stream.flush()
            self.log_file.write(line, shown=True)

    def redraw(self) -> None:
        """On a terminal during start-up: the status line rewritten in place (its time, what the run does)."""
        with self._lock:
            if self.router.tty and not self._pending:
                self._show("")

    def flush(self) -> None:
        with self._lock:
            if len(self._pending) > self._flushed:
                if self.router.tty and self.router.status_drawn:  # a partial line (a bar) replaces the status
                    self.stream.write(CLEAR_LINE)
                    self.router.status_drawn = False
                self.stream.write(self._pending[self._flushed:])
                self._flushed = len(self._pending)
            self.stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def __getattr__(self, name):  # buffer, errors, reconfigure, ...: the wrapped stream's
        return getattr(self.stream, name)


@dataclass
class RunOutput:
    """The driver's router and log file, once installed."""

    router: ConsoleRouter
    log_file: LogFile
    console: object
    """The real stdout, for the lines printed at exit."""
    pipes: list = field(default_factory=list)
    """With ``child_processes``: (saved descriptor, reader thread) of descriptors 1 and 2."""


_ACTIVE: Optional[RunOutput] = None


def quiet_workers() -> None:
    """From now on the console shows no line of Ray's processes but the recipe's own (the driver, once a stop signal
    came); they all still reach the log file. A no-op where no console filter is installed."""
    if _ACTIVE is not None:
        _ACTIVE.router.stopping = True

# Hydra's options that print something (the config, help, information) instead of running the job.
_HYDRA_SHOW = ("--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve", "--package", "-p", "--info",
               "-i", "--shell-completion", "-sc")


def hydra_shows_instead_of_running(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks Hydra to print (``--cfg job``, ``--help``, ``--info``, ...) instead of running a job.

    >>> hydra_shows_instead_of_running(["--cfg", "job", "size=cpu_tiny"]), hydra_shows_instead_of_running(["-cjob"])
    (True, True)
    >>> hydra_shows_instead_of_running(["size=cpu_tiny", "trainer.experiment_name=-h"])
    False
    """
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in _HYDRA_SHOW or (name[:2] in ("-c", "-i", "-p") and name[:3] not in ("-cp", "-cn", "-cd")
                                   and not name.startswith("--") and len(name) > 2):
            return True
    return False


def install_console_filter(argv: Optional[Sequence[str]] = None, child_processes: bool = False) -> Optional[RunOutput]:
    """Route this process's ``sys.stdout`` and ``sys.stderr`` (once): every line to the log file, the recipe's
    lines, warnings and errors to the console (all of them with ``DAPO_CONSOLE_FILTER=0``). Not for Hydra's own
    commands (``argv``, default ``sys.argv[1:]``; :func:`hydra_shows_instead_of_running`): None, nothing routed.

    ``child_processes``: route file descriptors 1 and 2 too, so that what processes started from here print
    (vLLM's engine process, spawned with the descriptors and not Python's streams) is routed as well. A Ray
    driver does not need it: Ray sends its workers' lines through the driver's ``sys.stdout`` / ``sys.stderr``."""
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    if hydra_shows_instead_of_running(sys.argv[1:] if argv is None else argv):
        return None
    show_all = os.environ.get(DISABLE_ENV, "1").lower() in ("0", "false", "no")
    os.environ[TAG_ENV] = "1"  # inherited by the Ray workers this driver starts
    router, log_file = ConsoleRouter(show_all=show_all), LogFile()
    console_out, console_err = sys.stdout, sys.stderr
    router.tty = not show_all and _is_terminal(console_out)
    if child_processes:  # the console is a copy of the descriptors; 1 and 2 become pipes read into the router
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        console_out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
        console_err = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    _ACTIVE = RunOutput(router, log_file, console_out)
    sys.stdout = RoutedStream(console_out, router, log_file, is_stderr=False)
    sys.stderr = RoutedStream(console_err, router, log_file, is_stderr=True)
    if child_processes:
        _ACTIVE.pipes = [_pipe_descriptor(fd, stream) for fd, stream in ((1, sys.stdout), (2, sys.stderr))]
    atexit.register(_at_exit, _ACTIVE)
    return _ACTIVE


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _pipe_descriptor(fd: int, stream: "RoutedStream") -> tuple[int, threading.Thread]:
    """Point descriptor ``fd`` at a pipe whose lines a thread writes to ``stream``; (the saved descriptor, the
    thread), for :func:`_at_exit` to restore and drain."""
    import codecs

    saved = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)

    def pump() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            stream.write(decoder.decode(chunk))
        stream.write(decoder.decode(b"", final=True))
        os.close(read_end)

    thread = threading.Thread(target=pump, name=f"dapo-console-fd{fd}", daemon=True)
    thread.start()
    return saved, thread


def _heartbeat(stream: "RoutedStream", period_s: float = 1.0) -> None:
    """While the run starts: on a terminal the status line rewritten every second; elsewhere, after a silence of
    :data:`HEARTBEAT_S` seconds, a line saying what it is still doing."""
    router = stream.router
    while router.starting:
        time.sleep(period_s)
        if router.tty:
            stream.redraw()
            continue
        line = router.heartbeat()
        if line is not None:
            stream.emit(line)


def log_file_path(config) -> str:
    """``$DAPO_LOG_FILE``, else ``<experiment>.log`` beside the metrics file (verl's ``FileLogger`` layout)."""
    from recipe_dapo.tracking.run_log import metrics_file_path  # verl-free

    if os.environ.get(LOG_FILE_ENV):
        return os.path.abspath(os.environ[LOG_FILE_ENV])
    metrics = metrics_file_path(str(config.trainer.project_name), str(config.trainer.experiment_name))
    stem = metrics[: -len(".jsonl")] if metrics.endswith(".jsonl") else metrics
    return os.path.abspath(stem + ".log")


def attach_log_file(config) -> Optional[str]:
    """Start writing the log file of the run ``config`` describes and name it on the console (absolute path);
    None when no router is installed (the entry point was not ``python -m recipe_dapo.main_dapo``)."""
    if _ACTIVE is None:
        return None
    path = attach_log_path(log_file_path(config))
    if not _ACTIVE.router.show_all and isinstance(sys.stdout, RoutedStream) and not _HEARTBEAT:
        # From here the run starts (Ray, workers, engines): the heartbeat says what it is doing when it is quiet.
        _HEARTBEAT.append(threading.Thread(target=_heartbeat, args=(sys.stdout,), name="dapo-console-heartbeat",
                                           daemon=True))
        _HEARTBEAT[0].start()
    return path


_HEARTBEAT: list = []


def attach_log_path(path: str, what: str = "verl, vLLM and Ray") -> Optional[str]:
    """Write every line to ``path`` (``$DAPO_LOG_FILE`` wins) from now on and name it on the console (absolute path);
    None when no router is installed."""
    if _ACTIVE is None:
        return None
    path = _ACTIVE.log_file.attach(os.environ.get(LOG_FILE_ENV) or path)
    shown = "" if _ACTIVE.router.show_all else f" ({DISABLE_ENV}=0 shows them here)"
    print(recipe_line(f"log file: {path}: every line of {what}{shown}"), flush=True)
    return path


def _at_exit(output: RunOutput) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    for fd, (saved, thread) in zip((1, 2), output.pipes):  # the descriptors back; the pipes drained (EOF)
        os.dup2(saved, fd)
        os.close(saved)
        thread.join(timeout=0.5)  # a child still alive (a resource tracker) may hold the pipe open
    output.log_file.close()
    if output.log_file.path is None:
        return
    router = output.router
    if router.status_drawn:  # a run that ended during start-up: the status line erased
        output.console.write(CLEAR_LINE)
    hidden = router.lines - router.shown
    text = f"log file: {output.log_file.path} ({output.log_file.lines} lines"
    text += f", {hidden} not shown here; {DISABLE_ENV}=0 shows them)" if hidden else ")"
    output.console.write(text + "\n")
    output.console.flush()
