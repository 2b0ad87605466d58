"""Per-step metrics by policy lag: how much of the batch is stale, and how hard the correction works on it.

For a training step, with ``lag`` per row (``versions.row_lags``), the rows' group ids, and per token the log
importance weight ``log w = log pi_old - log pi_behaviour`` (the actor's recomputed log-prob minus the rollout
engine's, the ratio verl's rollout correction weighs by)::

    policy_lag/<k>/groups                   trained groups whose oldest row has lag k (k = 0 logged every step)
    policy_lag/<k>/log_is_weight_abs_mean   mean |log w| over the valid tokens of rows with lag k
    policy_lag/<k>/is_weight_truncated_frac share of those tokens whose weight the correction truncated or rejected
                                            (token level: w above the upper bound, or outside [lower, upper];
                                            sequence level: the whole sequence's weight exp(sum log w) out of bounds;
                                            0 when no correction runs)
    policy_lag/max                          the largest lag trained this step (0 when everything is fresh)
    policy_lag/stale_group_frac             share of the step's groups with lag >= 1

``log_is_weight_abs_mean`` at lag 0 measures the rollout engine against the trainer on the same weights (numerics:
dtypes, kernels); above lag 0 it adds the policy's change since the rows were generated.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from recipe_dapo.policy_lag.names import LAG_PREFIX, MAX_LAG, STALE_GROUP_FRAC, lag_key  # noqa: F401


def is_bounds(threshold) -> tuple[Optional[float], float]:
    """verl's ``rollout_is_threshold``: a number (an upper bound: truncation) or ``"lower_upper"`` (a band: tokens
    outside it get weight 0) -> ``(lower or None, upper)``."""
    if isinstance(threshold, str) and "_" in threshold:
        lower, upper = threshold.split("_", 1)
        return float(lower), float(upper)
    return None, float(threshold)


def _out_of_bounds(log_weight: torch.Tensor, lower: Optional[float], upper: float) -> torch.Tensor:
    out = log_weight > np.log(upper)
    if lower is not None:
        out = out | (log_weight < np.log(lower))
    return out


@torch.no_grad()
def lag_metrics(lags: np.ndarray, group_ids: np.ndarray, response_mask: torch.Tensor,
                log_weight: Optional[torch.Tensor] = None, is_level: Optional[str] = None,
                is_threshold=2.0) -> dict[str, float]:
    """The step's ``policy_lag/*`` metrics (module docstring). ``lags`` and ``group_ids`` are per row;
    ``response_mask`` and ``log_weight`` are ``[rows, response_length]``; ``is_level`` is verl's
    ``rollout_correction.rollout_is`` (``token``, ``sequence`` or None: no weights applied)."""
    lags = np.asarray(lags, dtype=np.int64)
    group_ids = np.asarray(group_ids)
    if lags.shape[0] != group_ids.shape[0] or lags.shape[0] != response_mask.shape[0]:
        raise ValueError(f"lags ({lags.shape[0]}), group ids ({group_ids.shape[0]}) and the response mask "
                         f"({response_mask.shape[0]}) must have one entry per row")
    # A group's lag is its oldest row's (a group is generated together, but a resumed row can be older).
    _, group_of_row = np.unique(group_ids, return_inverse=True)
    group_lag = np.zeros(group_of_row.max() + 1 if len(group_of_row) else 0, dtype=np.int64)
    np.maximum.at(group_lag, group_of_row, lags)
    max_lag = int(group_lag.max()) if group_lag.size else 0
    metrics: dict[str, float] = {MAX_LAG: float(max_lag),
                                 STALE_GROUP_FRAC: float((group_lag > 0).mean()) if group_lag.size else 0.0}

    mask = response_mask.bool()
    truncated = None
    if log_weight is not None:
        log_weight = log_weight.float()
        if is_level == "token":
            truncated = _out_of_bounds(log_weight, *is_bounds(is_threshold)) & mask
        elif is_level == "sequence":
            sequence = (log_weight * mask).sum(dim=-1, keepdim=True)
            truncated = _out_of_bounds(sequence, *is_bounds(is_threshold)).expand_as(mask) & mask
        else:
            truncated = torch.zeros_like(mask)
    row_lag = torch.as_tensor(lags)
    for lag in range(max_lag + 1):
        groups = int((group_lag == lag).sum())
        if lag and not groups:
            continue
        metrics[lag_key(lag, "groups")] = float(groups)
        if log_weight is None:
            continue
        tokens = mask & (row_lag == lag).unsqueeze(-1)
        count = tokens.sum().clamp(min=1)
        metrics[lag_key(lag, "log_is_weight_abs_mean")] = float((log_weight.abs() * tokens).sum() / count)
        metrics[lag_key(lag, "is_weight_truncated_frac")] = float((truncated & tokens).sum() / count)
    return metrics
