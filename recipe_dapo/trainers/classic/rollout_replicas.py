"""verl 0.9.x's rollout-replica protocol as a small state machine, so that the trainer cannot break it.

The protocol (``verl/checkpoint_engine/base.py`` and ``RayPPOTrainer``):

- ``init_workers`` ends with ``checkpoint_manager.sleep_replicas()``: the replicas start asleep.
- ``checkpoint_manager.update_weights(step)`` loads the actor's weights into the replicas and leaves them awake
  (the colocated ``naive`` backend wakes them inside the actor's weight push; other backends abort in-flight
  requests, release and restore the KV cache around the transfer).
- ``sleep_replicas()`` frees their weights and KV cache (with ``free_cache_engine``), so the actor can train in
  that memory. A rollout sent to a sleeping replica can hang or leave async vLLM in an invalid state.
- verl wakes replicas only through ``update_weights``: ``wake_up_replicas`` restores memory but, in hybrid mode,
  not the weights a level-2 sleep discarded (verl's own trainer does the same after a colocated reward model).

So: awake with the actor's current weights for every generation, asleep while the actor trains. DAPO makes
this easy to get wrong because a step runs any number of generation rounds (none when carried-over groups fill
the batch) and may skip its update. :class:`RolloutReplicas` keeps the state and answers three calls:
``ready_for_generation`` before each rollout (a weight sync when they are asleep or behind the actor),
``sleep`` before the actor works (a no-op when already asleep), ``actor_updated`` after an update (the next
``ready_for_generation`` syncs). It needs only the checkpoint manager's methods: no Ray here.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)


class RolloutReplicas:
    """Tracks whether verl's rollout replicas are awake and hold the actor's current weights."""

    def __init__(self, checkpoint_manager: Any, awake: bool = False):
        self._manager = checkpoint_manager
        self.awake = awake
        self._actor_version = 0
        self._replica_version: Optional[int] = None  # None: never synced

    @property
    def current(self) -> bool:
        """True when the replicas hold the actor's latest weights."""
        return self._replica_version == self._actor_version

    def sync_weights(self, global_steps: int) -> dict:
        """Push the actor's weights to the replicas (which wakes them); returns the sync's metrics."""
        metrics = self._manager.update_weights(global_steps)
        self.awake = True
        self._replica_version = self._actor_version
        return metrics if isinstance(metrics, dict) else {}

    def ready_for_generation(self, global_steps: int) -> dict:
        """Make the replicas able to generate with the current weights; a no-op when they already are."""
        if self.awake and self.current:
            return {}
        logger.debug("step %d: waking the rollout replicas with a weight sync", global_steps)
        return self.sync_weights(global_steps)

    def sleep(self) -> None:
        """Free the replicas' device memory before the actor works; a no-op when they already sleep."""
        if self.awake:
            self._manager.sleep_replicas()
            self.awake = False

    def actor_updated(self) -> None:
        """The actor's weights changed: the replicas are behind until the next sync."""
        self._actor_version += 1
