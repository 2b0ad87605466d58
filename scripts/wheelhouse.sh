#!/usr/bin/env bash
# An offline wheelhouse: build it where the package index is reachable, install it where it is not.
# Usage: bash scripts/wheelhouse.sh {build,install} DIR [options]; --help says what each does and its options.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec "${PYTHON_BIN:-python3}" "$ROOT/scripts/lib/wheelhouse.py" "$@"
