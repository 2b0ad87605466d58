"""Where verl's checkpoints are on disk: a step's folder and the last good one, read from verl's tracker file.

Read without verl (whose finder prints ``Checkpoint tracker file does not exist`` when there is none yet) by the
console's end-of-run summary, the driver's pre-emption guard and the trainers' checkpoint state alike."""

from __future__ import annotations

import os
from typing import Optional

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl's (checkpoint_manager.get_checkpoint_tracker_filename)


def step_folder(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, f"global_step_{step}")


def latest_checkpointed_step(checkpoint_dir: Optional[str]) -> Optional[int]:
    """The step verl's tracker file names, when that folder exists; None otherwise (silently: no tracker is normal)."""
    if not checkpoint_dir:
        return None
    try:
        with open(os.path.join(checkpoint_dir, TRACKER_FILE)) as stream:
            step = int(stream.read().strip())
    except (OSError, ValueError):
        return None
    return step if os.path.isdir(step_folder(checkpoint_dir, step)) else None


def latest_checkpoint(checkpoint_dir: Optional[str]) -> Optional[str]:
    """The ``global_step_*`` folder verl resumes from (its tracker file), or None."""
    step = latest_checkpointed_step(checkpoint_dir)
    return None if step is None else step_folder(checkpoint_dir, step)
