"""The memory plan against torch's own accounting of real verl actor passes, on CPU (and on one GPU).

    nice -n 10 .venv/bin/python bench/memory_plan_check.py            # 8 shapes (timing below)
    nice -n 10 .venv/bin/python bench/memory_plan_check.py --quick    # 3 shapes, 1 rank
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

Last line: ``RESULT max_term_rel_error=... total_rel_error=... kv_bytes_per_token_match=0|1 shapes=N``.

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

import spawned_world  # bench/spawned_world.py, beside this script

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


# (model, gradient checkpointing, dynamic micro-batches, ranks)
SHAPES = [("q8k-h128-l4", True, False, 1), ("q8k-h128-l4", False, True, 1),
          ("q16k-h256-l2-tied", True, True, 1), ("q16k-h256-l2-tied", False, False, 1),
          ("q2k-h256-l4-wide", True, False, 1), ("q2k-h256-l4-wide", False, True, 1),
          ("q8k-h128-l4", True, True, 2), ("q2k-h256-l4-wide", True, False, 2)]
QUICK = [("q8k-h128-l4", True, False, 1), ("q8k-h128-l4", False, True, 1), ("q2k-h256-l4-wide", True, False, 1)]
# --device cuda: the GPU-sized shapes first, then the single-rank shapes above
CUDA_SHAPES = [("q32k-h1024-l16", True, False, 1), ("q32k-h1024-l16", False, True, 1),
               ("q152k-h896-l24-tied", True, True, 1), ("q152k-h896-l24-tied", False, False, 1)] + [
    s for s in SHAPES if s[3] == 1]
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


def plan_groups(model: str, gc: bool, dynamic: bool, world: int, device: str = "cpu") -> dict[str, dict[str, int]]:
    """The plan's terms by group for one shape; ``device``: the plan's mode (``cpu`` or ``cuda``; in both, padded
    batches, no flash-attn cross-entropy, no compiled entropy, no allowance: what the bench runs)."""
    from recipe_dapo.preflight.memory_plan import Layout, plan_memory

    prompt, response, rows, micro, budget = dims(model)
    layout = Layout(
        world=world, fsdp=world, sp=1, ref_sp=1, tp=1, prompt=prompt, response=response, mini_rows_per_gpu=rows,
        dynamic=dynamic, update_tokens_budget=budget, update_micro=micro, logprob_tokens_budget=budget,
        logprob_micro=micro, ref_tokens_budget=budget, ref_micro=micro, param_bytes=4, compute_bytes=2,
        rollout_bytes=2, kv_bytes=2, param_offload=False, optimizer_offload=False, offload_policy=False,
        no_sync_accumulation=False, gradient_checkpointing=gc, activation_offload=False, remove_padding=False,
        entropy_in_update=False, entropy_checkpointing=False, entropy_chunk=0, fused_kernels=False,
        compiled_entropy=False, lora_rank=0, lora_targets=None, use_ref=False, gpu_memory_utilization=0.5,
        free_cache_engine=True, max_num_seqs=256, max_num_batched_tokens=budget, round_sequences=rows,
        per_node=world, device=device, overhead_bytes=0)
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
            results.append({"shape": [model, gc, dynamic, world], **measure(model, gc, dynamic, rank)})
            continue
        start = time.time()
        try:
            result = {"shape": [model, gc, dynamic, world], **measure(model, gc, dynamic, rank, device)}
        except Exception as exc:  # one shape's failure is reported, the others still run
            import traceback

            traceback.print_exc()
            result = {"shape": [model, gc, dynamic, world], "error": f"{type(exc).__name__}: {exc}"[:500]}
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


def measure(model: str, gc: bool, dynamic: bool, rank: int, device: str = "cpu") -> dict:
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
    engine = FSDPEngineWithLMHead(
        HFModelConfig(path=folder, use_remove_padding=False, enable_gradient_checkpointing=gc,
                      override_config={"attn_implementation": "sdpa"}),
        # as verl's fsdp.yaml sets it (the dataclass's own default is true)
        FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", use_torch_compile=False,
                         use_no_sync_for_gradient_accumulation=False),
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
        tu.assign_non_tensor(data, use_remove_padding=False, use_dynamic_bsz=dynamic, micro_batch_size_per_gpu=micro,
                             max_token_len_per_gpu=budget, calculate_entropy=entropy, temperature=1.0)
        return data

    def loss_fn(model_output, data, dp_group=None):
        return -model_output["log_probs"].values().float().mean(), {}

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
        measured["actor update"] = tracked(lambda: engine.forward_backward_batch(batch(False), loss_fn),
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


def label_of(model: str, gc: bool, dynamic: bool, world: int) -> str:
    return f"{model} gc={'on' if gc else 'off'} {'dyn' if dynamic else 'fixed'} x{world}"


def dry_run(shapes: list, device: str) -> int:
    """The plans of the shapes, no measurement (and, for cuda, whether the measuring modules import here)."""
    print(f"{'shape':<38} {'phase':<15} " + " ".join(f"{t:>12}" for t in ("parameters", "gradients", "optimizer",
                                                                            "gathered", "activations", "total")))
    for shape in shapes:
        plan = plan_groups(*shape[:4], device=device)
        for phase in PHASES:
            print(f"{label_of(*shape[:4]):<38} {phase:<15} " + " ".join(
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
        model, gc, dyn, world = args.shape.split(",")
        shapes = [(model, gc == "1", dyn == "1", int(world))]
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
    worst_term, worst_total, rows = 0.0, 0.0, []
    failed = [r for r in results if "error" in r]
    results = [r for r in results if "error" not in r]
    print(f"{'shape':<38} {'phase':<15} {'term':<12} {'plan KiB':>10} {'torch KiB':>10} {'rel err':>8}")
    for result in results:
        model, gc, dynamic, world = result["shape"]
        plan = plan_groups(model, gc, dynamic, world, args.device)
        label = label_of(model, gc, dynamic, world)
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
                print(f"{label:<38} {phase:<15} {term:<12} {p / 1024:>10.0f} {t / 1024:>10.0f} "
                      f"{err:>7.1%}{'' if scored else ' (not scored: < 64 KiB)'}")
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
    print(f"{len(results)} shapes in {time.time() - start:.0f} s")
    print(f"RESULT max_term_rel_error={worst_term:.3f} total_rel_error={worst_total:.3f} "
          f"kv_bytes_per_token_match={kv_match} shapes={len(results)}" + gpu_line
          + (f" failed={len(failed)}" if cuda else ""))
    return 0


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
