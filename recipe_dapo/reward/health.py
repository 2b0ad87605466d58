"""The run-level limit on reward failures: one failed sample trains as a wrong answer, too many stop the run.

A sample *fails* when its reward could not be computed: the function timed out, raised, returned a score that is not
finite once verl stores it as float32 (NaN, +/-inf, or beyond +/-3.4e38, such as 1e39), or the ground truth is
malformed. Such a sample scores -1, the wrong answer's score, with ``verify_error`` saying why (counted per step in
``reward/verify_error_ratio``). That is right for a few samples and wrong for a broken function: a run where most
samples fail trains on noise, or (with every response -1, so no group has a spread) trains nothing while it spends
its generation budget.

:class:`FailureWindow` keeps the outcome of the last ``window`` samples one reward worker scored
(``dapo.health.reward_failure_window``); once at least :data:`MIN_JUDGED_SAMPLES` are in and more than
``max_ratio`` of them failed (``dapo.health.max_reward_failure_ratio``), it raises
:class:`~recipe_dapo.reward.bounded_calls.RewardFunctionBroken` with one line naming the function, the share that
failed and the last failure. The manager lets that error through, so the step, and the run, stop. Pure: no verl.
"""

from __future__ import annotations

import threading
from collections import deque

from recipe_dapo.reward.bounded_calls import RewardFunctionBroken, share

MIN_JUDGED_SAMPLES = 50
"""A worker's share is judged only once it has scored this many samples (or ``window``, when smaller), so that a
couple of failures among the first samples cannot stop a run."""


class FailureWindow:
    """The failure share of the last ``window`` samples of one reward worker, and the stop past ``max_ratio``."""

    def __init__(self, max_ratio: float, window: int, function: str, min_samples: int = MIN_JUDGED_SAMPLES):
        if not 0.0 <= float(max_ratio) <= 1.0:
            raise ValueError(f"dapo.health.max_reward_failure_ratio must lie in [0, 1] (1: never stop), got {max_ratio}")
        if int(window) < 1:
            raise ValueError(f"dapo.health.reward_failure_window must be >= 1 sample, got {window}")
        self.max_ratio = float(max_ratio)
        self.window = int(window)
        self.function = function
        self.min_samples = min(int(min_samples), self.window)
        self._outcomes: deque[bool] = deque(maxlen=self.window)
        self._failed = 0
        self.last_error = ""
        self._lock = threading.Lock()

    @property
    def failed(self) -> int:
        """Failed samples among those in the window."""
        return self._failed

    @property
    def samples(self) -> int:
        return len(self._outcomes)

    def record(self, error: str) -> None:
        """One scored sample (``error``: its ``verify_error``, ``""`` when it did not fail); raises
        :class:`RewardFunctionBroken` when the window's failure share is now above ``max_ratio``."""
        failed = bool(error)
        with self._lock:
            if len(self._outcomes) == self.window:
                self._failed -= self._outcomes[0]
            self._outcomes.append(failed)
            self._failed += failed
            if failed:
                self.last_error = str(error)
            samples, failures = len(self._outcomes), self._failed
        if self.max_ratio >= 1.0 or samples < self.min_samples or failures <= self.max_ratio * samples:
            return
        raise RewardFunctionBroken(
            f"{self.function} failed on {share(failures, samples)} of the last samples this reward worker scored, "
            f"above dapo.health.max_reward_failure_ratio={self.max_ratio:g} (each failure trains as a wrong answer); "
            f"the last: {self.last_error}. The run stops: fix the function or the data's ground truths, then rerun to "
            "resume from the last checkpoint"
        )
