"""The one rule for a truncated response: it used the whole rollout budget and its last token is not a stop token.

A response of exactly the budget whose last token is EOS finished on its own and is not truncated. The budget is
the rollout's ``response_length``; stop tokens are the tokenizer's EOS plus the model's generation config's
(``recipe_dapo.reward.manager.stop_token_ids``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:
    import torch

TRUNCATED_COLUMN = "truncated"
"""The reward manager's per-response column holding the rule's answer (read by the filter and the metrics)."""


def is_truncated(response_length: int, last_token_id: Optional[int], rollout_budget: int, stop_ids: Iterable[int]) -> bool:
    """The rule, for one unpadded response.

    >>> is_truncated(4, 5, rollout_budget=4, stop_ids={2})    # used the budget, no stop token
    True
    >>> is_truncated(4, 2, rollout_budget=4, stop_ids={2})    # finished on its last slot
    False
    >>> is_truncated(2, 5, rollout_budget=4, stop_ids={2})    # stopped early (a stop string)
    False
    """
    return response_length >= rollout_budget and last_token_id not in set(stop_ids)


def truncated_rows(responses: "torch.Tensor", real_tokens: "torch.Tensor", stop_ids: Iterable[int]) -> "torch.Tensor":
    """The rule for each row of verl's right-padded ``responses`` [batch, budget] (the width is the budget);
    ``real_tokens`` marks the generated tokens (``attention_mask`` over the response slots). Boolean [batch]."""
    import torch

    budget = responses.shape[-1]
    stop_ids = set(int(t) for t in stop_ids)
    lengths = real_tokens.sum(dim=-1).long().tolist()
    last_tokens = responses[:, -1].tolist()
    return torch.tensor(
        [is_truncated(length, last, budget, stop_ids) for length, last in zip(lengths, last_tokens)], dtype=torch.bool
    )
