"""The trainer's ``Tracking``: verl's, with its ``file`` and ``console`` backends replaced.

- ``file``: :class:`ResumableFileLogger`, which appends (verl's truncates the metrics file
  when a killed run resumes) and sets aside only the lines the resumed process logs again;
- ``console``: :class:`recipe_dapo.tracking.console.RunConsole`, one short line per step and per validation and a
  summary in ``finish()`` (verl's prints every metric of a step on one line).

Every other backend (wandb, tensorboard, mlflow, ...) is verl's, unchanged, and gets the full metrics.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from omegaconf import DictConfig, OmegaConf

import orjson
from verl.utils.tracking import Tracking

from recipe_dapo.tracking.console import RunConsole
from recipe_dapo.tracking.run_log import metrics_file_path, set_aside_superseded

REPLACED_BACKENDS = ("file", "console")
logger = logging.getLogger(__name__)


class ResumableFileLogger:
    """A ``file`` backend for verl's ``Tracking`` (its ``log``/``finish`` interface), appending where verl's truncates:
    earlier processes' lines up to ``resumed_step`` stay (``run_log``'s docstring). Lines are verl's file format, one
    ``{"step": ..., "data": {...}}`` JSON object per line."""

    def __init__(self, project_name: str, experiment_name: str, resumed_step: int = 0):
        self.project_name = project_name
        self.experiment_name = experiment_name
        self.filepath = metrics_file_path(project_name, experiment_name)
        os.makedirs(os.path.dirname(os.path.abspath(self.filepath)), exist_ok=True)
        self.superseded_lines = set_aside_superseded(self.filepath, resumed_step)
        self.fp = open(self.filepath, "ab", buffering=0)
        logger.info("metrics file: %s (appending from step %d)", os.path.abspath(self.filepath), resumed_step)

    def log(self, data: dict, step: int) -> None:
        self.fp.write(orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def finish(self) -> None:
        self.fp.close()


class DAPOTracking(Tracking):
    """verl's ``Tracking`` with the recipe's ``file`` and ``console`` backends (module docstring)."""

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend="console",
        config: Optional[dict] = None,
        *,
        resumed_step: int = 0,
        total_steps: Optional[int] = None,
        checkpoint_dir: Optional[str] = None,
        console_stream=None,
        resume_mode: str = "auto",
    ):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        super().__init__(project_name, experiment_name, [b for b in backends if b not in REPLACED_BACKENDS], config)
        metrics_file = None
        if "file" in backends:
            self.logger["file"] = ResumableFileLogger(project_name, experiment_name, resumed_step)
            metrics_file = os.path.abspath(self.logger["file"].filepath)  # the summary names it from anywhere
        if "console" in backends:
            self.console_logger = RunConsole(
                total_steps, checkpoint_dir=checkpoint_dir, metrics_file=metrics_file, stream=console_stream,
                resume_mode=resume_mode,
            )
            self.logger["console"] = self.console_logger

    def finish(self, exit_code: int = 0, outcome: Optional[str] = None) -> None:
        """verl's finish (flush and close every backend), then the console's end-of-run summary; ``outcome`` says how
        the run ended when it did not train every step (``failed at step 3: ...``, ``stopped by SIGTERM ...``)."""
        if getattr(self, "recipe_finished", False):
            return
        self.recipe_finished = True
        super().finish(exit_code)
        console = getattr(self, "logger", {}).get("console")
        if isinstance(console, RunConsole):
            console.finish(outcome if outcome is not None or exit_code == 0 else "failed")

    @property
    def summary_printed(self) -> bool:
        """The console printed the end-of-run summary (False without the ``console`` backend)."""
        console = getattr(self, "logger", {}).get("console")
        return isinstance(console, RunConsole) and console.summary_printed


def open_tracking(config: DictConfig, resumed_step: int, total_steps: Optional[int]) -> DAPOTracking:
    """The trainer's tracker, opened after the checkpoint is loaded (``resumed_step`` is its step, 0 if none)."""
    return DAPOTracking(
        project_name=config.trainer.project_name,
        experiment_name=config.trainer.experiment_name,
        default_backend=config.trainer.logger,
        config=OmegaConf.to_container(config, resolve=True),
        resumed_step=resumed_step,
        total_steps=total_steps,
        checkpoint_dir=os.path.abspath(config.trainer.default_local_dir) if config.trainer.default_local_dir else None,
        resume_mode=str(config.trainer.get("resume_mode", "auto")),
    )
