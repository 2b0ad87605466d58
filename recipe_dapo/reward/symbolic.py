"""Symbolic answer equivalence with math-verify, in a child process that is killed at the time limit.

Why a process: sympy can run for minutes or exhaust memory on a hostile answer (``10^{10^{10}}``), and
nothing inside a Python thread can stop it -- ``signal.alarm`` (math-verify's own time-out) works only in
the main thread, while verl calls ``compute_score`` from a thread pool. A child process can be killed.

Protocol: the parent writes one JSON line ``{"gold": str, "pred": str}`` to the child's stdin and reads one
JSON line ``{"equal": bool}`` or ``{"error": str}`` from a private copy of the child's stdout (the child
points its own fd 1 at stderr, so a library that prints cannot corrupt the channel). The child first sends
``{"ready": true}`` once math-verify is imported. It caps its address space at ``CHILD_MEMORY_LIMIT_MB``
and exits when the parent goes away.

A spare child, already past its import of math-verify (about 0.5-2 s), replaces a killed one at once. The
time limit covers waiting for a replacement that is still importing; only the first check of a process
may wait longer, up to ``STARTUP_TIMEOUT_S``, for the first child (the reward manager starts it early).

This file imports nothing outside the standard library at module level: the child runs it as a script
(``python symbolic.py``), which works wherever the parent runs. POSIX only (``select`` on pipes), like verl.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
"""How long to wait for a (re)started child to import math-verify."""

KILL_RESERVE_S = 0.05
"""Part of the time limit kept for noticing the time-out and killing the child, so the caller gets control
back within the limit."""

CHILD_MEMORY_LIMIT_MB = 2048
"""Address-space cap of the child: a runaway sympy expansion fails with MemoryError instead of swapping."""


class SymbolicCheckError(RuntimeError):
    """The check gave no answer: time-out, child crash or start failure, math-verify missing."""


class SymbolicTimeout(SymbolicCheckError):
    """The check ran past its time limit; the child was killed."""


@functools.cache
def math_verify_installed() -> bool:
    """True when the optional ``math-verify`` package (extra ``math``) is importable; imports nothing."""
    return importlib.util.find_spec("math_verify") is not None


class SymbolicChecker:
    """math-verify children shared by the threads of this process: one answers (one check at a time), one
    spare has imported math-verify already and takes over the moment a check is killed."""

    def __init__(self, startup_timeout_s: float = STARTUP_TIMEOUT_S, memory_limit_mb: int = CHILD_MEMORY_LIMIT_MB):
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.kills = 0  # children killed after a time-out or failure
        self._lock = threading.Lock()
        self._active: _Child | None = None
        self._spare: _Child | None = None
        self._ever_ready = False

    def start(self) -> None:
        """Start the children in the background if they are not running (returns at once)."""
        with self._lock:
            try:
                self._active_locked()
            except OSError:  # e.g. no memory to fork: checks will try again and report their error
                logger.warning("could not start the math-verify checker", exc_info=True)

    def equivalent(self, gold: str, pred: str, timeout_s: float) -> bool:
        """Whether math-verify finds ``pred`` equal to ``gold``; raises :class:`SymbolicCheckError`.

        ``timeout_s`` bounds the wait for the answer, counted once this process holds the checker (a check
        queued behind another one in this process waits for it first). Only the first check of a process
        may also wait up to ``startup_timeout_s`` for the first child to import math-verify.
        """
        if not math_verify_installed():
            raise SymbolicCheckError("math-verify is not installed: pip install 'recipe_dapo[math]'")
        request = (json.dumps({"gold": gold, "pred": pred}) + "\n").encode("ascii")
        with self._lock:
            deadline = time.monotonic() + max(0.0, timeout_s - KILL_RESERVE_S)
            child = self._active_locked()
            try:
                if not child.ready and not self._ever_ready:  # first child of this process: a one-off wait
                    child.wait_ready(time.monotonic() + self.startup_timeout_s)
                    deadline = time.monotonic() + max(0.0, timeout_s - KILL_RESERVE_S)
                child.wait_ready(deadline)  # a replacement still importing math-verify uses up the limit
                self._ever_ready = True
            except SymbolicTimeout:
                if not self._ever_ready:  # no child has come up in startup_timeout_s: something is broken
                    self._discard_active_locked()
                raise  # else the replacement is healthy, just slow to import: leave it be
            except (OSError, ValueError, SymbolicCheckError) as error:
                self._discard_active_locked()
                raise SymbolicCheckError(
                    f"symbolic checker failed to start: {type(error).__name__}: {error}"
                ) from error
            try:
                child.send(request)
                reply = child.read_reply(deadline, "checking")
            except SymbolicTimeout:
                self._discard_active_locked()
                raise
            except (OSError, ValueError, SymbolicCheckError) as error:
                self._discard_active_locked()
                raise SymbolicCheckError(f"symbolic checker failed: {type(error).__name__}: {error}") from error
        if "error" in reply:
            raise SymbolicCheckError(f"math-verify error: {reply['error']}")
        return bool(reply["equal"])

    def close(self) -> None:
        """Stop the children (they also stop by themselves when this process exits)."""
        with self._lock:
            for child in (self._active, self._spare):
                if child is not None:
                    child.kill(reap_in_background=False)
            self._active = self._spare = None

    def _active_locked(self) -> _Child:
        if self._active is None or not self._active.alive():
            if self._active is not None:
                self._active.kill()
            spare_ok = self._spare is not None and self._spare.alive()
            self._active = self._spare if spare_ok else _Child(self.memory_limit_mb)
            self._spare = None
        if self._spare is None or not self._spare.alive():
            self._spare = _Child(self.memory_limit_mb)
        return self._active

    def _discard_active_locked(self) -> None:
        self.kills += 1
        if self._active is not None:
            self._active.kill()
            self._active = None
        self._active_locked()  # promote the spare now and start a new spare in the background


class _Child:
    """One ``python symbolic.py`` process and its reply channel."""

    def __init__(self, memory_limit_mb: int):
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(memory_limit_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.ready = False
        self._buffer = b""

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, deadline: float) -> None:
        if not self.ready:
            self.read_reply(deadline, "starting")
            self.ready = True

    def send(self, request: bytes) -> None:
        self.process.stdin.write(request)
        self.process.stdin.flush()

    def read_reply(self, deadline: float, what: str) -> dict:
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SymbolicTimeout(f"time-out: symbolic checker still {what} at the limit")
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise SymbolicCheckError(f"symbolic checker exited (code {self.process.wait()}) while {what}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def kill(self, reap_in_background: bool = True) -> None:
        if self.alive():
            self.process.kill()
        if reap_in_background:  # a child that grabbed gigabytes takes a while to die; don't make the caller wait
            threading.Thread(target=_reap, args=(self.process,), daemon=True, name="reap-symbolic-checker").start()
        else:
            _reap(self.process)


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - a killed process that does not die
        logger.warning("symbolic checker pid %d did not exit after SIGKILL", process.pid)
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:
            pass


_default_checker: SymbolicChecker | None = None
_default_lock = threading.Lock()


def _forget_inherited_checker() -> None:
    # A forked process must not talk to its parent's children over the inherited pipes.
    global _default_checker, _default_lock
    _default_checker, _default_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_checker)


def default_checker() -> SymbolicChecker:
    """This process's shared checker (created on first use, stopped at exit)."""
    global _default_checker
    with _default_lock:
        if _default_checker is None:
            _default_checker = SymbolicChecker()
            atexit.register(_default_checker.close)
        return _default_checker


# --- the child -----------------------------------------------------------------------------------------


def _serve(memory_limit_mb: int) -> None:
    """Child main loop: answer requests from stdin until EOF."""
    # Run as a script, Python put this file's folder first on sys.path, where our settings.py, metrics.py
    # ... would shadow any top-level module of the same name that sympy or math-verify might import.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # anything printed by a library goes to stderr, not into the protocol
    reply = os.fdopen(reply_fd, "w", buffering=1, encoding="ascii")
    _limit_memory(memory_limit_mb)
    _exit_when_orphaned()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = [LatexExtractionConfig(), ExprExtractionConfig()]

    @functools.lru_cache(maxsize=4096)
    def parsed(expression: str):
        # No inner time-out: math-verify's would turn a time-out into a silent "not equal"; the parent kills us.
        return parse(f"${expression}$", extraction_config=targets, parsing_timeout=None)

    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold, pred = parsed(request["gold"]), parsed(request["pred"])
            equal = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
            answer = {"equal": bool(equal)}
        except BaseException as error:  # noqa: BLE001 - report MemoryError/RecursionError, keep serving
            answer = {"error": f"{type(error).__name__}: {error}"[:300]}
        reply.write(json.dumps(answer) + "\n")


def _limit_memory(memory_limit_mb: int) -> None:
    try:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # pragma: no cover - platform without RLIMIT_AS
        pass


def _exit_when_orphaned() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-when-orphaned").start()


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else CHILD_MEMORY_LIMIT_MB)
