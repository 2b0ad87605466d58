# Sourced by the scripts in scripts/ to choose the interpreter that has the recipe and verl installed:
# $PYTHON when set, else the repository's .venv (scripts/install_cpu.sh creates it), else python3 from PATH.
if [[ -z "${PYTHON:-}" ]]; then
  _recipe_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  if [[ -x "$_recipe_root/.venv/bin/python" ]]; then PYTHON="$_recipe_root/.venv/bin/python"; else PYTHON=python3; fi
  unset _recipe_root
fi
