"""The per-GPU memory plan of a DAPO step on verl: the peak of each phase and the terms that make it, before launch.

    python -m recipe_dapo.preflight.memory_plan --size paper_32b --gpu-gib 79.2 [Hydra overrides ...]
    python -m recipe_dapo.preflight.memory_plan --doc docs/memory_plan.md   # rewrite the doc's generated part

A pure function of three inputs: the composed config, the model's ``config.json`` (a dict; no weights), and the memory
of one GPU. Nothing is loaded, no GPU is needed. ``DRY_RUN=1`` prints the plan's table and the start-up rule
(:mod:`recipe_dapo.preflight.memory_rule`) refuses a shape whose planned peak exceeds the card. Each phase's peak is
the worst case (every sequence at its maximum length, what the rule refuses on); beside it the table gives the same
phase at the run's expected token counts (:func:`expected_lengths`).

What a DAPO step does on each GPU, in verl 0.9.1's colocated layout (``engine_workers.ActorRolloutRefWorker``: the FSDP
actor, the reference model when a KL term needs one, and a vLLM replica share every GPU), and the terms of each phase:

1. **Rollout.** The vLLM replica is awake and takes ``gpu_memory_utilization`` x the card (its weights, its profiled
   activations, and its KV cache in the rest: ``gpu_worker.determine_available_memory``). Beside it the actor keeps
   what is not offloaded: its fp32 parameters unless ``fsdp_config.param_offload`` and its Adam moments unless
   ``optimizer_offload`` (``engine_workers.update_weights`` offloads only the parameters, and only with
   param_offload; the gradients were freed by ``optimizer_zero_grad`` at the end of the update). The reference model
   is held on the host (``forward_only`` FSDP engines use ``CPUOffload`` / ``CPUOffloadPolicy``).
2. **Old log-probs** (``compute_log_prob``, no grad, entropy on) and 3. **reference log-probs** (when a KL term needs
   them): the resident actor states, the micro-batch's logits ``[tokens, vocab]`` and, for the old log-probs, the
   entropy's ``softmax`` and ``softmax x logits`` of the same size (``verl_F.entropy_from_logits``), or chunks of it
   with ``entropy_from_logits_with_chunking``.
4. **Actor update.** Parameters, gradients and AdamW's two moments, all in the parameters' dtype (``model_dtype``,
   fp32: the parameters are the master copy, there is no separate one), sharded over the FSDP group (``fsdp_size`` or
   the whole world). param_offload / optimizer_offload do not lower this phase: ``train_mode`` loads both back
   (``BaseEngineCtx._context_switch``); only FSDP2's ``offload_policy`` keeps them on the host. On top, the largest
   of four moments of a micro-batch: the end of the forward (the activations saved for backward: each decoder layer's
   input with gradient checkpointing, every layer's saved tensors without; and the logits), ``lm_head``'s backward
   (the logits' gradient, ``lm_head`` gathered again and its weight's gradient in the compute dtype,
   ``mixed_precision.param_dtype``, bf16), a decoder layer's backward, and with a tied embedding the end of the
   backward (autograd adds the embedding's gradient to ``lm_head``'s out of place: three ``[vocab, hidden]``
   gradients at once). The optimizer step has its own peak: the states plus AdamW's temporaries. The micro-batch
   holds ``ppo_max_token_len_per_gpu`` tokens with ``use_dynamic_bsz`` or ``ppo_micro_batch_size_per_gpu``
   full-length sequences without (per GPU: / Ulysses SP).

The per-token activation bytes are counted from the tensors autograd saves in transformers' Qwen2 decoder layer under
FSDP2's bf16 mixed precision (listed in :func:`layer_activation_bytes_per_token`); ``bench/memory_plan_check.py``
compares every actor term with torch's ``FSDPMemTracker`` on a real verl FSDP engine update on CPU, and with
``--device cuda`` each phase with the CUDA allocator's peaks on one GPU (padded batches, no flash-attn). What neither
shows is marked as such in the terms' notes: the flash-attn cross-entropy kernel verl uses for log-probs on
GPUs (its gradient is written into the logits in place), vLLM's profiled activations, CUDA contexts and NCCL buffers
(``dapo.memory.overhead_gib``), allocator fragmentation.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Optional

GIB = 1 << 30
DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "auto": 2}
VLLM_BLOCK_TOKENS = 16  # vLLM's default KV block on GPUs (CacheConfig.block_size)

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
MODEL = "actor_rollout_ref.model"

# The launch scripts' models: the figures of their config.json files (hidden size, layers, attention heads, KV heads,
# MLP width, vocabulary, tied embeddings, context). A model folder on this machine is read instead when there is one.
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "Qwen2.5-32B": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                        intermediate_size=27648, vocab_size=152064, tie_word_embeddings=False,
                        max_position_embeddings=131072),
    "Qwen2.5-Math-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                            intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                            max_position_embeddings=4096),
    "Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                       max_position_embeddings=131072),
    "Qwen2.5-Math-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                              intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                              max_position_embeddings=4096),
    "Qwen2.5-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=131072),
    "Qwen2.5-0.5B-Instruct": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                                  max_position_embeddings=32768),
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768),
}


class PlanInputMissing(ValueError):
    """An input the plan needs is not there; the message says which and how to give it, in one line."""


# ----------------------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelFacts:
    """The shapes of a Qwen2-style decoder (``config.json``) that memory depends on."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    attention_bias: bool = True

    @classmethod
    def from_config(cls, config: dict, name: str = "model") -> "ModelFacts":
        config = config.get("text_config", config)  # multimodal configs nest the language model's
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            return cls(
                name=name, hidden=hidden, layers=int(config["num_hidden_layers"]), heads=heads,
                kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(config.get("head_dim") or hidden // heads),
                intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                tied=bool(config.get("tie_word_embeddings", False)),
                attention_bias=bool(config.get("attention_bias", config.get("model_type", "qwen2") == "qwen2")),
            )
        except KeyError as exc:
            raise PlanInputMissing(f"the model's config.json ({name}) has no {exc.args[0]!r}") from None

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """q, k, v (with bias), o, gate, up, down and two RMSNorm weights."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        bias = (q + 2 * kv) if self.attention_bias else 0
        return h * q + 2 * h * kv + bias + q * h + 3 * h * self.intermediate + 2 * h

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embed_params * (1 if self.tied else 2) + self.hidden

    def lora_params(self, rank: int, targets: Any) -> int:
        """LoRA A and B (rank x (in + out)) of every targeted linear layer of every decoder layer."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        if targets in (None, "all-linear", "all_linear"):
            names = list(shapes)
        else:
            names = [targets] if isinstance(targets, str) else list(targets)
        return self.layers * sum(rank * sum(shapes[n]) for n in names if n in shapes)


def layer_activation_bytes_per_token(m: ModelFacts, b: int) -> int:
    """Bytes per token that one Qwen2 decoder layer saves for backward, compute dtype of ``b`` bytes (bf16: 2).

    Counted from the tensors autograd saves in transformers' ``Qwen2DecoderLayer`` under FSDP2 mixed precision
    (listed with ``torch.autograd.graph.saved_tensors_hooks`` on verl's engine; parameters left out):

    - each of the two RMSNorms: the fp32 copy of its input (4 H), the normalised input cast back (b H), its output
      (b H, kept by the next linear layer) and the fp32 rsqrt (4): 2 x (4 H + 2 b H + 4);
    - attention: q and k after rotary (b q_dim, b kv_dim), v (b kv_dim), the attention output (b q_dim; o_proj's
      input is a view of it) and the fp32 log-sum-exp per head (4 heads);
    - MLP: gate and up outputs, SiLU(gate), and the product down_proj reads: 4 b I.
    """
    h = m.hidden
    norms = 2 * (4 * h + 2 * b * h + 4)
    attention = b * (2 * m.q_dim + 2 * m.kv_dim) + 4 * m.heads
    mlp = 4 * b * m.intermediate
    return norms + attention + mlp


def forward_working_set_bytes_per_token(m: ModelFacts, b: int) -> int:
    """Bytes per token alive inside one decoder layer in a no-grad forward (log-prob passes): the residual and the
    MLP's input, the RMSNorm's fp32 copy, and SiLU(gate), up and their product at once."""
    return 2 * b * m.hidden + 4 * m.hidden + 3 * b * m.intermediate


# ------------------------------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    note: str = ""
    per_token: bool = False
    """Grows with the micro-batch's tokens (the part a smaller token budget lowers)."""


@dataclass
class Phase:
    name: str
    terms: list[Term]
    tokens: int = 0
    """Tokens of the largest micro-batch per GPU in this phase (0: not a forward pass)."""
    fix: str = ""
    """The cheapest change that lowers this phase's peak, filled in when the phase does not fit."""

    @property
    def peak(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)

    def term(self, name: str) -> int:
        return sum(t.bytes for t in self.terms if t.name == name)


@dataclass
class KvPlan:
    """vLLM's KV cache per tensor-parallel rank against one generation round."""

    bytes_per_token: int
    cache_bytes: int
    block_tokens: int
    tokens: int
    """Tokens the cache holds (whole blocks)."""
    sequence_tokens: int
    """Prompt + response: one full-length sequence."""
    sequences_per_replica: int
    """Sequences of one generation round on one replica (gen_batch x n / replicas)."""
    sequences_at_once: int
    """What one replica runs at once: min(max_num_seqs, sequences_per_replica)."""

    @property
    def full_sequences(self) -> int:
        return self.tokens // max(self.sequence_tokens, 1)

    @property
    def holds_one_wave(self) -> bool:
        return self.full_sequences >= self.sequences_at_once


@dataclass
class MemoryPlan:
    model: ModelFacts
    gpu_bytes: Optional[int]
    phases: list[Phase]
    kv: Optional[KvPlan]
    host_bytes_per_node: int
    host_terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    layout: Optional[Layout] = None
    gpu_source: str = ""
    """Where ``gpu_bytes`` comes from: ``dapo.memory.gpu_memory_gib`` or this machine's GPU."""
    expected: dict = field(default_factory=dict)
    """Phase name -> its peak at the run's expected token counts (``Layout.expected_*``); empty: not planned. The
    phases' own peaks are the worst case (every sequence at its maximum length), the one the start-up refuses on."""
    expected_note: str = ""
    """The expected token counts and where they come from, in words."""

    def expected_peak(self, phase: Phase) -> int:
        return self.expected.get(phase.name, phase.peak)

    @property
    def peak_phase(self) -> Phase:
        return max(self.phases, key=lambda p: p.peak)

    def headroom(self, phase: Phase) -> Optional[int]:
        return None if self.gpu_bytes is None else self.gpu_bytes - phase.peak

    def over_budget(self) -> list[Phase]:
        return [] if self.gpu_bytes is None else [p for p in self.phases if p.peak > self.gpu_bytes]

    def table(self) -> list[str]:
        """The short table: phase, peak, largest term, headroom."""
        card = "GPU memory unknown" if self.gpu_bytes is None else f"{gib(self.gpu_bytes)} GiB per GPU" + (
            f", {self.gpu_source}" if self.gpu_source else "")
        lines = [f"memory plan per GPU ({self.model.name}, {self.model.params / 1e9:.2f} B parameters; {card}):",
                 f"  {'phase':<16} {'peak GiB':>9} {'expected GiB':>12}  {'largest term':<52} {'headroom GiB':>12}"]
        for phase in self.phases:
            room = self.headroom(phase)
            largest = phase.largest
            lines.append(f"  {phase.name:<16} {gib(phase.peak):>9} {gib(self.expected_peak(phase)):>12}  "
                         f"{_cut(f'{largest.name} {gib(largest.bytes)}', 52):<52} "
                         f"{'?' if room is None else gib(room):>12}")
        if self.kv is not None:
            kv = self.kv
            lines.append(f"  KV cache per TP rank: {gib(kv.cache_bytes)} GiB = {kv.tokens:,} tokens "
                         f"({kv.bytes_per_token:,} B a token) = {kv.full_sequences:,} full-length sequences of "
                         f"{kv.sequence_tokens:,} tokens; one replica runs {kv.sequences_at_once:,} at once")
        lines.append(f"  host memory per node: {gib(self.host_bytes_per_node)} GiB"
                     + (f" ({', '.join(f'{t.name} {gib(t.bytes)}' for t in self.host_terms if t.bytes)})"
                        if self.host_bytes_per_node else ""))
        if self.expected_note:
            lines.append(f"  peak: every sequence at its maximum length (what the start-up refuses on); "
                         f"expected: {self.expected_note}")
        lines += [f"  note: {note}" for note in self.notes]
        return lines

    def details(self) -> list[str]:
        """Every term of every phase."""
        lines = []
        for phase in self.phases:
            lines.append(f"{phase.name}: {gib(phase.peak)} GiB" + (f" ({phase.tokens:,} tokens a micro-batch)"
                                                                  if phase.tokens else ""))
            for term in phase.terms:
                lines.append(f"  {gib(term.bytes):>8}  {term.name}" + (f"  [{term.note}]" if term.note else ""))
        return lines


def gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _sel(config, key: str, default: Any = None) -> Any:
    from recipe_dapo.config import select

    value = select(config, key, default)
    return default if value is None else value


def _dtype_bytes(value: Any, default: int) -> int:
    if value is None:
        return default
    return DTYPE_BYTES.get(str(value).lower(), default)


@dataclass(frozen=True)
class Layout:
    """What the plan reads from the config (one place, so the bench can build it without Hydra)."""

    world: int
    fsdp: int
    sp: int
    ref_sp: int
    tp: int
    prompt: int
    response: int
    mini_rows_per_gpu: int
    dynamic: bool
    update_tokens_budget: int
    update_micro: int
    logprob_tokens_budget: int
    logprob_micro: int
    ref_tokens_budget: int
    ref_micro: int
    param_bytes: int
    compute_bytes: int
    rollout_bytes: int
    kv_bytes: int
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    no_sync_accumulation: bool
    gradient_checkpointing: bool
    activation_offload: bool
    remove_padding: bool
    entropy_in_update: bool
    entropy_checkpointing: bool
    entropy_chunk: int
    """0: whole logits; else ``entropy_from_logits_chunk_size`` (entropy_from_logits_with_chunking)."""
    fused_kernels: bool
    compiled_entropy: bool
    """``fsdp_config.use_torch_compile``: the entropy runs as one compiled reduction (no [tokens, vocab] temporaries)."""
    lora_rank: int
    lora_targets: Any
    use_ref: bool
    gpu_memory_utilization: float
    free_cache_engine: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    round_sequences: int
    per_node: int
    device: str
    """``cuda``: verl's GPU path (flash-attn cross-entropy, prefetched all-gathers, AdamW's foreach kernels);
    ``cpu``: what the CPU platform runs (the bench's reference)."""
    overhead_bytes: int
    strategy: str = "fsdp2"
    """``actor.strategy``: ``fsdp2`` (what the bench measures) or ``fsdp`` (FSDP1: its root unit, the embedding and
    lm_head, stays gathered from the forward to the backward)."""
    flash_cross_entropy: Optional[bool] = None
    """verl's log-probs through flash-attn's cross-entropy kernel (packed batches only); None: on GPUs (flash-attn
    installed, as verl's GPU images have it), not on CPU."""
    expected_prompt: Optional[int] = None
    """Mean prompt tokens for the plan at expected token counts (None: no such plan, only the worst case)."""
    expected_response: Optional[int] = None
    """Mean response tokens for the plan at expected token counts."""
    expected_source: str = ""
    """Where the expected counts come from, in words."""

    @property
    def sequence_tokens(self) -> int:
        return self.prompt + self.response


EXPECTED_FRACTION = 0.5
"""The share of ``data.max_prompt_length`` and ``data.max_response_length`` a mean prompt and response are expected to
take when ``dapo.memory.expected_prompt_tokens`` / ``expected_response_tokens`` are unset (public verl runs' real
tokens are 22-45% of the full-length assumption)."""


def expected_lengths(config, prompt: int, response: int) -> tuple[int, int, str]:
    """(prompt, response, source in words): the mean token counts the plan's expected column assumes.

    Each is its ``dapo.memory.expected_*_tokens`` when set, else :data:`EXPECTED_FRACTION` of its maximum; the
    response is capped at ``max_response_length - overlong_buffer_cfg.len`` with the soft overlong punishment on
    (responses past it are penalised, and training pushes them back)."""
    said = []
    mean_prompt = _sel(config, "dapo.memory.expected_prompt_tokens", None)
    if mean_prompt is None:
        mean_prompt = math.ceil(prompt * EXPECTED_FRACTION)
        said.append(f"prompts {mean_prompt:,} tokens ({EXPECTED_FRACTION:.0%} of data.max_prompt_length)")
    else:
        said.append(f"prompts {int(mean_prompt):,} tokens (dapo.memory.expected_prompt_tokens)")
    mean_response = _sel(config, "dapo.memory.expected_response_tokens", None)
    if mean_response is None:
        mean_response = math.ceil(response * EXPECTED_FRACTION)
        why = f"{EXPECTED_FRACTION:.0%} of data.max_response_length"
        buffer = "reward.reward_kwargs.overlong_buffer_cfg"
        if bool(_sel(config, f"{buffer}.enable", False)):
            unpunished = response - int(_sel(config, f"{buffer}.len", 0) or 0)
            if 0 < unpunished < mean_response:
                mean_response, why = unpunished, "where the soft overlong punishment begins"
        said.append(f"responses {mean_response:,} tokens ({why})")
    else:
        said.append(f"responses {int(mean_response):,} tokens (dapo.memory.expected_response_tokens)")
    mean_prompt = min(max(int(mean_prompt), 1), prompt)
    mean_response = min(max(int(mean_response), 1), response)
    return mean_prompt, mean_response, ", ".join(said)


LEGACY_MICRO_KEYS = ((f"{ACTOR}.ppo_micro_batch_size", f"{ACTOR}.ppo_micro_batch_size_per_gpu"),
                     (f"{ROLLOUT}.log_prob_micro_batch_size", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
                     (f"{REF}.log_prob_micro_batch_size", f"{REF}.log_prob_micro_batch_size_per_gpu"))


def _micro(config, key: str, dynamic_key: str) -> int:
    """A per-GPU micro-batch size; refused (as the dry run's shape rule refuses it) when null without dynamic
    batches: verl would not run, and the plan would otherwise assume 1."""
    value = _sel(config, key, None)
    if value is None:
        if not bool(_sel(config, dynamic_key, False)):
            raise PlanInputMissing(f"memory plan: {key} is null with {dynamic_key}=false: set {key} (sequences a "
                                   "micro-batch per GPU)")
        return 1
    return int(value)


def layout_from_config(config) -> Layout:
    """The plan's inputs from a composed (resolved) run config. The global micro-batch keys verl 0.9.1's engine
    workers ignore are refused, naming the per-GPU key to set, as the dry run refuses them."""
    for legacy, per_gpu in LEGACY_MICRO_KEYS:
        value = _sel(config, legacy, None)
        if value is not None:
            raise PlanInputMissing(f"memory plan: {legacy}={value} is a global micro-batch size that verl 0.9.1's "
                                   f"engine workers ignore: set {per_gpu} instead")
    nnodes, per_node = int(_sel(config, "trainer.nnodes", 1)), int(_sel(config, "trainer.n_gpus_per_node", 1))
    world = nnodes * per_node
    fsdp_size = int(_sel(config, f"{ACTOR}.fsdp_config.fsdp_size", -1))
    fsdp = fsdp_size if 0 < fsdp_size < world else world
    sp = int(_sel(config, f"{ACTOR}.ulysses_sequence_parallel_size", 1) or 1)
    if sp <= 1:
        sp = int(_sel(config, f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)
    ref_sp = int(_sel(config, f"{REF}.ulysses_sequence_parallel_size", sp) or sp)
    prompt, response = int(_sel(config, "data.max_prompt_length")), int(_sel(config, "data.max_response_length"))
    n = int(_sel(config, f"{ROLLOUT}.n", 1))
    tp = int(_sel(config, f"{ROLLOUT}.tensor_model_parallel_size", 1))
    dp = max(world // sp, 1)
    mini_rows = max(int(_sel(config, f"{ACTOR}.ppo_mini_batch_size", 1)) * n // dp, 1)
    update_budget = int(_sel(config, f"{ACTOR}.ppo_max_token_len_per_gpu", prompt + response))
    train = int(_sel(config, "data.train_batch_size", 1))
    gen = int(_sel(config, "data.gen_batch_size", train) or train)
    gen = max(gen, int(_sel(config, "dapo.dynamic_sampling.max_round_prompts", 0) or 0))
    mixed = _sel(config, f"{ACTOR}.fsdp_config.mixed_precision", None) or {}
    entropy_chunking = bool(_sel(config, f"{ACTOR}.fsdp_config.entropy_from_logits_with_chunking",
                                 _sel(config, f"{ACTOR}.entropy_from_logits_with_chunking", False)))
    device = str(_sel(config, "trainer.device", "cuda"))
    overhead = _sel(config, "dapo.memory.overhead_gib", 2.0)
    expected_prompt, expected_response, expected_source = expected_lengths(config, prompt, response)
    return Layout(
        expected_prompt=expected_prompt, expected_response=expected_response, expected_source=expected_source,
        world=world, fsdp=fsdp, sp=sp, ref_sp=ref_sp, tp=tp, prompt=prompt, response=response,
        mini_rows_per_gpu=mini_rows,
        dynamic=bool(_sel(config, f"{ACTOR}.use_dynamic_bsz", False)),
        update_tokens_budget=update_budget,
        update_micro=_micro(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu", f"{ACTOR}.use_dynamic_bsz"),
        logprob_tokens_budget=int(_sel(config, f"{ROLLOUT}.log_prob_max_token_len_per_gpu", update_budget)),
        logprob_micro=_micro(config, f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
                             f"{ROLLOUT}.log_prob_use_dynamic_bsz"),
        ref_tokens_budget=int(_sel(config, f"{REF}.log_prob_max_token_len_per_gpu", update_budget)),
        ref_micro=int(_sel(config, f"{REF}.log_prob_micro_batch_size_per_gpu", 1) or 1),
        strategy=str(_sel(config, f"{ACTOR}.strategy", "fsdp")),
        param_bytes=_dtype_bytes(_sel(config, f"{ACTOR}.fsdp_config.model_dtype", "fp32"), 4),
        compute_bytes=_dtype_bytes(mixed.get("param_dtype", "bf16") if hasattr(mixed, "get") else "bf16", 2),
        rollout_bytes=_dtype_bytes(_sel(config, f"{ROLLOUT}.dtype", "bfloat16"), 2),
        kv_bytes=_dtype_bytes(_sel(config, f"{ROLLOUT}.kv_cache_dtype", "auto"),
                              _dtype_bytes(_sel(config, f"{ROLLOUT}.dtype", "bfloat16"), 2)),
        param_offload=bool(_sel(config, f"{ACTOR}.fsdp_config.param_offload", False)),
        optimizer_offload=bool(_sel(config, f"{ACTOR}.fsdp_config.optimizer_offload", False)),
        offload_policy=bool(_sel(config, f"{ACTOR}.fsdp_config.offload_policy", False))
        and str(_sel(config, f"{ACTOR}.strategy", "fsdp")) == "fsdp2",
        no_sync_accumulation=bool(_sel(config, f"{ACTOR}.fsdp_config.use_no_sync_for_gradient_accumulation", False)),
        gradient_checkpointing=bool(_sel(config, f"{MODEL}.enable_gradient_checkpointing", True)),
        activation_offload=bool(_sel(config, f"{MODEL}.enable_activation_offload", False)),
        remove_padding=bool(_sel(config, f"{MODEL}.use_remove_padding", True)),
        entropy_in_update=bool(_sel(config, f"{ACTOR}.calculate_entropy", False))
        or float(_sel(config, f"{ACTOR}.entropy_coeff", 0) or 0) != 0.0,
        entropy_checkpointing=bool(_sel(config, f"{ACTOR}.fsdp_config.entropy_checkpointing",
                                        _sel(config, f"{ACTOR}.entropy_checkpointing", False))),
        entropy_chunk=int(_sel(config, f"{ACTOR}.fsdp_config.entropy_from_logits_chunk_size", 2048))
        if entropy_chunking else 0,
        fused_kernels=bool(_sel(config, f"{MODEL}.use_fused_kernels", False)),
        compiled_entropy=bool(_sel(config, f"{ACTOR}.fsdp_config.use_torch_compile", True)) and device != "cpu",
        lora_rank=int(_sel(config, f"{MODEL}.lora_rank", 0) or 0),
        lora_targets=_sel(config, f"{MODEL}.target_modules", "all-linear"),
        use_ref=bool(_sel(config, f"{ACTOR}.use_kl_loss", False)) or bool(_sel(config, "algorithm.use_kl_in_reward",
                                                                               False)),
        gpu_memory_utilization=float(_sel(config, f"{ROLLOUT}.gpu_memory_utilization", 0.5)),
        free_cache_engine=bool(_sel(config, f"{ROLLOUT}.free_cache_engine", True)),
        max_num_seqs=int(_sel(config, f"{ROLLOUT}.max_num_seqs", 256)),
        max_num_batched_tokens=int(_sel(config, f"{ROLLOUT}.max_num_batched_tokens", 8192)),
        round_sequences=gen * n, per_node=per_node, device=device,
        overhead_bytes=int(float(overhead) * GIB) if device != "cpu" else 0,
    )


def _tokens(dynamic: bool, budget: int, micro: int, seq: int, sp: int, rows: int | None = None) -> int:
    """Tokens of the largest micro-batch on one GPU: the token budget (dynamic batches), else micro full-length
    sequences; a mini-batch's rows cap both; Ulysses SP splits the sequence."""
    if dynamic:
        cap = rows * seq // sp if rows else budget
        return max(min(budget, cap), math.ceil(seq / sp))
    return math.ceil(micro * seq / sp)


def plan_memory(config_or_layout, model: dict | ModelFacts, gpu_bytes: Optional[int]) -> MemoryPlan:
    """The plan of every phase (module docstring), from the config (or a :class:`Layout`), ``config.json`` and the
    GPU's memory in bytes (None: unknown; the plan is made, the headroom is not)."""
    lay = config_or_layout if isinstance(config_or_layout, Layout) else layout_from_config(config_or_layout)
    m = model if isinstance(model, ModelFacts) else ModelFacts.from_config(model)
    gpu = lay.device == "cuda" or lay.device not in ("cpu",)
    b, pb = lay.compute_bytes, lay.param_bytes
    P = m.params
    trainable = m.lora_params(lay.lora_rank, lay.lora_targets) if lay.lora_rank > 0 else P
    shard = lambda n: math.ceil(n / lay.fsdp)  # noqa: E731
    seq = lay.sequence_tokens
    notes: list[str] = []
    lora = f", LoRA rank {lay.lora_rank}" if lay.lora_rank > 0 else ""

    # ---- model states (per GPU)
    params = Term(f"actor parameters ({_dtype_name(pb)}, / FSDP {lay.fsdp})", shard(P * pb),
                  "the master copy: no separate fp32 weights")
    lora_params = Term(f"LoRA adapters ({_dtype_name(pb)}){lora}", shard(trainable * pb)) if lay.lora_rank else None
    grads = Term(f"actor gradients ({_dtype_name(pb)}, / FSDP {lay.fsdp})", shard(trainable * pb),
                 "reduced in fp32 and accumulated sharded")
    adam = Term(f"AdamW moments (2 x {_dtype_name(pb)}, / FSDP {lay.fsdp})", shard(2 * trainable * pb))
    on_gpu_in_update = not lay.offload_policy
    states_update = [t for t in (params, lora_params, grads, adam) if t] if on_gpu_in_update else [
        Term("actor parameters, gradients, AdamW (FSDP2 offload_policy: on the host)", 0)]
    resident = []  # what the actor keeps on the GPU outside its own phases
    if not lay.offload_policy:
        resident.append(params if not lay.param_offload else Term("actor parameters (param_offload: on the host)", 0))
        if lora_params and not lay.param_offload:
            resident.append(lora_params)
        resident.append(adam if not lay.optimizer_offload else Term("AdamW moments (optimizer_offload: on the host)",
                                                                     0))
    overhead = [Term("CUDA context, NCCL, allocator slack (allowance)", lay.overhead_bytes,
                     "dapo.memory.overhead_gib; not measured")] if lay.overhead_bytes else []

    # ---- vLLM (rollout): its whole budget while awake
    vllm_budget = int(lay.gpu_memory_utilization * gpu_bytes) if gpu_bytes else 0
    weights_rank = math.ceil(P * lay.rollout_bytes / lay.tp)
    kv_heads_rank = max(1, m.kv_heads // lay.tp)
    kv_per_token = 2 * m.layers * kv_heads_rank * m.head_dim * lay.kv_bytes
    profile = _vllm_profile_bytes(m, lay)
    kv_plan = None
    rollout_terms: list[Term] = []
    if gpu_bytes:
        kv_bytes = max(vllm_budget - weights_rank - profile, 0)
        rollout_terms += [
            Term(f"vLLM weights ({_dtype_name(lay.rollout_bytes)}, / TP {lay.tp})", weights_rank),
            Term("vLLM KV cache", kv_bytes, f"gpu_memory_utilization {lay.gpu_memory_utilization} x the card, "
                                            "less weights and profiled activations"),
            Term("vLLM profiled activations (estimate)", profile, "max_num_batched_tokens forward + sampler"),
        ]
        block = VLLM_BLOCK_TOKENS
        tokens = (kv_bytes // (kv_per_token * block)) * block if kv_per_token else 0
        replicas = max(lay.world // lay.tp, 1)
        per_replica = math.ceil(lay.round_sequences / replicas)
        kv_plan = KvPlan(bytes_per_token=kv_per_token, cache_bytes=kv_bytes, block_tokens=block, tokens=tokens,
                         sequence_tokens=seq, sequences_per_replica=per_replica,
                         sequences_at_once=min(lay.max_num_seqs, per_replica))
    else:
        rollout_terms.append(Term(f"vLLM weights ({_dtype_name(lay.rollout_bytes)}, / TP {lay.tp})", weights_rank,
                                  "the KV cache takes gpu_memory_utilization x the card: card size unknown"))
    rollout = Phase("rollout", rollout_terms + resident + overhead)
    awake_vllm = [] if lay.free_cache_engine else [
        Term("vLLM awake (free_cache_engine=false)", vllm_budget or weights_rank)]

    # ---- old log-probs: no grad, entropy on
    logits_dtype = _dtype_name(b)
    # with more than one rank FSDP2 all-gathers a layer into one buffer and copies it out to the parameters
    all_gather = [Term(f"all-gather output before its copy-out ({logits_dtype})", m.layer_params * b)] \
        if lay.fsdp > 1 else []
    t_lp = _tokens(lay.dynamic, lay.logprob_tokens_budget, lay.logprob_micro, seq, lay.sp)
    at_logits = [Term(f"logits [tokens, vocab] ({logits_dtype})", t_lp * m.vocab * b, per_token=True),
                 no_grad_entropy_term(t_lp, m, b, lay)]
    in_layer = [Term("gathered layer (no-grad forward)", (2 if gpu else 1) * m.layer_params * b),
                Term("one layer's working set", t_lp * forward_working_set_bytes_per_token(m, b), per_token=True)
                ] + all_gather
    logprob_terms = resident + awake_vllm + overhead + _larger(at_logits, in_layer)
    if lay.param_offload and not lay.offload_policy:
        logprob_terms.append(Term(f"actor parameters ({_dtype_name(pb)}, loaded for the pass)", shard(P * pb)))
    logprob = Phase("old log-prob", logprob_terms, tokens=t_lp)

    phases = [rollout, logprob]
    if lay.use_ref:
        t_ref = _tokens(lay.dynamic, lay.ref_tokens_budget, lay.ref_micro, seq, lay.ref_sp)
        ref_terms = resident + awake_vllm + overhead + _larger(
            [Term(f"logits [tokens, vocab] ({logits_dtype})", t_ref * m.vocab * b * (1 if lay.remove_padding else 2),
                  per_token=True)],
            [Term("reference layers gathered from the host", (2 if gpu else 1) * m.layer_params * b),
             Term("one layer's working set", t_ref * forward_working_set_bytes_per_token(m, b), per_token=True)]
            + all_gather)
        phases.append(Phase("ref log-prob", ref_terms, tokens=t_ref))

    # ---- actor update: the backward of the logits, and the optimizer step
    t_up = _tokens(lay.dynamic, lay.update_tokens_budget, lay.update_micro, seq, lay.sp, lay.mini_rows_per_gpu)
    if lay.activation_offload:
        saved = Term("saved activations (activation offload: one layer on the GPU)",
                     t_up * (m.hidden * b if lay.gradient_checkpointing else layer_activation_bytes_per_token(m, b)))
    elif lay.gradient_checkpointing:
        saved = Term(f"checkpointed layer inputs ({m.layers} x tokens x hidden, {logits_dtype})",
                     m.layers * t_up * m.hidden * b)
    else:
        saved = Term(f"saved activations ({m.layers} layers, no checkpointing)",
                     m.layers * t_up * layer_activation_bytes_per_token(m, b))
    saved = Term(saved.name, saved.bytes, per_token=True)
    # outside the layers: the final RMSNorm's saved tensors, rotary cos/sin, the token ids
    around = Term("final norm, rotary tables, ids", t_up * (4 * m.hidden + 2 * b * m.hidden + 4 + 2 * b * m.head_dim
                                                            + 8 * (1 if lay.remove_padding else 2)), per_token=True)
    logits_moments = update_logits_moments(t_up, m.vocab, b, lay)
    logits = logits_moments[LOGITS_AT_FORWARD_END][0]
    flash = flash_cross_entropy(lay)
    # Four moments of a micro-batch's forward and backward; the largest decides. verl passes reshard_after_forward
    # to fully_shard, so the root unit (with a tied embedding: embed_tokens = lm_head) is resharded after the forward
    # like every other unit, and lm_head's unit is gathered again for its backward.
    # 1. The end of the forward: the saved activations and every copy of the logits.
    at_logits = [saved, around, *logits_moments[LOGITS_AT_FORWARD_END]]
    # FSDP1 (strategy=fsdp) does not reshard its root unit (the embedding, lm_head and the final norm: the decoder
    # layers are the wrapped units) after the forward: it stays gathered through the whole backward
    root = [Term(f"FSDP1 root unit kept gathered: embedding{' (tied: lm_head)' if m.tied else ' and lm_head'} "
                 f"({logits_dtype})", m.embed_params * b * (1 if m.tied else 2),
                 "strategy=fsdp: FSDP1 keeps the root's parameters unsharded from the forward to the backward; "
                 "derived, not measured (the bench measures FSDP2)")] if lay.strategy == "fsdp" else []
    at_logits += root
    # 2. lm_head's backward: the logits' gradient (the log_softmax outputs and packed copies are freed by then; the
    # flash-attn kernel's gradient is the logits themselves), lm_head gathered again and its weight's gradient in the
    # compute dtype. With a tied embedding autograd holds that gradient until the embedding's arrives (moment 4).
    lm_head = Term(f"gathered {'embedding/lm_head' if m.tied else 'lm_head'} ({logits_dtype})", m.embed_params * b)
    head_grad = Term(f"lm_head's weight gradient ({logits_dtype})", m.embed_params * b if lay.lora_rank == 0 else 0,
                     "the tied embedding's share, held until the embedding's arrives" if m.tied else "")
    logits_grad = logits if (flash and not lay.entropy_in_update) or lay.fused_kernels else Term(
        f"the logits' gradient [tokens, vocab] ({logits_dtype})", t_up * m.vocab * b, per_token=True)
    at_head = [saved, around, logits_grad, *(root or [lm_head]), head_grad]
    # 2b. lm_head's reduce-scatter (untied): the gathered weight is resharded, its gradient is copied into
    # reduce_dtype (fp32) while the logits' buffer is still alive (measured on CPU)
    at_head_reduce = [saved, around, logits_grad, *root, head_grad, Term(
        "lm_head's gradient in reduce_dtype for its reduce-scatter (fp32)", m.embed_params * 4)] \
        if not m.tied and lay.lora_rank == 0 else []
    # 3. A decoder layer's backward (recomputed first with checkpointing), its gathered weights (prefetched: two on
    # GPUs) and its gradient in reduce_dtype for the reduce-scatter (kept until the next unit's reduce-scatter).
    layer_grad = Term("a layer's gradient in reduce_dtype for its reduce-scatter (fp32)", m.layer_params * 4)
    in_layer = [saved, around]
    if lay.gradient_checkpointing and not lay.activation_offload:
        in_layer.append(Term("one layer recomputed for backward", t_up * layer_activation_bytes_per_token(m, b),
                             per_token=True))
    in_layer += [Term("layer backward temporaries (one [tokens, intermediate] gradient)", t_up * m.intermediate * b,
                      per_token=True),
                 Term(f"gathered layer{'s (current and prefetched)' if gpu else ''} ({logits_dtype})",
                      (2 if gpu else 1) * m.layer_params * b),
                 layer_grad]
    in_layer += all_gather + root
    moments = [at_logits, at_head, in_layer] + ([at_head_reduce] if at_head_reduce else [])
    # 5. With the entropy in the update (entropy_coeff != 0 or calculate_entropy): the entropy's backward, after the
    # log-probs' (update_logits_moments).
    moments += [[saved, around, *terms, *root] for name, terms in logits_moments.items()
                if name != LOGITS_AT_FORWARD_END]
    if m.tied:
        in_layer += [lm_head, head_grad]
        # 4. The end of the backward with a tied embedding: the activations are freed, and autograd adds the
        # embedding's gradient to lm_head's out of place: both and their sum, beside the gathered weight and the
        # first layer's gradient still waiting for its reduce-scatter.
        if lay.lora_rank == 0:
            moments.append([lm_head, Term(f"tied embedding's gradient: lm_head's, the embedding's and their sum "
                                          f"(3 x {logits_dtype})", 3 * m.embed_params * b,
                                          "autograd accumulates the two uses out of place"), layer_grad])
    update_terms = states_update + awake_vllm + overhead + _larger(*moments)
    if lay.no_sync_accumulation and not lay.offload_policy:
        update_terms.append(Term("unsharded fp32 gradients (use_no_sync_for_gradient_accumulation)", trainable * 4))
    update = Phase("actor update", update_terms, tokens=t_up)
    # the optimizer step: AdamW's temporaries (foreach kernels on GPU: one parameter-sized list; single-tensor on
    # CPU: two tensors the size of the largest parameter)
    largest = m.embed_params if lay.lora_rank == 0 else lay.lora_rank * max(m.hidden, m.intermediate)
    temp = shard(trainable * pb) if gpu else 2 * shard(largest * pb)
    step = Phase("optimizer step", states_update + awake_vllm + overhead + [
        Term("AdamW temporaries", temp if on_gpu_in_update else 0,
             "foreach kernels" if gpu else "two tensors the size of the largest parameter")])
    phases += [update, step]

    # ---- host memory per node
    host = []
    if lay.param_offload or lay.offload_policy:
        host.append(Term("actor parameters", shard(P * pb)))
    if lay.optimizer_offload or lay.offload_policy:
        host.append(Term("AdamW moments", shard(2 * trainable * pb)))
    if lay.offload_policy:
        host.append(Term("actor gradients", shard(trainable * pb)))
    if lay.use_ref and lay.lora_rank == 0:
        host.append(Term("reference parameters", shard(P * pb)))
    if lay.free_cache_engine and gpu and lay.lora_rank > 0:  # level 2 (weights discarded) unless LoRA adapters
        host.append(Term("sleeping vLLM weights (sleep level 1, LoRA)", weights_rank))
    host_per_node = sum(t.bytes for t in host) * lay.per_node
    if lay.strategy == "fsdp":
        notes.append("strategy=fsdp (FSDP1) is planned with the terms measured on FSDP2 plus FSDP1's root unit (the "
                     "embedding and lm_head) kept gathered from the forward to the backward; FSDP1 itself is not "
                     "measured (the bench measures FSDP2)")
    elif lay.strategy != "fsdp2":
        raise PlanInputMissing(f"memory plan: {ACTOR}.strategy={lay.strategy} is not planned (the plan follows verl's "
                               "FSDP engines: fsdp2, or fsdp with FSDP1's root unit)")
    if lay.dynamic:
        notes.append("dynamic micro-batches are planned at their token budget; verl balances micro-batches by "
                     "attention workload, so one may run slightly over it")
    expected, expected_note = {}, ""
    if lay.expected_prompt is not None and lay.expected_response is not None:
        expected_note = lay.expected_source or (f"prompts {lay.expected_prompt:,} and responses "
                                                f"{lay.expected_response:,} tokens")
        if lay.remove_padding:
            # Packed micro-batches hold the tokens the sequences have; dynamic ones fill their token budget whenever
            # the mini-batch's rows have the tokens, so there the expected update equals the worst case.
            mean = replace(lay, prompt=lay.expected_prompt, response=lay.expected_response, expected_prompt=None,
                           expected_response=None)
            expected = {phase.name: phase.peak for phase in plan_memory(mean, m, gpu_bytes).phases}
            if lay.dynamic and expected.get(update.name) == update.peak:
                notes.append("expected: the actor update's peak is the worst case's: dynamic micro-batches fill "
                             "ppo_max_token_len_per_gpu whenever a mini-batch's sequences hold that many tokens")
        else:
            expected = {phase.name: phase.peak for phase in phases}
            notes.append("expected: with use_remove_padding=false every sequence is padded to its maximum length, so "
                         "the expected peaks are the worst case")
    return MemoryPlan(model=m, gpu_bytes=gpu_bytes, phases=phases, kv=kv_plan, host_bytes_per_node=host_per_node,
                      host_terms=[Term(t.name, t.bytes * lay.per_node) for t in host], notes=notes, layout=lay,
                      expected=expected, expected_note=expected_note)


def _larger(*moments: list[Term]) -> list[Term]:
    """The terms of whichever moment of a pass holds more (they are not alive at once)."""
    return max(moments, key=lambda terms: sum(t.bytes for t in terms))


LOGITS_AT_FORWARD_END = "the end of the forward"
ENTROPY_BACKWARD = "the entropy's backward"
COMPILED_ENTROPY_FORWARD = "the compiled entropy's forward"


def flash_cross_entropy(lay: Layout) -> bool:
    """verl's log-probs go through flash-attn's cross-entropy kernel: packed batches without fused kernels, on GPUs
    (``Layout.flash_cross_entropy`` overrides)."""
    installed = lay.device != "cpu" if lay.flash_cross_entropy is None else lay.flash_cross_entropy
    return installed and lay.remove_padding and not lay.fused_kernels


def update_logits_moments(tokens: int, vocab: int, b: int, lay: Layout) -> dict[str, list[Term]]:
    """The ``[tokens, vocab]`` tensors of an update micro-batch's logits at each moment that can decide its peak
    (the layers' saved activations come on top), as verl 0.9.1's ``FSDPEngineWithLMHead.prepare_model_outputs``
    makes them. ``b``: the compute dtype's bytes; with ``device=cuda`` autocast runs softmax, log_softmax and
    logsumexp in fp32 (f = 4 B), on CPU in ``b``. Per element of ``[tokens, vocab]``:

    - *end of the forward*, entropy off: flash-attn's kernel keeps the logits alone (``b``; its backward writes the
      gradient into them: ``inplace_backward``); without it the per-row log_softmax keeps its outputs (``b + s``,
      s = f on GPUs, b on CPU), and padded batches a packed copy too (``2 b + s``).
    - *entropy on* (``entropy_coeff != 0`` or ``calculate_entropy``): verl turns the in-place backward off, so the
      kernel's gradient is a new tensor. ``entropy = logsumexp(z) - sum(softmax(z) z)`` saves the softmax
      (s) and, under CUDA autocast, logsumexp's fp32 copy of the logits (f) unless ``entropy_checkpointing``.
      Autograd runs the log-probs' backward first (their nodes are newer), then the entropy's: the product's
      backward leaves softmax's pending gradient (s), and logsumexp's backward makes ``exp(z - lse) g`` with two
      temporaries while it and the logits' accumulated gradient (``b``) are alive:
      ``b (logits) + b (their gradient) + s (softmax) [+ f] + s (pending) + 3 s'`` (s' = f on GPUs, b on CPU):
      7 ``b`` on CPU, ``2 b + 6 f`` on GPUs. Checkpointing recomputes the same tensors at the backward: the same
      peak, only the end of the forward is lower.
    - *chunked* (``entropy_from_logits_with_chunking``, chunks of c rows): every chunk's fp32 copy and softmax are
      saved (2 f per element; the logits themselves are freed), and a chunk's backward has five fp32
      ``[c, vocab]`` temporaries beside the logits' gradient.
    - *compiled* (``use_torch_compile``): the fused kernel saves no ``[tokens, vocab]`` tensor; its backward makes
      one gradient (``b``): ``3 b`` with the logits and their gradient. Inductor's CPU kernel materialises one fp32
      ``[tokens, vocab]`` buffer in the forward (measured); on GPUs Triton's fused reduction is assumed to keep it
      in registers (not measured).

    ``bench/memory_plan_check.py`` measures each case with torch's accounting on CPU."""
    gpu = lay.device != "cpu"
    tv = tokens * vocab
    name_b = _dtype_name(b)
    s = 4 if gpu else b
    autocast = "; CUDA autocast computes it in fp32" if gpu else ""
    entropy = lay.entropy_in_update and not lay.fused_kernels
    # padded batches: verl calls entropy_from_logits itself, neither chunked nor compiled
    chunk, compiled = (lay.entropy_chunk, lay.compiled_entropy) if lay.remove_padding else (0, False)
    if lay.fused_kernels:
        return {LOGITS_AT_FORWARD_END: [Term("logits (fused kernels: not materialised)", 0)]}
    if flash_cross_entropy(lay) and not entropy:
        logits = Term(f"logits and their gradient [tokens, vocab] ({name_b})", tv * b,
                      "flash-attn cross-entropy writes the gradient into the logits (inplace_backward; its protocol "
                      "measured on CPU)", True)
    elif flash_cross_entropy(lay):
        logits = Term(f"logits [tokens, vocab] ({name_b})", tv * b, "flash-attn cross-entropy's in-place backward "
                      "is off while verl computes the entropy", True)
    elif lay.remove_padding:
        logits = Term(f"logits and log_softmax outputs [tokens, vocab] "
                      f"({f'2 x {name_b}' if s == b else f'{name_b} + {_dtype_name(s)}'})",
                      tv * (b + s), "the per-row log_softmax outputs saved for backward" + autocast, True)
    else:
        logits = Term(f"logits, packed copy, log_softmax outputs [tokens, vocab] "
                      f"({f'3 x {name_b}' if s == b else f'2 x {name_b} + {_dtype_name(s)}'})",
                      tv * (2 * b + s), "padded batches: the model's logits, their packed copy and its "
                      "per-row log_softmax outputs saved for backward" + autocast, True)
    moments = {LOGITS_AT_FORWARD_END: [logits]}
    if not entropy:
        return moments
    own = Term(f"logits [tokens, vocab] ({name_b})", tv * b, per_token=True)
    grad = Term(f"the logits' gradient [tokens, vocab] ({name_b})", tv * b,
                "a new tensor: verl turns the in-place backward off with the entropy", True)
    if chunk:
        chunk = min(tokens, chunk)
        saved = Term("entropy chunks saved for backward (every chunk's fp32 copy and softmax: 2 x fp32)", tv * 8,
                     "entropy_from_logits_with_chunking", True)
        moments[LOGITS_AT_FORWARD_END].append(saved)
        # the chunks' fp32 copies are what the entropy saves: the logits themselves are freed by then
        moments[ENTROPY_BACKWARD] = [saved, grad, Term(
            f"a chunk's backward temporaries (5 x fp32 [{chunk}, vocab])", 5 * chunk * vocab * 4)]
    elif compiled:
        moments[ENTROPY_BACKWARD] = [own, grad, Term(f"the compiled entropy's gradient [tokens, vocab] ({name_b})",
                                                     tv * b, "use_torch_compile: nothing [tokens, vocab] saved", True)]
        if not gpu:
            moments[COMPILED_ENTROPY_FORWARD] = [own, Term(
                "the compiled entropy's fp32 buffer [tokens, vocab] (inductor's CPU kernel)", tv * 4, per_token=True)]
    else:
        saved = Term(f"entropy's saved softmax{' and logsumexp fp32 copy (2 x fp32)' if gpu else f' ({name_b})'}",
                     tv * (s + (4 if gpu else 0)),
                     ("recomputed at the backward (entropy_checkpointing)" if lay.entropy_checkpointing else
                      "saved for backward") + autocast, True)
        if not lay.entropy_checkpointing:
            moments[LOGITS_AT_FORWARD_END].append(saved)
        moments[ENTROPY_BACKWARD] = [
            own, grad, saved, Term(f"softmax's pending gradient [tokens, vocab] ({_dtype_name(s)})", tv * s,
                                   per_token=True),
            Term(f"logsumexp's backward: z - lse, its exp and x gradient (3 x {_dtype_name(s)})", 3 * tv * s,
                 per_token=True)]
        if lay.entropy_checkpointing:
            moments[ENTROPY_BACKWARD].append(Term(
                f"the checkpoint's own gradient of the logits [tokens, vocab] ({name_b})", tv * b,
                "torch.utils.checkpoint returns the recomputed graph's gradient beside the accumulated one", True))
    return moments


def no_grad_entropy_term(tokens: int, m: ModelFacts, b: int, lay: Layout) -> Term:
    """The entropy's temporaries in a no-grad pass (old log-probs) beside the logits; padded batches run verl's
    plain ``entropy_from_logits`` (neither chunked nor compiled)."""
    if not lay.remove_padding:
        lay = replace(lay, entropy_chunk=0, compiled_entropy=False)
    if lay.compiled_entropy and not lay.entropy_chunk:
        if lay.device == "cpu":
            return Term("entropy (torch.compile: inductor's CPU kernel, one fp32 [tokens, vocab] buffer)",
                        tokens * m.vocab * 4, "measured on CPU", True)
        return Term("entropy (torch.compile: one fused reduction)", 0,
                    "fsdp_config.use_torch_compile; Triton's fused reduction: no [tokens, vocab] temporary "
                    "(not measured on a GPU)", True)
    if lay.entropy_chunk:
        chunk = min(tokens, lay.entropy_chunk)
        return Term(f"entropy, chunked ({chunk} rows x vocab, 3 x fp32)", 3 * chunk * m.vocab * 4)
    if lay.device != "cpu":
        # CUDA autocast runs softmax and logsumexp in fp32: the softmax, logsumexp's fp32 copy of the logits and its
        # kernel's exp temporary are alive at once (measured on an H200 with max_memory_allocated)
        return Term("entropy temporaries (softmax, logsumexp's fp32 copy and exp; 3 x fp32)", 3 * tokens * m.vocab * 4,
                    "CUDA autocast computes them in fp32", per_token=True)
    return Term(f"entropy temporaries (softmax, softmax x logits; 2 x {_dtype_name(b)})", 2 * tokens * m.vocab * b,
                per_token=True)


def _vllm_profile_bytes(m: ModelFacts, lay: Layout) -> int:
    """An estimate of vLLM's profiled peak activations (its dummy forward of ``max_num_batched_tokens`` tokens and
    the sampler's fp32 logits of ``max_num_seqs`` sequences); vLLM measures its own at start-up."""
    tokens = lay.max_num_batched_tokens
    forward = tokens * lay.rollout_bytes * (4 * m.hidden + 3 * math.ceil(m.intermediate / lay.tp))
    sampler = lay.max_num_seqs * m.vocab * 4 * 2
    return forward + sampler


def _dtype_name(nbytes: int) -> str:
    return {4: "fp32", 2: "bf16", 1: "fp8"}.get(nbytes, f"{nbytes} B")


# ------------------------------------------------------------------------------------------------ inputs from config


def model_facts_for(config) -> ModelFacts:
    """The model's facts: ``dapo.memory.model_config`` (a config.json), else the model folder's config.json when it is
    on this machine, else the table of the launch scripts' models by the folder's name."""
    explicit = _sel(config, "dapo.memory.model_config", None)
    path = str(_sel(config, f"{MODEL}.path", "") or "")
    if explicit:
        file = os.path.expanduser(str(explicit))
        if os.path.isdir(file):
            file = os.path.join(file, "config.json")
        if not os.path.isfile(file):
            raise PlanInputMissing(f"memory plan: dapo.memory.model_config={explicit} is not a config.json on this "
                                   "machine")
        with open(file) as handle:
            return ModelFacts.from_config(json.load(handle), name=os.path.basename(os.path.dirname(file)) or file)
    local = os.path.join(os.path.expanduser(path), "config.json")
    if path and os.path.isfile(local):
        with open(local) as handle:
            return ModelFacts.from_config(json.load(handle), name=os.path.basename(path.rstrip("/")))
    name = os.path.basename(path.rstrip("/"))
    for known, facts in KNOWN_MODELS.items():
        if known.lower() == name.lower():
            return ModelFacts.from_config(facts, name=known)
    raise PlanInputMissing(
        f"memory plan: needs the model's config.json ({MODEL}.path={path or '(unset)'} is not a folder on this machine "
        "nor a model the plan knows): set dapo.memory.model_config=/path/to/config.json")


GPU_KNOB = "dapo.memory.gpu_memory_gib"
THIS_GPU = "read from this machine's GPU 0"
# Run in a child process, so that the process that plans holds no CUDA context and can still fork.
_GPU_PROBE = ("import torch\n"
              "print(torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0)")


@functools.lru_cache(maxsize=1)
def this_gpu_bytes() -> Optional[int]:
    """The memory of this machine's first visible GPU as torch reports it (``total_memory``); None without one (no
    NVIDIA or ROCm device node: no child process is started)."""
    if not any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/kfd")):
        return None
    try:
        probe = subprocess.run([sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True, timeout=300)
        value = int(probe.stdout.split()[-1]) if probe.returncode == 0 and probe.stdout.split() else 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return value or None


def gpu_bytes_for(config) -> tuple[Optional[int], str]:
    """The memory of one GPU in bytes and where it comes from: ``dapo.memory.gpu_memory_gib`` (the launch scripts set
    the card they are written for), else this machine's GPU, else ``(None, "")``."""
    value = _sel(config, GPU_KNOB, None)
    if value:
        return int(float(value) * GIB), GPU_KNOB
    found = this_gpu_bytes()
    return (found, THIS_GPU) if found else (None, "")


def card_mismatch(plan: MemoryPlan) -> Optional[str]:
    """One line when this machine's GPU has less memory than the card the plan is checked against."""
    found = this_gpu_bytes() if plan.gpu_source == GPU_KNOB else None
    if found is None or found >= plan.gpu_bytes:
        return None
    return (f"memory plan: this machine's GPU 0 has {gib(found)} GiB, less than the {gib(plan.gpu_bytes)} GiB card the "
            f"plan is checked against ({GPU_KNOB}); on these GPUs set {GPU_KNOB}={gib(found)}")


GPU_MISSING = (f"memory plan: {GPU_KNOB} is unset and this machine has no GPU to read it from, so the plan has no "
               f"headroom and the start-up rule cannot check it: set {GPU_KNOB} (79.2 for an 80 GB H100/A100, 39.4 "
               "for 40 GB)")


def plan_for_config(config) -> MemoryPlan:
    """The plan of a composed config; :class:`PlanInputMissing` names a missing model config in one line."""
    gpu_bytes, source = gpu_bytes_for(config)
    plan = plan_memory(config, model_facts_for(config), gpu_bytes)
    plan.gpu_source = source
    return plan


# ----------------------------------------------------------------------------------------------------- docs and CLI

# The GPU launch scripts and the cards they are written for (docs/launching.md). Each passes the card's memory as
# dapo.memory.gpu_memory_gib (GiB as torch reports it), so its plan is checked at start-up; the doc shows each one's
# plan with what its exec line passes.
SHIPPED = (
    ("scripts/dapo_qwen2.5_32b.sh", "80 GB"),
    ("scripts/dapo_qwen2.5_7b_math.sh", "80 GB"),
    ("scripts/dapo_qwen2.5_1.5b_one_node.sh", "40 GB"),
    ("scripts/dapo_small_one_gpu.sh", "24 GB"),
)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script_overrides(script: str) -> list[str]:
    """The Hydra overrides a launch script passes to ``launch_dapo.sh`` (its exec line, less the user's ``"$@"``)."""
    with open(os.path.join(REPO_ROOT, script)) as handle:
        line = next(text for text in handle if text.startswith("exec ") and 'launch_dapo.sh"' in text)
    return [word for word in shlex.split(line.split('launch_dapo.sh"', 1)[1]) if word != "$@"]


DOC_BEGIN = "<!-- memory-plans:begin (generated by python -m recipe_dapo.preflight.memory_plan --doc; do not edit) -->"
DOC_END = "<!-- memory-plans:end -->"


def compose_size(size: str | None, overrides: list[str] = ()) -> Any:
    """The resolved config ``python -m recipe_dapo.main_dapo [size=<size>] <overrides>`` would train with."""
    from omegaconf import OmegaConf

    from recipe_dapo.config.compose import compose

    config = compose([f"size={size}"] * bool(size) + list(overrides))
    return OmegaConf.create(OmegaConf.to_container(config, resolve=True))


def shipped_plans() -> str:
    """The doc's generated part: the plan of every shipped GPU launch script on the card it is written for."""
    out = []
    for script, card in SHIPPED:
        overrides = script_overrides(script)
        plan = plan_for_config(compose_size(None, overrides))
        peak = plan.peak_phase
        verdict = ("fits" if not plan.over_budget() else
                   "does NOT fit: " + ", ".join(p.name for p in plan.over_budget()))
        out += [f"### `{script}` on {card} GPUs ({gib(plan.gpu_bytes)} GiB)", "",
                f"It passes `{' '.join(overrides)}`. Peak {gib(peak.peak)} GiB in {peak.name}; {verdict}.", "", "```"]
        out += plan.table()
        out += ["```", "", "<details><summary>every term</summary>", "", "```", *plan.details(), "```", "",
                "</details>", ""]
    return "\n".join(out).rstrip() + "\n"


def with_shipped_plans(text: str) -> str:
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ValueError(f"the markers are missing: add\n{DOC_BEGIN}\n{DOC_END}\nwhere the plans go")
    head, rest = text.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    return f"{head}{DOC_BEGIN}\n{shipped_plans()}{DOC_END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The per-GPU memory plan of a DAPO step (no GPU, no weights).")
    parser.add_argument("--size", default="paper_32b", help="the size group (size=...)")
    parser.add_argument("--gpu-gib", type=float, help="memory of one GPU in GiB (dapo.memory.gpu_memory_gib)")
    parser.add_argument("--details", action="store_true", help="every term of every phase")
    parser.add_argument("--doc", type=str, help="rewrite the generated part of this markdown file")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for recipe_dapo.main_dapo")
    args = parser.parse_args(argv)
    if args.doc:
        with open(args.doc) as handle:
            text = handle.read()
        with open(args.doc, "w") as handle:
            handle.write(with_shipped_plans(text))
        print(f"wrote the shipped launch scripts' memory plans into {args.doc}")
        return 0
    overrides = list(args.overrides) + ([f"dapo.memory.gpu_memory_gib={args.gpu_gib}"] if args.gpu_gib else [])
    try:
        plan = plan_for_config(compose_size(args.size, overrides))
    except PlanInputMissing as exc:
        print(exc)
        return 2
    print("\n".join(plan.table()))
    if args.details:
        print("\n".join(plan.details()))
    for line in (GPU_MISSING if plan.gpu_bytes is None else None, card_mismatch(plan)):
        if line:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
