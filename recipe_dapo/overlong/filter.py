"""Overlong filtering (DAPO section 3.4): truncated responses contribute no policy-gradient loss.

The trainer calls :func:`apply_overlong_filter` on the training batch after the advantages and the batch's data
metrics are computed, right before the actor update, when ``dapo.overlong_filter.enable=true``. Which responses
are truncated is the reward manager's ``truncated`` column (``truncation.is_truncated`` applied per response);
with a reward manager that reports none, the same rule is applied to the batch's tensors. A truncated response's
``response_mask`` row is zeroed; its reward and advantage are left alone, so it still counts in its group's mean
and standard deviation.

Why zeroing ``response_mask`` is enough in verl 0.9.1 (checked in its source):

- ``left_right_2_no_padding`` copies ``response_mask`` into ``loss_mask``; the engine's
  ``forward_backward_batch`` sums ``loss_mask`` (all-reduced over data-parallel ranks) into
  ``batch_num_tokens``, the token-mean denominator. So filtered tokens leave the numerator *and*
  the denominator of ``token-mean``; the entropy and KL terms use the same mask.
- ``global_token_num`` (from ``input_ids`` lengths) only feeds the MFU estimate, and dynamic batch
  sizing / ``balance_batch`` only balance compute; neither enters the loss.
- Not covered: in the sequence-mean modes (``seq-mean-*``) verl divides by ``global_batch_size``,
  the configured mini-batch size in responses, so a filtered response still counts there, as a
  response with zero loss. The paper's token-mean is exact.
- A mini-batch whose responses are all filtered gets ``batch_num_tokens=0``; the ``dapo`` loss turns
  that into a zero loss instead of NaN (see ``recipe_dapo.loss.dapo``).

The row is replaced, never written in place: when the trainer derived ``response_mask`` from ``attention_mask``
it is a view of it, and zeroing the view would hide those tokens from the model.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Optional

from recipe_dapo.overlong.metrics import filter_metrics
from recipe_dapo.overlong.truncation import TRUNCATED_COLUMN, truncated_rows

logger = logging.getLogger(__name__)


def apply_overlong_filter(
    batch: Any, stop_ids: int | Iterable[int], max_response_length: Optional[int] = None
) -> dict[str, float]:
    """Zero the ``response_mask`` rows of truncated responses in ``batch`` (a verl ``DataProto``); return the
    ``overlong/filtered_*`` metrics.

    ``stop_ids``: every id that ends a response (used only when the batch has no ``truncated`` column).
    ``max_response_length``: the rollout's length budget; when given it must equal the padded width of
    ``responses``, since the width is what defines "used the whole budget".
    """
    import torch

    tensors = batch.batch
    for key in ("responses", "response_mask"):
        if tensors is None or key not in tensors.keys():
            raise KeyError(
                f"apply_overlong_filter needs batch.batch['{key}']; call it on the training batch after "
                "compute_advantage (which adds response_mask) and before the actor update"
            )
    responses, response_mask = tensors["responses"], tensors["response_mask"]
    width = responses.shape[-1]
    if max_response_length is not None and width != max_response_length:
        raise ValueError(
            f"batch.batch['responses'] is padded to {width} slots but the response budget is "
            f"{max_response_length}; overlong filtering needs responses padded to the budget "
            "(actor_rollout_ref.rollout.response_length / data.max_response_length)"
        )
    column = (batch.non_tensor_batch or {}).get(TRUNCATED_COLUMN)
    if column is not None:
        truncated = torch.as_tensor(column.astype(bool), device=response_mask.device)
    else:
        # Judged on the real response tokens, not response_mask: in multi-turn rollouts tool-output tokens are real
        # but masked out of the loss, and a truncated response must still be recognised as having filled the budget.
        real_tokens = tensors["attention_mask"][:, -width:] if "attention_mask" in tensors.keys() else response_mask
        truncated = truncated_rows(responses, real_tokens, [stop_ids] if isinstance(stop_ids, int) else stop_ids)
    filtered_mask = response_mask.masked_fill(truncated.unsqueeze(-1), 0)
    tensors["response_mask"] = filtered_mask  # a new tensor: see the module docstring

    num_responses, num_filtered = truncated.numel(), int(truncated.sum())
    if num_filtered == num_responses and num_responses:
        logger.warning(
            "overlong filter: all %d responses of this batch are truncated, so this update has no "
            "policy-gradient signal; raise data.max_response_length or use soft overlong punishment",
            num_responses,
        )
    return filter_metrics(num_responses, num_filtered, float(response_mask.sum()), float(filtered_mask.sum()))
