"""Pre-rollout skipping (GRESO, arXiv 2506.02177): leave out, before generation, prompts whose recent groups did
not qualify, and draw the next prompts in their place.

Per prompt key (``prompt_keys``) the skipper remembers:

    streak    how many of the prompt's most recent groups in a row did not qualify (0 after one that did)
    skips     how many times in a row the prompt was skipped (0 once it is chosen for generation)
    easy      whether its last non-qualifying group was mostly right (success rate above 1/2) or mostly wrong

When a prompt comes up for a round (:meth:`PromptSkipper.choose`)::

    streak == 0                              generate (new, or its last group qualified)
    skips >= max_consecutive_skips           generate (the bound: no prompt is left out for longer)
    otherwise                                skip with probability 1 - explore ** streak

so one non-qualifying group makes a skip likely (1 - explore) and each further one more so. After every step
that generated groups (:meth:`PromptSkipper.end_step`), ``explore`` moves toward the target keep rate: down by
``explore_step`` when fewer than ``target_keep_rate`` of the step's generated groups qualified (skip more), up
otherwise (skip less), within [``explore_min``, 1]; at 1 nothing is skipped. The draws come from the skipper's own
generator, seeded from the config and saved in :meth:`state_dict`, so a resumed run decides exactly as the
uninterrupted one.

A skipped prompt is not generated this time round; the data order is unchanged, so it comes up again in a later
epoch. :func:`take_unskipped` is the one place prompts are filtered: the sampler's ``take_prompts``, which every
round source (the trainer's, a simulated one, a future replay-buffer source) gets its prompts through.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from recipe_dapo.dynamic_sampling.batch_ops import BatchOps

STREAK, SKIPS, SKIPPED, EASY = range(4)
"""Columns of a prompt's record: non-qualifying streak, skips in a row, skipped since last generated, last
non-qualifying group mostly right."""


@dataclass
class SkipTally:
    """What the skipper did in one step (or, summed, over the run)."""

    considered_prompts: int = 0  # prompts that came up for a round
    skipped_prompts: int = 0
    skipped_easy_prompts: int = 0  # skipped after a mostly-right non-qualifying group
    forced_prompts: int = 0  # generated only because of max_consecutive_skips
    skip_probability_sum: float = 0.0  # over the prompts with a non-qualifying streak
    eligible_prompts: int = 0  # prompts with a non-qualifying streak
    generated_after_skip: int = 0  # groups of prompts skipped since they were last generated
    qualified_after_skip: int = 0  # ... of which qualified


class PromptSkipper:
    """Per-prompt history of group outcomes and the skip decision (see the module docstring)."""

    def __init__(self, settings: Any, seed: int):
        """``settings``: ``config.SkipSettings`` (target_keep_rate, explore_init / _min / _step,
        max_consecutive_skips)."""
        self.settings = settings
        self._rng = np.random.default_rng(seed)
        self._explore = float(settings.explore_init)
        self._records: dict[Any, list[int]] = {}
        self._step = SkipTally()
        self._run = SkipTally()
        self.step_skipped_keys: list = []
        """Keys skipped in the current step, in order (for reports; not saved)."""

    @property
    def explore(self) -> float:
        """The exploration probability now: a prompt with a streak of z is generated with probability explore^z."""
        return self._explore

    @property
    def tracked_prompts(self) -> int:
        return len(self._records)

    def skip_probability(self, key: Any) -> float:
        """Probability that ``key`` is skipped if it comes up now."""
        record = self._records.get(key)
        if record is None or record[STREAK] == 0 or record[SKIPS] >= self.settings.max_consecutive_skips:
            return 0.0
        return 1.0 - self._explore ** record[STREAK]

    # ---------------------------------------------------------------- decisions and outcomes

    def begin_step(self) -> None:
        self._step = SkipTally()
        self.step_skipped_keys = []

    def choose(self, keys: Sequence) -> np.ndarray:
        """Which of the prompts ``keys`` to generate (True) and which to skip (False), in order."""
        keys = keys.tolist() if isinstance(keys, np.ndarray) else keys
        generate = np.ones(len(keys), dtype=bool)
        tally = self._step
        tally.considered_prompts += len(keys)
        for position, key in enumerate(keys):
            record = self._records.get(key)
            if record is None or record[STREAK] == 0:
                continue
            tally.eligible_prompts += 1
            if record[SKIPS] >= self.settings.max_consecutive_skips:
                tally.forced_prompts += 1
                record[SKIPS] = 0
                continue
            probability = 1.0 - self._explore ** record[STREAK]
            tally.skip_probability_sum += probability
            if self._rng.random() < probability:
                generate[position] = False
                record[SKIPS] += 1
                record[SKIPPED] = 1
                tally.skipped_prompts += 1
                tally.skipped_easy_prompts += record[EASY]
                self.step_skipped_keys.append(key)
            else:
                record[SKIPS] = 0
        return generate

    def record(self, keys: Sequence, qualified: np.ndarray, mostly_right: np.ndarray) -> None:
        """Outcomes of generated groups: the prompt key, whether the group qualified, whether it was mostly right."""
        tally = self._step
        keys = keys.tolist() if isinstance(keys, np.ndarray) else keys
        for key, kept, right in zip(keys, np.asarray(qualified).tolist(), np.asarray(mostly_right).tolist()):
            record = self._records.setdefault(key, [0, 0, 0, 0])
            if record[SKIPPED]:
                tally.generated_after_skip += 1
                tally.qualified_after_skip += int(kept)
            record[STREAK] = 0 if kept else record[STREAK] + 1
            record[EASY] = 0 if kept else int(right)
            record[SKIPPED] = 0

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
        considered = max(tally.considered_prompts, 1)
        return {
            "skipped_prompts": tally.skipped_prompts,
            "skipped_easy_prompts": tally.skipped_easy_prompts,
            "considered_prompts": tally.considered_prompts,
            "skipped_fraction": tally.skipped_prompts / considered,
            "forced_prompts": tally.forced_prompts,
            "explore_probability": explore_used,
            "mean_skip_probability": tally.skip_probability_sum / max(tally.eligible_prompts - tally.forced_prompts, 1),
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
            "keys": list(self._records),
            "records": np.array(list(self._records.values()), dtype=np.int64).reshape(-1, 4),
            "rng": self._rng.bit_generator.state,
            "step": asdict(self._step),
            "run": asdict(self._run),
        }

    def load_state_dict(self, state: dict) -> None:
        self._explore = float(state["explore"])
        self._records = {key: [int(v) for v in row] for key, row in zip(state["keys"], state["records"])}
        self._rng.bit_generator.state = state["rng"]
        self._step = SkipTally(**state["step"])
        self._run = SkipTally(**state["run"])


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
