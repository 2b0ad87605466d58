"""Source rows -> verl RL parquet rows with the DAPO template, deduplicated and validated.

Every output row::

    data_source:  the spec's tag (``math_dapo``, ``aime24``, ``aime25``, ``amc23``, ``math500``, ``gsm8k``)
    prompt:       [{"role": "user", "content": DAPO template around the problem}]   (never doubled)
    ability:      "math"
    reward_model: {"ground_truth": normalize_ground_truth(answer), "style": "rule"}
    extra_info:   {"index": 0-based output row, "split": "train"/"test",
                   "source_id": the source's problem id ("" when it has none), "raw_problem": bare problem}

Deduplication (``dedup``) undoes a release's repetition of the same problem:

- ``"source_id"`` (default): a row is dropped when an earlier row has the same source problem id, the
  same templated prompt and the same normalised answer. The DAPO releases repeat each problem under one
  ``extra_info.index`` (AIME 2024: 30 problems x 32 copies), while distinct problems keep distinct ids even
  when their text coincides: the 17,917 DAPO-Math-17k problems stay 17,917 (only 17,290 texts are
  distinct). Rows without a source id fall back to (prompt, answer). If the ids do not collapse the
  repetition (more than twice as many rows remain as distinct prompts), the prompt alone is used and a
  warning says so.
- ``"prompt"``: keep the first row of each templated prompt text.
- ``"none"``: keep every row.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from recipe_dapo.data.answers import normalize_ground_truth
from recipe_dapo.data.catalog import DATASETS, DatasetSpec, dataset_spec
from recipe_dapo.data.sources import (
    ProblemRecord,
    SourceRows,
    _offline_mode,
    check_hub_reachable,
    iter_problem_records,
    read_hub_rows,
    read_local_rows,
)
from recipe_dapo.data.template import apply_dapo_template, strip_dapo_template
from recipe_dapo.data.validation import RLDataError, validate_rl_record

logger = logging.getLogger(__name__)

DEDUP_MODES = ("source_id", "prompt", "none")
LOCAL_DIR_ENV = "DAPO_DATA_LOCAL_DIR"
# More rows than this many per distinct prompt after id-deduplication means the ids are per row.
_MAX_COPIES_PER_PROMPT = 2.0


@dataclass(frozen=True)
class ConversionResult:
    """What one conversion read and wrote."""

    name: str
    source: str
    output_path: str
    rows_read: int
    rows_written: int

    @property
    def duplicates_dropped(self) -> int:
        return self.rows_read - self.rows_written


def to_rl_row(record: ProblemRecord, spec: DatasetSpec, index: int) -> dict[str, Any]:
    """One verl RL row (layout in the module docstring) for ``record``."""
    prompt = apply_dapo_template(record.problem)
    return {
        "data_source": spec.data_source,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"ground_truth": normalize_ground_truth(record.answer), "style": "rule"},
        "extra_info": {
            "index": index,
            "split": spec.split,
            "source_id": record.source_id or "",
            "raw_problem": strip_dapo_template(prompt),
        },
    }


def convert_records(
    records: Iterable[ProblemRecord],
    spec: DatasetSpec,
    source_name: str,
    dedup: str = "source_id",
    total: int | None = None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], int]:
    """Convert, deduplicate (module docstring) and validate; returns (rows, number of rows read)."""
    if dedup not in DEDUP_MODES:
        raise ValueError(f"dedup must be one of {DEDUP_MODES}, got {dedup!r}")
    rows: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    rows_read = 0
    for record in tqdm(records, total=total, desc=f"convert {spec.name}", unit="row", disable=not progress):
        rows_read += 1
        try:
            row = to_rl_row(record, spec, index=len(rows))
        except TypeError as error:  # normalize_ground_truth refuses lists, dicts, bools
            raise RLDataError(source_name, record.row, record.answer_field, str(error)) from error
        if not row["reward_model"]["ground_truth"]:
            raise RLDataError(
                source_name, record.row, record.answer_field, f"ground truth {record.answer!r} is empty once normalised"
            )
        key = _dedup_key(row, record, dedup)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        validate_rl_record(row, source_name, record.row)
        rows.append(row)
    if dedup == "source_id":
        rows = _fall_back_to_prompt_dedup_if_ids_are_per_row(rows, source_name)
    return rows, rows_read


def _dedup_key(row: dict[str, Any], record: ProblemRecord, dedup: str) -> tuple | None:
    prompt = row["prompt"][0]["content"]
    if dedup == "none":
        return None
    if dedup == "prompt":
        return (prompt,)
    return (record.source_id, prompt, row["reward_model"]["ground_truth"])


def _fall_back_to_prompt_dedup_if_ids_are_per_row(rows: list[dict[str, Any]], source_name: str) -> list[dict[str, Any]]:
    distinct_prompts = len({row["prompt"][0]["content"] for row in rows})
    if len(rows) <= _MAX_COPIES_PER_PROMPT * distinct_prompts:
        return rows
    logger.warning(
        "%s: %d rows remain for %d distinct prompts after deduplicating by source id, so the ids are per row; "
        "deduplicating by prompt text instead (pass dedup='prompt' to choose this explicitly)",
        source_name,
        len(rows),
        distinct_prompts,
    )
    kept, seen = [], set()
    for row in rows:
        prompt = row["prompt"][0]["content"]
        if prompt not in seen:
            seen.add(prompt)
            row["extra_info"]["index"] = len(kept)
            kept.append(row)
    return kept


def write_rl_parquet(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write rows as parquet, atomically (a partial file never carries the final name)."""
    import pandas as pd

    if not rows:
        raise ValueError(f"refusing to write {path}: no rows")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.partial"
    pd.DataFrame(list(rows)).to_parquet(partial, index=False)
    os.replace(partial, path)


def locate_local_file(spec: DatasetSpec, local_dir: str | os.PathLike) -> str:
    """The first of ``spec.local_files`` present under ``local_dir``; the error lists what was tried."""
    candidates = [os.path.join(local_dir, relative) for relative in spec.local_files]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"{spec.name}: none of {candidates} exists; lay {LOCAL_DIR_ENV}={local_dir} out as `python -m "
        f"recipe_dapo.data prepare --help` lists, or unset it to download {spec.hub_id}"
    )


def open_source(spec: DatasetSpec, input_path: str | None = None, local_dir: str | None = None) -> SourceRows:
    """Rows for ``spec``: ``input_path`` if given, else from ``local_dir``, else from the Hugging Face Hub."""
    if input_path is not None:
        return read_local_rows(input_path)
    if local_dir is not None:
        return read_local_rows(locate_local_file(spec, local_dir))
    offline = _offline_mode()
    if offline is None:
        check_hub_reachable()
        logger.info("%s: downloading %s (split %s)", spec.name, spec.hub_id, spec.hub_split)
    rows = read_hub_rows(spec.hub_id, spec.hub_config, spec.hub_split, checked=True)
    if offline is not None:
        logger.info("%s: %s read from the datasets cache (%s is set)", spec.name, spec.hub_id, offline)
    return rows


def convert_dataset(
    name: str,
    output_dir: str | os.PathLike,
    input_path: str | None = None,
    local_dir: str | None = None,
    dedup: str = "source_id",
    progress: bool = True,
) -> ConversionResult:
    """Convert data set ``name`` (see ``catalog.DATASETS``) into ``output_dir/<spec.output_file>``."""
    spec = dataset_spec(name)
    source = open_source(spec, input_path, local_dir)
    records = iter_problem_records(source, spec.answer_of)
    rows, rows_read = convert_records(records, spec, source.name, dedup, total=source.num_rows, progress=progress)
    output_path = os.path.join(output_dir, spec.output_file)
    write_rl_parquet(rows, output_path)
    result = ConversionResult(spec.name, source.name, output_path, rows_read, len(rows))
    logger.info(
        "%s: %d rows read from %s, %d duplicates dropped, %d written to %s",
        spec.name,
        rows_read,
        source.name,
        result.duplicates_dropped,
        len(rows),
        output_path,
    )
    return result


def prepare_all(
    output_dir: str | os.PathLike,
    local_dir: str | None = None,
    names: Sequence[str] | None = None,
    progress: bool = True,
) -> list[ConversionResult]:
    """Convert every data set (or ``names``); with ``local_dir`` all local files are located before any work."""
    names = list(names) if names else list(DATASETS)
    specs = [dataset_spec(name) for name in names]
    if local_dir is not None:
        for spec in specs:
            locate_local_file(spec, local_dir)
    elif _offline_mode() is None:
        check_hub_reachable()  # before any file is written: without network, one line and how to go local
    return [convert_dataset(spec.name, output_dir, local_dir=local_dir, progress=progress) for spec in specs]
