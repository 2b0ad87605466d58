"""Writing an evaluation: ``report.json``, one Markdown table per data set, and the scored generations.

Layout of ``OUT_DIR``::

    report.json                  {"settings": {...}, "datasets": {name: {"file", "rows_in_file", "rows",
                                  "problems", "responses_per_row", "responses",
                                  "metrics": {data_source: {metric: value}}}}, "elapsed_s": {...}}
    <name>.md                    what was run and the file's counts, then its metrics, one column per data source
    <name>.generations.jsonl     one line per response: row, problem, response_index, data_source, ground_truth,
                                 response, score, acc, pred, num_tokens, truncated

Rows, problems and responses are counted as ``evaluate`` says (its module docstring): ``rows`` is what was evaluated
(``rows_in_file`` before ``--max-rows``), ``problems`` the distinct prompts among them (the metrics' ``num_problems``
per data source), ``responses`` = ``rows`` x ``responses_per_row`` (``--n``), one generations line each.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any


def metrics_table(per_source: Mapping[str, Mapping[str, float]]) -> str:
    """A Markdown table: one row per metric, one column per data source."""
    sources = list(per_source)
    names = list(dict.fromkeys(name for metrics in per_source.values() for name in metrics))
    lines = ["| metric | " + " | ".join(sources) + " |", "| --- |" + " ---: |" * len(sources)]
    for name in names:
        cells = [_format_value(name, per_source[source].get(name)) for source in sources]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _format_value(name: str, value: float | None) -> str:
    if value is None:
        return ""
    if name == "num_problems" or name.startswith("response_length"):
        return str(int(value)) if float(value).is_integer() else f"{value:.1f}"
    return f"{value:.4f}"


def dataset_markdown(
    name: str, data_file: str, settings: Mapping[str, Any], per_source: Mapping[str, Mapping[str, float]],
    counts: str,
) -> str:
    """The Markdown page of one data set: what was run and the file's counts (``evaluate.FileCounts.said_once``),
    then its metrics table."""
    header = (
        f"# {name}\n\n"
        f"`{data_file}` with `{settings['model']}`: n={settings['n']}, temperature={settings['temperature']}, "
        f"top_p={settings['top_p']}, max_response_length={settings['max_response_length']}\n\n"
        f"{counts}\n\n"
    )
    return header + metrics_table(per_source)


def write_json(path: str, payload: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def unique_names(paths: Iterable[str]) -> list[str]:
    """File stems, made unique with ``-2``, ``-3``... when two data files share a stem."""
    names: list[str] = []
    for path in paths:
        stem = os.path.splitext(os.path.basename(path))[0]
        name, suffix = stem, 2
        while name in names:
            name, suffix = f"{stem}-{suffix}", suffix + 1
        names.append(name)
    return names
