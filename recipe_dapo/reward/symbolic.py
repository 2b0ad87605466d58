"""Symbolic answer equivalence with math-verify, in child processes that are killed at the time limit.

Why processes: sympy can run for minutes or exhaust memory on a hostile answer (``10^{10^{10}}``), and
nothing inside a Python thread can stop it -- ``signal.alarm`` (math-verify's own time-out) works only in
the main thread, while verl calls ``compute_score`` from a thread pool. A child process can be killed.

Layout: one *template* process imports math-verify once (about 0.5-2 s, more under load) and then only
forks *checkers* on request, so a checker is ready in milliseconds (copy-on-write) whenever one is needed:

- up to ``max_checkers`` checkers answer in parallel, one check at a time each, so threads of this process
  do not queue behind one another (with 4 threads on one checker, the worst call took 14.7 s);
- a checker that runs past the limit is killed and the next check forks a fresh one from the template,
  which never runs a check itself: no check waits for a replacement to import math-verify (no cascade of
  time-outs after one hard answer);
- the limit of a check covers all of it -- waiting for a free checker, forking one, the check itself --
  except that the first check of a process may wait up to ``startup_timeout_s`` for the template's import
  (the reward manager starts the template at construction, so that is normally done before step 1).

Protocol: the parent and the template share a Unix socket; per new checker the parent sends one end of a
fresh socket pair (``SCM_RIGHTS``), the template forks and replies with the checker's pid. On its socket a
checker reads one JSON line ``{"gold": str, "pred": str}`` and answers ``{"equal": bool}`` or
``{"error": str}``. Processes print nothing on the channels (fd 1 points at stderr), cap their address space
at ``CHILD_MEMORY_LIMIT_MB``, and exit when the parent goes away (their socket reaches end of file).

This file imports nothing outside the standard library at module level: the template runs it as a script
(``python symbolic.py``), which works wherever the parent runs. POSIX only (``fork``, ``SCM_RIGHTS``), like
verl.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
"""How long the first check of a process may wait for the template to import math-verify."""

KILL_RESERVE_S = 0.25
"""Part of the time limit kept for noticing the time-out, killing the checker and returning, so that the
whole call ends within the limit. With 0.05 s, 4 threads on 2 busy cores ended calls up to 0.16 s late
(``bench/verifier_agreement.py``): the thread that wakes at the deadline waits for the GIL and the CPU."""

CHILD_MEMORY_LIMIT_MB = 2048
"""Address-space cap of each checker: a runaway sympy expansion fails with MemoryError instead of swapping."""

MAX_CHECKERS = max(4, min(8, os.cpu_count() or 4))
"""Checkers of one process that may run at once (verl's reward loop calls from a thread pool)."""


class SymbolicCheckError(RuntimeError):
    """The check gave no answer: time-out, child crash or start failure, math-verify missing."""


class SymbolicTimeout(SymbolicCheckError):
    """The check ran past its time limit; the child was killed."""


@functools.cache
def math_verify_installed() -> bool:
    """True when the optional ``math-verify`` package (extra ``math``) is importable; imports nothing."""
    return importlib.util.find_spec("math_verify") is not None


class SymbolicChecker:
    """A template process and the checkers it forks, shared by the threads of this process."""

    def __init__(
        self,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        memory_limit_mb: int = CHILD_MEMORY_LIMIT_MB,
        max_checkers: int = MAX_CHECKERS,
    ):
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.max_checkers = max_checkers
        self.kills = 0  # checkers killed after a time-out or failure
        self._condition = threading.Condition()
        self._fork_lock = threading.Lock()
        self._template: _Template | None = None
        self._idle: list[_Checker] = []
        self._busy = 0
        self._ever_ready = False

    def start(self) -> None:
        """Start the template in the background if it is not running (returns at once)."""
        with self._condition:
            try:
                self._template_locked()
            except OSError:  # e.g. no memory to fork: checks will try again and report their error
                logger.warning("could not start the math-verify checker", exc_info=True)

    def equivalent(self, gold: str, pred: str, timeout_s: float) -> bool:
        """Whether math-verify finds ``pred`` equal to ``gold``; raises :class:`SymbolicCheckError`
        (:class:`SymbolicTimeout` when ``timeout_s`` ran out, waiting for a free checker included)."""
        if not math_verify_installed():
            raise SymbolicCheckError("math-verify is not installed: pip install 'recipe_dapo[math]'")
        request = (json.dumps({"gold": gold, "pred": pred}) + "\n").encode("ascii")
        checker, deadline = self._acquire(timeout_s)
        try:
            checker.send(request)
            reply = checker.read_reply(deadline)
        except SymbolicTimeout:
            self._discard(checker)
            raise
        except (OSError, ValueError, SymbolicCheckError) as error:
            self._discard(checker)
            raise SymbolicCheckError(f"symbolic checker failed: {type(error).__name__}: {error}") from error
        self._release(checker)
        if "error" in reply:
            raise SymbolicCheckError(f"math-verify error: {reply['error']}")
        return bool(reply["equal"])

    def close(self) -> None:
        """Stop the template and the checkers (they also stop by themselves when this process exits)."""
        with self._condition:
            for checker in self._idle:
                checker.kill()
            self._idle = []
            if self._template is not None:
                self._template.kill()
                self._template = None

    # --- pool ---------------------------------------------------------------------------------------

    def _acquire(self, timeout_s: float) -> tuple[_Checker, float]:
        """A free checker (forked when none is idle and fewer than ``max_checkers`` are busy) and the
        deadline of this check."""
        start = time.monotonic()
        deadline = start + max(0.0, timeout_s - KILL_RESERVE_S)
        with self._condition:
            template = self._template_locked()
            if not template.ready:
                # Only the first check of a process may wait for the import; later ones wait within the limit.
                wait_until = start + self.startup_timeout_s if not self._ever_ready else deadline
                try:
                    template.wait_ready(wait_until)
                except SymbolicCheckError as error:
                    if not isinstance(error, SymbolicTimeout) or not self._ever_ready:
                        self._drop_template_locked()
                    if isinstance(error, SymbolicTimeout):
                        raise SymbolicTimeout("time-out: symbolic checker still starting at the limit") from None
                    raise SymbolicCheckError(f"symbolic checker failed to start: {error}") from error
                if not self._ever_ready:
                    self._ever_ready = True
                    deadline = time.monotonic() + max(0.0, timeout_s - KILL_RESERVE_S)
            checker = None
            while True:
                while self._idle and not self._idle[-1].alive():
                    self._idle.pop().kill()
                if self._idle:
                    checker = self._idle.pop()
                    break
                if self._busy < self.max_checkers:
                    break  # a slot for a new checker, forked below without holding the pool's lock
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SymbolicTimeout(f"time-out: all {self.max_checkers} symbolic checkers busy until the limit")
                self._condition.wait(remaining)
            self._busy += 1
        if checker is None:
            try:
                checker = self._fork(template, deadline)
            except BaseException:
                with self._condition:
                    self._busy -= 1
                    self._condition.notify()
                raise
        return checker, deadline

    def _fork(self, template: _Template, deadline: float) -> _Checker:
        """A new checker from ``template``; one fork at a time (they share its socket), each thread waiting
        for its turn only until its own deadline, so a slow fork holds up no release and no other limit."""
        if not self._fork_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise SymbolicTimeout("time-out: waiting to fork a symbolic checker at the limit")
        try:
            return template.fork(deadline)
        except SymbolicTimeout:
            raise SymbolicTimeout("time-out: forking a symbolic checker at the limit") from None
        except (OSError, ValueError, SymbolicCheckError) as error:
            with self._condition:
                if self._template is template:
                    self._drop_template_locked()
            raise SymbolicCheckError(f"symbolic checker failed to start: {error}") from error
        finally:
            self._fork_lock.release()

    def _release(self, checker: _Checker) -> None:
        with self._condition:
            self._busy -= 1
            self._idle.append(checker)
            self._condition.notify()

    def _discard(self, checker: _Checker) -> None:
        checker.kill()
        with self._condition:
            self.kills += 1
            self._busy -= 1
            self._condition.notify()

    def _template_locked(self) -> _Template:
        if self._template is None or not self._template.alive():
            if self._template is not None:
                self._template.kill()
            self._template = _Template(self.memory_limit_mb)
        return self._template

    def _drop_template_locked(self) -> None:
        if self._template is not None:
            self._template.kill()
            self._template = None


class _Template:
    """The ``python symbolic.py`` process that imported math-verify and forks checkers."""

    def __init__(self, memory_limit_mb: int):
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(memory_limit_mb), str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
        finally:
            theirs.close()
        self.ready = False
        self._late_replies = 0
        self._reader = _LineReader(self.control)

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, deadline: float) -> None:
        if not self.ready:
            self._reader.read(deadline, "starting")
            self.ready = True

    def fork(self, deadline: float) -> _Checker:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.control, [b"F"], [theirs.fileno()])
        finally:
            theirs.close()
        try:
            while self._late_replies:  # replies to forks that timed out: those checkers saw EOF and exited
                self._reader.read(deadline, "forking a checker")
                self._late_replies -= 1
            reply = self._reader.read(deadline, "forking a checker")
        except SymbolicTimeout:
            ours.close()
            self._late_replies += 1
            raise
        except SymbolicCheckError:
            ours.close()
            raise
        if "pid" not in reply:
            ours.close()
            raise SymbolicCheckError(f"template could not fork a checker: {reply.get('error', reply)}")
        return _Checker(ours, int(reply["pid"]))

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.control.close()
        threading.Thread(target=_reap, args=(self.process,), daemon=True, name="reap-symbolic-template").start()


class _Checker:
    """One forked checker: its socket and pid (a child of the template, which reaps it)."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock = sock
        self.pid = pid
        self._reader = _LineReader(sock)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return self.sock.fileno() >= 0

    def send(self, request: bytes) -> None:
        self.sock.sendall(request)

    def read_reply(self, deadline: float) -> dict:
        return self._reader.read(deadline, "checking")

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.sock.close()


class _LineReader:
    """JSON lines from a socket, each read with a deadline."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""

    def read(self, deadline: float, what: str) -> dict:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SymbolicTimeout(f"time-out: symbolic checker still {what} at the limit")
            readable, _, _ = select.select([self.sock], [], [], remaining)
            if readable:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise SymbolicCheckError(f"symbolic checker exited while {what}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - a killed process that does not die
        logger.warning("symbolic checker template pid %d did not exit after SIGKILL", process.pid)


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


# --- the template and its checkers -----------------------------------------------------------------


def _serve_template(memory_limit_mb: int, control_fd: int) -> None:
    """Template main loop: import math-verify, then fork one checker per request until end of file."""
    # Run as a script, Python put this file's folder first on sys.path, where our settings.py, metrics.py
    # ... would shadow any top-level module of the same name that sympy or math-verify might import.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    os.dup2(2, 1)  # anything printed by a library goes to stderr
    control = socket.socket(fileno=control_fd)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        targets = [LatexExtractionConfig(), ExprExtractionConfig()]
        verify(parse("$x+1$", extraction_config=targets), parse("$1+x$", extraction_config=targets))  # warm up
    except BaseException as error:  # noqa: BLE001 - tell the parent why, then exit
        control.sendall((json.dumps({"error": f"{type(error).__name__}: {error}"[:300]}) + "\n").encode())
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # checkers are reaped by the kernel
    control.sendall(b'{"ready": true}\n')
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 16, 1)
        except OSError:
            return
        if not message or not fds:
            return  # the parent is gone
        try:
            pid = os.fork()
        except OSError as error:
            os.close(fds[0])
            control.sendall((json.dumps({"error": f"fork failed: {error}"}) + "\n").encode())
            continue
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _limit_memory(memory_limit_mb)
            try:
                _serve_checks(socket.socket(fileno=fds[0]), parse, verify, targets)
            finally:
                os._exit(0)
        os.close(fds[0])
        control.sendall((json.dumps({"pid": pid}) + "\n").encode())


def _serve_checks(sock: socket.socket, parse, verify, targets) -> None:
    """Checker main loop: answer requests from the socket until end of file."""

    @functools.lru_cache(maxsize=4096)
    def parsed(expression: str):
        # No inner time-out: math-verify's would turn a time-out into a silent "not equal"; the parent kills us.
        return parse(f"${expression}$", extraction_config=targets, parsing_timeout=None)

    reader = sock.makefile("rb")
    for line in reader:
        try:
            request = json.loads(line)
            gold, pred = parsed(request["gold"]), parsed(request["pred"])
            equal = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
            answer = {"equal": bool(equal)}
        except BaseException as error:  # noqa: BLE001 - report MemoryError/RecursionError, keep serving
            answer = {"error": f"{type(error).__name__}: {error}"[:300]}
        sock.sendall((json.dumps(answer) + "\n").encode("ascii"))


def _limit_memory(memory_limit_mb: int) -> None:
    try:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # pragma: no cover - platform without RLIMIT_AS
        pass


if __name__ == "__main__":
    _serve_template(int(sys.argv[1]), int(sys.argv[2]))
