"""Dynamic sampling (DAPO section 3.2): group statistics, keep decision, carry-over buffer, round
sizing, exhaustion policy, per-step metrics, config validation, prompt stream and state_dict resume.

Payloads are real verl ``DataProto``s (through ``DATAPROTO_OPS``) so that what the trainer will pass is what
is tested; each row carries a ``rollout_log_probs`` tensor that must come out untouched.
"""

from __future__ import annotations

import io
import logging
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.config import FilterGroupsConfig

from recipe_dapo.dynamic_sampling import (
    DATAPROTO_OPS,
    DynamicSampler,
    DynamicSamplingConfig,
    DynamicSamplingExhausted,
    DynamicSamplingStalled,
    KeepRateEstimate,
    PromptStream,
    ScoredRound,
    collect_step,
    group_statistics,
    next_round_prompts,
    trajectory_metric,
)

P = "dynamic_sampling/"


# ----------------------------------------------------------------------------- helpers


def make_config(train_batch_size=2, gen_batch_size=None, filter_groups=None, **own) -> DynamicSamplingConfig:
    filter_groups = {"enable": True, "metric": "acc", "max_num_gen_batches": 0, **(filter_groups or {})}
    return DynamicSamplingConfig.from_config(
        filter_groups, own, train_batch_size=train_batch_size, gen_batch_size=gen_batch_size
    )


def make_round(groups: dict[str, list[float]]) -> tuple[DataProto, np.ndarray, np.ndarray]:
    """A round as verl lays it out: each uid's responses in adjacent rows. The rollout log-prob of a row is
    a recognisable function of its uid and position, so the tests can check that rows travel whole."""
    uids = np.array([uid for uid, values in groups.items() for _ in values], dtype=object)
    acc = np.array([value for values in groups.values() for value in values], dtype=np.float64)
    log_probs = torch.tensor([[-float(hash(uid) % 1000) - i / 10] for uid, v in groups.items() for i in range(len(v))])
    batch = DataProto.from_dict(tensors={"rollout_log_probs": log_probs}, non_tensors={"uid": uids.copy()})
    return batch, uids, acc


def uids_of(batch: DataProto) -> list[str]:
    return batch.non_tensor_batch["uid"].tolist()


def run_step(sampler: DynamicSampler, step: int, rounds: list[dict[str, list[float]]], tokens: list[int] = ()):
    """One training step of the given rounds; ``tokens`` holds each round's generated response tokens."""
    sampler.begin_step(step)
    for index, groups in enumerate(rounds):
        batch, uids, acc = make_round(groups)
        sampler.add_round(batch, group_ids=uids, metric_values=acc,
                          generated_tokens=tokens[index] if tokens else 0)
    return sampler.take_training_batch()


MIXED = [1.0, 0.0]
ALL_RIGHT = [1.0, 1.0]
ALL_WRONG = [0.0, 0.0]


# ----------------------------------------------------------------------------- group statistics


def test_groups_whose_responses_all_score_the_same_are_dropped_and_classified():
    # acc per group: a = (1,0,1) varies -> kept; b = (1,1,1) solved by all; c = (0,0,0) solved by none.
    stats = group_statistics(list("aaabbbccc"), [1, 0, 1, 1, 1, 1, 0, 0, 0])
    assert stats.group_ids.tolist() == ["a", "b", "c"]
    assert stats.keep.tolist() == [True, False, False]
    assert stats.solve_all.tolist() == [False, True, False]
    assert stats.solve_none.tolist() == [False, False, True]
    np.testing.assert_allclose(stats.mean, [2 / 3, 1.0, 0.0])
    assert stats.metric_sum == 5.0  # 2 + 3 + 0 correct responses


def test_single_response_group_is_kept_and_is_neither_solved_nor_unsolved():
    stats = group_statistics(["solo", "pair", "pair"], [1.0, 0.0, 0.0])
    assert stats.keep.tolist() == [True, False]
    assert stats.solve_all.tolist() == [False, False]
    assert stats.solve_none.tolist() == [False, True]


def test_values_equal_up_to_float_noise_are_a_tie_but_real_differences_are_kept():
    # 0.1 + 0.2 = 0.30000000000000004: a spread of 5.6e-17, far below the 1e-6 tolerance -> dropped.
    # An overlong penalty of 1e-3 on one response is a real difference -> kept.
    stats = group_statistics(["tie", "tie", "real", "real"], [0.1 + 0.2, 0.3, 0.3, 0.3 + 1e-3])
    assert stats.keep.tolist() == [False, True]


def test_score_metric_of_plus_and_minus_one_classifies_solve_all_and_solve_none():
    # DAPO's score: +1 right, -1 wrong, plus a non-positive overlong penalty.
    stats = group_statistics(list("aabbcc"), [1.0, 1.0, -1.0, -1.0, -1.0, -1.5])
    assert stats.solve_all.tolist() == [True, False, False]
    assert stats.solve_none.tolist() == [False, True, False]
    assert stats.keep.tolist() == [False, False, True]  # two wrong answers, one also overlong: a signal


def test_boolean_acc_reads_as_zero_and_one():
    stats = group_statistics(np.array([7, 7, 9, 9]), np.array([True, True, True, False]))
    assert stats.keep.tolist() == [False, True]
    assert stats.solve_all.tolist() == [True, False]


def test_interleaved_rows_come_out_grouped_in_first_appearance_order():
    # Rows: 0:a 1:b 2:a 3:c 4:b -> groups a (rows 0, 2), b (1, 4), c (3).
    stats = group_statistics(["a", "b", "a", "c", "b"], [1, 0, 0, 1, 1])
    assert stats.group_ids.tolist() == ["a", "b", "c"]
    rows, offsets = stats.rows_of(stats.keep)
    assert rows.tolist() == [0, 2, 1, 4, 3]
    assert offsets.tolist() == [0, 2, 4, 5]


class CollidingId:
    """An id whose hash collides with every other, to exercise the sort fallback of the grouping."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return self.name == other.name

    def __ne__(self, other):
        return self.name != other.name

    def __lt__(self, other):
        return self.name < other.name


def test_ids_with_colliding_hashes_are_still_grouped_correctly():
    ids = np.empty(6, dtype=object)
    ids[:] = [CollidingId(name) for name in "xyxzyx"]
    stats = group_statistics(ids, [1, 1, 0, 1, 1, 1])
    assert [group.name for group in stats.group_ids] == ["x", "y", "z"]
    assert stats.sizes.tolist() == [3, 2, 1]
    assert stats.keep.tolist() == [True, False, True]  # x: (1, 0, 1); y: (1, 1); z: single
    assert stats.order.tolist() == [0, 2, 5, 1, 4, 3]


def test_disabled_filter_keeps_every_group_but_still_counts_solved_ones():
    stats = group_statistics(list("aabb"), [1, 1, 0, 1], filter_enabled=False)
    assert stats.keep.tolist() == [True, True]
    assert stats.solve_all.tolist() == [True, False]


def test_non_finite_metric_is_refused_naming_the_metric_and_the_row():
    with pytest.raises(ValueError, match=r"'acc' is not finite at trajectory rows \[2\]"):
        group_statistics(list("aabb"), [1.0, 0.0, float("nan"), 1.0], metric_name="acc")


def test_trajectory_metric_reads_verl_tensors_and_reward_extra_info():
    batch = DataProto.from_dict(
        tensors={
            "token_level_scores": torch.tensor([[0.0, 1.0], [0.0, -1.0]]),
            "token_level_rewards": torch.tensor([[0.5, 1.0], [0.0, -1.0]]),
            "rm_scores": torch.tensor([[0.0, 2.0], [0.0, -2.0]]),
        },
        non_tensors={"acc": np.array([True, False], dtype=object), "uid": np.array(["u", "u"], dtype=object)},
    )
    tensors, extras = batch.batch, batch.non_tensor_batch
    assert trajectory_metric("seq_reward", tensors, extras).tolist() == [1.0, -1.0]  # row sums of scores
    assert trajectory_metric("seq_final_reward", tensors, extras).tolist() == [1.5, -1.0]
    assert trajectory_metric("reward", tensors, extras).tolist() == [2.0, -2.0]  # verl 0.9.1: rm_scores first
    assert trajectory_metric("acc", tensors, extras).tolist() == [1.0, 0.0]
    with pytest.raises(KeyError, match="algorithm.filter_groups.metric='pass'"):
        trajectory_metric("pass", tensors, extras)


# ----------------------------------------------------------------------------- buffer and batch assembly


def test_surplus_groups_are_carried_over_and_trained_first_with_their_tensors():
    sampler = DynamicSampler(make_config(train_batch_size=2), DATAPROTO_OPS)
    first_round = {"s1a": MIXED, "s1b": MIXED, "s1c": [0.0, 1.0]}
    expected_log_probs = make_round(first_round)[0].batch["rollout_log_probs"]
    batch, metrics = run_step(sampler, 1, [first_round])
    assert uids_of(batch) == ["s1a", "s1a", "s1b", "s1b"]
    assert metrics[P + "carried_out_groups"] == 1.0

    batch, metrics = run_step(sampler, 2, [{"s2a": MIXED, "s2b": ALL_RIGHT, "s2c": MIXED}])
    assert uids_of(batch) == ["s1c", "s1c", "s2a", "s2a"]  # the older group first
    assert torch.equal(batch.batch["rollout_log_probs"][:2], expected_log_probs[4:6])  # untouched, in order
    assert metrics[P + "carried_in_groups"] == 1.0
    assert metrics[P + "carried_out_groups"] == 1.0  # s2c
    assert metrics[P + "mean_staleness"] == 0.5  # one group one step old, one fresh


def test_groups_older_than_max_staleness_are_dropped_and_counted():
    sampler = DynamicSampler(make_config(train_batch_size=1, max_staleness=1), DATAPROTO_OPS)
    run_step(sampler, 1, [{"a": MIXED, "b": MIXED, "c": MIXED}])  # trains a; b, c pooled (born 1)
    batch, metrics = run_step(sampler, 2, [])  # full from the pool: trains b, one step old
    assert uids_of(batch) == ["b", "b"] and metrics[P + "num_gen_rounds"] == 0.0
    # c was born at step 1 and could train at step 3 only 2 > max_staleness steps old: it leaves as step 2 closes,
    # so the pool step 2 carries out is what step 3 may train.
    assert metrics[P + "dropped_stale_groups"] == 1.0 and metrics[P + "carried_out_groups"] == 0.0
    assert sampler.pooled_groups == 0 and sampler.take_dropped_group_ids().tolist() == ["c"]
    _, metrics = run_step(sampler, 3, [{"d": MIXED}])
    assert metrics[P + "dropped_stale_groups"] == 0.0 and sampler.run_counters()["dropped_stale_groups"] == 1


def test_max_staleness_zero_discards_the_surplus_as_the_paper_does():
    sampler = DynamicSampler(make_config(train_batch_size=1, max_staleness=0), DATAPROTO_OPS)
    run_step(sampler, 1, [{"a": MIXED, "b": MIXED}])
    sampler.begin_step(2)
    assert sampler.pooled_groups == 0 and not sampler.is_full()


def test_training_batch_holds_exactly_train_batch_size_whole_groups():
    sampler = DynamicSampler(make_config(train_batch_size=3), DATAPROTO_OPS)
    # Groups of different sizes (a failed response, a single one): counted as groups, kept whole.
    batch, _ = run_step(sampler, 1, [{"a": [1, 0, 0], "b": [1], "c": ALL_WRONG, "d": [0, 1, 1, 1], "e": MIXED}])
    assert uids_of(batch) == ["a", "a", "a", "b", "d", "d", "d", "d"]
    assert sampler.pooled_groups == 1


def test_a_uid_already_pooled_is_refused():
    sampler = DynamicSampler(make_config(train_batch_size=4), DATAPROTO_OPS)
    sampler.begin_step(1)
    sampler.add_round(*make_round({"a": MIXED}))
    with pytest.raises(ValueError, match="fresh uid"):
        sampler.add_round(*make_round({"a": MIXED}))


# ----------------------------------------------------------------------------- round sizing


def test_deficit_round_is_missing_times_margin_over_keep_rate_then_bounded():
    config = make_config(train_batch_size=512, gen_batch_size=1536, safety_margin=0.1, prompt_granularity=8)
    # ceil(512 * 1.1 / 0.5) = ceil(1126.4) = 1127, rounded up to a multiple of 8 -> 1128.
    assert next_round_prompts(config, 512, 0.5, 0) == 1128
    # 10 missing: ceil(10 * 1.1 / 0.5) = 22, raised to min_round = ceil(512 / 4) = 128.
    assert next_round_prompts(config, 10, 0.5, 0) == 128
    # keep rate 0.1: 5632 prompts wanted, capped at max_round = gen_batch_size = 1536.
    assert next_round_prompts(config, 512, 0.1, 0) == 1536
    assert next_round_prompts(config, 0, 0.5, 0) == 0


def test_whole_rounds_and_the_prompt_budget_of_max_num_gen_batches():
    config = make_config(
        train_batch_size=64, gen_batch_size=100, filter_groups={"max_num_gen_batches": 2}, round_sizing="whole"
    )
    assert next_round_prompts(config, 1, 0.9, 0) == 100  # whole rounds whatever is missing
    assert next_round_prompts(config, 1, 0.9, 150) == 50  # budget 2 x 100: 50 prompts left
    assert next_round_prompts(config, 1, 0.9, 200) == 0  # spent


def test_keep_rate_estimate_is_decayed_counts_shrunk_toward_the_prior():
    estimate = KeepRateEstimate(prior=0.5)
    assert estimate.value == 0.5  # (0 + 0.5 * 1) / (0 + 1)
    estimate.observe(30, 100)
    assert estimate.value == pytest.approx(30.5 / 101)
    estimate.start_step(0.5)  # K = 15, G = 50
    estimate.observe(80, 100)  # K = 95, G = 150
    assert estimate.value == pytest.approx(95.5 / 151)


def test_first_round_is_sized_from_the_prior_and_later_rounds_from_observed_keep_rate():
    sampler = DynamicSampler(make_config(train_batch_size=100, gen_batch_size=400, keep_rate_prior=0.5))
    sampler.begin_step(1)
    assert sampler.prompts_for_next_round() == 220  # ceil(100 * 1.1 / 0.5)
    # 220 groups of 2 rows, 55 of them varied (keep rate 0.25): the estimate becomes (55 + 0.5) / 221.
    uids = np.repeat(np.arange(220), 2)
    acc = np.zeros(440)
    acc[0:110:2] = 1.0  # the first response of groups 0..54 is right
    sampler.add_round(uids, uids, acc)
    assert sampler.keep_rate_estimate == pytest.approx(55.5 / 221)
    # 45 missing: ceil(45 * 1.1 / 0.25113) = ceil(197.1) = 198.
    assert sampler.prompts_for_next_round() == math.ceil(45 * 1.1 / (55.5 / 221))


# ----------------------------------------------------------------------------- exhaustion policy


def exhausting_config(on_exhausted: str) -> DynamicSamplingConfig:
    return make_config(
        train_batch_size=4, gen_batch_size=4, filter_groups={"max_num_gen_batches": 1}, on_exhausted=on_exhausted
    )


def test_train_partial_trains_on_what_was_collected_warns_once_and_counts(caplog):
    sampler = DynamicSampler(exhausting_config("train_partial"), DATAPROTO_OPS)
    with caplog.at_level(logging.WARNING, logger="recipe_dapo.dynamic_sampling.sampler"):
        for step in (1, 2):
            sampler.begin_step(step)
            assert sampler.prompts_for_next_round() == 4
            sampler.add_round(*make_round({f"{step}a": MIXED, f"{step}b": ALL_RIGHT, f"{step}c": ALL_WRONG,
                                           f"{step}d": ALL_RIGHT}))
            assert sampler.out_of_rounds() and not sampler.needs_more_rounds()
            batch, metrics = sampler.take_training_batch()
            assert uids_of(batch) == [f"{step}a", f"{step}a"]
            assert metrics[P + "partial_batch"] == 1.0
    assert metrics[P + "partial_steps"] == 2.0
    assert sum("train_partial" in record.message for record in caplog.records) == 1


def test_raise_policy_names_the_budget_key():
    sampler = DynamicSampler(exhausting_config("raise"), DATAPROTO_OPS)
    sampler.begin_step(1)
    sampler.add_round(*make_round({"a": MIXED, "b": ALL_RIGHT, "c": ALL_RIGHT, "d": ALL_RIGHT}))
    with pytest.raises(DynamicSamplingExhausted, match="algorithm.filter_groups.max_num_gen_batches"):
        sampler.take_training_batch()


def test_partial_batch_is_cut_to_a_multiple_and_the_rest_stays_pooled():
    sampler = DynamicSampler(exhausting_config("train_partial"), DATAPROTO_OPS)
    sampler.begin_step(1)
    sampler.add_round(*make_round({"a": MIXED, "b": MIXED, "c": MIXED, "d": ALL_RIGHT}))
    batch, metrics = sampler.take_training_batch(groups_multiple_of=2)
    assert uids_of(batch) == ["a", "a", "b", "b"]
    assert metrics[P + "carried_out_groups"] == 1.0


def test_a_step_where_nothing_qualified_returns_no_batch():
    sampler = DynamicSampler(exhausting_config("train_partial"), DATAPROTO_OPS)
    sampler.begin_step(1)
    sampler.add_round(*make_round({"a": ALL_RIGHT, "b": ALL_WRONG, "c": ALL_RIGHT, "d": ALL_RIGHT}))
    batch, metrics = sampler.take_training_batch()
    assert batch is None and metrics[P + "trained_groups"] == 0.0


def _partial_steps(sampler: DynamicSampler, plan: dict, restore_after: int | None = None):
    """One round per step under a budget of one round, mini-batches of 2 groups; the uids each step trained (None:
    no update). ``restore_after``: after that step the sampler is saved and a fresh one resumes from the state."""
    trained, metrics_of = [], {}
    for step, groups in plan.items():
        sampler.begin_step(step)
        sampler.add_round(*make_round(groups))
        batch, metrics_of[step] = sampler.take_training_batch(groups_multiple_of=2)
        trained.append(None if batch is None else uids_of(batch)[::2])
        if step == restore_after:
            state = sampler.state_dict()
            sampler = DynamicSampler(sampler.config, DATAPROTO_OPS)
            sampler.load_state_dict(state)
    return sampler, trained, metrics_of


# Step 1 keeps 3 groups and trains 2; step 2 keeps 1 (with 1c: a mini-batch) or none; step 3 keeps 4.
BACK_TO_BACK = {1: {"1a": MIXED, "1b": MIXED, "1c": MIXED, "1d": ALL_RIGHT},
                2: {"2a": ALL_RIGHT, "2b": ALL_RIGHT, "2c": ALL_WRONG, "2d": ALL_RIGHT},
                3: {"3a": MIXED, "3b": MIXED, "3c": MIXED, "3d": MIXED}}


@pytest.mark.parametrize("restore_after", [None, 2])
def test_a_group_pooled_in_a_step_that_trained_nothing_is_dropped_at_max_staleness_zero(restore_after):
    """max_staleness=0 under train_partial with mini-batches of 2: step 2 pools one group, fewer than a mini-batch,
    and trains nothing. That group was generated in step 2, so step 3 must not train it (with or without a restore in
    between): it is dropped as step 2 closes, counted, and the pool step 2 carries out is empty."""
    config = make_config(train_batch_size=4, gen_batch_size=4, filter_groups={"max_num_gen_batches": 1},
                         on_exhausted="train_partial", max_staleness=0)
    plan = {1: {"1a": MIXED, "1b": MIXED, "1c": ALL_RIGHT, "1d": ALL_RIGHT},
            2: {"2a": MIXED, "2b": ALL_RIGHT, "2c": ALL_WRONG, "2d": ALL_RIGHT},
            3: {"3a": MIXED, "3b": MIXED, "3c": MIXED, "3d": ALL_WRONG}}
    sampler, trained, metrics = _partial_steps(DynamicSampler(config, DATAPROTO_OPS), plan, restore_after)
    assert trained == [["1a", "1b"], None, ["3a", "3b"]]  # 3c: a remainder, dropped as step 3 closes
    assert [metrics[s][P + "dropped_stale_groups"] for s in plan] == [0.0, 1.0, 1.0]
    assert [metrics[s][P + "carried_out_groups"] for s in plan] == [0.0, 0.0, 0.0]
    assert [metrics[s][P + "mean_staleness"] for s in (1, 3)] == [0.0, 0.0]
    assert sampler.pooled_groups == 0


def test_back_to_back_partial_steps_train_a_leftover_only_within_max_staleness_steps():
    """max_staleness=1: step 1's leftover (1c) may train in step 2, which trains nothing (1c alone is less than a
    mini-batch); in step 3 it would be 2 steps old, so it leaves as step 2 closes, counted (7 qualifying: 6 trained,
    1 dropped). A step without an update still counts: the bound is in steps, as the user set it."""
    sampler, trained, metrics = _partial_steps(DynamicSampler(exhausting_config("train_partial"), DATAPROTO_OPS),
                                               BACK_TO_BACK)
    assert trained == [["1a", "1b"], None, ["3a", "3b", "3c", "3d"]]
    assert [metrics[s][P + "dropped_stale_groups"] for s in BACK_TO_BACK] == [0.0, 1.0, 0.0]
    assert [metrics[s][P + "carried_out_groups"] for s in BACK_TO_BACK] == [1.0, 0.0, 0.0]
    counters = sampler.run_counters()
    assert (counters["qualifying_groups"], counters["trained_groups"], counters["dropped_stale_groups"]) == (7, 6, 1)


def test_a_restored_pool_holding_groups_beyond_the_bound_drops_them_at_the_next_step():
    """A checkpoint whose pool holds a group the resumed run's bound no longer allows (written with max_staleness=1,
    resumed with 0; or by an older version whose ages counted policy updates, format 3, read here): the next step
    drops it before anything trains, counted, and frees its storage."""
    sampler = DynamicSampler(make_config(train_batch_size=2, max_staleness=1), DATAPROTO_OPS)
    run_step(sampler, 1, [{"a": MIXED, "b": MIXED, "c": MIXED}])
    state = sampler.state_dict()
    state["version"], state["policy_version"] = 3, 0
    for segment in state["pool"]:
        segment["born_version"] = 0
    resumed = DynamicSampler(make_config(train_batch_size=2, max_staleness=0), DATAPROTO_OPS)
    resumed.load_state_dict(state)
    assert resumed.pooled_groups == 1
    batch, metrics = run_step(resumed, 2, [{"d": MIXED, "e": MIXED}])
    assert uids_of(batch)[::2] == ["d", "e"] and metrics[P + "dropped_stale_groups"] == 1.0
    assert resumed.take_dropped_group_ids().tolist() == ["c"]


def test_taking_a_short_batch_while_budget_remains_is_an_error():
    sampler = DynamicSampler(make_config(train_batch_size=2), DATAPROTO_OPS)
    sampler.begin_step(1)
    sampler.add_round(*make_round({"a": MIXED}))
    with pytest.raises(RuntimeError, match="needs_more_rounds"):
        sampler.take_training_batch()


# ----------------------------------------------------------------------------- metrics


def test_metrics_of_a_multi_round_step_sum_every_round():
    sampler = DynamicSampler(make_config(train_batch_size=4), DATAPROTO_OPS)
    round_1 = {"a": MIXED, "b": ALL_RIGHT, "c": ALL_WRONG, "d": MIXED}  # 2 kept
    round_2 = {"e": MIXED, "f": MIXED, "g": MIXED, "h": ALL_RIGHT}  # 3 kept
    batch, metrics = run_step(sampler, 1, [round_1, round_2], tokens=[300, 500])
    assert uids_of(batch)[::2] == ["a", "d", "e", "f"]
    # 16 responses, 1 + 2 + 0 + 1 + 1 + 1 + 1 + 2 = 9 right -> mean 9/16 before filtering.
    assert metrics == {
        P + "num_gen_rounds": 2.0,
        P + "generated_groups": 8.0,
        P + "generated_tokens": 800.0,  # both rounds, dropped groups included
        P + "total_generated_tokens": 800.0,
        P + "kept_groups": 5.0,
        P + "trained_groups": 4.0,
        P + "carried_in_groups": 0.0,
        P + "carried_out_groups": 1.0,
        P + "dropped_stale_groups": 0.0,
        P + "mean_staleness": 0.0,
        P + "partial_batch": 0.0,
        P + "partial_steps": 0.0,
        P + "budget_extensions": 0.0,
        P + "total_gen_rounds": 2.0,
        P + "keep_rate_estimate": pytest.approx((5 + 0.5) / (8 + 1)),
        P + "utilization": 4 / 5,
        P + "keep_rate": 5 / 8,
        P + "solve_all_ratio": 2 / 8,  # b, h
        P + "solve_none_ratio": 1 / 8,  # c
        P + "score_mean_before_filter": 9 / 16,
    }
    # Step 2: the carried group g plus three new ones; utilization is cumulative: (4 + 4) / (5 + 3).
    _, metrics = run_step(sampler, 2, [{"i": MIXED, "j": MIXED, "k": MIXED}], tokens=[120])
    assert metrics[P + "generated_tokens"] == 120.0 and metrics[P + "total_generated_tokens"] == 920.0
    assert metrics[P + "carried_in_groups"] == 1.0
    assert metrics[P + "utilization"] == 1.0


# ----------------------------------------------------------------------------- configuration


def test_config_reads_verl_filter_groups_and_the_recipe_namespace():
    filter_groups = FilterGroupsConfig(enable=True, metric="score", max_num_gen_batches=5)
    own = OmegaConf.create({"max_staleness": 2, "round_sizing": "whole", "min_round_prompts": None})
    config = DynamicSamplingConfig.from_config(filter_groups, own, train_batch_size=8, gen_batch_size=None)
    assert (config.metric, config.max_num_gen_batches, config.max_staleness) == ("score", 5, 2)
    assert config.gen_batch_size == 8  # null gen_batch_size means train_batch_size, as in verl
    assert config.prompt_budget == 40
    assert config.min_round == 2  # ceil(8 / 4)


@pytest.mark.parametrize(
    "own, message",
    [
        ({"max_stalenes": 1}, "unknown setting dapo.dynamic_sampling.max_stalenes"),
        ({"round_sizing": "greedy"}, "dapo.dynamic_sampling.round_sizing='greedy'"),
        ({"on_exhausted": "crash"}, "dapo.dynamic_sampling.on_exhausted='crash'"),
        ({"keep_rate_prior": 0.0}, r"dapo.dynamic_sampling.keep_rate_prior must lie in \(0.0, 1.0\]"),
        ({"max_staleness": -1}, "dapo.dynamic_sampling.max_staleness must be >= 0"),
        ({"min_round_prompts": 64, "max_round_prompts": 32}, "min_round_prompts .64. exceeds the largest round"),
        ({"prompt_granularity": 5}, "data.gen_batch_size=48 is not a multiple of"),
    ],
)
def test_invalid_settings_are_refused_naming_the_key(own, message):
    with pytest.raises(ValueError, match=message):
        make_config(train_batch_size=16, gen_batch_size=48, **own)


def test_filter_groups_keys_left_out_mean_what_they_mean_in_verl():
    # verl: filter_groups.enable defaults to False; then every group is kept and no metric is needed.
    config = DynamicSamplingConfig.from_config({}, None, train_batch_size=2)
    assert (config.enable, config.max_num_gen_batches, config.prompt_budget) == (False, 0, None)
    sampler = DynamicSampler(config)
    sampler.begin_step(1)
    assert sampler.prompts_for_next_round() == 2  # exactly the missing groups: no margin, no keep rate
    sampler.add_round(np.arange(4), ["a", "a", "b", "b"], [1, 1, 0, 0])
    batch, _ = sampler.take_training_batch()
    assert batch.tolist() == [0, 1, 2, 3]


def test_enabled_filter_without_a_metric_is_refused():
    with pytest.raises(ValueError, match="algorithm.filter_groups.metric must name"):
        make_config(filter_groups={"metric": ""})


# ----------------------------------------------------------------------------- prompt stream


def numbered_epochs(size: int, batch_size: int):
    """Epoch e yields prompts 100 * e + 0..size-1 in batches."""

    def open_epoch(epoch):
        prompts = np.arange(size) + 100 * epoch
        return (prompts[i : i + batch_size] for i in range(0, size, batch_size))

    return open_epoch


def test_prompt_stream_hands_out_any_number_across_batches_and_epochs():
    stream = PromptStream(numbered_epochs(size=5, batch_size=2))
    assert stream.take(3).tolist() == [0, 1, 2]
    assert stream.take(4).tolist() == [3, 4, 100, 101]  # rolls into epoch 1 inside one round
    assert stream.epoch == 1
    assert stream.take(1).tolist() == [102]


def test_prompt_stream_refuses_an_empty_dataset():
    stream = PromptStream(lambda epoch: iter(()))
    with pytest.raises(RuntimeError, match="yielded no prompts"):
        stream.take(1)


# ----------------------------------------------------------------------------- resume


class ResumableLoader:
    """Stands in for verl's StatefulDataLoader: a shuffled epoch whose position survives a restart."""

    def __init__(self, size: int, batch_size: int):
        self.size, self.batch_size = size, batch_size
        self.epoch, self.position = 0, 0

    def open_epoch(self, epoch: int):
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0
        order = np.random.default_rng(epoch).permutation(self.size)
        while self.position < self.size:
            start = self.position
            self.position += self.batch_size
            prompts = order[start : self.position]
            yield DataProto.from_dict(tensors={"prompt": torch.as_tensor(prompts)})

    def state_dict(self):
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state):
        self.epoch, self.position = state["epoch"], state["position"]


class ToyRun:
    """Trainer-shaped driver: prompt stream -> deterministic 'generation' -> sampler, n = 4 responses."""

    RESPONSES = 4

    def __init__(self):
        self.loader = ResumableLoader(size=11, batch_size=3)
        self.stream = PromptStream(self.loader.open_epoch, DATAPROTO_OPS)
        config = make_config(train_batch_size=3, gen_batch_size=6, min_round_prompts=2, keep_rate_prior=0.9)
        self.sampler = DynamicSampler(config, DATAPROTO_OPS)

    def generate(self, prompts: DataProto, step: int) -> DataProto:
        ids = prompts.batch["prompt"].numpy()
        serial = self.stream.prompts_taken - len(ids) + np.arange(len(ids))  # unique per prompt instance
        rows = np.repeat(np.arange(len(ids)), self.RESPONSES)
        # Each response is right with a probability fixed by (step, prompt): about half the groups qualify.
        acc = np.concatenate([np.random.default_rng([step, int(p)]).random(self.RESPONSES) < 0.7 for p in ids])
        return DataProto.from_dict(
            tensors={"prompt": torch.as_tensor(ids[rows]), "rollout_log_probs": torch.randn(len(rows), 2)},
            non_tensors={"uid": np.array([f"u{s}" for s in serial[rows]], dtype=object), "acc": acc},
        )

    def generate_round(self, prompts: DataProto, step: int) -> ScoredRound:
        rollouts = self.generate(prompts, step)
        return ScoredRound(rollouts, rollouts.non_tensor_batch["uid"], rollouts.non_tensor_batch["acc"])

    def step(self, step: int):
        collected = collect_step(self.sampler, self.stream, lambda prompts: self.generate_round(prompts, step), step)
        return collected.batch, collected.metrics

    def state_dict(self):
        return {
            "sampler": self.sampler.state_dict(),
            "stream": self.stream.state_dict(),
            "loader": self.loader.state_dict(),
        }

    def load_state_dict(self, state):
        self.sampler.load_state_dict(state["sampler"])
        self.stream.load_state_dict(state["stream"])
        self.loader.load_state_dict(state["loader"])


def test_a_run_resumed_from_state_dict_continues_exactly_like_an_uninterrupted_one():
    torch.manual_seed(0)
    uninterrupted = ToyRun()
    expected = [uninterrupted.step(step) for step in range(1, 9)]

    torch.manual_seed(0)
    first_half = ToyRun()
    for step in range(1, 5):
        first_half.step(step)
    assert first_half.sampler.pooled_groups > 0  # the checkpoint really holds carried-over groups
    buffer = io.BytesIO()
    torch.save(first_half.state_dict(), buffer)
    rng_state = torch.get_rng_state()  # the trainer's RNG state is restored by verl's checkpoint, not us

    resumed = ToyRun()
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    torch.set_rng_state(rng_state)
    for step in range(5, 9):
        batch, metrics = resumed.step(step)
        expected_batch, expected_metrics = expected[step - 1]
        assert uids_of(batch) == uids_of(expected_batch)
        assert torch.equal(batch.batch["prompt"], expected_batch.batch["prompt"])
        assert torch.equal(batch.batch["rollout_log_probs"], expected_batch.batch["rollout_log_probs"])
        assert metrics == expected_metrics
    assert {m[P + "carried_in_groups"] for _, m in expected[4:]} != {0.0}  # the resumed steps used the buffer


def test_the_sampler_package_imports_neither_ray_nor_verl():
    code = (
        "import sys, recipe_dapo.dynamic_sampling; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'verl')); "
        "print(bad)"
    )
    completed = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert completed.stdout.strip() == "[]"


def test_collect_step_runs_no_round_when_carried_over_groups_fill_the_batch():
    sampler = DynamicSampler(make_config(train_batch_size=2, gen_batch_size=4), DATAPROTO_OPS)
    stream = PromptStream(numbered_epochs(size=100, batch_size=4))
    calls = []

    def generate_round(prompts):
        calls.append(len(prompts))
        uids = np.repeat([f"p{p}" for p in prompts], 2)
        batch = DataProto.from_dict(non_tensors={"uid": uids, "acc": np.tile([1.0, 0.0], len(prompts))})
        return ScoredRound(batch, uids, batch.non_tensor_batch["acc"], columns={"acc": batch.non_tensor_batch["acc"]})

    first = collect_step(sampler, stream, generate_round, step=1)
    assert first.rounds == 1 and len(first.batch) == 4  # 2 groups x 2 responses; the surplus stays pooled
    assert len(first.scored_columns["acc"]) == 2 * calls[0]
    second = collect_step(sampler, stream, generate_round, step=2)
    assert second.rounds == 0 and len(calls) == 1 and second.scored_columns == {}
    assert second.metrics[P + "carried_in_groups"] == 2.0


def test_a_step_that_can_never_fill_stops_with_a_clear_error_after_max_empty_rounds():
    # No generation budget (max_num_gen_batches=0) and every group all-correct: without the bound this never ends.
    sampler = DynamicSampler(make_config(train_batch_size=2, gen_batch_size=4, max_empty_rounds=3), DATAPROTO_OPS)
    stream = PromptStream(numbered_epochs(size=100, batch_size=4))
    rounds = []

    def all_correct(prompts):
        rounds.append(len(prompts))
        uids = np.repeat([f"p{p}" for p in prompts], 2)
        return ScoredRound(DataProto.from_dict(non_tensors={"uid": uids}), uids, np.ones(len(uids)))

    with pytest.raises(DynamicSamplingStalled, match=r"3 generation rounds in a row kept no group.*max_empty_rounds"):
        collect_step(sampler, stream, all_correct, step=1)
    assert len(rounds) == 3


def test_a_round_that_keeps_something_resets_the_empty_round_count():
    sampler = DynamicSampler(make_config(train_batch_size=3, gen_batch_size=1, max_empty_rounds=2), DATAPROTO_OPS)
    outcomes = iter([ALL_RIGHT, MIXED, ALL_RIGHT, MIXED, ALL_WRONG, MIXED])
    stream = PromptStream(numbered_epochs(size=100, batch_size=1))

    def scripted(prompts):
        uids = np.repeat([f"p{p}" for p in prompts], 2)
        return ScoredRound(DataProto.from_dict(non_tensors={"uid": uids}), uids, np.array(next(outcomes)))

    collected = collect_step(sampler, stream, scripted, step=1)
    assert collected.rounds == 6 and len(collected.batch) == 6


def test_a_state_kept_in_memory_shares_the_pooled_payloads_and_puts_the_pool_back_as_it_stood():
    """``state_dict(compact=False)``, the state a trainer keeps at the start of a step it may give up: a segment half
    taken keeps its payload object (no copy) and how much of it was taken; loaded back after the step pooled and took
    more, the sampler continues exactly as it would have from that moment (same groups, rows and counters)."""
    config = make_config(train_batch_size=2)
    sampler = DynamicSampler(config, DATAPROTO_OPS)
    run_step(sampler, 1, [{"a": MIXED, "b": MIXED, "c": MIXED, "d": MIXED}])  # c and d carried over
    run_step(sampler, 2, [{"e": MIXED}])  # c and d trained, e carried over
    sampler.begin_step(3)
    sampler.add_round(*make_round({"f": MIXED, "g": MIXED, "h": MIXED}))
    sampler.take_training_batch()  # e, f taken: the segment of f, g, h is half taken
    kept = sampler.state_dict(compact=False)
    compact = sampler.state_dict()
    pooled = [segment["payload"] for segment in kept["pool"]]
    assert [segment["start"] for segment in kept["pool"]] == [1]  # f taken, g and h pooled
    assert pooled[0] is sampler._pool._segments[0].payload  # shared, not copied
    assert len(compact["pool"][0]["payload"]) == 4  # (the checkpoint's form: g and h only, copied)

    def continue_from(state):
        again = DynamicSampler(config, DATAPROTO_OPS)
        again.load_state_dict(state)
        batch, _ = run_step(again, 4, [{"i": MIXED, "j": ALL_RIGHT}])
        return uids_of(batch), batch.batch["rollout_log_probs"].tolist(), again.state_dict()["totals"]

    sampler.begin_step(4)  # the step given up: it pooled more groups and took some
    sampler.add_round(*make_round({"x": MIXED, "y": MIXED}))
    sampler.take_training_batch()
    sampler.load_state_dict(kept)
    assert sampler.pooled_groups == 2
    assert continue_from(sampler.state_dict()) == continue_from(compact)
    assert continue_from(sampler.state_dict())[0] == ["g", "g", "h", "h"]
