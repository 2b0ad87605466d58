"""One checkpoint folder, one run: a lock file in ``trainer.default_local_dir`` held by the driver for its lifetime.

Two launches into one folder would both resume from the same checkpoint, train the same steps, overwrite each other's
checkpoints and log those steps twice in the metrics file. The driver takes an exclusive ``fcntl`` lock on
``<trainer.default_local_dir>/.dapo_run.lock`` (a POSIX record lock: on a shared file system it holds across nodes
where the file system supports locks, as NFSv4 and Lustre do) once the configuration passed its checks, and writes its
PID, host and start time into the file. A second launch finds the lock taken and is refused in one line naming the
first run's PID and host. The lock is released when the driver exits, however it exits (the operating system drops the
locks of a process that ends, even after ``kill -9``), so a crashed run never blocks the next. Pure standard library.

The driver is not the only process that writes into the folder: the trainer (the recipe's state, verl's tracker file)
and verl's actor workers (the model and optimizer shards) do, and after a driver is killed they go on for a few seconds
until Ray stops them. So every such process holds a *shared* lock on ``.dapo_run.writers.lock`` for its lifetime
(:func:`hold_as_writer`; the trainers take it in their own process and, through Ray, in each actor worker), and a new
driver, once it holds the run lock, waits until it can take that file's lock exclusively (:func:`wait_for_writers`):
until the last process of the earlier run has ended. Processes still writing after the wait are refused like a live
run, naming the wait.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
import sys
from typing import Optional

LOCK_FILE = ".dapo_run.lock"
WRITERS_FILE = ".dapo_run.writers.lock"
WRITERS_WAIT_S = 60.0
"""How long a new driver waits for the processes of an earlier run (its driver gone) to stop writing into the folder."""
_writer_fds: dict[str, int] = {}  # folder -> this process's descriptor holding the writers' shared lock


class FolderInUse(RuntimeError):
    """Another live run holds the checkpoint folder; the message names it."""


class RunLock:
    """The exclusive lock of one folder, held from :meth:`acquire` until :meth:`release` or the process's end."""

    def __init__(self, folder: str):
        self.folder = str(folder)
        self.path = os.path.join(self.folder, LOCK_FILE)
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunLock":
        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise FolderInUse(
                f"trainer.default_local_dir={self.folder} is in use by another run ({_describe(holder)}); two runs "
                "in one folder overwrite each other's checkpoints: wait for it to end (or stop it), or give this run "
                "its own folder (trainer.default_local_dir or trainer.experiment_name)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)[:500],
        }).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None


def hold_as_writer(folder: str) -> None:
    """In a process of the run that writes into ``folder``: hold the writers' shared lock until the process ends (once
    per folder; the descriptor is never closed: closing any descriptor of the file would drop the process's lock)."""
    folder = os.path.abspath(str(folder))
    if folder in _writer_fds:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, WRITERS_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.lockf(fd, fcntl.LOCK_SH)  # blocks only while a new driver checks (an instant)
    except OSError as error:  # a file system without locks: the run goes on, as unguarded as before
        logging.getLogger(__name__).warning("cannot hold the writers' lock in %s (%s): a new run will not wait for "
                                            "this process", folder, error)
        return
    _writer_fds[folder] = fd


def wait_for_writers(folder: str, wait_s: float = WRITERS_WAIT_S, poll_s: float = 0.2, say=None) -> float:
    """In the driver, holding the run lock: wait until no process of an earlier run holds the writers' lock of
    ``folder`` (its trainer and workers go on writing for a few seconds after their driver was killed); returns the
    seconds waited. Raises :class:`FolderInUse` when some still do after ``wait_s``. ``say``: called once with a line
    when a wait begins."""
    import time

    os.makedirs(str(folder), exist_ok=True)
    path = os.path.join(str(folder), WRITERS_FILE)
    started = time.monotonic()
    said = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            waited = time.monotonic() - started
            if waited >= wait_s:
                raise FolderInUse(
                    f"trainer.default_local_dir={folder}: processes of an earlier run (its trainer or actor workers, "
                    f"whose driver is gone) still write into it after {wait_s:.0f} s; stop them (ray stop on their "
                    "nodes) or give this run its own folder (trainer.default_local_dir or trainer.experiment_name)"
                ) from None
            if not said and say is not None:
                say(f"waiting for the processes of an earlier run to stop writing into {folder} (up to {wait_s:.0f} s)")
                said = True
            time.sleep(poll_s)
            continue
        finally:
            os.close(fd)  # releases the exclusive lock when it was taken: this run's writers take theirs
        return time.monotonic() - started


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "its PID and host are not recorded"
    described = f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("started"):
        described += f", started {holder['started']}"
    return described
