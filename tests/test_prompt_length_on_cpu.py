"""Prompts over the limit are refused (or dropped, counted) at start-up, never silently cut.

Counts are checked against verl's own code (the agent loop's token builder, RLHFDataset's filter) and on the
real DAPO-Math-17k prompts with the Qwen2.5 tokenizer when the shared data are present.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from recipe_dapo.data.prompt_length import (
    load_tokenizer,
    overlong_prompts,
    render_prompts,
    scan_prompt_lengths,
    token_counts,
)
from recipe_dapo.preflight import DAPOConfigError, check_config
from conftest import REPO_ROOT, SHARED, compose_recipe_config, small_run

needs_shared = pytest.mark.skipif(SHARED is None, reason="needs ../shared/data (Qwen2.5 tokenizer, DAPO-Math-17k)")


@pytest.fixture(scope="module")
def tokenizer(default_assets):
    return load_tokenizer(default_assets["model_path"])


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(str(SHARED / "qwen2.5-tokenizer"))


@pytest.fixture(scope="module")
def dapo_prompts():
    import pyarrow.parquet as pq

    return pq.read_table(SHARED / "dapo-math-17k" / "dapo-math-17k.parquet", columns=["prompt"]).column("prompt").to_pylist()


def verl_prompt_tokens(tokenizer, messages) -> int:
    """The prompt length verl's agent loop builds (its Continuous Token builder, before any cut)."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    return len(builder.build_initial_tokens(list(messages)))


def long_prompt_file(path, default_assets, long_rows: dict[int, int]):
    """The default training file with rows ``r`` made ``words`` words longer (the question stays at the end)."""
    frame = pd.read_parquet(default_assets["train_file"])
    for row, words in long_rows.items():
        content = frame.at[row, "prompt"][0]["content"]
        frame.at[row, "prompt"] = [{"role": "user", "content": "Consider this. " * words + content}]
    frame.to_parquet(path)
    return path


@needs_shared
def test_counts_equal_verls_agent_loop_on_dapo_math_prompts(qwen, dapo_prompts):
    sample = dapo_prompts[:: len(dapo_prompts) // 150][:150]
    counts = token_counts(qwen, render_prompts(qwen, sample))
    assert counts.tolist() == [verl_prompt_tokens(qwen, messages) for messages in sample]


@pytest.fixture(scope="module")
def every_third_dapo_prompt(qwen, dapo_prompts):
    prompts = dapo_prompts[::3]
    return prompts, token_counts(qwen, render_prompts(qwen, prompts))


@needs_shared
@pytest.mark.parametrize("limit", [512, 640, 768])
def test_byte_bound_finds_exactly_the_rows_a_full_count_finds(qwen, every_third_dapo_prompt, limit):
    prompts, full = every_third_dapo_prompt
    rows, counts, tokenized = overlong_prompts(qwen, prompts, limit)
    assert rows.tolist() == np.flatnonzero(full > limit).tolist() and len(rows) > 0
    assert counts.tolist() == full[full > limit].tolist()
    assert tokenized < len(prompts)  # the bound skipped the short ones


def test_dropped_count_equals_what_verls_dataset_filter_drops(tmp_path, default_assets, tokenizer):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    path = long_prompt_file(tmp_path / "train.parquet", default_assets, {1: 40, 5: 60, 9: 4})
    lengths = scan_prompt_lengths(path, tokenizer, 128)
    data_config = OmegaConf.create(
        {"max_prompt_length": 128, "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1,
         "cache_dir": str(tmp_path / "cache")}
    )
    dataset = RLHFDataset([str(path)], tokenizer, data_config)
    assert lengths.num_overlong == 2 and lengths.overlong_rows.tolist() == [1, 5]
    assert len(dataset) == lengths.rows - lengths.num_overlong


def config_with_train_file(default_assets, path, *extra):
    return compose_recipe_config(
        small_run(
            [f"data.train_files={path}", f"data.val_files={default_assets['val_file']}"],
            f"actor_rollout_ref.model.path={default_assets['model_path']}",
            "data.max_prompt_length=128",
            "data.filter_overlong_prompts=false",  # the recipe's default drops them; these tests see the refusal
            *extra,
        )
    )


def test_start_up_refuses_overlong_prompts_naming_file_row_tokens_and_key(tmp_path, default_assets, tokenizer):
    path = long_prompt_file(tmp_path / "train.parquet", default_assets, {2: 40, 7: 60})
    rows = pd.read_parquet(path)["prompt"]
    expected = verl_prompt_tokens(tokenizer, [dict(m) for m in rows[2]])
    assert expected > 128
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config_with_train_file(default_assets, path))
    message = str(refused.value)
    assert f"{path}, row 2, field 'prompt': prompt is {expected} tokens, over data.max_prompt_length=128" in message
    assert "1 more of the 512 rows" in message and "rows (tokens): 7 (" in message
    assert "raise data.max_prompt_length to " in message and "data.filter_overlong_prompts=true" in message


def test_a_smaller_rollout_prompt_length_is_the_key_named(tmp_path, default_assets):
    path = long_prompt_file(tmp_path / "train.parquet", default_assets, {})
    config = config_with_train_file(default_assets, path, "actor_rollout_ref.rollout.prompt_length=40")
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config)
    assert "over actor_rollout_ref.rollout.prompt_length=40" in str(refused.value)


def test_filter_overlong_prompts_drops_them_with_a_count(tmp_path, default_assets, caplog):
    path = long_prompt_file(tmp_path / "train.parquet", default_assets, {2: 40, 7: 60})
    with caplog.at_level(logging.WARNING, logger="recipe_dapo.preflight"):
        check_config(config_with_train_file(default_assets, path, "data.filter_overlong_prompts=true"))
    assert f"{path}: dropping 2 of 512 prompts longer than data.max_prompt_length=128 tokens" in caplog.text


def test_truncation_the_rollout_cannot_apply_is_refused(tmp_path, default_assets):
    with pytest.raises(DAPOConfigError) as refused:
        check_config(config_with_train_file(default_assets, default_assets["train_file"], "data.truncation=right"))
    assert "data.truncation=right" in str(refused.value)


def test_validate_command_counts_tokens_with_the_given_tokenizer(tmp_path, default_assets):
    path = long_prompt_file(tmp_path / "train.parquet", default_assets, {3: 50})
    command = [sys.executable, "-m", "recipe_dapo.data", "validate", str(path), "--tokenizer", default_assets["model_path"]]
    refused = subprocess.run([*command, "--max-prompt-length", "128"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert refused.returncode == 2
    assert f"{path}, row 3, field 'prompt': prompt is " in refused.stderr and "--max-prompt-length=128" in refused.stderr
    counted = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
    assert counted.returncode == 0 and "(longest: row 3)" in counted.stdout
