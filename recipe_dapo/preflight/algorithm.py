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
