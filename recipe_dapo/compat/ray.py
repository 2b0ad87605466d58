"""Ray internals the recipe depends on: naming an actor from its handle, the members Ray adds to every actor class
(``__ray_actor_class__``, ``__ray_ready__``, ``__ray_call__``), keeping Ray's driver from replacing the
pre-emption guard's SIGTERM handler, and starting the processes of the driver's Ray node in a session of their own, so
that a scheduler's signal to the driver's process group reaches the driver only (``run.preemption``)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Callable, Iterable

from recipe_dapo.compat import touches

logger = logging.getLogger(__name__)

RAY = ("2.60.0",)
"""The Ray releases the sites below were checked on."""

_SESSIONS: list = []
"""The leaders of the sessions :func:`keep_signal_handlers` started Ray's processes in (their process group ids)."""


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


@touches("ray.actor._modify_class", how="reads", checked=RAY,
         why="it gives every actor class __ray_actor_class__, the plain class a remote class wraps: the one way to "
             "subclass a remote class of another package (verl's agent-loop worker)")
def actor_class(remote_class) -> type:
    """The plain Python class of a Ray remote class (what ``@ray.remote`` wrapped), to derive from it."""
    return remote_class.__ray_actor_class__


@touches("ray.actor._modify_class", how="calls", checked=RAY,
         why="it gives every actor __ray_ready__, a no-op method: the cheapest call that says whether an actor of "
             "another package's class (it cannot be given a method) is alive")
def when_ready(handle):
    """An object ref that resolves once the actor behind ``handle`` answers (raises if it is dead)."""
    return handle.__ray_ready__.remote()


@touches("ray.actor._modify_class", how="calls", checked=RAY,
         why="it gives every actor __ray_call__, which runs a function inside the actor's process: how the recipe asks "
             "another package's actor (verl's workers) which node it runs on")
def run_in_actor(handle, function):
    """An object ref of ``function(actor_instance)`` run inside the actor behind ``handle``."""
    return handle.__ray_call__.remote(function)


@touches("ray.init", how="wraps", checked=RAY, params=("address",),
         why="its core worker installs a C++ SIGTERM handler (a stack dump, then abort); the guard takes SIGTERM back after")
@touches("ray._private.utils.set_sigterm_handler", how="replaces", checked=RAY, params=("sigterm_handler",),
         why="ray.init and the head node install SIGTERM handlers (sys.exit, kill every Ray process) over the guard's")
@touches("ray._private.services.ConsolePopen", how="replaces", checked=RAY,
         why="the head node's processes (GCS, raylet and through it every worker) start in the driver's process group, "
             "where a scheduler's signal to the group ends them before the trainer can save")
def keep_signal_handlers(signals: Iterable[int], handler: Callable) -> Callable[[], None]:
    """Until the returned function is called: Ray's driver installs no SIGTERM handler, every ``ray.init`` ends by
    putting ``handler`` back on ``signals``, and the processes a ``ray.init`` starts (GCS, raylet, dashboard, log
    monitor; the raylet's workers and their vLLM engines inherit it) run in a session of their own: a signal to the
    driver's process group (``kill -TERM -PGID``, Ctrl-C in a terminal) reaches the driver alone, whose guard then asks
    the trainer to save. They still end with the driver: Ray starts them with ``PR_SET_PDEATHSIG`` (kernel fate
    sharing), which a session does not change. Returns the function that restores Ray's own (a no-op without Ray)."""
    try:
        import ray
        import ray._private.services as ray_services
        import ray._private.utils as ray_utils
    except ImportError:
        return lambda: None
    signals = tuple(signals)
    ray_setter, ray_init, ray_popen = ray_utils.set_sigterm_handler, ray.init, ray_services.ConsolePopen

    def ignore_ray_handler(sigterm_handler):
        logger.debug("recipe_dapo: Ray's SIGTERM handler %r not installed (pre-emption guard)", sigterm_handler)

    class PopenInASessionOfItsOwn(ray_popen):
        def __init__(self, *args, **kwargs):
            if sys.platform != "win32":
                kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)
            if kwargs.get("start_new_session"):
                _SESSIONS.append(self.pid)

    def init_then_take_the_signals_back(*args, **kwargs):
        ray_services.ConsolePopen = PopenInASessionOfItsOwn
        try:
            return ray_init(*args, **kwargs)
        finally:
            ray_services.ConsolePopen = ray_popen
            for signum in signals:
                signal.signal(signum, handler)

    ray_utils.set_sigterm_handler, ray.init = ignore_ray_handler, init_then_take_the_signals_back

    def restore() -> None:
        ray_utils.set_sigterm_handler, ray.init, ray_services.ConsolePopen = ray_setter, ray_init, ray_popen

    return restore


def end_ray_sessions() -> None:
    """SIGKILL to the process groups of the Ray processes this driver started in sessions of their own (each leader
    still this process's child): for a driver that exits without ``ray.shutdown`` (``os._exit``). The raylet and GCS
    die with the driver anyway (``PR_SET_PDEATHSIG``), but the raylet's agents would wait on the dead GCS for a minute
    before they exit, and its workers until they notice."""
    import os

    while _SESSIONS:
        leader = _SESSIONS.pop()
        try:
            with open(f"/proc/{leader}/stat") as stat:  # (pid (name) state ppid pgrp ...)
                ppid, pgrp = (int(field) for field in stat.read().rsplit(")", 1)[1].split()[1:3])
            if ppid == os.getpid() and pgrp == leader:
                os.killpg(leader, signal.SIGKILL)
        except (OSError, ValueError):  # gone already, or not a Linux /proc
            continue
