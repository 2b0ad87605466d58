"""vLLM general plugin (entry point ``vllm.general_plugins``): keep CPU linear layers on live weights.

vLLM-CPU repacks every unquantized linear weight into a kernel-specific copy after loading and, for
``nn.Linear``-style layers, replaces the original parameter with an empty one. verl updates rollout
weights in place after each training step, which then fails ("'Parameter' object has no attribute
'weight_loader'"), and even where the parameter survives (the LM head) generation would keep using the
stale packed copy. On the CPU platform this plugin makes those layers compute ``F.linear`` on their
registered weight, so a weight sync is immediately what the rollout uses. GPU platforms are untouched.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def _linear_on_live_weight(layer, remove_weight: bool = False) -> None:
    import torch.nn.functional as F

    # `remove_weight` is ignored on purpose: the weight must stay loadable for verl's weight sync.
    layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)


def register() -> None:
    from recipe_dapo.cpu.detect import cpu_requested_by_env

    if not cpu_requested_by_env():  # a GPU engine: import nothing, patch nothing
        return
    try:
        from vllm.platforms import current_platform
    except Exception:  # vLLM not importable: nothing to patch
        return
    if not current_platform.is_cpu():
        return
    from recipe_dapo.compat.vllm import replace_cpu_gemm_dispatch

    replace_cpu_gemm_dispatch(_linear_on_live_weight)
    logger.debug("recipe_dapo: vLLM-CPU linear layers compute on live weights")
