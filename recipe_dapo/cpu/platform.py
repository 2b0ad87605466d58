"""A verl platform for machines with no accelerator (torch device ``cpu``, collective backend ``gloo``).

Registered in ``verl.plugin.platform.PlatformRegistry`` under ``cpu`` when this module is imported. The
``verl.plugins`` entry point imports it only where ``recipe_dapo.cpu.detect.cpu_platform_wanted()`` says so
(``platform=cpu``, or no accelerator outside Ray), and that same decision answers ``is_platform_available``:
on a GPU machine it is imported only when the config says ``platform=cpu``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from types import SimpleNamespace
from typing import Any, Optional

import torch

from verl.plugin.platform import PlatformBase, PlatformRegistry

from recipe_dapo.cpu.detect import PLATFORM_NAME, cpu_platform_wanted

logger = logging.getLogger(__name__)


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
        return cpu_platform_wanted()  # see recipe_dapo.cpu.detect

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


def cpu_platform_active() -> bool:
    """True when verl's platform singleton is (or will resolve to) this CPU platform."""
    from verl.plugin.platform import get_platform

    return get_platform().device_name == "cpu"


if cpu_platform_wanted():
    from recipe_dapo.cpu import compat

    compat.apply()
