"""Tier-2 rules, which need verl imported: the registries (policy loss, reward manager), verl's typed worker configs
and verl's own ``validate_config``."""

from __future__ import annotations

import logging
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.config.suggest import closest_first
from recipe_dapo.preflight.base import CheckReport, select

logger = logging.getLogger(__name__)


def rule_registries(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    loss_mode = select(config, "actor_rollout_ref.actor.policy_loss.loss_mode")
    if loss_mode not in POLICY_LOSS_REGISTRY:
        yield (
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss; "
            f"choose one of {closest_first(loss_mode, POLICY_LOSS_REGISTRY)}"
        )
    estimator = str(select(config, "algorithm.adv_estimator"))
    if estimator not in ADV_ESTIMATOR_REGISTRY:
        yield (
            f"algorithm.adv_estimator={estimator!r} is not a registered advantage estimator; choose one of "
            f"{closest_first(estimator, ADV_ESTIMATOR_REGISTRY)}"
        )
    source = select(config, "reward.reward_manager.source", "register")
    name = select(config, "reward.reward_manager.name")
    if source == "register" and name not in REWARD_MANAGER:
        yield (
            f"reward.reward_manager.name={name!r} is not a registered reward manager; choose one of "
            f"{closest_first(name, REWARD_MANAGER)}"
        )


def rule_verl_configs(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """verl's typed worker configs, built as the workers build them (their __post_init__ checks values), then
    verl's own ``validate_config`` as the task runner calls it (skipped when a worker config already failed: it
    would only repeat that problem). verl's progress prints go to the debug log."""
    import io
    import warnings
    from contextlib import redirect_stdout

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    refused = False
    for key in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm"):
        try:
            omega_conf_to_dataclass(select(config, key))
        except Exception as exc:  # verl raises ValueError, AssertionError or TypeError here
            refused = True
            yield f"{key}: verl refuses it: {type(exc).__name__}: {exc}"
    if refused:
        return
    captured = io.StringIO()
    try:
        with redirect_stdout(captured), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Disabled critic")
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as exc:  # verl raises AssertionError or ValueError
        yield f"verl's validate_config refuses the configuration: {type(exc).__name__}: {exc}"
    for line in captured.getvalue().splitlines():
        logger.debug("verl: %s", line)
