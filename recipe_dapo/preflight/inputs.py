"""Rules of the inputs: the data files (rows checked once per file version), the model folder, and every prompt's
tokens counted with the model's tokenizer (``recipe_dapo.data.prompt_length``; tier 2, it needs transformers)."""

from __future__ import annotations

import os
from typing import Iterable

from omegaconf import DictConfig

from recipe_dapo.preflight.base import CheckReport, paths, select


def rule_data_files(config: DictConfig, report: CheckReport) -> Iterable[str]:
    prompt_key = str(select(config, "data.prompt_key", "prompt"))
    # The recipe's reward reads strings, numbers and lists of them; a user's reward function reads what it reads.
    readable_shapes_only = not select(config, "reward.custom_reward_function.path", None)
    for key in ("data.train_files", "data.val_files"):
        files = paths(select(config, key))
        if not files:
            yield f"{key} is not set; point it at a verl RL parquet (bash scripts/prepare_data.sh DIR makes them)"
        for path in files:
            if path.startswith("~"):
                # A shell expands ~ only at the start of a word, never inside `key=~/...`.
                yield f"{key}: {path} starts with '~', which nothing expands; write the absolute path"
            elif not os.path.exists(path):
                if report.absent_inputs_ok:
                    report.not_checked.append(f"{key}: {path} (absent on this machine)")
                else:
                    where = "" if os.path.isabs(path) else f" (a relative path: looked for in {os.getcwd()})"
                    yield f"{key}: {path} does not exist{where} (bash scripts/prepare_data.sh DIR makes it)"
            else:
                stat = os.stat(path)
                error = _validate_file(os.path.abspath(path), stat.st_mtime_ns, stat.st_size, prompt_key,
                                       readable_shapes_only)
                if error:
                    yield f"{key}: {error}"


_validated: dict[tuple, str | None] = {}


def _validate_file(path: str, mtime_ns: int, size: int, prompt_key: str, readable_shapes_only: bool = True) -> str | None:
    """Row checks of one data file, once per file version (many configs checked in one process)."""
    from recipe_dapo.data.validation import RLDataError, validate_rl_parquet

    cache_key = (path, mtime_ns, size, prompt_key, readable_shapes_only)
    if cache_key not in _validated:
        try:
            validate_rl_parquet(path, prompt_key=prompt_key, readable_shapes_only=readable_shapes_only)
            _validated[cache_key] = None
        except RLDataError as exc:
            _validated[cache_key] = str(exc)
    return _validated[cache_key]


def rule_model_path(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """A local model folder must hold a config.json; anything else (a hub id, a cluster path) is not checked."""
    path = os.path.expanduser(str(select(config, "actor_rollout_ref.model.path")))
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            yield f"actor_rollout_ref.model.path={path} has no config.json; point it at a Hugging Face model folder"
    elif os.path.isabs(path) and not report.dry_run:  # a folder path, not a hub id: at start-up it must exist
        yield f"actor_rollout_ref.model.path={path} does not exist; point it at a Hugging Face model folder"
    else:
        report.not_checked.append(f"actor_rollout_ref.model.path: {path} (not a local folder; not checked here)")


def rule_prompt_lengths(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """Every prompt's tokens counted with the model's tokenizer (loading it needs transformers: tier 2). In a dry
    run a tokenizer that is not a local folder is never fetched: "not checked"."""
    from recipe_dapo.data.prompt_length import tokenizer_key, tokenizer_path

    path = os.path.expanduser(tokenizer_path(config))
    if report.dry_run and not os.path.isdir(path):
        report.not_checked.append(f"{tokenizer_key(config)}: {path} (not a local folder: prompt tokens not counted here)")
        return []
    from recipe_dapo.data.prompt_length import prompt_length_problems

    return prompt_length_problems(config, report.not_checked)
