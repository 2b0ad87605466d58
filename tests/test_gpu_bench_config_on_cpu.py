"""bench/gpu_one_gpu.py runs verl's own trainer on the recipe arm's config: same values, verl's loss and reward manager."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
gpu_bench = pytest.importorskip("gpu_one_gpu")

# What the verl arm changes on purpose (verl's own loss and reward manager, its classic trainer), and what it cannot
# take (the recipe's own section).
SWAPPED = {
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "reward.reward_manager.name": "dapo",
    "trainer.use_v1": False,
}


def test_verl_arm_composes_to_the_recipe_arms_config_except_the_loss_and_the_reward_manager():
    overrides = [gpu_bench.SIZE, *gpu_bench.RUN_OVERRIDES, "data.train_files='/data/my train.parquet'",
                 "trainer.total_training_steps=6", *gpu_bench.COMMON_OVERRIDES]
    recipe = gpu_bench.flatten(gpu_bench.compose_config("recipe_dapo.config", "dapo_trainer", overrides))
    verl_overrides = gpu_bench.as_verl_classic(overrides)
    assert not [item for item in verl_overrides if item.startswith("dapo.")]
    verl = gpu_bench.flatten(gpu_bench.compose_config("verl.trainer.config", "ppo_trainer", verl_overrides))
    differs = {key: (recipe.get(key), verl.get(key)) for key in recipe
               if not key.startswith("dapo.") and verl.get(key, "<absent>") != SWAPPED.get(key, recipe[key])}
    assert not differs, f"key: (recipe arm, verl arm) {differs}"
    # The run really is the bench's: the size's and the overrides' values, not verl's defaults.
    assert verl["data.train_batch_size"] == 64 and verl["actor_rollout_ref.rollout.n"] == 8
    assert verl["reward.reward_kwargs.overlong_buffer_cfg.len"] == 64 and verl["data.train_files"] == "/data/my train.parquet"
