"""Is the rollout alive? The probe both trainers run when the rollout makes no progress, and bounded calls into it.

:class:`RolloutLiveness` asks whether the agent-loop workers and the rollout servers' Ray actors are alive and
whether every vLLM engine answers its health check; it raises ``RolloutDied`` naming what died. The v1 trainer's
stream runs it when groups are in flight and none comes back (``rollout_health.StallWatch``). Both trainers run it
while a call of verl's into the replicas is under way (:func:`watch_replica_calls`: the weight sync, the abort and
sleep at a colocated step's end, the wake-up): such a call into a dead engine never returns, and without the probe
the run would wait forever.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

import ray

from recipe_dapo.compat.ray import actor_label, when_ready
from recipe_dapo.compat.verl import wrap_replica_calls
from recipe_dapo.run.rollout_health import RolloutDied, call_watched, summarize_error

logger = logging.getLogger(__name__)


class RolloutLiveness:
    """Raises :class:`RolloutDied`, naming what died, when an agent-loop worker or a rollout server's actor is dead
    or a vLLM engine fails its health check (``GET /health``: 200 while the engine runs, 503 once it died). A health
    check that gets no answer (the connection refused, or nothing within ``timeout_s``) is logged, and counted: the
    ``max_unanswered``-th in a row for one engine counts it dead (``dapo.health.max_unanswered_health_checks``; 0:
    never); any answer starts the count again. The same probe object keeps the count across calls."""

    def __init__(self, agent_loop_workers, server_handles, server_addresses, timeout_s: float = 10.0,
                 max_unanswered: int = 3):
        self.workers = list(agent_loop_workers or [])
        self.servers = list(server_handles or [])
        self.addresses = list(server_addresses or [])
        self.timeout_s = float(timeout_s)
        self.max_unanswered = int(max_unanswered)
        self.unanswered: dict[str, list[str]] = {}  # address -> what each unanswered check in a row saw

    @classmethod
    def of(cls, agent_loop_manager, llm_server_manager, timeout_s: float = 10.0,
           max_unanswered: int = 3) -> "RolloutLiveness":
        return cls(getattr(agent_loop_manager, "agent_loop_workers", []),
                   getattr(llm_server_manager, "server_handles", []),
                   getattr(llm_server_manager, "server_addresses", []), timeout_s=timeout_s,
                   max_unanswered=max_unanswered)

    @property
    def empty(self) -> bool:
        """Nothing to probe (no rollout started, as in tests of the trainer alone)."""
        return not (self.workers or self.servers or self.addresses)

    def __call__(self) -> None:
        self._actors_alive("agent-loop worker", self.workers)
        self._actors_alive("rollout server (replica)", self.servers)
        for rank, address in enumerate(self.addresses):
            problem = self._engine_problem(address)
            if problem is not None:
                raise RolloutDied(f"the vLLM engine of rollout replica {rank} ({address}) is dead: {problem}")

    def _actors_alive(self, role: str, handles: list) -> None:
        if not handles:
            return
        refs = [when_ready(handle) for handle in handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        for index, (handle, ref) in enumerate(zip(handles, refs)):
            if ref not in ready:
                logger.warning("%s %d (%s) did not answer within %.0f s", role, index, actor_label(handle),
                               self.timeout_s)
                continue
            try:
                ray.get(ref)
            except Exception as error:
                raise RolloutDied(f"{role} {index} ({actor_label(handle)}) is dead: {summarize_error(error)}") from error

    def _engine_problem(self, address: str) -> Optional[str]:
        """What the engine's health check says is wrong; None when it is healthy, or gave no answer fewer than
        ``max_unanswered`` times in a row (a busy server may answer the next one)."""
        url = f"http://{address}/health"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                self.unanswered.pop(address, None)
                return None if response.status == 200 else f"{url} answered HTTP {response.status}"
        except urllib.error.HTTPError as error:
            self.unanswered.pop(address, None)
            if error.code >= 500:
                return f"{url} answered HTTP {error.code} (vLLM answers 503 once its engine has died)"
            logger.warning("%s answered HTTP %d; cannot tell whether the engine is alive", url, error.code)
            return None
        except (urllib.error.URLError, OSError) as error:
            seen = self.unanswered.setdefault(address, [])
            seen.append(self._no_answer(error))
        if self.max_unanswered > 0 and len(seen) >= self.max_unanswered:
            return (f"{len(seen)} health checks in a row got no answer ({url}: {', '.join(seen)}; "
                    f"dapo.health.max_unanswered_health_checks={self.max_unanswered})")
        bound = f"{len(seen)} of {self.max_unanswered} in a row count it dead" if self.max_unanswered > 0 else \
            "never counted dead: dapo.health.max_unanswered_health_checks=0"
        logger.warning("%s gave no answer (%s); %s", url, seen[-1], bound)
        return None

    def _no_answer(self, error: BaseException) -> str:
        """What an unanswered health check saw, in a few words."""
        reason = getattr(error, "reason", error)
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, TimeoutError):  # socket.timeout: connecting, or waiting for the answer
            return f"no answer within {self.timeout_s:g} s"
        return str(reason) or type(reason).__name__


def watch_replica_calls(checkpoint_manager: Any, probe: Optional[Any], every_s: float) -> Callable[[], None]:
    """Make verl's calls into the rollout replicas (``checkpoint_manager.update_weights``, ``abort_replicas``,
    ``sleep_replicas`` and the others of ``compat.verl.REPLICA_CALLS``, called by verl's and the recipe's trainers
    alike) run the rollout's liveness probe every ``every_s`` seconds while they wait: a dead engine or server raises
    ``RolloutDied`` instead of a call that never returns. A call made from a running event loop (a caller that awaits
    verl's coroutine) is left to verl. ``every_s <= 0`` or no probe leaves verl's calls as they are. Returns the
    function that puts verl's calls back."""
    if probe is None or getattr(probe, "empty", False) or every_s <= 0 or checkpoint_manager is None:
        return lambda: None

    def watched(inner: Callable, what: str) -> Callable:
        def call(*args, **kwargs):
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # a plain call: verl runs its coroutine to the end here
                return call_watched(lambda: inner(*args, **kwargs), probe, every_s, what=what)
            caller = inspect.currentframe().f_back
            if caller is not None and caller.f_code.co_flags & inspect.CO_COROUTINE:
                return _coroutine_of(inner)(*args, **kwargs)  # ``await manager.abort_replicas()`` inside verl
            return inner(*args, **kwargs)

        return call

    return wrap_replica_calls(checkpoint_manager, watched)


def _coroutine_of(method: Callable) -> Callable:
    """The coroutine function behind verl's ``@auto_await`` method (bound as ``method`` is), for a caller that awaits
    it; ``method`` itself when it has none."""
    function = getattr(method, "__wrapped__", None)
    owner = getattr(method, "__self__", None)
    if function is None or not inspect.iscoroutinefunction(function):
        return method
    return function.__get__(owner) if owner is not None else function
