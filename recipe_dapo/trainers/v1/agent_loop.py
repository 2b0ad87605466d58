"""verl v1's TransferQueue agent loop with failures that say why.

verl's ``AgentLoopWorkerTQ`` marks a prompt group ``failure`` when one of its sessions raises, and logs the error
in its own Ray worker; the trainer sees only the status. :class:`DAPOAgentLoopWorkerTQ` also writes the error's
one-line summary and whether it means the rollout is gone (``rollout_health.error_tag``) into the group's prompt
marker, so that the recipe's buffer can stop the run on a dead engine instead of refilling forever. The liveness
probe the buffer runs when groups are in flight and none comes back is ``run.rollout_liveness`` (both trainers').

With the recipe's resuming client (``colocate_async``: ``partial_rollout.DAPOFullyAsyncLLMServerClient``) each
training session also runs in a ``partial_rollout.session_scope``: its attempts are recorded, so that a checkpoint
saves the responses still generating (:meth:`partial_responses`), and a session resumed from a checkpoint continues
its saved response (the prompt row's ``PARTIAL_FIELD``) instead of starting from the prompt.
"""

from __future__ import annotations

import logging

import ray
import transfer_queue as tq

from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from recipe_dapo.compat.ray import actor_class
from recipe_dapo.compat.verl import init_agent_loop_worker_tq
from recipe_dapo.run.rollout_health import error_tag
from recipe_dapo.trainers.v1.partial_rollout import PARTIAL_FIELD, session_scope

logger = logging.getLogger(__name__)


class _DAPOAgentLoopWorkerTQ(actor_class(AgentLoopWorkerTQ)):
    def __init__(self, *args, **kwargs):
        # What verl's AgentLoopWorkerTQ.__init__ does: its zero-argument super() fails in the Ray worker (there its class
        # cell is a copy of the class this one derives from: "super(type, obj): obj must be an instance or subtype").
        init_agent_loop_worker_tq(self, *args, **kwargs)

    def _partial_book(self):
        """The resuming client's record of this worker's sessions (None with another client)."""
        return getattr(self.llm_client, "partials", None)

    def partial_responses(self, uids: list) -> dict:
        """The responses so far of these groups' sessions (uid -> session -> ``PartialResponse.to_state()``)."""
        book = self._partial_book()
        if book is None:
            return {}
        wanted = {str(uid) for uid in uids}
        return {uid: {session: response.to_state() for session, response in sessions.items()}
                for uid, sessions in book.groups().items() if uid in wanted}

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        uid = prompt.get("uid")
        try:
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace=trace)
        finally:
            book = self._partial_book()
            if book is not None:
                book.discard_group(str(uid))  # the group's status is terminal: nothing of it is in flight

    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        saved = kwargs.pop(PARTIAL_FIELD, None)
        book = None if trajectory.get("validate") else self._partial_book()
        try:
            with session_scope(book, kwargs.get("uid"), kwargs.get("session_id", 0), saved):
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
