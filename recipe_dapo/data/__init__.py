"""Public data sets -> verl's RL parquet layout, with the DAPO prompt template and row validation.

Where things live (a new data set is a new ``DatasetSpec`` in ``catalog.DATASETS``):

- ``template``    the DAPO user prompt template (apply / verify / strip)
- ``answers``     ``normalize_ground_truth``: the canonical answer spelling; its number rules (thousands
                  separators, integers) are the verifier's too
- ``validation``  ``RLDataError`` and ``validate_rl_parquet``: row checks before anything heavy starts
- ``prompt_length`` prompt token counts as verl's rollout builds them (start-up check, ``validate --tokenizer``)
- ``sources``     reading local parquet/jsonl or Hub rows in the verl or the flat layout
- ``catalog``     the six data sets: file names, ``data_source`` tags, local and Hub locations
- ``convert``     conversion, deduplication and writing; ``prepare_all`` for the whole folder
- ``cli``         ``python -m recipe_dapo.data`` (what ``data_prep/`` and ``scripts/prepare_data.sh`` call)
"""

from recipe_dapo.data.answers import gsm8k_final_answer, normalize_ground_truth
from recipe_dapo.data.catalog import DATASETS, DatasetSpec, dataset_spec
from recipe_dapo.data.convert import ConversionResult, convert_dataset, prepare_all
from recipe_dapo.data.template import apply_dapo_template, is_dapo_templated, strip_dapo_template
from recipe_dapo.data.validation import RLDataError, validate_rl_parquet, validate_rl_record

__all__ = [
    "DATASETS",
    "ConversionResult",
    "DatasetSpec",
    "RLDataError",
    "apply_dapo_template",
    "convert_dataset",
    "dataset_spec",
    "gsm8k_final_answer",
    "is_dapo_templated",
    "normalize_ground_truth",
    "prepare_all",
    "strip_dapo_template",
    "validate_rl_parquet",
    "validate_rl_record",
]
