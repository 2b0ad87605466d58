"""The ``recipe_dapo_seeded`` agent loop: verl's single-turn loop, sampling with the row's ``rollout_seed``.

Registered in verl's agent-loop registry when this module is imported; the plugin imports it when verl imports
``verl.experimental.agent_loop`` (in the agent-loop workers). See ``rollout_seeds`` for where the seeds come from.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from recipe_dapo.trainers.classic.rollout_seeds import AGENT_NAME, SEED_COLUMN, with_seed


@register(AGENT_NAME)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop with vLLM's per-request ``seed`` taken from the ``rollout_seed`` column."""

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        return await super().run(with_seed(sampling_params, kwargs.pop(SEED_COLUMN, None)), **kwargs)
