"""Rules of the algorithm: a group advantage estimator without a critic, and the clip bounds of the loss."""

from __future__ import annotations

import logging
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select

logger = logging.getLogger(__name__)

# Outcome-reward estimators that compute advantages from groups of responses without a critic.
GROUP_ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg", "optimal_token_baseline")


def rule_algorithm(config: DictConfig, report: CheckReport) -> Iterable[str]:
    estimator = str(select(config, "algorithm.adv_estimator"))
    critic = select(config, "critic.enable", None)
    if estimator == "gae" or critic:
        yield (
            f"algorithm.adv_estimator={estimator} (critic.enable={critic}) needs a critic, which DAPO does not "
            "use; set algorithm.adv_estimator=grpo (the paper's group-normalised advantages) and critic.enable=null"
        )
    elif estimator not in GROUP_ADVANTAGE_ESTIMATORS:
        logger.warning("algorithm.adv_estimator=%s is not a group estimator the recipe was tested with", estimator)


def rule_clip(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.loss.clip import clip_problems

    yield from clip_problems(select(config, "actor_rollout_ref.actor"))


def rule_behaviour_correction(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """A behaviour-policy correction must have something to weigh by, and ``dapo.behaviour_correction`` a known mode."""
    from recipe_dapo.policy_lag.correction import CORRECTION_MODES, configured_level

    mode = select(config, "dapo.behaviour_correction", "auto")
    if mode not in CORRECTION_MODES:
        yield (f"dapo.behaviour_correction={mode!r} is not one of {', '.join(CORRECTION_MODES)}: auto corrects "
               "wherever an older policy's rows can be trained, on always, off never")
        return
    correction = select(config, "algorithm.rollout_correction", None)
    uses_rollout_log_probs = configured_level(correction) or (correction and (
        correction.get("rollout_rs") or correction.get("bypass_mode")))
    if uses_rollout_log_probs and not select(config, "actor_rollout_ref.rollout.calculate_log_probs", True):
        yield ("algorithm.rollout_correction weighs tokens by the rollout engine's log-probs, but "
               "actor_rollout_ref.rollout.calculate_log_probs=false: the rollout sends none, so the correction would "
               "apply to nothing; set actor_rollout_ref.rollout.calculate_log_probs=true, or turn the correction off "
               "(dapo.behaviour_correction=off, algorithm.rollout_correction.rollout_is=null)")
