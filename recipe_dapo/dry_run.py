"""Dry run: compose the exact config a launch would train with and check it, without Ray, GPUs or the model.

    python -m recipe_dapo.dry_run [the same Hydra overrides as recipe_dapo.main_dapo]
    DRY_RUN=1 bash scripts/<launch script>.sh                 # what the launch scripts run in dry-run mode

Composes ``config/dapo_trainer.yaml`` exactly as the entry point does (an unknown key fails here, as
Hydra refuses it), resolves every interpolation, then runs, collecting every problem before failing:

1. the recipe's start-up checks (:func:`recipe_dapo.preflight.check_config`), with two differences: a data
   file that does not exist on *this* machine is reported as "not checked" instead of failing (cluster
   paths usually exist only on the cluster); a file that exists is validated row by row as at start-up.
   ``DAPO_DRY_RUN_REQUIRE_FILES=1`` makes an absent file an error again. And prompt tokens are counted
   only when the tokenizer is a local folder (a hub id is never fetched here);
2. values in verl's legacy ``reward_model`` / ``custom_reward_function`` / ``sandbox_fusion`` sections,
   which verl 0.9.1's trainer silently ignores (old launch scripts set them);
3. settings the reward manager and verl's worker configs refuse only once the workers start
   (``RewardSettings``, verl's actor / rollout / algorithm dataclasses);
4. the cluster shape: sequence- and tensor-parallel sizes against the GPU count, mini-batches against the
   data-parallel size, generation rounds against the agent-loop workers (failures verl reports as an
   ``AssertionError`` deep inside a worker, after the cluster was allocated and the model loaded);
5. verl's own ``validate_config``.

The model is never loaded: ``actor_rollout_ref.model.path`` is checked only when it is a local folder.
Exit status 0 when the configuration is valid, 1 otherwise (the message names each key and its fix).
``DAPO_DRY_RUN_PRINT_CONFIG=1`` also prints the resolved configuration as YAML, like Hydra's ``--cfg job``.
"""

from __future__ import annotations

import functools
import io
import logging
import math
import os
import sys
import warnings
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from typing import Callable, Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from recipe_dapo import preflight
from recipe_dapo.preflight import DAPOConfigError, check_config, check_plugins_registered

logger = logging.getLogger(__name__)

REQUIRE_FILES_ENV = "DAPO_DRY_RUN_REQUIRE_FILES"
PRINT_CONFIG_ENV = "DAPO_DRY_RUN_PRINT_CONFIG"

# Hydra settings of the dry run only: no outputs/ folder, no log file, no Hydra logging set-up. They go
# first on the command line, so a user's own hydra.* override still wins.
QUIET_HYDRA_OVERRIDES = (
    "hydra.output_subdir=null",
    "hydra.run.dir=.",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
)


@dataclass
class DryRunReport:
    """What the dry run checked and what it could not check on this machine."""

    not_checked: list[str] = field(default_factory=list)
    """Inputs absent here (data files, the model), each with its key."""
    summary: dict[str, object] = field(default_factory=dict)
    """The run's shape, for the log: GPUs, batch sizes, lengths, loss, filter."""


Check = Callable[[DictConfig, list[str]], None]


def _select(config: DictConfig, key: str, default=None):
    return OmegaConf.select(config, key, default=default)


def _paths(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


@functools.lru_cache(maxsize=64)
def _validate_file(path: str, mtime_ns: int, size: int, prompt_key: str) -> str | None:
    """Row checks of one data file, once per file version (checking many configs in one process)."""
    from recipe_dapo.data.validation import RLDataError, validate_rl_parquet

    try:
        validate_rl_parquet(path, prompt_key=prompt_key)
    except RLDataError as exc:
        return str(exc)
    return None


def data_file_check(report: DryRunReport, require_files: bool) -> Check:
    """The start-up data check, except that a file absent from this machine is listed as not checked."""

    def check(config: DictConfig, problems: list[str]) -> None:
        prompt_key = str(_select(config, "data.prompt_key", "prompt"))
        for key in ("data.train_files", "data.val_files"):
            files = _paths(_select(config, key))
            if not files:
                problems.append(f"{key} is not set; point it at a verl RL parquet (bash scripts/prepare_data.sh DIR)")
            for path in files:
                if path.startswith("~"):
                    # A shell expands ~ only at the start of a word, never inside `key=~/...`, and the start-up
                    # check looks the path up as written.
                    problems.append(f"{key}: {path} starts with '~', which nothing expands; write the absolute path")
                    continue
                if not os.path.exists(path):
                    if require_files:
                        problems.append(f"{key}: {path} does not exist (bash scripts/prepare_data.sh DIR makes it)")
                    else:
                        report.not_checked.append(f"{key}: {path} (absent on this machine)")
                    continue
                stat = os.stat(path)
                error = _validate_file(os.path.abspath(path), stat.st_mtime_ns, stat.st_size, prompt_key)
                if error:
                    problems.append(f"{key}: {error}")

    return check


def model_path_check(report: DryRunReport) -> Check:
    """A local model folder must hold a config.json; anything else (a hub id, a cluster path) is not checked."""

    def check(config: DictConfig, problems: list[str]) -> None:
        path = os.path.expanduser(str(_select(config, "actor_rollout_ref.model.path")))
        if os.path.isdir(path):
            if not os.path.exists(os.path.join(path, "config.json")):
                problems.append(
                    f"actor_rollout_ref.model.path={path} has no config.json; point it at a Hugging Face model folder"
                )
        else:
            report.not_checked.append(f"actor_rollout_ref.model.path: {path} (not a local folder; never loaded here)")

    return check


def prompt_length_check(report: DryRunReport) -> Check:
    """The start-up prompt-length count, when the tokenizer is a local folder (a hub id is never fetched here)."""

    def check(config: DictConfig, problems: list[str]) -> None:
        path = os.path.expanduser(preflight.tokenizer_path(config))
        if not os.path.isdir(path):
            key = "tokenizer_path" if _select(config, "actor_rollout_ref.model.tokenizer_path") else "path"
            report.not_checked.append(
                f"actor_rollout_ref.model.{key}: {path} (not a local folder: prompt tokens not counted here)"
            )
            return
        preflight._check_prompt_lengths(config, problems)

    return check


def check_reward_settings(config: DictConfig, problems: list[str]) -> None:
    """What the ``recipe_dapo`` reward manager refuses when the reward workers start."""
    if _select(config, "reward.reward_manager.name") != "recipe_dapo":
        return
    from recipe_dapo.reward.settings import RewardSettings

    try:
        RewardSettings.from_config(config)
    except ValueError as exc:
        problems.append(f"reward.reward_kwargs: {exc}")


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


def check_legacy_sections(config: DictConfig, problems: list[str]) -> None:
    """Values under verl's legacy reward sections, which the trainer would ignore."""

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


def check_worker_configs(config: DictConfig, problems: list[str]) -> None:
    """verl's typed configs, built as the workers build them (their __post_init__ checks values)."""
    from verl.utils.config import omega_conf_to_dataclass

    for key in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm"):
        try:
            omega_conf_to_dataclass(_select(config, key))
        except Exception as exc:  # verl raises ValueError, AssertionError or TypeError here
            problems.append(f"{key}: verl refuses it: {type(exc).__name__}: {exc}")


def check_cluster_shape(config: DictConfig, problems: list[str]) -> None:
    """Divisibility rules verl asserts inside the workers, checked against the configured cluster."""
    nnodes, per_node = int(_select(config, "trainer.nnodes")), int(_select(config, "trainer.n_gpus_per_node"))
    n_gpus = nnodes * per_node
    n = int(_select(config, "actor_rollout_ref.rollout.n"))
    rollout = _select(config, "actor_rollout_ref.rollout")
    infer_world = int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size) * int(
        rollout.pipeline_model_parallel_size
    )
    if n_gpus % infer_world:
        problems.append(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size} "
            f"(x data/pipeline parallel = {infer_world} GPUs per vLLM replica) does not divide the {n_gpus} GPUs "
            f"(trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node}); choose a divisor"
        )
    if infer_world > per_node:
        problems.append(
            f"one vLLM replica needs {infer_world} GPUs but a node has trainer.n_gpus_per_node={per_node}; "
            "lower actor_rollout_ref.rollout.tensor_model_parallel_size"
        )
    actor = _select(config, "actor_rollout_ref.actor")
    # The actor-level key (deprecated in verl, still honoured) wins over fsdp_config's when it is larger than 1.
    sp = max(
        int(actor.get("ulysses_sequence_parallel_size", 1)),
        int(_select(config, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 1) or 1),
    )
    if n_gpus % sp:
        problems.append(
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp} does not divide the {n_gpus} GPUs; "
            "choose a divisor"
        )
    elif actor.get("strategy") in ("fsdp", "fsdp2"):
        dp = n_gpus // sp
        mini_batch = int(actor.ppo_mini_batch_size) * n
        if mini_batch % dp:
            problems.append(
                f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} x rollout.n={n} = "
                f"{mini_batch} responses is not divisible by the actor's {dp} data-parallel ranks ({n_gpus} GPUs / "
                f"sequence parallel {sp}); make the mini-batch a multiple of {dp // math.gcd(dp, n)} prompts"
            )
    workers = int(_select(config, "actor_rollout_ref.rollout.agent.num_workers", 1) or 1)
    for key, prompts in _round_sizes(config):
        if (prompts * n) % workers:
            problems.append(
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


def check_with_verl(config: DictConfig, problems: list[str]) -> None:
    """verl's own ``validate_config``, as the task runner calls it (its progress prints go to the log)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    if any(problem.startswith("actor_rollout_ref.actor: verl refuses") for problem in problems):
        return  # validate_config would only repeat that problem (it builds the same actor config first)
    captured = io.StringIO()
    try:
        with redirect_stdout(captured):
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as exc:  # verl raises AssertionError or ValueError
        problems.append(f"verl's validate_config refuses the configuration: {type(exc).__name__}: {exc}")
    for line in captured.getvalue().splitlines():
        logger.debug("verl: %s", line)


def dry_run_checks(report: DryRunReport, require_files: bool = False) -> tuple[Check, ...]:
    """The start-up checks with the dry run's data check, then the checks workers would do later."""
    replaced = {
        preflight._check_data_files: data_file_check(report, require_files),
        preflight._check_prompt_lengths: prompt_length_check(report),
    }
    startup = tuple(replaced.get(check, check) for check in preflight.CHECKS)
    return (
        *startup,
        model_path_check(report),
        check_legacy_sections,
        check_reward_settings,
        check_worker_configs,
        check_cluster_shape,
        check_with_verl,
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
        "overlong buffer": get("reward.reward_kwargs.overlong_buffer_cfg.enable"),
        "sequence / tensor parallel": f"{get(f'{actor}.ulysses_sequence_parallel_size')} / "
        f"{get('actor_rollout_ref.rollout.tensor_model_parallel_size')}",
    }


def dry_run(config: DictConfig, require_files: bool | None = None) -> DryRunReport:
    """Check ``config`` as a launch would, without Ray; raise :class:`DAPOConfigError` listing every problem."""
    # Imported here: importing verl configures logging, which must come after this module's basicConfig.
    from recipe_dapo.cpu.platform import use_configured_device

    if require_files is None:
        require_files = os.environ.get(REQUIRE_FILES_ENV, "0") not in ("", "0", "false")
    report = DryRunReport()
    use_configured_device(config)
    check_plugins_registered(where="the dry run")
    try:
        # The task runner resolves the whole config; a broken interpolation should fail here, not there.
        resolved = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    except Exception as exc:
        message = f"recipe_dapo refused the configuration:\n  - an interpolation does not resolve: {exc}"
        raise DAPOConfigError(message) from exc
    check_config(resolved, checks=dry_run_checks(report, require_files))
    report.summary = summarize(resolved)
    return report


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """The config ``python -m recipe_dapo.main_dapo <overrides>`` would train with (Hydra's compose API)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    with initialize_config_module(config_module="recipe_dapo.config", version_base=None):
        return hydra_compose(config_name="dapo_trainer", overrides=list(overrides))


def log_report(report: DryRunReport) -> None:
    for name, value in report.summary.items():
        logger.info("  %-26s %s", name, value)
    for item in report.not_checked:
        logger.warning("not checked: %s", item)
    logger.info("dry run OK: the configuration composes and passes every check%s",
                f" ({len(report.not_checked)} input(s) not checked here)" if report.not_checked else "")


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    if os.environ.get(PRINT_CONFIG_ENV, "0") not in ("", "0", "false"):
        try:
            sys.stdout.write(OmegaConf.to_yaml(config, resolve=True))
        except Exception:  # an interpolation that does not resolve: the dry run below names it
            sys.stdout.write(OmegaConf.to_yaml(config))
    try:
        report = dry_run(config)
    except DAPOConfigError as exc:
        logger.error("dry run FAILED\n%s", exc)
        sys.exit(1)
    log_report(report)


if __name__ == "__main__":
    # verl warns on every need_critic() call that a GRPO run has no critic; the dry run calls it several times.
    warnings.filterwarnings("ignore", message="Disabled critic")
    logging.basicConfig(level=logging.INFO, format="[dry-run] %(levelname)s %(message)s", stream=sys.stderr)
    sys.argv[1:1] = QUIET_HYDRA_OVERRIDES
    main()
