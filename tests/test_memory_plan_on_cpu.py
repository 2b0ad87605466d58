"""The per-GPU memory plan (``recipe_dapo.preflight.memory_plan``) and its start-up rule: hand-derived figures, the
refusal with its term and fix, the dry run's table, every shipped size planned, the doc in step with the generator.
(``bench/memory_plan_check.py`` compares the plan with torch's own accounting of real verl passes.)"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from recipe_dapo.preflight.base import CheckReport
from recipe_dapo.preflight.memory_plan import (
    GIB, GPU_KNOB, GPU_MISSING, KNOWN_MODELS, SHIPPED, THIS_GPU, Layout, ModelFacts, compose_size, gpu_bytes_for,
    plan_for_config, plan_memory, script_overrides, this_gpu_bytes, with_shipped_plans,
)
from recipe_dapo.preflight.memory_rule import plan_lines, rule_memory_plan

REPO_ROOT = Path(__file__).resolve().parents[1]

# A hand-sized model: hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128, vocabulary 1000, untied.
HAND = ModelFacts(name="hand", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=1000,
                  tied=False)
HAND_LAYOUT = Layout(
    world=4, fsdp=4, sp=1, ref_sp=1, tp=2, prompt=256, response=768, mini_rows_per_gpu=16, dynamic=True,
    update_tokens_budget=2048, update_micro=4, logprob_tokens_budget=4096, logprob_micro=4, ref_tokens_budget=4096,
    ref_micro=4, param_bytes=4, compute_bytes=2, rollout_bytes=2, kv_bytes=2, param_offload=False,
    optimizer_offload=False, offload_policy=False, no_sync_accumulation=False, gradient_checkpointing=True,
    activation_offload=False, remove_padding=True, entropy_in_update=False, entropy_checkpointing=False,
    entropy_chunk=0, fused_kernels=False, compiled_entropy=True, lora_rank=0, lora_targets=None, use_ref=False,
    gpu_memory_utilization=0.5, free_cache_engine=True, max_num_seqs=64, max_num_batched_tokens=1024,
    round_sequences=256, per_node=4, device="cuda", overhead_bytes=0)


def test_parameter_counts_equal_the_published_ones():
    # The positive control of the parameter formula: Qwen2.5's model cards' exact counts.
    published = {"Qwen2.5-32B": 32_763_876_352, "Qwen2.5-7B": 7_615_616_512, "Qwen2.5-1.5B": 1_543_714_304,
                 "Qwen2.5-0.5B": 494_032_768}
    for name, count in published.items():
        assert ModelFacts.from_config(KNOWN_MODELS[name], name).params == count, name
    # hand: per layer q 64x64+64, k and v 64x32+32, o 64x64, MLP 3x64x128, 2 norms x 64 = 37,120;
    # 2 layers + embedding and lm_head 2 x 1000 x 64 + final norm 64 = 202,304
    assert HAND.layer_params == 4160 + 2 * 2080 + 4096 + 24576 + 128 == 37_120
    assert HAND.params == 2 * 37_120 + 2 * 64_000 + 64 == 202_304


def test_golden_plan_of_a_hand_sized_config():
    plan = plan_memory(HAND_LAYOUT, HAND, 1 * GIB)
    phases = {phase.name: phase for phase in plan.phases}
    update = phases["actor update"]
    # 2,048 tokens a micro-batch (the budget; the mini-batch's 16 rows x 1,024 tokens are more).
    assert update.tokens == 2048
    # Model states, fp32 over FSDP 4: parameters 202,304 x 4 / 4 = 202,304; gradients the same; AdamW 2 x that.
    assert update.term("actor parameters (fp32, / FSDP 4)") == 202_304
    assert update.term("actor gradients (fp32, / FSDP 4)") == 202_304
    assert update.term("AdamW moments (2 x fp32, / FSDP 4)") == 404_608
    # At lm_head's backward: checkpointed inputs 2 x 2048 x 64 x 2 = 524,288; final norm etc. 2048 x (4x64 + 2x2x64
    # + 4 + 2x2x16 + 8) = 1,204,224; logits (their gradient in place) 2048 x 1000 x 2 = 4,096,000; lm_head gathered
    # 64,000 x 2 = 128,000 and its weight's gradient 128,000: 6,080,512. In a layer's backward: the same 524,288 + 1,204,224, the layer recomputed 2048 x 2,456 B (norms 2 x (4x64 +
    # 2x2x64 + 4) = 1,032, attention 2 x (2x64 + 2x32) + 4x4 = 400, MLP 4x2x128 = 1,024) = 5,029,888, an MLP-sized
    # gradient 2048 x 128 x 2 = 524,288, two gathered layers 2 x 37,120 x 2 = 148,480, the layer's fp32 gradient
    # 37,120 x 4 = 148,480 and (4 ranks) the all-gather buffer 37,120 x 2 = 74,240: 7,653,888, the larger moment.
    assert update.peak == 202_304 * 2 + 404_608 + 7_653_888 == 8_463_104
    assert update.largest.name == "one layer recomputed for backward"
    # Optimizer step: the states plus AdamW's foreach temporaries (one parameter-sized list, 202,304).
    assert phases["optimizer step"].peak == 202_304 * 3 + 404_608
    # Old log-probs (4,096 tokens, no grad, compiled entropy): resident parameters and AdamW, and the larger of the
    # logits 4096 x 1000 x 2 = 8,192,000 and a layer (3 x 37,120 x 2 + 4096 x (2x2x64 + 4x64 + 3x2x128)).
    assert phases["old log-prob"].peak == 202_304 + 404_608 + 8_192_000
    # KV: 2 x 2 layers x 1 KV head per TP rank x 16 x 2 B = 128 B a token. vLLM: 0.5 GiB, less its weights
    # 202,304 x 2 / 2 and profiled activations 1024 x 2 x (4x64 + 3x64) + 64 x 1000 x 4 x 2 = 1,429,504.
    kv = plan.kv
    assert kv.bytes_per_token == 128
    assert kv.cache_bytes == GIB // 2 - 202_304 - 1_429_504 == 535_239_104
    assert kv.tokens == 535_239_104 // (128 * 16) * 16 == 4_181_552
    assert kv.full_sequences == 4_181_552 // 1024 and kv.holds_one_wave
    # Offloading the parameters and AdamW frees them during the rollout, not during the update.
    offloaded = plan_memory(dataclasses.replace(HAND_LAYOUT, param_offload=True, optimizer_offload=True), HAND, GIB)
    assert offloaded.phases[0].peak == plan.phases[0].peak - 202_304 - 404_608
    assert offloaded.phases[2].peak == update.peak
    # Without checkpointing every layer keeps its 2,456 B a token: 2 x 2048 x 2,456 saved instead of 524,288.
    no_gc = plan_memory(dataclasses.replace(HAND_LAYOUT, gradient_checkpointing=False), HAND, GIB)
    assert no_gc.phases[2].term("saved activations (2 layers, no checkpointing)") == 2 * 2048 * 2456


def test_tied_embedding_peaks_at_the_end_of_the_backward():
    # The hand model with a tied 4,000-token vocabulary (embedding = lm_head = 4,000 x 64 = 256,000 parameters, bf16
    # 512,000 B), planned as the CPU runs it (padded batches, one rank) at one sequence of 64 tokens a micro-batch.
    tied = dataclasses.replace(HAND, vocab=4000, tied=True)
    layout = dataclasses.replace(HAND_LAYOUT, world=1, fsdp=1, per_node=1, device="cpu", remove_padding=False,
                                 prompt=16, response=48, update_tokens_budget=64, compiled_entropy=False)
    update = next(p for p in plan_memory(layout, tied, None).phases if p.name == "actor update")
    # End of the forward: checkpointed inputs 2 x 64 x 64 x 2 = 16,384, final norm etc. 64 x (4x64 + 2x2x64 + 4 +
    # 2x2x16 + 16) = 38,656, the logits, their packed copy and its log_softmax outputs 3 x 64 x 4000 x 2 = 1,536,000:
    # 1,591,040. lm_head's backward: the same 55,040 + the logits' gradient 512,000 + the gathered weight and its
    # gradient 2 x 512,000: 1,591,040. A layer's backward: 55,040 + the layer recomputed 64 x 2,456 = 157,184 + an
    # MLP-sized gradient 64 x 128 x 2 = 16,384 + the gathered layer 74,240 + its fp32 gradient 148,480 + the
    # gathered weight and lm_head's share of its gradient 1,024,000: 1,475,328. The end of the backward: the
    # gathered weight 512,000 + lm_head's and the embedding's gradients and their sum 3 x 512,000 + the first layer's
    # fp32 gradient 148,480 = 2,196,480, the largest.
    states = update.term("actor parameters (fp32, / FSDP 1)") * 2 + update.term("AdamW moments (2 x fp32, / FSDP 1)")
    assert update.peak - states == 2_196_480
    assert update.term("tied embedding's gradient: lm_head's, the embedding's and their sum (3 x bf16)") == 1_536_000
    assert update.term("gathered embedding/lm_head (bf16)") == 512_000
    # Untied, the same model has no such moment: lm_head's gradient is reduce-scattered at once.
    untied = next(p for p in plan_memory(layout, dataclasses.replace(tied, tied=False), None).phases
                  if p.name == "actor update")
    assert not any(t.name.startswith("tied embedding") for t in untied.terms)


def test_without_flash_attn_cuda_autocast_keeps_the_softmax_in_fp32():
    # Without flash-attn's cross-entropy (here: padded batches) and without the compiled entropy, verl's per-row
    # log_softmax and the entropy's softmax / logsumexp run under CUDA autocast, in fp32 (bench/memory_plan_check.py
    # --device cuda: within 0.5% of max_memory_allocated on an H200); on CPU they stay bf16.
    layout = dataclasses.replace(HAND_LAYOUT, remove_padding=False, compiled_entropy=False)
    gpu = {p.name: p for p in plan_memory(layout, HAND, None).phases}
    cpu = {p.name: p for p in plan_memory(dataclasses.replace(layout, device="cpu"), HAND, None).phases}
    # The update's 2,048 tokens: the logits and their packed copy in bf16, the log_softmax outputs in fp32 on GPUs.
    assert gpu["actor update"].term("logits, packed copy, log_softmax outputs [tokens, vocab] (2 x bf16 + fp32)") \
        == 2048 * 1000 * (2 + 2 + 4)
    assert cpu["actor update"].term("logits, packed copy, log_softmax outputs [tokens, vocab] (3 x bf16)") \
        == 2048 * 1000 * 3 * 2
    # The old log-probs' 4,096 tokens: the softmax, logsumexp's fp32 copy of the logits and its exponentials.
    assert gpu["old log-prob"].term("entropy temporaries (softmax, logsumexp's fp32 copy and exp; 3 x fp32)") \
        == 3 * 4096 * 1000 * 4
    assert cpu["old log-prob"].term("entropy temporaries (softmax, softmax x logits; 2 x bf16)") == 2 * 4096 * 1000 * 2


@pytest.fixture(scope="module")
def small_one_gpu():
    return lambda *overrides: compose_size("small_one_gpu", list(overrides))


def test_rule_refuses_a_shape_over_the_card_naming_phase_term_and_fix(small_one_gpu):
    problems = list(rule_memory_plan(small_one_gpu("dapo.memory.gpu_memory_gib=12"), CheckReport()))
    by_phase = {p.split(" needs ")[0].removeprefix("memory plan: "): p for p in problems}
    assert {"rollout", "actor update"} <= set(by_phase), problems
    update = by_phase["actor update"]
    assert "the largest term is logits and their gradient" in update
    assert "fix: lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu to" in update
    # The fix is a real one: the budget it names makes the update fit.
    budget = int(update.split("ppo_max_token_len_per_gpu to ")[1].split()[0])
    fixed = plan_for_config(small_one_gpu("dapo.memory.gpu_memory_gib=12",
                                          f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}"))
    assert next(p for p in fixed.phases if p.name == "actor update").peak <= 12 * GIB
    assert "fsdp_config.param_offload=true" in by_phase["rollout"]
    assert "rollout.log_prob_max_token_len_per_gpu to" in by_phase["old log-prob"]
    # The card the size names (24 GB) is not refused: a positive control of the refusal.
    assert list(rule_memory_plan(small_one_gpu("dapo.memory.gpu_memory_gib=23.6"), CheckReport())) == []


def test_enforce_false_turns_the_refusal_into_a_warning(small_one_gpu, caplog):
    with caplog.at_level(logging.WARNING, logger="recipe_dapo.preflight.memory_rule"):
        problems = list(rule_memory_plan(small_one_gpu("dapo.memory.gpu_memory_gib=12", "dapo.memory.enforce=false"),
                                         CheckReport()))
    assert problems == []
    assert any("actor update needs" in r.message and "starting anyway" in r.message for r in caplog.records)


def test_cpu_platform_is_not_planned_and_the_default_cpu_run_passes():
    config = compose_size("cpu_tiny", ["platform=cpu", "dapo.memory.gpu_memory_gib=0.001"])
    assert list(rule_memory_plan(config, CheckReport())) == [] and plan_lines(config) == []


def test_missing_model_config_is_asked_for_in_one_line(small_one_gpu):
    lines = plan_lines(small_one_gpu("actor_rollout_ref.model.path=/nowhere/MyModel"))
    assert len(lines) == 1
    assert "actor_rollout_ref.model.path=/nowhere/MyModel" in lines[0] and "dapo.memory.model_config=" in lines[0]


def test_every_shipped_gpu_script_names_its_card_and_its_plan_fits_it():
    for script, card in SHIPPED:
        overrides = script_overrides(script)
        assert overrides[0].startswith("size=") and overrides[-1].startswith(f"{GPU_KNOB}="), (script, overrides)
        plan = plan_for_config(compose_size(None, overrides))
        assert plan.gpu_source == GPU_KNOB and plan.gpu_bytes == int(float(overrides[-1].split("=")[1]) * GIB)
        assert [p.name for p in plan.phases][:2] == ["rollout", "old log-prob"], script
        assert plan.over_budget() == [], (script, [(p.name, p.peak / GIB) for p in plan.over_budget()])
        assert 0 < plan.peak_phase.peak <= plan.gpu_bytes
        # a card sold as "80 GB" reports a little under 80 GiB to torch (79.2)
        assert 0.95 * int(card.split()[0]) * GIB < plan.gpu_bytes < int(card.split()[0]) * GIB, (script, card)


def test_without_the_knob_the_card_is_this_machines_gpu_as_torch_reports_it(small_one_gpu):
    import torch

    config = small_one_gpu()
    if torch.cuda.is_available():  # read in a child process; the same figure as torch's here
        expected = torch.cuda.get_device_properties(0).total_memory
        assert this_gpu_bytes() == expected and gpu_bytes_for(config) == (expected, THIS_GPU)
        assert plan_for_config(config).table()[0].endswith(f"GiB per GPU, {THIS_GPU}):")
    else:  # no GPU: the plan has no card and says so in one line
        assert this_gpu_bytes() is None and gpu_bytes_for(config) == (None, "")
        assert plan_lines(config)[-1] == GPU_MISSING
    assert gpu_bytes_for(small_one_gpu(f"{GPU_KNOB}=23.6")) == (int(23.6 * GIB), GPU_KNOB)


def test_the_doc_holds_the_generated_plans():
    doc = (REPO_ROOT / "docs" / "memory_plan.md").read_text()
    assert with_shipped_plans(doc) == doc, "run: python -m recipe_dapo.preflight.memory_plan --doc docs/memory_plan.md"


def test_dry_run_prints_the_table_and_start_up_refuses_over_the_card():
    table = subprocess.run([sys.executable, "-m", "recipe_dapo.dry_run", "size=small_one_gpu",
                            "dapo.memory.gpu_memory_gib=23.6"], capture_output=True, text=True, cwd=REPO_ROOT,
                           timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "memory plan per GPU (Qwen2.5-0.5B-Instruct" in table.stderr
    assert "actor update" in table.stderr and "headroom GiB" in table.stderr
    refused = subprocess.run([sys.executable, "-m", "recipe_dapo.dry_run", "size=small_one_gpu",
                              "dapo.memory.gpu_memory_gib=12"], capture_output=True, text=True, cwd=REPO_ROOT,
                             timeout=300)
    assert refused.returncode == 1
    assert "memory plan: actor update needs" in refused.stderr + refused.stdout
    assert "Traceback" not in refused.stderr


# ------------------------------------------------------------------------------- the plan at expected token counts

def _expected(layout: Layout, prompt: int, response: int) -> Layout:
    return dataclasses.replace(layout, expected_prompt=prompt, expected_response=response,
                               expected_source=f"prompts {prompt} and responses {response} tokens (stated)")


def test_fixed_micro_batches_plan_the_expected_token_counts_beside_the_worst_case():
    # 4 sequences a micro-batch: 4 x 1,024 tokens at full length, 4 x (128 + 256) = 1,536 at the expected lengths.
    layout = _expected(dataclasses.replace(HAND_LAYOUT, dynamic=False), 128, 256)
    plan = plan_memory(layout, HAND, 1 * GIB)
    worst = plan_memory(dataclasses.replace(layout, expected_prompt=None, expected_response=None), HAND, 1 * GIB)
    at_mean = plan_memory(dataclasses.replace(layout, prompt=128, response=256, expected_prompt=None,
                                              expected_response=None), HAND, 1 * GIB)
    update = next(p for p in plan.phases if p.name == "actor update")
    assert update.tokens == 4096 and update.peak == next(p for p in worst.phases if p.name == "actor update").peak
    assert plan.expected["actor update"] == next(p for p in at_mean.phases if p.name == "actor update").peak
    assert plan.expected["actor update"] < update.peak
    assert plan.expected["optimizer step"] == next(p for p in plan.phases if p.name == "optimizer step").peak
    table = plan.table()
    assert "expected GiB" in table[1] and "peak GiB" in table[1]
    assert any(line.startswith("  peak: every sequence at its maximum length") and "(stated)" in line for line in table)


def test_dynamic_micro_batches_that_fill_their_budget_expect_the_worst_case_update():
    # 16 rows x 384 expected tokens = 6,144 > the 2,048-token budget: the micro-batch is full either way.
    plan = plan_memory(_expected(HAND_LAYOUT, 128, 256), HAND, 1 * GIB)
    update = next(p for p in plan.phases if p.name == "actor update")
    assert plan.expected["actor update"] == update.peak
    assert any("actor update's peak is the worst case's" in note for note in plan.notes)
    # unpacked batches are padded to the maximum lengths: expected is the worst case in every phase
    padded = plan_memory(dataclasses.replace(_expected(HAND_LAYOUT, 128, 256), dynamic=False, remove_padding=False),
                         HAND, 1 * GIB)
    assert all(padded.expected[p.name] == p.peak for p in padded.phases)


def test_the_refusal_is_on_the_worst_case_and_names_the_term_and_the_expected_figure():
    from recipe_dapo.preflight.memory_rule import over_budget_message

    layout = _expected(dataclasses.replace(HAND_LAYOUT, dynamic=False), 128, 256)
    probe = plan_memory(layout, HAND, 1 * GIB)
    update = next(p for p in probe.phases if p.name == "actor update")
    card = (update.peak + probe.expected["actor update"]) // 2  # the expected peak fits, the worst case does not
    plan = plan_memory(layout, HAND, card)
    refused = plan.over_budget()
    assert "actor update" in [p.name for p in refused]
    message = over_budget_message(plan, next(p for p in refused if p.name == "actor update"))
    assert f"the largest term is {update.largest.name}" in message
    assert "with every sequence at its maximum length" in message
    assert "at the expected token counts it needs" in message and "would fit until sequences reach" in message
    # a card the worst case fits is not refused, whatever the expected column says
    assert plan_memory(layout, HAND, update.peak + GIB).over_budget() == []


def test_expected_lengths_come_from_the_settings_or_a_stated_fraction_capped_by_the_overlong_buffer():
    from omegaconf import OmegaConf

    from recipe_dapo.preflight.memory_plan import EXPECTED_FRACTION, expected_lengths

    buffer = {"reward": {"reward_kwargs": {"overlong_buffer_cfg": {"enable": True, "len": 1800}}}}
    prompt, response, said = expected_lengths(OmegaConf.create(buffer), 1000, 2000)
    assert prompt == int(1000 * EXPECTED_FRACTION) and response == 200  # 2,000 - 1,800 < half of 2,000
    assert "50% of data.max_prompt_length" in said and "where the soft overlong punishment begins" in said
    stated = OmegaConf.create({**buffer, "dapo": {"memory": {"expected_prompt_tokens": 300,
                                                             "expected_response_tokens": 5000}}})
    assert expected_lengths(stated, 1000, 2000)[:2] == (300, 2000)  # never above the maximum
    assert "dapo.memory.expected_response_tokens" in expected_lengths(stated, 1000, 2000)[2]


def test_a_composed_config_plans_its_expected_counts(small_one_gpu):
    plan = plan_for_config(small_one_gpu("dapo.memory.gpu_memory_gib=23.6", "dapo.memory.expected_prompt_tokens=100",
                                         "dapo.memory.expected_response_tokens=200"))
    assert plan.layout.expected_prompt == 100 and plan.layout.expected_response == 200
    assert set(plan.expected) == {p.name for p in plan.phases}
    assert "dapo.memory.expected_prompt_tokens" in plan.expected_note
