"""Overlong filtering: exactly the truncated responses lose their loss and their token-mean weight."""

from __future__ import annotations

import logging

import pytest
import torch
from verl import DataProto
from verl.workers.config import ActorConfig, PolicyLossConfig

from recipe_dapo.loss.dapo import compute_policy_loss_dapo
from recipe_dapo.overlong import apply_overlong_filter, is_truncated
from recipe_dapo.overlong.metrics import FILTER_METRIC_NAMES as OVERLONG_FILTER_METRIC_NAMES

EOS = 2
IM_END = 3  # a second end-of-sequence id, as Qwen2.5 has <|im_end|> and <|endoftext|>
PAD = 0
BUDGET = 4  # responses are right-padded to the rollout's response_length
PROMPT_LEN = 2

# Five responses (real tokens before padding), in the layout verl's agent loop produces:
#  row  tokens          used budget?  ends in EOS?  truncated?
#   0   7 8 9 5         yes           no            yes
#   1   7 8 9 EOS       yes           yes           no   (finished on its last slot)
#   2   7 EOS           no            yes           no
#   3   7 8             no            no            no   (stopped early, e.g. by a stop string)
#   4   7 [6 6] 5       yes           no            yes  (multi-turn: the two 6s are tool output,
#                                                          real tokens but masked out of the loss)
#   5   7 8 9 IM_END    yes           yes           no
RESPONSES = [[7, 8, 9, 5], [7, 8, 9, EOS], [7, EOS, PAD, PAD], [7, 8, PAD, PAD], [7, 6, 6, 5], [7, 8, 9, IM_END]]
REAL_TOKENS = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
LOSS_TOKENS = [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 1], [1, 1, 1, 1]]
TRUNCATED_ROWS = [0, 4]


def training_batch(response_mask_from_attention: bool = False) -> DataProto:
    """A training batch as the trainer holds it after compute_advantage."""
    responses = torch.tensor(RESPONSES)
    real_tokens = torch.tensor(REAL_TOKENS)
    attention_mask = torch.cat([torch.ones(len(RESPONSES), PROMPT_LEN, dtype=torch.long), real_tokens], dim=1)
    # verl's compute_response_mask slices attention_mask: a view sharing its storage
    response_mask = attention_mask[:, -BUDGET:] if response_mask_from_attention else torch.tensor(LOSS_TOKENS)
    advantages = torch.arange(len(RESPONSES), dtype=torch.float32).unsqueeze(-1).expand(-1, BUDGET).clone()
    return DataProto.from_dict(
        tensors={
            "responses": responses,
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "advantages": advantages,
        }
    )


def test_overlong_filter_zeroes_exactly_the_truncated_responses():
    batch = training_batch()
    apply_overlong_filter(batch, stop_ids=[EOS, IM_END])

    expected = torch.tensor(LOSS_TOKENS)
    expected[TRUNCATED_ROWS] = 0
    assert torch.equal(batch.batch["response_mask"], expected)


def test_overlong_filter_reports_the_filtered_share_of_responses_and_tokens():
    batch = training_batch()
    metrics = apply_overlong_filter(batch, stop_ids=[EOS, IM_END])

    assert set(metrics) == set(OVERLONG_FILTER_METRIC_NAMES)
    # 2 of 6 responses; loss tokens per row are 4, 4, 2, 2, 2, 4 = 18, of which rows 0 and 4 hold 4 + 2 = 6
    assert metrics["overlong/filtered_ratio"] == pytest.approx(2 / 6)
    assert metrics["overlong/filtered_count"] == 2.0
    assert metrics["overlong/filtered_token_ratio"] == pytest.approx(6 / 18)


def test_overlong_filter_keeps_advantages_so_truncated_responses_still_count_in_their_group():
    batch = training_batch()
    advantages_before = batch.batch["advantages"].clone()
    apply_overlong_filter(batch, stop_ids=[EOS, IM_END])
    assert torch.equal(batch.batch["advantages"], advantages_before)


def test_overlong_filter_never_writes_into_attention_mask_through_a_response_mask_view():
    batch = training_batch(response_mask_from_attention=True)
    attention_before = batch.batch["attention_mask"].clone()
    original_mask = batch.batch["response_mask"]
    apply_overlong_filter(batch, stop_ids=[EOS, IM_END])

    assert torch.equal(batch.batch["attention_mask"], attention_before)
    # the caller's handle on the unfiltered mask stays valid, so it can be restored for metrics
    assert torch.equal(original_mask, attention_before[:, -BUDGET:])
    assert batch.batch["response_mask"][TRUNCATED_ROWS].sum() == 0


def test_only_eos_ids_passed_in_count_as_an_end_of_sequence():
    # With only EOS listed, row 5 (ends in IM_END on its last slot) is truncated too.
    batch = training_batch()
    metrics = apply_overlong_filter(batch, stop_ids=[EOS])
    assert metrics["overlong/filtered_count"] == 3.0
    assert batch.batch["response_mask"][5].sum() == 0


def test_a_single_eos_id_may_be_passed_as_an_int():
    # tokenizer.eos_token_id is an int; same result as the list [EOS] above (rows 0, 4 and 5).
    assert apply_overlong_filter(training_batch(), stop_ids=EOS)["overlong/filtered_count"] == 3.0


def test_a_response_width_other_than_the_budget_is_refused():
    with pytest.raises(ValueError, match="response_length"):
        apply_overlong_filter(training_batch(), stop_ids=[EOS], max_response_length=BUDGET + 1)


def test_a_batch_without_response_mask_is_refused_with_where_to_call_the_filter():
    batch = training_batch()
    batch.batch.pop("response_mask")
    with pytest.raises(KeyError, match="compute_advantage"):
        apply_overlong_filter(batch, stop_ids=[EOS])


def test_an_all_truncated_batch_is_filtered_and_warned_about(caplog):
    batch = training_batch()
    batch = batch.select_idxs([0, 4])
    with caplog.at_level(logging.WARNING, logger="recipe_dapo.overlong.filter"):
        metrics = apply_overlong_filter(batch, stop_ids=[EOS, IM_END])
    assert metrics["overlong/filtered_ratio"] == 1.0
    assert "all 2 responses" in caplog.text


def test_filtered_responses_leave_both_the_loss_and_the_token_mean_denominator():
    # verl's actor sets loss_mask = response_mask and batch_num_tokens = loss_mask.sum(), so after
    # filtering the dapo token-mean must equal the token-mean over the kept responses alone.
    # Ratio 1 (inside the band) makes each token loss -A = -row index, so over kept rows 1, 2, 3, 5
    # with 4, 2, 2, 4 loss tokens: (-(1*4) - (2*2) - (3*2) - (5*4)) / 12 = -34 / 12.
    batch = training_batch()
    apply_overlong_filter(batch, stop_ids=[EOS, IM_END])
    response_mask = batch.batch["response_mask"].bool()
    advantages = batch.batch["advantages"].double()
    log_prob = torch.zeros(response_mask.shape, dtype=torch.float64, requires_grad=True)
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode="dapo")
    )
    config.global_batch_info.update(dp_size=1, batch_num_tokens=int(response_mask.sum()), global_batch_size=None)
    loss, _ = compute_policy_loss_dapo(
        old_log_prob=torch.zeros_like(log_prob),
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode="token-mean",
        config=config,
    )
    loss.backward()

    assert loss.item() == pytest.approx(-34 / 12, abs=1e-12)
    assert torch.all(log_prob.grad[TRUNCATED_ROWS] == 0.0)
    assert torch.all(log_prob.grad[[1, 2, 3, 5]][response_mask[[1, 2, 3, 5]]] != 0.0)


def test_the_filter_uses_the_reward_managers_truncated_column_when_the_batch_has_one():
    """One truncation rule: the manager decides per response; the filter takes its answer, not a second opinion."""
    import numpy as np

    batch = training_batch()
    lengths = [sum(row) for row in REAL_TOKENS]
    lasts = [row[-1] for row in RESPONSES]
    column = np.array([is_truncated(n, last, BUDGET, {EOS, IM_END}) for n, last in zip(lengths, lasts)])
    assert np.flatnonzero(column).tolist() == TRUNCATED_ROWS  # the rule per response agrees with the tensor rule
    batch.non_tensor_batch["truncated"] = column
    batch.non_tensor_batch["truncated"][3] = True  # the manager's word wins: row 3 is filtered now
    apply_overlong_filter(batch, stop_ids=[EOS, IM_END])
    assert batch.batch["response_mask"][[0, 3, 4]].sum() == 0 and batch.batch["response_mask"][[1, 2, 5]].sum() > 0


def test_a_new_length_shaping_is_one_function_and_its_registration(monkeypatch):
    from omegaconf import OmegaConf

    from recipe_dapo.overlong import SHAPINGS, get_shaping, register_shaping
    from recipe_dapo.reward.settings import RewardSettings

    monkeypatch.setattr("recipe_dapo.overlong.shaping.SHAPINGS", dict(SHAPINGS))
    import recipe_dapo.overlong.shaping as shaping

    @shaping.register_shaping("hard_cutoff")
    def hard_cutoff(length, max_resp_len, buffer_len, penalty_factor=1.0):
        return -penalty_factor if length > max_resp_len - buffer_len else 0.0

    config = OmegaConf.create(
        {
            "data": {"max_response_length": 16},
            "actor_rollout_ref": {"rollout": {"response_length": 16}},
            "reward": {"reward_kwargs": {"overlong_buffer_cfg": {"enable": True, "len": 4, "shape": "hard_cutoff"}}},
        }
    )
    settings = RewardSettings.from_config(config)
    assert shaping.get_shaping(settings.overlong_shape)(13, 16, 4, 1.0) == -1.0
    config.reward.reward_kwargs.overlong_buffer_cfg.shape = "nope"
    with pytest.raises(ValueError, match="overlong_buffer_cfg.shape='nope'.*hard_cutoff"):
        RewardSettings.from_config(config)
    assert get_shaping is not None and register_shaping is not None
