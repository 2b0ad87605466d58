"""verl v1's TransferQueue agent loop with failures that say why, and the rollout's liveness probe.

verl's ``AgentLoopWorkerTQ`` marks a prompt group ``failure`` when one of its sessions raises, and logs the error
in its own Ray worker; the trainer sees only the status. :class:`DAPOAgentLoopWorkerTQ` also writes the error's
one-line summary and whether it means the rollout is gone (``rollout_health.error_tag``) into the group's prompt
marker, so that the recipe's buffer can stop the run on a dead engine instead of refilling forever.
:class:`RolloutLiveness` is the probe the buffer runs when groups are in flight and none comes back: are the
agent-loop workers and the rollout servers' Ray actors alive, and does every vLLM engine answer its health check.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from typing import Optional

import ray
import transfer_queue as tq

from verl.experimental.agent_loop import AgentLoopWorker
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from recipe_dapo.trainers.v1.rollout_health import RolloutDied, error_tag, summarize_error

logger = logging.getLogger(__name__)


class _DAPOAgentLoopWorkerTQ(AgentLoopWorkerTQ.__ray_actor_class__):
    def __init__(self, *args, **kwargs):
        # verl's AgentLoopWorkerTQ.__init__, whose zero-argument super() fails in the Ray worker (there its class cell
        # is a copy of the class this one derives from: "super(type, obj): obj must be an instance or subtype").
        AgentLoopWorker.__init__(self, *args, **kwargs)
        tq.init()
        self.background_tasks = set()

    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        except Exception as error:
            # Written before verl publishes the group's terminal status (it waits for every session to settle).
            partition_id = "val" if trajectory.get("validate") else "train"
            try:
                await tq.async_kv_put(key=kwargs["uid"], partition_id=partition_id, tag=error_tag(error))
            except Exception:  # the status verl writes next still marks the group failed
                logger.exception("could not record the rollout error of group %s", kwargs.get("uid"))
            raise


DAPOAgentLoopWorkerTQ = ray.remote(_DAPOAgentLoopWorkerTQ)


class DAPOAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` with the recipe's worker (the task runner's default on v1)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = DAPOAgentLoopWorkerTQ


def _actor_name(handle) -> str:
    try:
        name = handle._ray_actor_creation_function_descriptor.class_name.rsplit(".", 1)[-1]
        return f"{name} {handle._actor_id.hex()[:12]}"
    except Exception:
        return repr(handle)


class RolloutLiveness:
    """Raises :class:`RolloutDied`, naming what died, when an agent-loop worker or a rollout server's actor is dead
    or a vLLM engine fails its health check (``GET /health``: 200 while the engine runs, 503 once it died). A probe
    that times out or cannot connect proves nothing (the actor may be busy) and is only logged."""

    def __init__(self, agent_loop_workers, server_handles, server_addresses, timeout_s: float = 10.0):
        self.workers = list(agent_loop_workers or [])
        self.servers = list(server_handles or [])
        self.addresses = list(server_addresses or [])
        self.timeout_s = float(timeout_s)

    @classmethod
    def of(cls, agent_loop_manager, llm_server_manager, timeout_s: float = 10.0) -> "RolloutLiveness":
        return cls(getattr(agent_loop_manager, "agent_loop_workers", []),
                   getattr(llm_server_manager, "server_handles", []),
                   getattr(llm_server_manager, "server_addresses", []), timeout_s=timeout_s)

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
        refs = [handle.__ray_ready__.remote() for handle in handles]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        for index, (handle, ref) in enumerate(zip(handles, refs)):
            if ref not in ready:
                logger.warning("%s %d (%s) did not answer within %.0f s", role, index, _actor_name(handle),
                               self.timeout_s)
                continue
            try:
                ray.get(ref)
            except Exception as error:
                raise RolloutDied(f"{role} {index} ({_actor_name(handle)}) is dead: {summarize_error(error)}") from error

    def _engine_problem(self, address: str) -> Optional[str]:
        """What the engine's health check says is wrong; None when it is healthy or cannot be asked (a server that
        does not answer may be busy or serve no HTTP: the actor check above catches a dead server)."""
        url = f"http://{address}/health"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                return None if response.status == 200 else f"{url} answered HTTP {response.status}"
        except urllib.error.HTTPError as error:
            if error.code >= 500:
                return f"{url} answered HTTP {error.code} (vLLM answers 503 once its engine has died)"
            logger.warning("%s answered HTTP %d; cannot tell whether the engine is alive", url, error.code)
        except (urllib.error.URLError, OSError) as error:
            logger.warning("%s could not be asked (%s); cannot tell whether the engine is alive", url,
                           getattr(error, "reason", error))
        return None
