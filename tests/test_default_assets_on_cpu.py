"""The default run's inputs: DAPO-format rows the verifier scores, a chat tokenizer, a vLLM-CPU-shaped model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def test_synthetic_rows_are_valid_verl_rl_rows_whose_worked_solution_scores_correct(default_assets):
    from recipe_dapo.data.validation import validate_rl_parquet
    from recipe_dapo.default_assets import arithmetic_problem_from_row, worked_solution
    from recipe_dapo.reward import compute_score

    assert validate_rl_parquet(default_assets["train_file"]) == 512
    rows = pd.read_parquet(default_assets["train_file"]).to_dict("records")
    for row in rows[:20]:
        problem, answer = arithmetic_problem_from_row(row)
        # eval of "a op b" is the ground truth the row carries.
        assert eval(problem.removeprefix("What is ").removesuffix("?")) == answer  # noqa: S307
        result = compute_score(row["data_source"], worked_solution(problem, answer), row["reward_model"]["ground_truth"])
        assert result["acc"] is True and result["score"] == 1.0


def test_tokenizer_has_chat_template_and_eos_the_model_stops_on(default_assets):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_assets["model_path"])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    config = AutoConfig.from_pretrained(default_assets["model_path"])
    assert config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # vLLM-CPU's attention rejects head_dim 16.
    assert config.hidden_size // config.num_attention_heads >= 32


def test_existing_assets_are_reused_not_rebuilt(default_assets):
    from recipe_dapo.default_assets import build_default_assets

    out = Path(default_assets["model_path"]).parent
    weights = out / "model" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_default_assets(out) == default_assets
    assert weights.stat().st_mtime_ns == before
    assert json.loads((out / "manifest.json").read_text())["paths"] == default_assets
