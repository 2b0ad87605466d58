#!/usr/bin/env bash
# The recipe on another verl release (default verl 0.9.0): an overlay environment that shares every other package
# with the main one, then the tests that touch verl's API and one short CPU run on it.
#
# The overlay is a virtual environment whose own site-packages holds only verl (installed with --no-deps); a .pth
# file appends the main environment's site-packages (with its own .pth files: the recipe's editable install), so
# the overlay's verl shadows the main one and everything else is shared. PYTHONPATH puts this checkout first, so its
# code is what runs; verl finds the recipe's plugin through the main environment's `verl.plugins` entry point.
#
# Usage:  bash scripts/verl_compat.sh                  # verl==0.9.0 from the package index
#         VERL=/path/verl-0.9.0-py3-none-any.whl bash scripts/verl_compat.sh   # offline: a wheel
# Env:    VERL (pip requirement or wheel; default verl==0.9.0), BASE_PYTHON (the main environment's python;
#         default .venv/bin/python), COMPAT_VENV (default ${TMPDIR:-/tmp}/recipe_dapo_verl_compat),
#         STEPS (CPU run steps; default 2), ONLY=env|tests|run (the overlay alone, or one half), WORK_DIR (the CPU run's folder),
#         FULL=1 (the whole test modules below instead of the tests CI selects in tests/e2e/verl_compat_tests.txt).
# CI runs the same check through tests/e2e/test_verl_compat_on_cpu.py (it builds the overlay with ONLY=env).
# Exit status: non-zero when a test or the run fails. Wall time on the 2-core CI machine: see the README.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERL=${VERL:-verl==0.9.0}
BASE_PYTHON=${BASE_PYTHON:-$ROOT/.venv/bin/python}
COMPAT_VENV=${COMPAT_VENV:-${TMPDIR:-/tmp}/recipe_dapo_verl_compat}
STEPS=${STEPS:-2}
ONLY=${ONLY:-}

# The tests that touch verl's API, one by one, as CI runs them (tests/e2e/verl_compat_tests.txt).
mapfile -t TESTS < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$ROOT/tests/e2e/verl_compat_tests.txt" | grep -v '^$')
# FULL=1: their whole modules: plugin registration, the loss against verl's agg_loss, the reward manager, the classic
# trainer's protocol, the trainer table and v1 sampler (skipped where trainer.use_v1=true is refused), the composed
# config, and the version rules themselves.
if [[ "${FULL:-0}" == 1 ]]; then TESTS=(
  tests/test_verl_versions_on_cpu.py
  tests/test_plugin_loading_on_cpu.py
  tests/test_dapo_loss_on_cpu.py
  tests/test_reward_manager_on_cpu.py
  tests/test_trainer_on_cpu.py
  tests/test_trainer_table_on_cpu.py
  tests/test_v1_replay_buffer_on_cpu.py
  tests/test_config_on_cpu.py
  tests/test_cpu_platform_on_cpu.py::test_verls_padding_helpers_run_without_flash_attn_on_the_cpu_platform
); fi

start=$SECONDS
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
BASE_SITE=$(site_of "$BASE_PYTHON")
[[ -x "$COMPAT_VENV/bin/python" ]] || "$BASE_PYTHON" -m venv --without-pip "$COMPAT_VENV"
PY="$COMPAT_VENV/bin/python"
echo "import site; site.addsitedir('$BASE_SITE')" > "$(site_of "$PY")/zz_recipe_dapo_base_env.pth"
# --ignore-installed: pip must not try to uninstall the main environment's verl, which it sees through the .pth.
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --ignore-installed "$VERL"

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - "$ROOT" <<'EOF'
import importlib.metadata as metadata, sys
import recipe_dapo
from recipe_dapo.preflight.versions import installed_verl, verl_version_problem
plugins = [ep.value for ep in metadata.entry_points(group="verl.plugins")]
print(f"verl {installed_verl()} (setup range check: {verl_version_problem(installed_verl()) or 'supported'}); "
      f"verl.plugins entry points: {plugins}; recipe_dapo from {recipe_dapo.__file__}")
assert recipe_dapo.__file__.startswith(sys.argv[1]), "the checkout's recipe_dapo is not the one imported"
assert "recipe_dapo.plugin" in plugins, "the recipe's verl.plugins entry point is not visible in the overlay"
EOF
echo "overlay ready in $((SECONDS - start)) s: $COMPAT_VENV"

if [[ "$ONLY" != run && "$ONLY" != env ]]; then
  t=$SECONDS
  (cd "$ROOT" && "$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}")
  echo "verl API tests on $VERL: $((SECONDS - t)) s"
fi
if [[ "$ONLY" != tests && "$ONLY" != env ]]; then
  t=$SECONDS
  PYTHON="$PY" WORK_DIR="${WORK_DIR:-$ROOT/runs/verl_compat}" \
    bash "$ROOT/scripts/run_dapo_cpu.sh" trainer.total_training_steps="$STEPS"
  echo "CPU run ($STEPS steps) on $VERL: $((SECONDS - t)) s"
fi
echo "verl_compat.sh done in $((SECONDS - start)) s"
