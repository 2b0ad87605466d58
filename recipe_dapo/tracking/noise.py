"""Known console noise of a run, in one place, and the filter that hides it from the driver's console.

Every Ray worker's stdout and stderr reach the console through the driver, which prints them line by line
on its own ``sys.stdout`` / ``sys.stderr``; :func:`install_console_filter` (called by
``python -m recipe_dapo.main_dapo``) wraps those two streams, so one filter covers the driver and every
worker. A line is hidden when it matches a pattern of :data:`NOISE`; a hidden Python warning's second line
(its source line, ``  warnings.warn(...)``) goes with it. Nothing else is touched: the progress bar,
errors, tracebacks and every warning not listed here still print. The logs Ray writes under
``/tmp/ray/session_*/logs`` keep every line, and ``DAPO_CONSOLE_FILTER=0`` turns the filter off.

A new kind of noise is a new :class:`Noise` entry below, with who prints it and why it is noise here.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import re
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)

DISABLE_ENV = "DAPO_CONSOLE_FILTER"


@dataclass(frozen=True)
class Noise:
    pattern: str
    """Regular expression searched in each console line (after Ray's ``(Actor pid=...)`` prefix)."""
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
)

# Ray's prefix of a forwarded worker line: optional colour, "(Actor pid=123, ip=...)", optional colour.
_RAY_PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\([^()]*pid=[^()]*\)(?:\x1b\[[0-9;]*m)? ?")
_WARNING_LINE = re.compile(r":\d+: \w*Warning: ")


class NoiseFilter:
    """Decides line by line what the console shows (rules in the module docstring); counts what it hides."""

    def __init__(self, noise: tuple[Noise, ...] = NOISE):
        self.noise = noise
        self._patterns = [re.compile(entry.pattern) for entry in noise]
        self.hidden = [0] * len(noise)
        self._seen = [False] * len(noise)
        # Ray prefix -> noise entry, when that source's next indented line is a hidden warning's source line.
        self._source_line_pending: dict[str, int] = {}

    def keep(self, line: str) -> bool:
        match = _RAY_PREFIX.match(line)
        prefix, body = (match.group(0), line[match.end():]) if match else ("", line)
        if prefix in self._source_line_pending:
            index = self._source_line_pending.pop(prefix)
            if body[:1].isspace() and body.strip():
                self.hidden[index] += 1
                return False
        for index, pattern in enumerate(self._patterns):
            if pattern.search(body):
                if self.noise[index].once and not self._seen[index]:
                    self._seen[index] = True
                    return True
                self.hidden[index] += 1
                if _WARNING_LINE.search(body):
                    self._source_line_pending[prefix] = index
                return False
        return True

    @property
    def hidden_total(self) -> int:
        return sum(self.hidden)


class FilteredStream(io.TextIOBase):
    """A text stream that passes whole lines through :class:`NoiseFilter`; partial writes (a progress bar's
    ``\\r`` updates) go through on ``flush``, unfiltered."""

    def __init__(self, stream, noise_filter: NoiseFilter):
        self.stream = stream
        self.noise_filter = noise_filter
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if self.noise_filter.keep(line):
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(self._pending)
            self._pending = ""
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


def install_console_filter() -> NoiseFilter | None:
    """Wrap this process's ``sys.stdout`` and ``sys.stderr`` (once); None when ``DAPO_CONSOLE_FILTER=0``."""
    if os.environ.get(DISABLE_ENV, "1") in ("0", "false", "no"):
        return None
    if isinstance(sys.stdout, FilteredStream):
        return sys.stdout.noise_filter
    noise_filter = NoiseFilter()
    sys.stdout = FilteredStream(sys.stdout, noise_filter)
    sys.stderr = FilteredStream(sys.stderr, noise_filter)
    atexit.register(_report_hidden, noise_filter)
    return noise_filter


def _report_hidden(noise_filter: NoiseFilter) -> None:
    from recipe_dapo.tracking.console import logger as console_logger
    from recipe_dapo.tracking.console import _ensure_handler

    if noise_filter.hidden_total:
        _ensure_handler()
        console_logger.info(
            "the console hid %d known-noise line(s) (recipe_dapo/tracking/noise.py lists them; "
            "%s=0 shows them)", noise_filter.hidden_total, DISABLE_ENV,
        )
