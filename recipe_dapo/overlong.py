"""Overlong reward shaping (DAPO section 3.4): pure maths on lengths and token ids, no Ray.

Soft overlong punishment (paper eq. 13), with L_max the maximum response length and L_cache the
punishment buffer at its end::

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                  if |y| > L_max

The result is scaled by ``penalty_factor`` (1.0 in the paper) and added to the correctness reward.

Overlong filtering masks the loss of *truncated* responses: those that used the whole length budget
without ending in an end-of-sequence token. A response of exactly L_max tokens whose last token is EOS
finished on its own and is not truncated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the maths on numbers (and the start-up check) must not pay for importing torch
    import torch


def soft_overlong_penalty(response_length: int, max_resp_len: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """Paper eq. 13 for one response, times ``penalty_factor``; 0 when no shaping applies.

    >>> soft_overlong_penalty(12, max_resp_len=16, buffer_len=4)   # exactly L_max - L_cache
    0.0
    >>> soft_overlong_penalty(14, max_resp_len=16, buffer_len=4)   # half way into the buffer
    -0.5
    >>> soft_overlong_penalty(16, max_resp_len=16, buffer_len=4)   # at L_max
    -1.0
    >>> soft_overlong_penalty(17, max_resp_len=16, buffer_len=4)   # beyond L_max
    -1.0
    """
    check_overlong_buffer(max_resp_len, buffer_len)
    expected_len = max_resp_len - buffer_len
    if response_length <= expected_len:
        return 0.0
    if response_length > max_resp_len:
        return -1.0 * penalty_factor
    return (expected_len - response_length) / buffer_len * penalty_factor


def soft_overlong_penalties(
    response_lengths: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """Vectorised :func:`soft_overlong_penalty` over a 1-D tensor of lengths (float32 result)."""
    import torch

    check_overlong_buffer(max_resp_len, buffer_len)
    lengths = response_lengths.to(torch.float32)
    expected_len = float(max_resp_len - buffer_len)
    penalty = ((expected_len - lengths) / buffer_len).clamp(min=-1.0, max=0.0)
    return penalty * penalty_factor


def check_overlong_buffer(max_resp_len: int, buffer_len: int) -> None:
    """Refuse a buffer that leaves no room for an unpunished response (or a non-positive one)."""
    if buffer_len <= 0:
        raise ValueError(
            f"overlong buffer length must be positive, got {buffer_len}; "
            "set reward.reward_kwargs.overlong_buffer_cfg.enable=False to turn soft punishment off"
        )
    if buffer_len >= max_resp_len:
        raise ValueError(
            f"overlong buffer ({buffer_len} tokens) must be shorter than the maximum response length "
            f"({max_resp_len}); lower reward.reward_kwargs.overlong_buffer_cfg.len or raise "
            "reward.reward_kwargs.max_resp_len / data.max_response_length"
        )


def truncated_responses(
    responses: torch.Tensor, response_mask: torch.Tensor, eos_token_ids: Iterable[int]
) -> torch.Tensor:
    """Boolean [batch] tensor: True where a response filled every slot and its last token is not EOS.

    ``responses`` and ``response_mask`` are verl's right-padded [batch, max_response_length] tensors, so
    the width of ``responses`` is the length budget the rollout had.
    """
    import torch

    max_len = responses.shape[-1]
    lengths = response_mask.sum(dim=-1).long()
    used_whole_budget = lengths >= max_len
    last_token = responses[:, -1]
    eos = torch.as_tensor(sorted(set(int(t) for t in eos_token_ids)), dtype=responses.dtype, device=responses.device)
    ends_with_eos = torch.isin(last_token, eos) if eos.numel() else torch.zeros_like(used_whole_budget)
    return used_whole_budget & ~ends_with_eos
