"""Every launch script composes a valid configuration in dry-run mode: no Ray, no GPU, no model.

How, cheaply: each script runs for real through bash, but with ``PYTHON`` pointing at a stand-in that
records the ``python -m recipe_dapo.main_dapo ...`` command line instead of training. This process then
composes each recorded override list with the recipe's Hydra config (an unknown key fails composition)
and runs the dry run's checks on it (the recipe's start-up checks, verl's typed configs and
``validate_config``, the cluster shape). With ``DRY_RUN=1`` every script must run ``recipe_dapo.dry_run``
with the same overrides instead, and one good and two bad launches go through that path end to end (the
bad ones must fail naming the key). Data files are real: ``scripts/prepare_data.sh`` builds them from the
offline copies in ../shared/data (without those, absent files are reported "not checked").
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from recipe_dapo.dry_run import compose, dry_run
from recipe_dapo.preflight import DAPOConfigError
from recipe_dapo.preflight.memory_plan import GPU_MISSING
from recipe_dapo.preflight.memory_rule import KV_WAVES_KNOB, plan_lines

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"


def _shared_data() -> Path | None:
    """The offline data copies (../shared/data beside the repository, or $SHARED_DATA_DIR)."""
    for candidate in (os.environ.get("SHARED_DATA_DIR"), REPO_ROOT.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "dapo-math-17k").is_dir():
            return Path(candidate)
    return None


SHARED_DATA = _shared_data()

# verl warns on every need_critic() call that a GRPO run has no critic.
pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")

# Scripts that start a training run (each must compose in dry-run mode).
LAUNCH_SCRIPTS = (
    "launch_dapo.sh",
    "dapo_qwen2.5_32b.sh",
    "dapo_qwen2.5_32b_no_dynamic_sampling.sh",
    "dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh",
    "grpo_qwen2.5_32b_baseline.sh",
    "dapo_qwen2.5_7b_math.sh",
    "dapo_qwen2.5_1.5b_one_node.sh",
    "dapo_small_one_gpu.sh",
    "run_dapo_cpu.sh",
)
# The GPU launch scripts and the card each is written for: dapo.memory.gpu_memory_gib, GiB as torch reports it.
CARDS = {
    "dapo_qwen2.5_32b.sh": 79.2, "dapo_qwen2.5_32b_no_dynamic_sampling.sh": 79.2,
    "dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh": 79.2, "grpo_qwen2.5_32b_baseline.sh": 79.2,
    "dapo_qwen2.5_7b_math.sh": 79.2, "dapo_qwen2.5_1.5b_one_node.sh": 39.4, "dapo_small_one_gpu.sh": 23.6,
}
# Scripts that do something else.
HELPER_SCRIPTS = ("prepare_data.sh", "install_cpu.sh", "ray_job_submit.sh", "verl_compat.sh", "wheelhouse.sh")

# The paper's 32B run (section 4.1 and the reference recipe's script) as the composed config must hold it.
PAPER_32B = {
    "trainer.nnodes": 16,
    "trainer.n_gpus_per_node": 8,
    "data.train_batch_size": 512,
    "data.gen_batch_size": 1536,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    # "a linear warm-up over 20 rollout steps" (the reference recipe's script uses 10)
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 20,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.optim.clip_grad": 1.0,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.clip_ratio_c": 10.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "dapo",
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
    "algorithm.adv_estimator": "grpo",
    "algorithm.filter_groups.enable": True,
    "algorithm.filter_groups.metric": "acc",
    "data.max_prompt_length": 2048,
    "data.max_response_length": 20480,
    "reward.reward_manager.name": "recipe_dapo",
    "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
    "reward.reward_kwargs.overlong_buffer_cfg.len": 4096,
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
    "reward.reward_kwargs.max_resp_len": 20480,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 0.7,
    "actor_rollout_ref.rollout.val_kwargs.n": 32,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "dapo.dynamic_sampling.round_sizing": "whole",
    "dapo.dynamic_sampling.max_staleness": 0,
}

# What each ablation script changes relative to the paper's run, and nothing else of these keys.
ABLATIONS = {
    "dapo_qwen2.5_32b_no_dynamic_sampling.sh": {"algorithm.filter_groups.enable": False},
    "dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh": {
        "algorithm.filter_groups.enable": False,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
    },
    "grpo_qwen2.5_32b_baseline.sh": {
        "algorithm.filter_groups.enable": False,
        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
        "actor_rollout_ref.actor.clip_ratio_high": 0.2,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
        "dapo.overlong_filter.enable": False,
    },
}

SHIM = """#!/usr/bin/env bash
# Stand-in for python: records `-m recipe_dapo.main_dapo|dry_run ARGS` (NUL-separated) in $CAPTURE, runs the rest.
if [[ $1 == -m && ( $2 == recipe_dapo.main_dapo || $2 == recipe_dapo.dry_run ) ]]; then
  printf '%s\\0' "${@:2}" > "$CAPTURE"
  exit 0
fi
exec PYTHON_EXECUTABLE "$@"
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Real parquet files in the layout the scripts expect (DATA_DIR), from the offline copies."""
    out = tmp_path_factory.mktemp("dapo_data")
    if SHARED_DATA is None:
        return out  # the dry run then reports every data file as not checked
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # prepare_data.sh runs `python`
    env = {**os.environ, "DAPO_DATA_LOCAL_DIR": str(SHARED_DATA), "PATH": path}
    subprocess.run(
        ["bash", str(SCRIPTS / "prepare_data.sh"), str(out), "--only", "dapo-math-17k", "aime-2024", "math500"],
        env=env, check=True, capture_output=True, timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def launch_env(tmp_path_factory, data_dir) -> dict[str, str]:
    """Environment for running a script with the recording stand-in instead of python."""
    work = tmp_path_factory.mktemp("launch")
    shim = work / "python_shim"
    shim.write_text(SHIM.replace("PYTHON_EXECUTABLE", shlex.quote(sys.executable)))
    shim.chmod(0o755)
    # None of the caller's launch settings may leak in (an exported MODEL_PATH would change every script).
    env = {name: value for name, value in os.environ.items() if name not in launcher_variables() | CPU_RUN_VARIABLES}
    env.update(
        PYTHON=str(shim),
        CAPTURE=str(work / "capture"),
        DAPO_HOME=str(work / "dapo_home"),
        DATA_DIR=str(data_dir),
        WORK_DIR=str(work),
    )
    return env


# The variables scripts/launch_dapo.sh reads: paths, cluster, launch mode.
LAUNCHER_VARIABLES = {
    "DAPO_HOME", "DATA_DIR", "MODELS_DIR", "MODEL_PATH", "TRAIN_FILE", "VAL_FILES", "VAL_FILE", "CKPTS_DIR", "PYTHON",
    "NNODES", "GPUS_PER_NODE", "LAUNCH_MODE", "DRY_RUN", "PRINT_OVERRIDES", "RAY_ADDRESS", "RUNTIME_ENV", "WORKING_DIR",
    "JOB_PYTHON", "SUBMIT_NO_WAIT", "RAY", "JOB_ENV",
}


def removed_variables() -> dict[str, str]:
    """The former launcher's setting variables the launcher refuses, with the Hydra key it names (REMOVED_VARS)."""
    text = (SCRIPTS / "launch_dapo.sh").read_text()
    block = text[text.index("REMOVED_VARS=(") + len("REMOVED_VARS=(") :]
    return dict(entry.split("=", 1) for entry in block[: block.index(")")].split())


def launcher_variables() -> set[str]:
    """Every variable that changes what the launcher does (those it reads and those it refuses)."""
    return LAUNCHER_VARIABLES | set(removed_variables())


CPU_RUN_VARIABLES = {"MODEL_PATH", "TRAIN_FILE", "VAL_FILE", "TOKENIZER_PATH", "WORK_DIR", "DRY_RUN"}


def script_env(script: str, env: dict[str, str]) -> dict[str, str]:
    """run_dapo_cpu.sh takes its inputs as files (it would build a model and data when they are unset)."""
    if script != "run_dapo_cpu.sh":
        return env
    data_dir = Path(env["DATA_DIR"])
    return {
        **env,
        "MODEL_PATH": str(Path(env["WORK_DIR"]) / "no_model_here"),
        "TRAIN_FILE": str(data_dir / "dapo-math-17k.parquet"),
        "VAL_FILE": str(data_dir / "aime-2024.parquet"),
    }


def recorded_command(script: str, env: dict[str, str], *args: str, **extra_env: str) -> list[str]:
    """Run `bash scripts/<script> args` with the stand-in python; return `[module, *overrides]` it launched."""
    env = {**script_env(script, env), **extra_env}
    capture = Path(env["CAPTURE"])
    capture.unlink(missing_ok=True)
    result = subprocess.run(["bash", str(SCRIPTS / script), *args], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{script} failed:\n{result.stderr}"
    assert capture.exists(), f"{script} never ran python -m recipe_dapo...:\n{result.stdout}\n{result.stderr}"
    return capture.read_bytes().decode().split("\0")[:-1]


def overrides_of(script: str, env: dict[str, str], *args: str, **extra_env: str) -> list[str]:
    module, *overrides = recorded_command(script, env, *args, **extra_env)
    assert module == "recipe_dapo.main_dapo"
    return overrides


def value(config, key):
    return OmegaConf.select(config, key)


def resolved(config):
    return OmegaConf.create(OmegaConf.to_container(config, resolve=True))


@pytest.fixture(scope="module")
def composed(launch_env):
    """Each launch script's config, composed from the overrides it really passes."""
    return {script: compose(overrides_of(script, launch_env)) for script in LAUNCH_SCRIPTS}


def test_every_script_is_a_known_launch_or_helper_and_none_is_named_test():
    scripts = {path.name for path in SCRIPTS.glob("*.sh")}
    assert not [name for name in scripts if name.startswith("test_")], "pytest would collect test_*.sh names"
    unknown = scripts - set(LAUNCH_SCRIPTS) - set(HELPER_SCRIPTS)
    assert not unknown, f"add {sorted(unknown)} to LAUNCH_SCRIPTS (so the dry run covers it) or HELPER_SCRIPTS"
    assert set(LAUNCH_SCRIPTS) <= scripts


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_launch_script_composes_and_passes_every_dry_run_check(script, composed, launch_env):
    overrides = overrides_of(script, launch_env)
    # Scripts set existing verl/recipe keys only: `+key=` would bypass the unknown-key check.
    assert not [o for o in overrides if o.startswith("+")], overrides
    report = dry_run(composed[script], require_files=SHARED_DATA is not None)
    # Only the model (never loaded by a dry run) may be unchecked when the data were prepared.
    if SHARED_DATA is not None:
        assert all(item.startswith("actor_rollout_ref.model.path") for item in report.not_checked), report.not_checked


def test_paper_script_sets_every_hyperparameter_of_the_paper_run(composed):
    config = resolved(composed["dapo_qwen2.5_32b.sh"])
    wrong = {key: (value(config, key), want) for key, want in PAPER_32B.items() if value(config, key) != want}
    assert not wrong, f"key: (composed, paper) {wrong}"
    # Overlong shaping covers [L_max - L_cache, L_max] = [20480 - 4096, 20480]: 16,384 tokens are penalty-free.
    kwargs = config.reward.reward_kwargs
    assert kwargs.max_resp_len - kwargs.overlong_buffer_cfg.len == 16384


@pytest.mark.parametrize("script", sorted(ABLATIONS))
def test_ablation_script_differs_from_the_paper_run_only_where_the_ablation_says(script, composed):
    base, ablation = resolved(composed["dapo_qwen2.5_32b.sh"]), resolved(composed[script])
    changes = ABLATIONS[script]
    for key in [*PAPER_32B, *changes]:
        if key.startswith("dapo.dynamic_sampling"):
            continue  # sampler details do not matter when dynamic sampling is off
        want = changes.get(key, value(base, key))
        assert value(ablation, key) == want, f"{script}: {key}={value(ablation, key)}, expected {want}"


def test_small_scripts_fit_their_cluster(composed):
    one_gpu = composed["dapo_small_one_gpu.sh"]
    assert (one_gpu.trainer.nnodes, one_gpu.trainer.n_gpus_per_node) == (1, 1)
    one_node = composed["dapo_qwen2.5_1.5b_one_node.sh"]
    assert (one_node.trainer.nnodes, one_node.trainer.n_gpus_per_node) == (1, 8)
    # Qwen2.5-Math models have a 4,096-token context: prompt + response must fit in it.
    for script in ("dapo_qwen2.5_7b_math.sh", "dapo_qwen2.5_1.5b_one_node.sh"):
        data = composed[script].data
        assert data.max_prompt_length + data.max_response_length <= 4096, script


def test_paths_and_cluster_from_the_environment_beat_the_size_and_the_command_line_beats_both(launch_env):
    overrides = overrides_of(
        "dapo_small_one_gpu.sh", launch_env, "data.train_batch_size=48", "trainer.n_gpus_per_node=2",
        NNODES="3", GPUS_PER_NODE="4", MODEL_PATH="/models/mine",
    )
    config = compose(overrides)
    assert (config.trainer.nnodes, config.trainer.n_gpus_per_node) == (3, 2)
    assert config.actor_rollout_ref.model.path == "/models/mine"
    # The size says 32 prompts; the command line's 48 also sets the generation round (3 x 48).
    assert config.data.train_batch_size == 48 and config.data.gen_batch_size == 144
    # The size's data files are found in DATA_DIR; checkpoints go to $DAPO_HOME/ckpts/<project>/<experiment>.
    assert config.data.val_files == [str(Path(launch_env["DATA_DIR"]) / "math500.parquet")]
    assert config.trainer.default_local_dir == str(
        Path(launch_env["DAPO_HOME"]) / "ckpts" / "recipe_dapo" / "dapo-qwen2.5-0.5b-instruct"
    )


@pytest.mark.parametrize(("variable", "value"), [("TRAIN_BATCH_SIZE", "64"), ("OVERLONG_BUFFER_LEN", "512")])
def test_a_former_setting_variable_stops_the_launch_naming_the_hydra_key(launch_env, variable, value):
    Path(launch_env["CAPTURE"]).unlink(missing_ok=True)
    result = subprocess.run(
        ["bash", str(SCRIPTS / "dapo_small_one_gpu.sh")], env={**launch_env, variable: value},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0 and not Path(launch_env["CAPTURE"]).exists()
    assert f"pass {removed_variables()[variable]}={value} on the command line" in result.stderr


def test_an_overlay_option_stops_the_launch_naming_the_groups(launch_env):
    result = subprocess.run(["bash", str(SCRIPTS / "launch_dapo.sh"), "--overlay", "qwen2.5_7b_math"],
                            env=launch_env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "size=qwen2.5_7b_math" in result.stderr


def test_ray_submit_sends_the_same_overrides_with_the_runtime_env(launch_env, tmp_path):
    record = tmp_path / "ray_args"
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n')
    fake_ray.chmod(0o755)
    subprocess.run(
        ["bash", str(SCRIPTS / "ray_job_submit.sh"), str(SCRIPTS / "dapo_qwen2.5_32b.sh"), "trainer.save_freq=10"],
        env={**launch_env, "RAY": str(fake_ray)}, check=True, capture_output=True, timeout=60,
    )
    args = record.read_bytes().decode().split("\0")[:-1]
    assert args[:2] == ["job", "submit"]
    options = dict(zip(args[2:], args[3:]))
    runtime_env = yaml.safe_load(Path(options["--runtime-env"]).read_text())
    assert runtime_env["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == "recipe_dapo.plugin"
    assert Path(options["--working-dir"]) == REPO_ROOT
    # The entrypoint as separate arguments (Ray quotes each for the shell on the head): exactly the local command.
    entrypoint = args[args.index("--") + 1 :]
    local = overrides_of("dapo_qwen2.5_32b.sh", launch_env, "trainer.save_freq=10")
    assert entrypoint == ["python3", "-m", "recipe_dapo.main_dapo", *local]


def test_the_cpu_run_goes_to_the_cluster_as_a_job_writing_its_files_in_work_dir(launch_env, tmp_path):
    # The same submission for the CPU run (tests/e2e/test_scale_on_cpu.py sends it to a real two-node cluster): the
    # runtime env is the file's plus VERL_FILE_LOGGER_ROOT, since the job's processes start in the uploaded copy.
    record = tmp_path / "ray_args"
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > {shlex.quote(str(record))}\n')
    fake_ray.chmod(0o755)
    env = {**script_env("run_dapo_cpu.sh", launch_env), "RAY": str(fake_ray), "JOB_ENV": "EXTRA=1"}
    subprocess.run(["bash", str(SCRIPTS / "ray_job_submit.sh"), str(SCRIPTS / "run_dapo_cpu.sh"), "trainer.nnodes=2"],
                   env=env, check=True, capture_output=True, timeout=60)
    args = record.read_bytes().decode().split("\0")[:-1]
    options = dict(zip(args[2:], args[3:]))
    assert "--runtime-env" not in options and Path(options["--working-dir"]) == REPO_ROOT
    runtime_env = json.loads(options["--runtime-env-json"])
    from_file = yaml.safe_load((SCRIPTS / "runtime_env.yaml").read_text())
    assert runtime_env["excludes"] == from_file["excludes"]
    assert runtime_env["env_vars"] == {
        **from_file["env_vars"], "VERL_FILE_LOGGER_ROOT": launch_env["WORK_DIR"], "EXTRA": "1"
    }
    entrypoint = args[args.index("--") + 1 :]
    local = overrides_of("run_dapo_cpu.sh", launch_env, "trainer.nnodes=2")
    assert entrypoint == ["python3", "-m", "recipe_dapo.main_dapo", *local]


def test_dry_run_refuses_a_cluster_that_cannot_hold_the_parallel_layout(composed, launch_env):
    overrides = overrides_of("dapo_qwen2.5_32b.sh", launch_env, "trainer.nnodes=1", "trainer.n_gpus_per_node=6")
    with pytest.raises(DAPOConfigError) as error:
        dry_run(compose(overrides))
    message = str(error.value)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=4" in message
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8" in message


def test_dry_run_refuses_legacy_reward_keys_that_verl_would_ignore(launch_env):
    # An old script's reward line: verl 0.9.1 keeps the key in its schema but its trainer never reads it.
    overrides = overrides_of("dapo_small_one_gpu.sh", launch_env, "reward_model.reward_manager=dapo")
    with pytest.raises(DAPOConfigError, match=r"reward_model.reward_manager='dapo' .*reward.reward_manager.name"):
        dry_run(compose(overrides))


@pytest.mark.parametrize("script", sorted(CARDS))
def test_gpu_script_states_its_card_so_its_dry_run_prints_the_plan_with_headroom(script, composed):
    # What the dry run prints after its checks (recipe_dapo.dry_run), for the config the script really composes.
    lines = plan_lines(composed[script])
    assert lines[0].endswith(f"; {CARDS[script]} GiB per GPU, dapo.memory.gpu_memory_gib):"), lines
    phases = lines[2:lines.index(next(line for line in lines if line.startswith("  KV cache")))]
    assert [row.split()[0] for row in phases][:2] == ["rollout", "old"] and len(phases) >= 4, lines
    assert all(float(row.split()[-1]) > 0 for row in phases), lines  # headroom in GiB on every phase
    assert not [line for line in lines if line.startswith(("does not fit", "memory plan:"))], lines


def test_without_a_card_the_plan_says_so_in_one_line_and_the_cpu_run_is_not_planned(composed):
    # launch_dapo.sh names no card and this machine has no GPU: the table without headroom, then one line.
    lines = plan_lines(composed["launch_dapo.sh"])
    assert "GPU memory unknown" in lines[0] and lines[-1] == GPU_MISSING
    assert all(row.split()[-1] == "?" for row in lines[2:6]), lines
    assert plan_lines(composed["run_dapo_cpu.sh"]) == []


@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_dry_run_flag_runs_the_dry_run_with_the_same_overrides(script, launch_env):
    module, *overrides = recorded_command(script, launch_env, DRY_RUN="1")
    assert module == "recipe_dapo.dry_run"
    assert overrides == overrides_of(script, launch_env)


def _dry_run_process(script: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    # The real python this time, and no data files: the checks of real files ran above, in this process.
    env = {**script_env(script, env), "DRY_RUN": "1", "PYTHON": sys.executable}
    env["DATA_DIR"] = os.path.join(env["WORK_DIR"], "no_data")
    return subprocess.Popen(
        ["bash", str(SCRIPTS / script), *args],
        env=env, cwd=env["WORK_DIR"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_dry_run_mode_end_to_end_passes_a_good_config_and_names_the_key_of_a_bad_one(launch_env):
    # Started together: each is a Python process importing verl (the unknown key fails before that).
    runs = {
        "good": _dry_run_process("dapo_small_one_gpu.sh", launch_env),
        "bad value": _dry_run_process("dapo_small_one_gpu.sh", launch_env, "algorithm.filter_groups.metric=nope"),
        "unknown key": _dry_run_process("dapo_small_one_gpu.sh", launch_env, "algorithm.filter_groups.metrc=acc"),
    }
    outputs = {name: run.communicate(timeout=300)[0] for name, run in runs.items()}
    codes = {name: run.returncode for name, run in runs.items()}
    assert codes["good"] == 0, outputs["good"]
    assert "dry run OK" in outputs["good"]
    assert codes["bad value"] != 0, outputs["bad value"]
    assert "algorithm.filter_groups.metric='nope'" in outputs["bad value"], outputs["bad value"]
    assert codes["unknown key"] != 0, outputs["unknown key"]
    assert "algorithm.filter_groups.metrc" in outputs["unknown key"], outputs["unknown key"]
    # The dry run leaves no Hydra output folder behind.
    assert not (Path(launch_env["WORK_DIR"]) / "outputs").exists()


def test_cpu_run_refuses_a_mistyped_key_or_a_refused_setting_before_building_its_inputs(tmp_path):
    """The start-up rules and Hydra's composition run before the default model and data are built
    (about 20 s), so a mistake is reported in seconds and nothing is built."""
    import time

    env = {name: value for name, value in os.environ.items() if name not in CPU_RUN_VARIABLES}
    env["PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    mistakes = {
        "mistyped key": ("trainer.total_training_stepz=2", "did you mean trainer.total_training_steps?"),
        "refused value": ("algorithm.filter_groups.metric=nope", "algorithm.filter_groups.metric='nope'"),
    }
    started = time.monotonic()
    runs = {}
    for name, (override, _) in mistakes.items():
        work = tmp_path / name.replace(" ", "_")
        runs[name] = (work, subprocess.Popen(
            ["bash", str(SCRIPTS / "run_dapo_cpu.sh"), override], env={**env, "WORK_DIR": str(work)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    for name, (work, run) in runs.items():
        output = run.communicate(timeout=120)[0]
        assert run.returncode == 1, output
        assert mistakes[name][1] in output, output
        assert not work.exists(), f"{name}: {sorted(p.name for p in work.rglob('*'))} built before the refusal"
    # Each is a Python process that composes the config without importing verl or torch (~2 s alone).
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("extra", [[], ["algorithm.filter_groups.metric=nope"]], ids=["passes", "refused"])
def test_the_rules_only_dry_run_imports_neither_verl_nor_torch(extra, tmp_path):
    """What run_dapo_cpu.sh runs before building its inputs stays a ~2 s check, whether it passes or refuses."""
    absent = tmp_path / "absent"
    args = ["platform=cpu", "size=cpu_tiny", f"data.train_files={absent}/t.parquet",
            f"data.val_files={absent}/v.parquet", f"actor_rollout_ref.model.path={absent}/model", *extra]
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['dry_run', *{args!r}]\n"
        "try:\n"
        "    runpy.run_module('recipe_dapo.dry_run', run_name='__main__')\n"
        "finally:\n"
        "    print('IMPORTED', 'verl' in sys.modules, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "DAPO_DRY_RUN_RULES_ONLY": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == (1 if extra else 0), result.stderr
    assert result.stdout.strip().splitlines()[-1] == "IMPORTED False False", result.stdout + result.stderr
    assert ("refused the configuration" in result.stderr) == bool(extra)


@pytest.mark.parametrize("script", sorted(CARDS))
def test_a_gpu_scripts_dry_run_warns_of_nothing_or_gives_the_reason_the_script_states(script, composed, launch_env,
                                                                                     caplog):
    """On the card it states, a shipped GPU script's settings fit their plan, or the script says why a warning of the
    start-up is expected (dapo.memory.kv_waves_expected), and its dry run gives that reason in place of the warning."""
    with caplog.at_level(logging.INFO):
        dry_run(composed[script])
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert not warnings, f"{script}'s own settings: {warnings}"
    reason = value(composed[script], KV_WAVES_KNOB)
    if reason is None:
        return
    said = [record.getMessage() for record in caplog.records if reason in record.getMessage()]
    assert len(said) == 1 and f"expected here ({KV_WAVES_KNOB}): {reason}" in said[0], said
    # The reason is what keeps the warning away: without it, the same dry run warns, naming the knob.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        dry_run(compose(overrides_of(script, launch_env, f"{KV_WAVES_KNOB}=null")))
    warned = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warned) == 1 and "KV cache" in warned[0] and KV_WAVES_KNOB in warned[0], warned
