"""Whether this process runs on the recipe's CPU platform: the one place that decides.

Asked by the plugin (import the CPU platform at all?), the platform itself (``is_platform_available``), the
driver (``device.use_configured_device``), vLLM's general plugin and the standalone evaluator. The rules:

1. ``VERL_PLATFORM`` pins the answer: ``cpu`` means yes, any other platform name means no. The ``platform=cpu``
   config sets it in the driver and, through Ray's runtime env, in every worker.
2. Inside Ray workers nothing else turns the CPU platform on: a GPU job's CPU-only actors (task runner, agent-loop
   workers) on a node without an accelerator must keep verl's own platform, or the job's vLLM servers would start
   with ``VLLM_TARGET_DEVICE=cpu``.
3. Elsewhere (a shell-launched driver, tests, CLI tools) it is used when no other verl platform (CUDA, NPU, ROCm,
   ...) reports an accelerator.

On a machine with a GPU none of these imports the CPU platform module or vLLM.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"


def pinned_platform() -> str:
    """The platform ``VERL_PLATFORM`` pins ('' when unset)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower()


def in_ray_worker_process() -> bool:
    """True in a process Ray started (actors, tasks, job entrypoints) and in their children."""
    # Ray sets this in every worker it starts; a driver launched from a shell does not have it.
    return "RAY_RAYLET_PID" in os.environ


def accelerator_present() -> bool:
    """True when any other platform registered in verl (CUDA, NPU, ROCm, ...) reports itself available."""
    from verl.plugin.platform import PlatformRegistry

    for name in PlatformRegistry.registered_names():
        if name == PLATFORM_NAME:
            continue
        platform_cls = PlatformRegistry.get(name)
        try:
            if platform_cls is not None and platform_cls().is_platform_available(use_smi_check=True):
                return True
        except Exception:  # a vendor probe that cannot even run means that vendor is absent
            logger.debug("platform probe %s failed", name, exc_info=True)
    return False


def cpu_platform_wanted() -> bool:
    """The decision of the module docstring."""
    pinned = pinned_platform()
    if pinned:
        return pinned == PLATFORM_NAME
    if in_ray_worker_process():
        return False
    return not accelerator_present()


def cpu_requested_by_env() -> bool:
    """The environment says CPU (``VERL_PLATFORM=cpu``, or ``VLLM_TARGET_DEVICE=cpu`` as verl's CPU rollout and the
    evaluator set for vLLM): the cheap check for processes that must not import verl, such as vLLM's engine."""
    return pinned_platform() == PLATFORM_NAME or os.environ.get("VLLM_TARGET_DEVICE", "").lower() == PLATFORM_NAME
