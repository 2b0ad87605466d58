"""The recipe on verl 0.9.0, the older release ``setup.py`` supports (the main environment has verl 0.9.1).

An overlay environment built by ``scripts/verl_compat.sh`` (``ONLY=env``; the session's ``verl_overlay`` in
tests/e2e/e2e_runs.py): a virtual environment whose own site-packages holds only verl 0.9.0 (the wheel from the package
index, ``--no-deps``), with the main environment's site-packages appended through a ``.pth`` file, so every other
package is the main one's. On it:

- ``trainer.use_v1=true`` is refused at start-up in one line naming verl 0.9.0 and the 0.9.1 it needs, before Ray;
- the tests that touch verl's API, selected test by test in ``tests/e2e/verl_compat_tests.txt`` (plugin registration,
  the loss against verl's loss code and agg_loss, the reward manager, the classic trainer's protocol), pass.

The training run on verl 0.9.0 is the scale module's two-node Ray job (tests/e2e/test_scale_on_cpu.py): its nodes'
environment has this verl and not the recipe, as an existing 0.9.0 cluster would, and it trains 2 steps with the
``dapo`` loss and the ``recipe_dapo`` reward manager at DP 2. No validation and no checkpoint resume on 0.9.0: those
are verl code paths the runs of test_e2e_dapo_cpu_on_cpu.py cover on 0.9.1 (``bash scripts/verl_compat.sh`` runs the
default run, with its validation, on 0.9.0 by hand). Skipped, saying so, when the package index is unreachable
(offline: ``VERL=/path/verl-0.9.0-py3-none-any.whl bash scripts/verl_compat.sh`` by hand).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from e2e_runs import OLDER_VERL as VERL, REPO_ROOT, default_script_env, in_background, metrics_file, overlay_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

API_TESTS_FILE = REPO_ROOT / "tests" / "e2e" / "verl_compat_tests.txt"


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


@pytest.fixture(scope="module")
def overlay_python(verl_overlay) -> str:
    """The overlay's python (verl 0.9.0 over the main environment); skips, saying why, without the package index."""
    return verl_overlay.python_or_skip()


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


@in_background("verl_overlay", name="verl_api_tests")
def run_verl_api_tests(runs, work_dir, assets, env) -> subprocess.CompletedProcess | None:
    """The listed tests on the overlay's python, in the background queue after the two-node job (so that they run
    beside the e2e tests that need no queue, the evaluation command's, instead of after them); None without the
    overlay (the test skips, saying why)."""
    overlay = runs.result("verl_overlay")
    if overlay.python is None:
        return None
    return subprocess.run(
        [str(overlay.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--timeout", "600", *api_tests()],
        cwd=REPO_ROOT, env=overlay_env(env), capture_output=True, text=True, timeout=840,
    )


@pytest.fixture(scope="module")
def verl_api_tests(shared_runs, overlay_python) -> subprocess.CompletedProcess:
    return shared_runs.result("verl_api_tests")


def test_the_tests_that_touch_verls_api_pass_on_verl_090(verl_api_tests):
    selected = api_tests()
    completed = verl_api_tests
    output = completed.stdout + completed.stderr
    # Exit status 4 (a listed test no longer exists) and 5 (none collected) fail here too.
    assert completed.returncode == 0, f"on verl {VERL}:\n{output[-6000:]}"
    summary = output.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= len(selected), summary
    # The only skips allowed: compat sites declared as used from a later verl than this one (-rs names each).
    skips = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert bool(skips) == ("skipped" in summary), output[-3000:]
    assert all(re.search(r"is used from \S+ 0\.9\.[1-9]", line) for line in skips), "\n".join(skips)
