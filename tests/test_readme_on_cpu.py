"""The README's two set-up commands are the ones CI and users run."""

from __future__ import annotations

import re

from conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def quick_start_commands() -> list[str]:
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", README, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_quick_start_has_a_run_command_and_a_test_command():
    run_command, test_command = quick_start_commands()
    assert run_command == "bash scripts/install_cpu.sh && bash scripts/run_dapo_cpu.sh"
    assert test_command.startswith("bash scripts/install_cpu.sh cpu,test && ") and "pytest tests" in test_command


def test_ci_runs_the_readme_test_command():
    _, test_command = quick_start_commands()
    ci_script = (REPO_ROOT / ".ci" / "run").read_text()
    assert test_command in ci_script


def test_every_script_the_readme_names_exists():
    for path in set(re.findall(r"(scripts/[\w./-]+\.sh)", README)):
        assert (REPO_ROOT / path).exists(), path
