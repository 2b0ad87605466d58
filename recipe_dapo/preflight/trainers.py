"""Rules of the trainer choice (``recipe_dapo.trainers.table``): the v1 modes the recipe's sampler serves, what verl's
v1 trainer cannot do with DAPO's sampling, and TransferQueue installed."""

from __future__ import annotations

import functools
from typing import Iterable

from omegaconf import DictConfig, OmegaConf

from recipe_dapo.config.settings import PreemptionSettings
from recipe_dapo.preflight.base import CheckReport, select
from recipe_dapo.trainers.table import OPTIONS, V1_SAMPLER, V1_TRAINER_MODES, trainer_for


def rule_trainer(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """trainer.use_v1=true runs the recipe on verl's v1 trainer, in the modes the recipe's sampler supports."""
    if not select(config, "trainer.use_v1", False):
        return
    mode = select(config, "trainer.v1.trainer_mode", "sync")
    if mode not in V1_TRAINER_MODES:
        yield (
            f"trainer.v1.trainer_mode={mode}: the recipe's DAPO sampler runs on verl's v1 trainer in modes "
            f"{' and '.join(V1_TRAINER_MODES)}. separate_async trains from one batch in parameter_sync_step pieces "
            "and lends trainer GPUs to the rollout by counting sampleable groups itself, which the sampler does not "
            "serve; set trainer.v1.trainer_mode=colocate_async (async, partial rollout) or sync"
        )
    if mode == "colocate_async" and select(config, "trainer.v1.sampler.max_off_policy_strategy", "drop") != "drop":
        yield (
            "trainer.v1.sampler.max_off_policy_strategy="
            f"{select(config, 'trainer.v1.sampler.max_off_policy_strategy')}: with trainer_mode=colocate_async the "
            "recipe's sampler drops groups submitted more than max_off_policy_threshold steps ago (drop); it does not "
            "hold a step back for them (wait). Set it to drop, or max_off_policy_threshold=null for no limit"
        )
    sampler = (select(config, "trainer.v1.sampler.custom_sampler.path", None),
               select(config, "trainer.v1.sampler.custom_sampler.name", None))
    if sampler != V1_SAMPLER:
        yield (
            f"trainer.v1.sampler.custom_sampler is {sampler[0]}:{sampler[1]}; the recipe's v1 trainer samples with "
            f"{V1_SAMPLER[0]}:{V1_SAMPLER[1]} (its dynamic sampling); remove the override"
        )
    if select(config, "reward.reward_model.enable", False) and not select(
        config, "reward.reward_model.enable_resource_pool", False
    ):
        yield (
            "reward.reward_model.enable=true with a colocated reward model: on verl's v1 trainer groups are judged "
            "while they generate, which needs the reward at sampling time; set "
            "reward.reward_model.enable_resource_pool=true or trainer.use_v1=false"
        )
    if select(config, "dapo.dynamic_sampling.skip.enable", False):
        yield (
            "dapo.dynamic_sampling.skip.enable=true with trainer.use_v1=true: prompts are skipped where the classic "
            "trainer's rounds take them; on verl's v1 trainer verl's dataloader hands prompts to the rollout directly, "
            "so nothing would be skipped. Set trainer.use_v1=false to skip prompts, or skip.enable=false"
        )
    if select(config, "algorithm.filter_groups.metric", None) == "seq_final_reward":
        yield (
            "algorithm.filter_groups.metric=seq_final_reward: on verl's v1 trainer groups are judged before the KL "
            "penalty is applied; use seq_reward (the same without the KL term), acc or score"
        )


def rule_one_round(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """dapo.dynamic_sampling.one_round=true ends a step when its batch is full and resumes the unfinished responses in
    the next: verl's v1 trainer in colocate_async mode (partial rollout) is the one that can."""
    if not select(config, "dapo.dynamic_sampling.one_round", False):
        return
    use_v1 = bool(select(config, "trainer.use_v1", False))
    mode = select(config, "trainer.v1.trainer_mode", "sync")
    if not use_v1 or mode != "colocate_async":
        where = ("the classic trainer: verl's generation call there returns only when every response of the batch "
                 "has finished, and an aborted batch's partial responses would be lost") if not use_v1 else (
            f"trainer.v1.trainer_mode={mode}: it waits for every prompt in flight before the update by design")
        yield (
            f"dapo.dynamic_sampling.one_round=true on {where}. One round per step needs verl's v1 trainer with "
            "partial rollout: add trainer.use_v1=true trainer.v1.trainer_mode=colocate_async, or set "
            "dapo.dynamic_sampling.one_round=false"
        )
        return
    threshold = select(config, "trainer.v1.sampler.max_off_policy_threshold", None)
    staleness = int(select(config, "dapo.dynamic_sampling.max_staleness", 1))
    if threshold is not None and int(threshold) < staleness + 1:
        yield (
            f"trainer.v1.sampler.max_off_policy_threshold={threshold} with dapo.dynamic_sampling.one_round=true and "
            f"max_staleness={staleness}: a response aborted when a batch fills finishes in the next step, which that "
            f"threshold counts as {staleness + 1} steps; verl's threshold would drop what the recipe's bound keeps. "
            f"Set trainer.v1.sampler.max_off_policy_threshold={staleness + 1} (or more, or null)"
        )


def rule_v1_installed(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """trainer.use_v1=true needs TransferQueue, which verl installs only with its verl-core extra."""
    if not select(config, "trainer.use_v1", False):
        return
    import importlib.util

    if importlib.util.find_spec("transfer_queue") is None:
        yield (
            "trainer.use_v1=true needs TransferQueue, which is not installed: pip install 'transferqueue>=0.1.10,<0.2' "
            "(the recipe's cpu, gpu and v1 extras include it), or set trainer.use_v1=false"
        )


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, object]:
    """Every option's value in the recipe's config as composed with no override (verl's defaults, the recipe's)."""
    from recipe_dapo.config.compose import compose

    base = compose()  # inside the entry point's @hydra.main: with its search path
    return dict(_leaves(base, ("trainer.v1", "algorithm.filter_groups")))


def _leaves(config: DictConfig, sections) -> Iterable[tuple[str, object]]:
    for section in sections:
        node = OmegaConf.select(config, section)
        if node is None:
            continue
        flat = OmegaConf.to_container(node, resolve=False)
        stack = [(section, flat)]
        while stack:
            prefix, value = stack.pop()
            if isinstance(value, dict):
                stack.extend((f"{prefix}.{key}", item) for key, item in value.items() if not str(key).startswith("_"))
            else:
                yield prefix, value


def rule_ignored_options(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """An option of trainer.v1.* or algorithm.filter_groups.* set away from its default where the chosen trainer and
    the recipe's sampler do not honour it (``trainers.table.OPTIONS``): refused, naming the key and why."""
    entry = trainer_for(config)
    if entry is None:
        return  # an unsupported v1 mode: rule_trainer says so
    defaults = _defaults()
    for key, value in _leaves(config, ("trainer.v1", "algorithm.filter_groups")):
        if key not in defaults or value == defaults[key]:
            continue
        for prefix, honoured_by, why in OPTIONS:
            if key == prefix or (prefix.endswith(".") and key.startswith(prefix)):
                if entry.key not in honoured_by:
                    yield (f"{key}={value} has no effect with {entry.key} (trainer.use_v1={entry.use_v1}"
                           + (f", trainer_mode={entry.mode}" if entry.mode else "") + f"): {why}; remove the override")
                break


def rule_preemption(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """dapo.preemption.grace_s bounds the wait for the pre-emption checkpoint: a positive number of seconds."""
    grace = select(config, "dapo.preemption.grace_s", PreemptionSettings.grace_s)
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not grace > 0:
        yield (
            f"dapo.preemption.grace_s={grace}: the driver waits this many seconds after SIGTERM for the trainer to "
            "finish its step and save; set a positive number below the scheduler's own grace period "
            f"(e.g. {PreemptionSettings.grace_s:g})"
        )
