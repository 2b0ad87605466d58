"""Bounded calls of a user's reward function, and a watchdog that names scoring which makes no progress.

Why not ``loop.run_in_executor(None, ...)``: a Python thread cannot be stopped, so a call abandoned at its
time-out keeps its thread; in a shared executor (asyncio's default one has ``min(32, cpus + 4)``) the
abandoned calls hold slots until none is left, and everything else submitted there -- decoding, our own
verification -- waits forever. Here:

- :class:`BoundedCaller` runs each call of one function on a fresh daemon thread of its own. At most
  ``max_running`` calls run at once; a call that passes ``timeout_s`` raises :class:`CallTimeout` and gives its
  slot back at once, while its thread is *abandoned* (counted in ``abandoned`` until it ends by itself). So a
  function that hangs costs its time-out per call and never blocks another call, nor anything outside this
  caller. Daemon threads also never hold up the interpreter's exit (an executor's threads are joined there).
  The time-out counts from the start of the call itself, not from the wait for a slot.
- Abandoned threads are bounded too: with ``max_abandoned`` (``dapo.health.max_abandoned_reward_calls``), a call
  that would start while that many timed-out calls are still running raises :class:`RewardFunctionBroken` instead,
  naming the function and the share of its calls that timed out, and the run stops. So the threads one caller keeps
  alive never exceed ``max_running + max_abandoned``. A thread that cannot be started (the process is out of
  threads) raises the same, instead of scoring the sample as a wrong answer.
- :class:`ProgressWatch` records the calls in flight; when none has finished for ``stall_s`` seconds while
  some are in flight, a daemon thread logs one warning that names them (how many, of which kind, the oldest
  and how long it has run) and the abandoned calls; it warns again only after progress resumed and stalled
  anew. It is a thread so that it warns even when an ``async`` function blocks the event loop.

Limits: an abandoned thread runs until the function returns (a CPU-bound endless loop keeps a core busy);
``abandoned`` and the watchdog's warning say how many there are. Pure standard library, no Ray.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_RUNNING = min(32, (os.cpu_count() or 1) + 4)
"""Calls of one :class:`BoundedCaller` running at once: what asyncio's default executor allows."""


class CallTimeout(TimeoutError):
    """A call ran past its time-out; its thread was abandoned."""


class RewardFunctionBroken(RuntimeError):
    """A reward function failed too often, or left too many calls hanging, for the run to go on: its message is the
    one line that says which function and what share of its calls failed. The reward manager lets it through (a
    single failed sample is scored -1 instead)."""


def share(part: int, whole: int) -> str:
    """``"3 of 4 (75%)"``."""
    return f"{part} of {whole} ({100.0 * part / whole:.0f}%)" if whole else f"{part} of 0"


@dataclass
class _CallState:
    done: bool = False
    abandoned: bool = False


class BoundedCaller:
    """Runs a blocking function with a time-out per call, on threads nothing else shares (module docstring)."""

    def __init__(self, timeout_s: float, max_running: int = DEFAULT_MAX_RUNNING, name: str = "reward function",
                 max_abandoned: int = 0, label: str | None = None):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {max_running}")
        if max_abandoned < 0:
            raise ValueError(f"max_abandoned must be >= 0 (0: no cap), got {max_abandoned}")
        self.timeout_s = float(timeout_s)
        self.max_running = max_running
        self.max_abandoned = int(max_abandoned)
        """Calls refused (:class:`RewardFunctionBroken`) while this many timed-out calls still run; 0: no cap."""
        self.name = name
        self.label = label or name
        """How the function is named in :class:`RewardFunctionBroken` (e.g. with its file and function name)."""
        self.calls = 0
        """Calls that ended (returned, raised or timed out), in all."""
        self.timeouts = 0
        """Calls that ran past the time-out, in all."""
        self.abandoned = 0
        """Timed-out calls whose threads are still running."""
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _semaphore(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        with self._lock:  # an asyncio.Semaphore belongs to one event loop
            semaphore = self._slots.get(loop)
            if semaphore is None:
                semaphore = self._slots[loop] = asyncio.Semaphore(self.max_running)
            return semaphore

    async def call(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` on its own thread; its result or exception, or :class:`CallTimeout`."""
        loop = asyncio.get_running_loop()
        async with self._semaphore(loop):
            self._refuse_past_cap()
            future = loop.create_future()
            state = _CallState()

            def run() -> None:
                try:
                    outcome = (function(*args, **kwargs), None)
                except Exception as error:  # handed to the caller
                    outcome = (None, error)
                except BaseException as error:  # noqa: BLE001 - sys.exit() in a user function must not end the worker
                    outcome = (None, RuntimeError(f"{self.name} raised {type(error).__name__}: {error}"))
                with self._lock:
                    state.done = True
                    if state.abandoned:
                        self.abandoned -= 1
                        return
                try:
                    loop.call_soon_threadsafe(_settle, future, outcome)
                except RuntimeError:  # the event loop is closed: nobody waits for this result
                    pass

            thread = threading.Thread(
                target=run, name=f"recipe_dapo-{self.name.replace(' ', '_')}-{next(self._counter)}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as error:  # "can't start new thread": the process is out of threads
                raise RewardFunctionBroken(
                    f"{self.label}: no thread could be started for another call ({error}) with {self.abandoned} "
                    f"timed-out calls still running; {share(self.timeouts, self.calls)} calls timed out after "
                    f"{self.timeout_s:g} s. The run stops: make the function return within its time-out "
                    "(reward.reward_kwargs.custom_score_timeout_s)"
                ) from error
            try:
                try:
                    return await asyncio.wait_for(future, timeout=self.timeout_s)
                finally:
                    if future.done() and not future.cancelled():
                        with self._lock:
                            self.calls += 1  # returned or raised
            except (asyncio.TimeoutError, asyncio.CancelledError) as error:
                with self._lock:
                    if not state.done:
                        state.abandoned = True
                        self.abandoned += 1
                    if isinstance(error, asyncio.TimeoutError):
                        self.timeouts += 1
                        self.calls += 1
                if isinstance(error, asyncio.CancelledError):
                    raise
                raise CallTimeout(
                    f"time-out: {self.name} still running after {self.timeout_s:g} s"
                ) from None


    def _refuse_past_cap(self) -> None:
        with self._lock:
            abandoned, timeouts, calls = self.abandoned, self.timeouts, self.calls
        if self.max_abandoned and abandoned >= self.max_abandoned:
            raise RewardFunctionBroken(
                f"{self.label}: {abandoned} timed-out calls are still running on abandoned threads in this reward "
                f"worker (the cap, dapo.health.max_abandoned_reward_calls={self.max_abandoned}); "
                f"{share(timeouts, calls)} calls timed out after {self.timeout_s:g} s. The run stops: make the "
                "function return within its time-out (reward.reward_kwargs.custom_score_timeout_s), then rerun to "
                "resume from the last checkpoint"
            )


def _settle(future: asyncio.Future, outcome: tuple[Any, BaseException | None]) -> None:
    if future.done():  # timed out or cancelled meanwhile
        return
    result, error = outcome
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class ProgressWatch:
    """Calls in flight and the time of the last progress; a daemon thread warns once per stall.

    ``begin(kind, detail)`` returns a token for ``end(token)``; ending a call is progress. ``stalled_message``
    is the pure check (``now`` injectable); the thread calls it every ``min(stall_s / 4, 5)`` seconds while
    calls are in flight and exits when none is.
    """

    def __init__(
        self,
        stall_s: float,
        logger: logging.Logger,
        abandoned: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not stall_s > 0:
            raise ValueError(f"stall_s must be positive, got {stall_s}")
        self.stall_s = float(stall_s)
        self.logger = logger
        self.abandoned = abandoned
        self.clock = clock
        self.warnings = 0
        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[str, str, float]] = {}
        self._tokens = itertools.count()
        self._last_progress = clock()
        self._warned_for: float | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def begin(self, kind: str, detail: str = "") -> int:
        token = next(self._tokens)
        now = self.clock()
        with self._lock:
            if not self._in_flight:
                self._last_progress = now  # an idle stretch is no stall
            self._in_flight[token] = (kind, detail, now)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="recipe_dapo-reward-watchdog", daemon=True)
                self._thread.start()
        return token

    def end(self, token: int) -> None:
        with self._lock:
            self._in_flight.pop(token, None)
            self._last_progress = self.clock()

    def stalled_message(self, now: float | None = None) -> str | None:
        """The warning when calls are in flight and none ended for ``stall_s`` (once per stall), else None."""
        now = self.clock() if now is None else now
        with self._lock:
            if not self._in_flight or now - self._last_progress < self.stall_s:
                return None
            if self._warned_for == self._last_progress:
                return None
            self._warned_for = self._last_progress
            calls = list(self._in_flight.values())
            idle_s = now - self._last_progress
        kinds: dict[str, int] = {}
        for kind, _, _ in calls:
            kinds[kind] = kinds.get(kind, 0) + 1
        oldest_kind, oldest_detail, oldest_start = min(calls, key=lambda call: call[2])
        by_kind = ", ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
        message = (
            f"reward scoring made no progress for {idle_s:.0f} s: {len(calls)} calls in flight ({by_kind}); "
            f"the oldest ({oldest_kind}{', ' + oldest_detail if oldest_detail else ''}) has run for "
            f"{now - oldest_start:.0f} s"
        )
        abandoned = self.abandoned()
        if abandoned:
            message += f"; {abandoned} timed-out custom compute_score calls are still running on abandoned threads"
        return message + " (warning after reward.reward_kwargs.stall_warning_s of no progress)"

    def _run(self) -> None:
        interval = min(self.stall_s / 4, 5.0)
        while True:
            self._wake.wait(interval)
            message = self.stalled_message()
            if message is not None:
                self.warnings += 1
                self.logger.warning(message)
            with self._lock:
                if not self._in_flight:
                    self._thread = None
                    return
