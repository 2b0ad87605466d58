"""The data sets DAPO trains and evaluates on: where each comes from and how it is tagged.

A new data set is a new :class:`DatasetSpec` added to ``DATASETS`` below. ``local_files`` are paths
relative to a local data folder (``DAPO_DATA_LOCAL_DIR``, ``--local-dir``; :func:`local_layout` lists them); the
first that exists is read. ``hub_id`` is the usual public Hugging Face copy, used only when no local folder is
given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recipe_dapo.data.answers import gsm8k_final_answer


@dataclass(frozen=True)
class DatasetSpec:
    """How to build one output parquet file."""

    name: str
    """Short name used on the command line and in logs (``aime-2024``)."""
    output_file: str
    """File name written in the output folder."""
    data_source: str
    """``data_source`` of every output row; validation metrics are grouped by it (``val/<data_source>/...``)."""
    split: str
    """``extra_info.split`` of every output row (``train`` or ``test``)."""
    local_files: tuple[str, ...]
    """Candidate files under the local data folder, in order of preference."""
    hub_id: str
    hub_split: str
    hub_config: str | None = None
    answer_of: Callable[[Any], Any] = field(default=lambda answer: answer)
    """Maps a flat-layout ``answer`` cell to the final answer (GSM8K keeps it after ``####``)."""


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="dapo-math-17k",
            output_file="dapo-math-17k.parquet",
            # verl's default scorer routes "math_dapo" to its DAPO "Answer:" checker, so the file also
            # works with verl's own reward managers.
            data_source="math_dapo",
            split="train",
            local_files=("dapo-math-17k/dapo-math-17k.parquet", "dapo-math-17k/dapo-math-17k.svs-dedup.parquet"),
            hub_id="BytedTsinghua-SIA/DAPO-Math-17k",
            hub_split="train",
        ),
        DatasetSpec(
            name="aime-2024",
            output_file="aime-2024.parquet",
            data_source="aime24",
            split="test",
            local_files=("eval/aime-2024.parquet", "eval/aime-2024-dapo-960.parquet"),
            hub_id="HuggingFaceH4/aime_2024",
            hub_split="train",
        ),
        DatasetSpec(
            name="aime-2025",
            output_file="aime-2025.parquet",
            data_source="aime25",
            split="test",
            local_files=("eval/aime-2025.parquet",),
            hub_id="yentinglin/aime_2025",
            hub_split="train",
        ),
        DatasetSpec(
            name="amc23",
            output_file="amc23.parquet",
            data_source="amc23",
            split="test",
            local_files=("eval/amc23.parquet",),
            hub_id="math-ai/amc23",
            hub_split="test",
        ),
        DatasetSpec(
            name="math500",
            output_file="math500.parquet",
            data_source="math500",
            split="test",
            local_files=("eval/math500_test.jsonl",),
            hub_id="HuggingFaceH4/MATH-500",
            hub_split="test",
        ),
        DatasetSpec(
            name="gsm8k",
            output_file="gsm8k.parquet",
            data_source="gsm8k",
            split="test",
            local_files=("eval/gsm8k_test.jsonl",),
            hub_id="openai/gsm8k",
            hub_config="main",
            hub_split="test",
            answer_of=gsm8k_final_answer,
        ),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    """The spec called ``name``; the error lists the known names."""
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}") from None


def local_layout() -> str:
    """The local data folder's layout, one data set a line: the files read (the first present) and the Hub copy
    they stand for."""
    return "\n".join(f"  {spec.name:<14} {' or '.join(spec.local_files)}  (a copy of {spec.hub_id})"
                     for spec in DATASETS.values())
