"""Shared fixtures: the repository root, the offline data beside it, and the recipe's composed config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "e2e: multi-minute end-to-end runs (real Ray, vLLM, training); they live in tests/e2e and tests/gpu; "
        "`-m 'not e2e'` runs the unit tests alone",
    )


def shared_data_dir() -> Path | None:
    """The offline data (../shared/data beside the repository, or $SHARED_DATA_DIR); None when absent."""
    for candidate in (REPO_ROOT.parent / "shared" / "data", os.environ.get("SHARED_DATA_DIR")):
        if candidate and (Path(candidate) / "eval").is_dir():
            return Path(candidate)
    return None


SHARED = shared_data_dir()


def compose_recipe_config(overrides: list[str] = ()):
    """The recipe's real Hydra config (verl's ppo_trainer from the installed package + DAPO defaults)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("recipe_dapo.config", version_base=None):
        return compose("dapo_trainer", overrides=list(overrides))


def small_run(data_overrides, *extra) -> list[str]:
    """Overrides of a valid small configuration (the default CPU run's sizes on a 2-GPU node, no model parallelism:
    the tiny model has 2 attention heads) on the given data, plus ``extra``."""
    return [
        *data_overrides,
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "data.max_response_length=32",
        "data.train_batch_size=4",
        "data.gen_batch_size=8",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "reward.reward_kwargs.overlong_buffer_cfg.len=8",
        *extra,
    ]


def ray_runtime_env_as_verl_builds_it(config) -> dict:
    """The runtime env verl's run_ppo passes to ray.init: its defaults with ray_init.runtime_env on top."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    merged = OmegaConf.merge(get_ppo_ray_runtime_env(config), config.ray_kwargs.ray_init.get("runtime_env", {}))
    return OmegaConf.to_container(merged)


@pytest.fixture(scope="session")
def default_assets(tmp_path_factory):
    """The default run's inputs (synthetic data, BPE tokenizer, warmed-up tiny Qwen2), built once per session."""
    from recipe_dapo.cpu.assets import build_default_assets

    return build_default_assets(tmp_path_factory.mktemp("assets"))


def run_cpu_script(work_dir: Path, assets: dict, *overrides: str, timeout: int = 840):
    """``scripts/run_dapo_cpu.sh`` on the session's default assets with ``overrides``; the log goes to run.log."""
    import subprocess
    import sys

    env = dict(
        os.environ,
        PYTHON=sys.executable,
        WORK_DIR=str(work_dir),
        MODEL_PATH=assets["model_path"],
        TRAIN_FILE=assets["train_file"],
        VAL_FILE=assets["val_file"],
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    completed = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "run_dapo_cpu.sh"), *overrides],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    (work_dir / "run.log").write_text(completed.stdout + completed.stderr)
    assert completed.returncode == 0, f"run failed, log tail:\n{(completed.stdout + completed.stderr)[-6000:]}"
    return completed


# The scale runs' shared settings (tests/e2e/test_scale_on_cpu.py): classic trainer, seeded rollouts (platform=cpu),
# overlong filtering, and a step 1 that is both a budget-limited partial step and exactly one mini-batch: 8 prompts a
# step in mini-batches of 4, and a budget of 16 prompts in which 4 to 7 groups qualify (so 4 are trained). One
# mini-batch makes the update's composition the same at any DP size (verl splits each rank's rows into mini-batches,
# so with two mini-batches a DP 2 step would pair other rows than a DP 1 step).
SCALE_RUN_OVERRIDES = (
    "trainer.use_v1=false",
    "trainer.total_training_steps=2",
    "trainer.test_freq=-1",
    "trainer.save_freq=1",
    "data.train_batch_size=8",
    "data.gen_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "algorithm.filter_groups.max_num_gen_batches=1",
    "dapo.dynamic_sampling.on_exhausted=train_partial",
    "dapo.overlong_filter.enable=true",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
)


@pytest.fixture(scope="session")
def dp1_scale_reference(tmp_path_factory, default_assets):
    """The DP 1 run (one rank, one node, a Ray of its own) that the scale runs compare their step 1 with.

    Session-scoped so that any e2e module can share it: a run whose overrides hold ``SCALE_RUN_OVERRIDES`` (plus its
    own rollout dump) serves every comparison of step 1.
    """
    work_dir = tmp_path_factory.mktemp("scale_dp1")
    # address=local: a Ray of its own even if a test cluster's address is still recorded on this machine.
    run_cpu_script(work_dir, default_assets, *SCALE_RUN_OVERRIDES, f"trainer.rollout_data_dir={work_dir / 'rollouts'}",
                   "ray_kwargs.ray_init.address=local")
    return work_dir
