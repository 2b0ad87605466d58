"""Pre-rollout skipping: leave out, before generation, prompts whose recent groups say they will not qualify, and
draw the next prompts in their place (after GRESO, arXiv 2506.02177, with a different predictor).

Per prompt key (``prompt_keys``) the skipper keeps a decayed count of right responses S and of responses R over the
prompt's generated groups (each new group first multiplies both by ``history_decay``, so a prompt's recent groups
weigh most as the policy changes), plus how many times in a row it was skipped. From them it predicts the chance
that the prompt's next group qualifies: with the pass rate q ~ Beta(1/2 + S, 1/2 + R - S) (Jeffreys' prior), the
number of right responses among the group's n is beta-binomial, and the configured keep rule says which counts
qualify (``spread``: 0 < right < n). The metric is read as right / wrong (above 0 or not), which is exact for
``acc`` and for DAPO's score up to the overlong penalty.

When a prompt comes up for a round (:meth:`PromptSkipper.choose`) it is a *candidate* when it has a history and
its predicted chance to qualify is below ``max_qualify_probability``; a candidate is skipped with probability
``1 - explore`` unless it was skipped ``max_consecutive_skips`` times in a row (then it is generated: the bound on
how long any prompt is left out). With n = 16 and the defaults (``max_qualify_probability`` 0.1,
``history_decay`` 0.8) a prompt becomes a candidate after about nine all-right (or all-wrong) groups in a row, and
a group with mixed answers among its recent ones keeps it generated for several visits more. GRESO's rule (skip
with probability 1 - explore^z after z non-qualifying groups in a row) does not see that past: in a development
version of ``bench/dynamic_sampling_sim.py`` (late world) it skipped 11% prompts that would have qualified where
this predictor skipped 5%, for the same generation saved.

``explore`` is the exploration probability, adapted after every step that generated groups
(:meth:`PromptSkipper.end_step`): down by ``explore_step`` when fewer than ``target_keep_rate`` of the step's
generated groups qualified (skip more), up otherwise (skip less), within [``explore_min``, 1]; at 1 nothing is
skipped. The draws come from the skipper's own generator, seeded from the config and saved in :meth:`state_dict`, so
a resumed run decides exactly as the uninterrupted one.

A skipped prompt is not generated this time round; the data order is unchanged, so it comes up again in a later
epoch. :func:`take_unskipped` is the one place prompts are filtered: the sampler's ``take_prompts``, through which
every round source (the trainer's, a simulated one, a future replay-buffer source) gets its prompts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from recipe_dapo.dynamic_sampling.batch_ops import BatchOps
from recipe_dapo.dynamic_sampling.keep_rules import GroupView

PRIOR = (0.5, 0.5)
"""Beta prior of a prompt's pass rate (Jeffreys'): most prompts are near always or never solved."""

RIGHT, SEEN, SKIPS, SKIPPED, EASY = range(5)
"""Columns of a prompt's record: decayed right responses, decayed responses, skips in a row, skipped since it was
last generated, last group mostly right."""


@dataclass
class SkipTally:
    """What the skipper did in one step (or, summed, over the run)."""

    considered_prompts: int = 0  # prompts that came up for a round
    candidate_prompts: int = 0  # ... predicted below max_qualify_probability
    skipped_prompts: int = 0
    skipped_easy_prompts: int = 0  # skipped after a mostly-right last group
    forced_prompts: int = 0  # candidates generated only because of max_consecutive_skips
    predicted_qualify_skipped: float = 0.0  # sum of the predicted chance to qualify over the skipped prompts
    generated_after_skip: int = 0  # groups of prompts skipped since they were last generated
    qualified_after_skip: int = 0  # ... of which qualified


class PromptSkipper:
    """Per-prompt history of group outcomes and the skip decision (see the module docstring)."""

    def __init__(self, settings: Any, seed: int, keep_rule: Callable[[GroupView], np.ndarray], tolerance: float = 0.0):
        """``settings``: ``config.SkipSettings``; ``keep_rule``: the sampler's keep rule (arguments bound), which
        decides which numbers of right answers qualify; ``tolerance``: the same-value tolerance."""
        self.settings = settings
        self._keep_rule = keep_rule
        self._tolerance = tolerance
        self._qualifying_counts: dict[int, np.ndarray] = {}
        self._rng = np.random.default_rng(seed)
        self._explore = float(settings.explore_init)
        self._records: dict[Any, list[float]] = {}
        self._group_size = 0
        self._step = SkipTally()
        self._run = SkipTally()
        self.step_skipped_keys: list = []
        """Keys skipped in the current step, in order (for reports; not saved)."""

    @property
    def explore(self) -> float:
        """The exploration probability now: a candidate is generated with this probability."""
        return self._explore

    @property
    def tracked_prompts(self) -> int:
        return len(self._records)

    def qualify_probability(self, keys: Sequence) -> np.ndarray:
        """Predicted chance that each prompt's next group qualifies (1 for a prompt without history)."""
        keys = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        history = np.array([self._records.get(key, (0.0, 0.0))[:2] for key in keys], dtype=np.float64).reshape(-1, 2)
        right, seen = history[:, 0], history[:, 1]
        known = seen > 0
        probability = np.ones(len(keys))
        if known.any() and self._group_size:
            alpha, beta = PRIOR[0] + right[known], PRIOR[1] + seen[known] - right[known]
            pmf = beta_binomial_pmf(self._group_size, alpha, beta)
            probability[known] = pmf @ self._qualifying(self._group_size)
        return probability

    # ---------------------------------------------------------------- decisions and outcomes

    def begin_step(self) -> None:
        self._step = SkipTally()
        self.step_skipped_keys = []

    def choose(self, keys: Sequence) -> np.ndarray:
        """Which of the prompts ``keys`` to generate (True) and which to skip (False), in order."""
        keys = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        predicted = self.qualify_probability(keys)
        candidate = predicted < self.settings.max_qualify_probability
        generate = np.ones(len(keys), dtype=bool)
        tally = self._step
        tally.considered_prompts += len(keys)
        tally.candidate_prompts += int(np.count_nonzero(candidate))
        for position in np.flatnonzero(candidate).tolist():
            record = self._records[keys[position]]
            if record[SKIPS] >= self.settings.max_consecutive_skips:
                tally.forced_prompts += 1
            elif self._rng.random() >= self._explore:
                generate[position] = False
                record[SKIPS] += 1
                record[SKIPPED] = 1
                tally.skipped_prompts += 1
                tally.skipped_easy_prompts += int(record[EASY])
                tally.predicted_qualify_skipped += float(predicted[position])
                self.step_skipped_keys.append(keys[position])
                continue
            record[SKIPS] = 0
        for position in np.flatnonzero(~candidate).tolist():  # generated without a draw
            record = self._records.get(keys[position])
            if record is not None:
                record[SKIPS] = 0
        return generate

    def record(self, keys: Sequence, right: np.ndarray, sizes: np.ndarray, qualified: np.ndarray) -> None:
        """Outcomes of generated groups: prompt key, right responses, responses, whether the group qualified."""
        tally = self._step
        keys = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        decay = self.settings.history_decay
        for key, hits, size, kept in zip(keys, np.asarray(right, dtype=np.float64).tolist(),
                                         np.asarray(sizes).tolist(), np.asarray(qualified).tolist()):
            record = self._records.setdefault(key, [0.0, 0.0, 0, 0, 0])
            if record[SKIPPED]:
                tally.generated_after_skip += 1
                tally.qualified_after_skip += int(kept)
            record[RIGHT] = record[RIGHT] * decay + hits
            record[SEEN] = record[SEEN] * decay + size
            record[EASY] = int(2 * hits > size)
            record[SKIPPED] = 0
            self._group_size = int(size)

    def end_step(self, generated_groups: int, kept_groups: int) -> dict[str, float]:
        """Adapt ``explore`` to the step's keep rate; the step's metrics (names without prefix)."""
        tally = self._step
        explore_used = self._explore
        if generated_groups:
            settings = self.settings
            direction = -1.0 if kept_groups / generated_groups < settings.target_keep_rate else 1.0
            self._explore = min(max(self._explore + direction * settings.explore_step, settings.explore_min), 1.0)
        for name, value in asdict(tally).items():
            setattr(self._run, name, getattr(self._run, name) + value)
        return {
            "skipped_prompts": tally.skipped_prompts,
            "skipped_easy_prompts": tally.skipped_easy_prompts,
            "considered_prompts": tally.considered_prompts,
            "candidate_prompts": tally.candidate_prompts,
            "skipped_fraction": tally.skipped_prompts / max(tally.considered_prompts, 1),
            "forced_prompts": tally.forced_prompts,
            "skip_probability": 1.0 - explore_used,
            "predicted_qualify_of_skipped": tally.predicted_qualify_skipped / max(tally.skipped_prompts, 1),
            "generated_after_skip": tally.generated_after_skip,
            "qualified_after_skip": tally.qualified_after_skip,
            "total_skipped_prompts": self._run.skipped_prompts,
            "total_generated_after_skip": self._run.generated_after_skip,
            "total_qualified_after_skip": self._run.qualified_after_skip,
            "tracked_prompts": self.tracked_prompts,
        }

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict:
        return {
            "explore": self._explore,
            "group_size": self._group_size,
            "keys": list(self._records),
            "records": np.array(list(self._records.values()), dtype=np.float64).reshape(-1, 5),
            "rng": self._rng.bit_generator.state,
            "step": asdict(self._step),
            "run": asdict(self._run),
        }

    def load_state_dict(self, state: dict) -> None:
        self._explore = float(state["explore"])
        self._group_size = int(state["group_size"])
        self._records = {
            key: [float(row[RIGHT]), float(row[SEEN]), int(row[SKIPS]), int(row[SKIPPED]), int(row[EASY])]
            for key, row in zip(state["keys"], state["records"])
        }
        self._rng.bit_generator.state = state["rng"]
        self._step = SkipTally(**state["step"])
        self._run = SkipTally(**state["run"])

    # ---------------------------------------------------------------- helpers

    def _qualifying(self, n: int) -> np.ndarray:
        """[n + 1] 1.0 where a group of n binary answers with that many right qualifies under the keep rule."""
        if n not in self._qualifying_counts:
            right = np.arange(n + 1)
            rate = right / n
            varied = (right > 0) & (right < n)
            view = GroupView(
                sizes=np.full(n + 1, n), mean=rate, std=np.sqrt(rate * (1 - rate)), spread=varied.astype(float),
                success_rate=rate, varied=varied & (1.0 > self._tolerance),
            )
            keep = np.asarray(self._keep_rule(view), dtype=bool) | (n == 1)
            self._qualifying_counts[n] = keep.astype(np.float64)
        return self._qualifying_counts[n]


def beta_binomial_pmf(n: int, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """[k, n + 1]: P(x right of n) when the pass rate is Beta(alpha, beta), for k (alpha, beta) pairs."""
    alpha, beta = np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)
    pmf = np.empty((alpha.shape[0], n + 1))
    steps = np.arange(n)
    pmf[:, 0] = np.prod((beta[:, None] + steps) / (alpha[:, None] + beta[:, None] + steps), axis=1)
    for x in range(n):  # P(x + 1) / P(x) = (n - x) / (x + 1) * (alpha + x) / (beta + n - x - 1)
        pmf[:, x + 1] = pmf[:, x] * (n - x) / (x + 1) * (alpha + x) / (beta + n - x - 1)
    return pmf


def take_unskipped(stream: Any, skipper: PromptSkipper, ops: BatchOps, count: int) -> Any:
    """``count`` prompts from ``stream`` that ``skipper`` chose to generate, in stream order: each skipped prompt is
    replaced by the next one. Ends, because every prompt is generated after ``max_consecutive_skips`` skips."""
    pieces, have = [], 0
    while have < count:
        batch = stream.take(count - have)
        generate = skipper.choose(ops.prompt_keys(batch))
        kept = int(np.count_nonzero(generate))
        if kept == len(generate):
            pieces.append(batch)
        elif kept:
            pieces.append(ops.select(batch, np.flatnonzero(generate)))
        have += kept
    return pieces[0] if len(pieces) == 1 else ops.concat(pieces)
