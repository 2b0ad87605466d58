"""The ``dapo`` policy loss for verl 0.9.1 (DAPO paper, section 3, eq. 10).

Select it with ``actor_rollout_ref.actor.policy_loss.loss_mode=dapo``. Per valid response token, with
``r = exp(clamp(log_prob - old_log_prob, -20, 20))`` and advantage ``A``::

    J_tok = min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)     decoupled clip (Clip-Higher)
    J_tok = max(J_tok, c * A)                        if A < 0      dual clip, c = clip_ratio_c > 1
    loss_tok = -J_tok * w                                          w = rollout IS weight (1 if absent)

and the token losses are aggregated by verl's ``agg_loss`` with ``config.global_batch_info``. With
``loss_agg_mode=token-mean`` (the paper's token-level loss) that is ``sum(loss_tok) / N`` where N counts
the valid tokens of the whole mini-batch over every micro-batch and data-parallel rank, so gradient
accumulation and data parallelism give exactly the full mini-batch gradient.

A clipped token has zero gradient: the clipped branch is a constant in the current policy.
There is no KL term (keep ``actor_rollout_ref.actor.use_kl_loss=false``, as the paper does).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import verl.utils.torch_functional as verl_F
from omegaconf import DictConfig
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.config import ActorConfig

from recipe_dapo.loss.clip import (  # noqa: F401  (one home for the clip rules and the clip fractions' names)
    CLIPFRAC,
    CLIPFRAC_DUAL,
    CLIPFRAC_EPS_HIGH,
    CLIPFRAC_EPS_LOW,
    ClipBounds,
    clip_bounds,
)

__all__ = [
    "CLIPFRAC",
    "CLIPFRAC_DUAL",
    "CLIPFRAC_EPS_HIGH",
    "CLIPFRAC_EPS_LOW",
    "DAPO_LOSS_MODE",
    "BEHAVIOUR_METRIC_NAMES",
    "BEHAVIOUR_WEIGHTED",
    "BEHAVIOUR_WEIGHT_MEAN",
    "DAPO_METRIC_NAMES",
    "ClipBounds",
    "clip_bounds",
    "compute_policy_loss_dapo",
]

DAPO_LOSS_MODE = "dapo"

# Log-ratio clamp before exp(): keeps r finite when the old and new policies disagree wildly
# (same bound as verl's vanilla loss, so the two losses agree wherever both are defined).
LOG_RATIO_CLAMP = 20.0

# How verl 0.9.1 aggregates these metrics (verl/workers/utils/losses.py ppo_loss, engine_workers.py,
# verl/utils/metric/utils.py), and so what each logged number means:
#   1. ``ppo_loss`` wraps every value this loss returns in ``Metric(aggregation=MEAN)``; a loss cannot
#      choose another aggregation (a ``Metric`` value of another kind raises there), so each value is
#      a per-micro-batch statistic.
#   2. Within a mini-batch, ``Metric.aggregate_dp`` takes the plain mean over micro-batches and
#      data-parallel ranks (not weighted by token counts, exactly like verl's own ``pg_clipfrac``).
#   3. Across the step's mini-batches, ``reduce_metrics`` takes ``np.max`` for names containing "max"
#      and ``np.mean`` otherwise.
# So the fractions are micro-batch-averaged token fractions (exact when micro-batches hold equally many
# valid tokens, and always exact with one micro-batch per rank), and ``clipped_high_token_prob_max`` is
# the largest, over the step's mini-batches, of the per-micro-batch maximum averaged over micro-batches
# and ranks: a smoothed maximum, never above the true one, equal to it with one micro-batch per rank.
# A micro-batch with no clipped token reports 0 for both probability metrics.
DAPO_METRIC_NAMES = (
    CLIPFRAC,
    CLIPFRAC_EPS_HIGH,
    CLIPFRAC_EPS_LOW,
    CLIPFRAC_DUAL,
    "actor/ppo_kl",
    "actor/clipped_high_token_prob_mean",
    "actor/clipped_high_token_prob_max",
)
BEHAVIOUR_WEIGHTED = "actor/behaviour_weighted"
"""1.0 when the loss multiplied its tokens by rollout importance weights (the behaviour-policy correction reached
the loss), 0.0 when it got none; averaged like the others, so a fraction of micro-batches in between."""
BEHAVIOUR_WEIGHT_MEAN = "actor/behaviour_weight_mean"
"""Mean weight the loss applied over valid tokens (1.0 without weights)."""
BEHAVIOUR_METRIC_NAMES = (BEHAVIOUR_WEIGHTED, BEHAVIOUR_WEIGHT_MEAN)


@register_policy_loss(DAPO_LOSS_MODE)
def compute_policy_loss_dapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[ActorConfig | DictConfig] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """DAPO's clipped surrogate (module docstring), aggregated with verl's ``agg_loss``.

    verl calls it with keywords from ``verl.workers.utils.losses.ppo_loss`` after filling
    ``config.global_batch_info`` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor).
    All tensors are [batch, response_length]; ``response_mask`` selects the valid tokens.

    Returns ``(loss, metrics)``; the metric names are :data:`DAPO_METRIC_NAMES` and :data:`BEHAVIOUR_METRIC_NAMES`
    (whether ``rollout_is_weights``, the behaviour-policy correction, reached this loss, and their mean).
    """
    if config is None:
        raise ValueError("the dapo policy loss needs the actor config (verl passes config=ActorConfig)")
    bounds = clip_bounds(config)
    mask = response_mask.bool()

    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - bounds.eps_low, 1.0 + bounds.eps_high)

    # Pessimistic PPO bound with the decoupled band; where the band binds, the clipped branch is a
    # constant in log_prob, so that token's gradient is exactly zero.
    objective = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    # Dual clip: for A < 0 a huge ratio would make the objective unboundedly negative; cap it at c * A.
    negative = advantages < 0
    objective = torch.where(negative, torch.maximum(objective, bounds.clip_ratio_c * advantages), objective)

    token_losses = -objective
    if rollout_is_weights is not None:
        token_losses = token_losses * rollout_is_weights

    global_batch_info = _global_batch_info(config)
    _guard_empty_token_mean(global_batch_info, loss_agg_mode)
    loss = agg_loss(loss_mat=token_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **global_batch_info)

    metrics = _clip_metrics(log_ratio, ratio, log_prob, advantages, mask, bounds)
    metrics.update(behaviour_weight_metrics(rollout_is_weights, mask))
    return loss, metrics


@torch.no_grad()
def behaviour_weight_metrics(rollout_is_weights: Optional[torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
    """:data:`BEHAVIOUR_METRIC_NAMES` for one micro-batch: the trainer checks from them that a configured
    correction reached the loss (``recipe_dapo.policy_lag.correction``)."""
    if rollout_is_weights is None:
        return {BEHAVIOUR_WEIGHTED: 0.0, BEHAVIOUR_WEIGHT_MEAN: 1.0}
    mean = verl_F.masked_mean(rollout_is_weights.detach().float(), mask) if mask.any() else torch.tensor(1.0)
    return {BEHAVIOUR_WEIGHTED: 1.0, BEHAVIOUR_WEIGHT_MEAN: float(mean)}


def _global_batch_info(config: ActorConfig | DictConfig) -> dict:
    """``config.global_batch_info`` (the live dict verl's ``ppo_loss`` fills), or {} when absent."""
    info = config.get("global_batch_info", None)
    return info if info is not None else {}


def _guard_empty_token_mean(global_batch_info: dict, loss_agg_mode: str) -> None:
    """Turn a zero global token count into 1, in place, so an all-masked mini-batch gives 0, not 0/0.

    Why: with overlong filtering every response of a mini-batch can be truncated, so verl fills
    ``batch_num_tokens=0``; agg_loss would then return NaN for this loss and for the entropy and KL
    terms verl's ``ppo_loss`` aggregates from the same dict after this call (``0 * NaN`` is still NaN,
    so even ``entropy_coeff=0`` poisons the loss). With no valid token anywhere every numerator is an
    empty masked sum, so any positive denominator gives exactly 0 and zero gradients. verl refills the
    dict before every micro-batch, so the change never outlives this call's mini-batch.
    """
    if loss_agg_mode != "token-mean":
        return
    batch_num_tokens = global_batch_info.get("batch_num_tokens", None)
    if batch_num_tokens is not None and int(batch_num_tokens) == 0:
        global_batch_info["batch_num_tokens"] = 1


@torch.no_grad()
def _clip_metrics(
    log_ratio: torch.Tensor,
    ratio: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    bounds: ClipBounds,
) -> dict[str, float]:
    """Per-micro-batch clip statistics over valid tokens (see the aggregation note above).

    - pg_clipfrac: the band clip binds (verl's definition: eps_high + eps_low; dual clip is counted apart)
    - pg_clipfrac_eps_high: A > 0 and r > 1 + eps_high (clip-higher binds: ``clip_ratio_high``)
    - pg_clipfrac_eps_low: A < 0 and r < 1 - eps_low (``clip_ratio_low`` binds)
    - pg_clipfrac_lower: A < 0 and r > clip_ratio_c, the dual clip (verl's name and meaning, as its vanilla loss)
    - ppo_kl: mean of -log r (verl's definition)
    - clipped_high_token_prob_mean / _max: current-policy probability exp(log_prob) of the
      clipped-high tokens, 0 when there are none
    """
    clipped_high = mask & (advantages > 0) & (ratio > 1.0 + bounds.eps_high)
    clipped_low = mask & (advantages < 0) & (ratio < 1.0 - bounds.eps_low)
    clipped_dual = mask & (advantages < 0) & (ratio > bounds.clip_ratio_c)

    num_valid = mask.sum().clamp(min=1)
    num_clipped_high = clipped_high.sum()
    prob = torch.exp(log_prob.detach().float())
    prob_of_clipped_high = torch.where(clipped_high, prob, torch.zeros_like(prob))
    stats = torch.stack(
        [
            (clipped_high | clipped_low).sum() / num_valid,
            num_clipped_high / num_valid,
            clipped_low.sum() / num_valid,
            clipped_dual.sum() / num_valid,
            verl_F.masked_mean(-log_ratio.detach().float(), mask),
            prob_of_clipped_high.sum() / num_clipped_high.clamp(min=1),
            prob_of_clipped_high.max(),
        ]
    ).float()
    # One device-to-host copy for all seven numbers instead of one sync per metric.
    return dict(zip(DAPO_METRIC_NAMES, stats.tolist()))
