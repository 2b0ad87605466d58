"""A verl platform for machines with no accelerator (torch device ``cpu``, collective backend ``gloo``).

Registered in ``verl.plugin.platform.PlatformRegistry`` under ``cpu`` when this module is imported (the
``verl.plugins`` entry point does it in every process). verl probes the registered platforms in order and
takes the first available one; ours reports itself available only when none of the others is, so a GPU or
NPU machine keeps its own platform. ``VERL_PLATFORM=cpu`` forces it; the ``platform=cpu`` config sets it in the
driver and, through Ray's runtime env, in every worker. Inside Ray workers nothing else turns it on: a GPU job's
CPU-only actors must keep verl's own platform even on a node without an accelerator.
"""

from __future__ import annotations

import contextlib
import logging
import os
from types import SimpleNamespace
from typing import Any, Optional

import torch

from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"


def _cpu_device_module() -> SimpleNamespace:
    """The subset of the ``torch.cuda`` module API that verl calls, answered for the CPU.

    verl calls ``get_torch_device().<fn>()`` for memory statistics, RNG state and synchronisation;
    ``torch.cpu`` lacks most of them, and on a CPU they have trivial answers.
    """
    zero = lambda *args, **kwargs: 0  # noqa: E731
    nothing = lambda *args, **kwargs: None  # noqa: E731
    return SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: torch.device("cpu"),
        set_device=nothing,
        synchronize=nothing,
        empty_cache=nothing,
        reset_peak_memory_stats=nothing,
        memory_allocated=zero,
        memory_reserved=zero,
        max_memory_allocated=zero,
        max_memory_reserved=zero,
        mem_get_info=lambda *args, **kwargs: (0, 0),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        get_rng_state=lambda *args, **kwargs: torch.get_rng_state(),
        set_rng_state=lambda state, *args, **kwargs: torch.set_rng_state(state),
        Stream=torch.cpu.Stream,
        stream=torch.cpu.stream,
        current_stream=torch.cpu.current_stream,
        Event=torch.cpu.Event if hasattr(torch.cpu, "Event") else None,
        amp=torch.cpu.amp,
        is_bf16_supported=lambda *args, **kwargs: True,
        get_device_name=lambda *args, **kwargs: "cpu",
        get_device_properties=lambda *args, **kwargs: SimpleNamespace(name="cpu", total_memory=0),
    )


def accelerator_present() -> bool:
    """True when any other platform registered in verl (CUDA, NPU, ROCm, ...) reports itself available."""
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


def in_ray_worker_process() -> bool:
    """True in a process Ray started (actors, tasks, job entrypoints) and in their children."""
    # Ray sets this in every worker it starts; a driver launched from a shell does not have it.
    return "RAY_RAYLET_PID" in os.environ


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform backed by the host CPU: gloo collectives, no IPC, no device profiler."""

    _device_module = _cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
            return True
        if in_ray_worker_process():
            # A CPU run pins VERL_PLATFORM=cpu in every worker (platform=cpu). Without the pin this is a GPU job's
            # CPU-only actor (task runner, agent-loop worker) on a node with no GPU or no nvidia-smi: taking this
            # platform there would start the job's vLLM servers with VLLM_TARGET_DEVICE=cpu.
            return False
        return not accelerator_present()

    def current_device(self) -> torch.device:
        # verl passes this straight to `.to(...)` / `device=`; an int would mean "accelerator 0".
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the stand-in GPUs it hands out; reading it is harmless here.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl always asks Ray for GPUs; on CPU the run starts Ray with a stand-in GPU count.
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_TARGET_DEVICE": "cpu"}

    def cudart(self) -> Any:
        return None


def pin_cpu_platform() -> None:
    """Make this process use the CPU platform, as ``platform=cpu`` does for every Ray worker it starts.

    Called by the driver when the config says ``trainer.device=cpu``: on a machine that also has a GPU, verl's
    auto-detection would otherwise pick CUDA here and rewrite ``trainer.device`` to ``cuda`` while the workers
    (pinned by the overlay's runtime env) run on CPU.
    """
    from verl.plugin.platform import set_platform

    os.environ["VERL_PLATFORM"] = PLATFORM_NAME
    if not cpu_platform_active():  # verl resolved its platform before the pin: replace it
        set_platform(PlatformCPU())
    from recipe_dapo.cpu import compat

    compat.apply()


def use_configured_device(config) -> None:
    """Settle this process's platform and ``trainer.device`` before any check or worker uses them.

    ``trainer.device=cpu`` pins the CPU platform; otherwise verl's ``auto_set_device`` keeps the detected one.
    """
    from verl.utils.device import auto_set_device

    if config.trainer.device == PLATFORM_NAME:
        pin_cpu_platform()
    auto_set_device(config)


def cpu_platform_active() -> bool:
    """True when verl's platform singleton is (or will resolve to) this CPU platform."""
    from verl.plugin.platform import get_platform

    return get_platform().device_name == "cpu"


if PlatformCPU().is_platform_available():
    from recipe_dapo.cpu import compat

    compat.apply()
