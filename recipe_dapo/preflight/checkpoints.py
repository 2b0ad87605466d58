"""Rules of the checkpoint a run would resume from: its recorded shape, damaged files, and the free space its next save
needs (:mod:`recipe_dapo.run.checkpoint_guard`). Only a checkpoint folder on this machine is checked.

Beside the rule, :func:`hold_run_folder`: the driver's lock on its checkpoint folder (``run.run_lock``), taken once
the checks passed, refused like a rule's problem when another run holds it; then it waits for the processes of an
earlier run that still write into the folder."""

from __future__ import annotations

import atexit
from typing import Iterable, Optional

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, DAPOConfigError, select


def rule_checkpoint_resume(config: DictConfig, report: CheckReport) -> Iterable[str]:
    from recipe_dapo.run.checkpoint_guard import checkpoint_problems

    yield from checkpoint_problems(config, dry_run=report.dry_run)


_held: list = []


def hold_run_folder(config: DictConfig) -> Optional[object]:
    """Take the lock of the run's ``trainer.default_local_dir`` for the rest of this process (released at exit);
    raise :class:`DAPOConfigError` (a one-line refusal) when another run holds it. Returns the
    ``run.run_lock.RunLock``, or None without a folder."""
    from recipe_dapo.run.run_lock import FolderInUse, RunLock

    folder = select(config, "trainer.default_local_dir", None)
    if not folder:
        return None
    from recipe_dapo.run.run_lock import wait_for_writers

    try:
        lock = RunLock(str(folder)).acquire()
    except FolderInUse as error:
        raise DAPOConfigError([str(error)]) from None
    _held.append(lock)
    atexit.register(lock.release)
    try:
        wait_for_writers(str(folder), say=lambda line: print(line, flush=True))
    except FolderInUse as error:
        raise DAPOConfigError([str(error)]) from None
    return lock
