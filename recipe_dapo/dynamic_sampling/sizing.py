"""How many prompts the next round asks for, from a running estimate of the keep rate.

Deficit sizing (``round_sizing=deficit``), with M groups still missing from the batch and keep-rate
estimate p::

    prompts = ceil(M * (1 + safety_margin) / max(p, MIN_KEEP_RATE))
    prompts = clip(prompts, min_round, max_round), rounded up to a multiple of prompt_granularity
    prompts = min(prompts, prompts left in the step's max_num_gen_batches budget)

One-round sizing (``one_round=true``, a streaming source that aborts what is unfinished when the batch is full),
with M groups missing, I prompts already in flight, confidence c and over-provision f: T the fewest prompts with
``P(Binomial(T, p) >= M) >= c`` (normal approximation with a continuity correction), then ``N = ceil(f T) - I`` new
prompts, rounded up to the granularity and within the step's budget (``min_round``/``max_round`` do not apply: the
round is the step). With f > 1 the batch fills from the groups that finish first while the replicas are still full;
the rest are aborted and finish first in the next step. The sampler applies f only where it pays
(``DynamicSampler._overprovision``): once the keep-rate estimate rests on judged groups (on the prior alone, a run's
first step, a rate far below the true one, multiplied, would fill this step and the next with surplus that then ages
out: the GPU model at keep rate 0.9 dropped 400 qualifying groups as stale in step 2), and in a step that began with
prompts in flight (a source that finishes a step's prompts in one wave aborts nothing, and there the extra prompts
would only pool surplus).

Whole sizing (``round_sizing=whole``): ``gen_batch_size`` prompts, as in the paper. With the filter
disabled (``algorithm.filter_groups.enable=false``) a deficit round is exactly the M missing prompts
(rounded up to the granularity).

Why a margin and a floor: an extra round costs a whole generation pass, whose wall time is set by its
longest response, while surplus groups are not wasted (they are carried to the next step). So it pays to
overshoot a little and to never send a tiny round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

from recipe_dapo.dynamic_sampling.config import DynamicSamplingConfig

MIN_KEEP_RATE = 1e-3
"""Floor of the keep rate used for sizing, so an all-filtered history cannot ask for infinitely many prompts
(``max_round`` caps the round anyway)."""

PRIOR_WEIGHT = 1.0
"""The prior counts as this many generated groups: enough to size the first round, negligible after it."""


@dataclass
class KeepRateEstimate:
    """Decayed counts of kept and generated groups; the estimate is their ratio, shrunk toward a prior::

        p = (K + prior * PRIOR_WEIGHT) / (G + PRIOR_WEIGHT)

    Rounds add their counts to K and G; each new training step first multiplies K and G by ``decay``.
    """

    prior: float
    kept: float = 0.0
    generated: float = 0.0

    @property
    def value(self) -> float:
        return (self.kept + self.prior * PRIOR_WEIGHT) / (self.generated + PRIOR_WEIGHT)

    def start_step(self, decay: float) -> None:
        self.kept *= decay
        self.generated *= decay

    def observe(self, kept_groups: int, generated_groups: int) -> None:
        self.kept += kept_groups
        self.generated += generated_groups

    def state_dict(self) -> dict:
        return {"prior": self.prior, "kept": self.kept, "generated": self.generated}

    @classmethod
    def from_state_dict(cls, state: dict) -> "KeepRateEstimate":
        return cls(prior=float(state["prior"]), kept=float(state["kept"]), generated=float(state["generated"]))


def next_round_prompts(
    config: DynamicSamplingConfig, missing_groups: int, keep_rate: float, prompts_generated_this_step: int
) -> int:
    """Prompts for the next round (0 when nothing is missing or the step's budget is spent)."""
    if missing_groups <= 0:
        return 0
    budget_left = _budget_left(config, prompts_generated_this_step)
    if budget_left == 0:
        return 0
    if config.round_sizing == "whole":
        prompts = config.gen_batch_size
    elif not config.enable:  # every group is kept: ask for exactly what is missing
        prompts = -(-missing_groups // config.prompt_granularity) * config.prompt_granularity
    else:
        wanted = missing_groups * (1.0 + config.safety_margin) / max(keep_rate, MIN_KEEP_RATE)
        wanted = math.ceil(wanted - 1e-9)  # 100 * 1.1 / 0.5 is 220.00000000000003 in floats: still 220
        prompts = min(max(wanted, config.min_round), config.max_round)
        prompts = -(-prompts // config.prompt_granularity) * config.prompt_granularity
    return prompts if budget_left is None else min(prompts, budget_left)


def _budget_left(config: DynamicSamplingConfig, prompts_generated_this_step: int) -> Optional[int]:
    """Prompts still allowed this step, rounded down to the granularity; None when unlimited."""
    budget = config.prompt_budget
    if budget is None:
        return None
    left = max(budget - prompts_generated_this_step, 0)
    return left - left % config.prompt_granularity


def one_round_prompts(
    config: DynamicSamplingConfig, missing_groups: int, in_flight: int, keep_rate: float,
    prompts_generated_this_step: int, overprovision: Optional[float] = None,
) -> int:
    """New prompts that bring those in flight to ``config.one_round_overprovision`` times the prompts that fill
    ``missing_groups`` with probability ``config.one_round_confidence`` (the module docstring); 0 when the prompts in
    flight already do. ``overprovision`` replaces ``config.one_round_overprovision`` (the sampler passes 1 where the
    multiple does not pay: ``DynamicSampler._overprovision``)."""
    if missing_groups <= 0:
        return 0
    p = 1.0 if not config.enable else min(max(keep_rate, MIN_KEEP_RATE), 1.0)
    z = _normal_quantile(float(config.one_round_confidence))
    factor = float(config.one_round_overprovision if overprovision is None else overprovision)
    total = math.ceil(fill_count(missing_groups, p, z) * factor - 1e-9)
    prompts = max(total - int(in_flight), 0)
    if prompts == 0:
        return 0
    prompts = -(-prompts // config.prompt_granularity) * config.prompt_granularity
    budget_left = _budget_left(config, prompts_generated_this_step)
    return prompts if budget_left is None else min(prompts, budget_left)


def fill_count(missing: int, keep_rate: float, z: float) -> int:
    """The fewest prompts n with ``n p - z sqrt(n p (1 - p)) >= missing - 1/2`` (``missing`` groups kept with
    probability ``Phi(z)``, each prompt kept with probability ``p``)."""
    if keep_rate >= 1.0:
        return int(missing)
    # In x = sqrt(n): p x^2 - z sqrt(p (1 - p)) x - (missing - 1/2) = 0, the positive root.
    a, b, c = keep_rate, -z * math.sqrt(keep_rate * (1.0 - keep_rate)), -(missing - 0.5)
    root = (-b + math.sqrt(b * b - 4.0 * a * c)) / (2.0 * a)
    return max(int(math.ceil(root * root - 1e-9)), int(missing))


def _normal_quantile(probability: float) -> float:
    return NormalDist().inv_cdf(probability)
