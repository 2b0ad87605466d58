"""Tier-1 rule: the installed verl is one the recipe supports (read from its package metadata, without importing verl).

The facts, one place: ``setup.py`` declares :data:`SUPPORTED_VERL` (a test compares the two), the start-up check
refuses any other installed verl in one line, and a feature that needs a newer verl than the range's floor is refused
with its reason (:data:`V1_TRAINER_MIN_VERL`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Iterable, Optional

from omegaconf import DictConfig
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from recipe_dapo.preflight.base import CheckReport, select

SUPPORTED_VERL = ">=0.9.0,<0.10"
"""The verl releases the recipe runs on (``setup.py``'s ``install_requires``); 0.9.0 and 0.9.1 are tested."""

V1_TRAINER_MIN_VERL = "0.9.1"
"""``trainer.use_v1=true`` needs it: the recipe's v1 trainer feeds the rollout through verl 0.9.1's ``prepare_step``
hook (0.9.0 adds a batch of prompts itself every step, past the recipe's sampler), passes ``expected_acc_counts`` to
``_val_metrics_update`` and resumes from ``_restored_tq_prompt_count``, none of which verl 0.9.0's v1 trainer has."""

OLDER_VERL_WHY = (
    "verl before 0.9 has no 'verl.plugins' entry points, through which the recipe registers its loss, reward manager "
    "and CPU platform, no v1 trainer, and it pins numpy<2"
)
NEWER_VERL_WHY = "the recipe subclasses verl's trainers, whose internals change between minor releases"


def installed_verl() -> Optional[str]:
    """The installed verl's version from its package metadata, or from ``verl/version/version`` for a source checkout
    on PYTHONPATH (no metadata); None when verl cannot be imported. Does not import verl."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        version_file = Path(folder) / "version" / "version"
        if version_file.is_file():
            return version_file.read_text().strip()
    return None


def verl_version_problem(version: Optional[str]) -> Optional[str]:
    """Why the recipe refuses this verl version (None: supported)."""
    fix = f"pip install 'verl{SUPPORTED_VERL}' into this Python environment"
    if version is None:
        return f"verl is not installed in this Python environment; the recipe supports verl{SUPPORTED_VERL}: {fix}"
    try:
        parsed = Version(version)
    except InvalidVersion:
        return f"verl {version!r} has a version the recipe cannot read; it supports verl{SUPPORTED_VERL}: {fix}"
    if SpecifierSet(SUPPORTED_VERL).contains(parsed, prereleases=True):
        return None
    why = OLDER_VERL_WHY if parsed < Version("0.9") else NEWER_VERL_WHY
    return f"verl {version} is installed; the recipe supports verl{SUPPORTED_VERL} ({why}): {fix}"


def v1_trainer_supported(version: Optional[str]) -> bool:
    """Whether the recipe's v1 trainer (``trainer.use_v1=true``) runs on this verl."""
    return verl_version_problem(version) is None and Version(version) >= Version(V1_TRAINER_MIN_VERL)


def rule_verl_version(config: DictConfig, report: CheckReport) -> Iterable[str]:
    """The installed verl is in :data:`SUPPORTED_VERL`; ``trainer.use_v1=true`` needs :data:`V1_TRAINER_MIN_VERL`."""
    version = installed_verl()
    problem = verl_version_problem(version)
    if problem:
        yield problem
        return
    if select(config, "trainer.use_v1", False) and not v1_trainer_supported(version):
        yield (
            f"trainer.use_v1=true needs verl>={V1_TRAINER_MIN_VERL} (verl {version} is installed): the recipe's v1 "
            "trainer feeds the rollout through verl 0.9.1's prepare_step hook and validation/resume hooks that verl "
            f"{version}'s v1 trainer lacks. Set trainer.use_v1=false (the classic trainer runs on verl {version}) "
            f"or pip install 'verl>={V1_TRAINER_MIN_VERL},<0.10'"
        )
