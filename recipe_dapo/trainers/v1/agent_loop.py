"""verl v1's TransferQueue agent loop with failures that say why.

verl's ``AgentLoopWorkerTQ`` marks a prompt group ``failure`` when one of its sessions raises, and logs the error
in its own Ray worker; the trainer sees only the status. :class:`DAPOAgentLoopWorkerTQ` also writes the error's
one-line summary and whether it means the rollout is gone (``rollout_health.error_tag``) into the group's prompt
marker, so that the recipe's buffer can stop the run on a dead engine instead of refilling forever. The liveness
probe the buffer runs when groups are in flight and none comes back is ``run.rollout_liveness`` (both trainers').
"""

from __future__ import annotations

import logging

import ray
import transfer_queue as tq

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from recipe_dapo.compat.ray import actor_class
from recipe_dapo.compat.verl import init_agent_loop_worker_tq
from recipe_dapo.run.rollout_health import error_tag

logger = logging.getLogger(__name__)


class _DAPOAgentLoopWorkerTQ(actor_class(AgentLoopWorkerTQ)):
    def __init__(self, *args, **kwargs):
        # What verl's AgentLoopWorkerTQ.__init__ does: its zero-argument super() fails in the Ray worker (there its class
        # cell is a copy of the class this one derives from: "super(type, obj): obj must be an instance or subtype").
        init_agent_loop_worker_tq(self, *args, **kwargs)

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
