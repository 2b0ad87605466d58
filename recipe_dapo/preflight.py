"""The one rule set: every check a configuration must pass before anything heavy starts.

A real start-up (``python -m recipe_dapo.main_dapo``) and a dry run (``DRY_RUN=1`` / ``python -m
recipe_dapo.dry_run``) call the same :func:`check_config`. The only difference is what happens to an input file
absent from this machine: an error at start-up, "not checked" in a dry run (cluster paths often exist only on
the cluster). Every problem is listed at once with its key and its fix, and the entry points print the list and
exit with status 1, without a traceback.

The rules run in two tiers:

1. ``RULES``: the recipe's rules, verl's batch and cluster-shape rules that otherwise fail inside the workers,
   legacy keys verl ignores, the data files. They need only OmegaConf and pyarrow, so a mistake here is reported
   in a few seconds, before verl, torch or vLLM are imported.
2. ``VERL_RULES``, only when tier 1 passed: the registries (policy loss, reward manager), verl's worker
   dataclasses and verl's own ``validate_config``, which need verl imported, and the prompt lengths, counted with
   the model's tokenizer (transformers).

A new rule is a function ``rule(config, report) -> iterable of problem strings`` added to one of the tuples.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

# Outcome-reward estimators that compute advantages from groups of responses without a critic.
GROUP_ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg", "optimal_token_baseline")

# Per-sample keys that are text, so they cannot be a filter metric.
TEXT_REWARD_KEYS = ("pred", "verify_error")

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


class DAPOConfigError(ValueError):
    """A configuration the recipe refuses; the message lists every problem with its key and fix."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__(
            "recipe_dapo refused the configuration:\n" + "\n".join(f"  - {problem}" for problem in self.problems)
        )


class PluginNotLoadedError(RuntimeError):
    """The recipe's verl plugins are not registered in some process."""


@dataclass
class CheckReport:
    """What the checks could not check on this machine, and the run's shape for the log."""

    absent_inputs_ok: bool = False
    """Dry run: an input absent here is listed in ``not_checked`` instead of being a problem."""
    dry_run: bool = False
    """Dry run: nothing is fetched (a tokenizer that is not a local folder is listed in ``not_checked``)."""
    not_checked: list[str] = field(default_factory=list)
    summary: dict[str, object] = field(default_factory=dict)


Rule = Callable[[DictConfig, CheckReport], Iterable[str]]


def _select(config: DictConfig, key: str, default=None):
    return OmegaConf.select(config, key, default=default)


def _paths(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


# ----------------------------------------------------------------------------- tier 1: no verl import


V1_TRAINER_MODES = ("sync", "colocate_async")
"""verl v1 modes the recipe's trainers and sampler support (recipe_dapo.trainers.v1 registers one trainer per mode)."""
V1_SAMPLER = ("pkg://recipe_dapo.trainers.v1.replay_buffer", "DAPOReplayBuffer")


def rule_trainer(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """trainer.use_v1=true runs the recipe on verl's v1 trainer, in the modes the recipe's sampler supports."""
    if not _select(config, "trainer.use_v1", False):
        return
    mode = _select(config, "trainer.v1.trainer_mode", "sync")
    if mode not in V1_TRAINER_MODES:
        yield (
            f"trainer.v1.trainer_mode={mode}: the recipe's DAPO sampler runs on verl's v1 trainer in modes "
            f"{' and '.join(V1_TRAINER_MODES)}. separate_async trains from one batch in parameter_sync_step pieces "
            "and lends trainer GPUs to the rollout by counting sampleable groups itself, which the sampler does not "
            "serve; set trainer.v1.trainer_mode=colocate_async (async, partial rollout) or sync"
        )
    if mode == "colocate_async" and _select(config, "trainer.v1.sampler.max_off_policy_strategy", "drop") != "drop":
        yield (
            "trainer.v1.sampler.max_off_policy_strategy="
            f"{_select(config, 'trainer.v1.sampler.max_off_policy_strategy')}: with trainer_mode=colocate_async the "
            "recipe's sampler drops groups submitted more than max_off_policy_threshold steps ago (drop); it does not "
            "hold a step back for them (wait). Set it to drop, or max_off_policy_threshold=null for no limit"
        )
    sampler = (_select(config, "trainer.v1.sampler.custom_sampler.path", None),
               _select(config, "trainer.v1.sampler.custom_sampler.name", None))
    if sampler != V1_SAMPLER:
        yield (
            f"trainer.v1.sampler.custom_sampler is {sampler[0]}:{sampler[1]}; the recipe's v1 trainer samples with "
            f"{V1_SAMPLER[0]}:{V1_SAMPLER[1]} (its dynamic sampling); remove the override"
        )
    if _select(config, "reward.reward_model.enable", False) and not _select(
        config, "reward.reward_model.enable_resource_pool", False
    ):
        yield (
            "reward.reward_model.enable=true with a colocated reward model: on verl's v1 trainer groups are judged "
            "while they generate, which needs the reward at sampling time; set "
            "reward.reward_model.enable_resource_pool=true or trainer.use_v1=false"
        )
    if _select(config, "dapo.dynamic_sampling.skip.enable", False):
        yield (
            "dapo.dynamic_sampling.skip.enable=true with trainer.use_v1=true: prompts are skipped where the classic "
            "trainer's rounds take them; on verl's v1 trainer verl's dataloader hands prompts to the rollout directly, "
            "so nothing would be skipped. Set trainer.use_v1=false to skip prompts, or skip.enable=false"
        )
    if _select(config, "algorithm.filter_groups.metric", None) == "seq_final_reward":
        yield (
            "algorithm.filter_groups.metric=seq_final_reward: on verl's v1 trainer groups are judged before the KL "
            "penalty is applied; use seq_reward (the same without the KL term), acc or score"
        )


def trainer_in_use(config: DictConfig) -> str:
    """One line for the start-up log: which trainer runs this configuration, and why."""
    if _select(config, "trainer.use_v1", False):
        mode = _select(config, "trainer.v1.trainer_mode", "sync")
        name = "DAPOTrainerV1ColocateAsync" if mode == "colocate_async" else "DAPOTrainerV1"
        return (
            f"trainer: recipe_dapo.trainers.v1.trainer.{name} on verl's v1 trainer (trainer.use_v1=true, "
            f"trainer_mode={mode}): TransferQueue, groups judged as they finish, refills sized to the deficit"
        )
    return (
        "trainer: recipe_dapo.trainers.classic.trainer.RayDAPOTrainer on verl's classic RayPPOTrainer (trainer.use_v1=false, the "
        "recipe's default: faster per step on bench/peer_side_by_side.py); trainer.use_v1=true runs verl's v1 trainer"
    )


def rule_algorithm(config: DictConfig, report: CheckReport) -> Iterable[str]:
    estimator = str(_select(config, "algorithm.adv_estimator"))
    critic = _select(config, "critic.enable", None)
    if estimator == "gae" or critic:
        yield (
            f"algorithm.adv_estimator={estimator} (critic.enable={critic}) needs a critic, which DAPO does not "
            "use; set algorithm.adv_estimator=grpo (the paper's group-normalised advantages) and critic.enable=null"
        )
    elif estimator not in GROUP_ADVANTAGE_ESTIMATORS:
        logger.warning("algorithm.adv_estimator=%s is not a group estimator the recipe was tested with", estimator)


def rule_batch_sizes(config: DictConfig, report: CheckReport) -> Iterable[str]:
    train = int(_select(config, "data.train_batch_size"))
    gen = _select(config, "data.gen_batch_size")
    if gen is not None and int(gen) < train:
        yield (
            f"data.gen_batch_size={gen} is smaller than data.train_batch_size={train}: a generation round must hold "
            "at least one training batch of prompts; raise data.gen_batch_size (the paper uses 3 x train_batch_size) "
            "or lower data.train_batch_size"
        )
    mini = int(_select(config, "actor_rollout_ref.actor.ppo_mini_batch_size"))
    if mini > train:
        yield (
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train} "
            "(both in prompts): one step could not fill one update; lower the mini-batch (the paper: 512 prompts "
            "per step in 16 mini-batches of 32)"
        )


def rule_clip(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.loss.clip import clip_problems

    yield from clip_problems(_select(config, "actor_rollout_ref.actor"))


def rule_dynamic_sampling(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.dynamic_sampling import DynamicSamplingConfig

    try:
        DynamicSamplingConfig.from_config(
            _select(config, "algorithm.filter_groups"),
            _select(config, "dapo.dynamic_sampling"),
            train_batch_size=int(_select(config, "data.train_batch_size")),
            gen_batch_size=_select(config, "data.gen_batch_size"),
        )
    except ValueError as exc:  # DynamicSamplingConfigError lists every problem of the keep rule and skip settings
        yield from getattr(exc, "problems", [str(exc)])
    if not _select(config, "algorithm.filter_groups.enable", False):
        return
    if int(_select(config, "actor_rollout_ref.rollout.n", 1)) < 2:
        yield (
            "algorithm.filter_groups.enable=true with actor_rollout_ref.rollout.n < 2: every group has one "
            "response, so nothing can be filtered and GRPO advantages are zero; set rollout.n >= 2"
        )
    if _select(config, "algorithm.filter_groups.metric") == "seq_final_reward" and _select(
        config, "algorithm.use_kl_in_reward", False
    ):
        yield (
            "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: the KL penalty "
            "needs reference log-probs, which are computed after filtering; filter on seq_reward or acc instead"
        )


def rule_reward(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The ``recipe_dapo`` reward manager's settings, which it would otherwise refuse in the reward workers."""
    from recipe_dapo.overlong import check_overlong_buffer

    buffer_cfg = _select(config, "reward.reward_kwargs.overlong_buffer_cfg")
    if buffer_cfg and buffer_cfg.get("enable", False):
        max_response_length = int(_select(config, "data.max_response_length"))
        max_resp_len = _select(config, "reward.reward_kwargs.max_resp_len")
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
    if _select(config, "reward.reward_manager.name") == "recipe_dapo":
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
        node = _select(config, section)
        if node is not None:
            walk(section, node)
    return problems


def rule_cluster_shape(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Divisibility rules verl asserts inside the workers, after the cluster was allocated and the model loaded."""
    nnodes, per_node = int(_select(config, "trainer.nnodes")), int(_select(config, "trainer.n_gpus_per_node"))
    n_gpus = nnodes * per_node
    n = int(_select(config, "actor_rollout_ref.rollout.n"))
    rollout = _select(config, "actor_rollout_ref.rollout")
    infer_world = int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size) * int(
        rollout.pipeline_model_parallel_size
    )
    if n_gpus % infer_world:
        yield (
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size} "
            f"(x data/pipeline parallel = {infer_world} GPUs per vLLM replica) does not divide the {n_gpus} GPUs "
            f"(trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node}); choose a divisor"
        )
    if infer_world > per_node:
        yield (
            f"one vLLM replica needs {infer_world} GPUs but a node has trainer.n_gpus_per_node={per_node}; "
            "lower actor_rollout_ref.rollout.tensor_model_parallel_size"
        )
    actor = _select(config, "actor_rollout_ref.actor")
    # The actor-level key (deprecated in verl, still honoured) wins over fsdp_config's when it is larger than 1.
    sp = max(
        int(actor.get("ulysses_sequence_parallel_size", 1) or 1),
        int(_select(config, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 1) or 1),
    )
    if n_gpus % sp:
        yield f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp} does not divide the {n_gpus} GPUs; choose a divisor"
    elif actor.get("strategy") in ("fsdp", "fsdp2"):
        dp = n_gpus // sp
        mini_batch = int(actor.ppo_mini_batch_size) * n
        if mini_batch % dp:
            yield (
                f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} x rollout.n={n} = "
                f"{mini_batch} responses is not divisible by the actor's {dp} data-parallel ranks ({n_gpus} GPUs / "
                f"sequence parallel {sp}); make the mini-batch a multiple of {dp // math.gcd(dp, n)} prompts"
            )
    workers = int(_select(config, "actor_rollout_ref.rollout.agent.num_workers", 1) or 1)
    for key, prompts in _round_sizes(config):
        if (prompts * n) % workers:
            yield (
                f"{key}={prompts} prompts x rollout.n={n} responses do not split evenly over "
                f"actor_rollout_ref.rollout.agent.num_workers={workers} agent-loop workers; change one of them"
            )


def _round_sizes(config: DictConfig) -> list[tuple[str, int]]:
    """Prompt counts every generation round is a multiple of (so prompts x n must split over the workers)."""
    train = int(_select(config, "data.train_batch_size"))
    if not _select(config, "algorithm.filter_groups.enable", False):
        return [("data.train_batch_size", train)]
    if _select(config, "dapo.dynamic_sampling.round_sizing", "deficit") == "whole":
        return [("data.gen_batch_size", int(_select(config, "data.gen_batch_size") or train))]
    granularity = "dapo.dynamic_sampling.prompt_granularity"
    return [(granularity, int(_select(config, granularity, 1)))]


def rule_data_files(config: DictConfig, report: CheckReport) -> Iterable[str]:
    prompt_key = str(_select(config, "data.prompt_key", "prompt"))
    for key in ("data.train_files", "data.val_files"):
        files = _paths(_select(config, key))
        if not files:
            yield f"{key} is not set; point it at a verl RL parquet (bash scripts/prepare_data.sh DIR makes them)"
        for path in files:
            if path.startswith("~"):
                # A shell expands ~ only at the start of a word, never inside `key=~/...`.
                yield f"{key}: {path} starts with '~', which nothing expands; write the absolute path"
            elif not os.path.exists(path):
                if report.absent_inputs_ok:
                    report.not_checked.append(f"{key}: {path} (absent on this machine)")
                else:
                    yield f"{key}: {path} does not exist (bash scripts/prepare_data.sh DIR makes it)"
            else:
                stat = os.stat(path)
                error = _validate_file(os.path.abspath(path), stat.st_mtime_ns, stat.st_size, prompt_key)
                if error:
                    yield f"{key}: {error}"


_validated: dict[tuple, str | None] = {}


def _validate_file(path: str, mtime_ns: int, size: int, prompt_key: str) -> str | None:
    """Row checks of one data file, once per file version (many configs checked in one process)."""
    from recipe_dapo.data.validation import RLDataError, validate_rl_parquet

    cache_key = (path, mtime_ns, size, prompt_key)
    if cache_key not in _validated:
        try:
            validate_rl_parquet(path, prompt_key=prompt_key)
            _validated[cache_key] = None
        except RLDataError as exc:
            _validated[cache_key] = str(exc)
    return _validated[cache_key]


def rule_prompt_keys(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Prompt skipping needs every training row to carry a prompt id no other prompt shares."""
    if not _select(config, "dapo.dynamic_sampling.skip.enable", False):
        return []
    from recipe_dapo.data.prompt_ids import prompt_key_problems

    files = [path for path in _paths(_select(config, "data.train_files")) if os.path.isfile(path)]
    if not files:  # absent files are rule_data_files' to report
        return []
    return prompt_key_problems(files, str(_select(config, "data.prompt_key", "prompt")))


def rule_model_path(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """A local model folder must hold a config.json; anything else (a hub id, a cluster path) is not checked."""
    path = os.path.expanduser(str(_select(config, "actor_rollout_ref.model.path")))
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            yield f"actor_rollout_ref.model.path={path} has no config.json; point it at a Hugging Face model folder"
    elif os.path.isabs(path) and not report.dry_run:  # a folder path, not a hub id: at start-up it must exist
        yield f"actor_rollout_ref.model.path={path} does not exist; point it at a Hugging Face model folder"
    else:
        report.not_checked.append(f"actor_rollout_ref.model.path: {path} (not a local folder; not checked here)")


def rule_filter_metric(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The filter metric must be a number every response has: a summed reward, or a key the manager reports."""
    from recipe_dapo.dynamic_sampling.group_stats import SEQUENCE_METRICS

    if not _select(config, "algorithm.filter_groups.enable", False):
        return
    metric = _select(config, "algorithm.filter_groups.metric")
    manager = str(_select(config, "reward.reward_manager.name"))
    known = reward_extra_info_keys(manager)
    if known is None:
        return  # a manager the recipe does not know: any key it reports may be valid
    numeric = set(SEQUENCE_METRICS) | (set(known) - set(TEXT_REWARD_KEYS))
    if metric not in numeric:
        yield (
            f"algorithm.filter_groups.metric={metric!r} is not a numeric metric reward manager {manager!r} "
            f"reports; choose one of {_closest_first(metric, numeric)}"
        )


def reward_extra_info_keys(reward_manager_name: str) -> tuple[str, ...] | None:
    """The per-sample keys a registered reward manager reports, when the recipe knows them."""
    if reward_manager_name == "recipe_dapo":
        from recipe_dapo.reward.metrics import REWARD_EXTRA_KEYS

        return tuple(REWARD_EXTRA_KEYS)
    if reward_manager_name == "dapo":
        return ("score", "acc", "pred", "overlong_reward", "overlong")  # verl's dapo manager's own names
    return None


def prompt_limit(config: DictConfig) -> tuple[int, str]:
    """The prompt length the rollout enforces and the key that sets it (``rollout.prompt_length`` follows
    ``data.max_prompt_length`` unless overridden; the smaller one cuts)."""
    data_limit = int(_select(config, "data.max_prompt_length"))
    rollout_limit = _select(config, "actor_rollout_ref.rollout.prompt_length")
    if rollout_limit is not None and int(rollout_limit) < data_limit:
        return int(rollout_limit), "actor_rollout_ref.rollout.prompt_length"
    return data_limit, "data.max_prompt_length"


def tokenizer_key(config: DictConfig) -> str:
    """The key that names the tokenizer: ``tokenizer_path`` when set, else the model path."""
    key = "tokenizer_path" if _select(config, "actor_rollout_ref.model.tokenizer_path") else "path"
    return f"actor_rollout_ref.model.{key}"


def tokenizer_path(config: DictConfig) -> str:
    model = _select(config, "actor_rollout_ref.model")
    return str(model.get("tokenizer_path") or model.path)


def _prompt_length_problems(config: DictConfig, problems: list[str], report: CheckReport) -> None:
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
        if os.path.isfile(path)  # a missing file is rule_data_files' problem
    ]
    if not files:
        return
    model = _select(config, "actor_rollout_ref.model")
    path = os.path.expanduser(tokenizer_path(config))
    local = os.path.isdir(path)
    try:
        tokenizer = load_tokenizer(
            path, bool(model.get("trust_remote_code", False)), model.get("custom_chat_template"), local_files_only=not local
        )
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a bad path
        if not local:  # a hub id not in the cache: the check never downloads (verl's workers will)
            report.not_checked.append(f"{tokenizer_key(config)}: {path} (not a local folder nor in the Hugging Face "
                                      "cache: prompt tokens not counted before start)")
            logger.warning("prompt tokens not counted at start-up: %s is not a local folder nor cached", path)
            return
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


def rule_cpu_memory(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """On CPU: vLLM's KV cache and the weights must fit in free memory (``recipe_dapo.cpu.memory``)."""
    from recipe_dapo.cpu.memory import check_cpu_memory

    problems: list[str] = []
    check_cpu_memory(config, problems)
    return problems


def rule_prompt_lengths(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Every prompt's tokens counted with the model's tokenizer (loading it needs transformers: tier 2). In a dry
    run a tokenizer that is not a local folder is never fetched: "not checked"."""
    path = os.path.expanduser(tokenizer_path(config))
    if report.dry_run and not os.path.isdir(path):
        report.not_checked.append(f"{tokenizer_key(config)}: {path} (not a local folder: prompt tokens not counted here)")
        return []
    problems: list[str] = []
    _prompt_length_problems(config, problems, report)
    return problems


RULES: tuple[Rule, ...] = (
    rule_trainer,
    rule_algorithm,
    rule_batch_sizes,
    rule_clip,
    rule_dynamic_sampling,
    rule_filter_metric,
    rule_reward,
    rule_legacy_keys,
    rule_cluster_shape,
    rule_data_files,
    rule_prompt_keys,
    rule_model_path,
    rule_cpu_memory,
)


# ----------------------------------------------------------------------------- tier 2: with verl


def rule_registries(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    loss_mode = _select(config, "actor_rollout_ref.actor.policy_loss.loss_mode")
    if loss_mode not in POLICY_LOSS_REGISTRY:
        yield (
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is not a registered policy loss; "
            f"choose one of {_closest_first(loss_mode, POLICY_LOSS_REGISTRY)}"
        )
    source = _select(config, "reward.reward_manager.source", "register")
    name = _select(config, "reward.reward_manager.name")
    if source == "register" and name not in REWARD_MANAGER:
        yield (
            f"reward.reward_manager.name={name!r} is not a registered reward manager; choose one of "
            f"{_closest_first(name, REWARD_MANAGER)}"
        )


def rule_v1_installed(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """trainer.use_v1=true needs TransferQueue, which verl installs only with its verl-core extra."""
    if not _select(config, "trainer.use_v1", False):
        return
    import importlib.util

    if importlib.util.find_spec("transfer_queue") is None:
        yield (
            "trainer.use_v1=true needs TransferQueue, which is not installed: pip install 'transferqueue>=0.1.10,<0.2' "
            "(the recipe's cpu, gpu and v1 extras include it), or set trainer.use_v1=false"
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
            omega_conf_to_dataclass(_select(config, key))
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


VERL_RULES: tuple[Rule, ...] = (rule_registries, rule_v1_installed, rule_verl_configs, rule_prompt_lengths)


# ----------------------------------------------------------------------------- running the rules


def check_config(
    config: DictConfig, *, absent_inputs_ok: bool = False, dry_run: bool = False, where: str = "the driver"
) -> CheckReport:
    """Run every rule; raise :class:`DAPOConfigError` listing every problem found.

    Tier 1 runs first and needs no verl import; tier 2 (with verl) runs only when tier 1 passed. Before tier 2 the
    process settles its platform (``platform=cpu`` pins the CPU platform) and checks that the plugins registered.
    """
    report = CheckReport(absent_inputs_ok=absent_inputs_ok, dry_run=dry_run)
    try:
        # The task runner resolves the whole config; a broken interpolation should fail here, not there.
        resolved = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    except Exception as exc:
        raise DAPOConfigError([f"an interpolation does not resolve: {exc}"]) from None
    _raise_if_any(_run(RULES, resolved, report))

    from recipe_dapo.cpu.detect import use_configured_device

    use_configured_device(config)
    check_plugins_registered(where=where)
    _raise_if_any(_run(VERL_RULES, resolved, report))
    report.summary = summarize(resolved)
    return report


def _run(rules: Sequence[Rule], config: DictConfig, report: CheckReport) -> list[str]:
    problems: list[str] = []
    for rule in rules:
        for problem in rule(config, report) or ():
            if problem not in problems:
                problems.append(problem)
    return problems


def _raise_if_any(problems: list[str]) -> None:
    if problems:
        raise DAPOConfigError(problems)


def check_plugins_registered(where: str) -> None:
    """Fail loudly when the ``verl.plugins`` entry point did not register the recipe in this process."""
    import verl  # noqa: F401  (importing verl is what loads the plugins)

    try:
        from recipe_dapo.plugin import registered_components, registration_errors

        missing = [name for name, ok in registered_components().items() if not ok]
        error = registration_errors() or None
    except Exception as exc:  # the plugin module itself failed to import
        missing, error = ["recipe_dapo.plugin"], exc
    if missing:
        raise PluginNotLoadedError(
            f"recipe_dapo components are not registered in {where}: missing {missing}"
            + (f" (importing or registering recipe_dapo.plugin failed: {error!r})" if error else "")
            + ". verl loads them through the 'verl.plugins' entry point: install the recipe into the Python "
            "environment the workers use (`pip install -e .` in this repository, or add it to the Ray "
            "runtime_env), and make sure VERL_USE_EXTERNAL_PLUGINS is unset, 'auto' or includes 'recipe_dapo'."
        )


def summarize(config: DictConfig) -> dict[str, object]:
    """The handful of values that say what the run will do."""

    def get(key: str):
        return _select(config, key)

    actor = "actor_rollout_ref.actor"
    return {
        "GPUs": f"{get('trainer.nnodes')} nodes x {get('trainer.n_gpus_per_node')}",
        "model": get("actor_rollout_ref.model.path"),
        "train / gen prompts": f"{get('data.train_batch_size')} / {get('data.gen_batch_size')}",
        "responses per prompt": get("actor_rollout_ref.rollout.n"),
        "mini-batch prompts": get(f"{actor}.ppo_mini_batch_size"),
        "prompt / response tokens": f"{get('data.max_prompt_length')} / {get('data.max_response_length')}",
        "loss": f"{get(f'{actor}.policy_loss.loss_mode')}, {get(f'{actor}.loss_agg_mode')}, "
        f"clip {get(f'{actor}.clip_ratio_low')} / {get(f'{actor}.clip_ratio_high')}",
        "dynamic sampling": get("algorithm.filter_groups.enable"),
        "keep rule / prompt skipping": f"{get('dapo.dynamic_sampling.keep_rule')} / "
        f"{get('dapo.dynamic_sampling.skip.enable')}",
        "overlong buffer": get("reward.reward_kwargs.overlong_buffer_cfg.enable"),
        "sequence / tensor parallel": f"{get(f'{actor}.ulysses_sequence_parallel_size')} / "
        f"{get('actor_rollout_ref.rollout.tensor_model_parallel_size')}",
    }


# ----------------------------------------------------------------------------- mistyped keys


def _closest_first(name, choices) -> list[str]:
    choices = sorted(str(c) for c in choices)
    close = difflib.get_close_matches(str(name), choices, n=3, cutoff=0.6)
    return close + [c for c in choices if c not in close]


def config_keys(config: DictConfig, prefix: str = "") -> list[str]:
    """Every dotted key of a config (leaves and sections)."""
    keys = []
    for key in config.keys():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        node = config._get_node(key)
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            keys.extend(config_keys(node, dotted + "."))
    return keys


def unknown_override_keys(overrides: Sequence[str], config: DictConfig, groups: Sequence[str] = ()) -> list[str]:
    """For each ``key=value`` override whose key is not in ``config`` (nor a config group), a 'did you mean' line."""
    known = [k for k in config_keys(config) if not k.rsplit(".", 1)[-1].startswith("_")]
    known_set = set(known) | set(groups)
    lines = []
    for override in overrides:
        if "=" not in override or override.startswith(("+", "~", "hydra.", "hydra/")):
            continue
        key = override.split("=", 1)[0].strip()
        if key in known_set or key.split("@")[0] in known_set:
            continue
        parent, _, leaf = key.rpartition(".")
        if parent in known_set or not parent:  # a mistyped leaf: compare it with its siblings
            siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
            guesses = [f"{parent}.{g}" if parent else g for g in difflib.get_close_matches(leaf, siblings, n=2, cutoff=0.75)]
        else:  # a mistyped section: compare the whole key
            guesses = difflib.get_close_matches(key, known, n=2, cutoff=0.8)
        hint = f"did you mean {' or '.join(guesses)}?" if guesses else "no similar key exists"
        lines.append(f"{key} is not a key of the recipe's config: {hint} (a new key needs a leading '+')")
    return lines


def suggest_for_overrides(overrides: Sequence[str]) -> list[str]:
    """'Did you mean' lines for the command-line overrides whose keys the recipe's config does not have."""
    from hydra import compose, initialize_config_module

    from recipe_dapo.config import config_groups

    try:
        with initialize_config_module("recipe_dapo.config", version_base=None):
            base = compose("dapo_trainer")
    except Exception:  # the base config itself does not compose: Hydra's own message says why
        return []
    return unknown_override_keys([o for o in overrides if "/" not in o.split("=", 1)[0]], base, config_groups())
