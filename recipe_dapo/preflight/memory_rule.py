"""The start-up rule of the memory plan: refuse a shape whose planned per-GPU peak exceeds the card, naming the phase,
the term that decides it and the cheapest change that makes it fit; warn when vLLM's KV cache cannot hold one wave of
a generation round, unless the launch says why that is expected (``dapo.memory.kv_waves_expected``). Pure
(``recipe_dapo.preflight.memory_plan``); skipped on ``platform=cpu``, where ``recipe_dapo.cpu.memory`` checks the
host's memory instead."""

from __future__ import annotations

import logging
import math
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, select

# memory_plan is imported where it is used: `python -m recipe_dapo.preflight.memory_plan` must not find it imported
# by the package first (runpy's warning)
ACTOR, MODEL, REF, ROLLOUT = ("actor_rollout_ref.actor", "actor_rollout_ref.model", "actor_rollout_ref.ref",
                              "actor_rollout_ref.rollout")

logger = logging.getLogger(__name__)


def rule_memory_plan(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Every phase's planned peak fits the GPU (``dapo.memory.gpu_memory_gib``); ``dapo.memory.enforce=false`` turns
    the refusal into a warning."""
    if str(select(config, "trainer.device", "cuda")) == "cpu":
        return []
    from recipe_dapo.preflight.memory_plan import GPU_MISSING, PlanInputMissing, card_mismatch, plan_for_config

    try:
        plan = plan_for_config(config)
    except PlanInputMissing as exc:
        logger.warning("%s", exc)
        return []
    except (TypeError, ValueError, KeyError) as exc:  # a value the plan cannot read: never block a start-up on it
        logger.warning("memory plan: not made (%s: %s); the start-up goes on unchecked", type(exc).__name__, exc)
        return []
    if plan.gpu_bytes is None:
        logger.info("%s", GPU_MISSING)
        return []
    mismatch = card_mismatch(plan)
    if mismatch:
        logger.warning("%s", mismatch)
    problems = [over_budget_message(plan, phase) for phase in plan.over_budget()]
    if plan.kv is not None and not plan.kv.holds_one_wave:
        reason = select(config, KV_WAVES_KNOB, None)
        if reason:
            logger.info("%s; expected here (%s): %s", kv_waves_line(plan), KV_WAVES_KNOB, reason)
        else:
            logger.warning(
                "%s; raise %s.gpu_memory_utilization, %s.tensor_model_parallel_size or lower %s.max_num_seqs, or, "
                "when it is expected, say why in %s", kv_waves_line(plan), ROLLOUT, ROLLOUT, ROLLOUT, KV_WAVES_KNOB)
    if problems and not bool(select(config, "dapo.memory.enforce", True)):
        for problem in problems:
            logger.warning("%s (dapo.memory.enforce=false: starting anyway)", problem)
        return []
    return problems


KV_WAVES_KNOB = "dapo.memory.kv_waves_expected"
"""The reason a launch gives for a KV cache that cannot hold one wave of a round (``MemorySettings``)."""


def kv_waves_line(plan) -> str:
    """The KV cache's shortfall in words: full-length sequences it holds (and at the expected lengths, when planned)
    against what one replica runs at once."""
    from recipe_dapo.preflight.memory_plan import gib

    kv, lay = plan.kv, plan.layout
    at_expected = ""
    if lay is not None and lay.expected_prompt is not None and lay.expected_response is not None:
        expected_tokens = lay.expected_prompt + lay.expected_response
        at_expected = f" ({kv.tokens // max(expected_tokens, 1):,} at the expected {expected_tokens:,})"
    return (f"memory plan: vLLM's KV cache ({gib(kv.cache_bytes)} GiB per TP rank) holds {kv.full_sequences:,} "
            f"full-length sequences of {kv.sequence_tokens:,} tokens{at_expected}, fewer than the "
            f"{kv.sequences_at_once:,} one replica runs at once (min(max_num_seqs, a round's sequences per replica)): "
            "vLLM will run them in waves or preempt")


def plan_lines(config: DictConfig) -> list[str]:
    """What a dry run prints: the plan's table, or the one line naming the missing input (nothing on CPU)."""
    if str(select(config, "trainer.device", "cuda")) == "cpu":
        return []
    from recipe_dapo.preflight.memory_plan import GPU_MISSING, PlanInputMissing, card_mismatch, plan_for_config

    try:
        plan = plan_for_config(config)
    except PlanInputMissing as exc:
        return [str(exc)]
    except (TypeError, ValueError, KeyError) as exc:
        return [f"memory plan: not made ({type(exc).__name__}: {exc})"]
    lines = plan.table()
    lines += [line for line in (GPU_MISSING if plan.gpu_bytes is None else card_mismatch(plan),) if line]
    for phase in plan.over_budget():
        lines.append(f"does not fit: {phase.name}: fix: {cheapest_fix(plan, phase)}")
    return lines


def over_budget_message(plan, phase) -> str:
    from recipe_dapo.preflight.memory_plan import gib

    largest = phase.largest
    expected = ""
    if plan.expected:
        at_mean = plan.expected_peak(phase)
        expected = (f"; at the expected token counts it needs {gib(at_mean)} GiB"
                    + (" and would fit until sequences reach their maximum length" if at_mean <= plan.gpu_bytes
                       else ""))
    return (f"memory plan: {phase.name} needs {gib(phase.peak)} GiB per GPU with every sequence at its maximum "
            f"length, more than the {gib(plan.gpu_bytes)} GiB card (dapo.memory.gpu_memory_gib); the largest term is "
            f"{largest.name} ({gib(largest.bytes)} GiB){expected}; fix: {cheapest_fix(plan, phase)} (python -m "
            "recipe_dapo.preflight.memory_plan --details lists every term; dapo.memory.enforce=false starts anyway)")


def tokens_that_fit(plan, phase) -> int:
    """The micro-batch tokens at which ``phase`` just fits (its per-token terms scale linearly)."""
    per_token = sum(t.bytes for t in phase.terms if t.per_token)
    fixed = phase.peak - per_token
    if not per_token or not phase.tokens or plan.gpu_bytes <= fixed:
        return 0
    return int(phase.tokens * (plan.gpu_bytes - fixed) / per_token)


def cheapest_fix(plan, phase) -> str:
    """The one change that makes ``phase`` fit, cheapest first (a smaller micro-batch before offload or more GPUs)."""
    from recipe_dapo.preflight.memory_plan import gib

    lay = plan.layout
    over = phase.peak - plan.gpu_bytes
    seq = lay.sequence_tokens
    if phase.name == "rollout":
        fixes = []
        if not lay.param_offload and not lay.offload_policy:
            fixes.append((phase.term(next(t.name for t in phase.terms if t.name.startswith("actor parameters"))),
                          f"set {ACTOR}.fsdp_config.param_offload=true (frees the actor's parameters while vLLM "
                          "generates)"))
        if not lay.optimizer_offload and not lay.offload_policy:
            adam = next((t for t in phase.terms if t.name.startswith("AdamW")), None)
            fixes.append((adam.bytes if adam else 0, f"set {ACTOR}.fsdp_config.optimizer_offload=true (frees AdamW's "
                                                     "moments while vLLM generates)"))
        for freed, fix in fixes:
            if freed >= over:
                return fix
        util = math.floor(100 * (lay.gpu_memory_utilization - over / plan.gpu_bytes)) / 100
        if util >= 0.1:
            return f"lower {ROLLOUT}.gpu_memory_utilization to {util:.2f} (a smaller KV cache)"
        return "offload the actor (param_offload and optimizer_offload) and lower gpu_memory_utilization"
    if phase.name == "optimizer step":
        return (f"set {ACTOR}.strategy=fsdp2 and {ACTOR}.fsdp_config.offload_policy=true (parameters, gradients and "
                "AdamW on the host), or more GPUs: the states are sharded over them")
    fit = tokens_that_fit(plan, phase)
    sp = lay.sp if phase.name != "ref log-prob" else lay.ref_sp
    needed = math.ceil(seq / sp)
    keys = {"actor update": (f"{ACTOR}.ppo_max_token_len_per_gpu", f"{ACTOR}.ppo_micro_batch_size_per_gpu"),
            "old log-prob": (f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
                             f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
            "ref log-prob": (f"{REF}.log_prob_max_token_len_per_gpu", f"{REF}.log_prob_micro_batch_size_per_gpu")}
    budget_key, micro_key = keys[phase.name]
    if fit >= needed:
        if lay.dynamic:
            value = max(needed, fit // 1024 * 1024)
            return f"lower {budget_key} to {value} (from {phase.tokens})"
        micro = fit * sp // seq
        if micro >= 1:
            return f"lower {micro_key} to {micro}"
    if phase.name == "actor update" and not lay.gradient_checkpointing:
        return f"set {MODEL}.enable_gradient_checkpointing=true"
    if phase.name == "old log-prob" and not lay.entropy_chunk and not lay.compiled_entropy:
        return f"set {ACTOR}.entropy_from_logits_with_chunking=true (the entropy in chunks of 2048 tokens)"
    if phase.name == "actor update" and lay.entropy_in_update and lay.remove_padding and (
            not lay.compiled_entropy or lay.entropy_chunk):
        # checkpointing the entropy does not lower its backward's peak; the compiled entropy keeps no
        # [tokens, vocab] tensor of its own but its gradient
        return (f"set {ACTOR}.fsdp_config.use_torch_compile=true and "
                f"{ACTOR}.fsdp_config.entropy_from_logits_with_chunking=false (the compiled entropy: one "
                "[tokens, vocab] gradient instead of the softmax and logsumexp's backward)")
    states = sum(t.bytes for t in phase.terms if not t.per_token)
    if states >= plan.gpu_bytes:
        return (f"more GPUs or {ACTOR}.strategy=fsdp2 with {ACTOR}.fsdp_config.offload_policy=true: the model states "
                f"alone take {gib(states)} GiB")
    return (f"raise {ACTOR}.ulysses_sequence_parallel_size to {sp * 2} (a sequence's tokens split over more GPUs; "
            f"the longest sequence, {seq} tokens, does not fit at {sp})")
