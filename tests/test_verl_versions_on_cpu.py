"""The verl releases the recipe supports: setup.py and the start-up check agree, any other installed verl is refused in
one line naming both versions, trainer.use_v1=true is refused where verl's v1 trainer lacks the recipe's hooks, and the
plugin never breaks ``import verl`` on a verl it does not support (``recipe_dapo.preflight.versions``)."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap

import pytest
from packaging.version import Version

from conftest import REPO_ROOT, compose_recipe_config
from recipe_dapo.preflight import DAPOConfigError, check_rules
from recipe_dapo.preflight import versions
from recipe_dapo.preflight.versions import SUPPORTED_VERL, V1_TRAINER_MIN_VERL, installed_verl, verl_version_problem


def test_setup_py_declares_the_range_the_start_up_check_accepts():
    requirements = re.findall(r'^\s*"(verl[<>=!~ ][^"]*)",', (REPO_ROOT / "setup.py").read_text(), re.MULTILINE)
    assert requirements == [f"verl{SUPPORTED_VERL}"]


@pytest.mark.parametrize("version", ["0.9.0", "0.9.1", "0.9.2.dev0"])
def test_the_09_releases_are_supported(version):
    assert verl_version_problem(version) is None


@pytest.mark.parametrize(
    "version, why",
    [
        ("0.8.0", "no 'verl.plugins' entry points"),
        ("0.8.5", "numpy<2"),
        ("0.10.0", "internals change between minor releases"),
        (None, "verl is not installed"),
    ],
)
def test_other_versions_are_refused_in_one_line_naming_both_versions_and_the_fix(version, why):
    problem = verl_version_problem(version)
    assert "\n" not in problem and why in problem and SUPPORTED_VERL in problem
    assert f"pip install 'verl{SUPPORTED_VERL}'" in problem
    if version:
        assert f"verl {version} is installed" in problem


def _fake_site(tmp_path, version: str, package: str | None = None):
    """A folder that, first on sys.path, makes ``verl`` look like ``version`` (metadata; optionally a package)."""
    site = tmp_path / "site"
    info = site / f"verl-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {version}\n")
    if package is not None:
        (site / "verl").mkdir()
        (site / "verl" / "__init__.py").write_text(package)
    return site


def _run(code: str, site, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_RAYLET_PID")}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(site), str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env=environ, cwd=REPO_ROOT / "tests")


def test_the_start_up_check_reads_the_installed_verls_metadata_and_refuses_08(tmp_path):
    # verl 0.8.5's metadata first on sys.path, as in an environment where pip installed it.
    code = """
        from conftest import compose_recipe_config
        from recipe_dapo.preflight import DAPOConfigError, check_rules
        try:
            check_rules(compose_recipe_config())
        except DAPOConfigError as error:
            print([p for p in error.problems if "verl 0.8.5" in p])
    """
    result = _run(code, _fake_site(tmp_path, "0.8.5"))
    assert result.returncode == 0, result.stderr[-3000:]
    (problem,) = eval(result.stdout.strip().splitlines()[-1])
    assert problem.startswith(f"verl 0.8.5 is installed; the recipe supports verl{SUPPORTED_VERL}")
    assert "'verl.plugins' entry points" in problem and "numpy<2" in problem


def _problems(overrides, monkeypatch, version) -> list[str]:
    monkeypatch.setattr(versions, "installed_verl", lambda: version)
    try:
        check_rules(compose_recipe_config(overrides))
    except DAPOConfigError as error:
        return error.problems
    return []


def test_v1_trainer_is_refused_on_090_with_the_reason_and_the_classic_trainer_is_not(monkeypatch):
    v1 = [p for p in _problems(["trainer.use_v1=true"], monkeypatch, "0.9.0") if "trainer.use_v1=true needs" in p]
    assert len(v1) == 1 and "verl 0.9.0 is installed" in v1[0] and "prepare_step" in v1[0]
    assert "trainer.use_v1=false" in v1[0]
    assert not [p for p in _problems([], monkeypatch, "0.9.0") if "verl" in p.split(":")[0]]
    assert not [p for p in _problems(["trainer.use_v1=true"], monkeypatch, "0.9.1") if "needs verl" in p]


def test_the_v1_refusal_matches_the_installed_verls_v1_trainer():
    """The hooks the recipe's v1 trainer overrides exist exactly from V1_TRAINER_MIN_VERL on (run on 0.9.0 by
    scripts/verl_compat.sh); ``register_trainer`` itself exists on both."""
    from verl.trainer.ppo.v1 import register_trainer  # noqa: F401  (0.9.0 exports it too)
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    has_hooks = hasattr(PPOTrainer, "prepare_step") and (
        "expected_acc_counts" in inspect.signature(PPOTrainer._val_metrics_update).parameters
    )
    assert has_hooks == (Version(installed_verl()) >= Version(V1_TRAINER_MIN_VERL))


def test_the_plugin_does_not_break_import_verl_on_a_verl_without_its_platform_registry(tmp_path):
    # A verl 0.8-like package (no verl.plugin.platform) that imports the plugin as VERL_USE_EXTERNAL_MODULES would.
    site = _fake_site(tmp_path, "0.8.5", package="__version__ = '0.8.5'\nimport recipe_dapo.plugin\n")
    code = """
        import verl
        from recipe_dapo.import_hooks import failed_hooks
        from recipe_dapo.plugin import PluginNotLoadedError, check_plugins_registered
        try:
            check_plugins_registered(where="the driver")
        except PluginNotLoadedError as error:
            print(sorted(failed_hooks), "platform:cpu" in str(error))
    """
    result = _run(code, site, VERL_PLATFORM="cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "['recipe_dapo.cpu.platform'] True"


def test_a_verl_source_checkout_without_metadata_is_read_from_its_version_file(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (checkout / "verl" / "version").mkdir(parents=True)
    (checkout / "verl" / "__init__.py").write_text("raise RuntimeError('the version check must not import verl')\n")
    (checkout / "verl" / "version" / "version").write_text("0.9.0\n")

    def no_metadata(name):
        raise versions.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(versions.importlib.metadata, "version", no_metadata)
    monkeypatch.syspath_prepend(str(checkout))
    monkeypatch.delitem(sys.modules, "verl", raising=False)
    assert installed_verl() == "0.9.0"
