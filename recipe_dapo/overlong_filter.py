"""Overlong filtering (DAPO section 3.4): truncated responses contribute no policy-gradient loss.

The trainer calls :func:`apply_overlong_filter` on the training batch after advantages are computed
and before the actor update, when ``dapo.overlong_filter.enable=true``. A response is *truncated* when
it used the whole length budget without ending in an end-of-sequence token
(:func:`recipe_dapo.overlong.truncated_responses`). Its ``response_mask`` row is zeroed; its reward
and advantage are left alone, so it still counts in its group's mean and standard deviation.

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
  that into a zero loss instead of NaN (see ``recipe_dapo.loss``).

The row is replaced, never written in place: when the trainer derived ``response_mask`` from
``attention_mask`` it is a view of it, and zeroing the view would hide those tokens from the model.
It also means a caller that keeps ``batch.batch["response_mask"]`` before the call can put the
unfiltered mask back after the update, for metrics that read it: verl's ``compute_data_metrics``
takes ``critic/advantages/*`` over ``response_mask`` tokens (all NaN when every response is filtered).
"""

from __future__ import annotations

import logging
from typing import Iterable, Optional

from verl import DataProto

from recipe_dapo.overlong import truncated_responses

__all__ = ["OVERLONG_FILTER_METRIC_NAMES", "apply_overlong_filter"]

logger = logging.getLogger(__name__)

OVERLONG_FILTER_METRIC_NAMES = (
    "overlong/filtered_ratio",  # filtered responses / responses
    "overlong/filtered_count",  # filtered responses
    "overlong/filtered_token_ratio",  # response_mask tokens removed / response_mask tokens before
)


def apply_overlong_filter(
    batch: DataProto, eos_token_ids: int | Iterable[int], max_response_length: Optional[int] = None
) -> dict[str, float]:
    """Zero the ``response_mask`` rows of truncated responses in ``batch``; return the filter metrics.

    ``eos_token_ids``: every id that ends a response (the tokenizer's eos plus the generation
    config's, e.g. Qwen2.5's ``<|im_end|>`` and ``<|endoftext|>``); a single int is accepted.
    ``max_response_length``: the rollout's length budget; when given it must equal the padded width of
    ``responses`` (verl pads responses to ``actor_rollout_ref.rollout.response_length``), since the
    width is what defines "used the whole budget".

    Truncation is judged on the real response tokens (``attention_mask`` over the response slots),
    not on ``response_mask``: in multi-turn rollouts tool-output tokens are real but masked out of the
    loss, and a truncated response must still be recognised as having filled the budget.
    """
    tensors = batch.batch
    for key in ("responses", "response_mask"):
        if tensors is None or key not in tensors.keys():
            raise KeyError(
                f"apply_overlong_filter needs batch.batch['{key}']; call it on the training batch after "
                "compute_advantage (which adds response_mask) and before the actor update"
            )
    responses = tensors["responses"]
    response_mask = tensors["response_mask"]
    width = responses.shape[-1]
    if max_response_length is not None and width != max_response_length:
        raise ValueError(
            f"batch.batch['responses'] is padded to {width} slots but the response budget is "
            f"{max_response_length}; overlong filtering needs responses padded to the budget "
            "(actor_rollout_ref.rollout.response_length / data.max_response_length)"
        )
    if "attention_mask" in tensors.keys():
        real_tokens = tensors["attention_mask"][:, -width:]
    else:
        real_tokens = response_mask

    if isinstance(eos_token_ids, int):
        eos_token_ids = [eos_token_ids]
    truncated = truncated_responses(responses, real_tokens, eos_token_ids)
    filtered_mask = response_mask.masked_fill(truncated.unsqueeze(-1), 0)
    tensors["response_mask"] = filtered_mask  # a new tensor: see the module docstring

    num_responses = truncated.numel()
    num_filtered = int(truncated.sum())
    tokens_before = float(response_mask.sum())
    tokens_removed = tokens_before - float(filtered_mask.sum())
    metrics = {
        "overlong/filtered_ratio": num_filtered / num_responses if num_responses else 0.0,
        "overlong/filtered_count": float(num_filtered),
        "overlong/filtered_token_ratio": tokens_removed / tokens_before if tokens_before else 0.0,
    }
    if num_filtered == num_responses and num_responses:
        logger.warning(
            "overlong filter: all %d responses of this batch are truncated, so this update has no "
            "policy-gradient signal; raise data.max_response_length or use soft overlong punishment",
            num_responses,
        )
    return metrics
