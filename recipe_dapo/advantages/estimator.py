"""``grpo_process`` in verl's advantage-estimator registry: :func:`recipe_dapo.advantages.process.process_advantages`
on the rewards verl hands every registered estimator.

verl 0.9.1's ``compute_advantage`` passes a registered estimator ``token_level_rewards``, ``response_mask``, the group
ids (``index``, the ``uid`` column) and the algorithm config, nothing else. So the step rewards travel in
``token_level_rewards``: each step's reward at its last token, and a step end is a valid token whose reward is not 0.
A response scored only on its outcome (verl's reward managers put the score at the last valid token) is then one
step, and ``grpo_process`` gives it GRPO's outcome advantage (the same up to verl's epsilon). A step scorer must
therefore never give a step exactly 0 (the chain-arithmetic scorer gives +1 / -1; ``recipe_dapo.advantages.steps``
nudges a sum of 0 in one token away from it).

Select it with ``algorithm.adv_estimator=grpo_process`` (``objective=grpo_process``);
``algorithm.norm_adv_by_std_in_grpo`` is read as for GRPO.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from verl.trainer.ppo.core_algos import register_adv_est

from recipe_dapo.advantages.process import process_advantages

from recipe_dapo.advantages import GRPO_PROCESS


def step_ends_of(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The step ends the rewards mark: valid tokens with a non-zero reward."""
    return (token_level_rewards != 0) & response_mask.bool()


@register_adv_est(GRPO_PROCESS)
def compute_grpo_process_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Optional[Any] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both [batch, response_length], as verl's estimators return them."""
    if index is None:
        raise ValueError("grpo_process needs the group ids (verl's 'uid' column) to normalise each group's steps")
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    with torch.no_grad():
        ends = step_ends_of(token_level_rewards, response_mask)
        advantages = process_advantages(token_level_rewards, ends, response_mask, index, norm_by_std=norm_by_std)
    return advantages, advantages
