"""Process-supervised group advantages (DeepSeekMath, arXiv 2402.03300, section 4.1.3). Pure torch: no verl, no Ray.

A response is a sequence of reasoning steps; step j of response i has a reward r_ij, written at the step's last token.
Within a group G (the responses of one prompt) the step rewards of all its responses are normalised together::

    r~_ij = (r_ij - mean_G(r)) / (std_G(r) + eps)        mean and std over every step of every response of G

(``norm_by_std=False`` drops the division, as Dr.GRPO does for outcome rewards), and the advantage of token t of
response i is the sum of the normalised rewards of its steps that end at or after t::

    A_it = sum_{j : end(j) >= t} r~_ij

So a token is credited with the step it belongs to and every later step. The degenerate cases:

- a response with no step end has advantage 0 on every token (nothing rewards it);
- a group whose step rewards all agree (or that has one step in all) has advantage 0 everywhere: no step is better
  than another, as GRPO gives 0 to a group whose outcomes all agree;
- truncation: the tokens after a response's last step end belong to a step that never ended; no step ends at or
  after them, so their advantage is 0 (a truncated response is credited for the steps it finished only);
- a step end outside ``response_mask`` (padding) is an error, not silently dropped.

``std`` is the unbiased standard deviation, as verl's outcome GRPO (``compute_grpo_outcome_advantage``).
"""

from __future__ import annotations

from typing import Sequence

import torch

EPS = 1e-6


def process_advantages(
    step_rewards: torch.Tensor,
    step_ends: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    *,
    norm_by_std: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    """[batch, response_length] advantages from step rewards (the module docstring has the formula).

    ``step_rewards`` [B, T]: a step's reward at its last token (other entries are ignored); ``step_ends`` [B, T] bool:
    the last token of each step; ``response_mask`` [B, T]: the valid tokens; ``index``: the group id of each row.
    """
    if step_rewards.shape != step_ends.shape or step_rewards.shape != response_mask.shape:
        raise ValueError(
            f"step_rewards {tuple(step_rewards.shape)}, step_ends {tuple(step_ends.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must have the same [batch, response_length] shape"
        )
    if len(index) != step_rewards.shape[0]:
        raise ValueError(f"index has {len(index)} group ids for {step_rewards.shape[0]} rows")
    ends = step_ends.bool()
    mask = response_mask.bool()
    outside = ends & ~mask
    if outside.any():
        row, column = (int(value) for value in outside.nonzero()[0])
        raise ValueError(f"row {row} has a step end at token {column}, outside its response_mask")

    rewards = step_rewards.to(torch.promote_types(step_rewards.dtype, torch.float32))
    normalised = torch.zeros_like(rewards)
    groups: dict = {}
    for row, group in enumerate(index):
        groups.setdefault(_key(group), []).append(row)
    for rows in groups.values():
        rows_t = torch.tensor(rows, dtype=torch.long)
        group_ends = ends[rows_t]
        values = rewards[rows_t][group_ends]
        if values.numel() < 2:
            continue  # no step or one step: nothing to compare it with, advantage 0
        centred = values - values.mean()
        if norm_by_std:
            centred = centred / (values.std() + eps)
        block = torch.zeros_like(rewards[rows_t])
        block[group_ends] = centred
        normalised[rows_t] = block

    # A_t = sum over ends j >= t: a reverse cumulative sum along the response.
    advantages = normalised.flip(-1).cumsum(-1).flip(-1)
    return advantages * mask


def _key(group):
    """A hashable group id (verl's uid is a str; an array element or tensor scalar is taken by value)."""
    return group.item() if hasattr(group, "item") else group
