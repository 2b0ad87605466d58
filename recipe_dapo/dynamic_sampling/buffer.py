"""The pool of qualifying groups waiting to be trained on, oldest first.

Each round's kept groups enter as one *segment* (one payload, groups contiguous, one birth step), so
filling a batch costs one ``select`` per segment touched and one ``concat``, never one per group. Groups
leave in arrival order: what a step does not use stays for the next step (the surplus carry-over), and groups that
can no longer train within ``max_staleness`` steps of the step that generated them are dropped by the sampler (each
segment records that step: the groups' age and the metrics count from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from recipe_dapo.dynamic_sampling.batch_ops import BatchOps


@dataclass
class _Segment:
    payload: Any  # rows of this segment's groups, each group contiguous
    group_ids: np.ndarray  # [G]
    offsets: np.ndarray  # [G + 1] row boundaries of the groups inside ``payload``
    born_step: int  # training step during which the groups were generated (their age counts steps from it)
    start: int = 0  # groups before ``start`` have been taken already

    @property
    def remaining(self) -> int:
        return int(self.group_ids.shape[0]) - self.start

    def rows(self, first: int, count: int) -> np.ndarray:
        return np.arange(self.offsets[first], self.offsets[first + count], dtype=np.int64)


@dataclass(frozen=True)
class TakenGroups:
    """Groups removed from the pool, in order: payload pieces to concatenate, and per-group facts."""

    pieces: list
    group_ids: np.ndarray  # [k]
    born_steps: np.ndarray  # [k]


class GroupBuffer:
    """FIFO of whole groups over opaque payloads."""

    def __init__(self, ops: BatchOps):
        self._ops = ops
        self._segments: list[_Segment] = []

    @property
    def num_groups(self) -> int:
        return sum(segment.remaining for segment in self._segments)

    def group_ids(self) -> np.ndarray:
        """Ids of all pooled groups, oldest first."""
        if not self._segments:
            return np.empty(0, dtype=object)
        return np.concatenate([segment.group_ids[segment.start :] for segment in self._segments])

    def add(self, payload: Any, group_ids: np.ndarray, offsets: np.ndarray, born_step: int) -> None:
        """Add groups (after every pooled group born no later): group g of ``group_ids`` is rows ``offsets[g]:offsets[g + 1]`` of ``payload``, generated
        during training step ``born_step``."""
        if group_ids.shape[0] == 0:
            return
        if offsets.shape[0] != group_ids.shape[0] + 1 or int(offsets[-1]) != self._ops.length(payload):
            raise ValueError(
                f"segment of {group_ids.shape[0]} groups ends at row {int(offsets[-1])} but its payload has "
                f"{self._ops.length(payload)} rows"
            )
        segment = _Segment(payload, np.asarray(group_ids), np.asarray(offsets, np.int64), int(born_step))
        # Oldest first by birth, not by arrival: a streaming source with partial rollouts returns groups of an earlier
        # step after groups of this one, and those are the ones that must train first (or be dropped first).
        at = len(self._segments)
        while at > 0 and self._segments[at - 1].born_step > segment.born_step:
            at -= 1
        self._segments.insert(at, segment)

    def payloads_by_step(self) -> list[tuple[Any, int]]:
        """Each segment's payload (whole, taken rows included) with the training step its groups were generated in,
        oldest first."""
        return [(segment.payload, segment.born_step) for segment in self._segments]

    def drop_born_before(self, step: int) -> np.ndarray:
        """Remove groups generated before training step ``step``; returns the ids of the groups dropped."""
        dropped = [s.group_ids[s.start :] for s in self._segments if s.born_step < step]
        self._segments = [s for s in self._segments if s.born_step >= step]
        return np.concatenate(dropped) if dropped else np.empty(0, dtype=object)

    def take(self, count: int) -> TakenGroups:
        """Remove the ``count`` oldest groups (all of them if fewer are pooled)."""
        pieces, ids, born = [], [], []
        while count > 0 and self._segments:
            segment = self._segments[0]
            n = min(count, segment.remaining)
            if segment.start == 0 and n == segment.remaining:
                pieces.append(segment.payload)  # the whole segment: no copy
            else:
                pieces.append(self._ops.select(segment.payload, segment.rows(segment.start, n)))
            ids.append(segment.group_ids[segment.start : segment.start + n])
            born.append(np.full(n, segment.born_step, dtype=np.int64))
            segment.start += n
            count -= n
            if segment.remaining == 0:
                self._segments.pop(0)
        return TakenGroups(
            pieces=pieces,
            group_ids=np.concatenate(ids) if ids else np.empty(0, dtype=object),
            born_steps=np.concatenate(born) if born else np.empty(0, dtype=np.int64),
        )

    def state_dict(self, compact: bool = True) -> list[dict]:
        """The pooled groups (payloads included), compacted so that taken rows are not saved; ``compact=False``: the
        segments as they stand (payloads shared, not copied, with how many groups each has given), for a state kept
        in memory and loaded back in this process."""
        if not compact:
            return [{"payload": s.payload, "group_ids": s.group_ids, "offsets": s.offsets, "born_step": s.born_step,
                     "start": s.start} for s in self._segments]
        state = []
        for segment in self._segments:
            payload, offsets = segment.payload, segment.offsets
            if segment.start:
                payload = self._ops.select(payload, segment.rows(segment.start, segment.remaining))
                offsets = offsets[segment.start :] - offsets[segment.start]
            state.append(
                {
                    "payload": payload,
                    "group_ids": segment.group_ids[segment.start :],
                    "offsets": offsets,
                    "born_step": segment.born_step,
                }
            )
        return state

    def load_state_dict(self, state: list[dict]) -> None:
        self._segments = []
        for segment in state:
            self.add(segment["payload"], segment["group_ids"], segment["offsets"], int(segment["born_step"]))
            if self._segments:
                self._segments[-1].start = int(segment.get("start", 0))
