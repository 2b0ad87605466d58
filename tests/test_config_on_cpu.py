"""The recipe's Hydra config composes verl's real ppo_trainer, and start-up checks refuse bad settings by key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recipe_dapo.preflight import DAPOConfigError, check_config
from conftest import compose_recipe_config, ray_runtime_env_as_verl_builds_it


@pytest.fixture(scope="module")
def data_files(default_assets):
    # The model path too: the start-up check counts prompt tokens with the model's tokenizer.
    return [
        f"data.train_files={default_assets['train_file']}",
        f"data.val_files={default_assets['val_file']}",
        f"actor_rollout_ref.model.path={default_assets['model_path']}",
    ]


def small_run(data_files, *extra):
    """A valid small configuration (the default run's sizes) plus `extra` overrides."""
    return [
        *data_files,
        "data.max_response_length=32",
        "data.train_batch_size=4",
        "data.gen_batch_size=8",
        "actor_rollout_ref.rollout.n=8",
        "reward.reward_kwargs.overlong_buffer_cfg.len=8",
        *extra,
    ]


def test_config_composes_verl_ppo_trainer_with_dapo_defaults():
    config = compose_recipe_config()
    # verl's own sections are there (composed from the installed package, not copied).
    assert config.actor_rollout_ref.actor._target_ == "verl.workers.config.FSDPActorConfig"
    assert config.algorithm.filter_groups._target_ == "verl.trainer.config.FilterGroupsConfig"
    # The paper's algorithm settings (section 4.1).
    assert config.algorithm.adv_estimator == "grpo"
    assert config.algorithm.use_kl_in_reward is False and config.actor_rollout_ref.actor.use_kl_loss is False
    actor = config.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert actor.loss_agg_mode == "token-mean" and actor.policy_loss.loss_mode == "dapo"
    assert config.algorithm.filter_groups.enable and config.algorithm.filter_groups.metric == "acc"
    assert config.algorithm.filter_groups.max_num_gen_batches == 10
    assert config.reward.reward_manager.name == "recipe_dapo"
    assert config.reward.reward_kwargs.overlong_buffer_cfg.enable and config.reward.reward_kwargs.overlong_buffer_cfg.len == 4096
    # max_resp_len follows data.max_response_length (20,480 = 16,384 + 4,096 in the paper).
    assert OmegaConf.to_container(config, resolve=True)["reward"]["reward_kwargs"]["max_resp_len"] == 20480
    assert config.trainer.use_v1 is False


def test_cpu_platform_overlay_sets_what_vllm_cpu_and_fsdp2_need():
    config = compose_recipe_config(["platform=cpu"])
    assert config.trainer.device == "cpu"
    assert config.actor_rollout_ref.actor.strategy == "fsdp2"
    assert config.actor_rollout_ref.rollout.enable_sleep_mode is False
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert config.ray_kwargs.ray_init.num_gpus == 1
    # The overlay leaves the algorithm alone.
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "dapo"


def test_cpu_overlay_pins_the_cpu_platform_in_every_ray_worker():
    env_vars = ray_runtime_env_as_verl_builds_it(compose_recipe_config(["platform=cpu"]))["env_vars"]
    assert env_vars["VERL_PLATFORM"] == "cpu"
    # Merged into verl's defaults, not replacing them.
    assert "TOKENIZERS_PARALLELISM" in env_vars
    # Accelerator machines keep verl's own platform detection.
    assert "VERL_PLATFORM" not in ray_runtime_env_as_verl_builds_it(compose_recipe_config([])).get("env_vars", {})


def test_verl_rollout_dataclass_accepts_the_cpu_overlay():
    from verl.utils.config import omega_conf_to_dataclass

    config = compose_recipe_config(["platform=cpu"])
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout.enable_sleep_mode is False and rollout.enforce_eager is True


def test_valid_small_configuration_passes_every_start_up_check(data_files):
    check_config(compose_recipe_config(small_run(data_files)))


@pytest.mark.parametrize(
    ("override", "named_key"),
    [
        ("algorithm.filter_groups.metric=nope", "algorithm.filter_groups.metric"),
        ("algorithm.filter_groups.metric=pred", "algorithm.filter_groups.metric"),
        ("reward.reward_kwargs.overlong_buffer_cfg.len=32", "overlong_buffer_cfg.len"),
        ("data.gen_batch_size=2", "data.gen_batch_size"),
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=missing_loss", "policy_loss.loss_mode"),
        ("reward.reward_manager.name=missing_manager", "reward.reward_manager.name"),
        ("actor_rollout_ref.rollout.n=1", "rollout.n"),
        ("+dapo.dynamic_sampling.max_stalenes=2", "dapo.dynamic_sampling.max_stalenes"),
        ("dapo.dynamic_sampling.on_exhausted=crash", "dapo.dynamic_sampling.on_exhausted"),
        ("actor_rollout_ref.actor.clip_ratio_c=0.5", "clip_ratio_c"),
        ("data.train_files=/nonexistent/train.parquet", "data.train_files"),
    ],
)
def test_wrong_override_is_refused_naming_the_key(data_files, override, named_key):
    config = compose_recipe_config(small_run(data_files, override))
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    assert named_key in str(refused.value)


def test_every_problem_is_reported_at_once(data_files):
    config = compose_recipe_config(
        small_run(data_files, "algorithm.filter_groups.metric=nope", "data.gen_batch_size=2")
    )
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    message = str(refused.value)
    assert "algorithm.filter_groups.metric" in message and "data.gen_batch_size" in message


def test_bad_data_row_is_refused_with_file_row_and_field(tmp_path, data_files):
    import pandas as pd

    from recipe_dapo.default_assets import synthetic_rows

    rows = synthetic_rows(3, "train", seed=0)
    rows[1]["reward_model"] = {"ground_truth": "", "style": "rule"}
    bad = tmp_path / "bad.parquet"
    pd.DataFrame(rows).to_parquet(bad)
    config = compose_recipe_config(small_run(data_files, f"data.train_files={bad}"))
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    message = str(refused.value)
    assert str(bad) in message and "row 1" in message and "ground_truth" in message
