"""What a rerun checks about the checkpoint it would resume from, before any worker starts.

- **The run's shape.** Every checkpoint records the shape it was made with (:data:`SHAPE_KEYS`: ``rollout.n``, the
  training batch, the mini-batch) in ``global_step_<k>/dapo_shape.json`` (written by
  ``checkpoint_state.save_recipe_state``). A resume that changes one is refused in one line naming the key: the pooled
  groups of the dynamic sampler hold ``n`` responses each and the optimizer's schedule counts steps of that batch.
- **A damaged checkpoint.** Every ``.pt`` file of the folder must be a whole torch file (torch writes a zip archive
  whose index is at its end, so a truncated file has none), every record of it must match the CRC-32 its index holds
  (garbage written inside a tensor leaves the index intact and would load as wrong numbers), and the policy's weights
  and optimizer state (verl's ``model_*.pt``, ``optim_*.pt``) must hold no NaN or inf (:mod:`.checkpoint_records`:
  one read of the files, on parallel threads; ``dapo.resume.verify_records=false`` reads the indexes only). And
  ``dapo_state.pt`` must be there. A damaged one is named, file, record and folder, with the previous complete
  checkpoint and how to resume from it; with ``dapo.resume.fallback_to_previous=true`` the run takes it: the damaged
  folder is moved aside (``global_step_<k>.damaged``) and verl's tracker file names the previous step.
- **Free space.** Saving a checkpoint needs about the size of the last one; a disk with less free space is refused
  at start-up instead of after a whole step of training.

Which checkpoint: ``trainer.resume_mode=auto`` the latest (verl's tracker file in ``trainer.default_local_dir``),
``resume_path`` ``trainer.resume_from_path``, ``disable`` none. A folder absent from this machine (a dry run on a
laptop) is not checked. No torch, no verl (the standard library and numpy).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import zipfile
from typing import Any, Iterable, Optional

from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger(__name__)

SHAPE_FILE = "dapo_shape.json"
STATE_FILE = "dapo_state.pt"  # checkpoint_state.STATE_FILE (that module imports torch)
TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl's
SHAPE_KEYS = ("actor_rollout_ref.rollout.n", "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size")
"""What a checkpoint's state is shaped by: the responses per group (the pooled groups' size), the groups per step and
per mini-batch."""
FALLBACK_KEY = "dapo.resume.fallback_to_previous"
VERIFY_KEY = "dapo.resume.verify_records"
FINITE_CHECKED = ("model_", "optim_")
"""Files whose floating-point storages must be finite: verl's FSDP shards of the policy's weights and optimizer state
(what a resume loads into the model); the recipe's state and verl's extra state are checked by their CRCs only."""
_STEP = re.compile(r"^global_step_(\d+)$")


def _select(config: Any, key: str, default: Any = None) -> Any:
    return OmegaConf.select(config, key, default=default) if isinstance(config, DictConfig) else default


def run_shape(config: Any) -> dict:
    """The values of :data:`SHAPE_KEYS` in ``config``."""
    return {key: _select(config, key) for key in SHAPE_KEYS}


def write_shape(folder: str, config: Any) -> str:
    """Record the run's shape in a checkpoint folder (atomically); returns the file's path."""
    path = os.path.join(folder, SHAPE_FILE)
    with open(path + ".tmp", "w") as stream:
        json.dump(run_shape(config), stream)
    os.replace(path + ".tmp", path)
    return path


def read_shape(folder: str) -> Optional[dict]:
    """The shape a checkpoint recorded, or None (a checkpoint older than the record, or an unreadable one)."""
    try:
        with open(os.path.join(folder, SHAPE_FILE)) as stream:
            shape = json.load(stream)
    except (OSError, ValueError):
        return None
    return shape if isinstance(shape, dict) else None


def shape_changes(config: Any, folder: str) -> list[str]:
    """One line per key whose value differs from the checkpoint's record."""
    recorded = read_shape(folder)
    if recorded is None:
        return []
    now = run_shape(config)
    return [
        f"{key}={now[key]} but the checkpoint to resume from ({folder}) was made with {key}={recorded[key]}: resume "
        f"with {key}={recorded[key]}, or start afresh (trainer.resume_mode=disable, or another trainer.default_local_dir: "
        "WORK_DIR=another/folder for scripts/run_dapo_cpu.sh)"
        for key in SHAPE_KEYS
        if key in recorded and recorded[key] != now[key]
    ]


# ---------------------------------------------------------------------------------------------- damaged checkpoints


def step_of(folder: str) -> Optional[int]:
    match = _STEP.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def damaged_files(folder: str, verify_records: bool = True) -> list[tuple[str, str]]:
    """``(file relative to folder, why)`` for every file that makes the checkpoint unusable: a missing
    ``dapo_state.pt``, an empty ``.pt`` file, a torch file (a zip archive) without its index (truncated), and with
    ``verify_records`` one with a record that fails its CRC-32, or non-finite values in the policy's weights or
    optimizer state (:data:`FINITE_CHECKED`)."""
    from recipe_dapo.run.checkpoint_records import verify_files

    problems, whole = [], []
    if not os.path.isfile(os.path.join(folder, STATE_FILE)):
        problems.append((STATE_FILE, "is missing"))
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if not name.endswith(".pt"):
                continue
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            try:
                with open(path, "rb") as stream:
                    magic = stream.read(2)
                if not magic:
                    problems.append((relative, "is empty"))
                elif magic == b"PK":  # torch's zip format; the legacy pickle format has no index to check
                    with zipfile.ZipFile(path) as archive:
                        archive.infolist()
                    whole.append((path, name.startswith(FINITE_CHECKED)))
            except (OSError, zipfile.BadZipFile, EOFError, ValueError) as error:
                problems.append((relative, f"is truncated or corrupt ({type(error).__name__}: {error})"))
    if verify_records and whole:
        started = time.monotonic()
        found = verify_files(whole)
        problems.extend((os.path.relpath(path, folder), found[path]) for path, _ in whole if path in found)
        logger.info("checkpoint %s: %d torch files, %s, read back against their CRCs in %.1f s", folder, len(whole),
                    _size(sum(os.path.getsize(path) for path, _ in whole)), time.monotonic() - started)
    return problems


def checkpoint_folders(checkpoint_dir: str) -> list[tuple[int, str]]:
    """``(step, folder)`` of every ``global_step_<k>`` folder, latest first."""
    try:
        names = os.listdir(checkpoint_dir)
    except OSError:
        return []
    found = [(int(m.group(1)), os.path.join(checkpoint_dir, name)) for name in names if (m := _STEP.match(name))]
    return sorted((item for item in found if os.path.isdir(item[1])), reverse=True)


def previous_complete(checkpoint_dir: str, before_step: int, verify_records: bool = True) -> Optional[str]:
    """The latest ``global_step_<k>`` folder with ``k < before_step`` that has no damaged file."""
    for step, folder in checkpoint_folders(checkpoint_dir):
        if step < before_step and not damaged_files(folder, verify_records):
            return folder
    return None


def fall_back(checkpoint_dir: str, damaged: str, previous: str) -> str:
    """Move the damaged folder aside and point verl's tracker file at ``previous``; returns where it was moved."""
    aside = damaged + ".damaged"
    suffix = 1
    while os.path.exists(aside):
        suffix += 1
        aside = f"{damaged}.damaged{suffix}"
    os.replace(damaged, aside)
    tracker = os.path.join(checkpoint_dir, TRACKER_FILE)
    with open(tracker + ".tmp", "w") as stream:
        stream.write(str(step_of(previous)))
    os.replace(tracker + ".tmp", tracker)
    return aside


# ---------------------------------------------------------------------------------------------- the start-up check


def resume_folder(config: Any) -> Optional[str]:
    """The checkpoint folder verl will resume from, when it is on this machine; None otherwise."""
    mode = str(_select(config, "trainer.resume_mode", "auto"))
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = _select(config, "trainer.resume_from_path")
        return str(folder) if folder and os.path.isdir(str(folder)) else None
    checkpoint_dir = _select(config, "trainer.default_local_dir")
    if not checkpoint_dir:
        return None
    try:
        with open(os.path.join(str(checkpoint_dir), TRACKER_FILE)) as stream:
            step = int(stream.read().strip())
    except (OSError, ValueError):
        return None
    folder = os.path.join(str(checkpoint_dir), f"global_step_{step}")
    return folder if os.path.isdir(folder) else None


def nothing_left_to_train(config: Any) -> Optional[str]:
    """The line a rerun prints instead of starting workers when the checkpoint it resumes from already holds
    ``trainer.total_training_steps`` steps (verl would validate, train nothing and end); None when a step is left."""
    total = _select(config, "trainer.total_training_steps")
    folder = resume_folder(config)
    step = step_of(folder) if folder else None
    if total is None or step is None or step < int(total) or _select(config, "trainer.val_only", False):
        return None
    return (f"nothing to train: the checkpoint this run resumes from, {folder}, already holds step {step} of "
            f"trainer.total_training_steps={int(total)}. To train further, raise it (e.g. "
            f"trainer.total_training_steps={step + int(total)}); to start afresh, set trainer.resume_mode=disable or "
            "another trainer.default_local_dir (WORK_DIR for scripts/run_dapo_cpu.sh)")


def folder_bytes(folder: str) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def free_bytes(path: str) -> Optional[int]:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


def _size(count: Optional[int]) -> str:
    if count is None:
        return "unknown"
    return f"{count / (1 << 20):.1f} MiB" if count < 1 << 30 else f"{count / (1 << 30):.1f} GiB"


def checkpoint_problems(config: Any, dry_run: bool = False) -> Iterable[str]:
    """The start-up problems of the checkpoint a run would resume from (module docstring), one line each. Outside a dry
    run, with ``dapo.resume.fallback_to_previous=true``, a damaged latest checkpoint is replaced by the previous
    complete one (moved aside, logged)."""
    folder = resume_folder(config)
    if folder is None:
        return
    checkpoint_dir = str(_select(config, "trainer.default_local_dir") or os.path.dirname(folder))
    verify = bool(_select(config, VERIFY_KEY, True))
    damaged = damaged_files(folder, verify)
    if damaged:
        step = step_of(folder)
        previous = previous_complete(os.path.dirname(folder), step, verify) if step is not None else None
        auto = str(_select(config, "trainer.resume_mode", "auto")) == "auto"
        if previous and auto and _select(config, FALLBACK_KEY, False) and not dry_run:
            aside = fall_back(checkpoint_dir, folder, previous)
            logger.warning("the latest checkpoint %s is damaged (%s %s): moved aside to %s; resuming from the previous "
                           "complete one, %s (%s=true)", folder, damaged[0][0], damaged[0][1], aside, previous,
                           FALLBACK_KEY)
            folder = previous
        else:
            name, why = damaged[0]
            more = f" (and {len(damaged) - 1} more damaged files)" if len(damaged) > 1 else ""
            if previous:
                offer = (f"the previous complete checkpoint is {previous}: resume from it with trainer.resume_mode="
                         f"resume_path trainer.resume_from_path={previous}" +
                         (f", or set {FALLBACK_KEY}=true to take it (the damaged folder is moved aside)" if auto else ""))
            else:
                offer = "there is no earlier complete checkpoint: start afresh with trainer.resume_mode=disable"
            yield f"the checkpoint to resume from, {folder}, is damaged: {name} {why}{more}; {offer}"
            return
    yield from shape_changes(config, folder)
    if int(_select(config, "trainer.save_freq", -1) or -1) > 0:  # the run will save
        needed, free = folder_bytes(folder), free_bytes(checkpoint_dir)
        if free is not None and needed and free < needed:
            yield (
                f"trainer.default_local_dir={checkpoint_dir} has {_size(free)} free, but the next checkpoint needs "
                f"about {_size(needed)} (the size of {folder}): free space there or point trainer.default_local_dir "
                "to a larger disk, then rerun"
            )
