"""Reward failures that are logged without flooding the log: the first few in detail, then counts.

A broken ground-truth column or a user's reward function that raises on every sample would otherwise write a
traceback per sample (thousands per step). :class:`FailureLog` logs the first ``detailed`` occurrences of one
kind of failure with their detail (and traceback when given), then at most one line per ``summary_every_s``
seconds with how many more occurred::

    custom compute_score raised (1 of the first 3 logged in detail): ValueError: cannot parse
    ...
    custom compute_score raised: 250 more since the last report (253 in all); last: ValueError: cannot parse

Thread-safe: verl's reward loop calls the verifier from a thread pool.
"""

from __future__ import annotations

import logging
import threading
import time

DETAILED = 3
"""How many occurrences of one kind of failure are logged in detail."""

SUMMARY_EVERY_S = 60.0
"""After that, at most one summary line per this many seconds."""


class FailureLog:
    """Counts one kind of reward failure and logs it at a bounded rate."""

    def __init__(
        self, logger: logging.Logger, what: str, detailed: int = DETAILED, summary_every_s: float = SUMMARY_EVERY_S
    ):
        self.logger = logger
        self.what = what
        self.detailed = detailed
        self.summary_every_s = summary_every_s
        self.count = 0
        self._unreported = 0
        self._last_summary = float("-inf")
        self._lock = threading.Lock()

    def report(self, detail: str, exc_info: BaseException | None = None) -> None:
        """Count one failure; log it in detail, in a summary, or not at all (rate limit)."""
        with self._lock:
            self.count += 1
            count = self.count
            if count <= self.detailed:
                summary = None
            else:
                self._unreported += 1
                now = time.monotonic()
                if now - self._last_summary < self.summary_every_s:
                    return
                summary, self._unreported, self._last_summary = self._unreported, 0, now
        if summary is None:
            self.logger.warning(
                "%s (%d of the first %d logged in detail; later ones are counted): %s",
                self.what, count, self.detailed, detail, exc_info=exc_info,
            )
        else:
            self.logger.warning(
                "%s: %d more since the last report (%d in all); last: %s", self.what, summary, count, detail
            )
