"""Reading source rows (local parquet/jsonl or a Hugging Face dataset) as :class:`ProblemRecord` s.

Two source layouts are understood, detected from the columns:

- **verl RL layout** (the DAPO release, the AIME/AMC parquet files): ``prompt`` (chat list) and
  ``reward_model.ground_truth``; the problem is the first user message, the source problem id is
  ``extra_info.index``.
- **flat layout** (MATH-500, GSM8K, most Hub copies): a problem column (``problem`` or ``question``) and an
  ``answer`` column; the source problem id is ``unique_id`` or ``id`` when present.

Each bad row raises :class:`~recipe_dapo.data.validation.RLDataError` naming the file, the row and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from recipe_dapo.data.validation import RLDataError, ground_truth_problem, require_columns

PROBLEM_COLUMNS = ("problem", "question")
ANSWER_COLUMN = "answer"
SOURCE_ID_COLUMNS = ("unique_id", "id")
_ROWS_PER_BATCH = 8192


@dataclass(frozen=True)
class ProblemRecord:
    """One source row: problem text (bare or already templated), raw answer and source problem id."""

    problem: str
    answer: Any
    source_id: str | None
    row: int
    answer_field: str = ANSWER_COLUMN
    """Where the answer came from, for error messages (``answer`` or ``reward_model.ground_truth``)."""


@dataclass(frozen=True)
class SourceRows:
    """Rows of one source with the columns it has and the name used in error messages."""

    name: str
    columns: tuple[str, ...]
    rows: Iterator[dict[str, Any]]
    num_rows: int | None


def read_local_rows(path: str | os.PathLike) -> SourceRows:
    """Stream the rows of a local ``.parquet`` or ``.jsonl`` file (other suffixes are refused)."""
    path = str(path)
    if not os.path.isfile(path):
        raise RLDataError(path, None, None, "file not found", "check the path, or DAPO_DATA_LOCAL_DIR's layout")
    if path.endswith(".parquet"):
        return _read_parquet_rows(path)
    if path.endswith(".jsonl"):
        return _read_jsonl_rows(path)
    raise RLDataError(path, None, None, "unsupported file type", "give a .parquet or .jsonl file")


def _read_parquet_rows(path: str) -> SourceRows:
    import pyarrow.parquet as pq

    try:
        parquet_file = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a non-parquet file
        raise RLDataError(path, None, None, f"not a readable parquet file ({error})") from error
    columns = tuple(parquet_file.schema_arrow.names)
    wanted = [
        c
        for c in columns
        if c in ("prompt", "reward_model", "extra_info", ANSWER_COLUMN) + PROBLEM_COLUMNS + SOURCE_ID_COLUMNS
    ]

    def rows() -> Iterator[dict[str, Any]]:
        for batch in parquet_file.iter_batches(batch_size=_ROWS_PER_BATCH, columns=wanted):
            yield from batch.to_pylist()

    return SourceRows(path, columns, rows(), parquet_file.metadata.num_rows)


def _read_jsonl_rows(path: str) -> SourceRows:
    with open(path, encoding="utf-8") as handle:
        first_line = handle.readline()
    try:
        first = json.loads(first_line) if first_line.strip() else {}
    except json.JSONDecodeError as error:
        raise RLDataError(path, 0, None, f"line 1 is not valid JSON ({error})") from error
    num_rows = _count_lines(path)

    def rows() -> Iterator[dict[str, Any]]:
        with open(path, encoding="utf-8") as handle:
            for row, line in enumerate(handle):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise RLDataError(path, row, None, f"line {row + 1} is not valid JSON ({error})") from error
                if not isinstance(record, dict):
                    raise RLDataError(path, row, None, f"line {row + 1} is not a JSON object")
                yield record

    return SourceRows(path, tuple(first), rows(), num_rows)


def _count_lines(path: str) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


HUB_TIMEOUT_S = 5.0
"""How long the Hub may take to answer before it counts as unreachable (one try, no retries)."""


class HubUnreachable(OSError):
    """The Hugging Face Hub cannot be reached: one line saying so, and how to prepare from local copies."""

    def __init__(self, reason: str):
        super().__init__(
            f"cannot reach the Hugging Face Hub ({reason}); without network, prepare from local copies: "
            f"DAPO_DATA_LOCAL_DIR=DIR bash scripts/prepare_data.sh OUT_DIR (or python -m recipe_dapo.data prepare "
            f"OUT_DIR --local-dir DIR), DIR laid out as `python -m recipe_dapo.data prepare --help` lists"
        )


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _offline_mode() -> str | None:
    """The variable that puts the Hub libraries offline, when one does."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    return None


def check_hub_reachable(timeout_s: float = HUB_TIMEOUT_S) -> None:
    """Raise :class:`HubUnreachable` when the Hub (``$HF_ENDPOINT``) does not answer within ``timeout_s`` (once, before
    any download, so a machine without network learns it in seconds instead of after the Hub client's retries)."""
    import urllib.error
    import urllib.request

    endpoint = hub_endpoint()
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise HubUnreachable(f"{endpoint}: {reason}") from None


def read_hub_rows(dataset_id: str, config: str | None, split: str, checked: bool = False) -> SourceRows:
    """Rows of a Hugging Face dataset (needs network and the ``datasets`` package; imported lazily). With
    ``HF_HUB_OFFLINE=1`` the ``datasets`` cache is read; without it the Hub is checked first
    (:func:`check_hub_reachable`; ``checked``: the caller did)."""
    offline = _offline_mode()
    if offline is None and not checked:
        check_hub_reachable()
    try:
        import datasets
    except ImportError as error:
        raise RLDataError(
            f"hf://{dataset_id}", None, None, "downloading needs the 'datasets' package",
            "pip install datasets, or set DAPO_DATA_LOCAL_DIR to a folder with local copies",
        ) from error
    try:
        dataset = datasets.load_dataset(dataset_id, config, split=split)
    except (ConnectionError, OSError) as error:
        if offline is None:
            raise
        raise HubUnreachable(f"{offline} is set and {dataset_id} is not in the datasets cache") from None
    return SourceRows(f"hf://{dataset_id}[{split}]", tuple(dataset.column_names), iter(dataset), len(dataset))


def iter_problem_records(
    source: SourceRows, answer_of: Callable[[Any], Any] = lambda answer: answer
) -> Iterator[ProblemRecord]:
    """Problems of ``source`` in either layout (module docstring); ``answer_of`` maps a flat answer cell.

    Column problems are raised here, at the call; row problems while iterating.
    """
    if "prompt" in source.columns:
        require_columns(source.name, source.columns, ("reward_model",))
        return _verl_layout_records(source)
    problem_column = next((c for c in PROBLEM_COLUMNS if c in source.columns), None)
    if problem_column is None:
        raise RLDataError(
            source.name,
            None,
            "prompt",
            f"no problem column (the file has {sorted(source.columns)})",
            "give a verl RL file ('prompt' + 'reward_model') or a flat one ('problem' or 'question' + 'answer')",
        )
    require_columns(source.name, source.columns, (ANSWER_COLUMN,))
    return _flat_layout_records(source, problem_column, answer_of)


def _verl_layout_records(source: SourceRows) -> Iterator[ProblemRecord]:
    for row, record in enumerate(source.rows):
        prompt = record.get("prompt")
        problem = prompt if isinstance(prompt, str) else _first_user_content(prompt, source.name, row)
        if not problem.strip():
            raise RLDataError(
                source.name, row, "prompt", "prompt is empty", "give the row its problem text or drop the row"
            )
        reward_model = record.get("reward_model")
        answer = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
        _require_answer(answer, source.name, row, "reward_model.ground_truth")
        extra_info = record.get("extra_info")
        source_id = extra_info.get("index") if isinstance(extra_info, Mapping) else None
        yield ProblemRecord(
            problem, answer, None if source_id is None else str(source_id), row, "reward_model.ground_truth"
        )


def _first_user_content(prompt: Any, name: str, row: int) -> str:
    messages = list(prompt) if prompt is not None and not isinstance(prompt, Mapping) else []
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
    raise RLDataError(name, row, "prompt", f"prompt is empty (no user message with text content): {prompt!r}")


def _flat_layout_records(
    source: SourceRows, problem_column: str, answer_of: Callable[[Any], Any]
) -> Iterator[ProblemRecord]:
    source_id_column = next((c for c in SOURCE_ID_COLUMNS if c in source.columns), None)
    for row, record in enumerate(source.rows):
        problem = record.get(problem_column)
        if problem is None:
            raise RLDataError(source.name, row, problem_column, "problem is missing", "give the row its problem text")
        if not isinstance(problem, str) or not problem.strip():
            raise RLDataError(
                source.name, row, problem_column, "prompt is empty", "give the row its problem text or drop the row"
            )
        raw_answer = record.get(ANSWER_COLUMN)
        _require_answer(raw_answer, source.name, row, ANSWER_COLUMN)
        answer = answer_of(raw_answer)
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            raise RLDataError(
                source.name,
                row,
                ANSWER_COLUMN,
                f"ground truth is empty: no final answer found in {str(raw_answer)[-80:]!r}",
                "end the answer with its final value (GSM8K: a last line '#### <number>')",
            )
        source_id = record.get(source_id_column) if source_id_column else None
        yield ProblemRecord(problem, answer, None if source_id is None else str(source_id), row)


def _require_answer(answer: Any, name: str, row: int, field: str) -> None:
    problem = ground_truth_problem(answer)
    if problem is not None:
        raise RLDataError(name, row, field, *problem)
