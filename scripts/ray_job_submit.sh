#!/usr/bin/env bash
# Submit any launch script to a running Ray cluster with `ray job submit` instead of running its driver here.
#
# Assumes:   a Ray cluster (`ray start --head` on one node, `ray start --address=HEAD:6379` on the others) whose
#            nodes all have verl (0.9.0 or 0.9.1), vLLM and Ray with its job server (ray[default]), the recipe installed
#            or not, and see MODEL_PATH and DATA_DIR at the same paths; the `ray` CLI here. This repository is uploaded
#            as the job's working directory, and scripts/runtime_env.yaml registers the recipe in every worker even
#            where it is not pip-installed (run on CPU by tests/e2e/test_scale_on_cpu.py: two nodes without it).
# Launch:    bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b.sh [Hydra overrides...]
#            bash scripts/ray_job_submit.sh scripts/run_dapo_cpu.sh trainer.nnodes=2 trainer.n_gpus_per_node=1
# Override:  RAY_ADDRESS=http://head:8265 SUBMIT_NO_WAIT=0 bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_7b_math.sh
# Env:       RAY_ADDRESS (http://localhost:8265), RUNTIME_ENV (scripts/runtime_env.yaml), WORKING_DIR (this repository),
#            JOB_PYTHON (python3 on the cluster), SUBMIT_NO_WAIT (1: return once submitted; follow with
#            `ray job logs -f JOB_ID`; 0: follow it here and exit non-zero when the job fails), JOB_ENV ("K=V ..."
#            added to the runtime env's env_vars; scripts/lib/ray_submit.sh). Paths in MODEL_PATH, DATA_DIR, ... are
#            paths on the cluster.
# Check:     DRY_RUN=1 bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b.sh   (checks here, submits nothing)
set -euo pipefail
if [[ $# -lt 1 || ! -f $1 ]]; then
  echo "usage: bash scripts/ray_job_submit.sh scripts/<launch script>.sh [Hydra overrides...]" >&2
  exit 2
fi
script=$1
shift
LAUNCH_MODE=ray exec bash "$script" "$@"
