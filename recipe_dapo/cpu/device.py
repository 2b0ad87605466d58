"""The driver's device decision, settled before any start-up check or worker uses it (``trainer.device``)."""

from __future__ import annotations

from recipe_dapo.cpu.detect import PLATFORM_NAME


def use_configured_device(config) -> None:
    """Settle this process's platform and ``trainer.device`` before any check or worker uses them.

    ``trainer.device=cpu`` pins the CPU platform (importing it only then); otherwise verl's ``auto_set_device``
    keeps the detected one.
    """
    from verl.utils.device import auto_set_device

    if config.trainer.device == PLATFORM_NAME:
        from recipe_dapo.cpu.platform import pin_cpu_platform  # imported (and registered) only for a CPU run

        pin_cpu_platform()
    auto_set_device(config)
