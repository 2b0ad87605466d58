"""The ``dapo`` policy loss: clip regions, Clip-Higher, exact token-level aggregation, metrics.

All cases run through verl 0.9.1's real objects: the policy-loss registry, ``ActorConfig``,
``agg_loss``, the actor's ``ppo_loss`` (which fills ``global_batch_info`` and calls the loss with
keywords) and verl's ``Metric`` aggregation.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric, reduce_metrics
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.utils.losses import ppo_loss

from recipe_dapo.loss.dapo import BEHAVIOUR_METRIC_NAMES, DAPO_METRIC_NAMES, clip_bounds, compute_policy_loss_dapo

ALL_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum", "seq-mean-token-sum")


def actor_config(**overrides) -> ActorConfig:
    """A real verl ActorConfig selecting the dapo loss with the paper's bounds unless overridden."""
    fields = dict(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        policy_loss=PolicyLossConfig(loss_mode="dapo"),
    )
    fields.update(overrides)
    return ActorConfig(**fields)


def loss_inputs(ratios, advantages, mask, old_prob=0.1):
    """old_log_prob = log(old_prob); log_prob = old_log_prob + log(ratio), a float64 leaf for gradients."""
    ratios = torch.tensor(ratios, dtype=torch.float64)
    old_log_prob = torch.full_like(ratios, math.log(old_prob))
    log_prob = (old_log_prob + torch.log(ratios)).detach().requires_grad_(True)
    return dict(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=torch.tensor(advantages, dtype=torch.float64),
        response_mask=torch.tensor(mask, dtype=torch.bool),
    )


# One response, eight valid tokens (eps_low=0.2, eps_high=0.28, c=3), then one padding token:
#  tok  A   r     objective min(rA, clip(r)A) [dual max(., cA) if A<0]   loss   d loss/d log_prob = -A r if unclipped
#   1  +1  0.5   min(0.5, 0.8)                 =  0.5                    -0.5   -0.5
#   2  +1  1.0   min(1.0, 1.0)                 =  1.0                    -1.0   -1.0
#   3  +1  1.5   min(1.5, 1.28)                =  1.28  clipped high     -1.28   0
#   4  -1  0.5   min(-0.5, -0.8)               = -0.8   clipped low       0.8    0
#   5  -1  1.0   min(-1.0, -1.0)               = -1.0                     1.0   +1.0
#   6  -1  2.0   min(-2.0, -1.28) = -2; max(-2, -3)  = -2  (not clipped)  2.0   +2.0
#   7  -1  4.0   min(-4.0, -1.28) = -4; max(-4, -3)  = -3  dual clipped   3.0    0
#   8  +1  4.0   min(4.0, 1.28)                =  1.28  clipped high     -1.28   0
#  pad -1 10.0   masked out                                                -       0
# token-mean = (-0.5 - 1 - 1.28 + 0.8 + 1 + 2 + 3 - 1.28) / 8 = 2.74 / 8 = 0.3425
HAND_RATIOS = [[0.5, 1.0, 1.5, 0.5, 1.0, 2.0, 4.0, 4.0, 10.0]]
HAND_ADVANTAGES = [[1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0]]
HAND_MASK = [[1, 1, 1, 1, 1, 1, 1, 1, 0]]


def test_dapo_loss_is_registered_in_verls_policy_loss_registry():
    assert get_policy_loss_fn("dapo") is compute_policy_loss_dapo


def test_every_clip_region_gives_its_hand_derived_loss_and_gradient():
    inputs = loss_inputs(HAND_RATIOS, HAND_ADVANTAGES, HAND_MASK)
    loss, _ = compute_policy_loss_dapo(**inputs, loss_agg_mode="token-mean", config=actor_config())
    loss.backward()

    assert loss.item() == pytest.approx(2.74 / 8, abs=1e-12)
    # token-mean divides each token's -A r by the 8 valid tokens (table above).
    expected_grad = torch.tensor([[-0.5, -1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0]], dtype=torch.float64) / 8
    torch.testing.assert_close(inputs["log_prob"].grad, expected_grad, rtol=0, atol=1e-12)


def test_clipped_tokens_get_exactly_zero_gradient_and_unclipped_ones_do_not():
    inputs = loss_inputs(HAND_RATIOS, HAND_ADVANTAGES, HAND_MASK)
    loss, _ = compute_policy_loss_dapo(**inputs, loss_agg_mode="token-mean", config=actor_config())
    loss.backward()
    grad = inputs["log_prob"].grad[0]

    clipped = [2, 3, 6, 7]  # tokens 3, 4, 7, 8 (0-based indices): clipped high, low, dual, high
    unclipped = [0, 1, 4, 5]
    assert torch.all(grad[clipped] == 0.0)
    assert torch.all(grad[unclipped] != 0.0)


def test_dual_clip_bounds_the_loss_of_negative_advantages_only():
    # A = -1 and r = 4 > c = 3: the loss is capped at -c A = 3 instead of -r A = 4.
    # A = +1 and r = 4: dual clip does not apply; the band caps the objective at 1.28 (loss -1.28).
    inputs = loss_inputs([[4.0, 4.0]], [[-1.0, 1.0]], [[1, 1]])
    loss, _ = compute_policy_loss_dapo(**inputs, loss_agg_mode="token-sum", config=actor_config())
    assert loss.item() == pytest.approx(3.0 - 1.28, abs=1e-12)


def test_dapo_equals_verls_vanilla_loss_and_clipfrac_when_the_bounds_are_equal():
    # Same objective as verl's vanilla PPO loss (decoupled band + dual clip), so with the same
    # config both must agree on the loss and on verl's pg_clipfrac (3 of 8 tokens: 3, 4, 8).
    config = actor_config()
    dapo_loss, dapo_metrics = compute_policy_loss_dapo(
        **loss_inputs(HAND_RATIOS, HAND_ADVANTAGES, HAND_MASK), loss_agg_mode="token-mean", config=config
    )
    vanilla_loss, vanilla_metrics = get_policy_loss_fn("vanilla")(
        **loss_inputs(HAND_RATIOS, HAND_ADVANTAGES, HAND_MASK), loss_agg_mode="token-mean", config=config
    )
    assert dapo_loss.item() == pytest.approx(vanilla_loss.item(), abs=1e-12)
    assert dapo_metrics["actor/pg_clipfrac"] == pytest.approx(vanilla_metrics["actor/pg_clipfrac"])
    assert dapo_metrics["actor/pg_clipfrac"] == pytest.approx(3 / 8)


def test_clip_higher_widens_the_band_upward_only():
    # eps_low = 0.2 in both; eps_high 0.2 (symmetric) vs 0.28 (Clip-Higher).
    ratios = [0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 1.25, 1.27, 1.29, 1.5]
    row = ratios + ratios
    advantages = [1.0] * len(ratios) + [-1.0] * len(ratios)
    grads = {}
    for eps_high in (0.2, 0.28):
        inputs = loss_inputs([row], [advantages], [[1] * len(row)])
        loss, _ = compute_policy_loss_dapo(
            **inputs, loss_agg_mode="token-sum", config=actor_config(clip_ratio_high=eps_high)
        )
        loss.backward()
        grads[eps_high] = inputs["log_prob"].grad[0]

    n = len(ratios)
    zero_grad = {eps: set(torch.nonzero(g == 0).flatten().tolist()) for eps, g in grads.items()}
    # A > 0 is clipped above 1 + eps_high: r in {1.21, 1.25, 1.27, 1.29, 1.5} (indices 5-9) at 0.2,
    # only r in {1.29, 1.5} (8, 9) at 0.28. A < 0 is clipped below 0.8 at both: r in {0.5, 0.79} (n, n+1).
    assert zero_grad[0.2] == {5, 6, 7, 8, 9, n, n + 1}
    assert zero_grad[0.28] == {8, 9, n, n + 1}
    # Everything below the old upper bound, and every negative-advantage token, is untouched.
    unchanged = list(range(5)) + list(range(n, 2 * n))
    torch.testing.assert_close(grads[0.2][unchanged], grads[0.28][unchanged], rtol=0, atol=0)


def test_rollout_importance_weights_multiply_each_token_loss():
    # ratio 1 (inside the band): token loss = -A. Weights 2, 1, 1, 1 on A=+1 and 0.5 on A=-3:
    # token-mean = (-2 - 1 - 1 - 1 + 0.5 * 3) / 5 = -3.5 / 5 = -0.7
    inputs = loss_inputs([[1.0] * 4, [1.0] * 4], [[1.0] * 4, [-3.0] * 4], [[1, 1, 1, 1], [1, 0, 0, 0]])
    weights = torch.tensor([[2.0, 1.0, 1.0, 1.0], [0.5, 9.0, 9.0, 9.0]], dtype=torch.float64)
    loss, _ = compute_policy_loss_dapo(
        **inputs, loss_agg_mode="token-mean", config=actor_config(), rollout_is_weights=weights
    )
    assert loss.item() == pytest.approx(-0.7, abs=1e-12)


# A long response (4 tokens, A = +1) and a short one (1 token, A = -3), ratio 1, response width T = 4.
# Token losses are -A: -1 on each long token, +3 on the short token.
#   mode                      loss                     d/d log_prob long token   short token
#   token-mean                (-4 + 3) / 5 = -0.2      -1/5   = -0.2             3/5   = 0.6
#   seq-mean-token-mean       (-4/4 + 3/1) / 2 = 1.0   -1/8   = -0.125           3/2   = 1.5
#   seq-mean-token-sum        (-4 + 3) / 2 = -0.5      -1/2   = -0.5             3/2   = 1.5
#   seq-mean-token-sum-norm   (-4 + 3) / 2 / T = -0.125 -1/8  = -0.125           3/8   = 0.375
#   token-sum                 -4 + 3 = -1              -1                        3
# token-mean gives every token the same weight (|grad| / |A| = 1/5 for both responses);
# seq-mean-token-mean gives every response the same total weight (4 * 1/8 = 1/2 = 1 * 1/2).
AGG_MODE_GOLDEN = {
    "token-mean": (-0.2, -0.2, 0.6),
    "seq-mean-token-mean": (1.0, -0.125, 1.5),
    "seq-mean-token-sum": (-0.5, -0.5, 1.5),
    "seq-mean-token-sum-norm": (-0.125, -0.125, 0.375),
    "token-sum": (-1.0, -1.0, 3.0),
}


@pytest.mark.parametrize("loss_agg_mode", ALL_AGG_MODES)
def test_each_aggregation_mode_matches_its_formula_on_a_long_and_a_short_response(loss_agg_mode):
    inputs = loss_inputs([[1.0] * 4, [1.0] * 4], [[1.0] * 4, [-3.0] * 4], [[1, 1, 1, 1], [1, 0, 0, 0]])
    config = actor_config(loss_agg_mode=loss_agg_mode)
    loss, _ = compute_policy_loss_dapo(**inputs, loss_agg_mode=loss_agg_mode, config=config)
    loss.backward()

    expected_loss, long_token_grad, short_token_grad = AGG_MODE_GOLDEN[loss_agg_mode]
    grad = inputs["log_prob"].grad
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    torch.testing.assert_close(grad[0], torch.full((4,), long_token_grad, dtype=torch.float64), rtol=0, atol=1e-12)
    assert grad[1, 0].item() == pytest.approx(short_token_grad, abs=1e-12)
    assert torch.all(grad[1, 1:] == 0.0)


def test_metrics_count_each_clip_region_on_the_hand_made_case():
    _, metrics = compute_policy_loss_dapo(
        **loss_inputs(HAND_RATIOS, HAND_ADVANTAGES, HAND_MASK), loss_agg_mode="token-mean", config=actor_config()
    )
    assert set(metrics) == set(DAPO_METRIC_NAMES) | set(BEHAVIOUR_METRIC_NAMES)
    # Of 8 valid tokens: clipped high 3 and 8, low 4, dual 7 (padding with r = 10, A < 0 not counted).
    assert metrics["actor/pg_clipfrac"] == pytest.approx(3 / 8)
    assert metrics["actor/pg_clipfrac_eps_high"] == pytest.approx(2 / 8)
    assert metrics["actor/pg_clipfrac_eps_low"] == pytest.approx(1 / 8)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 8)
    # ppo_kl = mean(-log r) = -(log .5 + 0 + log 1.5 + log .5 + 0 + log 2 + log 4 + log 4) / 8
    #        = -log(.5 * 1.5 * .5 * 2 * 4 * 4) / 8 = -log(12) / 8
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(12) / 8)
    # Current probabilities of the clipped-high tokens: 0.1 * 1.5 = 0.15 and 0.1 * 4 = 0.4.
    assert metrics["actor/clipped_high_token_prob_mean"] == pytest.approx((0.15 + 0.4) / 2)
    assert metrics["actor/clipped_high_token_prob_max"] == pytest.approx(0.4)


def test_clipped_high_probability_metrics_are_zero_when_nothing_is_clipped_high():
    _, metrics = compute_policy_loss_dapo(
        **loss_inputs([[1.0, 0.5]], [[1.0, -1.0]], [[1, 1]]), loss_agg_mode="token-mean", config=actor_config()
    )
    assert metrics["actor/clipped_high_token_prob_mean"] == 0.0
    assert metrics["actor/clipped_high_token_prob_max"] == 0.0
    assert metrics["actor/pg_clipfrac_eps_low"] == pytest.approx(1 / 2)


def test_verl_averages_the_per_micro_batch_max_over_micro_batches_and_takes_the_max_over_mini_batches():
    # The aggregation the loss module documents: ppo_loss wraps the value in Metric(MEAN);
    # aggregate_dp averages the values of one mini-batch, reduce_metrics then takes the max over
    # mini-batches because the name contains "max". Micro-batch maxima 0.4 and 0.0 -> 0.2 for the
    # mini-batch; a second mini-batch at 0.3 -> the step logs max(0.2, 0.3) = 0.3.
    first, second = Metric(AggregationType.MEAN), Metric(AggregationType.MEAN)
    first.extend([0.4, 0.0])
    second.extend([0.3])
    per_mini_batch = [Metric.aggregate_dp([first]), Metric.aggregate_dp([second])]
    reduced = reduce_metrics({"actor/clipped_high_token_prob_max": per_mini_batch})
    assert reduced["actor/clipped_high_token_prob_max"] == pytest.approx(0.3)


def test_clip_bounds_fall_back_to_clip_ratio_and_read_omegaconf_configs():
    bounds = clip_bounds(OmegaConf.create({"clip_ratio": 0.1, "clip_ratio_low": None, "clip_ratio_high": None}))
    assert (bounds.eps_low, bounds.eps_high, bounds.clip_ratio_c) == (0.1, 0.1, 3.0)
    # A DictConfig works as the loss config too: band [0.9, 1.1], so r = 1.15 with A > 0 is clipped high.
    _, metrics = compute_policy_loss_dapo(
        **loss_inputs([[1.15, 1.05]], [[1.0, 1.0]], [[1, 1]]),
        loss_agg_mode="token-mean",
        config=OmegaConf.create({"clip_ratio": 0.1, "clip_ratio_low": None, "clip_ratio_high": None}),
    )
    assert metrics["actor/pg_clipfrac_eps_high"] == pytest.approx(1 / 2)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high"),
        ({"clip_ratio_low": 0.0}, "clip_ratio_low"),  # the start-up check refuses the same values (one rule)
        ({"clip_ratio_low": 0.3, "clip_ratio_high": 0.1}, "clip_ratio_high=0.1 is below clip_ratio_low=0.3: did you swap"),
    ],
)
def test_meaningless_clip_settings_are_refused_with_the_key_to_fix(overrides, key):
    with pytest.raises(ValueError, match=f"actor_rollout_ref.actor.{key}"):
        compute_policy_loss_dapo(
            **loss_inputs([[1.0]], [[1.0]], [[1]]), loss_agg_mode="token-mean", config=actor_config(**overrides)
        )


# ---------------------------------------------------------------------------------------------------
# Exactness through verl's own actor loss (ppo_loss) with k micro-batches on 2 data-parallel ranks.
# ---------------------------------------------------------------------------------------------------

PROMPT_LEN = 3
VOCAB = 11
HIDDEN = 5


def response_log_probs(weight, features, responses):
    """A tiny shared-weight policy: log softmax(features @ weight) at the response tokens, [B, T]."""
    logits = features @ weight
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def flat_model_output(log_probs, lengths):
    """Lay the [B, T] response log-probs out as verl's no-padding model output (one value per real token).

    no_padding_2_padding reads response token t of a sequence at position prompt_len - 1 + t (the
    model output is shifted by one), so each sequence is [prompt_len - 1 fillers, L values, 1 filler].
    """
    pieces = []
    for row, length in enumerate(lengths):
        filler = log_probs.new_zeros(PROMPT_LEN - 1)
        pieces += [filler, log_probs[row, :length], log_probs.new_zeros(1)]
    return torch.cat(pieces)


def actor_micro_batch(rows, batch, dp_size, batch_num_tokens, global_batch_size, extra=()):
    """The micro-batch TensorDict ppo_loss receives, with the non-tensor keys the FSDP engine and the
    trainer assign (forward_backward_batch: dp_size, batch_num_tokens; _update_actor: global_batch_size); ``extra``:
    more of the batch's per-token keys (``ref_log_prob``)."""
    response_mask = batch["response_mask"][rows]
    real_response_tokens = batch.get("response_attention_mask", batch["response_mask"])[rows].long()
    attention_mask = torch.cat([torch.ones(len(rows), PROMPT_LEN, dtype=torch.long), real_response_tokens], 1)
    td = TensorDict(
        {
            "prompts": torch.ones(len(rows), PROMPT_LEN, dtype=torch.long),
            "responses": batch["responses"][rows],
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_log_probs": batch["old_log_probs"][rows],
            "advantages": batch["advantages"][rows],
            **{key: batch[key][rows] for key in extra},
        },
        batch_size=[len(rows)],
    )
    tu.assign_non_tensor(
        td, dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size
    )
    return td


def ragged_mini_batch(seed=0, rows=12, width=9):
    """12 responses with ragged lengths: rank 0 (rows 0-5) long, rank 1 (rows 6-11) short."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [9, 8, 7, 9, 6, 8, 1, 3, 2, 4, 1, 2]
    response_mask = torch.zeros(rows, width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        response_mask[row, :length] = True
    weight = torch.randn(HIDDEN, VOCAB, generator=gen, dtype=torch.float64)
    features = torch.randn(rows, width, HIDDEN, generator=gen, dtype=torch.float64)
    responses = torch.randint(0, VOCAB, (rows, width), generator=gen)
    # old policy = current policy plus noise, so ratios spread over the band's edges; every third
    # response also gets r = e^1.5 = 4.5 > c = 3 on every other token (dual clip where A < 0)
    old_log_probs = response_log_probs(weight, features, responses) + 0.4 * torch.randn(
        rows, width, generator=gen, dtype=torch.float64
    )
    old_log_probs[::3, ::2] -= 1.5
    advantages = torch.randn(rows, 1, generator=gen, dtype=torch.float64).expand(rows, width).clone()
    batch = dict(
        responses=responses,
        response_mask=response_mask,
        response_attention_mask=response_mask.clone(),  # the real tokens; response_mask may be filtered later
        old_log_probs=old_log_probs,
        advantages=advantages,
    )
    return weight, features, lengths, batch


def full_batch_gradient(loss_agg_mode, weight, features, batch, metrics_out=None):
    """The reference: one call on the whole mini-batch, no global info (agg_loss's local formulas)."""
    weight = weight.clone().requires_grad_(True)
    loss, metrics = compute_policy_loss_dapo(
        old_log_prob=batch["old_log_probs"],
        log_prob=response_log_probs(weight, features, batch["responses"]),
        advantages=batch["advantages"],
        response_mask=batch["response_mask"],
        loss_agg_mode=loss_agg_mode,
        config=actor_config(loss_agg_mode=loss_agg_mode),
    )
    loss.backward()
    if metrics_out is not None:
        metrics_out.update(metrics)
    return loss.item(), weight.grad


def data_parallel_gradient(loss_agg_mode, weight, features, lengths, batch, rank_micro_batches):
    """What verl does: per rank, per micro-batch ppo_loss -> backward (gradients accumulate unscaled);
    then FSDP/DDP average the gradients over ranks. Returns (gradient, pg_loss metric as verl logs it)."""
    dp_size = len(rank_micro_batches)
    all_rows = [row for micro_batches in rank_micro_batches for rows in micro_batches for row in rows]
    batch_num_tokens = int(batch["response_mask"][all_rows].sum())  # all-reduced over ranks
    global_batch_size = len(all_rows)  # ppo_mini_batch_size * rollout.n, over all ranks
    config = actor_config(loss_agg_mode=loss_agg_mode)
    rank_grads, rank_loss_metrics = [], []
    for micro_batches in rank_micro_batches:
        rank_weight = weight.clone().requires_grad_(True)  # each rank holds a replica
        loss_metric = Metric(AggregationType.SUM)
        for rows in micro_batches:
            td = actor_micro_batch(rows, batch, dp_size, batch_num_tokens, global_batch_size)
            log_probs = response_log_probs(rank_weight, features[rows], batch["responses"][rows])
            model_output = {"log_probs": flat_model_output(log_probs, [lengths[row] for row in rows])}
            loss, metrics = ppo_loss(config, model_output, td)
            loss.backward()
            loss_metric.append(metrics["actor/pg_loss"])
        rank_grads.append(rank_weight.grad)
        rank_loss_metrics.append(loss_metric)
    return torch.stack(rank_grads).mean(0), Metric.aggregate_dp(rank_loss_metrics)


# Two ranks x three micro-batches of uneven sizes (same micro-batch count per rank, as verl enforces).
RANK_MICRO_BATCHES = [[[0], [1, 2], [3, 4, 5]], [[6, 7], [8, 9], [10, 11]]]


@pytest.mark.parametrize("loss_agg_mode", ALL_AGG_MODES)
def test_micro_batches_on_two_ranks_give_exactly_the_full_batch_gradient(loss_agg_mode):
    weight, features, lengths, batch = ragged_mini_batch()
    full_metrics = {}
    full_loss, full_grad = full_batch_gradient(loss_agg_mode, weight, features, batch, full_metrics)
    dp_grad, dp_loss = data_parallel_gradient(loss_agg_mode, weight, features, lengths, batch, RANK_MICRO_BATCHES)

    # the case exercises every clip region and has a real gradient, not two zeros agreeing
    assert min(full_metrics[f"actor/pg_clipfrac_{kind}"] for kind in ("eps_high", "eps_low", "lower")) > 0
    assert full_grad.abs().max() > 1e-3
    assert (dp_grad - full_grad).abs().max().item() < 1e-6
    # verl's logged actor/pg_loss (Metric SUM over micro-batches, mean over ranks) is the full-batch loss
    assert dp_loss == pytest.approx(full_loss, abs=1e-9)


def test_per_micro_batch_token_means_would_not_be_exact_on_the_same_case():
    # The control for the test above: averaging local token-means (what one gets without
    # global_batch_info) misweights tokens when lengths are ragged, by far more than 1e-6.
    weight, features, lengths, batch = ragged_mini_batch()
    _, full_grad = full_batch_gradient("token-mean", weight, features, batch)
    rank_grads = []
    for micro_batches in RANK_MICRO_BATCHES:
        rank_weight = weight.clone().requires_grad_(True)
        for rows in micro_batches:
            loss, _ = compute_policy_loss_dapo(
                old_log_prob=batch["old_log_probs"][rows],
                log_prob=response_log_probs(rank_weight, features[rows], batch["responses"][rows]),
                advantages=batch["advantages"][rows],
                response_mask=batch["response_mask"][rows],
                loss_agg_mode="token-mean",
                config=actor_config(),
            )
            (loss / len(micro_batches)).backward()
        rank_grads.append(rank_weight.grad)
    naive_grad = torch.stack(rank_grads).mean(0)
    assert (naive_grad - full_grad).abs().max().item() > 1e-3


def test_a_mini_batch_with_no_valid_token_gives_a_zero_loss_not_nan_through_verls_actor_loss():
    # Overlong filtering can mask every response of a mini-batch: verl then fills batch_num_tokens = 0.
    # Without the guard agg_loss gives 0/0 = NaN for the policy loss and for the entropy term
    # ppo_loss adds afterwards (0 * NaN is NaN even with entropy_coeff = 0).
    weight, features, lengths, batch = ragged_mini_batch()
    rows = [0, 1]
    batch["response_mask"] = torch.zeros_like(batch["response_mask"])
    td = actor_micro_batch(rows, batch, dp_size=2, batch_num_tokens=0, global_batch_size=4)
    weight = weight.clone().requires_grad_(True)
    log_probs = response_log_probs(weight, features[rows], batch["responses"][rows])
    flat = flat_model_output(log_probs, [lengths[row] for row in rows])
    model_output = {"log_probs": flat, "entropy": flat * 0 + 1.0}
    loss, metrics = ppo_loss(actor_config(entropy_coeff=0.0), model_output, td)
    loss.backward()

    assert loss.item() == 0.0
    assert torch.all(weight.grad == 0.0)
    assert metrics["actor/entropy_loss"].aggregate() == 0.0
    assert all(math.isfinite(metrics[name].aggregate()) for name in DAPO_METRIC_NAMES)
