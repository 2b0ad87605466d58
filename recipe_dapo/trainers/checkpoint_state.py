"""The recipe's own state in a verl checkpoint folder (``global_step_<k>/dapo_state.pt``), for both trainers.

Written before verl's checkpoint (to a temporary name, then renamed): verl marks the step as the latest last, so a
run killed at any moment resumes from a complete checkpoint. Read after verl restored its step.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch
from omegaconf import DictConfig

logger = logging.getLogger(__name__)

STATE_FILE = "dapo_state.pt"


def save_recipe_state(config: DictConfig, step: int, state: dict) -> str:
    """Write ``state`` into step ``step``'s checkpoint folder, atomically; returns the file's path."""
    folder = os.path.join(config.trainer.default_local_dir, f"global_step_{step}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, STATE_FILE)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def load_recipe_state(config: DictConfig, step: int) -> Optional[dict]:
    """The state saved with the checkpoint verl resumed from (step ``step``), or None (warned) when there is none."""
    if step == 0:
        return None
    folder = os.path.join(config.trainer.default_local_dir, f"global_step_{step}")
    if config.trainer.resume_mode == "resume_path":
        folder = config.trainer.resume_from_path
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        logger.warning("no dynamic-sampling state at %s: the sampler starts empty", path)
        return None
    return torch.load(path, weights_only=False)
