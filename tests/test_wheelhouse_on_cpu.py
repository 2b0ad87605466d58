"""The offline wheelhouse (``scripts/wheelhouse.sh``, ``scripts/lib/wheelhouse.py``) and the installation check
(``recipe_dapo.preflight.install``).

The offline install itself is tested by every install: ``scripts/install_cpu.sh`` downloads the wheels into a
wheelhouse, then installs its hashed lock with uv's (or pip's) ``--no-index``, no configuration and a dead proxy, and
runs the installation check; ``test_this_environment_was_installed_offline_from_its_wheelhouse`` reads the record it
leaves (``<venv>/recipe_dapo_wheelhouse.json``) for the environment running the tests (CI's, freshly installed) and
compares it with what is installed. The rest: the download (uv's resolution, pip's download, sdists built into
wheels) on the real uv and pip with a local folder as their only index, the command line's refusals (an altered wheel
by pip's hash check), and the pure helpers. Wall time: about 2 minutes on the 2-core machine under load.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from recipe_dapo.preflight.install import accelerator_verdict, import_fix

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "wheelhouse.sh"
_spec = importlib.util.spec_from_file_location("wheelhouse", REPO_ROOT / "scripts" / "lib" / "wheelhouse.py")
wheelhouse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheelhouse)

REQUIRE_RECORD_ENV = "DAPO_REQUIRE_WHEELHOUSE_RECORD"  # .ci/run sets it: there the record must exist


# ------------------------------------------------------------------------------------------------ the CI install


def _record() -> dict:
    path = Path(sys.prefix) / wheelhouse.RECORD
    if not path.is_file():
        if os.environ.get(REQUIRE_RECORD_ENV) == "1":
            pytest.fail(f"{path} is missing: scripts/install_cpu.sh did not install this environment through the "
                        "wheelhouse (or failed before writing its record)")
        pytest.skip(f"this environment ({sys.prefix}) was not installed by scripts/install_cpu.sh through the "
                    "wheelhouse (no record); CI's is")
    return json.loads(path.read_text())


def _pinned(constraints: Path) -> dict:
    pins = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[wheelhouse.normalize(name)] = version.strip()
    return pins


def test_this_environment_was_installed_offline_from_its_wheelhouse():
    record = _record()
    manifest = record["manifest"]
    installer, command, env = record["installer"], record["install_command"], record["install_env"]
    # The installer had the wheelhouse and nothing else: no index, no other find-links, no configuration, no network.
    assert "--no-index" in command, command
    assert command.count("--find-links") == 1 and command[command.index("--find-links") + 1] == record["wheelhouse"]
    assert not [arg for arg in command if "index-url" in arg], command
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PIP_NO_INDEX"] == "1"
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == wheelhouse.DEAD_PROXY
    held_uv = [wheel for wheel in manifest["wheels"] if wheel["name"] == "uv"]
    if installer == "uv":  # uv, put into this environment from the wheelhouse, offline, with no uv configuration
        bin_dir = (Path(sys.prefix) / "bin").resolve()
        assert Path(command[0]).parent.resolve() == bin_dir and command[1:3] == ["pip", "install"], command
        # Compiled at install where Python may not write bytecode (PYTHONDONTWRITEBYTECODE set in the install's
        # environment), as pip does; else each module is compiled and cached at its first import. A record without
        # the variable's value comes from an install that always compiled.
        dont_write = record.get("PYTHONDONTWRITEBYTECODE", "always compiled")
        assert ("--compile-bytecode" in command) == bool(dont_write), (dont_write, command)
        assert "--offline" in command and Path(command[command.index("--python") + 1]).parent.resolve() == bin_dir
        assert env["UV_NO_CONFIG"] == "1" and {key for key in env if key.startswith("UV_")} == {"UV_NO_CONFIG",
                                                                                               "UV_CACHE_DIR"}
        assert not Path(env["UV_CACHE_DIR"]).exists()  # a temporary cache, removed after the install
        assert record["uv_fallback"] is None and held_uv
    else:
        assert installer == "pip" and command[1:4] == ["-m", "pip", "install"] and "--isolated" in command, command
        # pip only where uv was turned off (WHEELHOUSE_INSTALLER=pip) or the record says why uv did not install
        assert record["installer_choice"] == "pip" or record["uv_fallback"], record["uv_fallback"]

    # What is installed here is what the wheelhouse held, at the same versions, less what the manifest removes.
    # Read from the environment's own site-packages: once anything imported setuptools, its vendored packages
    # (setuptools/_vendor/*.dist-info: jaraco.*, inflect, ...) are on sys.path too, though pip installed none of them.
    site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    installed = {wheelhouse.normalize(dist.metadata["Name"]): dist.version
                 for dist in importlib.metadata.distributions(path=site_packages)}
    held = {wheel["name"]: wheel["version"] for wheel in manifest["wheels"] if wheel["origin"] != "recipe"}
    removed = set(manifest["remove_after_install"]["packages"])
    venv_bootstrap = {"pip", "setuptools", "wheel"}  # `python -m venv` puts pip and setuptools there itself
    not_from_wheelhouse = {name: version for name, version in installed.items()
                           if name != "recipe-dapo" and held.get(name) != version and name not in venv_bootstrap}
    assert not not_from_wheelhouse, f"installed but not from the wheelhouse: {not_from_wheelhouse}"
    build_only = set(wheelhouse.BUILD_BACKEND) | (set(wheelhouse.INSTALLER) if installer == "pip" else set())
    not_installed = sorted(set(held) - set(installed) - removed - build_only)
    assert not not_installed, f"in the wheelhouse but not installed: {not_installed}"
    assert removed == {"torchvision", "torchaudio", "torchcodec"} and not removed & set(installed)
    assert set(record["removed"]) == removed

    # The wheelhouse respected scripts/constraints-cpu.txt: every pinned package it holds has the pinned version.
    assert manifest["constraints"]["file"] == "scripts/constraints-cpu.txt"
    pins = _pinned(REPO_ROOT / "scripts" / "constraints-cpu.txt")
    off_pin = {name: (version, pins[name]) for name, version in held.items() if name in pins and pins[name] != version}
    assert not off_pin, f"wheel version != scripts/constraints-cpu.txt pin: {off_pin}"
    assert held["torch"] == "2.13.0+cpu"

    # The recipe is the editable checkout (install_cpu.sh), and the installation check passed in full.
    # (the checkout's own recipe_dapo.egg-info, found first from the working directory, has no direct_url.json)
    installed_recipe = [dist for dist in importlib.metadata.distributions(name="recipe_dapo")
                        if dist.read_text("direct_url.json")]
    assert len(installed_recipe) == 1, [str(dist._path) for dist in importlib.metadata.distributions(name="recipe_dapo")]
    direct_url = json.loads(installed_recipe[0].read_text("direct_url.json"))
    assert direct_url["dir_info"].get("editable") and direct_url["url"] == Path(record["editable"]).as_uri()
    assert record["check_exit"] == 0 and record["check"]["failed"] == []
    names = [check["name"] for check in record["check"]["checks"]]
    assert {"verl", "vllm", "accelerator", "plugins"} <= set(names), names
    assert all(check["ok"] for check in record["check"]["checks"])


# ------------------------------------------------------------------------------------------------ the sdist fallback

BACKEND = '''
import base64, hashlib, os, zipfile
NAME, VERSION, TAG, REQUIRES = {name!r}, {version!r}, {tag!r}, {requires!r}

def _metadata():
    return "Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n" % (NAME, VERSION) + "".join(
        "Requires-Dist: %s\\n" % r for r in REQUIRES)

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "%s-%s.dist-info" % (NAME, VERSION)
    files = {{NAME + "/__init__.py": "VALUE = 1\\n", info + "/METADATA": _metadata(),
             info + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: %s\\n" % TAG}}
    record = []
    name = "%s-%s-%s.whl" % (NAME, VERSION, TAG)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (path, digest, len(text)))
        archive.writestr(info + "/RECORD", "\\n".join(record + [info + "/RECORD,,"]) + "\\n")
    return name
'''


def _sdist(folder: Path, name: str, version: str, tag: str = "py3-none-any", requires=()) -> None:
    """An sdist whose in-tree PEP 517 backend builds a wheel with ``tag`` (no setuptools needed: pip builds it
    offline)."""
    base = folder / "src" / f"{name}-{version}"
    base.mkdir(parents=True)
    (base / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (base / "backend.py").write_text(BACKEND.format(name=name, version=version, tag=tag, requires=list(requires)))
    (base / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    with tarfile.open(folder / f"{name}-{version}.tar.gz", "w:gz") as archive:
        archive.add(base, arcname=base.name)


def _wheel(folder: Path, name: str, version: str, requires=()) -> Path:
    """A pure-Python wheel that needs ``requires``."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                         + "".join(f"Requires-Dist: {r}\n" for r in requires))
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path):
    """A folder that is pip's only index: a wheel that needs a package published only as an sdist."""
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "tinyapp", "1.0", requires=["tinysdist>=2"])
    _sdist(index, "tinysdist", "2.1")
    _sdist(index, "tinynative", "1.0", tag="cp311-cp311-linux_x86_64")
    _wheel(index, "tinyneedsnative", "1.0", requires=["tinynative"])
    _wheel(index, "tinyextra", "1.0", requires=["tinyapp"])
    return index


PIP = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check"]  # no pip configuration: no index


def _index_args(index: Path) -> list:
    return ["--no-index", "--find-links", str(index)]


OTHER_TARGET = ("3.11", "manylinux_2_28_x86_64")


@pytest.mark.parametrize("pinned, target", [(False, OTHER_TARGET), (True, OTHER_TARGET), (True, (None, None))],
                         ids=["other-target", "other-target-pinned", "this-machine-pinned"])
def test_a_requirement_with_only_an_sdist_is_built_into_a_wheel_and_the_download_resumes(local_index, tmp_path,
                                                                                          pinned, target):
    """pip downloads for another target over binary wheels only: uv resolves (reading the sdist's metadata; pinned
    by a constraints file too, as constraints-cpu.txt pins hydra-core's sdist-only antlr4 runtime), pip fetches the
    sdist and builds it, for another target and for this machine alike; a package left out is not downloaded."""
    constraints = None
    if pinned:
        constraints = tmp_path / "constraints.txt"
        constraints.write_text("tinysdist==2.1\n")
    # Twice: the second build takes pip's cached wheel, still told from a downloaded one.
    for staging in (tmp_path / "house-again", tmp_path / "house"):
        staging.mkdir()
        built = wheelhouse.download(PIP, _index_args(local_index), ["tinyapp", "tinyextra"], staging, constraints,
                                    *target, leave_out=["tinyextra"])
        assert built == {"tinysdist": "tinysdist-2.1-py3-none-any.whl"}
        assert sorted(path.name for path in staging.iterdir()) == ["tinyapp-1.0-py3-none-any.whl",
                                                                    "tinysdist-2.1-py3-none-any.whl"]
    # The lock holds every wheel's pin and sha256, and the manifest says where each came from.
    wheels = wheelhouse.write_lock(staging, "tinyapp-1.0-py3-none-any.whl", built)
    assert {wheel["name"]: wheel["origin"] for wheel in wheels} == {"tinyapp": "recipe",
                                                                     "tinysdist": "built from sdist"}
    sha = {wheel["name"]: hashlib.sha256((staging / wheel["file"]).read_bytes()).hexdigest() for wheel in wheels}
    assert (staging / wheelhouse.LOCK).read_text().splitlines() == [
        f"tinyapp==1.0 --hash=sha256:{sha['tinyapp']}", f"tinysdist==2.1 --hash=sha256:{sha['tinysdist']}"]


def test_an_sdist_that_builds_a_platform_wheel_is_refused_for_another_target(local_index, tmp_path):
    staging = tmp_path / "house"
    staging.mkdir()
    with pytest.raises(wheelhouse.WheelhouseError, match=r"tinynative has no wheel for the target and its sdist "
                       r"builds a platform-specific wheel here \(tinynative-1.0-cp311-cp311-linux_x86_64.whl\): build "
                       r"the wheelhouse on a machine of the target's platform and Python"):
        wheelhouse.download(PIP, _index_args(local_index), ["tinyneedsnative"], staging, None, *OTHER_TARGET)


def test_a_requirement_that_exists_nowhere_fails_with_the_resolvers_reason(local_index, tmp_path):
    with pytest.raises(wheelhouse.WheelhouseError, match=r"(?s)uv could not resolve the wheels for Python 3.11, "
                       r"manylinux_2_28_x86_64:\n.*nosuchpackage was not found in the provided package locations.*"
                       r"\n\(check the name"):
        wheelhouse.download(PIP, _index_args(local_index), ["nosuchpackage"], tmp_path, None, *OTHER_TARGET)
    with pytest.raises(wheelhouse.WheelhouseError, match=r"(?s)uv could not resolve the wheels for this machine:\n.*"
                       r"nosuchpackage was not found in the provided package locations"):
        wheelhouse.download(PIP, _index_args(local_index), ["nosuchpackage"], tmp_path, None)


def test_the_lock_is_downloaded_by_several_pips_each_entry_with_all_its_hash_lines(local_index, tmp_path):
    """The lock's entries (a pin, then its indented hash lines, as uv writes them) split over pip processes run at
    once: every wheel arrives, an entry keeps every hash line (tinyapp's right hash is its second), and a wheel that
    matches none of its hashes fails its pip, whose output is what the build reports."""
    names = ("tinyapp", "tinyextra", "tinyneedsnative")
    wheels = {name: local_index / f"{name}-1.0-py3-none-any.whl" for name in names}
    digest = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in wheels.items()}

    def entry(name: str, *hashes: str) -> str:
        return f"{name}==1.0 \\\n" + " \\\n".join(f"    --hash=sha256:{value}" for value in hashes)

    lock, staging = tmp_path / "requirements.lock", tmp_path / "house"
    staging.mkdir()
    download = PIP + ["download", "--quiet", "--no-deps", "--require-hashes", "-d", staging, *_index_args(local_index)]
    lock.write_text("\n".join([entry("tinyapp", "0" * 64, digest["tinyapp"]), entry("tinyextra", digest["tinyextra"]),
                               entry("tinyneedsnative", digest["tinyneedsnative"])]) + "\n")
    assert wheelhouse.download_in_parallel(download, lock, processes=2) == ""
    assert sorted(path.name for path in staging.iterdir()) == sorted(path.name for path in wheels.values())

    lock.write_text("\n".join([entry("tinyextra", digest["tinyextra"]), entry("tinyapp", "0" * 64)]) + "\n")
    failed = wheelhouse.download_in_parallel(download, lock, processes=2)
    assert "DO NOT MATCH THE HASHES" in failed and "tinyapp" in failed and digest["tinyapp"] in failed, failed


# ------------------------------------------------------------------------------------------------ command line


def _cli(*args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.parametrize("args, status, message", [
    ((), 2, "the following arguments are required: {build,install}"),
    (("build",), 2, "the following arguments are required: DIR"),
    (("frobnicate", "x"), 2, "invalid choice: 'frobnicate'"),
    (("build", "{tmp}/h", "--python", "2.7"), 2, "argument --python: '2.7' is not a Python version such as 3.11"),
    (("build", "{tmp}/h", "--platform", "manylinux 2 28"), 2, "is not a wheel platform tag; use one such as"),
    (("build", "{tmp}/h", "--extras", "gpu,,!x"), 2, "is not a comma-separated list of the recipe's extras"),
    (("build", "{tmp}/h", "--constraints", "{tmp}/none.txt"), 2, "none.txt': [Errno 2] No such file or directory"),
    (("build", "{tmp}/h", "--constraints", "{tmp}/something.txt", "--no-constraints"), 2, "not allowed with argument"),
    (("build", "{tmp}", "--extras", "cpu"), 1, "exists, is not empty and is not a wheelhouse: give a new folder"),
    (("install", "{tmp}/none"), 1, "none has no wheelhouse.json: it is not a wheelhouse folder"),
    (("install", "{tmp}"), 1, "has no wheelhouse.json: it is not a wheelhouse folder (or its build did not finish)"),
])
def test_command_line_refusals_name_the_problem(tmp_path, args, status, message):
    (tmp_path / "something.txt").write_text("not a wheelhouse")
    result = _cli(*[arg.format(tmp=tmp_path) for arg in args])
    assert result.returncode == status, result.stderr
    assert message in result.stderr, result.stderr


def test_an_unknown_extra_is_refused_with_the_recipes_extras(tmp_path):
    result = _cli("build", tmp_path / "h", "--extras", "gpu,gpux")
    assert result.returncode == 1
    assert "the recipe has no extra ['gpux'] (it declares ['math', 'gpu', 'cpu', 'v1', 'report', 'test'])" \
        in result.stderr, result.stderr
    assert not (tmp_path / "h").exists() and not list(tmp_path.iterdir())  # nothing half-built left behind


def _house(tmp_path: Path, python: str = "3.11", platform=None) -> Path:
    """A wheelhouse of the recipe's name alone, without uv (so pip installs it)."""
    folder = tmp_path / "house"
    folder.mkdir()
    wheel = _wheel(folder, "recipe_dapo", "0.1.0")
    wheels = wheelhouse.write_lock(folder, wheel.name, {})
    manifest = {"format": wheelhouse.FORMAT, "recipe": {"name": "recipe_dapo", "version": "0.1.0", "wheel": wheel.name,
                                                         "extras": ["cpu"]},
                "target": {"python": python, "platform": platform}, "wheels": wheels,
                "remove_after_install": {"packages": ["tinyremoved"], "why": ["a test"]}}
    (folder / "wheelhouse.json").write_text(json.dumps(manifest))
    return folder


def test_install_refuses_a_wheelhouse_for_another_python_before_creating_anything(tmp_path):
    folder = _house(tmp_path, python="3.12")
    result = _cli("install", folder, "--venv", tmp_path / "venv", "--python-bin", sys.executable)
    assert result.returncode == 1
    assert ("the wheelhouse holds wheels for Python 3.12 and this interpreter is Python 3.11: install with a Python "
            "3.12 (--python-bin /path/to/python3.12), or rebuild the wheelhouse with --python 3.11") in result.stderr
    assert not (tmp_path / "venv").exists()


def test_install_refuses_missing_or_altered_wheels_and_installs_with_pip_without_uv(tmp_path):
    folder, venv = _house(tmp_path), tmp_path / "venv"
    wheel = folder / "recipe_dapo-0.1.0-py3-none-any.whl"
    wheel.rename(tmp_path / wheel.name)
    result = _cli("install", folder, "--venv", venv)
    assert result.returncode == 1 and not venv.exists()
    assert (f"the wheelhouse {folder} lacks recipe_dapo-0.1.0-py3-none-any.whl, which its manifest lists: copy the "
            "whole folder again, or rebuild it") in result.stderr, result.stderr
    env = dict(os.environ, WHEELHOUSE_INSTALLER="uv")  # as built before uv was added: the recipe's wheel only
    (tmp_path / wheel.name).rename(wheel)
    result = _cli("install", folder, "--venv", venv, "--python-bin", sys.executable, env=env)
    assert result.returncode == 1 and not venv.exists()
    assert "WHEELHOUSE_INSTALLER=uv, but the wheelhouse holds no uv wheel" in result.stderr, result.stderr
    # An altered wheel (same name, other contents) is refused by the installer's hash check, before installing it.
    env["WHEELHOUSE_INSTALLER"] = "auto"
    original = shutil.copy(wheel, tmp_path / "original.whl")
    _wheel(tmp_path, "recipe_dapo", "0.1.0", requires=["something-else"]).replace(wheel)
    result = _cli("install", folder, "--venv", venv, "--python-bin", sys.executable, env=env)
    assert result.returncode == 1, result.stdout
    assert "DO NOT MATCH THE HASHES" in result.stderr and (
        f"a wheel in {folder} is not the one the build wrote (its sha256 is not the one in requirements.txt): copy "
        "the whole folder again, or rebuild it") in result.stderr, result.stderr
    assert not list((venv / "lib").glob("python*/site-packages/recipe_dapo*"))
    # The wheel as built: pip installs it (no uv in the wheelhouse), and the record says why.
    Path(original).replace(wheel)
    result = _cli("install", folder, "--venv", venv, env=dict(env, WHEELHOUSE_INSTALLER=""))
    assert "(pip --no-index, no network): the wheelhouse holds no uv wheel" in result.stdout, result.stdout
    record = json.loads((venv / wheelhouse.RECORD).read_text())  # the check fails: a stub recipe
    assert record["installer"] == "pip" and record["uv_fallback"].startswith("the wheelhouse holds no uv wheel")
    command = record["install_command"]
    assert command[1:4] == ["-m", "pip", "install"] and "--no-index" in command and "--require-hashes" in command
    assert command[-2:] == ["-r", str(folder / "requirements.txt")] and record["removed"] == ["tinyremoved"]
    assert list((venv / "lib").glob("python*/site-packages/recipe_dapo-0.1.0.dist-info"))
    assert not list(venv.glob(".uv-cache-*"))
    (folder / "wheelhouse.json").write_text("{")
    assert "wheelhouse.json is not valid JSON" in _cli("install", folder).stderr
    assert "WHEELHOUSE_INSTALLER='conda': use auto" in _cli("install", folder,
                                                            env=dict(os.environ, WHEELHOUSE_INSTALLER="conda")).stderr


# ------------------------------------------------------------------------------------------------ pure helpers


def test_wheel_names_tags_and_targets():
    assert wheelhouse.wheel_pin("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == ("torch", "2.13.0+cpu")
    assert wheelhouse.wheel_pin("Foo.Bar-1.0-1build-py3-none-any.whl") == ("foo-bar", "1.0")
    assert wheelhouse.glibc_and_arch("manylinux_2_28_x86_64") == ((2, 28), "x86_64")
    assert wheelhouse.glibc_and_arch("manylinux2014_aarch64") == ((2, 17), "aarch64")
    assert wheelhouse.glibc_and_arch("macosx_11_0_arm64") is None
    tags = wheelhouse.pip_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and tags[-1] == "manylinux1_x86_64" and len(tags) == 24 + 3
    assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
    assert "manylinux2010_aarch64" not in wheelhouse.pip_platforms("manylinux_2_28_aarch64")
    assert wheelhouse.pip_platforms("manylinux2014_x86_64")[:2] == ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    assert wheelhouse.pip_platforms("macosx_11_0_arm64") == ["macosx_11_0_arm64"]
    assert {wheelhouse.parser().parse_args(["build", "h", "--python", v]).python for v in ("311", "3.11")} == {"3.11"}
    assert wheelhouse.uv_platform("manylinux_2_28_x86_64") == "x86_64-manylinux_2_28"
    assert wheelhouse.uv_platform("manylinux2014_aarch64") == "aarch64-manylinux_2_17"

    gpu = {"target": {"python": "3.11", "platform": "manylinux_2_28_x86_64"}}
    assert wheelhouse.target_problems(gpu, "3.11", "x86_64", (2, 35)) == []
    assert "this machine is aarch64: rebuild it with --platform manylinux_2_28_aarch64" in \
        wheelhouse.target_problems(gpu, "3.11", "aarch64", (2, 35))[0]
    assert "this machine has glibc 2.17: rebuild it with --platform manylinux_2_17_x86_64" in \
        wheelhouse.target_problems(gpu, "3.11", "x86_64", (2, 17))[0]
    assert wheelhouse.target_problems({"target": {"python": "3.11", "platform": None}}, "3.11", "aarch64", None) == []


def test_pips_index_settings_reach_uv(monkeypatch, tmp_path):
    """uv reads no pip configuration: the indexes and find-links pip is configured with are handed to it."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///a/simple file:///b/simple")
    assert wheelhouse.pip_sources([sys.executable, "-m", "pip"]) == [
        "--index-strategy", "unsafe-best-match", "--extra-index-url", "file:///a/simple",
        "--extra-index-url", "file:///b/simple", "--find-links", str(tmp_path)]
    assert wheelhouse.pip_sources(PIP) == ["--index-strategy", "unsafe-best-match"]  # pip --isolated: none


def test_the_offline_environment_has_no_configuration_index_or_network(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("PIP_INDEX_URL", "https://example.invalid/simple")
    monkeypatch.setenv("UV_INDEX_URL", "https://example.invalid/simple")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))  # the checkout's recipe_dapo.egg-info would count as installed
    env = wheelhouse.offline_env(Path("/tmp/cache"))
    assert not {"PIP_FIND_LINKS", "PIP_INDEX_URL", "UV_INDEX_URL", "PYTHONPATH"} & set(env)
    assert env["PIP_CONFIG_FILE"] == os.devnull and env["PIP_NO_INDEX"] == "1" and env["UV_NO_CONFIG"] == "1"
    assert env["https_proxy"] == env["HTTPS_PROXY"] == wheelhouse.DEAD_PROXY and env["UV_CACHE_DIR"] == "/tmp/cache"


# ------------------------------------------------------------------------------------------------ install check


def test_accelerator_verdicts():
    assert accelerator_verdict("cuda", 8, 8, "12.8", "2.11.0").ok
    none_here = accelerator_verdict("cpu", 0, 0, None, "2.13.0+cpu")
    assert none_here.ok and "verl sees no accelerator (platform cpu; torch 2.13.0+cpu)" in none_here.detail
    cpu_torch_on_gpu_node = accelerator_verdict("cpu", 0, 8, None, "2.13.0+cpu")
    assert not cpu_torch_on_gpu_node.ok and "--extras gpu,math" in cpu_torch_on_gpu_node.fix
    assert not accelerator_verdict("cpu", 0, 8, "12.8").ok
    assert not accelerator_verdict("cuda", 0, 0, "12.8").ok


def test_import_fixes_name_the_cure():
    assert "pip uninstall -y torchvision torchaudio torchcodec" in import_fix(
        "transformers", "RuntimeError('operator torchvision::nms does not exist')")
    assert "install the recipe with its gpu (or cpu) extra" in import_fix("vllm", "ModuleNotFoundError(\"No module named 'vllm'\")")
    assert "math extra" in import_fix("math_verify", "ModuleNotFoundError(\"No module named 'math_verify'\")")
    assert "latex2sympy2_extended is missing, which math_verify needs" in import_fix(
        "math_verify", "ModuleNotFoundError(\"No module named 'latex2sympy2_extended'\")")


def test_an_import_that_kills_its_process_is_one_failed_check_and_the_others_still_report(tmp_path):
    # A vLLM whose import dies as a broken native extension does (SIGSEGV), first on the path of the checks' processes.
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    path = [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    report = tmp_path / "check.json"

    def check(*names: str) -> subprocess.CompletedProcess:
        only = [part for name in names for part in ("--only", name)]
        return subprocess.run([sys.executable, "-m", "recipe_dapo.preflight.install", *only, "--json", str(report)],
                              capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    # Positive control: the vLLM check on its own imports in its process, which the fake kills before any line.
    alone = check("vllm")
    assert alone.returncode == -11 and "install check:" not in alone.stdout, (alone.returncode, alone.stdout)

    # With others, it runs in a process of its own: one FAIL line naming how that process ended, every other check
    # still printed in its place, the summary, and exit status 1.
    both = check("verl", "vllm")
    assert both.returncode == 1, both.stdout + both.stderr
    lines = both.stdout.splitlines()
    assert lines[0].startswith("ok    verl: verl ")
    assert lines[1].startswith("FAIL  vllm: the vllm check's process ended (killed by signal 11) without a result")
    assert lines[2].startswith("      fix: ")
    assert lines[-1] == "install check: 1 of 2 passed; failed: vllm"
    assert [(c["name"], c["ok"]) for c in json.loads(report.read_text())["checks"]] == [("verl", True), ("vllm", False)]
