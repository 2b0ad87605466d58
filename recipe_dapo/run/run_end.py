"""Every end of a run says where to resume from, printed by the driver when the trainer could not say it.

The trainer prints the end-of-run summary itself (``tracking.console.RunConsole``) whenever its loop ends: finished,
failed at a step, stopped by a signal. Two ends leave it no chance:

- its process dies: the kernel's OOM killer, ``kill -9``, a segfault, a lost node. The driver, waiting in
  ``ray.get(task_runner.run.remote(...))``, gets Ray's ``ActorDiedError``;
- the run fails before the trainer's tracker prints anything: building the workers, the datasets, loading the
  checkpoint, the first validation. The driver gets the error (``RayTaskError(<cause>)``).

For those, the driver (:class:`summary_when_the_trainer_cannot`, around verl's ``run_ppo`` in ``main_dapo``) prints
one summary: what happened, the last complete checkpoint in ``trainer.default_local_dir`` (verl's tracker file names
it) and the command line that resumes from it, then exits 1. When the trainer's process died, the exit is bounded
(:func:`exit_within`, ``EXIT_WATCHDOG_S``): the death can take the node's raylet with it (the OOM killer, a lost node),
and Ray's own shutdown at exit then waits on it for minutes (seen in a CI run: over 300 s after the summary). A refused
configuration or a missing plugin is not such an end (the refusal says what to fix, and the same command would be
refused again), nor is a signal to the driver (the pre-emption guard says where to resume from).

The driver tells the two kinds of failure apart by the error itself: the task runner's :class:`TrainerEnd` records on
the exception leaving ``run`` whether the trainer printed its summary (Ray sends the exception to the driver with its
attributes), so the summary is printed once.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import traceback
from typing import Any, Optional, Sequence

SUMMARY_PRINTED = "recipe_dapo_summary_printed"
"""The attribute :class:`TrainerEnd` sets on an exception leaving the task runner: True when the trainer printed the
end-of-run summary before it."""

ENTRY_POINT = "recipe_dapo.main_dapo"

EXIT_WATCHDOG_S = 30.0
"""After the driver's summary of a dead trainer: the longest the driver's normal exit (``atexit``: ``ray.shutdown``) may
take before it exits at once, its Ray processes ended (``compat.ray.end_ray_sessions``)."""


def exit_within(seconds: float, status: int) -> None:
    """A daemon thread that, unless the process has exited by then, flushes the console, ends the Ray processes this
    driver started and exits with ``status`` after ``seconds``: the normal exit goes first, and cannot hang."""
    import threading
    import time

    def watchdog() -> None:
        time.sleep(seconds)
        try:
            print(f"recipe_dapo: the driver's exit took over {seconds:g} s (Ray's shutdown, its node gone?): exiting "
                  "now", file=sys.stderr, flush=True)
            sys.stdout.flush()
            from recipe_dapo.compat.ray import end_ray_sessions

            end_ray_sessions()
        finally:
            os._exit(status)

    threading.Thread(target=watchdog, name="recipe_dapo-exit-watchdog", daemon=True).start()


# ------------------------------------------------------------------------------------------------ trainer side


class TrainerEnd:
    """Around a task runner's ``run``: set ``trainer`` once it is built; an exception leaving the block carries whether
    the trainer printed the end-of-run summary (its ``recipe.summary_printed``)."""

    def __init__(self):
        self.trainer: Any = None

    def __enter__(self) -> "TrainerEnd":
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if isinstance(error, Exception):
            recipe = getattr(self.trainer, "recipe", None) if self.trainer is not None else None
            printed = bool(getattr(recipe, "summary_printed", False))
            # On the error and on the remote errors it wraps: an error the trainer met as Ray's copy of another
            # worker's (a reward worker's RayTaskError) is re-wrapped by Ray on its way to the driver, which keeps only
            # the original ``cause`` (with its attributes) and drops the wrapper's.
            for candidate in _causes(error):
                try:
                    candidate.__dict__[SUMMARY_PRINTED] = printed  # not setattr: Ray's wrapper forwards to its cause
                except Exception:  # an exception that takes no attributes: the driver prints its summary as well
                    pass
        return False


def _causes(error: BaseException, depth: int = 8) -> list[BaseException]:
    """``error`` and the remote errors it wraps (Ray's ``RayTaskError.cause``, nested), outermost first."""
    chain = [error]
    while len(chain) < depth and isinstance(getattr(chain[-1], "cause", None), BaseException):
        if any(chain[-1].cause is seen for seen in chain):
            break
        chain.append(chain[-1].cause)
    return chain


def trainer_printed_summary(error: BaseException) -> bool:
    """The trainer printed its summary before ``error`` (raised in the task runner, or Ray's copy of it) left it."""
    for candidate in _causes(error):  # Ray's RayTaskError keeps the remote error in ``cause``
        if getattr(candidate, "__dict__", {}).get(SUMMARY_PRINTED) is True:
            return True
    return False


# ------------------------------------------------------------------------------------------------ driver side


def trainer_died(error: BaseException) -> bool:
    """The trainer's process is gone (its Ray actor died, or the worker running it crashed)."""
    from ray.exceptions import RayActorError, WorkerCrashedError

    return isinstance(error, (RayActorError, WorkerCrashedError))


def _ray_field(text: str, name: str) -> Optional[str]:
    match = re.search(rf"^\s*{name}: (\S+)", text, re.M)
    return match.group(1) if match else None


def death_reason(error: BaseException) -> str:
    """What killed the trainer's process, as far as Ray's error says (``failed: the trainer's process died ...``)."""
    text = str(error)
    lower = text.lower()
    pid, ip = _ray_field(text, "pid"), _ray_field(text, "ip")
    where = ", ".join(part for part in (_ray_field(text, "class_name"), pid and f"pid {pid}") if part)
    where += f" on {ip}" if ip else ""
    if getattr(error, "preempted", False):
        why = "its node was pre-empted"
    elif "its node" in lower or "node has died" in lower or "node died" in lower:
        why = "its node died (a lost or pre-empted machine)"
    elif "low on memory" in lower or "memory monitor" in lower:
        why = "Ray's memory monitor killed it (the node ran out of memory)"
    elif "ray.kill" in lower:
        why = "it was killed with ray.kill"
    else:
        why = "killed by a signal (the kernel's OOM killer, kill -9) or crashed (a segfault)"
    # Ray's own account, without the list of usual causes that follows it
    detail = re.split(r"\s+(?:Some common causes|There are some potential)", _last_line(text))[0]
    died = f"failed: the trainer's process died{f' ({where})' if where else ''}: {why}"
    return died + (f"; Ray: {_shortened(detail)}" if detail else "")


def failure_reason(error: BaseException) -> str:
    """How the run ended (``run <this>``), in one line, for an error the trainer printed no summary for."""
    if getattr(error, "actor_init_failed", False):  # the task runner's actor could not be created (or unpickled)
        return f"failed during start-up: the trainer's Ray actor could not be created ({_last_line(str(error))})"
    if trainer_died(error):
        return death_reason(error)
    cause = getattr(error, "cause", None)
    shown = cause if isinstance(cause, BaseException) else error
    message = _shortened(_last_line(str(shown)))
    return (f"failed during start-up, before the trainer printed a summary ({type(shown).__name__}"
            + (f": {message})" if message else ")"))


def _last_line(text: str) -> str:
    """The last line of an error's text that is not one of Ray's tab-indented fields (a traceback ends with the
    exception's own line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("\t")]
    return lines[-1] if lines else ""


def _shortened(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def rerun_command(argv: Sequence[str], checkpoint: Optional[str], resume_mode: str, cwd: Optional[str] = None,
                  python: Optional[str] = None) -> str:
    """The driver's command line again (``argv``: its overrides), changed only where the resume needs it:
    ``resume_path`` points at ``checkpoint``, a mode that starts over becomes ``auto``; ``auto`` is the same line."""
    overrides = list(argv)
    if checkpoint is not None and resume_mode == "resume_path":
        overrides = [o for o in overrides if _key(o) != "trainer.resume_from_path"]
        overrides.append(f"trainer.resume_from_path={checkpoint}")
    elif checkpoint is not None and resume_mode != "auto":
        overrides = [o for o in overrides if _key(o) != "trainer.resume_mode"]
        overrides.append("trainer.resume_mode=auto")
    command = shlex.join([python or sys.executable, "-m", ENTRY_POINT, *overrides])
    return f"cd {shlex.quote(cwd or os.getcwd())} && {command}"


def driver_summary_lines(reason: str, checkpoint_dir: Optional[str], resume_mode: str = "auto",
                         resume_from_path: Optional[str] = None, argv: Optional[Sequence[str]] = None) -> list[str]:
    """The driver's end-of-run summary: how the run ended, the last complete checkpoint, the command that resumes."""
    from recipe_dapo.tracking.checkpoint_folders import latest_checkpoint
    from recipe_dapo.tracking.console import resume_advice

    checkpoint = latest_checkpoint(checkpoint_dir)
    shown = checkpoint or f"none saved in {checkpoint_dir or '(no trainer.default_local_dir)'}"
    advice = resume_advice(checkpoint, resume_mode)
    if checkpoint is None and resume_mode == "resume_path" and resume_from_path:  # nothing newer than where it began
        advice = f"to resume: rerun the same command (it resumes from trainer.resume_from_path={resume_from_path} " \
                 "again)"
    command = rerun_command(sys.argv[1:] if argv is None else argv, checkpoint, resume_mode)
    return [f"run {reason}", f"  checkpoint: {shown}", f"  {advice}:", f"    {command}"]


class summary_when_the_trainer_cannot:
    """Around ``run_ppo`` in the driver: when the trainer's process died, or the run failed before the trainer printed
    its summary, print the error and the driver's summary (:func:`driver_summary_lines`) and exit 1 (module
    docstring). ``guard``: the pre-emption guard, whose signal ends the run its own way; ``refusals``: the error types
    the entry point reports as a refused launch (a list of what to fix), left to it."""

    def __init__(self, config, guard: Any = None, refusals: tuple = (), argv: Optional[Sequence[str]] = None,
                 exit_within_s: Optional[float] = None):
        """``exit_within_s``: when the trainer's process died, the exit is bounded by this many seconds
        (:func:`exit_within`; the driver passes ``EXIT_WATCHDOG_S``); None in a process that must not end (a test)."""
        self.config, self.guard, self.refusals, self.argv = config, guard, tuple(refusals), argv
        self.exit_within_s = exit_within_s

    def __enter__(self) -> "summary_when_the_trainer_cannot":
        return self

    def __exit__(self, kind, error, trace) -> bool:
        if not isinstance(error, Exception) or trainer_printed_summary(error):
            return False
        if getattr(self.guard, "signum", None) is not None or isinstance(error, self.refusals):
            return False
        from recipe_dapo.tracking.noise import recipe_line

        trainer = self.config.trainer
        checkpoint_dir = trainer.get("default_local_dir")
        lines = driver_summary_lines(
            failure_reason(error),
            os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
            resume_mode=str(trainer.get("resume_mode", "auto")),
            resume_from_path=trainer.get("resume_from_path"),
            argv=self.argv,
        )
        if not trainer_died(error):  # the error's traceback first (Ray's copy holds the worker's), then the summary
            traceback.print_exception(error, file=sys.stderr)
            sys.stderr.flush()
        print(recipe_line("\n".join(lines)), flush=True)
        if trainer_died(error) and self.exit_within_s is not None:
            exit_within(self.exit_within_s, 1)
        raise SystemExit(1) from error
