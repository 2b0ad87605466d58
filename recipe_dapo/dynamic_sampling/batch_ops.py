"""How the sampler touches a payload it does not understand: select rows, concatenate, count rows, read the
rows' prompt keys (``prompt_keys``; only prompt skipping needs them).

The sampler never looks inside a round's rollouts; it only decides which rows to keep and in what order.
The operations are injected so that the same logic runs on numpy arrays (tests, simulations) and on
verl's ``DataProto`` (the trainer) without this package importing verl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from recipe_dapo.dynamic_sampling.prompt_keys import dataproto_prompt_keys, numpy_prompt_keys


@dataclass(frozen=True)
class BatchOps:
    """Row operations on an opaque batch.

    select(batch, rows) -> batch   rows: 1-D int64 array of row indices, in the order wanted
    concat(batches) -> batch       batches: non-empty list, concatenated along rows in list order
    length(batch) -> int           number of rows (trajectories)
    prompt_keys(batch) -> array    the stable key of each row's prompt (``prompt_keys``), same for a prompt's
                                   responses and across epochs
    """

    select: Callable[[Any, np.ndarray], Any]
    concat: Callable[[Sequence[Any]], Any]
    length: Callable[[Any], int] = len
    prompt_keys: Callable[[Any], np.ndarray] = numpy_prompt_keys


def _concat_arrays(batches: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(list(batches), axis=0)


def _select_dataproto(batch: Any, rows: np.ndarray) -> Any:
    return batch.select_idxs(rows)


def _concat_dataproto(batches: Sequence[Any]) -> Any:
    # DataProto.concat is a staticmethod; going through the class keeps subclasses (and no verl import).
    return type(batches[0]).concat(list(batches))


NUMPY_OPS = BatchOps(select=lambda batch, rows: batch[rows], concat=_concat_arrays, length=len,
                     prompt_keys=numpy_prompt_keys)
"""Rows of a numpy array (any dtype, including structured arrays): the default payload. Prompt keys: the array
itself, or its ``prompt_key`` field."""

DATAPROTO_OPS = BatchOps(select=_select_dataproto, concat=_concat_dataproto, length=len,
                         prompt_keys=dataproto_prompt_keys)
"""verl ``DataProto`` rows: ``select_idxs`` / ``DataProto.concat``. Tensors and non-tensor fields (for
example ``rollout_log_probs``) travel untouched. ``DataProto.concat`` asserts that non-metric ``meta_info``
keys agree, so keep per-round values (timing, global_steps) out of the payload's ``meta_info``. Prompt keys:
``data_source`` and ``extra_info.index``."""
