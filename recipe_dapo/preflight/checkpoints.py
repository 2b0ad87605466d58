"""Rules of the checkpoint a run would resume from: its recorded shape, damaged files, and the free space its next save
needs (:mod:`recipe_dapo.trainers.checkpoint_guard`). Only a checkpoint folder on this machine is checked."""

from __future__ import annotations

from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport


def rule_checkpoint_resume(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.trainers.checkpoint_guard import checkpoint_problems

    yield from checkpoint_problems(config, dry_run=report.dry_run)
