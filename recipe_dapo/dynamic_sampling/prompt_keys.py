"""A stable key per prompt, so that skipping can remember how a prompt's groups went across epochs.

verl's ``uid`` is fresh for every prompt *instance*; the key names the prompt itself. In verl's RL parquet layout it
is the row's ``data_source`` and ``extra_info.index`` (``recipe_dapo.data.convert`` numbers every output row, and the
DAPO releases give every copy of one problem the same index), read as ``"<data_source>#<index>"``. verl's dataset
fills a missing index with 0, so the key is read from ``extra_info`` itself, and a row without one is an error, not
key 0 shared by every prompt.

Numpy payloads (tests, ``bench/dynamic_sampling_sim.py``) carry the key themselves: a 1-D array of prompt keys, or
a structured array with a ``prompt_key`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

KEY_FIELD = "prompt_key"


class PromptKeyError(ValueError):
    """A prompt has no stable key, so its groups' outcomes cannot be remembered."""


def prompt_key(data_source: Any, extra_info: Any) -> Optional[str]:
    """``"<data_source>#<extra_info.index>"``, or None when the row has no ``extra_info.index``."""
    index = extra_info.get("index") if isinstance(extra_info, Mapping) else None
    if index is None:
        return None
    return f"{'' if data_source is None else data_source}#{index}"


def dataproto_prompt_keys(batch: Any) -> np.ndarray:
    """The key of every row of a verl ``DataProto`` (prompts or rollouts), from its non-tensor fields."""
    fields = batch.non_tensor_batch
    rows = len(batch)
    if "extra_info" not in fields:
        raise PromptKeyError(_missing("the batch has no extra_info field", list(range(min(rows, 5)))))
    sources = fields.get("data_source", np.full(rows, None, dtype=object))
    keys = np.array([prompt_key(s, e) for s, e in zip(sources, fields["extra_info"])], dtype=object)
    missing = [row for row, key in enumerate(keys) if key is None]
    if missing:
        raise PromptKeyError(_missing(f"{len(missing)} of {rows} rows have no extra_info.index", missing[:5]))
    return keys


def numpy_prompt_keys(batch: np.ndarray) -> np.ndarray:
    """A 1-D array of keys, or the ``prompt_key`` field of a structured array."""
    names = batch.dtype.names
    if names is None:
        return batch
    if KEY_FIELD not in names:
        raise PromptKeyError(f"a structured payload needs a '{KEY_FIELD}' field for skipping (fields: {list(names)})")
    return batch[KEY_FIELD]


def _missing(what: str, rows: list[int]) -> str:
    return (
        f"dapo.dynamic_sampling.skip needs a stable key per prompt (data_source and extra_info.index): {what} "
        f"(rows {rows}); prepare the data with scripts/prepare_data.sh (recipe_dapo.data.convert numbers every row) "
        "or set dapo.dynamic_sampling.skip.enable=false"
    )
