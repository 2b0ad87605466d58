"""A run's life from its first step to its outcome, written once for both trainers: :class:`RunLifecycle` (the base of
``recipe_run.RecipeRun``), driven by the events each trainer forwards from verl's loop.

The events, in the order a step meets them (the adapter forwards each where its verl loop has it):

- ``run_begins()``: the training loop begins; the driver's stop flag is opened (from now on a signal to the driver
  stops the run after a save, ``preemption``);
- ``step_begins(steps, read_flag)``: before a step. A run that stopped at the previous step's end leaves the loop
  (``Preempted``). With ``read_flag`` (a loop with nothing in flight between steps) a stop request read now saves the
  previous step and ends the run before this one;
- ``generation_begins(step)`` / ``update_begins()``: until the update a stop request gives the step up (``give_up``,
  ``generation_window``); from the update on the step finishes;
- ``step_ends(steps, around_save)``: where verl saves: a stop request saves this step (unless saved); the run stops
  after it;
- ``step_logged(steps, last_step)``: the step's metrics are logged: the outcome of a run that stops after it, or the
  summary of a run that trained every step;
- ``drive(steps, loop)``: runs the trainer's loop and owns its ends: a step given up in generation (the rollout
  aborted, the step's inputs rewound, the previous step saved, the outcome printed), a run that stopped after a step,
  and a failure (the outcome names the step and the error, which is raised again).

The trainer is seen through :class:`TrainerSteps` (its step, its save and its rewind), never through verl's names.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, ContextManager, Optional, Protocol

from omegaconf import DictConfig

from recipe_dapo.compat.verl import abort_replicas
from recipe_dapo.run.checkpoint_state import checkpoint_exists
from recipe_dapo.run.preemption import GenerationWindow, GiveUpCheck, Preempted, StepGivenUp, TrainerWatch

logger = logging.getLogger(__name__)

ABANDON_TIMEOUT_S = 10.0
"""Longest wait for the rollout replicas to abort and sleep when a step in generation is given up."""


def failed_outcome(step: int, error: BaseException) -> str:
    return f"failed at step {step} ({type(error).__name__})"


def stopped_outcome(signal_name: str, where: str) -> str:
    """``where``: ``"before step 3"`` or ``"after step 2"``."""
    return f"stopped by {signal_name} {where}"


def given_up_outcome(signal_name: str, step: int) -> str:
    """A step given up in generation: nothing of it was kept, and a rerun trains it again on the same prompts."""
    return stopped_outcome(signal_name, f"in step {step}'s generation (step {step} given up: its prompts are trained "
                                        "when the run resumes)")


class TrainerSteps(Protocol):
    """What the lifecycle needs of a trainer (``trainers.adapter.HoldsRecipeRun`` implements it on verl's names)."""

    @property
    def current_step(self) -> int:
        """The step verl's loop is at."""

    @property
    def replica_manager(self) -> Any:
        """verl's checkpoint-engine manager, which aborts and sleeps the rollout replicas (None: no replicas)."""

    def save_as(self, step: int) -> None:
        """Checkpoint the trainer's state as step ``step`` (through the trainer's own save)."""

    def rewind(self) -> None:
        """Put the inputs of the step being given up back where the step found them (its prompts return)."""


class StoppedBeforeStep(Preempted):
    """A stop request read before step ``step`` began: the previous step is saved and the run ends here."""

    def __init__(self, signal_name: str, step: int):
        super().__init__(signal_name)
        self.signal_name, self.step = signal_name, step


class RunLifecycle:
    """When the run stops, what it saves then, and the outcome it prints (module docstring); ``config`` gives the
    checkpoint folder. Holds the stop flag's reader (``preemption``), the signal that stopped the run
    (``stopped_by``) and the run's tracker (``tracker``, which prints the outcome)."""

    def __init__(self, config: DictConfig):
        self.config = config
        self.preemption = TrainerWatch(None)  # run_begins opens the real one (the driver then knows training began)
        self.stopped_by: Optional[str] = None  # the signal's name once the run stopped for pre-emption
        self.tracker: Any = None  # opened by the trainer's loop (``RecipeRun.open_tracker``)

    # ------------------------------------------------------------------ the stop flag (``preemption``)

    def watch_preemption(self) -> None:
        """Create the run's flag (the training loop begins: a driver's signal now stops the run after a save)."""
        self.preemption = TrainerWatch.open()

    def stop_requested(self) -> Optional[str]:
        """The signal's name once the driver asked the run to stop (remembered in ``stopped_by``), else None."""
        signal_name = self.preemption.requested()
        if signal_name and not self.stopped_by:
            self.stopped_by = signal_name
        return signal_name

    @property
    def give_up(self) -> GiveUpCheck:
        """The stop flag as a step in generation reads it (``preemption.GiveUpCheck``; armed by ``generation_begins``
        for a step that has trained nothing yet). Built on first use: it refers back to this run, and a run that never
        trains (a dry run's, a test's) is then freed at once with its tracker instead of waiting for the cycle
        collector."""
        check = self.__dict__.get("_give_up")
        if check is None:
            check = self.__dict__["_give_up"] = GiveUpCheck(self.stop_requested)
        return check

    def generation_window(self) -> GenerationWindow:
        """Around a blocking rollout call: a stop request interrupts it (``preemption.GenerationWindow``)."""
        return GenerationWindow(self.give_up)

    def needs_checkpoint(self, step: int) -> bool:
        """Step ``step`` is not yet the last good checkpoint (a pre-empted run saves it)."""
        return not checkpoint_exists(self.config.trainer.default_local_dir, step)

    # ------------------------------------------------------------------ the events

    def run_begins(self) -> None:
        """The training loop begins."""
        self.watch_preemption()

    def step_begins(self, steps: TrainerSteps, read_flag: bool = False) -> None:
        """Before step ``steps.current_step``: leave the loop (``Preempted``) if the run stopped at the previous step's
        end; with ``read_flag``, on a stop request read now, checkpoint the previous step (unless saved or none) and
        leave the loop before this step (``StoppedBeforeStep``)."""
        if self.stopped_by:
            raise Preempted(self.stopped_by)
        if read_flag:
            signal_name = self.stop_requested()
            if signal_name:
                self.checkpoint_previous_step(steps)
                raise StoppedBeforeStep(signal_name, steps.current_step)

    def generation_begins(self, step: int) -> None:
        """Step ``step`` generates and has changed nothing yet: a stop request gives it up."""
        self.give_up.armed_for(step)

    def update_begins(self) -> None:
        """The step updates the actor: from here on a stop request lets it finish (it is saved)."""
        self.give_up.disarm()

    def step_ends(self, steps: TrainerSteps,
                  around_save: Callable[[], ContextManager] = contextlib.nullcontext) -> bool:
        """Where verl saves a step: on a stop request, checkpoint this step (unless saved; inside ``around_save()``).
        True: the run stops after this step (validation is skipped, the step is logged)."""
        if self.stopped_by:
            return True
        if not self.stop_requested():
            return False
        if self.needs_checkpoint(steps.current_step):
            with around_save():
                steps.save_as(steps.current_step)
        return True

    def step_logged(self, steps: TrainerSteps, last_step: bool) -> None:
        """The step's metrics are logged: a run that stops after it ends with its outcome; the last step ends the run
        (every backend flushed, the console prints the summary)."""
        if self.stopped_by:
            self.finish(stopped_outcome(self.stopped_by, f"after step {steps.current_step}"))
        elif last_step:
            self.tracker.finish()

    def drive(self, steps: TrainerSteps, loop: Callable[[], Any]) -> None:
        """Run the trainer's ``loop`` and end the run as it ends: a step given up in generation
        (:meth:`give_up_step`), a stop before a step or after one (the outcome printed), a failure (the outcome printed,
        the error raised again)."""
        try:
            try:
                loop()
            except StoppedBeforeStep as stopped:
                self.finish(stopped_outcome(stopped.signal_name, f"before step {stopped.step}"))
            except Preempted:
                self.finish(stopped_outcome(self.stopped_by, f"after step {steps.current_step - 1}"))
            except StepGivenUp as given_up:
                self.give_up_step(steps, given_up)
        except Exception as error:
            if self.tracker is not None and hasattr(self.tracker, "finish"):
                self.finish(failed_outcome(steps.current_step, error))
            raise

    # ------------------------------------------------------------------ the run's ends

    def give_up_step(self, steps: TrainerSteps, given_up: StepGivenUp) -> None:
        """A stop request while step ``steps.current_step`` generated: the rollout stops, the step's inputs go back to
        where the step found them (its prompts return), that state is saved as the previous step's checkpoint (unless
        saved), and the run ends with the outcome: a rerun trains this step as if it had never begun."""
        self.abandon_rollout(steps.replica_manager)
        steps.rewind()
        self.checkpoint_previous_step(steps)
        self.finish(given_up_outcome(given_up.signal_name, steps.current_step))

    def checkpoint_previous_step(self, steps: TrainerSteps) -> None:
        """Before step ``steps.current_step`` (a run stopping there): checkpoint the step before it through the
        trainer's own save, unless it is saved or there is none."""
        step = int(steps.current_step)
        if step <= 1 or not self.needs_checkpoint(step - 1):
            return
        steps.save_as(step - 1)

    def finish(self, outcome: str) -> None:
        """End the run on its tracker with ``outcome`` (a run that did not train every step: exit code 1)."""
        self.tracker.finish(exit_code=1, outcome=outcome)

    @staticmethod
    def abandon_rollout(checkpoint_manager: Any, timeout_s: float = ABANDON_TIMEOUT_S) -> None:
        """A given-up step's rollout: every replica's requests aborted (later ones refused), then the replicas put to
        sleep (the actor's save may need their device memory), through verl's checkpoint manager. Bounded by
        ``timeout_s``: an engine that does not answer must not use up the scheduler's notice; a failure is logged."""

        def abandon() -> None:
            try:
                if hasattr(checkpoint_manager, "abort_replicas"):
                    abort_replicas(checkpoint_manager, reject_request=True)
                checkpoint_manager.sleep_replicas()
            except Exception as error:  # the save comes next whatever the engines say
                logger.warning("pre-emption: stopping the rollout replicas failed (%s: %s); saving anyway",
                               type(error).__name__, error)

        if checkpoint_manager is None:
            return
        worker = threading.Thread(target=abandon, name="recipe_dapo-abandon-rollout", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            logger.warning("pre-emption: the rollout replicas did not stop within %g s; saving anyway", timeout_s)
