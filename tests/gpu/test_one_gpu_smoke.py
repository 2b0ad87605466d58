"""GPU smoke test: the one-GPU launch script trains a tiny model for 3 steps with sleep mode on.

Skipped where CUDA is absent (CI and this project's CPU machines). On a GPU machine with the `gpu` extra
installed (vLLM, verl 0.9.1, ray; see scripts/wheelhouse.sh for air-gapped nodes)::

    python -m pytest tests/gpu -q

It runs ``scripts/dapo_small_one_gpu.sh`` (``size=small_one_gpu``) on the default run's tiny model and
synthetic data, shrunk to seconds per step, with verl's sleep mode on (``free_cache_engine``), so the rollout
replicas sleep while the actor trains and must be woken with current weights for every round. Rounds are sized
to exactly the missing groups (keep-rate prior 1, no margin), so any filtered group forces a second round in
that step; the test asserts at least one such step and training metrics from every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.timeout(1800),
]

STEPS = 3
# The one-GPU size shrunk to seconds per step (Hydra overrides, after the script's size=small_one_gpu).
SMOKE_OVERRIDES = [
    "data.train_batch_size=8",
    "data.gen_batch_size=16",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "data.max_prompt_length=128",
    "data.max_response_length=32",
    "reward.reward_kwargs.overlong_buffer_cfg.len=8",
    "algorithm.filter_groups.max_num_gen_batches=8",
    f"trainer.total_training_steps={STEPS}",
    f"trainer.test_freq={STEPS}",
    "trainer.save_freq=-1",
    "trainer.val_before_train=false",
    "actor_rollout_ref.rollout.val_kwargs.n=2",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=10",  # as written (the config's default is the paper's 20)
]


def test_three_steps_with_sleep_mode_and_a_multi_round_step_train_every_step(tmp_path, default_assets):
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        MODEL_PATH=default_assets["model_path"],
        TRAIN_FILE=default_assets["train_file"],
        VAL_FILES=default_assets["val_file"],
        CKPTS_DIR=str(tmp_path / "ckpts"),
        VERL_FILE_LOGGER_PATH=str(tmp_path / "metrics.jsonl"),
    )
    env.pop("VERL_PLATFORM", None)
    result = subprocess.run(
        [
            "bash",
            str(REPO_ROOT / "scripts" / "dapo_small_one_gpu.sh"),
            *SMOKE_OVERRIDES,
            "actor_rollout_ref.rollout.free_cache_engine=true",
            "dapo.dynamic_sampling.keep_rate_prior=1.0",
            "dapo.dynamic_sampling.safety_margin=0.0",
            "actor_rollout_ref.actor.optim.lr=5e-5",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1700,
    )
    (tmp_path / "run.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, f"run failed, log tail:\n{(result.stdout + result.stderr)[-8000:]}"

    records = [json.loads(line) for line in Path(tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps: dict[int, dict] = {}
    for record in records:
        steps.setdefault(record["step"], {}).update(record["data"])
    for step in range(1, STEPS + 1):
        metrics = steps[step]
        assert metrics["dynamic_sampling/trained_groups"] > 0
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac_eps_high", "response_length/mean"):
            assert key in metrics and metrics[key] == metrics[key], (step, key)  # present and not NaN
    rounds = [steps[step]["dynamic_sampling/num_gen_rounds"] for step in range(1, STEPS + 1)]
    assert max(rounds) >= 2, f"no step needed a second round: {rounds}"
