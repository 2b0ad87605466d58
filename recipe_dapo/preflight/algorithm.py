"""Rules of the algorithm: a group advantage estimator without a critic, the clip bounds of the loss, and the policy
objective's keys agreeing with one another (aggregation, normalisation, KL estimator, the objective's own keys)."""

from __future__ import annotations

import logging
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select

logger = logging.getLogger(__name__)

ACTOR = "actor_rollout_ref.actor"

# Outcome-reward estimators that compute advantages from groups of responses without a critic.
GROUP_ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "grpo_passk", "opo", "gpg", "optimal_token_baseline",
                              "grpo_process")


def rule_algorithm(config: DictConfig, report: CheckReport) -> Iterable[str]:
    estimator = str(select(config, "algorithm.adv_estimator"))
    critic = select(config, "critic.enable", None)
    if estimator == "gae" or critic:
        yield (
            f"algorithm.adv_estimator={estimator} (critic.enable={critic}) needs a critic, which DAPO does not "
            "use; set algorithm.adv_estimator=grpo (the paper's group-normalised advantages) and critic.enable=null"
        )
    elif estimator not in GROUP_ADVANTAGE_ESTIMATORS:
        logger.warning("algorithm.adv_estimator=%s is not a group estimator the recipe was tested with", estimator)


def rule_clip(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.loss.clip import clip_problems

    yield from clip_problems(select(config, "actor_rollout_ref.actor"))


def rule_behaviour_correction(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """A behaviour-policy correction must have something to weigh by, and ``dapo.behaviour_correction`` a known mode."""
    from recipe_dapo.policy_lag.correction import CORRECTION_MODES, configured_level

    mode = select(config, "dapo.behaviour_correction", "auto")
    if mode not in CORRECTION_MODES:
        yield (f"dapo.behaviour_correction={mode!r} is not one of {', '.join(CORRECTION_MODES)}: auto corrects "
               "wherever an older policy's rows can be trained, on always, off never")
        return
    correction = select(config, "algorithm.rollout_correction", None)
    uses_rollout_log_probs = configured_level(correction) or (correction and (
        correction.get("rollout_rs") or correction.get("bypass_mode")))
    if uses_rollout_log_probs and not select(config, "actor_rollout_ref.rollout.calculate_log_probs", True):
        yield ("algorithm.rollout_correction weighs tokens by the rollout engine's log-probs, but "
               "actor_rollout_ref.rollout.calculate_log_probs=false: the rollout sends none, so the correction would "
               "apply to nothing; set actor_rollout_ref.rollout.calculate_log_probs=true, or turn the correction off "
               "(dapo.behaviour_correction=off, algorithm.rollout_correction.rollout_is=null)")


# verl 0.9.1's kl_penalty forms (core_algos.kl_penalty_forward) usable in the loss, and what each computes per token
# with log r = log pi - log pi_ref (docs/objectives.md); a trailing "+" adds the straight-through k2 gradient.
KL_ESTIMATORS = {
    "k1": "log r (unbiased for KL(pi || pi_ref); can be negative)",
    "kl": "= k1",
    "k2": "(log r)^2 / 2 (biased; its gradient is the KL's)",
    "mse": "= k2",
    "k3": "1/r - 1 + log r, clamped to [-10, 10] (unbiased, non-negative, low variance)",
    "low_var_kl": "= k3",
    "abs": "|log r|",
}
DR_GRPO_AGGREGATION = "seq-mean-token-sum-norm"
LENGTH_NORMALISED = "seq-mean-token-mean"
COVARIANCE_RATIOS = {"clip_cov": "clip_cov_ratio", "kl_cov": "kl_cov_ratio"}


def kl_estimator_names() -> list[str]:
    """Every accepted ``kl_loss_type``: the forms above and each with the straight-through ``+``."""
    return [*KL_ESTIMATORS, *(f"{name}+" for name in KL_ESTIMATORS)]


def rule_objective(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The policy objective's keys agree with one another (the ``objective=`` presets pass; a contradiction is
    refused)."""
    from recipe_dapo.advantages import GRPO_PROCESS, STEP_SCORERS
    from recipe_dapo.loss.reference_reset import reference_reset_problems

    actor = select(config, ACTOR)
    agg = actor.get("loss_agg_mode")
    scale = actor.get("loss_scale_factor", None)
    estimator = str(select(config, "algorithm.adv_estimator"))
    loss_mode = select(config, f"{ACTOR}.policy_loss.loss_mode")
    if agg == DR_GRPO_AGGREGATION and scale is None:
        yield (
            f"{ACTOR}.loss_agg_mode={agg} with {ACTOR}.loss_scale_factor=null divides by the padded width of each "
            "micro-batch, which changes with how a mini-batch is split; set loss_scale_factor to a constant "
            "(Dr.GRPO: ${data.max_response_length}, as objective=dr_grpo does)"
        )
    if scale is not None and agg != DR_GRPO_AGGREGATION:
        yield (
            f"{ACTOR}.loss_scale_factor={scale} is read only by loss_agg_mode={DR_GRPO_AGGREGATION} (this run: {agg}); "
            "set it to null, or use that aggregation (objective=dr_grpo)"
        )
    if estimator in ("grpo", GRPO_PROCESS) and not select(config, "algorithm.norm_adv_by_std_in_grpo", True) \
            and agg == LENGTH_NORMALISED:
        yield (
            f"algorithm.norm_adv_by_std_in_grpo=false (Dr.GRPO) with {ACTOR}.loss_agg_mode={agg}: Dr.GRPO removes both "
            "of GRPO's normalisations, and this aggregation keeps the division by each response's length; use "
            f"loss_agg_mode={DR_GRPO_AGGREGATION} with loss_scale_factor (objective=dr_grpo), or token-mean"
        )
    yield from _kl_problems(config, actor)
    if loss_mode == "gspo" and agg != LENGTH_NORMALISED:
        yield (
            f"{ACTOR}.policy_loss.loss_mode=gspo with loss_agg_mode={agg}: GSPO's objective is a mean over responses "
            f"of one sequence-level term each; set loss_agg_mode={LENGTH_NORMALISED} (objective=gspo)"
        )
    if loss_mode in COVARIANCE_RATIOS:
        logger.warning(
            "policy_loss.loss_mode=%s: verl 0.9.1 centres the covariance and counts the selected tokens per "
            "micro-batch, so the selection (and the loss) depends on how a mini-batch is split "
            "(docs/objectives.md); the other objectives are exact under re-splitting", loss_mode,
        )
        key = COVARIANCE_RATIOS[loss_mode]
        ratio = select(config, f"{ACTOR}.policy_loss.{key}")
        if ratio is None or not 0.0 < float(ratio) < 1.0:
            yield (
                f"{ACTOR}.policy_loss.{key}={ratio} must lie in (0, 1): the fraction of a micro-batch's tokens "
                f"{loss_mode} selects (the paper: 2e-4 for Clip-Cov, 2e-3 for KL-Cov)"
            )
    if loss_mode == "clip_cov":
        low, high = (select(config, f"{ACTOR}.policy_loss.clip_cov_{end}") for end in ("lb", "ub"))
        if low is None or high is None or not float(low) < float(high):
            yield (
                f"{ACTOR}.policy_loss.clip_cov_lb={low} must be below clip_cov_ub={high}: Clip-Cov detaches tokens "
                "whose covariance lies between them (the paper: 1 and 5)"
            )
    if loss_mode == "kl_cov" and not float(select(config, f"{ACTOR}.policy_loss.ppo_kl_coef", 0) or 0) > 0:
        yield (f"{ACTOR}.policy_loss.ppo_kl_coef must be > 0 with loss_mode=kl_cov (the KL-Cov penalty's beta; the "
               "paper: 1)")
    yield from reference_reset_problems(
        select(config, "dapo.objective.reference_reset_every", 0),
        uses_reference=bool(actor.get("use_kl_loss", False))
        or bool(select(config, "algorithm.use_kl_in_reward", False)),
        lora=bool(select(config, "actor_rollout_ref.model.lora_rank", 0)
                  or select(config, "actor_rollout_ref.model.lora.rank", 0)
                  or select(config, "actor_rollout_ref.model.lora_adapter_path", None)),
        use_v1=bool(select(config, "trainer.use_v1", False)),
    )
    if estimator == GRPO_PROCESS:
        scorer = select(config, "dapo.objective.step_scorer")
        if scorer not in STEP_SCORERS:
            yield f"dapo.objective.step_scorer={scorer!r} is not a step scorer; choose one of {list(STEP_SCORERS)}"
        if select(config, "trainer.use_v1", False):
            yield (
                f"algorithm.adv_estimator={GRPO_PROCESS} scores the steps in the classic trainer only; set "
                "trainer.use_v1=false"
            )
        if select(config, "algorithm.use_kl_in_reward", False):
            yield (
                f"algorithm.adv_estimator={GRPO_PROCESS} with algorithm.use_kl_in_reward=true: the per-token KL "
                "penalty would be read as step rewards; put the KL in the loss (actor.use_kl_loss, "
                "objective=grpo_process)"
            )


def _kl_problems(config: DictConfig, actor) -> Iterable[str]:
    use_kl_loss = bool(actor.get("use_kl_loss", False))
    coef = float(actor.get("kl_loss_coef", 0.0) or 0.0)
    kind = actor.get("kl_loss_type")
    if use_kl_loss:
        if not coef > 0:
            yield (
                f"{ACTOR}.use_kl_loss=true with kl_loss_coef={coef}: the reference model would run for a term of "
                "weight 0; set kl_loss_coef > 0 (DeepSeekMath's GRPO: 0.04) or use_kl_loss=false"
            )
        if kind not in kl_estimator_names():
            yield (
                f"{ACTOR}.kl_loss_type={kind!r} is not a KL estimator the loss can use; choose one of "
                f"{kl_estimator_names()} (docs/objectives.md says what each estimates)"
            )
        if select(config, "algorithm.use_kl_in_reward", False):
            yield (
                f"{ACTOR}.use_kl_loss=true and algorithm.use_kl_in_reward=true penalise the KL twice; keep one "
                "(GRPO puts it in the loss)"
            )
    elif coef != 0:
        yield (
            f"{ACTOR}.kl_loss_coef={coef} has no effect with use_kl_loss=false; set use_kl_loss=true for a KL term "
            "in the loss (objective=grpo), or kl_loss_coef=0"
        )
