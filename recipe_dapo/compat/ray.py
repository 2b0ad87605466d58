"""Ray internals the recipe depends on: naming an actor from its handle, and keeping Ray's driver from replacing the
pre-emption guard's SIGTERM handler (``trainers.preemption``)."""

from __future__ import annotations

import logging
import signal
from typing import Callable, Iterable

from recipe_dapo.compat import touches

logger = logging.getLogger(__name__)

RAY = ("2.60.0",)
"""The Ray releases the sites below were checked on."""


@touches("ray.actor.ActorHandle._actor_id", how="reads", checked=RAY,
         why="a dead actor is named in the error by its id; handles have no public id")
@touches("ray.actor.ActorHandle._ray_actor_creation_function_descriptor", how="reads", checked=RAY,
         why="a dead actor is named in the error by its class; handles have no public class name")
def actor_label(handle) -> str:
    """``"ClassName 0123456789ab"`` for a Ray actor handle (``repr(handle)`` when Ray does not say)."""
    try:
        name = handle._ray_actor_creation_function_descriptor.class_name.rsplit(".", 1)[-1]
        return f"{name} {handle._actor_id.hex()[:12]}"
    except Exception:
        return repr(handle)


@touches("ray.init", how="wraps", checked=RAY, params=("address",),
         why="its core worker installs a C++ SIGTERM handler (a stack dump, then abort); the guard takes SIGTERM back after")
@touches("ray._private.utils.set_sigterm_handler", how="replaces", checked=RAY, params=("sigterm_handler",),
         why="ray.init and the head node install SIGTERM handlers (sys.exit, kill every Ray process) over the guard's")
def keep_signal_handlers(signals: Iterable[int], handler: Callable) -> Callable[[], None]:
    """Until the returned function is called: Ray's driver installs no SIGTERM handler, and every ``ray.init`` ends by
    putting ``handler`` back on ``signals``. Returns the function that restores Ray's own (a no-op without Ray)."""
    try:
        import ray
        import ray._private.utils as ray_utils
    except ImportError:
        return lambda: None
    signals = tuple(signals)
    ray_setter, ray_init = ray_utils.set_sigterm_handler, ray.init

    def ignore_ray_handler(sigterm_handler):
        logger.debug("recipe_dapo: Ray's SIGTERM handler %r not installed (pre-emption guard)", sigterm_handler)

    def init_then_take_the_signals_back(*args, **kwargs):
        try:
            return ray_init(*args, **kwargs)
        finally:
            for signum in signals:
                signal.signal(signum, handler)

    ray_utils.set_sigterm_handler, ray.init = ignore_ray_handler, init_then_take_the_signals_back

    def restore() -> None:
        ray_utils.set_sigterm_handler, ray.init = ray_setter, ray_init

    return restore
