"""Prompts handed out in any amount, across dataloader batches and epochs.

Deficit-sized rounds ask for numbers of prompts that do not match the dataloader's batch size. The stream
keeps the unused rest of the last batch (the *leftover*) and pulls further batches as needed; at the end
of an epoch it asks ``open_epoch(epoch + 1)`` for the next one, so a step never stops at an epoch end.

Resume: ``state_dict`` holds the epoch and the leftover prompts. The dataloader's own position is the
trainer's to restore (verl saves ``StatefulDataLoader.state_dict()`` in its checkpoint); after
``load_state_dict`` the next ``take`` calls ``open_epoch(epoch)``, which must then continue where the
restored dataloader stopped (``iter(stateful_dataloader)`` does).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from recipe_dapo.dynamic_sampling.batch_ops import NUMPY_OPS, BatchOps

logger = logging.getLogger(__name__)


class PromptStream:
    """Take exactly ``n`` prompts at a time from a sequence of epochs of batches."""

    def __init__(self, open_epoch: Callable[[int], Iterable[Any]], ops: BatchOps = NUMPY_OPS, epoch: int = 0):
        self._open_epoch = open_epoch
        self._ops = ops
        self._epoch = epoch
        self._iterator: Optional[Iterator[Any]] = None
        self._leftover: Any = None
        self._prompts_taken = 0

    @property
    def epoch(self) -> int:
        """The epoch the next prompt comes from (or the leftover's epoch)."""
        return self._epoch

    @property
    def prompts_taken(self) -> int:
        return self._prompts_taken

    def take(self, count: int) -> Any:
        """The next ``count`` prompts as one batch, in dataloader order."""
        if count < 1:
            raise ValueError(f"take() needs a positive number of prompts, got {count}")
        pieces, have = [], 0
        if self._leftover is not None:
            pieces.append(self._leftover)
            have = self._ops.length(self._leftover)
            self._leftover = None
        while have < count:
            batch = self._next_batch()
            pieces.append(batch)
            have += self._ops.length(batch)
        joined = pieces[0] if len(pieces) == 1 else self._ops.concat(pieces)
        if have > count:
            self._leftover = self._ops.select(joined, np.arange(count, have))
            joined = self._ops.select(joined, np.arange(count))
        self._prompts_taken += count
        return joined

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "leftover": self._leftover, "prompts_taken": self._prompts_taken}

    def load_state_dict(self, state: dict) -> None:
        self._epoch = int(state["epoch"])
        self._leftover = state["leftover"]
        self._prompts_taken = int(state["prompts_taken"])
        self._iterator = None  # reopened lazily from the (restored) dataloader

    def _next_batch(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._open_epoch(self._epoch))
        batch = next(self._iterator, None)
        if batch is None:  # the epoch ended: roll over
            self._epoch += 1
            logger.info("prompt stream: starting epoch %d", self._epoch)
            self._iterator = iter(self._open_epoch(self._epoch))
            batch = next(self._iterator, None)
        if batch is None:
            raise RuntimeError(
                f"the dataloader yielded no prompts for epoch {self._epoch}; check data.train_files and that "
                "the dataset is not empty after filtering overlong prompts"
            )
        return batch
