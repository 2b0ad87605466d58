"""Rules of dynamic sampling: the sampler's settings (keep rule, skipping, budget), a filter metric every response
has and that the overlong punishment does not shape, and prompt ids for skipping."""

from __future__ import annotations

import os
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.config.suggest import closest_first
from recipe_dapo.preflight.base import CheckReport, paths, select
from recipe_dapo.preflight.reward import reward_extra_info_keys

# Per-sample keys that are text, so they cannot be a filter metric.
TEXT_REWARD_KEYS = ("pred", "verify_error")


def rule_dynamic_sampling(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.dynamic_sampling.config import sampler_config, sampler_settings

    try:
        sampler_config(sampler_settings(config))  # the trainers' own builder, so start-up refuses what they would
    except ValueError as exc:  # DynamicSamplingConfigError lists every problem of the keep rule and skip settings
        yield from getattr(exc, "problems", [str(exc)])
    if not select(config, "algorithm.filter_groups.enable", False):
        return
    if int(select(config, "actor_rollout_ref.rollout.n", 1)) < 2:
        yield (
            "algorithm.filter_groups.enable=true with actor_rollout_ref.rollout.n < 2: every group has one "
            "response, so nothing can be filtered and GRPO advantages are zero; set rollout.n >= 2"
        )
    if select(config, "algorithm.filter_groups.metric") == "seq_final_reward" and select(
        config, "algorithm.use_kl_in_reward", False
    ):
        yield (
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: the KL penalty "
            "needs reference log-probs, which are computed after filtering; filter on seq_reward or acc instead"
        )


def rule_filter_metric(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The filter metric must be a number every response has: a summed reward, or a key the manager reports; and not
    a score shaped by the overlong punishment (:func:`rule_shaped_filter_metric`)."""
    from recipe_dapo.dynamic_sampling.group_stats import SEQUENCE_METRICS

    if not select(config, "algorithm.filter_groups.enable", False):
        return
    yield from rule_shaped_filter_metric(config, report)
    metric = select(config, "algorithm.filter_groups.metric")
    manager = str(select(config, "reward.reward_manager.name"))
    known = reward_extra_info_keys(manager)
    if known is None:
        return  # a manager the recipe does not know: any key it reports may be valid
    numeric = set(SEQUENCE_METRICS) | (set(known) - set(TEXT_REWARD_KEYS))
    if metric not in numeric:
        yield (
            f"algorithm.filter_groups.metric={metric!r} is not a numeric metric reward manager {manager!r} "
            f"reports; choose one of {closest_first(metric, numeric)}"
        )


SHAPED_METRICS = ("reward", "seq_reward", "seq_final_reward", "overlong_reward")
"""Filter metrics that carry the overlong punishment: the summed reward tensors (correctness plus the length penalty)
and the penalty itself. ``acc`` and ``score`` are the answer's correctness alone."""


def rule_shaped_filter_metric(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Filtering on a score that the overlong punishment shapes keeps groups that differ only in length.

    verl 0.9.1 changed ``algorithm.filter_groups.metric``'s default from none to ``reward``; the recipe sets ``acc``,
    and this refuses a shaped metric named on the command line unless
    ``dapo.dynamic_sampling.allow_shaped_filter_metric=true``.
    """
    if not select(config, "algorithm.filter_groups.enable", False):
        return
    metric = select(config, "algorithm.filter_groups.metric")
    buffer = "reward.reward_kwargs.overlong_buffer_cfg"
    shaped = bool(select(config, f"{buffer}.enable", False)) and float(select(config, f"{buffer}.penalty_factor", 1.0) or 0) > 0
    if metric not in SHAPED_METRICS or not shaped or select(config, "dapo.dynamic_sampling.allow_shaped_filter_metric", False):
        return
    yield (
        f"algorithm.filter_groups.metric={metric} filters on the score shaped by the overlong punishment "
        f"({buffer}.enable=true): a group whose answers are all right but differ in length would qualify and be "
        "trained on length alone; set algorithm.filter_groups.metric=acc (DAPO's choice), or "
        "dapo.dynamic_sampling.allow_shaped_filter_metric=true to filter on it anyway"
    )


def rule_prompt_keys(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Prompt skipping needs every training row to carry a prompt id no other prompt shares."""
    if not select(config, "dapo.dynamic_sampling.skip.enable", False):
        return []
    from recipe_dapo.data.prompt_ids import prompt_key_problems

    files = [path for path in paths(select(config, "data.train_files")) if os.path.isfile(path)]
    if not files:  # absent files are rule_data_files' to report
        return []
    return prompt_key_problems(files, str(select(config, "data.prompt_key", "prompt")))
