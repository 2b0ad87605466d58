"""Row checks for verl's RL parquet layout, run before anything heavy starts.

A verl RL row, as ``verl.utils.dataset.RLHFDataset`` and the reward managers read it::

    data_source:  non-empty string (selects the metric group and, in verl's default scorer, the scorer)
    prompt:       non-empty list of chat messages {"role": str, "content": str}, at least one non-blank content;
                  roles among system, user, assistant, tool; the last message is the user's (the one answered)
    reward_model: {"ground_truth": non-blank string (or number, or a non-empty list of them), "style": ...}
    ability, extra_info: optional

A ground truth that is a missing value in disguise is refused like a missing one: ``None``, a float NaN, and
strings that are empty or, once stripped, ``nan``/``none``/``null`` in any case (what pandas or a JSON
export writes for a missing answer; no DAPO-Math-17k, AIME, AMC, MATH-500 or GSM8K answer is one of them).
So is every shape the recipe's reward cannot read (``reward.verifier.ground_truth_answers``: a string, a number or a
non-empty list of them): a dict, a boolean, bytes that are not UTF-8, any other object. A user's reward function
(``reward.custom_reward_function``) reads what it reads: with one, only missing and empty ground truths are refused
(``readable_shapes_only=False``).

Every failure raises :class:`RLDataError`, whose message names the file, the row (0-based, as pandas
numbers it) and the field, and says how to fix it.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REQUIRED_RL_COLUMNS = ("data_source", "prompt", "reward_model")
CHAT_ROLES = ("system", "user", "assistant", "tool")
"""The chat roles a prompt message may have."""
NULL_LIKE_ANSWERS = frozenset({"nan", "none", "null"})
"""Ground-truth strings (after stripping, any case) that are a missing value written as text."""
_ROWS_PER_BATCH = 4096


class RLDataError(ValueError):
    """Bad input data: ``path``, 0-based ``row`` (None for file-level problems) and ``field`` say where."""

    def __init__(self, path: str | os.PathLike, row: int | None, field: str | None, problem: str, fix: str = ""):
        self.path = str(path)
        self.row = row
        self.field = field
        self.problem = problem
        where = [self.path]
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        message = ", ".join(where) + f": {problem}"
        if fix:
            message += f". Fix: {fix}"
        super().__init__(message)


def require_columns(path: str | os.PathLike, available: Iterable[str], required: Sequence[str]) -> None:
    """Raise :class:`RLDataError` naming the first required column that ``available`` lacks."""
    available = set(available)
    for column in required:
        if column not in available:
            raise RLDataError(
                path,
                None,
                column,
                f"column is missing (the file has {sorted(available)})",
                f"add a '{column}' column, or convert the file with data_prep/ (see scripts/prepare_data.sh)",
            )


def validate_rl_record(
    record: Mapping[str, Any], path: str | os.PathLike, row: int, prompt_key: str = "prompt",
    readable_shapes_only: bool = True,
) -> None:
    """Check one verl RL row (layout in the module docstring); raise :class:`RLDataError` on the first problem."""
    data_source = record.get("data_source")
    if not isinstance(data_source, str) or not data_source.strip():
        raise RLDataError(path, row, "data_source", f"must be a non-empty string, got {data_source!r}")
    _check_prompt(record.get(prompt_key), path, row, prompt_key)
    _check_reward_model(record.get("reward_model"), path, row, readable_shapes_only)


def _check_prompt(prompt: Any, path, row: int, prompt_key: str) -> None:
    if prompt is None or isinstance(prompt, (str, bytes, Mapping)) or not isinstance(prompt, Iterable):
        raise RLDataError(
            path,
            row,
            prompt_key,
            f"must be a list of chat messages, got {type(prompt).__name__}",
            'write it as [{"role": "user", "content": "<problem>"}]',
        )
    messages = list(prompt)
    if not messages:
        raise RLDataError(path, row, prompt_key, "prompt is empty (no messages)", "give the row its problem text")
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RLDataError(path, row, f"{prompt_key}[{position}].role", f"message {message!r} has no string role")
        if message["role"] not in CHAT_ROLES:
            raise RLDataError(
                path,
                row,
                f"{prompt_key}[{position}].role",
                f"role {message['role']!r} is not one of {', '.join(CHAT_ROLES)}",
                "use the chat roles of verl's chat template",
            )
        if not isinstance(message.get("content"), str):
            raise RLDataError(
                path, row, f"{prompt_key}[{position}].content", f"content must be a string, got {message!r}"
            )
    if messages[-1]["role"] != "user":
        raise RLDataError(
            path,
            row,
            f"{prompt_key}[{len(messages) - 1}].role",
            f"the last message is the {messages[-1]['role']!r} one, not the 'user' one (the model answers the last "
            "user message)",
            "end the prompt with the user's message",
        )
    if not any(message["content"].strip() for message in messages):
        raise RLDataError(
            path,
            row,
            f"{prompt_key}[0].content",
            "prompt is empty (every message content is blank)",
            "give the row its problem text or drop the row",
        )


def _check_reward_model(reward_model: Any, path, row: int, readable_shapes_only: bool = True) -> None:
    if not isinstance(reward_model, Mapping):
        raise RLDataError(
            path,
            row,
            "reward_model",
            f"must be a struct with a ground_truth, got {reward_model!r}",
            'write it as {"ground_truth": "<answer>", "style": "rule"}',
        )
    problem = ground_truth_problem(reward_model.get("ground_truth"), readable_shapes_only)
    if problem is not None:
        raise RLDataError(path, row, "reward_model.ground_truth", *problem)


def ground_truth_problem(ground_truth: Any, readable_shapes_only: bool = True) -> tuple[str, str] | None:
    """``(problem, fix)`` when ``ground_truth`` is missing, empty or null-like, or (``readable_shapes_only``) a shape
    the recipe's reward cannot read (module docstring), else None.

    A list (several acceptable answers) must be non-empty and each of its items pass.

    >>> ground_truth_problem("42") is None, ground_truth_problem(" NaN ")[0]
    (True, "ground truth is ' NaN ' (a missing value written as text)")
    >>> ground_truth_problem({"answer": "42"})[0]
    "ground truth is a dict ({'answer': '42'}): the reward reads a string, a number or a list of them"
    """
    unreadable = _unreadable_shape(ground_truth) if readable_shapes_only else None
    if unreadable is not None:
        return unreadable
    if ground_truth is None:
        return "ground truth is missing", "give the row its reference answer"
    if isinstance(ground_truth, str):
        text = ground_truth.strip()
        if not text:
            return "ground truth is empty", "give the row its reference answer or drop the row"
        if text.lower() in NULL_LIKE_ANSWERS:
            return (
                f"ground truth is {ground_truth!r} (a missing value written as text)",
                "give the row its reference answer or drop the row",
            )
        return None
    if isinstance(ground_truth, float) and math.isnan(ground_truth):
        return "ground truth is NaN (a missing value)", "give the row its reference answer or drop the row"
    if isinstance(ground_truth, (int, float, bool)):
        return None
    if isinstance(ground_truth, bytes):
        return ground_truth_problem(ground_truth.decode("utf-8", errors="replace"), readable_shapes_only)
    if hasattr(ground_truth, "tolist"):  # numpy scalars and arrays
        return ground_truth_problem(ground_truth.tolist(), readable_shapes_only)
    if isinstance(ground_truth, (list, tuple)):
        for item in ground_truth:
            problem = ground_truth_problem(item, readable_shapes_only)
            if problem is not None:
                return f"an item of the list: {problem[0]}", problem[1]
    try:
        empty = len(ground_truth) == 0
    except TypeError:
        empty = False
    if empty:
        return "ground truth is empty", "give the row its reference answer or drop the row"
    return None


def _unreadable_shape(ground_truth: Any) -> tuple[str, str] | None:
    """``(problem, fix)`` when the recipe's reward cannot read ``ground_truth`` at all (items of a list included)."""
    fix = "store the answer itself in reward_model.ground_truth: a string, a number, or a list of acceptable answers"
    if ground_truth is None or isinstance(ground_truth, (str, numbers.Number)) and not isinstance(ground_truth, bool):
        return None
    if isinstance(ground_truth, bool):
        return f"ground truth is a boolean ({ground_truth!r}): the reward reads a string, a number or a list of them", (
            "write the answer as text (\"True\", \"Yes\") if that is the answer")
    if isinstance(ground_truth, bytes):
        try:
            ground_truth.decode("utf-8")
        except UnicodeDecodeError:
            return "ground truth is bytes that are not UTF-8", "store reward_model.ground_truth as text"
        return None
    if hasattr(ground_truth, "tolist") and not isinstance(ground_truth, Mapping):  # numpy scalars and arrays
        return _unreadable_shape(ground_truth.tolist())
    if isinstance(ground_truth, (list, tuple)):
        for item in ground_truth:
            problem = _unreadable_shape(item)
            if problem is not None:
                return f"an item of the list: {problem[0]}", problem[1]
        return None
    shown = repr(ground_truth)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    kind = "a dict" if isinstance(ground_truth, Mapping) else f"of type {type(ground_truth).__name__}"
    return f"ground truth is {kind} ({shown}): the reward reads a string, a number or a list of them", fix


def validate_rl_parquet(path: str | os.PathLike, prompt_key: str = "prompt", readable_shapes_only: bool = True) -> int:
    """Check every row of a verl RL parquet file and return its row count.

    Reads only the checked columns, in record batches, so it is cheap enough to run at trainer
    start-up on the train and validation files. Raises :class:`RLDataError` on a missing file, a
    missing column, an empty file or the first bad row.
    """
    import pyarrow.parquet as pq

    if not os.path.isfile(path):
        raise RLDataError(path, None, None, "file not found", "check data.train_files / data.val_files or --data")
    try:
        parquet_file = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a non-parquet file
        raise RLDataError(path, None, None, f"not a readable parquet file ({error})") from error
    columns = tuple(dict.fromkeys((REQUIRED_RL_COLUMNS[0], prompt_key) + REQUIRED_RL_COLUMNS[2:]))
    require_columns(path, parquet_file.schema_arrow.names, columns)
    row = 0
    for batch in parquet_file.iter_batches(batch_size=_ROWS_PER_BATCH, columns=list(columns)):
        for record in batch.to_pylist():
            validate_rl_record(record, path, row, prompt_key, readable_shapes_only)
            row += 1
    if row == 0:
        raise RLDataError(path, None, None, "file has no rows")
    return row
