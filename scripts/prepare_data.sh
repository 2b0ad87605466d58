#!/usr/bin/env bash
# Prepare every DAPO data set as a verl RL parquet file.
#
#   bash scripts/prepare_data.sh OUT_DIR
#
# Writes OUT_DIR/{dapo-math-17k,aime-2024,aime-2025,amc23,math500,gsm8k}.parquet with the DAPO prompt
# template, normalised answers and deduplicated problems. Runs with $PYTHON, else the repository's .venv (from
# scripts/install_cpu.sh) when there is one, else python3 from PATH (with the recipe's requirements).
# Sources: the public Hugging Face copies (needs network and `datasets`; without network it says so in one line),
# or, with DAPO_DATA_LOCAL_DIR set to a local folder, the copies there (its layout:
# `python -m recipe_dapo.data prepare --help`).
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: bash scripts/prepare_data.sh OUT_DIR   (DAPO_DATA_LOCAL_DIR=DIR reads local copies)" >&2
    exit 2
fi
OUT_DIR=$1
shift
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The recipe from this checkout wins even if the user's python has not installed it.
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
source "$REPO_ROOT/scripts/lib/python.sh"  # sets PYTHON
exec "$PYTHON" "$REPO_ROOT/data_prep/prepare_all.py" "$OUT_DIR" "$@"
