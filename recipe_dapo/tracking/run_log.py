"""The run's metrics file: its layout, what a resume sets aside, and its reader (pure: no verl import, so the run
report and the benches read metrics files quickly).

Layout (verl's ``FileLogger``): ``<VERL_FILE_LOGGER_ROOT or .>/<project>/<experiment>.jsonl`` (or
``$VERL_FILE_LOGGER_PATH``), one line per ``Tracking.log`` call: ``{"step": int, "data": {metric: value}}``.

**What a resume keeps.** verl opens the file with ``"wb"``, so a resumed process erased everything the
earlier processes logged. The tracker's file backend (``tracker.ResumableFileLogger``) appends instead. A process that starts from the
checkpoint of step ``k`` first sets aside the lines it is about to repeat: lines of steps ``> k`` were logged
after the checkpoint was written (the run was killed after logging step ``k+1`` but before saving it), and
the resumed process trains and logs those steps again from the checkpoint. They are moved, not deleted, to
``<experiment>.superseded.jsonl`` beside the file, each with
``"superseded": {"resumed_from_step": k, "time": ...}``, so the metrics file itself is always the history
the checkpoints belong to: steps ``0..k`` from the earlier processes, then what this process logs. A fresh
start (``k = 0``: no checkpoint) over an existing file sets aside all of its lines.

A step may have several lines (the step's training metrics, then a validation at the same step, e.g. the
resumed process's ``val_before_train`` at step ``k``); :func:`read_metrics` merges them, later lines winning.
The file is replaced atomically (written beside it, then renamed), after the set-aside lines are safely in
the superseded file, so a kill at any point loses no line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any


logger = logging.getLogger(__name__)

SUPERSEDED_SUFFIX = ".superseded.jsonl"


def metrics_file_path(project_name: str, experiment_name: str) -> str:
    """Where verl's ``FileLogger`` writes (its rule, repeated: verl computes it inside ``__init__``)."""
    path = os.getenv("VERL_FILE_LOGGER_PATH")
    if path is None:
        root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
        path = os.path.join(root, project_name, f"{experiment_name}.jsonl")
    return path


def superseded_path(path: str | os.PathLike) -> str:
    path = str(path)
    return (path[: -len(".jsonl")] if path.endswith(".jsonl") else path) + SUPERSEDED_SUFFIX


def _parse(line: bytes) -> dict | None:
    try:
        record = json.loads(line)
    except ValueError:  # a line cut by a kill in the middle of a write
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def set_aside_superseded(path: str | os.PathLike, resumed_step: int) -> int:
    """Move the lines a process resuming at ``resumed_step`` will log again to the superseded file.

    Returns how many lines were moved. Lines that do not parse (a write cut by a kill) are moved too,
    as ``{"raw": text}``. Nothing is moved when the file does not exist or nothing is superseded. The run's console
    gets one plain line (:func:`start_line`): a resume, or a fresh start where a metrics file was there before, and
    what happened to the metrics already in the file; a first run (a fresh start, no file yet) gets none (its
    summary names the metrics file).
    """
    path = str(path)
    if not os.path.exists(path):
        if resumed_step > 0:
            _announce(start_line(path, resumed_step, [], []))
        return 0
    with open(path, "rb") as handle:
        lines = [line for line in handle.read().split(b"\n") if line.strip()]
    keep, moved = [], []
    for line in lines:
        record = _parse(line)
        if record is not None and 0 < resumed_step and record["step"] <= resumed_step:
            keep.append(line)
        else:
            moved.append((line, record))
    kept_steps = sorted({_parse(line)["step"] for line in keep})
    moved_steps = sorted({record["step"] for _, record in moved if record is not None})
    if not moved:
        _announce(start_line(path, resumed_step, kept_steps, []))
        return 0
    stamp = {"resumed_from_step": int(resumed_step), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(superseded_path(path), "ab") as side:
        for line, record in moved:
            if record is None:  # keep the raw text of a line cut by a kill
                record = {"raw": line.decode(errors="replace")}
            entry = dict(record, superseded=stamp)
            side.write(json.dumps(entry).encode() + b"\n")
        side.flush()
        os.fsync(side.fileno())
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(b"".join(line + b"\n" for line in keep))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _announce(start_line(path, resumed_step, kept_steps, moved_steps, len(moved)))
    return len(moved)


def start_line(path: str, resumed_step: int, kept_steps: list[int], moved_steps: list[int],
               moved_lines: int = 0) -> str:
    """The console's line on how a run starts and what became of the metrics already in its file.

    >>> start_line("/r/m.jsonl", 0, [], [])
    'metrics: a fresh start (no checkpoint to resume from), logging to /r/m.jsonl'
    >>> start_line("/r/m.jsonl", 0, [], [0, 1, 2, 3, 4], 6)
    'metrics: a fresh start (no checkpoint to resume from); the 6 lines of steps 0-4 already in /r/m.jsonl were moved to /r/m.superseded.jsonl'
    >>> start_line("/r/m.jsonl", 4, [0, 1, 2, 3, 4], [5], 1)
    'metrics: resuming from the checkpoint of step 4; steps 0-4 stay in /r/m.jsonl, the 1 line of step 5 (logged after that checkpoint, trained again now) was moved to /r/m.superseded.jsonl'
    """
    path = os.path.abspath(path)
    if resumed_step <= 0:
        line = "metrics: a fresh start (no checkpoint to resume from)"
        if not moved_lines:
            return f"{line}, logging to {path}"
        return (f"{line}; the {_lines(moved_lines)} of {_steps(moved_steps)} already in {path} "
                f"{'were' if moved_lines > 1 else 'was'} moved to {superseded_path(path)}")
    line = f"metrics: resuming from the checkpoint of step {resumed_step}; "
    line += f"{_steps(kept_steps)} stay in {path}" if kept_steps else f"logging to {path}"
    if moved_lines:
        line += (f", the {_lines(moved_lines)} of {_steps(moved_steps)} (logged after that checkpoint, trained again "
                 f"now) {'were' if moved_lines > 1 else 'was'} moved to {superseded_path(path)}")
    return line


def _lines(count: int) -> str:
    return f"{count} line{'s' if count != 1 else ''}"


def _steps(steps: list[int]) -> str:
    if not steps:
        return "no parsable step"
    return f"step{'s' if len(steps) > 1 else ''} {_ranges(steps)}"


def _announce(line: str) -> None:
    """One plain line on the run's console (no Ray prefix, no colour: ``tracking.console.announce``)."""
    from recipe_dapo.tracking.console import announce

    announce(line)


def read_metrics(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """step -> metrics, merging every line of a step in file order (later lines win); bad lines are skipped."""
    metrics: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_bytes().split(b"\n"):
        if not line.strip():
            continue
        record = _parse(line)
        if record is None:
            logger.warning("%s: skipping a line that is not a metrics record: %r", path, line[:80])
            continue
        metrics.setdefault(record["step"], {}).update(record.get("data") or {})
    return metrics


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts, start = [], None
    for index, step in enumerate(steps):
        if start is None:
            start = step
        if index + 1 == len(steps) or steps[index + 1] != step + 1:
            parts.append(str(start) if start == step else f"{start}-{step}")
            start = None
    return ", ".join(parts)
