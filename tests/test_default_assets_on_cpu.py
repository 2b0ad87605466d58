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


def _tiny(tmp_path, **spec_fields):
    """A small chain-task build with the given warm-up settings (seconds, not the default run's minutes)."""
    from dataclasses import replace

    from recipe_dapo.cpu.assets import TinyModelSpec, build_default_assets

    spec = replace(TinyModelSpec(), warmup_check_every=5, warmup_check_problems=8, warmup_check_max_tokens=8,
                   **spec_fields)
    build_default_assets(tmp_path, None, num_train=16, num_val=4, spec=spec, task="chain", num_warmup=64)
    return json.loads((tmp_path / "manifest.json").read_text())


def test_the_warm_up_stops_at_the_first_check_that_reaches_its_sampled_accuracy_target(tmp_path):
    # A target of 0 is met at the first check; one above 1 never is, so the warm-up runs to its limit and says so.
    reached = _tiny(tmp_path / "reached", warmup_steps=20, warmup_target_acc=0.0)
    assert reached["warm_up"]["steps"] == 5 and reached["warm_up"]["sampled_accuracy"] is not None
    missed = _tiny(tmp_path / "missed", warmup_steps=12, warmup_target_acc=1.01)
    assert missed["warm_up"]["steps"] == 12 and missed["warm_up"]["sampled_accuracy"] <= 1.0
    assert len(reached["model_sha256"]) == 64 and reached["model_sha256"] != missed["model_sha256"]


def test_sampled_accuracy_scores_what_the_model_writes_with_the_recipes_verifier(tmp_path):
    # A model trained on nothing answers nothing right; the check itself is the run's measure (T=1, cut at a length).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipe_dapo.cpu.assets import prompt_ids, sampled_accuracy, synthetic_rows

    manifest = _tiny(tmp_path, warmup_steps=0)
    model_dir = manifest["paths"]["model_path"]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = synthetic_rows(8, "warmup_check", 0, "chain")
    assert sampled_accuracy(model, tokenizer, rows, 8, seed=0) == 0.0
    # positive control: the same check on a "model" that writes each row's worked answer line scores them all right
    answers = {tuple(prompt_ids(tokenizer, list(r["prompt"]))): r["reward_model"]["ground_truth"] for r in rows}

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def generate(self, input_ids, attention_mask, max_new_tokens, **_):
            out = []
            for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
                prompt = tuple(i for i, m in zip(ids, mask) if m)
                reply = tokenizer(f"Answer: {answers[prompt]}", add_special_tokens=False)["input_ids"]
                out.append(ids + reply[:max_new_tokens] + [tokenizer.pad_token_id] * (max_new_tokens - len(reply)))
            return torch.tensor(out)

    assert sampled_accuracy(Oracle(), tokenizer, rows, 8, seed=0) == 1.0
