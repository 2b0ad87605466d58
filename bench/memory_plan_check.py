"""The memory plan against torch's own accounting of real verl actor passes, on CPU (and on one GPU).

    nice -n 10 .venv/bin/python bench/memory_plan_check.py            # 14 shapes and 18 logits cases
    nice -n 10 .venv/bin/python bench/memory_plan_check.py --quick    # 4 shapes, 1 rank; logits cases uncompiled
    nice -n 10 .venv/bin/python bench/memory_plan_check.py --shape q2k-h256-l4-wide,1,0,2   # one, with raw snapshots
    python3 bench/memory_plan_check.py --device cuda            # on one GPU: 10 shapes, nccl, plan in its cuda mode
    .venv/bin/python bench/memory_plan_check.py --device cuda --dry-run   # the plans alone, no GPU needed

How long: 41 s on a quiet 2-core machine, about 6 minutes (353 s) while another benchmark shares its cores. One
process per rank count measures all of its shapes in turn (one process group each); vLLM's KV figures are computed
while the first one measures. Most of the rest is torch's tracker dispatching every operator in Python (verl's
per-row log-softmax on CPU). ``--device cuda``: 175 s on an NVIDIA H200 (10 shapes, one process).

For each shape (tiny Qwen2 models of a few sizes built from a config, no download; gradient checkpointing on and off;
fixed and dynamic micro-batches; 1 and 2 ranks over gloo), every rank builds verl's own FSDP engine
(``verl.workers.engine.fsdp.transformer_impl.FSDPEngineWithLMHead``: FSDP2 with verl's mixed precision, wrap policy,
optimizer and gradient checkpointing, as the actor worker builds it on ``platform=cpu``) and runs, as the actor worker
does: a warm-up update of one micro-batch (``forward_backward_batch`` + ``optimizer_step``, so that AdamW's moments
exist), an old-log-prob pass (``forward_backward_batch(forward_only=True)`` with ``calculate_entropy``), then an
update whose ``forward_backward_batch`` (two micro-batches: the second with the first one's gradients accumulated)
and ``optimizer_step`` are each tracked by torch's ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``. The
plan (``recipe_dapo.preflight.memory_plan.plan_memory`` in its CPU mode: no flash-attn kernel, padded batches, no
prefetch, single-tensor AdamW) is compared term by term with the tracker's peak snapshot of rank 0:

    parameters       <-> Sharded Param            gradients   <-> Sharded Grad
    AdamW moments    <-> OptState (forward/backward peak); moments + temporaries <-> OptState (optimizer step peak)
    gathered weights <-> Unsharded Param          activations, logits <-> Activation + Temp + Unsharded Grad + ...
    total            <-> Total

Offload cannot be measured on a CPU (the "device" is the host), and vLLM's KV cache is compared with vLLM's own
objects instead: ``FullAttentionSpec.page_size_bytes`` per layer and ``_get_kv_cache_bytes_per_block`` over the model's
layers for the bytes a token takes, and the same integer division as ``get_kv_cache_config_from_groups`` for the
tokens a cache holds.

Six of the shapes put the entropy in the update's loss (as ``entropy_coeff != 0`` does; verl then turns the in-place
cross-entropy backward off), checkpointed or chunked, with padded or packed batches, and with flash-attn's
cross-entropy protocol (:class:`FlashCrossEntropyProtocol`: its Triton kernel needs a GPU, the stand-in keeps what it
saves and where its gradient goes). Then :func:`logits_check` runs verl's own entropy and log-prob functions on
lm_head's output alone, as ``prepare_model_outputs`` calls them, for every case (entropy off, eager, checkpointed,
chunked, compiled; per-row log-softmax or flash-attn's protocol; update or no-grad pass), and compares the peak of the
CPU allocator's record (``torch.profiler`` with ``profile_memory``: it sees the compiled kernels' buffers, which a
dispatch-mode tracker cannot, as compiled code runs eagerly under one) with the plan's largest ``[tokens, vocab]``
moment (``update_logits_moments``).

Last line: ``RESULT max_term_rel_error=... total_rel_error=... entropy_on_max_term_rel_error=...
kv_bytes_per_token_match=0|1 shapes=N shapes_with_entropy=N logits_cases=N pass=1|0 [what missed]``; it passes
(exit 0) with every scored term within 10% (``PASS``), every phase's total within 5%, every term of the shapes and
logits cases with the entropy on within 5%, and the KV figures equal to vLLM's. ``entropy_check`` is the part the
test suite runs (tests/test_memory_plan_entropy_on_cpu.py).

``--device cuda`` runs the same passes on one GPU (1 rank; the process group is ``cpu:gloo,cuda:nccl`` as verl's
workers make it): four GPU-sized shapes (a 248M untied and a 494M tied Qwen2, the latter with Qwen2.5-0.5B's shapes;
2048-token sequences, 4096-token micro-batches), then the six single-rank shapes above. The plan is made in its
``cuda`` mode (prefetched all-gathers, AdamW's foreach kernels) with what runs there: padded batches
(``use_remove_padding=false``), SDPA attention, no flash-attn cross-entropy (the GPU machine has no flash-attn, so verl
takes its per-row log-softmax), no compiled entropy (``use_torch_compile=false``), and no allowance
(``overhead_bytes=0``: the CUDA context and allocator slack are measured instead). Each phase is also measured with
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` (peaks reset before it) and ``torch.cuda.mem_get_info``
(what the process holds outside torch's allocator: the CUDA context, NCCL). vLLM is not needed there: its KV check is
the CPU run's (``kv_bytes_per_token_match=na``). The last line adds ``device=cuda card=... gpu_total_rel_error=...``
(the plan's total against ``max_memory_allocated``, worst phase of the GPU-sized shapes) and the largest shape's
``peak_allocated_gib= peak_reserved_gib= planned_gib= outside_torch_gib=``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

# the checkout this script is in, before an installed recipe_dapo: the plan it checks is this checkout's
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import spawned_world  # noqa: E402  (bench/spawned_world.py, beside this script)

MODELS = {
    # name: (vocab, hidden, layers, heads, kv_heads, intermediate, tied)
    "q8k-h128-l4": (8192, 128, 4, 4, 2, 384, False),
    "q16k-h256-l2-tied": (16384, 256, 2, 8, 2, 704, True),
    "q2k-h256-l4-wide": (2048, 256, 4, 8, 4, 1536, False),
    # GPU-sized (--device cuda): 248M untied; 494M tied with Qwen2.5-0.5B's shapes
    "q32k-h1024-l16": (32768, 1024, 16, 16, 4, 2816, False),
    "q152k-h896-l24-tied": (151936, 896, 24, 14, 2, 4864, True),
}
PROMPT, RESPONSE, ROWS = 16, 48, 8  # a mini-batch of 8 full-length sequences of 64 tokens per rank
MICRO, BUDGET = 4, 256  # fixed: 4 sequences a micro-batch; dynamic: 256 tokens (4 sequences)
# the GPU-sized models: 8 sequences of 2048 tokens a rank; fixed: 2 a micro-batch; dynamic: 4096 tokens (2 sequences)
GPU_MODELS = {"q32k-h1024-l16", "q152k-h896-l24-tied"}
GPU_TOKENS = (512, 1536, 8, 2, 4096)


def dims(model: str) -> tuple[int, int, int, int, int]:
    """(prompt, response, rows, micro, budget) of a model's batches."""
    return GPU_TOKENS if model in GPU_MODELS else (PROMPT, RESPONSE, ROWS, MICRO, BUDGET)


# How the logits' end of a pass runs (the shape's fifth field; "" when absent): the entropy in the update's loss or
# not, checkpointed or chunked (chunking applies to packed batches only); padded batches or packed ones
# (use_remove_padding) with flash-attn's cross-entropy protocol (FlashCrossEntropyProtocol), whose in-place backward
# verl turns off when it computes the entropy. The compiled entropy is measured by logits_check alone: torch's
# tracker is a dispatch mode, under which compiled code runs eagerly.
VARIANTS = {
    "": dict(entropy=False, checkpointed=False, chunk=0, compiled=False, rmpad=False, flash=False),
    "entropy": dict(entropy=True, checkpointed=False, chunk=0, compiled=False, rmpad=False, flash=False),
    "entropy-checkpointed": dict(entropy=True, checkpointed=True, chunk=0, compiled=False, rmpad=False, flash=False),
    "packed-entropy-chunked": dict(entropy=True, checkpointed=False, chunk=64, compiled=False, rmpad=True,
                                   flash=False),
    "packed-flash-entropy-chunked": dict(entropy=True, checkpointed=False, chunk=64, compiled=False, rmpad=True,
                                         flash=True),
    "packed-flash": dict(entropy=False, checkpointed=False, chunk=0, compiled=False, rmpad=True, flash=True),
    "packed-flash-entropy": dict(entropy=True, checkpointed=False, chunk=0, compiled=False, rmpad=True, flash=True),
    "packed-entropy": dict(entropy=True, checkpointed=False, chunk=0, compiled=False, rmpad=True, flash=False),
}


def variant_of(shape) -> str:
    return shape[4] if len(shape) > 4 else ""


# (model, gradient checkpointing, dynamic micro-batches, ranks[, variant])
SHAPES = [("q8k-h128-l4", True, False, 1), ("q8k-h128-l4", False, True, 1),
          ("q16k-h256-l2-tied", True, True, 1), ("q16k-h256-l2-tied", False, False, 1),
          ("q2k-h256-l4-wide", True, False, 1), ("q2k-h256-l4-wide", False, True, 1),
          ("q8k-h128-l4", True, True, 2), ("q2k-h256-l4-wide", True, False, 2),
          # the entropy in the update's loss (verl turns the in-place cross-entropy backward off), and its options
          ("q8k-h128-l4", True, False, 1, "entropy"), ("q16k-h256-l2-tied", False, True, 1, "packed-flash-entropy"),
          ("q8k-h128-l4", True, True, 1, "entropy-checkpointed"),
          ("q16k-h256-l2-tied", True, False, 1, "packed-entropy-chunked"),
          ("q8k-h128-l4", False, True, 1, "packed-flash"), ("q8k-h128-l4", True, True, 2, "packed-flash-entropy")]
QUICK = [("q8k-h128-l4", True, False, 1), ("q8k-h128-l4", False, True, 1), ("q2k-h256-l4-wide", True, False, 1),
         ("q8k-h128-l4", True, False, 1, "packed-flash-entropy")]
# --device cuda: the GPU-sized shapes first (the entropy's CUDA-autocast terms on the untied one), then the
# single-rank shapes above that need no flash-attn stand-in
CUDA_SHAPES = [("q32k-h1024-l16", True, False, 1), ("q32k-h1024-l16", False, True, 1),
               ("q32k-h1024-l16", True, True, 1, "entropy"),
               ("q152k-h896-l24-tied", True, True, 1), ("q152k-h896-l24-tied", False, False, 1)] + [
    s for s in SHAPES if s[3] == 1 and not VARIANTS[variant_of(s)]["flash"]]
CUDA_QUICK = [("q8k-h128-l4", True, False, 1), ("q152k-h896-l24-tied", True, True, 1)]
GIB = 1 << 30
TERM_OF = {  # the tracker's categories -> the plan's term groups
    "Sharded Param": "parameters", "Sharded Grad": "gradients", "OptState": "optimizer",
    "Unsharded Param": "gathered", "Activation": "activations", "Temp": "activations", "Unsharded Grad": "activations",
    "All Gather": "activations", "Reduce Scatter": "activations", "Inputs": "activations", "Buffer": "activations",
}
MIN_TERM_BYTES = 64 << 10  # terms smaller than this are listed but not scored (a few KiB of ids, masks, scalars)


def hf_config(model: str) -> dict:
    vocab, hidden, layers, heads, kv_heads, intermediate, tied = MODELS[model]
    return dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=intermediate, tie_word_embeddings=tied,
                max_position_embeddings=4096, model_type="qwen2")


# ------------------------------------------------------------------------------------------------- the plan's side


def plan_groups(model: str, gc: bool, dynamic: bool, world: int, device: str = "cpu",
                variant: str = "") -> dict[str, dict[str, int]]:
    """The plan's terms by group for one shape; ``device``: the plan's mode (``cpu`` or ``cuda``; in both, no
    allowance, and padded batches without flash-attn's cross-entropy and without the compiled entropy unless the
    shape's ``variant`` says otherwise: what the bench runs)."""
    from recipe_dapo.preflight.memory_plan import Layout, plan_memory

    prompt, response, rows, micro, budget = dims(model)
    v = VARIANTS[variant]
    layout = Layout(
        world=world, fsdp=world, sp=1, ref_sp=1, tp=1, prompt=prompt, response=response, mini_rows_per_gpu=rows,
        dynamic=dynamic, update_tokens_budget=budget, update_micro=micro, logprob_tokens_budget=budget,
        logprob_micro=micro, ref_tokens_budget=budget, ref_micro=micro, param_bytes=4, compute_bytes=2,
        rollout_bytes=2, kv_bytes=2, param_offload=False, optimizer_offload=False, offload_policy=False,
        no_sync_accumulation=False, gradient_checkpointing=gc, activation_offload=False, remove_padding=v["rmpad"],
        entropy_in_update=v["entropy"], entropy_checkpointing=v["checkpointed"], entropy_chunk=v["chunk"],
        fused_kernels=False, compiled_entropy=v["compiled"], lora_rank=0, lora_targets=None, use_ref=False,
        gpu_memory_utilization=0.5, free_cache_engine=True, max_num_seqs=256, max_num_batched_tokens=budget,
        round_sequences=rows, per_node=world, device=device, overhead_bytes=0, flash_cross_entropy=v["flash"])
    plan = plan_memory(layout, hf_config(model), None)
    groups = {}
    for phase in plan.phases:
        if phase.name == "rollout":
            continue
        g: dict[str, int] = {}
        for term in phase.terms:
            g[_group(term.name)] = g.get(_group(term.name), 0) + term.bytes
        g["total"] = phase.peak
        groups[phase.name] = g
    return groups


def _group(name: str) -> str:
    if name.startswith("actor parameters"):
        return "parameters"
    if name.startswith("actor gradients"):
        return "gradients"
    if name.startswith("AdamW"):
        return "optimizer"
    if name.startswith("gathered"):
        return "gathered"
    return "activations"


# ----------------------------------------------------------------------------------------------- the measured side


def worker(rank: int, world: int, port: int, payload: dict, out: str) -> None:
    device = payload["device"]
    os.environ.update(VERL_ENGINE_DEVICE="cuda", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TOKENIZERS_PARALLELISM="false")
    if device == "cpu":
        os.environ["VERL_PLATFORM"] = "cpu"
    import logging

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import torch

    if device == "cpu":
        torch.set_num_threads(1 if world > 1 else 2)
        from recipe_dapo.cpu import compat

        compat.apply()
    import torch.distributed as dist

    if device == "cpu":
        dist.init_process_group("gloo", rank=rank, world_size=world)
    else:
        torch.set_num_threads(8)  # building the GPU-sized models' weights on the host
        torch.cuda.set_device(rank)
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=rank, world_size=world)
    results = []
    for shape in payload["shapes"]:
        model, gc, dynamic = shape[:3]
        if device == "cpu":
            results.append({"shape": [model, gc, dynamic, world, variant_of(shape)],
                            **measure(model, gc, dynamic, rank, variant=variant_of(shape))})
            continue
        start = time.time()
        try:
            result = {"shape": [model, gc, dynamic, world, variant_of(shape)],
                      **measure(model, gc, dynamic, rank, device, variant_of(shape))}
        except Exception as exc:  # one shape's failure is reported, the others still run
            import traceback

            traceback.print_exc()
            result = {"shape": [model, gc, dynamic, world, variant_of(shape)],
                      "error": f"{type(exc).__name__}: {exc}"[:500]}
        result["seconds"] = round(time.time() - start, 1)
        results.append(result)
        if rank == 0:  # as it goes: a log cut short still holds every finished shape
            print("SHAPE " + json.dumps(result), flush=True)
            with open(out, "w") as handle:
                json.dump(results, handle)
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(results, handle)
    dist.barrier()
    dist.destroy_process_group()


def build_model_dir(model: str) -> str:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    folder = os.path.join(tempfile.gettempdir(), f"memory_plan_check_{model}")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        tokenizer = Tokenizer(models.WordLevel({"<pad>": 0, "a": 1, "<unk>": 2}, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<pad>").save_pretrained(folder)
        torch.manual_seed(0)
        config = {k: v for k, v in hf_config(model).items() if k != "model_type"}
        Qwen2ForCausalLM(Qwen2Config(**config, torch_dtype="float32")).save_pretrained(folder)
    return folder


class FlashCrossEntropyProtocol:
    """flash-attn's Triton cross-entropy (``flash_attn.ops.triton.cross_entropy.cross_entropy_loss``, which verl's
    ``logprobs_from_logits`` calls when flash-attn is installed) on CPU, keeping its memory protocol, the only part
    the plan depends on: the forward saves the logits, the fp32 log-sum-exp per row and the labels and makes no
    ``[tokens, vocab]`` temporary (one row at a time here); the backward writes the logits' gradient into the logits
    themselves with ``inplace_backward`` (raw writes: no version bump, as a Triton kernel's), else into a new
    ``empty_like(logits)``. Installed into ``verl.utils.torch_functional`` for the shapes marked ``flash``."""

    @staticmethod
    def install() -> None:
        import torch

        from verl.utils import torch_functional

        class CrossEntropy(torch.autograd.Function):
            @staticmethod
            def forward(ctx, logits, labels, inplace_backward):
                logits = logits if logits.stride(-1) == 1 else logits.contiguous()
                rows = logits.shape[0]
                lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
                losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
                for i in range(rows):
                    row = logits[i].float()
                    lse[i] = torch.logsumexp(row, -1)
                    losses[i] = lse[i] - row[labels[i]]
                ctx.save_for_backward(logits, lse, labels)
                ctx.inplace_backward = inplace_backward
                return losses, torch.zeros_like(losses)

            @staticmethod
            def backward(ctx, grad_losses, grad_z_losses):
                logits, lse, labels = ctx.saved_tensors
                dlogits = logits if ctx.inplace_backward else torch.empty_like(logits)
                raw = dlogits.data
                for i in range(logits.shape[0]):
                    probs = torch.exp(logits[i].float() - lse[i])
                    probs[labels[i]] -= 1.0
                    raw[i] = (probs * grad_losses[i]).to(raw.dtype)
                return dlogits, None, None

        def cross_entropy_loss(logits, labels, inplace_backward=False, **_):
            return CrossEntropy.apply(logits, labels, inplace_backward)

        torch_functional.cross_entropy_loss = cross_entropy_loss
        torch_functional.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE = True


def measure(model: str, gc: bool, dynamic: bool, rank: int, device: str = "cpu", variant: str = "") -> dict:
    import gc as garbage
    import torch
    from tensordict import TensorDict
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from verl.trainer.config import CheckpointConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import left_right_2_no_padding

    cuda = device != "cpu"
    prompt, response, rows_per_rank, micro, budget = dims(model)
    if cuda:  # each shape starts from an empty cache; what earlier shapes left allocated is its baseline
        garbage.collect()
        torch.cuda.empty_cache()
        baseline = {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved()}
    folder = build_model_dir(model) if rank == 0 else None
    torch.distributed.barrier()
    folder = folder or os.path.join(tempfile.gettempdir(), f"memory_plan_check_{model}")
    v = VARIANTS[variant]
    if v["flash"]:
        FlashCrossEntropyProtocol.install()
    engine = FSDPEngineWithLMHead(
        HFModelConfig(path=folder, use_remove_padding=v["rmpad"], enable_gradient_checkpointing=gc,
                      override_config={"attn_implementation": "sdpa"}),
        # as verl's fsdp.yaml sets it (the dataclass's own default is true)
        FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", use_torch_compile=v["compiled"],
                         use_no_sync_for_gradient_accumulation=False, entropy_checkpointing=v["checkpointed"],
                         entropy_from_logits_with_chunking=bool(v["chunk"]),
                         entropy_from_logits_chunk_size=v["chunk"] or 2048),
        FSDPOptimizerConfig(lr=1e-6, clip_grad=1.0, total_training_steps=10), CheckpointConfig())
    engine.initialize()
    seq = prompt + response
    vocab = MODELS[model][0]

    def batch(entropy: bool, rows: int = rows_per_rank) -> TensorDict:
        ids = torch.randint(3, vocab, (rows, seq))
        data = TensorDict({"input_ids": ids, "attention_mask": torch.ones(rows, seq, dtype=torch.long),
                           "position_ids": torch.arange(seq).expand(rows, seq).clone(), "responses": ids[:, prompt:],
                           "response_mask": torch.ones(rows, response, dtype=torch.long)}, batch_size=[rows])
        data = left_right_2_no_padding(data)
        tu.assign_non_tensor(data, use_remove_padding=v["rmpad"], use_dynamic_bsz=dynamic, micro_batch_size_per_gpu=micro,
                             max_token_len_per_gpu=budget, calculate_entropy=entropy, temperature=1.0)
        return data

    def loss_fn(model_output, data, dp_group=None):
        loss = -model_output["log_probs"].values().float().mean()
        if "entropy" in model_output and torch.is_grad_enabled():  # an entropy bonus, as entropy_coeff != 0 adds
            loss = loss - 0.01 * model_output["entropy"].values().float().mean()
        return loss, {}

    gpu: dict[str, dict] = {}

    def tracked(run, phase: str = "") -> dict:
        if cuda:  # the allocator's own peaks over the same pass
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        tracker = FSDPMemTracker(engine.module, engine.optimizer)
        original = engine.forward_step

        def forward_step(*args, **kwargs):  # one tracked iteration per micro-batch
            tracker.reset_mod_stats()
            return original(*args, **kwargs)

        engine.forward_step = forward_step
        try:
            with tracker:
                run()
        finally:
            engine.forward_step = original
        peak = tracker.get_tracker_snapshot("peak")
        snap = next((s for dev, s in peak.items() if str(dev).split(":")[0] == ("cuda" if cuda else "cpu")), {})
        if cuda:
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            gpu[phase] = {"max_allocated": torch.cuda.max_memory_allocated(),
                          "max_reserved": torch.cuda.max_memory_reserved(), "allocated_before": before,
                          "reserved": torch.cuda.memory_reserved(), "device_used": total - free,
                          "device_total": total}
        return {k: int(v) for k, v in snap.items()}

    measured = {}
    with engine.train_mode():
        # a warm-up update of one micro-batch (micro rows: one micro-batch, fixed or dynamic), so that AdamW's moments
        # exist (their size does not depend on tokens)
        engine.forward_backward_batch(batch(False, micro), loss_fn)
        engine.optimizer_step()
        engine.optimizer_zero_grad()
        # two micro-batches: the tracker only names FSDP's gathered layers right once it has seen them gathered
        measured["old log-prob"] = tracked(lambda: engine.forward_backward_batch(batch(True), loss_fn,
                                                                                   forward_only=True), "old log-prob")
        # two micro-batches: the second runs with the first one's gradients accumulated, as in every update
        measured["actor update"] = tracked(lambda: engine.forward_backward_batch(batch(v["entropy"]), loss_fn),
                                           "actor update")
        measured["optimizer step"] = tracked(engine.optimizer_step, "optimizer step")
        engine.optimizer_zero_grad()
    del engine
    if cuda:
        measured["_cuda"] = {**gpu, "baseline": baseline, "card": torch.cuda.get_device_name(),
                             "torch": torch.__version__}
    return measured


def measured_groups(snapshot: dict) -> dict[str, int]:
    groups: dict[str, int] = {}
    for category, value in snapshot.items():
        if category == "Total":
            continue
        group = TERM_OF.get(category, "activations")
        groups[group] = groups.get(group, 0) + value
    groups["total"] = snapshot.get("Total", sum(groups.values()))
    return groups


# ------------------------------------------------------------------------------------------ the logits on their own

# (name, entropy mode, flash-attn's protocol, grad): what verl's prepare_model_outputs runs on packed logits
LOGITS_CASES = [(mode, flash, grad) for grad in (True, False) for flash in (False, True)
                for mode in ("off", "eager", "checkpointed", "chunked", "compiled") if grad or mode != "checkpointed"]
LOGITS_TOKENS, LOGITS_VOCAB, LOGITS_CHUNK = 256, 8192, 64


def logits_layout(mode: str, flash: bool, grad: bool):
    """The plan's Layout for one case of :func:`logits_check` (CPU mode, packed batches)."""
    from recipe_dapo.preflight.memory_plan import Layout

    return Layout(
        world=1, fsdp=1, sp=1, ref_sp=1, tp=1, prompt=16, response=LOGITS_TOKENS - 16, mini_rows_per_gpu=1,
        dynamic=True, update_tokens_budget=LOGITS_TOKENS, update_micro=1, logprob_tokens_budget=LOGITS_TOKENS,
        logprob_micro=1, ref_tokens_budget=LOGITS_TOKENS, ref_micro=1, param_bytes=4, compute_bytes=2,
        rollout_bytes=2, kv_bytes=2, param_offload=False, optimizer_offload=False, offload_policy=False,
        no_sync_accumulation=False, gradient_checkpointing=True, activation_offload=False, remove_padding=True,
        entropy_in_update=grad and mode != "off", entropy_checkpointing=mode == "checkpointed",
        entropy_chunk=LOGITS_CHUNK if mode == "chunked" else 0, fused_kernels=False, compiled_entropy=mode == "compiled",
        lora_rank=0, lora_targets=None, use_ref=False, gpu_memory_utilization=0.5, free_cache_engine=True,
        max_num_seqs=1, max_num_batched_tokens=LOGITS_TOKENS, round_sequences=1, per_node=1, device="cpu",
        overhead_bytes=0, flash_cross_entropy=flash)


def planned_logits_peak(mode: str, flash: bool, grad: bool) -> int:
    """The plan's largest ``[tokens, vocab]`` moment for one case: the update's (grad) or the old log-probs'."""
    from recipe_dapo.preflight.memory_plan import ModelFacts, no_grad_entropy_term, update_logits_moments

    lay = logits_layout(mode, flash, grad)
    t, v = LOGITS_TOKENS, LOGITS_VOCAB
    if not grad:  # the logits and the entropy's temporaries
        head = ModelFacts(name="lm_head", hidden=64, layers=1, heads=1, kv_heads=1, head_dim=64, intermediate=64,
                          vocab=v, tied=False)
        return t * v * 2 + no_grad_entropy_term(t, head, 2, lay).bytes * (mode != "off")
    moments = update_logits_moments(t, v, 2, lay)
    gradient_alone = t * v * 2  # the logits' gradient reaching lm_head's backward
    return max([gradient_alone] + [sum(term.bytes for term in terms) for terms in moments.values()])


def measured_logits_peak(mode: str, flash: bool, grad: bool) -> int:
    """Peak bytes torch allocates from lm_head's output on, through verl's own entropy and log-prob functions as
    ``FSDPEngineWithLMHead.prepare_model_outputs`` calls them on packed logits (entropy before log-probs; the
    in-place backward off with the entropy; checkpointed, chunked or compiled as ``fsdp_config`` says), then the
    backward of a loss of both: the CPU allocator's own record (``torch.profiler`` with ``profile_memory``, which
    sees the compiled kernels' buffers too; a dispatch-mode tracker would run them eagerly)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from verl.utils import torch_functional as verl_F

    if flash:
        FlashCrossEntropyProtocol.install()
    entropy_fn = verl_F.entropy_from_logits_with_chunking if mode == "chunked" else verl_F.entropy_from_logits
    if mode == "compiled":
        entropy_fn = torch.compile(entropy_fn, dynamic=True)  # as the engine compiles it
    t, v = LOGITS_TOKENS, LOGITS_VOCAB
    torch.manual_seed(0)
    hidden = torch.randn(t, 64, dtype=torch.bfloat16, requires_grad=grad)
    head = torch.randn(v, 64, dtype=torch.bfloat16) / 8
    labels = torch.randint(0, v, (t,))

    def run():
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = hidden @ head.t()
            entropy = None
            if mode == "checkpointed":
                entropy = torch.utils.checkpoint.checkpoint(entropy_fn, logits)
            elif mode == "chunked":
                entropy = entropy_fn(logits, chunk_size=LOGITS_CHUNK)
            elif mode != "off":
                entropy = entropy_fn(logits)
            log_probs = verl_F.logprobs_from_logits(logits, labels, inplace_backward=entropy is None)
            del logits  # the model's output is not kept past the forward: autograd's saved tensors are
        if grad:
            loss = -log_probs.float().mean() - (0.0 if entropy is None else 0.01 * entropy.float().mean())
            del log_probs, entropy
            loss.backward()

    for _ in range(2 if mode == "compiled" else 1):  # compiles (once) and warms up
        run()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for event in events:
        now += event.nbytes()
        peak = max(peak, now)
    return peak


def logits_check(cases=None, measured_peaks: dict | None = None) -> tuple[float, list[str]]:
    """Every case's planned largest ``[tokens, vocab]`` moment against torch's allocations (the worst relative
    error with the entropy on, and a line a case); ``measured_peaks`` receives the measured bytes by case."""
    import warnings

    warnings.filterwarnings("ignore")
    worst, lines = 0.0, []
    for mode, flash, grad in cases or LOGITS_CASES:
        planned, measured = planned_logits_peak(mode, flash, grad), measured_logits_peak(mode, flash, grad)
        if measured_peaks is not None:
            measured_peaks[(mode, flash, grad)] = measured
        err = abs(planned - measured) / max(measured, 1)
        if mode != "off":
            worst = max(worst, err)
        lines.append(f"  {'update' if grad else 'no grad':<8} entropy {mode:<13} {'flash' if flash else 'per-row':<8} "
                     f"plan {planned / 2**20:>6.1f} MiB  torch {measured / 2**20:>6.1f} MiB  {err:>6.1%}")
    return worst, lines


# --------------------------------------------------------------------------------------------------------- KV cache


def kv_check() -> tuple[int, list[str]]:
    """KV bytes a token and the tokens a cache holds: the plan's against vLLM's own objects (1 when all agree)."""
    import torch
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_bytes_per_block
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    from recipe_dapo.preflight.memory_plan import KNOWN_MODELS, VLLM_BLOCK_TOKENS, Layout, ModelFacts, plan_memory

    lines, ok = [], True
    for name, facts in KNOWN_MODELS.items():
        m = ModelFacts.from_config(facts, name)
        for tp in (1, 2, 4):
            if m.heads % tp:
                continue
            layout = Layout(
                world=8, fsdp=8, sp=1, ref_sp=1, tp=tp, prompt=1024, response=3072, mini_rows_per_gpu=64,
                dynamic=True, update_tokens_budget=16384, update_micro=4, logprob_tokens_budget=16384,
                logprob_micro=4, ref_tokens_budget=16384, ref_micro=4, param_bytes=4, compute_bytes=2,
                rollout_bytes=2, kv_bytes=2, param_offload=False, optimizer_offload=False, offload_policy=False,
                no_sync_accumulation=False, gradient_checkpointing=True, activation_offload=False, remove_padding=True,
                entropy_in_update=False, entropy_checkpointing=False, entropy_chunk=0, fused_kernels=False,
                compiled_entropy=True, lora_rank=0, lora_targets=None, use_ref=False, gpu_memory_utilization=0.7,
                free_cache_engine=True, max_num_seqs=256, max_num_batched_tokens=8192, round_sequences=2048,
                per_node=8, device="cuda", overhead_bytes=0)
            kv = plan_memory(layout, m, 80 << 30).kv
            spec = FullAttentionSpec(block_size=VLLM_BLOCK_TOKENS, num_kv_heads=max(1, m.kv_heads // tp),
                                     head_size=m.head_dim, dtype=torch.bfloat16)
            group = KVCacheGroupSpec(layer_names=[f"model.layers.{i}.self_attn.attn" for i in range(m.layers)],
                                     kv_cache_spec=spec)
            per_block = _get_kv_cache_bytes_per_block([group])
            vllm_per_token = per_block // VLLM_BLOCK_TOKENS
            vllm_tokens = (kv.cache_bytes // per_block) * VLLM_BLOCK_TOKENS
            agree = vllm_per_token == kv.bytes_per_token and vllm_tokens == kv.tokens
            ok &= agree
            lines.append(f"  {name:<22} TP {tp}: plan {kv.bytes_per_token:>7,} B/token {kv.tokens:>10,} tokens | vLLM "
                         f"{vllm_per_token:>7,} B/token {vllm_tokens:>10,} tokens  {'match' if agree else 'MISMATCH'}")
    return int(ok), lines


# ------------------------------------------------------------------------------------------------------------- main


def start_world(world: int, shapes: list, device: str = "cpu"):
    """Start one process per rank (one process group per rank count; each measures all of its shapes in turn);
    ``finish_world`` waits for them and reads rank 0's results."""
    return spawned_world.start(worker, world, {"shapes": shapes, "device": device})


finish_world = spawned_world.finish

PHASES = ("actor update", "optimizer step", "old log-prob")


def label_of(model: str, gc: bool, dynamic: bool, world: int, variant: str = "") -> str:
    return f"{model} gc={'on' if gc else 'off'} {'dyn' if dynamic else 'fixed'} x{world}" + (
        f" {variant}" if variant else "")


def dry_run(shapes: list, device: str) -> int:
    """The plans of the shapes, no measurement (and, for cuda, whether the measuring modules import here)."""
    print(f"{'shape':<38} {'phase':<15} " + " ".join(f"{t:>12}" for t in ("parameters", "gradients", "optimizer",
                                                                            "gathered", "activations", "total")))
    for shape in shapes:
        plan = plan_groups(*shape[:4], device=device, variant=variant_of(shape))
        for phase in PHASES:
            print(f"{label_of(*shape[:4], variant_of(shape)):<58} {phase:<15} " + " ".join(
                f"{plan[phase].get(t, 0) / 1024:>12.0f}" for t in ("parameters", "gradients", "optimizer", "gathered",
                                                                   "activations", "total")))
    print("(KiB, plan in its", device, "mode)")
    if device == "cuda":
        import importlib

        for name in ("tensordict", "torch.distributed._tools.fsdp2_mem_tracker", "verl.trainer.config",
                     "verl.workers.config", "verl.workers.engine.fsdp.transformer_impl", "verl.workers.utils.padding"):
            importlib.import_module(name)
        print("the measuring modules import")
    print(f"RESULT dry_run=1 device={device} shapes={len(shapes)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 shapes at 1 rank (cuda: 2 shapes)")
    parser.add_argument("--shape", help="one shape: model,gc(0|1),dynamic(0|1),ranks; prints the raw snapshots")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: the passes on GPU 0 (1 rank, nccl), the plan in its cuda mode")
    parser.add_argument("--dry-run", action="store_true", help="print the shapes' plans, measure nothing")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    shapes = (CUDA_QUICK if args.quick else CUDA_SHAPES) if cuda else (QUICK if args.quick else SHAPES)
    if args.shape:
        model, gc, dyn, world, *variant = args.shape.split(",")
        shapes = [(model, gc == "1", dyn == "1", int(world), *variant)]
    if cuda and any(s[3] != 1 for s in shapes):
        parser.error("--device cuda measures on one GPU: ranks must be 1")
    if args.dry_run:
        return dry_run(shapes, args.device)
    start = time.time()
    results, kv_match, kv_lines = [], None, []
    for world in sorted({s[3] for s in shapes}):
        started = start_world(world, [s for s in shapes if s[3] == world], args.device)
        if kv_match is None:  # vLLM's import and the KV figures, while the first rank count measures
            try:
                kv_match, kv_lines = kv_check()
            except ImportError as exc:
                if not cuda:
                    raise
                kv_match, kv_lines = "na", [f"  not checked here ({exc}); the CPU run compares it"]
        results += finish_world(started)
    failed = [r for r in results if "error" in r]
    results = [r for r in results if "error" not in r]
    scores = compare(results, args.device)
    print("\n".join(scores.pop("lines")))
    if args.shape and results:
        for phase, snap in results[0].items():
            if phase in PHASES:
                print(phase, {k: round(v / 1024) for k, v in snap.items() if v})
    gpu_line = ""
    if cuda:
        gpu_line = cuda_table(results)
        for result in failed:
            print(f"FAILED {label_of(*result['shape'])}: {result['error']}")
    else:
        print("KV cache, the plan against vLLM's FullAttentionSpec / _get_kv_cache_bytes_per_block (80 GiB, util 0.7):")
    if not cuda or kv_match != "na":
        print("\n".join(kv_lines))
    entropy_worst = scores["entropy_on_max_term_rel_error"]
    logits_cases = 0
    if not cuda and not args.shape:  # the logits on their own, the compiled entropy included
        cases = [c for c in LOGITS_CASES if c[0] != "compiled"] if args.quick else LOGITS_CASES
        worst, lines = logits_check(cases)
        print("The update's and the old log-probs' [tokens, vocab] tensors, the plan against torch's allocations "
              f"({LOGITS_TOKENS} tokens x {LOGITS_VOCAB} vocab, bf16, packed batches):")
        print("\n".join(lines))
        entropy_worst, logits_cases = max(entropy_worst, worst), len(cases)
    print(f"{len(results)} shapes in {time.time() - start:.0f} s")
    verdict = ""
    if not cuda:
        misses = [f"{name}={value:.3f}>{limit}" for name, value, limit in (
            ("max_term_rel_error", scores["max_term_rel_error"], PASS["max_term_rel_error"]),
            ("total_rel_error", scores["total_rel_error"], PASS["total_rel_error"]),
            ("entropy_on_max_term_rel_error", entropy_worst, PASS["entropy_on_max_term_rel_error"]))
            if value > limit] + (["kv_bytes_per_token_match=0"] if kv_match == 0 else [])
        verdict = " pass=1" if not misses else " pass=0 " + " ".join(misses)
    print(f"RESULT max_term_rel_error={scores['max_term_rel_error']:.3f} "
          f"total_rel_error={scores['total_rel_error']:.3f} entropy_on_max_term_rel_error={entropy_worst:.3f} "
          f"kv_bytes_per_token_match={kv_match} shapes={len(results)} "
          f"shapes_with_entropy={scores['shapes_with_entropy']} logits_cases={logits_cases}" + gpu_line
          + (f" failed={len(failed)}" if cuda else "") + verdict)
    return 1 if verdict.startswith(" pass=0") else 0


# The CPU check's pass thresholds: each term group of each phase (>= 64 KiB) and each phase's total within these of
# torch's accounting; the shapes and logits cases with the entropy on, every term within 5%.
PASS = {"max_term_rel_error": 0.10, "total_rel_error": 0.05, "entropy_on_max_term_rel_error": 0.05}


def compare(results: list, device: str = "cpu") -> dict:
    """The plan against the tracker, shape by shape: the worst term and total errors, the worst with the entropy
    on (term or total) and a printed line per term."""
    worst_term = worst_total = worst_entropy = 0.0
    lines = [f"{'shape':<58} {'phase':<15} {'term':<12} {'plan KiB':>10} {'torch KiB':>10} {'rel err':>8}"]
    for result in results:
        model, gc, dynamic, world, variant = result["shape"]
        plan = plan_groups(model, gc, dynamic, world, device, variant)
        label = label_of(model, gc, dynamic, world, variant)
        for phase in PHASES:
            measured = measured_groups(result[phase])
            planned = plan[phase]
            for term in ("parameters", "gradients", "optimizer", "gathered", "activations", "total"):
                p, t = planned.get(term, 0), measured.get(term, 0)
                if max(p, t) == 0:
                    continue
                err = abs(p - t) / max(t, 1)
                scored = max(p, t) >= MIN_TERM_BYTES
                if scored and term == "total":
                    worst_total = max(worst_total, err)
                elif scored:
                    worst_term = max(worst_term, err)
                if scored and VARIANTS[variant]["entropy"] and phase == "actor update":
                    worst_entropy = max(worst_entropy, err)
                lines.append(f"{label:<58} {phase:<15} {term:<12} {p / 1024:>10.0f} {t / 1024:>10.0f} "
                             f"{err:>7.1%}{'' if scored else ' (not scored: < 64 KiB)'}")
    return {"max_term_rel_error": worst_term, "total_rel_error": worst_total,
            "entropy_on_max_term_rel_error": worst_entropy,
            "shapes_with_entropy": sum(VARIANTS[r["shape"][4]]["entropy"] for r in results), "lines": lines}


ENTROPY_CHECK_SHAPES = [("q8k-h128-l4", True, False, 1, "packed-flash-entropy")]
ENTROPY_CHECK_CASES = [("eager", True, True), ("checkpointed", False, True), ("chunked", True, True)]


def entropy_check() -> dict:
    """The CPU check the test suite runs (about 15 s): one real verl engine update with the entropy in its loss
    and flash-attn's cross-entropy protocol (in-place backward off), and the logits on their own with the entropy
    eager, checkpointed and chunked (the compiled case needs a compile: the bench runs it)."""
    started = start_world(1, ENTROPY_CHECK_SHAPES)  # the engine's process, while this one measures the logits
    measured: dict = {}
    worst, lines = logits_check(ENTROPY_CHECK_CASES, measured)
    scores = compare(finish_world(started))
    scores["logits_measured"] = measured
    scores["entropy_on_max_term_rel_error"] = max(scores["entropy_on_max_term_rel_error"], worst)
    scores["lines"] += lines
    return scores


def cuda_table(results: list) -> str:
    """Each phase's plan total against torch's tracker and the CUDA allocator; the RESULT line's GPU fields."""
    print(f"\n{'shape':<38} {'phase':<15} {'plan MiB':>9} {'tracker':>9} {'max alloc':>9} {'max rsrvd':>9} "
          f"{'rel err':>8} {'outside torch':>13}")
    worst_big, worst_tiny, top, card = 0.0, 0.0, None, "?"
    for result in results:
        model, gc, dynamic, world = result["shape"]
        plan = plan_groups(model, gc, dynamic, world, "cuda")
        gpu = result["_cuda"]
        card = gpu.get("card", card)
        for phase in PHASES:
            planned, tracker, stats = plan[phase]["total"], result[phase].get("Total", 0), gpu[phase]
            base = gpu.get("baseline", {})  # what earlier shapes left allocated, not this shape's
            alloc = stats["max_allocated"] - base.get("allocated", 0)
            reserved = stats["max_reserved"] - base.get("reserved", 0)
            err = abs(planned - alloc) / max(alloc, 1)
            outside = stats["device_used"] - stats["reserved"]
            if model in GPU_MODELS:
                worst_big = max(worst_big, err)
            else:
                worst_tiny = max(worst_tiny, err)
            if top is None or alloc > top[0]:
                top = (alloc, reserved, planned, outside)
            label = label_of(model, gc, dynamic, world)
            print(f"{label:<38} {phase:<15} {planned / 2**20:>9.1f} {tracker / 2**20:>9.1f} "
                  f"{alloc / 2**20:>9.1f} {reserved / 2**20:>9.1f} {err:>7.1%} {outside / 2**20:>13.0f}")
    print(f"(plan: cuda mode, no allowance; max alloc / max rsrvd: the phase's peaks less what earlier shapes left; rel "
          f"err: plan against max alloc; outside torch: the process's device memory less torch's reserved, at the "
          f"phase's end; card: {card})")
    if top is None:
        return f" device=cuda card={card.replace(' ', '_')}"
    alloc, reserved, planned, outside = top
    return (f" device=cuda card={card.replace(' ', '_')} gpu_total_rel_error={worst_big:.3f} "
            f"gpu_tiny_total_rel_error={worst_tiny:.3f} peak_allocated_gib={alloc / GIB:.2f} "
            f"peak_reserved_gib={reserved / GIB:.2f} planned_gib={planned / GIB:.2f} "
            f"outside_torch_gib={outside / GIB:.2f}")


if __name__ == "__main__":
    sys.exit(main())
