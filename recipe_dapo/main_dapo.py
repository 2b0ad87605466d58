"""Entry point: ``python -m recipe_dapo.main_dapo [hydra overrides]``.

Hydra composes ``config/dapo_trainer.yaml`` (verl's ``ppo_trainer`` + DAPO defaults + the ``size=``, ``ablation=``,
``sampling=`` and ``platform=`` groups); the recipe checks the configuration (``preflight``: the same rules as
``DRY_RUN=1``) before Ray, vLLM or a worker starts, and refuses a bad one with every problem listed and exit
status 1; then verl's ``run_ppo`` starts Ray and runs
:class:`recipe_dapo.trainers.classic.task_runner.DAPOTaskRunner`, which trains with :class:`recipe_dapo.trainers.classic.trainer.RayDAPOTrainer`, or with
``trainer.use_v1=true`` :class:`recipe_dapo.trainers.v1.task_runner.DAPOTaskRunnerV1` and the trainer ``recipe_dapo.trainers.v1.trainer``
registers for ``trainer.v1.trainer_mode`` (sync or colocate_async) on verl's v1 trainer. The start-up log says which, and why.
"""

from __future__ import annotations

if __name__ == "__main__":
    # First, before verl is imported: importing it already prints (every line to the log file, the recipe's
    # lines, warnings and errors to the console: tracking/noise.py).
    from recipe_dapo.tracking.noise import install_console_filter

    install_console_filter()

import logging  # noqa: E402
import sys  # noqa: E402
from typing import Sequence  # noqa: E402

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import recipe_dapo.config  # noqa: E402,F401  (registers what Hydra needs to compose the config)
from recipe_dapo.cpu.memory import apply_cpu_kv_cache  # noqa: E402
from recipe_dapo.preflight import DAPOConfigError, check_config  # noqa: E402
from recipe_dapo.tracking.noise import attach_log_file, recipe_line  # noqa: E402
from recipe_dapo.preflight.checkpoints import hold_run_folder  # noqa: E402
from recipe_dapo.run.checkpoint_guard import nothing_left_to_train  # noqa: E402
from recipe_dapo.trainers.table import load, trainer_for  # noqa: E402
from recipe_dapo.policy_lag import correction_line  # noqa: E402

logger = logging.getLogger(__name__)


def run(config: DictConfig) -> None:
    """Check the configuration, then train (verl's run_ppo starts Ray and the task runner)."""
    attach_log_file(config)  # every line of the run to <experiment>.log (when the console router is installed)
    apply_cpu_kv_cache(config)  # platform=cpu: vLLM's KV cache sized in GiB from the run's shapes
    report = check_config(config, where="the driver")
    print(recipe_line("\n".join(report.summary_lines())), flush=True)
    trainer = trainer_for(config)
    print(recipe_line(trainer.log_line()), flush=True)
    print(recipe_line(correction_line(config)), flush=True)  # which behaviour-policy correction runs, and why
    finished = nothing_left_to_train(config)  # a rerun of a finished run: say so instead of starting a cluster
    if finished:
        print(recipe_line(finished), flush=True)
        return
    hold_run_folder(config)  # one run per checkpoint folder: a second launch is refused naming the first's PID and host
    from verl.trainer.main_ppo import run_ppo

    from recipe_dapo.plugin import PluginNotLoadedError
    from recipe_dapo.run.nodes import CheckedOnEveryNode
    from recipe_dapo.run.run_end import EXIT_WATCHDOG_S, summary_when_the_trainer_cannot

    # Every Ray node is asked whether `import verl` registers the recipe there, before the task runner starts.
    runner = CheckedOnEveryNode(load(trainer.task_runner), enabled=config.dapo.preflight.check_worker_plugins)
    # The trainer's process dies, or the run fails before the trainer printed its summary: the driver prints one
    # (a refusal is listed by refusals_exit_cleanly instead).
    refusals = (DAPOConfigError, PluginNotLoadedError)
    with preemption_guard(config) as guard, summary_when_the_trainer_cannot(config, guard, refusals,
                                                                            exit_within_s=EXIT_WATCHDOG_S):
        run_ppo(config, task_runner_class=runner)


class preemption_guard:
    """SIGTERM / SIGINT from here on: during start-up the launch stops at once; during training the trainer saves its
    step and the driver exits with 128 + signal after printing where to resume from (``run.preemption``)."""

    def __init__(self, config: DictConfig):
        self.config = config

    def __enter__(self):
        self.guard = None
        if self.config.dapo.preemption.enable:
            from recipe_dapo.run.preemption import guard_driver

            self.guard = guard_driver(self.config)
        return self.guard

    def __exit__(self, kind, error, traceback):
        if self.guard is not None:
            self.guard.finish()  # after a signal: raises SystemExit(128 + signal), whatever ended the run
        return False


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def _hydra_main(config: DictConfig) -> None:
    release_stderr()
    with refusals_exit_cleanly():
        run(config)


class refusals_exit_cleanly:
    """Print a refused configuration (or missing plugins) as a list, without a traceback, and exit with status 1."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None:
            return False
        if not isinstance(error, DAPOConfigError):  # a tier-1 refusal must not wait for verl's import
            from recipe_dapo.plugin import PluginNotLoadedError  # here: importing the plugin may import verl

            if not isinstance(error, PluginNotLoadedError):
                from recipe_dapo.run.checkpoint_state import CheckpointWriteError

                if isinstance(error, CheckpointWriteError):  # raised in the task runner: Ray's copy has its traceback
                    print(f"\nrecipe_dapo: {getattr(error, 'cause', error)}\n", file=sys.stderr, flush=True)
                    raise SystemExit(1)
                return False
        print(f"\n{error}\n", file=sys.stderr, flush=True)
        raise SystemExit(1)


class _HeldStderr:
    """``sys.stderr`` while Hydra composes the config: what it writes is held until the job starts
    (:func:`release_stderr`), so that a refused override's 'did you mean' can come before Hydra's own advice."""

    def __init__(self, stream):
        self.stream = stream
        self.held: list[str] = []

    def write(self, text: str) -> int:
        self.held.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the real stream's
        return getattr(self.stream, name)


def release_stderr(first: Sequence[str] = ()) -> None:
    """The job starts (or Hydra stopped): ``sys.stderr`` is the real stream again; the lines ``first``, then what
    Hydra wrote while composing, are written to it. A no-op when nothing is held."""
    held = sys.stderr
    if not isinstance(held, _HeldStderr):
        return
    sys.stderr = held.stream
    for line in first:
        held.stream.write(line + "\n")
    held.stream.write("".join(held.held))
    held.stream.flush()


def main(hydra_main=_hydra_main) -> None:
    """Run ``hydra_main``; when Hydra cannot compose the overrides, a 'did you mean' for mistyped keys comes first,
    before Hydra's own message (its advice to add a '+' fits a new key, not a misspelt one)."""
    sys.stderr = _HeldStderr(sys.stderr)
    try:
        hydra_main()
    except SystemExit as exit:
        from hydra.errors import HydraException

        suggestions = []
        if exit.code not in (0, None) and isinstance(exit.__context__, HydraException):
            from recipe_dapo.config.suggest import suggest_for_overrides

            suggestions = suggest_for_overrides(sys.argv[1:])
        release_stderr(suggestions)
        raise
    finally:
        release_stderr()


if __name__ == "__main__":
    main()
