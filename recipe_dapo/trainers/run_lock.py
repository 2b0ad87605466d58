"""One checkpoint folder, one run: a lock file in ``trainer.default_local_dir`` held by the driver for its lifetime.

Two launches into one folder would both resume from the same checkpoint, train the same steps, overwrite each other's
checkpoints and log those steps twice in the metrics file. The driver takes an exclusive ``fcntl`` lock on
``<trainer.default_local_dir>/.dapo_run.lock`` (a POSIX record lock: on a shared file system it holds across nodes
where the file system supports locks, as NFSv4 and Lustre do) once the configuration passed its checks, and writes its
PID, host and start time into the file. A second launch finds the lock taken and is refused in one line naming the
first run's PID and host. The lock is released when the driver exits, however it exits (the operating system drops the
locks of a process that ends, even after ``kill -9``), so a crashed run never blocks the next. Pure standard library.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from typing import Optional

LOCK_FILE = ".dapo_run.lock"


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
