"""Each objective's loss, as its preset configures it, is exact under micro-batch and data-parallel re-splitting: verl's
own actor loss (``ppo_loss``, the registered policy loss, the KL term, ``global_batch_info``) on two ranks of uneven
micro-batches gives the loss and the gradient of a reference written from the objective's paper formula on the whole
mini-batch, and a wrong aggregation (each micro-batch's own mean, averaged) fails the same comparison. The KL
estimators are checked against their formulas. Clip-Cov and KL-Cov select their tokens per micro-batch in verl 0.9.1:
they equal their paper formula on one micro-batch, and a test pins that a re-split changes them."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn, kl_penalty
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from conftest import compose_recipe_config
from test_dapo_loss_on_cpu import (RANK_MICRO_BATCHES, actor_micro_batch, flat_model_output,
                                   ragged_mini_batch, response_log_probs)

WIDTH = 9  # ragged_mini_batch's response width = data.max_response_length here (Dr.GRPO's constant)
EXACT_OBJECTIVES = ["dapo", "grpo", "dr_grpo", "gspo", "cispo", "grpo_process"]


def preset_actor(objective: str, **overrides):
    """verl's ActorConfig built from the composed ``objective=`` preset (as the workers build it)."""
    config = compose_recipe_config([f"objective={objective}", f"data.max_response_length={WIDTH}"])
    actor = OmegaConf.create(OmegaConf.to_container(config.actor_rollout_ref.actor, resolve=True))
    for key, value in overrides.items():
        OmegaConf.update(actor, key, value)
    return omega_conf_to_dataclass(actor)


def mini_batch(seed=0):
    weight, features, lengths, batch = ragged_mini_batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    batch["ref_log_prob"] = batch["old_log_probs"] + 0.3 * torch.randn(batch["old_log_probs"].shape, generator=gen,
                                                                       dtype=torch.float64)
    return weight, features, lengths, batch


# ------------------------------------------------------------------------------- the paper formulas, per response
def ppo_clip(log_ratio, adv, eps_low, eps_high, c=None):
    ratio = torch.exp(log_ratio)
    objective = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    if c is not None and adv < 0:
        objective = torch.clamp(objective, min=c * adv)
    return objective


def k3(log_prob, ref_log_prob):
    """Schulman's k3: pi_ref/pi - log(pi_ref/pi) - 1 (GRPO's per-token KL, DeepSeekMath eq. 4)."""
    log_ref_ratio = ref_log_prob - log_prob
    return torch.exp(log_ref_ratio) - log_ref_ratio - 1


def reference_loss(objective, actor, log_prob, batch):
    """The loss to minimise, from each paper's formula, one response and one token at a time."""
    eps_low, eps_high, c = actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c
    rows = range(log_prob.shape[0])
    terms, total_tokens = [], int(batch["response_mask"].sum())
    for i in rows:
        valid = batch["response_mask"][i].nonzero().flatten().tolist()
        adv = float(batch["advantages"][i, 0])
        lp, old, ref = log_prob[i, valid], batch["old_log_probs"][i, valid], batch["ref_log_prob"][i, valid]
        if objective == "gspo":  # GSPO eq. 5-7: one ratio per response, the geometric mean of its token ratios
            s = torch.exp((lp - old).mean())
            terms.append(torch.minimum(s * adv, torch.clamp(s, 1 - eps_low, 1 + eps_high) * adv))
            continue
        if objective == "cispo":  # MiniMax-M1 eq. 4: sg(clipped IS weight) * A * log pi, over all tokens
            weight = torch.clamp(torch.exp(lp - old), 1 - eps_low, 1 + eps_high).detach()
            terms.append((weight * adv * lp).sum() / total_tokens)
            continue
        per_token = torch.stack([ppo_clip(lp[t] - old[t], adv, eps_low, eps_high, c) for t in range(len(valid))])
        if objective == "dapo":  # DAPO eq. 10: token-level, over all tokens of the mini-batch
            terms.append(per_token.sum() / total_tokens)
        elif objective in ("grpo", "grpo_process"):  # DeepSeekMath eq. 3: mean over own tokens, KL in the loss
            terms.append((per_token - actor.kl_loss_coef * k3(lp, ref)).mean())
        elif objective == "dr_grpo":  # Dr.GRPO: a constant normaliser (the generation budget) per response
            terms.append(per_token.sum() / WIDTH)
    if objective in ("dapo", "cispo"):
        return -torch.stack(terms).sum()
    return -torch.stack(terms).mean()  # (1/G) sum over responses


def reference(objective, actor, weight, features, batch):
    weight = weight.clone().requires_grad_(True)
    loss = reference_loss(objective, actor, response_log_probs(weight, features, batch["responses"]), batch)
    loss.backward()
    return loss.item(), weight.grad


# ------------------------------------------------------------------------------- verl's actor path, re-split
def micro_batch(rows, batch, dp_size, batch_num_tokens, global_batch_size):
    """The dapo tests' micro-batch with the reference log-probs the KL terms read."""
    return actor_micro_batch(rows, batch, dp_size, batch_num_tokens, global_batch_size, extra=("ref_log_prob",))


def resplit(actor, weight, features, lengths, batch, rank_micro_batches, global_info=True):
    """Per rank, per micro-batch ppo_loss -> backward (gradients accumulate); the ranks' gradients averaged (FSDP).
    ``global_info=False``: the wrong aggregation, each micro-batch its own mean, averaged over micro-batches."""
    dp_size = len(rank_micro_batches)
    all_rows = [row for micro_batches in rank_micro_batches for rows in micro_batches for row in rows]
    tokens, sequences = int(batch["response_mask"][all_rows].sum()), len(all_rows)
    grads, losses = [], []
    for micro_batches in rank_micro_batches:
        rank_weight, rank_loss = weight.clone().requires_grad_(True), 0.0
        for rows in micro_batches:
            info = (dp_size, tokens, sequences) if global_info else (1, None, None)
            td = micro_batch(rows, batch, *info)
            log_probs = response_log_probs(rank_weight, features[rows], batch["responses"][rows])
            loss, _ = ppo_loss(actor, {"log_probs": flat_model_output(log_probs, [lengths[r] for r in rows])}, td)
            if not global_info:
                loss = loss / len(micro_batches)
            loss.backward()
            rank_loss += loss.item()
        grads.append(rank_weight.grad)
        losses.append(rank_loss)
    # as verl logs it: summed over a rank's micro-batches, averaged over the ranks
    return sum(losses) / dp_size, torch.stack(grads).mean(0)


@pytest.mark.parametrize("objective", EXACT_OBJECTIVES)
def test_each_objectives_loss_is_exact_under_micro_batch_and_data_parallel_resplitting(objective):
    actor = preset_actor(objective)
    weight, features, lengths, batch = mini_batch()
    full_loss, full_grad = reference(objective, actor, weight, features, batch)
    split_loss, split_grad = resplit(actor, weight, features, lengths, batch, RANK_MICRO_BATCHES)
    assert full_grad.abs().max() > 1e-3  # a real gradient, not two zeros agreeing
    assert split_loss == pytest.approx(full_loss, abs=1e-9, rel=1e-9)
    assert (split_grad - full_grad).abs().max().item() < 1e-9


@pytest.mark.parametrize("objective", EXACT_OBJECTIVES)
def test_a_wrong_aggregation_fails_the_same_comparison(objective):
    # the control: each micro-batch normalised by its own tokens / responses, the means averaged
    actor = preset_actor(objective)
    weight, features, lengths, batch = mini_batch()
    full_loss, full_grad = reference(objective, actor, weight, features, batch)
    _, split_grad = resplit(actor, weight, features, lengths, batch, RANK_MICRO_BATCHES, global_info=False)
    assert (split_grad - full_grad).abs().max().item() > 1e-4


def test_the_grpo_reference_counts_its_kl_term():
    # positive control of the KL part of the grpo reference: without the KL the two disagree
    actor = preset_actor("grpo")
    weight, features, lengths, batch = mini_batch()
    _, with_kl = reference("grpo", actor, weight, features, batch)
    _, without = reference("grpo", preset_actor("grpo", kl_loss_coef=0.0), weight, features, batch)
    _, split_grad = resplit(actor, weight, features, lengths, batch, RANK_MICRO_BATCHES)
    assert (with_kl - without).abs().max() > 1e-3
    assert (split_grad - with_kl).abs().max() < 1e-9


# ------------------------------------------------------------------------------- KL estimators
LOG_PROB = torch.tensor([-0.2, -1.0, -3.0, -0.5], dtype=torch.float64)
REF_LOG_PROB = torch.tensor([-0.3, -0.4, -3.5, -0.5], dtype=torch.float64)
FORMULAS = {
    # log r = log pi - log pi_ref; the estimates of KL(pi || pi_ref) on samples from pi (Schulman, 2020)
    "k1": lambda lr: lr,
    "kl": lambda lr: lr,
    "k2": lambda lr: 0.5 * lr ** 2,
    "mse": lambda lr: 0.5 * lr ** 2,
    "k3": lambda lr: torch.exp(-lr) - 1 + lr,
    "low_var_kl": lambda lr: torch.exp(-lr) - 1 + lr,
    "abs": lambda lr: lr.abs(),
}


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_each_kl_estimator_is_its_formula(name):
    log_prob = LOG_PROB.clone().requires_grad_(True)
    value = kl_penalty(log_prob, REF_LOG_PROB, name)
    expected = FORMULAS[name](LOG_PROB - REF_LOG_PROB)
    assert torch.allclose(value, expected, atol=1e-12)
    value.sum().backward()
    expected_grad = torch.autograd.functional.jacobian(lambda lp: FORMULAS[name](lp - REF_LOG_PROB).sum(), LOG_PROB)
    assert torch.allclose(log_prob.grad, expected_grad, atol=1e-12)


@pytest.mark.parametrize("name", ["k1", "k3", "low_var_kl", "abs"])
def test_the_straight_through_form_keeps_the_value_and_takes_k2s_gradient(name):
    log_prob = LOG_PROB.clone().requires_grad_(True)
    value = kl_penalty(log_prob, REF_LOG_PROB, name + "+")
    assert torch.allclose(value, FORMULAS[name](LOG_PROB - REF_LOG_PROB), atol=1e-12)
    value.sum().backward()
    assert torch.allclose(log_prob.grad, LOG_PROB - REF_LOG_PROB, atol=1e-12)  # d/dlp of (lp - ref)^2 / 2


def test_k1_and_k3_are_unbiased_k3_nonnegative_and_k2_biased_on_samples_from_the_policy():
    gen = torch.Generator().manual_seed(0)
    policy = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    true_kl = float((policy * (policy / ref).log()).sum())
    samples = torch.multinomial(policy, 200_000, replacement=True, generator=gen)
    lp, ref_lp = policy.log()[samples], ref.log()[samples]
    estimates = {name: float(kl_penalty(lp, ref_lp, name).mean()) for name in ("k1", "k2", "k3")}
    assert estimates["k1"] == pytest.approx(true_kl, rel=0.02)
    assert estimates["k3"] == pytest.approx(true_kl, rel=0.02)
    assert abs(estimates["k2"] - true_kl) > 0.05 * true_kl
    assert float(kl_penalty(lp, ref_lp, "k3").min()) >= 0 > float(kl_penalty(lp, ref_lp, "k1").min())


# ------------------------------------------------------------------------------- covariance losses
def covariance(batch, log_prob):
    mask = batch["response_mask"]
    adv, lp = batch["advantages"][mask], log_prob.detach()[mask]
    return (adv - adv.mean()) * (lp - lp.mean())


def kl_cov_reference(actor, log_prob, batch):
    """KL-Cov (arXiv 2505.22617 eq. 12): the top k·N tokens by covariance get beta·|log pi - log pi_old| added to the
    unclipped surrogate; token-mean over the mini-batch."""
    mask = batch["response_mask"]
    log_ratio = (log_prob - batch["old_log_probs"])[mask]
    token_loss = -batch["advantages"][mask] * torch.exp(log_ratio)
    cov = covariance(batch, log_prob)
    count = max(1, int(cov.numel() * actor.policy_loss.kl_cov_ratio))
    chosen = torch.topk(cov, count).indices
    penalty = torch.zeros_like(token_loss)
    penalty[chosen] = actor.policy_loss.ppo_kl_coef * log_ratio[chosen].abs()
    return (token_loss + penalty).sum() / mask.sum()


def test_kl_cov_is_its_paper_formula_on_one_micro_batch_and_changes_when_resplit():
    actor = preset_actor("kl_cov", **{"policy_loss.kl_cov_ratio": 0.1})
    weight, features, lengths, batch = mini_batch()
    weight = weight.clone().requires_grad_(True)
    log_prob = response_log_probs(weight, features, batch["responses"])
    loss_fn = get_policy_loss_fn("kl_cov")
    one, _ = loss_fn(old_log_prob=batch["old_log_probs"], log_prob=log_prob, advantages=batch["advantages"],
                     response_mask=batch["response_mask"], loss_agg_mode="token-mean", config=actor)
    assert one.item() == pytest.approx(kl_cov_reference(actor, log_prob, batch).item(), rel=1e-12)
    # re-split: each micro-batch centres the covariance on its own tokens and takes its own top k
    split_loss, _ = resplit(actor, weight.detach(), features, lengths, batch, RANK_MICRO_BATCHES)
    assert abs(split_loss - one.item()) > 1e-6


def test_clip_cov_detaches_tokens_chosen_per_micro_batch_so_a_resplit_changes_which():
    # Clip-Cov's candidates: tokens whose covariance lies in (lb, ub), chosen within each micro-batch. Take every
    # candidate (a ratio of 1) so verl's random choice is no choice, and compare the candidate sets.
    actor = preset_actor("clip_cov", **{"policy_loss.clip_cov_lb": 0.05, "policy_loss.clip_cov_ub": 5.0})
    weight, features, lengths, batch = mini_batch()
    log_prob = response_log_probs(weight, features, batch["responses"])
    whole = covariance(batch, log_prob)
    whole_candidates = set(((whole > 0.05) & (whole < 5.0)).nonzero().flatten().tolist())
    flat_index = torch.arange(batch["response_mask"].numel()).reshape(batch["response_mask"].shape)
    split_candidates = set()
    for micro_batches in RANK_MICRO_BATCHES:
        for rows in micro_batches:
            part = {key: value[rows] for key, value in batch.items()}
            cov = covariance(part, log_prob[rows])
            positions = flat_index[rows][part["response_mask"]]
            split_candidates |= set(positions[(cov > 0.05) & (cov < 5.0)].tolist())
    whole_positions = set(flat_index[batch["response_mask"]][sorted(whole_candidates)].tolist())
    assert whole_positions and split_candidates and whole_positions != split_candidates
