"""torch internals the recipe depends on: the process-group backend string verl builds on the CPU platform."""

from __future__ import annotations

import functools
from typing import Callable, Optional

from recipe_dapo.compat import touches

TORCH = ("2.13.0+cpu",)
"""The torch releases the site below was checked on."""


@touches("torch.distributed.init_process_group", how="wraps", checked=TORCH, params=("backend", "init_method"),
         why="verl builds the backend 'cpu:gloo,{device}:{backend}', which is 'cpu:gloo,cpu:gloo' on CPU and rejected")
def rewrite_process_group_backend(rewrite: Callable[[Optional[str]], Optional[str]]) -> bool:
    """Make ``torch.distributed.init_process_group`` pass its ``backend`` through ``rewrite`` first (process-wide,
    once: a second call changes nothing). True when installed now."""
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "recipe_dapo_wrapped", None) is not None:
        return False

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = rewrite(kwargs["backend"])
        elif args:
            args = (rewrite(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group.recipe_dapo_wrapped = original
    dist.init_process_group = init_process_group
    return True
