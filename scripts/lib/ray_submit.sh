# Sourced by scripts/launch_dapo.sh and scripts/run_dapo_cpu.sh: `submit_ray_job OVERRIDES...` sends
# `$JOB_PYTHON -m recipe_dapo.main_dapo OVERRIDES...` to a running Ray cluster with `ray job submit` (LAUNCH_MODE=ray,
# which scripts/ray_job_submit.sh sets). This repository is uploaded as the job's working directory and
# scripts/runtime_env.yaml is its runtime environment, so every Ray worker of the job imports the recipe from the
# upload (VERL_USE_EXTERNAL_MODULES=recipe_dapo.plugin) even on nodes where it is not installed.
#
# Env: RAY_ADDRESS (http://localhost:8265: the head's job server), RUNTIME_ENV (scripts/runtime_env.yaml),
#      WORKING_DIR (this repository), JOB_PYTHON (python3 on the cluster's head), SUBMIT_NO_WAIT (1: return once
#      submitted; 0: follow the job's log and exit non-zero when it fails), RAY (the `ray` CLI: the one beside $PYTHON,
#      else ray on PATH), JOB_ENV ("KEY=VALUE ..." added to the runtime environment's env_vars, for the job's driver
#      and every worker; the caller's own environment does not reach the cluster).
# Needs $ROOT (the repository) and $PYTHON (a Python with PyYAML, to merge JOB_ENV).
submit_ray_job() {
  if [[ -z "${RAY:-}" ]]; then
    if [[ -x "$(dirname "$PYTHON")/ray" ]]; then RAY="$(dirname "$PYTHON")/ray"; else RAY=ray; fi
  fi
  : "${RAY_ADDRESS:=http://localhost:8265}" "${RUNTIME_ENV:=$ROOT/scripts/runtime_env.yaml}"
  : "${WORKING_DIR:=$ROOT}" "${JOB_PYTHON:=python3}" "${SUBMIT_NO_WAIT:=1}"
  [[ -f "$RUNTIME_ENV" ]] || { echo "ray job submit: RUNTIME_ENV=$RUNTIME_ENV is not a file" >&2; return 2; }
  # The entrypoint goes as separate arguments after `--`: Ray quotes each one (shlex.join) for the shell that runs it
  # on the head node (one pre-quoted string would reach that shell as a single word: "python3 -m ...: not found").
  local entrypoint=("$JOB_PYTHON" -m recipe_dapo.main_dapo "$@")
  local submit=("$RAY" job submit --address "$RAY_ADDRESS" --working-dir "$WORKING_DIR")
  if [[ -n "${JOB_ENV:-}" ]]; then
    # --runtime-env and --runtime-env-json exclude each other: merge JOB_ENV into the file's env_vars here.
    local merged
    merged=$("$PYTHON" - "$RUNTIME_ENV" $JOB_ENV <<'EOF'
import json, sys
import yaml
with open(sys.argv[1]) as handle:
    env = yaml.safe_load(handle) or {}
for item in sys.argv[2:]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        sys.exit(f"JOB_ENV: {item!r} is not KEY=VALUE")
    env.setdefault("env_vars", {})[key] = value
print(json.dumps(env))
EOF
    ) || return 2
    submit+=(--runtime-env-json "$merged")
  else
    submit+=(--runtime-env "$RUNTIME_ENV")
  fi
  [[ $SUBMIT_NO_WAIT != 1 ]] || submit+=(--no-wait)
  echo "submitting to $RAY_ADDRESS: ${entrypoint[*]}" >&2
  exec "${submit[@]}" -- "${entrypoint[@]}"
}
