"""Every command the README shows works as written, in the environment its first command makes (the recipe's
``python -m`` commands run with the test extra's packages hidden: the default install has none of them).

The commands are read from the README's ``bash`` blocks (continued lines joined, comments dropped). Each is checked
as far as it can be without training or a GPU: the recipe's ``python -m`` commands parse the README's arguments with
their own parsers and answer ``--help``; Hydra overrides compose with the real config; the report runs on a real
run's metrics file laid out as the default run writes it; ``.venv/bin/X`` tools exist in this environment; what the
report needs is a requirement of every install (``test_report_on_cpu.py``).
"""

from __future__ import annotations

import os
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
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # this checkout's recipe, run from elsewhere
    completed = subprocess.run(default_install_python("recipe_dapo.report", *command), capture_output=True, text=True,
                               timeout=300, cwd=tmp_path, env=env)
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


# ----------------------------------------------------------------------------- the README's commands, in the order typed

RECORDING_PYTHON = """#!/usr/bin/env bash
# Stand-in for python where a command would start training: records the folder it starts in and its arguments
# (NUL-separated) in $CAPTURE; runs everything else with the real interpreter.
if [[ $1 == -m && $2 == recipe_dapo.main_dapo ]]; then
  { printf '%s\\0' "$PWD" "${@:2}"; } > "$CAPTURE"
  exit 0
fi
exec PYTHON_EXECUTABLE "$@"
"""


def inline_commands(prefix: str) -> list[str]:
    """The README's inline `...` commands that start with ``prefix`` (lines joined as the reader reads them)."""
    return re.findall(r"`(" + re.escape(prefix) + r"[^`]+)`", README.replace("\n", " "))


@pytest.fixture
def fresh_clone(tmp_path):
    """A checkout as a newcomer has it (its scripts), with python recorded where the training would start."""
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "scripts").symlink_to(REPO_ROOT / "scripts")
    recorder = tmp_path / "python"
    recorder.write_text(RECORDING_PYTHON.replace("PYTHON_EXECUTABLE", shlex.quote(sys.executable)))
    recorder.chmod(0o755)
    env = {key: value for key, value in os.environ.items()
           if key not in {"MODEL_PATH", "TRAIN_FILE", "VAL_FILE", "TOKENIZER_PATH", "WORK_DIR", "DRY_RUN", "CPU_TASK"}}
    env.update(PYTHON=str(recorder), CAPTURE=str(tmp_path / "capture"))
    return clone, env


def typed(command: str, clone: Path, env: dict) -> tuple[Path, dict[str, str]]:
    """Run a README command in the clone as typed; the folder the training starts in, and its key=value overrides."""
    completed = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    cwd, _module, *overrides = Path(env["CAPTURE"]).read_bytes().decode().split("\0")[:-1]
    return Path(cwd), dict(o.split("=", 1) for o in overrides if "=" in o)


def test_your_own_model_and_data_with_relative_paths_trains_on_the_files_typed(fresh_clone):
    """'Your own model and data', typed in the clone with the README's relative file names: the run starts inside
    WORK_DIR, and the paths it is given still name the files beside the command."""
    clone, env = fresh_clone
    (command,) = inline_commands("MODEL_PATH=")
    assert "TRAIN_FILE=train.parquet" in command  # the README's own relative paths
    for name in ("train.parquet", "val.parquet"):
        (clone / name).write_bytes(b"PAR1")
    (clone / "my_model").mkdir()
    cwd, overrides = typed(command, clone, env)
    assert cwd == clone / "runs" / "dapo_cpu"  # the run starts in WORK_DIR
    for key, name in (("data.train_files", "train.parquet"), ("data.val_files", "val.parquet")):
        assert (cwd / overrides[key]).resolve() == (clone / name).resolve(), (key, overrides[key])
    # a relative WORK_DIR, a relative local model and a relative path override, typed likewise
    cwd, overrides = typed("WORK_DIR=runs/mine MODEL_PATH=my_model TRAIN_FILE=train.parquet VAL_FILE=val.parquet "
                           "bash scripts/run_dapo_cpu.sh data.val_files=val.parquet", clone, env)
    assert cwd == clone / "runs" / "mine"
    assert Path(overrides["trainer.default_local_dir"]) == clone / "runs" / "mine" / "checkpoints"
    assert (cwd / overrides["actor_rollout_ref.model.path"]).resolve() == (clone / "my_model").resolve()
    assert (cwd / overrides["data.val_files"]).resolve() == (clone / "val.parquet").resolve()
    # a Hub id is not a local folder: it is passed on as typed
    _, overrides = typed("MODEL_PATH=Qwen/Qwen2.5-0.5B TRAIN_FILE=train.parquet VAL_FILE=val.parquet "
                         "bash scripts/run_dapo_cpu.sh", clone, env)
    assert overrides["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-0.5B"


def test_the_default_runs_checkpoint_that_blocks_your_own_shape_names_work_dir(tmp_path):
    """After the quick start, 'your own model and data' runs in size=cpu_tiny's shape in the same WORK_DIR: the
    default run's checkpoint refuses it, and the refusal says how to start elsewhere with the script's own variable."""
    from recipe_dapo.run.checkpoint_guard import shape_changes, write_shape

    folder = tmp_path / "checkpoints" / "global_step_12"
    folder.mkdir(parents=True)
    write_shape(str(folder), compose_recipe_config(CPU_RUN))  # the quick start's run
    own = compose_recipe_config(["platform=cpu", "size=cpu_tiny"])  # what run_dapo_cpu.sh composes for your files
    problems = shape_changes(own, str(folder))
    assert problems and all("WORK_DIR=" in line and "scripts/run_dapo_cpu.sh" in line for line in problems)
    assert not shape_changes(compose_recipe_config(CPU_RUN), str(folder))  # positive control: the same shape passes


def test_the_report_reads_the_run_after_the_evaluation_wrote_beside_it(tmp_path):
    """In the README's order: the default run, its evaluation (`--out runs/dapo_cpu/eval`), then the report on
    `runs/dapo_cpu`: the evaluation's files beside the run's do not make the report refuse the folder."""
    pytest.importorskip("matplotlib")
    from recipe_dapo.evaluation.evaluate import build_parser
    from recipe_dapo.evaluation.report import write_json, write_jsonl

    (evaluate,) = [argv for argv in module_commands("recipe_dapo.evaluation.evaluate")
                   if "runs/dapo_cpu/checkpoints" in argv]
    out = tmp_path / build_parser().parse_args(evaluate).out
    assert out.parent == tmp_path / "runs" / "dapo_cpu"  # beside the run's own files
    report = next(argv for argv in module_commands("recipe_dapo.report") if argv == ["runs/dapo_cpu"])
    run = tmp_path / "runs" / "dapo_cpu" / "recipe_dapo"
    run.mkdir(parents=True)
    shutil.copy(FIXTURE, run / "dapo_cpu.jsonl")
    out.mkdir()
    # what the evaluation writes there: one record per response, the report and the table
    sample = {"row": 0, "problem": 0, "response_index": 0, "data_source": "chain_arithmetic", "ground_truth": "7",
              "response": "Answer: 7", "score": 1.0, "acc": True, "pred": "7", "num_tokens": 4, "truncated": False}
    write_jsonl(str(out / "val.generations.jsonl"), [sample, {**sample, "response_index": 1}])
    write_json(str(out / "report.json"), {"datasets": {}})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # this checkout's recipe, run from elsewhere
    completed = subprocess.run(default_install_python("recipe_dapo.report", *report), capture_output=True, text=True,
                               timeout=300, cwd=tmp_path, env=env)
    assert completed.returncode == 0, completed.stderr
    assert "| dapo_cpu | 6 (1-6) |" in (tmp_path / "runs" / "dapo_cpu" / "run_report.md").read_text()


def test_help_is_a_page_naming_the_groups_the_settings_and_the_composed_config():
    """`--help` (the README names it beside `--cfg job`): a page, not the composed configuration (over a thousand
    lines, which `--cfg job` prints on purpose)."""
    completed = subprocess.run([sys.executable, "-m", "recipe_dapo.main_dapo", "--help"], capture_output=True,
                               text=True, timeout=120, cwd=REPO_ROOT)
    assert completed.returncode == 0, completed.stderr
    page = completed.stdout
    assert len(page.splitlines()) <= 40, len(page.splitlines())
    assert "actor_rollout_ref:" not in page  # positive control below: the configuration is what --cfg job prints
    groups = {path.parent.name: sorted(p.stem for p in path.parent.glob("*.yaml"))
              for path in (REPO_ROOT / "recipe_dapo" / "config").glob("*/__init__.py")}
    assert {"size", "ablation", "sampling", "platform"} <= set(groups)
    for group, options in groups.items():
        assert f"{group}: {', '.join(options)}" in page, group
    assert "docs/settings.md" in page and "--cfg job" in page and "DRY_RUN=1" in page
    composed = subprocess.run([sys.executable, "-m", "recipe_dapo.main_dapo", "--cfg", "job"], capture_output=True,
                              text=True, timeout=120, cwd=REPO_ROOT)
    assert composed.returncode == 0 and "actor_rollout_ref:" in composed.stdout


def test_the_cpu_runs_help_names_its_variables_then_the_recipes_page_and_builds_nothing(tmp_path):
    import signal

    env = {**os.environ, "WORK_DIR": str(tmp_path / "work")}
    # its own process group: a script that ignored --help would start building the inputs, stopped here as a whole
    process = subprocess.Popen(["bash", "scripts/run_dapo_cpu.sh", "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env, start_new_session=True)
    try:
        page, errors = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, errors
    assert len(page.splitlines()) <= 80, len(page.splitlines())
    script = (REPO_ROOT / "scripts" / "run_dapo_cpu.sh").read_text()
    variables = set(re.findall(r"\$\{(\w+):[-=]", script)) - {"PYTHON"}  # what the script reads from the environment
    assert {"WORK_DIR", "MODEL_PATH", "TRAIN_FILE", "VAL_FILE", "CPU_TASK", "DRY_RUN"} <= variables
    for variable in variables | {"PYTHON"}:
        assert variable in page, variable
    assert "The recipe's groups" in page and "--cfg job" in page  # the recipe's page follows
    assert not (tmp_path / "work").exists()


def test_the_readmes_evaluation_samples_the_default_runs_model_as_the_run_validates_it():
    """The evaluation of the default run and the run's own validation measure the same thing (same problems, samples
    per problem, temperature, top-p, length), so their figures differ only by their seeds' draws. The evaluation's
    own default top-p is the paper's 0.7, which the run's validation (verl's val_kwargs) does not use."""
    from recipe_dapo.evaluation.evaluate import build_parser

    args = build_parser().parse_args(next(argv for argv in module_commands("recipe_dapo.evaluation.evaluate")
                                          if "runs/dapo_cpu/checkpoints" in argv))
    config = compose_recipe_config(CPU_RUN)
    validation = config.actor_rollout_ref.rollout.val_kwargs
    assert validation.do_sample
    assert (args.n, args.temperature, args.top_p) == (validation.n, validation.temperature, validation.top_p)
    assert args.max_response_length == config.data.max_response_length
    assert args.data == ["runs/dapo_cpu/assets/data/val.parquet"]  # the run's val_files (scripts/run_dapo_cpu.sh)
    assert build_parser().parse_args(["--model", "m", "--data", "d", "--max-response-length", "1", "--out", "o"]
                                     ).top_p != validation.top_p  # positive control: the default would not match


def test_a_missing_relative_data_file_is_named_with_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    """A relative data path that does not resolve (python -m recipe_dapo.main_dapo typed from another folder) says
    where it was looked for, not only that a script would make it."""
    from omegaconf import OmegaConf

    from recipe_dapo.preflight.base import CheckReport
    from recipe_dapo.preflight.inputs import rule_data_files

    monkeypatch.chdir(tmp_path)
    config = OmegaConf.create({"data": {"train_files": "train.parquet", "val_files": str(tmp_path / "val.parquet")}})
    problems = list(rule_data_files(config, CheckReport()))
    relative = next(p for p in problems if p.startswith("data.train_files"))
    absolute = next(p for p in problems if p.startswith("data.val_files"))
    assert f"looked for in {tmp_path}" in relative
    assert "looked for in" not in absolute  # an absolute path names itself


def test_the_launch_doc_names_exactly_the_scripts_whose_dry_run_says_why_instead_of_warning():
    """docs/launching.md says which GPU scripts, as shipped, keep a KV cache short of a wave and say why (their dry run
    gives the reason in place of the warning) and which fit their plan: the lists are what the dry runs print, and no
    dry run prints a warning (other than an input absent from this machine)."""
    doc = (REPO_ROOT / "docs" / "launching.md").read_text()
    paragraph = doc.split("**What the scripts' own dry runs say about the KV cache.**", 1)[1].split("\n\n", 1)[0]
    explained, fit = paragraph.split("fit their plan as they are", 1)[0].split("keep, on their card", 1)
    scripts = sorted(path.name for path in (REPO_ROOT / "scripts").glob("*.sh")
                     if path.name.startswith(("dapo_", "grpo_")))
    assert len(scripts) == 7
    env = {k: v for k, v in os.environ.items() if k not in {"MODEL_PATH", "TRAIN_FILE", "VAL_FILES", "VAL_FILE",
                                                            "NNODES", "GPUS_PER_NODE", "RAY_ADDRESS", "WORK_DIR"}}
    env["DRY_RUN"] = "1"
    warning, reason = {}, {}
    for script in scripts:
        completed = subprocess.run(["bash", f"scripts/{script}"], capture_output=True, text=True, timeout=300,
                                   cwd=REPO_ROOT, env=env)
        assert completed.returncode == 0, (script, completed.stderr[-2000:])
        lines = (completed.stdout + completed.stderr).splitlines()
        warning[script] = [line for line in lines if "WARNING" in line and "not checked" not in line]
        reason[script] = [line for line in lines if "expected here (dapo.memory.kv_waves_expected): " in line]
    assert not any(warning.values()), warning
    said_to_explain = {script for script in scripts if f"`{script}`" in explained}
    said_to_fit = {script for script in scripts if f"`{script}`" in fit}
    assert said_to_explain == {script for script, lines in reason.items() if lines}, reason
    assert said_to_fit == {script for script, lines in reason.items() if not lines}
    assert all(len(lines) == 1 and "KV cache" in lines[0] for lines in reason.values() if lines), reason
