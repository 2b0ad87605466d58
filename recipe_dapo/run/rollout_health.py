"""When the rollout dies, the run stops: what counts as dead, how it is reported, when the probe runs.

On verl's v1 trainer generation is fire-and-forget: an agent-loop task that raises only marks its prompt group
``failure`` in TransferQueue, which the recipe's buffer drops and refills. That is right for one bad sample and wrong
for a dead vLLM engine or a dead Ray actor: every later group fails too (or never finishes), and the step waits or
refills forever. This module (no Ray, no TransferQueue) decides which errors mean the rollout itself is gone
(:func:`is_fatal`), turns them into one readable line (:func:`summarize_error`), times the liveness probe that
the stream runs when groups are in flight and none has come back for a while (:class:`StallWatch`), and runs a call
that may never return (verl's weight sync into a dead engine) with the probe beside it (:func:`call_watched`).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

# Errors after which no later request can succeed: vLLM's engine process is gone, or a Ray actor (a rollout
# server, the load balancer, a reward worker) or its node died. Matched by class name anywhere in the error's class
# hierarchy (Ray wraps a remote error in ``RayTaskError(<cause>)``, which also derives from the cause's class) and in
# the causes it chains, so that neither vLLM nor Ray has to be importable where the tag is read.
FATAL_ERROR_NAMES = (
    "EngineDeadError",
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "WorkerCrashedError",
    "NodeDiedError",
    "OutOfMemoryError",
    "RaySystemError",
    "RewardFunctionBroken",  # the reward function failed too often or left too many calls hanging (recipe_dapo.reward)
)

# The tag fields the recipe's agent-loop worker adds to a failed prompt group's marker in TransferQueue.
ERROR_TAG = "error"
FATAL_TAG = "fatal_error"

_MAX_CHARS = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REPR = re.compile(r", repr=<[^>]*>")


class RolloutDied(RuntimeError):
    """The rollout cannot produce another group (a vLLM engine, a rollout server or an agent-loop worker is dead)."""


def _class_names(error: BaseException) -> set[str]:
    names: set[str] = set()
    seen = 0
    while error is not None and seen < 8:
        names.update(cls.__name__ for cls in type(error).__mro__)
        cause = getattr(error, "cause", None)  # Ray's RayTaskError keeps the remote error here
        error = cause if isinstance(cause, BaseException) else (error.__cause__ or error.__context__)
        seen += 1
    return names


def is_fatal(error: BaseException) -> bool:
    """True when ``error`` says the rollout itself is gone (see ``FATAL_ERROR_NAMES``), not that one sample failed."""
    names = _class_names(error)
    return any(name in names or any(name in n for n in names) for name in FATAL_ERROR_NAMES)


def summarize_error(error: BaseException) -> str:
    """One line: the error's class and last message line, and where Ray says it ran (``ray::vLLMHttpServer.generate()
    (pid=..., ip=..., actor_id=...)``) when the error came from another process."""
    text = _REPR.sub("", _ANSI.sub("", str(error))).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    where = next((line for line in lines if line.startswith("ray::")), None)
    # Ray puts the remote traceback between its "ray::..." header and the cause's "pkg.Error: message" line.
    last = lines[-1] if lines else ""
    kind = type(error).__name__
    if where is not None and last and last != where:
        summary = f"{kind}: {last} (raised in {where})"
    else:
        summary = f"{kind}: {last}" if last else kind
    return summary if len(summary) <= _MAX_CHARS else summary[: _MAX_CHARS - 3] + "..."


def error_tag(error: BaseException) -> dict:
    """What the recipe's agent-loop worker writes into a failed group's prompt marker."""
    return {ERROR_TAG: summarize_error(error), FATAL_TAG: is_fatal(error)}


def fatal_failure_message(step: int, errors: list[str], failed_groups: int, in_flight: int,
                           dead: Optional[str] = None) -> str:
    """The line that ends the run when failed groups carry a fatal error; ``dead`` is what the liveness probe found
    (which replica or worker), when it found something."""
    shown = errors[0] + (f" (and {len(errors) - 1} more like it)" if len(errors) > 1 else "")
    found = f"{dead}; " if dead else ""
    if any("RewardFunctionBroken" in error for error in errors):  # not the rollout: the reward function (its line)
        return f"the reward function stopped the run at step {step}: {failed_groups} prompt group(s) failed with {shown}"
    return (
        f"rollout died at step {step}: {found}{failed_groups} prompt group(s) failed with {shown}, {in_flight} "
        "still in flight; no later group can finish, so the run stops instead of waiting. Check the rollout "
        "replica's log (Ray's worker logs: <ray session>/logs/worker-*.err, the vLLM engine's own error is just "
        "before it) for why it died, then rerun the same command: it resumes from the last checkpoint."
    )


class StallWatch:
    """Times the stream's liveness probe: it runs when prompts are in flight and no group has come back for
    ``after_s`` seconds, and again at most every ``after_s`` seconds while that lasts.

    ``probe`` raises :class:`RolloutDied` when something is dead and returns otherwise; ``clock`` is injectable for
    tests. ``after_s <= 0`` turns the probe off.
    """

    def __init__(self, probe: Optional[Callable[[], None]], after_s: float, clock: Callable[[], float] = time.monotonic):
        self.probe = probe
        self.after_s = float(after_s)
        self.clock = clock
        self._last_progress = clock()
        self._last_probe: Optional[float] = None
        self.probes = 0

    def progress(self) -> None:
        """A group came back, or prompts were submitted: the rollout is moving."""
        self._last_progress = self.clock()
        self._last_probe = None

    def diagnose(self) -> Optional[str]:
        """Run the probe now: what it found dead, or None (no probe, or everything answered)."""
        if self.probe is None:
            return None
        try:
            self.probe()
        except RolloutDied as error:
            return str(error)
        return None

    def check(self, in_flight: int) -> None:
        """Run the probe if the stream has been stalled for ``after_s`` (and the last probe is as old)."""
        if self.probe is None or self.after_s <= 0 or in_flight <= 0:
            return
        now = self.clock()
        if now - self._last_progress < self.after_s:
            return
        if self._last_probe is not None and now - self._last_probe < self.after_s:
            return
        self._last_probe = now
        self.probes += 1
        self.probe()


def call_watched(call: Callable[[], T], probe: Callable[[], None], every_s: float, what: str) -> T:
    """``call()``'s result, with ``probe()`` run every ``every_s`` seconds while it has not returned.

    ``call`` runs on a thread of its own; this thread waits for it and probes. When the probe raises
    :class:`RolloutDied` (something the call waits on is dead, so it may never return), that error is raised here,
    naming ``what`` was under way, and the call's thread is left behind (it holds nothing the run still needs: the run
    ends). An error of ``call`` itself is raised as it is.
    """
    done = threading.Event()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the waiting thread, raised there
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name=f"recipe_dapo-watched: {what}", daemon=True).start()
    while not done.wait(every_s):
        try:
            probe()
        except RolloutDied as error:
            raise RolloutDied(f"{error} (during {what}, which cannot finish)") from error
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
