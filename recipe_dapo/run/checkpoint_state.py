"""Checkpoints of both trainers: the recipe's own state in a verl checkpoint folder
(``global_step_<k>/dapo_state.pt``), the last good checkpoint, and a save that fails cleanly.

With it goes the shape the run was made with (``dapo_shape.json``: ``rollout.n``, the batch sizes), which a resume
must keep; what a rerun checks at start-up about the checkpoint it resumes from (its shape, damaged files, free
space) is :mod:`recipe_dapo.run.checkpoint_guard`.

The recipe's state is written before verl's checkpoint (to a temporary name, then renamed): verl marks the step as the
latest last (``latest_checkpointed_iteration.txt``), so a run killed at any moment resumes from a complete checkpoint.
Read after verl restored its step.

:func:`guarded_save` wraps a whole save (the recipe's state and verl's): when it fails (a full disk surfaces from
torch's writer as ``basic_ios::clear: iostream error`` or ``enforce fail at inline_container.cc``, not as "no space
left"), the half-written ``global_step_<k>/`` is removed (verl's tracker file still names the last good checkpoint, so
a rerun resumes from that) and :class:`CheckpointWriteError` says in one line the folder, the error, the space the
checkpoint needs, the space free and the last good checkpoint. Pure Python and torch: no Ray, no verl.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from typing import Callable, Optional

import torch
from omegaconf import DictConfig

from recipe_dapo.tracking.checkpoint_folders import (  # noqa: F401  (re-exported: the trainers' checkpoint names)
    TRACKER_FILE, latest_checkpoint, latest_checkpointed_step, step_folder)
from recipe_dapo.run.checkpoint_guard import folder_bytes, free_bytes as _free_bytes, write_shape
from recipe_dapo.run.checkpoint_guard import _size as _gib

logger = logging.getLogger(__name__)

STATE_FILE = "dapo_state.pt"

# What torch's C++ writer and verl's savers say when a write fails for lack of space (they drop the errno).
_DISK_FULL_WORDS = ("no space left", "iostream error", "inline_container.cc", "file write failed", "disk quota")


def save_recipe_state(config: DictConfig, step: int, state: dict) -> str:
    """Write ``state`` into step ``step``'s checkpoint folder, atomically; returns the file's path."""
    folder = step_folder(config.trainer.default_local_dir, step)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, STATE_FILE)
    try:
        with open(path + ".tmp", "wb") as stream:
            torch.save(state, stream)
    except BaseException:
        _remove_quietly(path + ".tmp")
        raise
    os.replace(path + ".tmp", path)
    write_shape(folder, config)
    return path


def load_recipe_state(config: DictConfig, step: int) -> Optional[dict]:
    """The state saved with the checkpoint verl resumed from (step ``step``), or None (warned) when there is none."""
    if step == 0:
        return None
    folder = step_folder(config.trainer.default_local_dir, step)
    if config.trainer.resume_mode == "resume_path":
        folder = config.trainer.resume_from_path
    path = os.path.join(folder, STATE_FILE)
    if not os.path.exists(path):
        logger.warning("no dynamic-sampling state at %s: the sampler starts empty", path)
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception as error:  # a truncated or corrupt file: name it, not an 80-line traceback from torch
        raise RuntimeError(
            f"{path} cannot be loaded ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
            "resume from an earlier checkpoint (trainer.resume_mode=resume_path trainer.resume_from_path=...) or set "
            "dapo.resume.fallback_to_previous=true"
        ) from None



def resume_line(step: int, pooled_groups: int, stream: str) -> str:
    """The console line of a resumed run: the step and what the sampler restored."""
    plural = "" if pooled_groups == 1 else "s"
    return f"resumed at step {step}: {pooled_groups} group{plural} pooled by the dynamic sampler, {stream}"


# ---------------------------------------------------------------------------------------------- the last good one


def checkpoint_exists(checkpoint_dir: Optional[str], step: int) -> bool:
    """Step ``step`` is the last good checkpoint (nothing to save again for it)."""
    return latest_checkpointed_step(checkpoint_dir) == step


# ---------------------------------------------------------------------------------------------- a save that fails cleanly


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the message is one line (module docstring)."""


def _model_bytes_estimate(model_path: Optional[str]) -> Optional[int]:
    """A checkpoint's size from the model's weight files: fp32 weights + Adam's two fp32 moments (3 x 4 bytes per
    parameter), the parameter count from the files' size and ``config.json``'s ``torch_dtype``."""
    if not model_path or not os.path.isdir(model_path):
        return None
    weights = sum(
        os.path.getsize(os.path.join(model_path, name))
        for name in os.listdir(model_path)
        if name.endswith((".safetensors", ".bin", ".pt")) and not name.startswith("training_args")
    )
    if not weights:
        return None
    dtype_bytes = 4
    try:
        with open(os.path.join(model_path, "config.json")) as stream:
            dtype = str(json.load(stream).get("torch_dtype") or "float32")
        dtype_bytes = 2 if dtype in ("bfloat16", "float16") else 4
    except (OSError, ValueError):
        pass
    return weights // dtype_bytes * 12


def checkpoint_bytes_estimate(checkpoint_dir: str, model_path: Optional[str] = None) -> Optional[int]:
    """The space one checkpoint needs: the last good checkpoint's size, else from the model's parameter bytes."""
    latest = latest_checkpoint(checkpoint_dir)
    if latest is not None:
        size = folder_bytes(latest)
        if size:
            return size
    return _model_bytes_estimate(model_path)


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC / EDQUOT anywhere in the exception's chain, or the words torch's writers use for a failed write."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(word in str(error).lower() for word in _DISK_FULL_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False


def _first_line(error: BaseException) -> str:
    """The error's own first meaningful line (a Ray task error repeats a traceback; keep its last line)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[-1] if len(lines) > 1 and lines[0].startswith(("ray::", "Traceback")) else lines[0]
    return line if len(line) <= 300 else line[:297] + "..."


def save_failure_message(checkpoint_dir: str, step: int, error: BaseException, needed: Optional[int]) -> str:
    folder = step_folder(checkpoint_dir, step)
    last = latest_checkpoint(checkpoint_dir)
    cause = "disk full" if is_disk_full(error) else "write failed"
    free = _free_bytes(folder)
    return (
        f"checkpoint {folder} not written ({cause}: {_first_line(error)}); it needs about {_gib(needed)}, "
        f"{_gib(free)} free there; the half-written folder was removed; last good checkpoint: "
        f"{last or 'none'} (free space under trainer.default_local_dir, or point it to a larger disk, then rerun "
        f"the same command to resume from it)"
    )


def guarded_save(checkpoint_dir: str, step: int, save: Callable[[], None], model_path: Optional[str] = None) -> None:
    """Run ``save`` (the whole checkpoint of step ``step``); if it fails, remove the half-written step folder (unless
    it is the last good checkpoint) and raise :class:`CheckpointWriteError` with the one-line account."""
    needed = checkpoint_bytes_estimate(checkpoint_dir, model_path)
    try:
        save()
    except Exception as error:
        folder = step_folder(checkpoint_dir, step)
        if latest_checkpointed_step(checkpoint_dir) != step:
            shutil.rmtree(folder, ignore_errors=True)
        message = save_failure_message(checkpoint_dir, step, error, needed)
        logger.error("%s", message)
        raise CheckpointWriteError(message) from error


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
