"""Pre-emption: SIGTERM or SIGINT to the driver ends the run with a checkpoint of the last step and a resume line.

Two processes are involved. The driver (``main_dapo`` -> verl's ``run_ppo`` -> ``ray.get(task_runner.run)``) gets
the scheduler's signal; the trainer runs in the task runner, a Ray actor, possibly on another node. They meet
through a small named Ray actor, :data:`FLAG_NAME` (:class:`PreemptionFlag`), that the trainer creates when its
training loop begins:

- the driver's guard (:class:`DriverGuard`) is a thread woken by the signal through Python's wakeup fd, at once
  even while the main thread is inside ``ray.init`` or ``ray.get`` (C++ calls, where a Python handler waits for the
  call to return, and which must not be re-entered from a handler). It looks the flag up (at most
  :data:`FLAG_TIMEOUT_S`). No flag: the run is still starting (Ray, workers, vLLM, checkpoint load, first validation;
  nothing trained in this launch is lost), and the driver exits at once. A flag: the guard raises it and waits up to
  ``dapo.preemption.grace_s`` (30 s by default, a scheduler's usual notice) for the trainer. Ray failing to look the
  flag up or to raise it (an error, no answer in time) ends the driver at once with a line naming that failure;
- the trainer (:class:`TrainerWatch`) reads the flag at each step boundary (one small Ray call per step), and every
  :data:`GIVE_UP_POLL_S` while a step generates (:class:`GiveUpCheck`). Raised while the step generates (before its
  update), the step is given up (:class:`StepGivenUp`): the classic trainer's rollout call is interrupted
  (:class:`GenerationWindow`), the v1 trainer leaves its wait for groups at the next poll; the engines' requests are
  aborted, the sampler, the prompt stream and the dataloader go back to where the step found them (v1's async modes
  keep their state: verl's TransferQueue snapshot holds the prompts in flight), and that is saved as the previous
  step's checkpoint unless one exists: nothing of the step is kept and a rerun trains it on the same prompts. Raised
  later in the step (the update), the step finishes and is saved; validation is skipped. Either way the trainer prints
  the end-of-run summary with the resume line and returns;
- the driver then prints where to resume from and exits with ``128 + signal`` (143 for SIGTERM, 130 for SIGINT).

Bound: a second or so plus one checkpoint save for a step in generation; the rest of the update plus one save for a
step in its update; when the trainer has not
stopped after ``dapo.preemption.grace_s`` seconds, or on a second signal (SIGTERM or SIGINT), the driver exits at once
with the first signal's status (the last good checkpoint is named). Ray's own driver handlers (``ray.init``'s
``sys.exit(15)``, which a ``ray.init`` in progress swallows, the head node's kill-everything handler, and the core
worker's C++ dump handler, which also aborts the driver 3 s later) are kept from replacing the recipe's while the guard
is installed. A signal to the whole process group (``kill -TERM -PGID``, Ctrl-C in a terminal) reaches the driver
alone: the processes of the driver's Ray node (GCS, raylet, the workers and their vLLM engines) run in a session of
their own (``compat.ray.keep_signal_handlers``), and the trainer can save; on exit they stop with the driver (Ray's
kernel fate sharing and ``atexit``, or :func:`~recipe_dapo.compat.ray.end_ray_sessions`). A signal sent to every
process of the job (SLURM's cgroup process tracking, a container runtime's kill of all its processes) still reaches
Ray's processes: not covered.
A named actor rather than a file: the task runner may run on another node than the driver, with no shared disk.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

FLAG_NAME = "recipe_dapo.preemption_flag"
SIGNALS = (signal.SIGTERM, signal.SIGINT)
FLAG_TIMEOUT_S = 10.0
"""Longest wait for Ray to find and raise the stop flag after a signal; then the driver exits without a final save."""
STARTING = "starting"
"""The flag look-up's answer while the run starts (no flag: nothing trained in this launch)."""


class FlagError(Exception):
    """A Ray call on the stop flag failed (``where``: which one; ``error``: Ray's exception)."""

    def __init__(self, where: str, error: BaseException):
        super().__init__(where, error)
        self.where, self.error = where, error


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= 200 else text[:197] + "..."


def _noted(signum, frame) -> None:
    """The Python-level handler: nothing to do, the guard's thread was woken through the wakeup fd."""


def exit_status(signum: int) -> int:
    """The shell's status for a process ended by ``signum``."""
    return 128 + int(signum)


class PreemptionFlag:
    """The flag's state (a Ray actor with :func:`_flag_actor_class`): the signal's name once the driver raised it."""

    def __init__(self):
        self.signal_name: Optional[str] = None

    def request(self, signal_name: str) -> bool:
        self.signal_name = self.signal_name or signal_name
        return True

    def requested(self) -> Optional[str]:
        return self.signal_name


def _flag_actor_class():
    import ray

    return ray.remote(num_cpus=0, max_concurrency=4)(PreemptionFlag)


# ------------------------------------------------------------------------------------------------ trainer side


class TrainerWatch:
    """The trainer's view of the flag (created by the trainer: its existence tells the driver training began)."""

    def __init__(self, flag=None):
        self._flag = flag
        self.signal_name: Optional[str] = None
        self._warned = False

    @classmethod
    def open(cls) -> "TrainerWatch":
        """Create the run's flag actor (or find it, after a restart of the task runner); without Ray, a watch that
        never fires."""
        try:
            import ray

            if not ray.is_initialized():
                return cls(None)
            flag = _flag_actor_class().options(name=FLAG_NAME, get_if_exists=True).remote()
            return cls(flag)
        except Exception as error:  # pre-emption handling must not stop a run that could train
            logger.warning("pre-emption flag not created (%s): a SIGTERM will stop the run without a final save", error)
            return cls(None)

    def requested(self) -> Optional[str]:
        """The signal's name once the driver asked the run to stop (sticky), else None."""
        if self.signal_name is not None or self._flag is None:
            return self.signal_name
        try:
            import ray

            self.signal_name = ray.get(self._flag.requested.remote(), timeout=30)
        except Exception as error:
            if not self._warned:
                logger.warning("could not read the pre-emption flag (%s)", error)
                self._warned = True
        return self.signal_name


class Preempted(Exception):
    """Raised inside a trainer's loop to leave it after the pre-emption checkpoint (the step is logged)."""


GIVE_UP_POLL_S = 0.25
"""How often a step that is generating reads the stop flag (a step in generation is given up within about this)."""


class StepGivenUp(KeyboardInterrupt):
    """The stop flag was raised while the step generated: the step is given up (nothing it generated is kept), the
    trainer puts back the state it started from (its prompts return to the stream) and saves that as the previous
    step's checkpoint. A ``KeyboardInterrupt`` so that it passes through ``except Exception`` in verl's and Ray's
    code, and so that Ray's ``ray.get`` lets it out (Ray turns a signal handler's ``KeyboardInterrupt`` into the
    call's exception; other exceptions it does not)."""

    def __init__(self, signal_name: str, step: int):
        super().__init__(f"{signal_name} in step {step}'s generation")
        self.signal_name, self.step = signal_name, step


class GiveUpCheck:
    """Reads the stop flag at most every :data:`GIVE_UP_POLL_S` seconds while a step generates (``requested``: the
    flag's reader, :meth:`RecipeRun.stop_requested`). ``armed_for(step)`` arms it for a step that has changed nothing
    yet; ``disarm()`` once the step has (an update): then the step finishes as a step in its update does."""

    def __init__(self, requested: Callable[[], Optional[str]], poll_s: float = GIVE_UP_POLL_S,
                 clock: Callable[[], float] = time.monotonic):
        self._requested = requested
        self.poll_s = float(poll_s)
        self._clock = clock
        self._last = -float("inf")
        self.step: Optional[int] = None

    def armed_for(self, step: int) -> "GiveUpCheck":
        self.step = int(step)
        return self

    def disarm(self) -> None:
        self.step = None

    def due(self) -> Optional[str]:
        """The signal's name when the armed step must be given up (the flag read when the poll interval passed)."""
        if self.step is None:
            return None
        now = self._clock()
        if now - self._last < self.poll_s:
            return None
        self._last = now
        return self._requested()

    def __call__(self) -> None:
        """At a safe point of the step (between polls of the rollout): raise :class:`StepGivenUp` when it is due."""
        signal_name = self.due()
        if signal_name:
            raise StepGivenUp(signal_name, self.step)


class GenerationWindow:
    """A blocking rollout call (the classic trainer's ``generate_sequences``: a ``ray.get`` in the task runner's main
    thread) that a stop request interrupts: while the window is open a thread runs ``check.due()`` and, once due,
    sends SIGINT to the main thread, whose handler (the window's, while it is open) raises :class:`StepGivenUp`; Ray's
    ``ray.get`` runs pending signal handlers while it waits, so the call ends at once. A request that comes just as the
    window closes still gives the step up (raised on leaving the window), never later in the step. Outside the main
    thread (no signal handlers there) the window does nothing: the step finishes, as one in its update does."""

    def __init__(self, check: GiveUpCheck):
        self._check = check
        self._lock = threading.RLock()  # the handler runs in the main thread, which may hold it in __exit__
        self._open = False
        self._fired: Optional[str] = None
        self._done = threading.Event()
        self._previous = None
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "GenerationWindow":
        if self._check.step is None or threading.current_thread() is not threading.main_thread():
            return self
        self._previous = signal.signal(signal.SIGINT, self._handler)
        self._open, self._fired = True, None
        self._done.clear()
        self._thread = threading.Thread(target=self._watch, name="recipe_dapo-give-up", daemon=True)
        try:
            self._thread.start()
        except BaseException:  # the interrupt came before the body began: the window closes all the same
            self.__exit__(None, None, None)
            raise
        return self

    def _watch(self) -> None:
        while not self._done.wait(min(self._check.poll_s, 0.2)):
            signal_name = self._check.due()
            if not signal_name:
                continue
            with self._lock:
                if self._open:
                    self._fired = signal_name
                    # A real signal to the main thread: it breaks a blocking system call (EINTR), where
                    # ``_thread.interrupt_main`` would wait for the call to return on its own.
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            return

    def _handler(self, signum, frame) -> None:
        with self._lock:
            fired, still_open = self._fired, self._open
        if fired and still_open:
            raise StepGivenUp(fired, self._check.step)
        if not fired:  # a real SIGINT to this process: what would have happened without the window
            previous = self._previous
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt

    def __exit__(self, kind, error, traceback) -> bool:
        if self._thread is None:
            return False
        try:  # the interrupt may land anywhere in here, even before the window is marked closed
            with self._lock:
                self._open = False
            self._done.set()
            self._thread.join()
            _let_pending_signals_run()  # an interrupt already on its way meets the closed window here, not later
        finally:
            self._open = False
            self._done.set()
            self._thread = None
            signal.signal(signal.SIGINT, self._previous)
        if self._fired and kind is None:
            raise StepGivenUp(self._fired, self._check.step)
        return False


def _let_pending_signals_run() -> None:
    """A Python-level call: the interpreter runs pending signal handlers before it (in the main thread)."""
    signal.getsignal(signal.SIGINT)


# ------------------------------------------------------------------------------------------------ driver side


def _say(line: str) -> None:
    """One line of the recipe on the driver's console (and in the run's log file, through the console router of
    ``tracking.noise``), flushed: the guard's thread may end the process right after."""
    from recipe_dapo.tracking.noise import recipe_line

    try:
        sys.stderr.write(recipe_line(line) + "\n")
        sys.stderr.flush()
    except Exception:  # a closed or broken stream: the line must still reach the terminal
        os.write(2, (line + "\n").encode("utf-8", "replace"))


class DriverGuard:
    """SIGTERM / SIGINT handling in the driver (module docstring). ``install()`` before ``ray.init``;
    ``finish()`` after the trainer returned."""

    def __init__(
        self,
        grace_s: float,
        checkpoint_dir: Optional[str],
        resume_hint: Callable[[Optional[str]], str],
        exit_now: Callable[[int], None] = os._exit,
    ):
        self.grace_s = float(grace_s)
        self.checkpoint_dir = checkpoint_dir
        self.resume_hint = resume_hint
        self.signum: Optional[int] = None
        self._exit_now = exit_now
        self._trainer_returned = threading.Event()
        self._previous: dict = {}
        self._previous_wakeup_fd = -1
        self._pipe: Optional[tuple[int, int]] = None
        self._restore_ray: Optional[Callable[[], None]] = None

    # -------------------------------------------------------------- install / uninstall

    def install(self) -> "DriverGuard":
        """Signals wake the guard's thread through Python's wakeup fd, written by the C-level handler the moment the
        signal arrives: the main thread may be inside ``ray.init`` or ``ray.get`` (C++), where a Python handler would
        run only once the call returns. The Python handlers themselves do nothing but keep the default action away."""
        self._pipe = os.pipe()
        os.set_blocking(self._pipe[1], False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, _noted)
        self._keep_ray_from_replacing_the_handler()
        threading.Thread(target=self._watch, name="recipe_dapo-preemption", daemon=True).start()
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
        if self._restore_ray is not None:
            self._restore_ray()
            self._restore_ray = None

    def _keep_ray_from_replacing_the_handler(self) -> None:
        """``ray.init`` installs ``sys.exit(15)`` (swallowed while ray.init runs) and the head node a handler that kills
        every Ray process: while the guard is on, their installs are ignored (the guard ends the run itself). Its core
        worker then puts a C++ handler on SIGTERM that prints a stack dump ("*** SIGTERM received at time=...") before
        passing the signal on: after ``ray.init`` the guard takes SIGTERM back (crash signals keep Ray's handler)."""
        from recipe_dapo.compat.ray import keep_signal_handlers

        self._restore_ray = keep_signal_handlers(SIGNALS, _noted)

    # -------------------------------------------------------------- the signal

    def _watch(self) -> None:
        """The guard's thread: the first signal stops a starting run at once, or raises the trainer's flag and waits
        up to ``grace_s`` for it to return; a second signal, or the grace running out, exits at once."""
        deadline = None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._pipe[0]], [], [], timeout)
            if self._trainer_returned.is_set():
                return
            if not ready:
                name = signal.Signals(self.signum).name
                self._leave(f"{name}: the trainer did not stop within dapo.preemption.grace_s={self.grace_s:g} s")
                return
            for signum in os.read(self._pipe[0], 64):
                if signum not in SIGNALS:
                    continue
                name = signal.Signals(signum).name
                if self.signum is not None:
                    self._leave(f"second {name}: exiting now without waiting for the trainer")
                    return
                self.signum = signum
                _say(f"recipe_dapo: {name} received: stopping the run (a second {name} exits at once)")
                from recipe_dapo.tracking.noise import quiet_workers

                quiet_workers()  # the aborted rollouts' errors go to the log file
                if not self._raise_the_flag(name):
                    return
                deadline = time.monotonic() + self.grace_s

    def _raise_the_flag(self, name: str) -> bool:
        """Ask the trainer to stop after its step; False when the run ended here (starting, or the flag out of reach).
        The look-up and the request together take at most ``FLAG_TIMEOUT_S`` (a Ray that does not answer must not hold
        the guard: the grace and a second signal wait on it)."""
        outcome: list = []

        def look_up_and_raise() -> None:
            try:
                outcome.append(self._request_stop(name))
            except BaseException as error:  # reported below, whatever it is
                outcome.append(error)

        helper = threading.Thread(target=look_up_and_raise, name="recipe_dapo-preemption-flag", daemon=True)
        helper.start()
        deadline = time.monotonic() + FLAG_TIMEOUT_S
        while helper.is_alive() and time.monotonic() < deadline:  # a second signal meanwhile exits at once
            ready, _, _ = select.select([self._pipe[0]], [], [], min(0.05, max(0.0, deadline - time.monotonic())))
            if ready and any(signum in SIGNALS for signum in os.read(self._pipe[0], 64)):
                self._leave("second signal while the stop flag was looked up: exiting now")
                return False
        if not outcome:
            self._leave(f"{name}: Ray did not answer the look-up of the stop flag ({FLAG_NAME}) within "
                        f"{FLAG_TIMEOUT_S:g} s: stopped without a final save")
            return False
        result = outcome[0]
        if result is STARTING:
            self._leave(f"{name} during start-up (no training step in this launch): stopped")
            return False
        if isinstance(result, BaseException):
            where, error = (result.where, result.error) if isinstance(result, FlagError) else ("the stop flag", result)
            self._leave(f"{name}: {where} failed ({type(error).__name__}: {_first_line(error)}): stopped without a "
                        "final save")
            return False
        _say("recipe_dapo: the trainer gives up a step in generation (finishes one in its update) and saves (up to "
             f"dapo.preemption.grace_s={self.grace_s:g} s)")
        return True

    @staticmethod
    def _request_stop(name: str):
        """Find the run's flag and raise it: True, or :data:`STARTING` when there is no flag yet (Ray not started, or
        no trainer created one: ``ray.get_actor``'s ``ValueError``), or a :class:`FlagError` naming the call that
        failed."""
        import ray

        if not ray.is_initialized():
            return STARTING
        try:
            flag = ray.get_actor(FLAG_NAME)
        except ValueError:  # Ray's answer for a name no actor holds
            return STARTING
        except Exception as error:
            return FlagError("looking up the stop flag", error)
        try:
            ray.get(flag.request.remote(name), timeout=FLAG_TIMEOUT_S)
        except Exception as error:
            return FlagError("raising the stop flag", error)
        return True

    def resume_line(self) -> str:
        from recipe_dapo.tracking.checkpoint_folders import latest_checkpoint

        return self.resume_hint(latest_checkpoint(self.checkpoint_dir))

    def _leave(self, reason: str) -> None:
        """Exit now (from the handler or the helper thread): Ray's processes stop with the driver."""
        _say(f"recipe_dapo: {reason}; {self.resume_line()}")
        if self._exit_now is os._exit:  # no atexit ray.shutdown: the Ray node's processes go now
            from recipe_dapo.compat.ray import end_ray_sessions

            end_ray_sessions()
        self._exit_now(exit_status(self.signum or signal.SIGTERM))

    # -------------------------------------------------------------- after the trainer returned

    def finish(self) -> None:
        """Call when ``run_ppo`` returned or raised: after a signal, print the resume line and exit ``128 + signal``."""
        self._trainer_returned.set()
        if self._pipe is not None:
            os.write(self._pipe[1], b"\0")  # wakes the guard's thread, which sees the trainer returned
        self.uninstall()
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            _say(f"recipe_dapo: stopped by {name}; {self.resume_line()}")
            raise SystemExit(exit_status(self.signum))


def resume_hint(config) -> Callable[[Optional[str]], str]:
    """The 'where to resume from' sentence for a checkpoint folder (None: none saved), from ``trainer.resume_mode``."""
    from recipe_dapo.tracking.console import resume_advice

    mode = str(config.trainer.get("resume_mode", "auto"))
    return lambda checkpoint: f"last checkpoint: {checkpoint or 'none'}; " + resume_advice(checkpoint, mode)


def guard_driver(config) -> DriverGuard:
    """Install the driver's guard for this run (``main_dapo``)."""
    from omegaconf import OmegaConf

    from recipe_dapo.config.settings import PreemptionSettings

    checkpoint_dir = config.trainer.get("default_local_dir")
    return DriverGuard(
        grace_s=float(OmegaConf.select(config, "dapo.preemption.grace_s", default=PreemptionSettings.grace_s)),
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        resume_hint=resume_hint(config),
    ).install()
