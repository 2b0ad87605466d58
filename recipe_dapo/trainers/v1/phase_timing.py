"""Where a v1 step's time goes inside the trainer's process, beyond verl's own timers.

verl's v1 trainer times sampling (``timing_s/gen``: from the step's start until the replay buffer hands over the
batch), the reward, old log-probs, advantages, the actor update and the weight sync. Inside sampling it times nothing,
and nothing says how long TransferQueue took. :class:`PhaseClock` adds, to the same step's ``timing_s/*`` metrics:

- ``timing_s/tq_read``: seconds the trainer's process spent in TransferQueue reads (``kv_list``, ``kv_batch_get``)
  during the step, wherever in the step (sampling, old log-probs, advantages, the update);
- ``timing_s/tq_write``: the same for writes (``kv_put``, ``kv_batch_put``, ``kv_clear``: prompt markers of a refill,
  clearing judged and filtered groups, the log-probs and advantages written back);
- ``timing_s/gen_tq``: the part of both spent during sampling (inside ``timing_s/gen``);
- ``timing_s/poll_wait``: seconds the replay buffer slept between polls, waiting for groups to finish (generation
  runs meanwhile in the rollout's processes).

Not counted: TransferQueue calls made by other processes (the agent-loop workers write each trajectory and its
status while generating; that time is part of generation). The calls are timed where they are made, the outermost
call only (a read that lists first is one read).

:func:`install_tq_timing` wraps the ``transfer_queue`` module's functions (callers look them up as ``tq.<name>`` at
call time, as verl and the recipe do) through ``recipe_dapo.compat.transfer_queue``, and :func:`uninstall_tq_timing`
puts them back (the v1 trainer does both around ``fit``); :func:`timed_step` brackets one step.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable

from recipe_dapo.compat.transfer_queue import restore_functions, wrap_functions

TQ_READS = ("kv_list", "kv_batch_get")
TQ_WRITES = ("kv_put", "kv_batch_put", "kv_clear")
TQ_READ, TQ_WRITE, GEN_TQ, POLL_WAIT = "tq_read", "tq_write", "gen_tq", "poll_wait"
PHASES = (TQ_READ, TQ_WRITE, GEN_TQ, POLL_WAIT)
"""The ``timing_raw`` names this module adds (verl logs each as ``timing_s/<name>``)."""


class PhaseClock:
    """Seconds per phase since the last :meth:`take`; the trainer's thread and any other in its process may add."""

    def __init__(self):
        self._seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._local = threading.local()
        self.sampling = False  # inside the replay buffer's sample (TransferQueue time also counts as gen_tq)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._seconds[phase] += seconds

    @contextmanager
    def timing(self, phase: str):
        """Time the block into ``phase``; a block inside another of this clock's blocks is not counted again."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                seconds = time.perf_counter() - started
                self.add(phase, seconds)
                if self.sampling and phase in (TQ_READ, TQ_WRITE):
                    self.add(GEN_TQ, seconds)

    def take(self) -> dict[str, float]:
        """Every phase's seconds since the last take (0.0 for those with none), and start again."""
        with self._lock:
            taken = {phase: float(self._seconds.get(phase, 0.0)) for phase in PHASES}
            taken.update({phase: float(s) for phase, s in self._seconds.items() if phase not in taken})
            self._seconds.clear()
        return taken


CLOCK = PhaseClock()
"""The process's clock: the TransferQueue wrappers, the recipe's poll and :func:`timed_step` share it."""


def timed(fn: Callable, phase: str, clock: PhaseClock = CLOCK) -> Callable:
    """``fn``, its time added to ``phase``."""
    if getattr(fn, "timed_phase", None):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with clock.timing(phase):
            return fn(*args, **kwargs)

    wrapper.timed_phase = phase
    wrapper.untimed = fn
    return wrapper


def install_tq_timing(module=None, clock: PhaseClock = CLOCK) -> list[str]:
    """Wrap ``module``'s (default: ``transfer_queue``) read and write functions; a second call changes nothing.
    Returns the names wrapped now; :func:`uninstall_tq_timing` puts the originals back."""
    wrapped = []
    for names, phase in ((TQ_READS, TQ_READ), (TQ_WRITES, TQ_WRITE)):
        wrapped += wrap_functions(module, names, lambda fn, phase=phase: timed(fn, phase, clock))
    return wrapped


def uninstall_tq_timing(module=None) -> None:
    """Put ``module``'s original functions back."""
    restore_functions(module, (*TQ_READS, *TQ_WRITES))


def timed_step(step: Callable, replay_buffer, metrics: dict, timing_raw: dict, clock: PhaseClock = CLOCK):
    """Run verl's ``step(metrics, timing_raw)`` and add the clock's phases to ``timing_raw``: only what happened
    during this step (what came before, validation or a checkpoint, is not counted)."""
    sample = replay_buffer.sample
    if not getattr(sample, "sampling_clock", None):
        @functools.wraps(sample)
        def sampling(*args, **kwargs):
            clock.sampling = True
            try:
                return sample(*args, **kwargs)
            finally:
                clock.sampling = False

        sampling.sampling_clock = clock
        replay_buffer.sample = sampling
    clock.take()
    try:
        return step(metrics, timing_raw)
    finally:
        timing_raw.update(clock.take())
