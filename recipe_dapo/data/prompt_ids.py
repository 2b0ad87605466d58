"""Can prompt skipping tell the training prompts apart? A start-up check of the train files.

Skipping remembers each prompt's group outcomes under its key, ``"<data_source>#<extra_info.index>"``
(``recipe_dapo.dynamic_sampling.prompt_keys``). Two things would make that memory wrong:

- a row without ``extra_info.index`` (verl would give it index 0, shared with every other such row);
- one key shared by rows with different prompts (two files numbered from 0 under one data_source, say), whose
  histories would be merged. Copies of one problem under one key (the DAPO releases' repetition) are fine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from recipe_dapo.dynamic_sampling.prompt_keys import prompt_key

_ROWS_PER_BATCH = 4096
FIX = (
    "prepare the data with scripts/prepare_data.sh (recipe_dapo.data.convert numbers every row in "
    "extra_info.index) or set dapo.dynamic_sampling.skip.enable=false"
)


def prompt_key_problems(paths: Sequence[str], prompt_column: str = "prompt") -> list[str]:
    """Problems (one line per kind, with examples) that stop skipping from telling the prompts of ``paths`` apart."""
    import pyarrow.parquet as pq

    missing: list[str] = []
    missing_count = 0
    shared: list[str] = []
    shared_count = 0
    first_seen: dict[str, tuple[str, str, int]] = {}  # key -> (prompt text, file, row)
    for path in paths:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        columns = [c for c in ("data_source", "extra_info", prompt_column) if c in names]
        row = 0
        for batch in parquet.iter_batches(batch_size=_ROWS_PER_BATCH, columns=columns):
            for record in batch.to_pylist():
                key = prompt_key(record.get("data_source"), record.get("extra_info"))
                if key is None:
                    missing_count += 1
                    if len(missing) < 3:
                        missing.append(f"{os.path.basename(path)} row {row}")
                else:
                    text = json.dumps(record.get(prompt_column), sort_keys=True, default=str)
                    seen = first_seen.setdefault(key, (text, path, row))
                    if seen[0] != text:
                        shared_count += 1
                        if len(shared) < 3:
                            shared.append(f"{key} at {os.path.basename(seen[1])} row {seen[2]} and "
                                          f"{os.path.basename(path)} row {row}")
                row += 1
    problems = []
    if missing_count:
        problems.append(
            f"dapo.dynamic_sampling.skip.enable=true: {missing_count} training rows have no extra_info.index, the "
            f"prompt id skipping remembers outcomes under (e.g. {', '.join(missing)}); {FIX}"
        )
    if shared_count:
        problems.append(
            f"dapo.dynamic_sampling.skip.enable=true: {shared_count} training rows share their prompt id "
            f"(data_source#extra_info.index) with a different prompt, so their histories would be merged (e.g. "
            f"{'; '.join(shared)}); give each file its own data_source or number the rows across files, or {FIX}"
        )
    return problems
