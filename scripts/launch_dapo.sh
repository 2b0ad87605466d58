#!/usr/bin/env bash
# The one parametrised DAPO launcher. Every GPU script in scripts/ is this launcher plus overlays.
#
# Assumes:   the recipe installed on the machine that runs this (`pip install -e ".[gpu,math]"`), data prepared
#            with `bash scripts/prepare_data.sh "$DATA_DIR"`, a Hugging Face model folder at MODEL_PATH. Without
#            overlays the defaults are the paper's DAPO run (section 4.1): Qwen2.5-32B base on 16 nodes x 8 GPUs
#            (80 GB each), DAPO-Math-17k, validation on AIME 2024 (avg@32).
# Launch:    bash scripts/launch_dapo.sh [--overlay NAME]... [Hydra overrides...]
#            NAME is scripts/overlays/NAME.env (or a path to a .env file of your own).
# Override:  NNODES=2 TRAIN_BATCH_SIZE=64 bash scripts/launch_dapo.sh --overlay qwen2.5_7b_math trainer.save_freq=10
# Modes:     DRY_RUN=1          compose the full Hydra config and run every start-up check; no Ray, GPU or model
#            PRINT_OVERRIDES=1  print the Hydra overrides this launch would pass, one per line, and exit
#            LAUNCH_MODE=ray    `ray job submit` to RAY_ADDRESS with scripts/runtime_env.yaml (see ray_job_submit.sh);
#                               default LAUNCH_MODE=local: `python -m recipe_dapo.main_dapo` here (one node, or
#                               the driver of a running Ray cluster when RAY_ADDRESS is set)
# Precedence (last wins): the defaults below < overlays, in the order given < your environment < Hydra overrides
# on the command line. An overlay may only set the variables listed in LAUNCH_VARS (typos are refused).
#
# Variables (default: the paper's run; docs/launching.md maps each to its Hydra key):
#   paths      DAPO_HOME ($HOME/dapo), DATA_DIR ($DAPO_HOME/data), MODELS_DIR ($DAPO_HOME/models),
#              MODEL_PATH ($MODELS_DIR/Qwen2.5-32B), TRAIN_FILE ($DATA_DIR/dapo-math-17k.parquet),
#              VAL_FILES (space-separated; $DATA_DIR/aime-2024.parquet; VAL_FILE also accepted),
#              CKPTS_DIR ($DAPO_HOME/ckpts/$PROJECT_NAME/$EXP_NAME), PYTHON (.venv/bin/python if present, else python3)
#   cluster    NNODES (16), GPUS_PER_NODE (8)
#   run        PROJECT_NAME (recipe_dapo), VARIANT (dapo), EXP_NAME ($VARIANT-<model folder, lower case>),
#              LOGGER (["console","file"]), TOTAL_EPOCHS (20), TOTAL_TRAINING_STEPS (unset: from epochs),
#              TEST_FREQ (5), SAVE_FREQ (5), VAL_BEFORE_TRAIN (true), RESUME_MODE (auto)
#   lengths    MAX_PROMPT_LENGTH (2048), MAX_RESPONSE_LENGTH (20480), OVERLONG_BUFFER (true),
#              OVERLONG_BUFFER_LEN (4096), OVERLONG_PENALTY_FACTOR (1.0), OVERLONG_FILTER (false),
#              FILTER_OVERLONG_PROMPTS (true)
#   batches    TRAIN_BATCH_SIZE (512), GEN_BATCH_SIZE (3 x TRAIN_BATCH_SIZE), N_RESP_PER_PROMPT (16),
#              MINI_BATCH_SIZE (32)
#   optimiser  LR (1e-6), LR_WARMUP_STEPS (10), WEIGHT_DECAY (0.1), GRAD_CLIP (1.0)
#   algorithm  ADV_ESTIMATOR (grpo), LOSS_MODE (dapo), LOSS_AGG_MODE (token-mean), CLIP_RATIO_LOW (0.2),
#              CLIP_RATIO_HIGH (0.28), CLIP_RATIO_C (10.0), USE_KL_LOSS (false), KL_LOSS_COEF (0.0),
#              REWARD_MANAGER (recipe_dapo), ENABLE_FILTER_GROUPS (true), FILTER_GROUPS_METRIC (acc),
#              MAX_NUM_GEN_BATCHES (10), DS_ROUND_SIZING / DS_MAX_STALENESS / DS_ON_EXHAUSTED (unset: the
#              recipe's defaults deficit / 1 / train_partial; overlay paper_sampling: whole / 0 / raise)
#   sampling   TEMPERATURE (1.0), TOP_P (1.0), TOP_K (-1), VAL_TEMPERATURE (1.0), VAL_TOP_P (0.7), VAL_N (32)
#   memory     SP_SIZE (8, Ulysses sequence parallel), GEN_TP (4, vLLM tensor parallel), OFFLOAD (true: actor
#              params + optimiser, ref params), GPU_MEMORY_UTILIZATION (0.8), USE_DYNAMIC_BSZ (true),
#              ACTOR_MAX_TOKEN_LEN / INFER_MAX_TOKEN_LEN (MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH, per GPU),
#              ROLLOUT_MAX_BATCHED_TOKENS (same), MICRO_BATCH_SIZE_PER_GPU (4, used when USE_DYNAMIC_BSZ=false),
#              AGENT_WORKERS (unset: verl's 8 agent-loop workers)
#   ray submit RAY_ADDRESS (http://localhost:8265), RUNTIME_ENV (scripts/runtime_env.yaml), WORKING_DIR (this
#              repository), JOB_PYTHON (python3 on the cluster), SUBMIT_NO_WAIT (1), RAY (ray)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

LAUNCH_VARS=(
  DAPO_HOME DATA_DIR MODELS_DIR MODEL_PATH TRAIN_FILE VAL_FILES VAL_FILE CKPTS_DIR PYTHON
  NNODES GPUS_PER_NODE
  PROJECT_NAME VARIANT EXP_NAME LOGGER TOTAL_EPOCHS TOTAL_TRAINING_STEPS TEST_FREQ SAVE_FREQ VAL_BEFORE_TRAIN RESUME_MODE
  MAX_PROMPT_LENGTH MAX_RESPONSE_LENGTH OVERLONG_BUFFER OVERLONG_BUFFER_LEN OVERLONG_PENALTY_FACTOR OVERLONG_FILTER
  FILTER_OVERLONG_PROMPTS
  TRAIN_BATCH_SIZE GEN_BATCH_SIZE N_RESP_PER_PROMPT MINI_BATCH_SIZE
  LR LR_WARMUP_STEPS WEIGHT_DECAY GRAD_CLIP
  ADV_ESTIMATOR LOSS_MODE LOSS_AGG_MODE CLIP_RATIO_LOW CLIP_RATIO_HIGH CLIP_RATIO_C USE_KL_LOSS KL_LOSS_COEF
  REWARD_MANAGER ENABLE_FILTER_GROUPS FILTER_GROUPS_METRIC MAX_NUM_GEN_BATCHES
  DS_ROUND_SIZING DS_MAX_STALENESS DS_ON_EXHAUSTED
  TEMPERATURE TOP_P TOP_K VAL_TEMPERATURE VAL_TOP_P VAL_N
  SP_SIZE GEN_TP OFFLOAD GPU_MEMORY_UTILIZATION USE_DYNAMIC_BSZ ACTOR_MAX_TOKEN_LEN INFER_MAX_TOKEN_LEN
  ROLLOUT_MAX_BATCHED_TOKENS MICRO_BATCH_SIZE_PER_GPU AGENT_WORKERS
  LAUNCH_MODE DRY_RUN PRINT_OVERRIDES RAY_ADDRESS RUNTIME_ENV WORKING_DIR JOB_PYTHON SUBMIT_NO_WAIT RAY
)

die() { echo "launch_dapo.sh: $*" >&2; exit 2; }
is_launch_var() { local v; for v in "${LAUNCH_VARS[@]}"; do [[ $v == "$1" ]] && return 0; done; return 1; }

# Your environment wins over every overlay: remember what it set, restore it after each overlay.
declare -A FROM_ENV=()
for _v in "${LAUNCH_VARS[@]}"; do
  if [[ -n "${!_v+set}" ]]; then FROM_ENV[$_v]=${!_v}; fi
done
restore_env() { local v; for v in "${!FROM_ENV[@]}"; do printf -v "$v" '%s' "${FROM_ENV[$v]}"; done; }

# Base folders first: overlays may build paths from them.
: "${DAPO_HOME:=$HOME/dapo}"
: "${DATA_DIR:=$DAPO_HOME/data}"
: "${MODELS_DIR:=$DAPO_HOME/models}"

load_overlay() {
  local file=$1 before after v
  [[ $file == */* || $file == *.env ]] || file=$HERE/overlays/$file.env
  [[ -f $file ]] || die "overlay not found: $file (the overlays are in scripts/overlays/)"
  before=$(compgen -v | sort)
  # shellcheck source=/dev/null
  source "$file"
  after=$(compgen -v | sort)
  for v in $(comm -13 <(echo "$before") <(echo "$after")); do
    [[ $v =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
    is_launch_var "$v" || die "overlay $file sets $v, which the launcher does not read (a typo?); known: ${LAUNCH_VARS[*]}"
  done
  restore_env
}

while [[ $# -gt 0 ]]; do
  case $1 in
    --overlay) [[ $# -ge 2 ]] || die "--overlay needs a name"; load_overlay "$2"; shift 2 ;;
    --overlay=*) load_overlay "${1#--overlay=}"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) break ;;
  esac
done

# VAL_FILE (one file, as in run_dapo_cpu.sh) from your environment beats an overlay's VAL_FILES.
if [[ -n "${FROM_ENV[VAL_FILE]+set}" && -z "${FROM_ENV[VAL_FILES]+set}" ]]; then VAL_FILES=$VAL_FILE; fi

# ------------------------------------------------------------------ defaults: the paper's run (section 4.1)
: "${NNODES:=16}" "${GPUS_PER_NODE:=8}"
: "${MODEL_PATH:=$MODELS_DIR/Qwen2.5-32B}"
: "${TRAIN_FILE:=$DATA_DIR/dapo-math-17k.parquet}"
: "${VAL_FILES:=${VAL_FILE:-$DATA_DIR/aime-2024.parquet}}"
: "${PROJECT_NAME:=recipe_dapo}" "${VARIANT:=dapo}"
_model_tag=$(basename "$MODEL_PATH" | tr '[:upper:]' '[:lower:]')
: "${EXP_NAME:=$VARIANT-$_model_tag}"
: "${CKPTS_DIR:=$DAPO_HOME/ckpts/$PROJECT_NAME/$EXP_NAME}"
: "${LOGGER:=[\"console\",\"file\"]}"
: "${TOTAL_EPOCHS:=20}" "${TOTAL_TRAINING_STEPS:=}" "${TEST_FREQ:=5}" "${SAVE_FREQ:=5}"
: "${VAL_BEFORE_TRAIN:=true}" "${RESUME_MODE:=auto}"
# L_max = 16,384 expected + 4,096 soft-punishment buffer (paper eq. 13).
: "${MAX_PROMPT_LENGTH:=2048}" "${MAX_RESPONSE_LENGTH:=20480}"
: "${OVERLONG_BUFFER:=true}" "${OVERLONG_BUFFER_LEN:=4096}" "${OVERLONG_PENALTY_FACTOR:=1.0}" "${OVERLONG_FILTER:=false}"
: "${FILTER_OVERLONG_PROMPTS:=true}"
# 512 prompts per step, generated in rounds of 3 x 512, G = 16 responses, 16 updates of 32 prompts per step.
: "${TRAIN_BATCH_SIZE:=512}" "${N_RESP_PER_PROMPT:=16}" "${MINI_BATCH_SIZE:=32}"
: "${GEN_BATCH_SIZE:=$((TRAIN_BATCH_SIZE * 3))}"
: "${LR:=1e-6}" "${LR_WARMUP_STEPS:=10}" "${WEIGHT_DECAY:=0.1}" "${GRAD_CLIP:=1.0}"
: "${ADV_ESTIMATOR:=grpo}" "${LOSS_MODE:=dapo}" "${LOSS_AGG_MODE:=token-mean}"
: "${CLIP_RATIO_LOW:=0.2}" "${CLIP_RATIO_HIGH:=0.28}" "${CLIP_RATIO_C:=10.0}"
: "${USE_KL_LOSS:=false}" "${KL_LOSS_COEF:=0.0}" "${REWARD_MANAGER:=recipe_dapo}"
: "${ENABLE_FILTER_GROUPS:=true}" "${FILTER_GROUPS_METRIC:=acc}" "${MAX_NUM_GEN_BATCHES:=10}"
: "${DS_ROUND_SIZING:=}" "${DS_MAX_STALENESS:=}" "${DS_ON_EXHAUSTED:=}"
: "${TEMPERATURE:=1.0}" "${TOP_P:=1.0}" "${TOP_K:=-1}"
# Evaluation: temperature 1.0, top-p 0.7, 32 samples per AIME problem (avg@32).
: "${VAL_TEMPERATURE:=1.0}" "${VAL_TOP_P:=0.7}" "${VAL_N:=32}"
: "${SP_SIZE:=8}" "${GEN_TP:=4}" "${OFFLOAD:=true}" "${GPU_MEMORY_UTILIZATION:=0.8}" "${USE_DYNAMIC_BSZ:=true}"
: "${ACTOR_MAX_TOKEN_LEN:=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))}"
: "${INFER_MAX_TOKEN_LEN:=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))}"
: "${ROLLOUT_MAX_BATCHED_TOKENS:=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))}"
: "${MICRO_BATCH_SIZE_PER_GPU:=4}" "${AGENT_WORKERS:=}"
: "${LAUNCH_MODE:=local}" "${DRY_RUN:=0}" "${PRINT_OVERRIDES:=0}"
source "$ROOT/scripts/lib/python.sh"  # sets PYTHON

# A Hydra quoted string keeps any path intact (commas, '=', spaces).
hydra_str() { [[ $1 != *"'"* ]] || die "a path with a single quote is not supported: $1"; printf "'%s'" "$1"; }
hydra_list() { local out='' sep='' item; for item in "$@"; do out+="$sep$(hydra_str "$item")"; sep=,; done; printf '[%s]' "$out"; }
read -r -a _val_files <<<"$VAL_FILES"

OVERRIDES=(
  # data
  "data.train_files=$(hydra_str "$TRAIN_FILE")"
  "data.val_files=$(hydra_list "${_val_files[@]}")"
  "data.prompt_key=prompt"
  "data.max_prompt_length=$MAX_PROMPT_LENGTH"
  "data.max_response_length=$MAX_RESPONSE_LENGTH"
  "data.filter_overlong_prompts=$FILTER_OVERLONG_PROMPTS"
  "data.train_batch_size=$TRAIN_BATCH_SIZE"
  "data.gen_batch_size=$GEN_BATCH_SIZE"
  # model
  "actor_rollout_ref.model.path=$(hydra_str "$MODEL_PATH")"
  "actor_rollout_ref.model.use_remove_padding=true"
  "actor_rollout_ref.model.enable_gradient_checkpointing=true"
  # algorithm: GRPO advantages, no KL, clip-higher, token-level loss, dynamic sampling, overlong shaping
  "algorithm.adv_estimator=$ADV_ESTIMATOR"
  "algorithm.use_kl_in_reward=false"
  "actor_rollout_ref.actor.use_kl_loss=$USE_KL_LOSS"
  "actor_rollout_ref.actor.kl_loss_coef=$KL_LOSS_COEF"
  "actor_rollout_ref.actor.policy_loss.loss_mode=$LOSS_MODE"
  "actor_rollout_ref.actor.loss_agg_mode=$LOSS_AGG_MODE"
  "actor_rollout_ref.actor.clip_ratio_low=$CLIP_RATIO_LOW"
  "actor_rollout_ref.actor.clip_ratio_high=$CLIP_RATIO_HIGH"
  "actor_rollout_ref.actor.clip_ratio_c=$CLIP_RATIO_C"
  "actor_rollout_ref.actor.entropy_coeff=0"
  "algorithm.filter_groups.enable=$ENABLE_FILTER_GROUPS"
  "algorithm.filter_groups.metric=$FILTER_GROUPS_METRIC"
  "algorithm.filter_groups.max_num_gen_batches=$MAX_NUM_GEN_BATCHES"
  "reward.reward_manager.name=$REWARD_MANAGER"
  "reward.reward_kwargs.overlong_buffer_cfg.enable=$OVERLONG_BUFFER"
  "reward.reward_kwargs.overlong_buffer_cfg.len=$OVERLONG_BUFFER_LEN"
  "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=$OVERLONG_PENALTY_FACTOR"
  "dapo.overlong_filter.enable=$OVERLONG_FILTER"
  # optimiser
  "actor_rollout_ref.actor.optim.lr=$LR"
  "actor_rollout_ref.actor.optim.lr_warmup_steps=$LR_WARMUP_STEPS"
  "actor_rollout_ref.actor.optim.weight_decay=$WEIGHT_DECAY"
  "actor_rollout_ref.actor.optim.clip_grad=$GRAD_CLIP"
  "actor_rollout_ref.actor.ppo_mini_batch_size=$MINI_BATCH_SIZE"
  # rollout and validation sampling
  "actor_rollout_ref.rollout.name=vllm"
  "actor_rollout_ref.rollout.n=$N_RESP_PER_PROMPT"
  "actor_rollout_ref.rollout.temperature=$TEMPERATURE"
  "actor_rollout_ref.rollout.top_p=$TOP_P"
  "actor_rollout_ref.rollout.top_k=$TOP_K"
  "actor_rollout_ref.rollout.val_kwargs.do_sample=true"
  "actor_rollout_ref.rollout.val_kwargs.temperature=$VAL_TEMPERATURE"
  "actor_rollout_ref.rollout.val_kwargs.top_p=$VAL_TOP_P"
  "actor_rollout_ref.rollout.val_kwargs.top_k=$TOP_K"
  "actor_rollout_ref.rollout.val_kwargs.n=$VAL_N"
  # memory and parallelism
  "actor_rollout_ref.actor.ulysses_sequence_parallel_size=$SP_SIZE"
  "actor_rollout_ref.actor.fsdp_config.param_offload=$OFFLOAD"
  "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$OFFLOAD"
  "actor_rollout_ref.ref.fsdp_config.param_offload=$OFFLOAD"
  "actor_rollout_ref.actor.use_dynamic_bsz=$USE_DYNAMIC_BSZ"
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$ACTOR_MAX_TOKEN_LEN"
  "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$INFER_MAX_TOKEN_LEN"
  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$INFER_MAX_TOKEN_LEN"
  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$MICRO_BATCH_SIZE_PER_GPU"
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$GEN_TP"
  "actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEMORY_UTILIZATION"
  "actor_rollout_ref.rollout.enable_chunked_prefill=true"
  "actor_rollout_ref.rollout.max_num_batched_tokens=$ROLLOUT_MAX_BATCHED_TOKENS"
  # trainer
  "trainer.logger=$LOGGER"
  "trainer.project_name=$(hydra_str "$PROJECT_NAME")"
  "trainer.experiment_name=$(hydra_str "$EXP_NAME")"
  "trainer.nnodes=$NNODES"
  "trainer.n_gpus_per_node=$GPUS_PER_NODE"
  "trainer.total_epochs=$TOTAL_EPOCHS"
  "trainer.test_freq=$TEST_FREQ"
  "trainer.save_freq=$SAVE_FREQ"
  "trainer.val_before_train=$VAL_BEFORE_TRAIN"
  "trainer.resume_mode=$RESUME_MODE"
  "trainer.default_local_dir=$(hydra_str "$CKPTS_DIR")"
)
# Optional settings: passed only when set, otherwise the config's default applies.
[[ -z $TOTAL_TRAINING_STEPS ]] || OVERRIDES+=("trainer.total_training_steps=$TOTAL_TRAINING_STEPS")
[[ -z $DS_ROUND_SIZING ]] || OVERRIDES+=("dapo.dynamic_sampling.round_sizing=$DS_ROUND_SIZING")
[[ -z $DS_MAX_STALENESS ]] || OVERRIDES+=("dapo.dynamic_sampling.max_staleness=$DS_MAX_STALENESS")
[[ -z $DS_ON_EXHAUSTED ]] || OVERRIDES+=("dapo.dynamic_sampling.on_exhausted=$DS_ON_EXHAUSTED")
[[ -z $AGENT_WORKERS ]] || OVERRIDES+=("actor_rollout_ref.rollout.agent.num_workers=$AGENT_WORKERS")
# The command line comes last, so it wins over everything above.
OVERRIDES+=("$@")

if [[ $PRINT_OVERRIDES == 1 ]]; then
  printf '%s\n' "${OVERRIDES[@]}"
  exit 0
fi
export PYTHONUNBUFFERED=1
if [[ $DRY_RUN == 1 ]]; then
  # Always local: composes with the recipe installed here, starts nothing.
  exec "$PYTHON" -m recipe_dapo.dry_run "${OVERRIDES[@]}"
fi
case $LAUNCH_MODE in
  local)
    if (( NNODES > 1 )) && [[ -z "${RAY_ADDRESS:-}" ]]; then
      echo "launch_dapo.sh: NNODES=$NNODES and the driver runs here: this node must be the head of a running Ray" \
        "cluster (ray start --head; the others joined), or submit with scripts/ray_job_submit.sh" >&2
    fi
    exec "$PYTHON" -m recipe_dapo.main_dapo "${OVERRIDES[@]}"
    ;;
  ray)
    : "${RAY:=ray}" "${RAY_ADDRESS:=http://localhost:8265}" "${RUNTIME_ENV:=$HERE/runtime_env.yaml}"
    : "${WORKING_DIR:=$ROOT}" "${JOB_PYTHON:=python3}" "${SUBMIT_NO_WAIT:=1}"
    # Ray runs the entrypoint through a shell on the head node: quote every argument for it.
    entrypoint=$(printf '%q ' "$JOB_PYTHON" -m recipe_dapo.main_dapo "${OVERRIDES[@]}")
    submit=("$RAY" job submit --address "$RAY_ADDRESS" --runtime-env "$RUNTIME_ENV" --working-dir "$WORKING_DIR")
    [[ $SUBMIT_NO_WAIT != 1 ]] || submit+=(--no-wait)
    exec "${submit[@]}" -- "${entrypoint% }"
    ;;
  *) die "LAUNCH_MODE=$LAUNCH_MODE: use local or ray" ;;
esac
