"""Rules of the reward and overlong shaping: the ``recipe_dapo`` reward manager's settings (which it would refuse in
the reward workers), and values under verl's legacy reward sections, which its trainer would silently ignore."""

from __future__ import annotations

from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select

# Legacy sections verl 0.9.1 keeps in its schema (all null) but its classic trainer never reads: a value set
# there by an old launch script is silently ignored (only the fully-async trainer migrates them).
LEGACY_KEYS = {
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.num_workers": "reward.num_workers",
    "reward_model.reward_kwargs": "reward.reward_kwargs",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model": "reward.reward_model",
    "custom_reward_function": "reward.custom_reward_function",
    "sandbox_fusion": "reward.sandbox_fusion",
}


def rule_reward(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The ``recipe_dapo`` reward manager's settings, which it would otherwise refuse in the reward workers."""
    from recipe_dapo.overlong import check_overlong_buffer

    buffer_cfg = select(config, "reward.reward_kwargs.overlong_buffer_cfg")
    if buffer_cfg and buffer_cfg.get("enable", False):
        max_response_length = int(select(config, "data.max_response_length"))
        max_resp_len = select(config, "reward.reward_kwargs.max_resp_len")
        max_resp_len = max_response_length if max_resp_len is None else int(max_resp_len)
        if max_resp_len > max_response_length:
            yield (
                f"reward.reward_kwargs.max_resp_len={max_resp_len} exceeds data.max_response_length="
                f"{max_response_length}: responses are cut before the penalty reaches -1; set it to "
                "data.max_response_length (or null, which means the same)"
            )
        else:
            try:
                check_overlong_buffer(max_resp_len, int(buffer_cfg.get("len")))
            except ValueError as exc:
                yield str(exc)
    if select(config, "reward.reward_manager.name") == "recipe_dapo":
        from recipe_dapo.reward.settings import RewardSettings

        try:
            RewardSettings.from_config(config)
        except ValueError as exc:
            if "overlong" not in str(exc):  # reported above with its fix
                yield f"reward.reward_kwargs: {exc}"


def rule_legacy_keys(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Values under verl's legacy reward sections, which the trainer would silently ignore."""
    problems: list[str] = []

    def walk(prefix: str, node) -> None:
        if isinstance(node, DictConfig):
            for key in node.keys():
                walk(f"{prefix}.{key}", node.get(key))
        elif node is not None:
            legacy = next(name for name in LEGACY_KEYS if prefix.startswith(name))
            new = LEGACY_KEYS[legacy] + prefix[len(legacy) :]
            problems.append(f"{prefix}={node!r} is a legacy key that verl 0.9.1's trainer ignores; set {new} instead")

    for section in ("reward_model", "custom_reward_function", "sandbox_fusion"):
        node = select(config, section)
        if node is not None:
            walk(section, node)
    return problems


def reward_extra_info_keys(reward_manager_name: str) -> tuple[str, ...] | None:
    """The per-sample keys a registered reward manager reports, when the recipe knows them."""
    if reward_manager_name == "recipe_dapo":
        from recipe_dapo.reward.metrics import REWARD_EXTRA_KEYS

        return tuple(REWARD_EXTRA_KEYS)
    if reward_manager_name == "dapo":
        return ("score", "acc", "pred", "overlong_reward", "overlong")  # verl's dapo manager's own names
    return None
