"""Start-up checks: refuse a configuration the recipe cannot train, before any Ray worker starts.

Every problem found is reported at once, each naming the config key and how to fix it, so a launch
script with three mistakes fails once, not three times an hour apart.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

# Filter metrics that exist for every reward manager (verl's names): the summed score, and the summed
# reward after KL shaping. Reward managers add their own per-sample keys (reward_extra_info).
BUILTIN_FILTER_METRICS = ("seq_reward", "seq_final_reward")

# Outcome-reward estimators that compute advantages from groups of responses without a critic.
GROUP_ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg", "optimal_token_baseline")


class DAPOConfigError(ValueError):
    """A configuration the recipe refuses; the message lists every problem with its key and fix."""


class PluginNotLoadedError(RuntimeError):
    """The recipe's verl plugins are not registered in some process."""


def check_plugins_registered(where: str) -> None:
    """Fail loudly when the ``verl.plugins`` entry point did not register the recipe in this process."""
    import verl  # noqa: F401  (importing verl is what loads the plugins)

    try:
        from recipe_dapo.plugin import registered_components

        missing = [name for name, ok in registered_components().items() if not ok]
        error = None
    except Exception as exc:  # the plugin module itself failed to import
        missing, error = ["recipe_dapo.plugin"], exc
    if missing:
        raise PluginNotLoadedError(
            f"recipe_dapo components are not registered in {where}: missing {missing}"
            + (f" (importing recipe_dapo.plugin failed: {error!r})" if error else "")
            + ". verl loads them through the 'verl.plugins' entry point: install the recipe into the Python "
            "environment the workers use (`pip install -e .` in this repository, or add it to the Ray "
            "runtime_env), and make sure VERL_USE_EXTERNAL_PLUGINS is unset, 'auto' or includes 'recipe_dapo'."
        )


def _select(config: DictConfig, key: str, default=None):
    return OmegaConf.select(config, key, default=default)


def reward_extra_info_keys(reward_manager_name: str) -> tuple[str, ...] | None:
    """The per-sample keys a registered reward manager reports, when the recipe knows them."""
    if reward_manager_name == "recipe_dapo":
        from recipe_dapo.reward.manager import REWARD_EXTRA_KEYS

        return tuple(REWARD_EXTRA_KEYS)
    if reward_manager_name == "dapo":
        return ("score", "acc", "pred", "overlong_reward", "overlong")
    return None


# Per-sample keys that are text, so they cannot be a filter metric.
TEXT_REWARD_KEYS = ("pred", "verify_error")


def _check_algorithm(config: DictConfig, problems: list[str]) -> None:
    from verl.trainer.ppo.utils import need_critic

    estimator = str(_select(config, "algorithm.adv_estimator"))
    if estimator == "gae" or _select(config, "critic.enable", None) or need_critic(config):
        problems.append(
            f"algorithm.adv_estimator={estimator} needs a critic, which DAPO does not use; "
            "set algorithm.adv_estimator=grpo (the paper's group-normalised advantages)"
        )
    elif estimator not in GROUP_ADVANTAGE_ESTIMATORS:
        logger.warning("algorithm.adv_estimator=%s is not a group estimator the recipe was tested with", estimator)


def _check_dynamic_sampling(config: DictConfig, problems: list[str]) -> None:
    if not _select(config, "algorithm.filter_groups.enable", False):
        return
    metric = _select(config, "algorithm.filter_groups.metric")
    manager = str(_select(config, "reward.reward_manager.name"))
    known = reward_extra_info_keys(manager)
    if known is not None:
        numeric = set(BUILTIN_FILTER_METRICS) | (set(known) - set(TEXT_REWARD_KEYS))
        if metric not in numeric:
            problems.append(
                f"algorithm.filter_groups.metric={metric!r} is not a numeric metric reward manager {manager!r} "
                f"reports; choose one of {sorted(numeric)}"
            )
    if metric == "seq_final_reward" and _select(config, "algorithm.use_kl_in_reward", False):
        problems.append(
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: the KL penalty "
            "needs reference log-probs, which are computed after filtering; filter on seq_reward or acc instead"
        )
    max_rounds = _select(config, "algorithm.filter_groups.max_num_gen_batches", 0)
    if max_rounds is None or int(max_rounds) < 0:
        problems.append(
            f"algorithm.filter_groups.max_num_gen_batches={max_rounds} must be >= 0 (0 means no limit)"
        )
    if int(_select(config, "actor_rollout_ref.rollout.n", 1)) < 2:
        problems.append(
            "algorithm.filter_groups.enable=true with actor_rollout_ref.rollout.n < 2: every group has one "
            "response, so nothing can be filtered and GRPO advantages are zero; set rollout.n >= 2"
        )
    from recipe_dapo.dynamic_sampling import DynamicSamplingConfig

    try:
        DynamicSamplingConfig.from_config(
            config.algorithm.filter_groups,
            _select(config, "dapo.dynamic_sampling"),
            train_batch_size=int(_select(config, "data.train_batch_size")),
            gen_batch_size=_select(config, "data.gen_batch_size"),
        )
    except ValueError as exc:
        problems.append(str(exc))


def _check_batch_sizes(config: DictConfig, problems: list[str]) -> None:
    train_bsz = int(_select(config, "data.train_batch_size"))
    gen_bsz = _select(config, "data.gen_batch_size")
    if gen_bsz is not None and int(gen_bsz) < train_bsz:
        problems.append(
            f"data.gen_batch_size={gen_bsz} is smaller than data.train_batch_size={train_bsz}: a generation "
            "round must hold at least one training batch of prompts; raise data.gen_batch_size "
            "(the paper uses 3 x train_batch_size) or lower data.train_batch_size"
        )


def _check_overlong(config: DictConfig, problems: list[str]) -> None:
    from recipe_dapo.overlong import check_overlong_buffer

    buffer_cfg = _select(config, "reward.reward_kwargs.overlong_buffer_cfg")
    if not buffer_cfg or not buffer_cfg.get("enable", False):
        return
    max_response_length = int(_select(config, "data.max_response_length"))
    max_resp_len = _select(config, "reward.reward_kwargs.max_resp_len")
    max_resp_len = max_response_length if max_resp_len is None else int(max_resp_len)
    if max_resp_len > max_response_length:
        problems.append(
            f"reward.reward_kwargs.max_resp_len={max_resp_len} exceeds data.max_response_length="
            f"{max_response_length}: responses are cut before the penalty reaches -1; set it to "
            "data.max_response_length (or null, which means the same)"
        )
    try:
        check_overlong_buffer(max_resp_len, int(buffer_cfg.get("len")))
    except ValueError as exc:
        problems.append(str(exc))


def _check_registries(config: DictConfig, problems: list[str]) -> None:
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    loss_mode = _select(config, "actor_rollout_ref.actor.policy_loss.loss_mode")
    if loss_mode not in POLICY_LOSS_REGISTRY:
        problems.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss; "
            f"choose one of {sorted(POLICY_LOSS_REGISTRY)}"
        )
    source = _select(config, "reward.reward_manager.source", "register")
    name = _select(config, "reward.reward_manager.name")
    if source == "register" and name not in REWARD_MANAGER:
        problems.append(
            f"reward.reward_manager.name={name!r} is not a registered reward manager; choose one of {sorted(REWARD_MANAGER)}"
        )
    low = _select(config, "actor_rollout_ref.actor.clip_ratio_low")
    high = _select(config, "actor_rollout_ref.actor.clip_ratio_high")
    if low is not None and high is not None and not (0 < float(low) < 1 and float(high) > 0):
        problems.append(
            f"actor_rollout_ref.actor.clip_ratio_low={low} / clip_ratio_high={high}: need 0 < low < 1 and high > 0"
        )
    clip_c = _select(config, "actor_rollout_ref.actor.clip_ratio_c")
    if clip_c is not None and float(clip_c) <= 1.0:
        problems.append(f"actor_rollout_ref.actor.clip_ratio_c={clip_c} must be > 1 (dual-clip lower bound)")


def _check_data_files(config: DictConfig, problems: list[str]) -> None:
    from recipe_dapo.data.validation import RLDataError, validate_rl_parquet

    for key in ("data.train_files", "data.val_files"):
        files = _select(config, key)
        if files is None:
            problems.append(f"{key} is not set; point it at a verl RL parquet (see data_prep/)")
            continue
        for path in [files] if isinstance(files, str) else list(files):
            if not os.path.exists(path):
                problems.append(f"{key}: {path} does not exist (prepare it with `bash scripts/prepare_data.sh DIR`)")
                continue
            try:
                validate_rl_parquet(path)
            except RLDataError as exc:
                problems.append(f"{key}: {exc}")


def prompt_limit(config: DictConfig) -> tuple[int, str]:
    """The prompt length the rollout enforces and the key that sets it (``rollout.prompt_length`` follows
    ``data.max_prompt_length`` unless overridden; the smaller one cuts)."""
    data_limit = int(_select(config, "data.max_prompt_length"))
    rollout_limit = _select(config, "actor_rollout_ref.rollout.prompt_length")
    if rollout_limit is not None and int(rollout_limit) < data_limit:
        return int(rollout_limit), "actor_rollout_ref.rollout.prompt_length"
    return data_limit, "data.max_prompt_length"


def tokenizer_path(config: DictConfig) -> str:
    model = _select(config, "actor_rollout_ref.model")
    return str(model.get("tokenizer_path") or model.path)


def _check_prompt_lengths(config: DictConfig, problems: list[str]) -> None:
    """Count every prompt's tokens with the model's tokenizer (``recipe_dapo.data.prompt_length``).

    Over the limit, verl's rollout would keep each prompt's last tokens and cut its question away. Refused,
    naming file, row, token count and key, unless ``data.filter_overlong_prompts=true`` (verl's dataset then
    drops them: counted here) or ``data.truncation=left`` (what the rollout does: counted here).
    """
    from recipe_dapo.data.prompt_length import load_tokenizer, overlong_error, scan_prompt_lengths

    truncation = str(_select(config, "data.truncation", "error"))
    filtering = bool(_select(config, "data.filter_overlong_prompts", False))
    if truncation not in ("error", "left"):
        problems.append(
            f"data.truncation={truncation}: verl's agent loop only cuts prompts on the left (keeping their last "
            "tokens); set data.truncation=error (refuse overlong prompts at start-up, the default) or left, "
            "or data.filter_overlong_prompts=true (drop them)"
        )
    files = [
        (key, path)
        for key in ("data.train_files", "data.val_files")
        for path in _paths(_select(config, key))
        if os.path.isfile(path)  # a missing file is _check_data_files' problem
    ]
    if not files:
        return
    model = _select(config, "actor_rollout_ref.model")
    try:
        tokenizer = load_tokenizer(
            tokenizer_path(config), bool(model.get("trust_remote_code", False)), model.get("custom_chat_template")
        )
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a bad path
        problems.append(
            f"actor_rollout_ref.model.path={model.path}: cannot load its tokenizer to count prompt tokens "
            f"({type(exc).__name__}: {exc}); point it (or actor_rollout_ref.model.tokenizer_path) at a model folder"
        )
        return
    limit, limit_key = prompt_limit(config)
    prompt_key = str(_select(config, "data.prompt_key", "prompt"))
    template_kwargs = _select(config, "data.apply_chat_template_kwargs") or {}
    for key, path in files:
        try:
            lengths = scan_prompt_lengths(path, tokenizer, limit, prompt_key, template_kwargs)
        except Exception as exc:  # a row the chat template cannot render (bad rows are also reported above)
            problems.append(f"{key}: {path}: cannot count its prompt tokens ({type(exc).__name__}: {exc})")
            continue
        if not lengths.num_overlong:
            continue
        needed = int(_select(config, "data.train_batch_size")) if key == "data.train_files" else 1
        kept = lengths.rows - lengths.num_overlong
        if filtering and kept >= needed:
            logger.warning(
                "%s: %s: dropping %d of %d prompts longer than %s=%d tokens (data.filter_overlong_prompts=true)",
                key, path, lengths.num_overlong, lengths.rows, limit_key, limit,
            )
        elif filtering:
            problems.append(
                f"{key}: {path}: only {kept} of {lengths.rows} prompts fit {limit_key}={limit} tokens, fewer than "
                f"the {needed} a step needs after data.filter_overlong_prompts drops the rest; raise {limit_key} "
                f"to {int(lengths.overlong_tokens.max())}"
            )
        elif truncation == "left":
            logger.warning(
                "%s: %s: %d of %d prompts are longer than %s=%d tokens and will lose their first tokens "
                "(data.truncation=left)", key, path, lengths.num_overlong, lengths.rows, limit_key, limit,
            )
        else:
            fix = (
                f"raise {limit_key} to {{longest}} (the longest prompt), or set data.filter_overlong_prompts=true "
                "to drop these rows (data.truncation=left keeps their last tokens, cutting the question away)"
            )
            problems.append(f"{key}: {overlong_error(lengths, limit_key, fix)}")


def _check_cpu_memory(config: DictConfig, problems: list[str]) -> None:
    """On CPU: vLLM's KV cache and the weights must fit in free memory (``recipe_dapo.cpu.memory``)."""
    from recipe_dapo.cpu.memory import check_cpu_memory

    check_cpu_memory(config, problems)


def _paths(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


CHECKS: tuple[Callable[[DictConfig, list[str]], None], ...] = (
    _check_algorithm,
    _check_batch_sizes,
    _check_dynamic_sampling,
    _check_overlong,
    _check_registries,
    _check_data_files,
    _check_prompt_lengths,
    _check_cpu_memory,
)


def check_config(config: DictConfig, checks=CHECKS) -> None:
    """Run every start-up check; raise :class:`DAPOConfigError` listing all problems found."""
    problems: list[str] = []
    for check in checks:
        check(config, problems)
    if problems:
        raise DAPOConfigError(
            "recipe_dapo refused the configuration:\n" + "\n".join(f"  - {problem}" for problem in problems)
        )
