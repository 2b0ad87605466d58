"""The memory plan follows verl's backward as it is: the update's [tokens, vocab] tensors with and without the entropy
(verl turns flash-attn's in-place cross-entropy backward off when it computes the entropy), checkpointed, chunked and
compiled, checked against torch's own accounting on CPU (``bench/memory_plan_check.py``'s check)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from recipe_dapo.preflight.memory_plan import (
    ENTROPY_BACKWARD, LOGITS_AT_FORWARD_END, ModelFacts, plan_memory, update_logits_moments,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "bench"))
check = pytest.importorskip("memory_plan_check")

HAND = ModelFacts(name="hand", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1000,
                  tied=False)


def update_phase(layout):
    return next(p for p in plan_memory(layout, HAND, None).phases if p.name == "actor update")


def test_entropy_in_the_update_turns_the_in_place_backward_off_and_adds_its_backward():
    # Packed batches through flash-attn's kernel, 256 tokens x 8,192 vocabulary, bf16 (one copy: 4 MiB).
    off = check.logits_layout("off", flash=True, grad=True)
    copy = 256 * 8192 * 2
    moments = update_logits_moments(256, 8192, 2, off)
    assert list(moments) == [LOGITS_AT_FORWARD_END]
    assert moments[LOGITS_AT_FORWARD_END][0].bytes == copy  # the gradient written into the logits
    # The entropy on: the logits, their own gradient, the saved softmax, softmax's pending gradient and
    # logsumexp's three backward temporaries: 7 copies on CPU (bf16 softmax).
    eager = update_logits_moments(256, 8192, 2, check.logits_layout("eager", flash=True, grad=True))
    assert sum(t.bytes for t in eager[ENTROPY_BACKWARD]) == 7 * copy
    # On GPUs CUDA autocast runs softmax and logsumexp in fp32 and logsumexp keeps an fp32 copy of the logits:
    # 2 bf16 + 6 fp32 = 14 bf16 copies.
    cuda = dataclasses.replace(check.logits_layout("eager", flash=True, grad=True), device="cuda")
    assert sum(t.bytes for t in update_logits_moments(256, 8192, 2, cuda)[ENTROPY_BACKWARD]) == 14 * copy
    # Checkpointing lowers the end of the forward, not the backward (one more gradient of the logits, torch's).
    ckpt = update_logits_moments(256, 8192, 2, check.logits_layout("checkpointed", flash=True, grad=True))
    assert sum(t.bytes for t in ckpt[LOGITS_AT_FORWARD_END]) == copy
    assert sum(t.bytes for t in ckpt[ENTROPY_BACKWARD]) == 8 * copy
    # Compiled: the logits, their gradient and the compiled backward's gradient.
    compiled = update_logits_moments(256, 8192, 2, check.logits_layout("compiled", flash=True, grad=True))
    assert sum(t.bytes for t in compiled[ENTROPY_BACKWARD]) == 3 * copy


def test_the_update_phase_grows_with_the_entropy_and_names_its_term():
    layout = dataclasses.replace(check.logits_layout("off", flash=True, grad=True), device="cuda",
                                 compiled_entropy=False)
    without = update_phase(layout)
    with_entropy = update_phase(dataclasses.replace(layout, entropy_in_update=True))
    tokens = with_entropy.tokens
    beside = with_entropy.term("checkpointed layer inputs (2 x tokens x hidden, bf16)") + with_entropy.term(
        "final norm, rotary tables, ids")
    assert beside > 0
    # the entropy's backward decides: 2 x bf16 + 6 x fp32 per [tokens, vocab] element beside the activations
    assert sum(t.bytes for t in with_entropy.terms if t.per_token) == beside + tokens * HAND.vocab * (2 * 2 + 6 * 4)
    assert with_entropy.peak > without.peak
    assert with_entropy.largest.name.startswith("logsumexp's backward")


def test_padded_batches_run_the_plain_entropy_whatever_chunking_or_compile_say():
    # verl's padded branch calls entropy_from_logits itself: chunking and torch.compile apply to packed batches only.
    padded = dataclasses.replace(check.logits_layout("chunked", flash=False, grad=True), remove_padding=False)
    plain = dataclasses.replace(check.logits_layout("eager", flash=False, grad=True), remove_padding=False)
    assert update_logits_moments(256, 8192, 2, padded) == update_logits_moments(256, 8192, 2, plain)


def test_cpu_check_of_the_entropy_terms_against_torchs_accounting_passes():
    # One real verl FSDP engine update with the entropy in its loss (flash-attn's protocol, in-place backward off),
    # and verl's logits functions on their own: the plan within the bench's pass threshold of torch's accounting.
    scores = check.entropy_check()
    assert scores["shapes_with_entropy"] == 1
    assert scores["entropy_on_max_term_rel_error"] <= check.PASS["entropy_on_max_term_rel_error"], scores["lines"]
    assert scores["total_rel_error"] <= check.PASS["total_rel_error"], scores["lines"]
    # Positive control: the same measurement against the plan that ignores the entropy (the plan before it
    # followed verl's backward) is far outside the threshold.
    measured = scores["logits_measured"][("eager", True, True)]
    assert abs(check.planned_logits_peak("off", True, True) - measured) / measured > 0.5


def test_standalone_command_refuses_the_legacy_micro_batch_keys_as_the_dry_run_does(capsys):
    from recipe_dapo.preflight.memory_plan import main

    # The global key verl 0.9.1's engine workers ignore: planned before as a micro-batch of 1, now refused naming
    # the per-GPU key, in one line (exit 2), as the dry run's shape rule refuses it.
    assert main(["--size", "small_one_gpu", "--gpu-gib", "23.6", "actor_rollout_ref.actor.use_dynamic_bsz=false",
                 "actor_rollout_ref.actor.ppo_micro_batch_size=8"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["memory plan: actor_rollout_ref.actor.ppo_micro_batch_size=8 is a global micro-batch size that "
                   "verl 0.9.1's engine workers ignore: set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu "
                   "instead"]
    # A null per-GPU size without dynamic batches is refused too (the plan assumed 1).
    assert main(["--size", "small_one_gpu", "--gpu-gib", "23.6", "actor_rollout_ref.actor.use_dynamic_bsz=false",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"]) == 2
    assert "ppo_micro_batch_size_per_gpu is null with actor_rollout_ref.actor.use_dynamic_bsz=false" in \
        capsys.readouterr().out
    # Positive control: the per-GPU key is planned.
    assert main(["--size", "small_one_gpu", "--gpu-gib", "23.6", "actor_rollout_ref.actor.use_dynamic_bsz=false",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]) == 0
    assert "actor update" in capsys.readouterr().out


def test_fsdp1_is_planned_with_its_root_unit_and_said_so_never_silently_as_fsdp2():
    from recipe_dapo.preflight.memory_plan import compose_size, plan_for_config

    def update(strategy):
        plan = plan_for_config(compose_size("small_one_gpu", ["dapo.memory.gpu_memory_gib=23.6",
                                                               f"actor_rollout_ref.actor.strategy={strategy}"]))
        return plan, next(p for p in plan.phases if p.name == "actor update")

    fsdp1, update1 = update("fsdp")
    fsdp2, update2 = update("fsdp2")
    root = "FSDP1 root unit kept gathered: embedding (tied: lm_head) (bf16)"
    # Qwen2.5-0.5B's tied embedding, 151,936 x 896 bf16, gathered through the whole backward under FSDP1
    assert update1.term(root) == 151_936 * 896 * 2 and update2.term(root) == 0
    assert update1.peak >= update2.peak  # at lm_head's backward both hold it; elsewhere only FSDP1
    assert any(line.startswith("  note: strategy=fsdp (FSDP1) is planned") for line in fsdp1.table())
    assert not any("FSDP1" in line for line in fsdp2.table())


def test_an_update_the_entropy_overflows_is_told_to_compile_it_not_to_checkpoint_it():
    from recipe_dapo.preflight.memory_rule import cheapest_fix

    # One 4,096-token sequence of a 152k vocabulary on an 8 GiB card: even one sequence a micro-batch does not fit
    # with the eager entropy's backward (14 bf16 copies on GPUs), so the fix is about the entropy.
    big = dataclasses.replace(HAND, vocab=151_936)
    layout = dataclasses.replace(check.logits_layout("eager", flash=True, grad=True), device="cuda",
                                 prompt=1024, response=3072, update_tokens_budget=4096, logprob_tokens_budget=4096,
                                 flash_cross_entropy=None)
    plan = plan_memory(layout, big, 8 << 30)
    update = next(p for p in plan.phases if p.name == "actor update")
    assert update.peak > 8 << 30 and update.largest.name.startswith("logsumexp's backward")
    fix = cheapest_fix(plan, update)
    assert fix.startswith("set actor_rollout_ref.actor.fsdp_config.use_torch_compile=true"), fix
    # The compiled entropy does fit there: the fix is a real one (and checkpointing would not have been).
    compiled = plan_memory(dataclasses.replace(layout, compiled_entropy=True), big, 8 << 30)
    assert next(p for p in compiled.phases if p.name == "actor update").peak <= 8 << 30
    checkpointed = plan_memory(dataclasses.replace(layout, entropy_checkpointing=True), big, 8 << 30)
    assert next(p for p in checkpointed.phases if p.name == "actor update").peak > 8 << 30
