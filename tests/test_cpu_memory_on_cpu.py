"""The CPU run sizes vLLM's KV cache in GiB from its shapes and checks free memory first.

Before: ``platform/cpu.yaml`` set ``gpu_memory_utilization: 0.3``, which vLLM-CPU reads as 30% of the host's
memory (refusing to start on a busy machine, ~150 GB on a 512 GB host).
"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from recipe_dapo.cpu.memory import GIB, KV_CACHE_KEY, apply_cpu_kv_cache, check_cpu_memory
from recipe_dapo.preflight import DAPOConfigError, check_config
from conftest import compose_recipe_config

# The default run's sizes (scripts/run_dapo_cpu.sh: platform=cpu size=cpu_tiny).
DEFAULT_RUN = ["platform=cpu", "size=cpu_tiny"]


def default_run(default_assets, *extra):
    return compose_recipe_config(
        [
            *DEFAULT_RUN,
            f"data.train_files={default_assets['train_file']}",
            f"data.val_files={default_assets['val_file']}",
            f"actor_rollout_ref.model.path={default_assets['model_path']}",
            *extra,
        ]
    )


# The default model: 2 layers, 1 KV head, head_dim 64 / 2 heads = 32, float32 rollout:
#   2 (K, V) x 2 layers x 1 head x 32 x 4 bytes = 512 bytes per token.
# In flight: max(generation round 8 prompts x n 8, validation batch 16 x val n 4) = 64 sequences.
# max_model_len 128 + 32 = 160 tokens -> 2 blocks of 128 = 256 tokens.
# KV cache: 512 x 64 x 256 = 8,388,608 bytes (8 MiB).
DEFAULT_RUN_KV_BYTES = 512 * 64 * 256


def test_default_cpu_run_sizes_the_kv_cache_from_its_shapes(default_assets):
    config = default_run(default_assets)
    assert apply_cpu_kv_cache(config) == DEFAULT_RUN_KV_BYTES
    assert OmegaConf.select(config, KV_CACHE_KEY) == DEFAULT_RUN_KV_BYTES


def test_the_size_reaches_vllm_as_verl_passes_engine_arguments(default_assets):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config

    config = default_run(default_assets)
    apply_cpu_kv_cache(config)
    engine_kwargs = OmegaConf.to_container(config.actor_rollout_ref.rollout.engine_kwargs.vllm)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--model", default_assets["model_path"], *build_cli_args_from_config(engine_kwargs)])
    assert AsyncEngineArgs.from_cli_args(parsed).kv_cache_memory_bytes == DEFAULT_RUN_KV_BYTES


def test_an_explicit_size_in_gib_wins(default_assets):
    config = default_run(default_assets, "dapo.cpu.kv_cache_gib=0.25")
    assert apply_cpu_kv_cache(config) == GIB // 4


def test_gpu_runs_are_left_to_verls_gpu_memory_utilization(default_assets):
    config = compose_recipe_config([f"actor_rollout_ref.model.path={default_assets['model_path']}"])
    assert apply_cpu_kv_cache(config) is None
    assert OmegaConf.select(config, KV_CACHE_KEY) is None


def seven_b_model(tmp_path):
    """A Qwen2.5-7B-shaped model folder: its config, and a sparse 15.2 GB bf16 weight file (no disk used)."""
    folder = tmp_path / "qwen7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
        "torch_dtype": "bfloat16",
    }))
    with open(folder / "model.safetensors", "wb") as handle:
        handle.truncate(15_231_233_024)  # 7.6B parameters x 2 bytes
    return folder


def test_a_run_that_cannot_fit_is_refused_before_workers_start(tmp_path, default_assets):
    model = seven_b_model(tmp_path)
    config = default_run(default_assets, f"actor_rollout_ref.model.path={model}", "data.max_response_length=4096")
    problems: list[str] = []
    check_cpu_memory(config, problems, available=24 * GIB)
    # KV: 2 x 28 x 4 x 128 x 4 bytes = 114,688 B/token x 64 sequences x 4224 tokens = 28.9 GiB > 24 GiB.
    assert len(problems) == 1
    assert "28.88 GiB of KV cache (64 sequences x 4224 tokens)" in problems[0]
    assert "24.00 GiB free" in problems[0] and "dapo.cpu.kv_cache_gib" in problems[0]
    # Rollout weights: 7.6B x 4 bytes (float32 on CPU) = 28.4 GiB. With the KV cache capped at 2 GiB, 30.4 GiB
    # fit in 64 GiB (the training state, 16 bytes a parameter, is only warned about: an estimate).
    capped = default_run(default_assets, f"actor_rollout_ref.model.path={model}", "dapo.cpu.kv_cache_gib=2")
    problems = []
    check_cpu_memory(capped, problems, available=64 * GIB)
    assert problems == []


def test_start_up_check_passes_the_default_run_on_this_machine(default_assets):
    report = check_config(default_run(default_assets))
    assert not report.not_checked  # every input is local: files, model folder and prompt tokens were all checked


def test_start_up_check_names_the_key_when_memory_is_short(default_assets, monkeypatch):
    monkeypatch.setattr("recipe_dapo.cpu.memory.available_memory", lambda: 4 * (1 << 20))  # 4 MiB free
    with pytest.raises(DAPOConfigError) as refused:
        check_config(default_run(default_assets))
    assert "dapo.cpu.kv_cache_gib" in str(refused.value)


def test_evaluator_sizes_its_cpu_kv_cache_the_same_way(default_assets):
    from recipe_dapo.evaluation.generation import EngineSettings, cpu_kv_cache_gib

    # 30 problems x n 4 = 120 sequences, max_model_len 160 -> 512 B x 120 x 256 tokens (float32 model).
    settings = EngineSettings(model=default_assets["model_path"], tokenizer=default_assets["model_path"],
                              max_model_len=160, dtype="float32", sequences=120)
    assert cpu_kv_cache_gib(settings) * GIB == pytest.approx(512 * 120 * 256)
    # More samples than vLLM-CPU runs at once (256): sized for 256.
    many = EngineSettings(model=default_assets["model_path"], tokenizer=default_assets["model_path"],
                          max_model_len=160, dtype="float32", sequences=10_000)
    assert cpu_kv_cache_gib(many) * GIB == pytest.approx(512 * 256 * 256)
