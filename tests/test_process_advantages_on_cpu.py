"""Process-supervised advantages (DeepSeekMath section 4.1.3): the pure function against a per-step reference on a
hand-made group, its degenerate cases, its entry in verl's advantage-estimator registry called through verl's own
``compute_advantage`` on a ``DataProto``, and the chain-arithmetic step scorer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, compute_grpo_outcome_advantage
from verl.trainer.ppo.ray_trainer import compute_advantage

from recipe_dapo.advantages.estimator import compute_grpo_process_advantage
from recipe_dapo.advantages.process import EPS, process_advantages
from recipe_dapo.advantages.steps import step_tensors, token_steps
from recipe_dapo.cpu.chain_task import ChainProblem, score_response, score_steps, solution


def hand_group():
    """Two groups. Group a: row 0 has steps ending at tokens 1 and 3 (rewards 1, 0.5); row 1 one step at token 2
    (reward -1), then padding. Group b: row 2, steps at tokens 0 and 4 (rewards 2, 4)."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    ends = torch.zeros(3, 5, dtype=torch.bool)
    rewards = torch.zeros(3, 5, dtype=torch.float64)
    for row, token, reward in [(0, 1, 1.0), (0, 3, 0.5), (1, 2, -1.0), (2, 0, 2.0), (2, 4, 4.0)]:
        ends[row, token], rewards[row, token] = True, reward
    return rewards, ends, mask, np.array(["a", "a", "b"], dtype=object)


def reference(rewards, ends, mask, index, norm_by_std=True):
    """The paper's formula, one token at a time: r~ = (r - mean_G) / (std_G + eps); A_t = sum of r~ over steps j of
    the response with end(j) >= t."""
    out = torch.zeros_like(rewards)
    for row in range(rewards.shape[0]):
        group_rows = [other for other in range(rewards.shape[0]) if index[other] == index[row]]
        values = torch.tensor([float(rewards[g, t]) for g in group_rows for t in range(rewards.shape[1]) if ends[g, t]],
                              dtype=torch.float64)
        if len(values) < 2:
            continue
        for t in range(rewards.shape[1]):
            if not mask[row, t]:
                continue
            total = 0.0
            for end in range(t, rewards.shape[1]):
                if ends[row, end]:
                    centred = float(rewards[row, end]) - float(values.mean())
                    total += centred / (float(values.std()) + EPS) if norm_by_std else centred
            out[row, t] = total
    return out


def test_process_advantages_match_the_papers_formula_on_a_hand_made_case():
    rewards, ends, mask, index = hand_group()
    advantages = process_advantages(rewards, ends, mask, index)
    assert torch.allclose(advantages, reference(rewards, ends, mask, index), atol=1e-9)
    # by hand, group a: steps 1, 0.5, -1: mean 1/6, std sqrt(((5/6)^2 + (1/3)^2 + (7/6)^2) / 2) = sqrt(13/12)
    std = (13 / 12) ** 0.5
    first, second, third = (1 - 1 / 6) / std, (0.5 - 1 / 6) / std, (-1 - 1 / 6) / std
    expected_row0 = [first + second, first + second, second, second, 0.0]  # token 4 follows the last step end
    assert advantages[0].tolist() == pytest.approx(expected_row0, rel=1e-5)
    assert advantages[1].tolist() == pytest.approx([third, third, third, 0.0, 0.0], rel=1e-5)
    # group b: two steps 2, 4: mean 3, std sqrt(2): each normalised to -+1/sqrt(2)
    assert advantages[2, 0].item() == pytest.approx(0.0, abs=1e-5)  # -1/sqrt2 + 1/sqrt2
    assert advantages[2, 1:].tolist() == pytest.approx([2 ** -0.5] * 4, rel=1e-5)


def test_without_std_normalisation_the_steps_are_only_centred():
    rewards, ends, mask, index = hand_group()
    advantages = process_advantages(rewards, ends, mask, index, norm_by_std=False)
    assert torch.allclose(advantages, reference(rewards, ends, mask, index, norm_by_std=False), atol=1e-12)
    assert advantages[2, 1].item() == pytest.approx(1.0)


def test_a_response_with_no_step_gets_zero_advantage_and_leaves_its_group_unchanged():
    rewards, ends, mask, index = hand_group()
    with_empty = (torch.cat([rewards, torch.zeros(1, 5, dtype=torch.float64)]),
                  torch.cat([ends, torch.zeros(1, 5, dtype=torch.bool)]),
                  torch.cat([mask, torch.ones(1, 5, dtype=torch.bool)]), np.append(index, "a"))
    advantages = process_advantages(*with_empty)
    assert torch.all(advantages[3] == 0)
    assert torch.allclose(advantages[:3], process_advantages(rewards, ends, mask, index))


def test_a_group_whose_step_rewards_all_agree_gets_zero_advantage():
    rewards, ends, mask, index = hand_group()
    rewards = torch.where(ends, torch.ones_like(rewards), rewards)
    advantages = process_advantages(rewards, ends, mask, index)
    assert torch.all(advantages == 0)
    # positive control: one disagreeing step makes the same group's advantages non-zero
    rewards[0, 1] = 0.0 + 2.0
    assert process_advantages(rewards, ends, mask, index)[:2].abs().sum() > 0.5


def test_truncated_tokens_after_the_last_step_end_get_zero_and_a_step_end_in_padding_is_refused():
    rewards, ends, mask, index = hand_group()
    advantages = process_advantages(rewards, ends, mask, index)
    assert advantages[0, 4] == 0  # row 0 was cut after its last step ended at token 3
    assert torch.all(advantages[1, 3:] == 0)  # padding
    ends[1, 4] = True
    with pytest.raises(ValueError, match="row 1 has a step end at token 4, outside its response_mask"):
        process_advantages(rewards, ends, mask, index)


def test_grpo_process_is_in_verls_registry_and_runs_through_verls_compute_advantage():
    assert ADV_ESTIMATOR_REGISTRY["grpo_process"] is compute_grpo_process_advantage
    rewards, ends, mask, index = hand_group()
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards.float(), "response_mask": mask.long(),
                 "responses": torch.zeros(3, 5, dtype=torch.long)},
        non_tensors={"uid": index},
    )
    out = compute_advantage(data, adv_estimator="grpo_process", num_repeat=2, config={"norm_adv_by_std_in_grpo": True})
    assert torch.allclose(out.batch["advantages"].double(), reference(rewards, ends, mask, index), atol=1e-5)


def test_with_outcome_rewards_only_grpo_process_gives_grpos_outcome_advantages():
    # verl's reward managers put each response's score at its last valid token: one step per response.
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    scores = torch.tensor([1.0, -1.0, 1.0, 0.5])
    rewards = torch.zeros(4, 4)
    rewards[torch.arange(4), mask.sum(-1) - 1] = scores
    index = np.array(["p", "p", "p", "p"], dtype=object)
    process, _ = compute_grpo_process_advantage(rewards, mask, index=index, config={"norm_adv_by_std_in_grpo": True})
    outcome, _ = compute_grpo_outcome_advantage(rewards, mask, index=index, norm_adv_by_std_in_grpo=True)
    assert torch.allclose(process, outcome, atol=1e-5)
    assert outcome.abs().max() > 0.5


def test_the_chain_scorer_checks_each_lines_operation():
    problem = ChainProblem((4, 5, 2, 3), ("+", "-", "+"))
    right = solution(problem, "concise")  # 4+5-2+3 / =9-2+3 / =7+3 / =10 / Answer: 10
    assert [reward for _, reward in score_steps(problem, right)] == [1, 1, 1, 1, 1]
    assert [right[end] for end, _ in score_steps(problem, right)] == ["3", "3", "3", "0", "0"]  # each line's end
    slipped = "4+5-2+3\n=9-2+3\n=8+3\n=11\nAnswer: 11"  # one slip: the next line follows it correctly
    assert [reward for _, reward in score_steps(problem, slipped)] == [1, 1, -1, 1, -1]
    verbose = solution(problem, "verbose")  # "Step i:" prefixes, and a closing sentence that is no step
    assert [reward for _, reward in score_steps(problem, verbose)] == [1, 1, 1, 1, 1]
    assert [reward for _, reward in score_steps(problem, "4+5-2+3\n=9-")] == [1, -1]  # cut off mid-line


def test_the_chain_rule_scorer_reads_the_problem_from_the_prompt_and_refuses_another_task():
    prompt = "<|im_start|>user\nCompute 4+5-2+3.<|im_end|>\n<|im_start|>assistant\n"
    assert [reward for _, reward in score_response(prompt, "4+5-2+3\n=9-2+3")] == [1, 1]
    with pytest.raises(ValueError, match="no chain-arithmetic problem"):
        score_response("What is 2+2?", "4")


def test_steps_land_on_the_tokens_that_hold_their_last_characters():
    tokens = ["4", "+5", "-2", "\n=", "9", "-2\n", "Ans", "wer: 9"]  # "4+5-2\n=9-2\nAnswer: 9"
    text = "".join(tokens)
    steps = [(text.index("\n") - 1, 1.0), (text.index("\nA") - 1, -1.0), (len(text) - 1, 1.0)]
    assert token_steps(tokens, steps) == [(2, 1.0), (5, -1.0), (7, 1.0)]
    rewards, ends = step_tensors([token_steps(tokens, steps)], 10)
    assert ends[0].nonzero().flatten().tolist() == [2, 5, 7]
    assert rewards[0, 5] == -1.0
    with pytest.raises(ValueError, match="row 0: a step ends at token 7, outside the response"):
        step_tensors([token_steps(tokens, steps)], 6)


def chain_batch(tokenizer, problem, responses, width=48):
    """A DataProto as the classic trainer holds it before its advantages: left-padded prompts, right-padded
    responses, outcome scores at the last token (token_level_rewards), one uid for the group."""
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": problem.text}], add_generation_prompt=True,
                                               tokenize=False)
    prompt_ids = tokenizer.encode(prompt_ids)
    prompt_width = len(prompt_ids) + 2
    rows = len(responses)
    prompts = torch.full((rows, prompt_width), tokenizer.pad_token_id)
    prompts[:, -len(prompt_ids):] = torch.tensor(prompt_ids)
    response_ids = torch.full((rows, width), tokenizer.pad_token_id)
    attention = torch.zeros(rows, prompt_width + width, dtype=torch.long)
    attention[:, prompt_width - len(prompt_ids): prompt_width] = 1
    for row, text in enumerate(responses):
        ids = tokenizer.encode(text) + [tokenizer.eos_token_id]  # a finished response ends with EOS, as generated
        response_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, prompt_width: prompt_width + len(ids)] = 1
    response_mask = attention[:, prompt_width:].clone()
    scores = torch.zeros(rows, width)
    scores[torch.arange(rows), response_mask.sum(-1) - 1] = 1.0
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": response_ids, "attention_mask": attention,
                 "response_mask": response_mask, "token_level_rewards": scores},
        non_tensors={"uid": np.array(["g"] * rows, dtype=object)},
    )


def test_the_trainer_hook_scores_chain_steps_on_their_last_tokens_and_verl_turns_them_into_process_advantages():
    from transformers import AutoTokenizer

    from conftest import REPO_ROOT
    from recipe_dapo.trainers.process_steps import write_step_rewards

    tokenizer = AutoTokenizer.from_pretrained(str(REPO_ROOT.parent / "shared" / "data" / "qwen2.5-tokenizer"))
    problem = ChainProblem((4, 5, 2, 3), ("+", "-", "+"))
    responses = [solution(problem, "concise"), "4+5-2+3\n=9-2+3\n=8+3\n=11\nAnswer: 11", "4+5-2+3\n=9-"]
    batch = chain_batch(tokenizer, problem, responses)
    metrics = write_step_rewards(batch, tokenizer, "chain_rule")

    rewards = batch.batch["token_level_rewards"]
    for row, text in enumerate(responses):
        ends = rewards[row].nonzero().flatten().tolist()
        # each step's reward sits on the token that ends the line (the token decoding to the line's last character)
        lines_ends = [end for end, _ in score_steps(problem, text)]
        decoded = [tokenizer.decode(batch.batch["responses"][row, : token + 1].tolist()) for token in ends]
        assert [len(prefix) - 1 for prefix in decoded] == lines_ends, row
        assert rewards[row, ends].tolist() == [reward for _, reward in score_steps(problem, text)]
    assert metrics["process/steps_per_response_mean"] == pytest.approx((5 + 5 + 2) / 3)
    assert metrics["process/step_right_fraction"] == pytest.approx(9 / 12)

    out = compute_advantage(batch, adv_estimator="grpo_process", num_repeat=3, config={"norm_adv_by_std_in_grpo": True})
    mask = batch.batch["response_mask"].bool()
    expected = process_advantages(rewards, rewards != 0, mask, batch.non_tensor_batch["uid"])
    assert torch.allclose(out.batch["advantages"], expected)
    # the all-right response is credited above the one that slipped, on every token before the slip's line ends
    assert torch.all(out.batch["advantages"][0, :5] > out.batch["advantages"][1, :5])
