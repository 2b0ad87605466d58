"""Every command the README shows works as written, in the environment its first command makes (the recipe's
``python -m`` commands run with the test extra's packages hidden: the default install has none of them).

The commands are read from the README's ``bash`` blocks (continued lines joined, comments dropped). Each is checked
as far as it can be without training or a GPU: the recipe's ``python -m`` commands parse the README's arguments with
their own parsers and answer ``--help``; Hydra overrides compose with the real config; the report runs on a real
run's metrics file laid out as the default run writes it; ``.venv/bin/X`` tools exist in this environment; what the
report needs is a requirement of every install (``test_report_on_cpu.py``).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, compose_recipe_config

README = (REPO_ROOT / "README.md").read_text()
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "metrics_cpu_run.jsonl"
CPU_RUN = ["platform=cpu", "size=cpu_chain"]  # what scripts/run_dapo_cpu.sh puts before the user's overrides


def readme_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line:
                commands.append(line)
    return commands


COMMANDS = readme_commands()


def words(command: str) -> list[str]:
    return shlex.split(command.replace("$HOME", "/home/user").replace("~", "/home/user"))


def module_commands(module: str) -> list[list[str]]:
    """The arguments of every README command that runs ``python -m module`` (in the venv or not)."""
    found = []
    for command in COMMANDS:
        for part in command.split("&&"):
            argv = words(part)
            if len(argv) >= 3 and argv[0] in ("python", ".venv/bin/python") and argv[1:3] == ["-m", module]:
                found.append(argv[3:])
    return found


def modules_only_in_test_extra() -> set[str]:
    """Top-level modules of the packages only the ``test`` extra brings: absent from the environment the README's first
    command makes (``bash scripts/install_cpu.sh``: the default requirements and the ``cpu`` extra)."""
    import importlib.metadata as metadata

    from packaging.requirements import Requirement

    default, test = set(), set()
    for line in metadata.requires("recipe_dapo"):
        requirement = Requirement(line)
        name = requirement.name.lower().replace("_", "-")
        extra = re.search(r'extra == "([^"]+)"', str(requirement.marker or ""))
        if extra is None or extra.group(1) == "cpu":
            default.add(name)
        elif extra.group(1) == "test":
            test.add(name)
    modules = {module for module, dists in metadata.packages_distributions().items()
               if any(dist.lower().replace("_", "-") in test - default for dist in dists)}
    assert "pytest" in modules  # the scan found what it is for
    return modules


# `python -m MODULE ARGS` as the default install runs it: the test extra's modules cannot be imported.
DEFAULT_INSTALL = """
import importlib.abc, runpy, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the default install)")
sys.meta_path.insert(0, Absent())
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def default_install_python(module: str, *args: str) -> list[str]:
    """The command line of ``python -m module args`` with only what the default install has."""
    return [sys.executable, "-c", f"HIDDEN = {sorted(modules_only_in_test_extra())!r}\n" + DEFAULT_INSTALL, module, *args]


def test_the_default_install_stand_in_hides_the_test_extra():
    # positive control: a module that imports pytest fails under it, and runs without it
    hidden = subprocess.run(default_install_python("pytest", "--version"), capture_output=True, text=True, timeout=60)
    assert hidden.returncode != 0 and "not in the default install" in hidden.stderr
    shown = subprocess.run([sys.executable, "-m", "pytest", "--version"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0


def test_the_readme_shows_the_commands_this_test_checks():
    # The scan itself: without these, the checks below would pass on nothing.
    assert module_commands("recipe_dapo.report") and module_commands("recipe_dapo.evaluation.evaluate")
    assert module_commands("recipe_dapo.main_dapo") and any("run_dapo_cpu.sh" in c for c in COMMANDS)


def test_commands_on_the_cpu_path_use_the_installed_environment():
    """After `bash scripts/install_cpu.sh`, a bare `python` is not the environment it made: the CPU-path commands say
    `.venv/bin/python` (the GPU section's `pip install -e .[gpu]` is into the user's own environment)."""
    gpu_section = README.split("## On GPUs", 1)[1].split("\n## ", 1)[0]
    cpu_blocks = README.split("## On GPUs", 1)[0]
    for block in re.findall(r"```bash\n(.*?)```", cpu_blocks, re.S):
        for line in block.splitlines():
            if "--model PATH" not in line:  # the paper's setting, for a GPU machine's environment
                assert not re.match(r"\s*python\b", line), line
    assert "source .venv/bin/activate" in README
    assert "pip install" in gpu_section


def test_every_venv_tool_the_readme_names_is_in_the_environment():
    tools = set(re.findall(r"\.venv/bin/([\w.-]+)", README))
    assert {"python", "tensorboard"} <= tools
    for tool in tools:
        assert (Path(sys.prefix) / "bin" / tool).exists(), f".venv/bin/{tool}"


@pytest.mark.parametrize("module", ["recipe_dapo.report", "recipe_dapo.evaluation.evaluate", "recipe_dapo.data",
                                    "recipe_dapo.preflight.install"])
def test_the_recipes_commands_answer_help(module):
    named = set(re.findall(r"-m (recipe_dapo[\w.]*)", README))
    assert module in named, module
    if module == "recipe_dapo.preflight.install":
        return  # it checks the installation when run: tests/test_wheelhouse_on_cpu.py runs it
    completed = subprocess.run(default_install_python(module, "--help"), capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0 and "usage:" in completed.stdout, completed.stderr


def test_the_evaluation_commands_parse_as_written():
    from recipe_dapo.evaluation.evaluate import build_parser

    for argv in module_commands("recipe_dapo.evaluation.evaluate"):
        args = build_parser().parse_args(argv)
        assert args.model and args.data and args.out and args.max_response_length
    trained = [argv for argv in module_commands("recipe_dapo.evaluation.evaluate") if "runs/dapo_cpu/checkpoints" in argv]
    assert trained, "the README evaluates what the default run trained"


def test_the_data_commands_parse_as_written():
    from recipe_dapo.data.cli import build_parser

    inline = re.findall(r"`python -m\s+recipe_dapo\.data ([^`]+)`", README.replace("\n", " "))
    assert any(text.startswith("prepare ") for text in inline)
    for text in inline:
        argv = words(text.replace(" N", " 512"))
        if "--help" not in argv:
            build_parser().parse_args(argv)


def test_the_training_overrides_compose_with_the_real_config():
    for command in COMMANDS:
        for part in command.split("&&"):
            argv = [word for word in words(part) if "=" not in word or "." in word.split("=")[0]
                    or word.startswith(("size=", "ablation=", "sampling=", "platform="))]
            if "scripts/run_dapo_cpu.sh" in part:
                overrides = argv[argv.index("scripts/run_dapo_cpu.sh") + 1:]
                config = compose_recipe_config([*CPU_RUN, *overrides])
                if any(o.startswith("trainer.logger=") for o in overrides):
                    assert list(config.trainer.logger) == ["console", "file", "wandb", "tensorboard"]
            elif argv[:3] in (["python", "-m", "recipe_dapo.main_dapo"], [".venv/bin/python", "-m",
                                                                          "recipe_dapo.main_dapo"]):
                compose_recipe_config(argv[3:])


def test_the_report_command_draws_the_default_run_as_written(tmp_path):
    """`.venv/bin/python -m recipe_dapo.report runs/dapo_cpu` in a checkout where the default run has run."""
    pytest.importorskip("matplotlib")
    command = next(argv for argv in module_commands("recipe_dapo.report") if argv == ["runs/dapo_cpu"])
    run = tmp_path / "runs" / "dapo_cpu" / "recipe_dapo"
    run.mkdir(parents=True)
    shutil.copy(FIXTURE, run / "dapo_cpu.jsonl")  # where scripts/run_dapo_cpu.sh's run writes its metrics
    completed = subprocess.run(default_install_python("recipe_dapo.report", *command), capture_output=True, text=True,
                               timeout=300, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert (tmp_path / "runs" / "dapo_cpu" / "run_report.png").stat().st_size > 10_000
    assert "| dapo_cpu | 6 (1-6) |" in (tmp_path / "runs" / "dapo_cpu" / "run_report.md").read_text()


def test_the_run_the_readme_evaluates_saves_the_model_the_evaluation_reads():
    """The Evaluating section's training command (the default run) saves a checkpoint with its Hugging Face copy at
    its last step, in the folder its evaluation command reads (`--model runs/dapo_cpu/checkpoints`)."""
    script = (REPO_ROOT / "scripts" / "run_dapo_cpu.sh").read_text()
    assert 'SIZE=cpu_chain; fi' in script  # the default run's shape on its built-in inputs
    section = README.split("## Evaluating a trained model", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    train = next(line for line in block.splitlines() if "scripts/run_dapo_cpu.sh" in line)
    argv = words(train)
    config = compose_recipe_config([*CPU_RUN, *argv[argv.index("scripts/run_dapo_cpu.sh") + 1:]])
    assert config.trainer.save_freq > 0 and config.trainer.total_training_steps % config.trainer.save_freq == 0
    assert "hf_model" in config.actor_rollout_ref.actor.checkpoint.save_contents
    evaluate = words(block.replace("\\\n", " ").split(".venv/bin/python -m recipe_dapo.evaluation.evaluate", 1)[1])
    # scripts/run_dapo_cpu.sh saves under $WORK_DIR/checkpoints, WORK_DIR defaulting to runs/dapo_cpu.
    assert 'trainer.default_local_dir="$WORK_DIR/checkpoints"' in script and "runs/dapo_cpu}" in script
    assert evaluate[evaluate.index("--model") + 1] == "runs/dapo_cpu/checkpoints"
