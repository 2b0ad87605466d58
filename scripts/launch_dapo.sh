#!/usr/bin/env bash
# The one DAPO launcher: paths, cluster and launch mode here; everything else is Hydra groups and overrides.
#
# Assumes:   the recipe installed on the machine that runs this (`pip install -e ".[gpu,math]"`), data prepared
#            with `bash scripts/prepare_data.sh "$DATA_DIR"`, the size's model folder in MODELS_DIR (or MODEL_PATH).
#            Without arguments it is the paper's DAPO run (section 4.1; size=paper_32b ablation=none): Qwen2.5-32B
#            base on 16 nodes x 8 GPUs (80 GB each), DAPO-Math-17k, validation on AIME 2024 (avg@32).
# Launch:    bash scripts/launch_dapo.sh [size=NAME] [ablation=NAME] [sampling=NAME] [Hydra overrides...]
#            sizes (recipe_dapo/config/size/): paper_32b, qwen2.5_7b_math, qwen2.5_1.5b_one_node, small_one_gpu,
#            cpu_tiny; ablations (config/ablation/): none, no_dynamic_sampling, no_token_level_loss, grpo_baseline,
#            table1_overlong_filtering, table1_clip_higher, table1_soft_overlong, table1_token_level_loss;
#            sampling (config/sampling/): recipe, paper. docs/launching.md lists what each sets.
# Override:  NNODES=2 bash scripts/launch_dapo.sh size=qwen2.5_7b_math data.train_batch_size=256 trainer.save_freq=10
# Modes:     DRY_RUN=1          compose the full Hydra config and run every start-up check; no Ray, GPU or model
#            PRINT_OVERRIDES=1  print the Hydra overrides this launch would pass, one per line, and exit
#            LAUNCH_MODE=ray    `ray job submit` to RAY_ADDRESS with scripts/runtime_env.yaml (see ray_job_submit.sh);
#                               default LAUNCH_MODE=local: `python -m recipe_dapo.main_dapo` here (one node, or
#                               the driver of a running Ray cluster when RAY_ADDRESS is set)
# Precedence (last wins): the config's defaults < the groups chosen < these variables < the command line.
#
# Variables (docs/launching.md):
#   paths      DAPO_HOME ($HOME/dapo), DATA_DIR ($DAPO_HOME/data), MODELS_DIR ($DAPO_HOME/models): the size's model
#              folder and data files are found there; MODEL_PATH, TRAIN_FILE, VAL_FILES (space-separated; VAL_FILE
#              also accepted) replace the size's choice when set; CKPTS_DIR ($DAPO_HOME/ckpts/<project>/<experiment>);
#              PYTHON (.venv/bin/python if present, else python3)
#   cluster    NNODES, GPUS_PER_NODE (unset: the size's)
#   ray submit RAY_ADDRESS (http://localhost:8265), RUNTIME_ENV (scripts/runtime_env.yaml), WORKING_DIR (this
#              repository), JOB_PYTHON (python3 on the cluster), SUBMIT_NO_WAIT (1), RAY (ray), JOB_ENV
#              (scripts/lib/ray_submit.sh)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)

die() { echo "launch_dapo.sh: $*" >&2; exit 2; }

# The variables of the former launcher (before the config groups): each is now a Hydra key. One left in the
# environment would be silently ignored, so refuse it and name the key.
REMOVED_VARS=(
  TRAIN_BATCH_SIZE=data.train_batch_size GEN_BATCH_SIZE=data.gen_batch_size N_RESP_PER_PROMPT=actor_rollout_ref.rollout.n
  MINI_BATCH_SIZE=actor_rollout_ref.actor.ppo_mini_batch_size MAX_PROMPT_LENGTH=data.max_prompt_length
  MAX_RESPONSE_LENGTH=data.max_response_length OVERLONG_BUFFER=reward.reward_kwargs.overlong_buffer_cfg.enable
  OVERLONG_BUFFER_LEN=reward.reward_kwargs.overlong_buffer_cfg.len
  OVERLONG_PENALTY_FACTOR=reward.reward_kwargs.overlong_buffer_cfg.penalty_factor
  OVERLONG_FILTER=dapo.overlong_filter.enable FILTER_OVERLONG_PROMPTS=data.filter_overlong_prompts
  LR=actor_rollout_ref.actor.optim.lr LR_WARMUP_STEPS=actor_rollout_ref.actor.optim.lr_warmup_steps
  WEIGHT_DECAY=actor_rollout_ref.actor.optim.weight_decay GRAD_CLIP=actor_rollout_ref.actor.optim.clip_grad
  ADV_ESTIMATOR=algorithm.adv_estimator LOSS_MODE=actor_rollout_ref.actor.policy_loss.loss_mode
  LOSS_AGG_MODE=actor_rollout_ref.actor.loss_agg_mode CLIP_RATIO_LOW=actor_rollout_ref.actor.clip_ratio_low
  CLIP_RATIO_HIGH=actor_rollout_ref.actor.clip_ratio_high CLIP_RATIO_C=actor_rollout_ref.actor.clip_ratio_c
  USE_KL_LOSS=actor_rollout_ref.actor.use_kl_loss KL_LOSS_COEF=actor_rollout_ref.actor.kl_loss_coef
  REWARD_MANAGER=reward.reward_manager.name ENABLE_FILTER_GROUPS=algorithm.filter_groups.enable
  FILTER_GROUPS_METRIC=algorithm.filter_groups.metric MAX_NUM_GEN_BATCHES=algorithm.filter_groups.max_num_gen_batches
  DS_ROUND_SIZING=dapo.dynamic_sampling.round_sizing DS_MAX_STALENESS=dapo.dynamic_sampling.max_staleness
  DS_ON_EXHAUSTED=dapo.dynamic_sampling.on_exhausted TEMPERATURE=actor_rollout_ref.rollout.temperature
  TOP_P=actor_rollout_ref.rollout.top_p TOP_K=actor_rollout_ref.rollout.top_k
  VAL_TEMPERATURE=actor_rollout_ref.rollout.val_kwargs.temperature VAL_TOP_P=actor_rollout_ref.rollout.val_kwargs.top_p
  VAL_N=actor_rollout_ref.rollout.val_kwargs.n SP_SIZE=actor_rollout_ref.actor.ulysses_sequence_parallel_size
  GEN_TP=actor_rollout_ref.rollout.tensor_model_parallel_size OFFLOAD=actor_rollout_ref.actor.fsdp_config.param_offload
  GPU_MEMORY_UTILIZATION=actor_rollout_ref.rollout.gpu_memory_utilization
  USE_DYNAMIC_BSZ=actor_rollout_ref.actor.use_dynamic_bsz ACTOR_MAX_TOKEN_LEN=actor_rollout_ref.actor.ppo_max_token_len_per_gpu
  INFER_MAX_TOKEN_LEN=actor_rollout_ref.ref.log_prob_max_token_len_per_gpu
  ROLLOUT_MAX_BATCHED_TOKENS=actor_rollout_ref.rollout.max_num_batched_tokens
  MICRO_BATCH_SIZE_PER_GPU=actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
  AGENT_WORKERS=actor_rollout_ref.rollout.agent.num_workers PROJECT_NAME=trainer.project_name
  EXP_NAME=trainer.experiment_name VARIANT=trainer.experiment_name LOGGER=trainer.logger TOTAL_EPOCHS=trainer.total_epochs
  TOTAL_TRAINING_STEPS=trainer.total_training_steps TEST_FREQ=trainer.test_freq SAVE_FREQ=trainer.save_freq
  VAL_BEFORE_TRAIN=trainer.val_before_train RESUME_MODE=trainer.resume_mode
)
for _entry in "${REMOVED_VARS[@]}"; do
  _var=${_entry%%=*}
  if [[ -n "${!_var+set}" ]]; then
    die "$_var is no longer read (settings other than paths, cluster and launch mode are Hydra keys now): unset it" \
      "and pass ${_entry#*=}=${!_var} on the command line (docs/launching.md)"
  fi
done

case ${1:-} in
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  --overlay|--overlay=*)
    die "--overlay is gone: the overlays are Hydra groups now, e.g. size=qwen2.5_7b_math, ablation=no_dynamic_sampling," \
      "sampling=paper (docs/launching.md)" ;;
esac

# ------------------------------------------------------------------ paths, cluster, mode
: "${DAPO_HOME:=$HOME/dapo}"
: "${DATA_DIR:=$DAPO_HOME/data}"
: "${MODELS_DIR:=$DAPO_HOME/models}"
: "${LAUNCH_MODE:=local}" "${DRY_RUN:=0}" "${PRINT_OVERRIDES:=0}"
source "$ROOT/scripts/lib/python.sh"  # sets PYTHON

RUN_FOLDER='${trainer.project_name}/${trainer.experiment_name}'
# A Hydra quoted string keeps any path intact (commas, '=', spaces); ${...} inside it stays an interpolation.
hydra_str() { [[ $1 != *"'"* ]] || die "a path with a single quote is not supported: $1"; printf "'%s'" "$1"; }
hydra_list() { local out='' sep='' item; for item in "$@"; do out+="$sep$(hydra_str "$item")"; sep=,; done; printf '[%s]' "$out"; }

OVERRIDES=(
  # The size's model folder and data files are looked up in these (recipe_dapo/config/size/*.yaml).
  "dapo.paths.data_dir=$(hydra_str "$DATA_DIR")"
  "dapo.paths.models_dir=$(hydra_str "$MODELS_DIR")"
  # Checkpoints: one folder per project and experiment (<ablation>-<size> unless set), filled in by Hydra.
  "trainer.default_local_dir=$(hydra_str "${CKPTS_DIR:-$DAPO_HOME/ckpts/$RUN_FOLDER}")"
)
# Set only when given: otherwise the size's choice applies.
[[ -z "${MODEL_PATH:-}" ]] || OVERRIDES+=("actor_rollout_ref.model.path=$(hydra_str "$MODEL_PATH")")
[[ -z "${TRAIN_FILE:-}" ]] || OVERRIDES+=("data.train_files=$(hydra_str "$TRAIN_FILE")")
: "${VAL_FILES:=${VAL_FILE:-}}"
if [[ -n $VAL_FILES ]]; then
  read -r -a _val_files <<<"$VAL_FILES"
  OVERRIDES+=("data.val_files=$(hydra_list "${_val_files[@]}")")
fi
[[ -z "${NNODES:-}" ]] || OVERRIDES+=("trainer.nnodes=$NNODES")
[[ -z "${GPUS_PER_NODE:-}" ]] || OVERRIDES+=("trainer.n_gpus_per_node=$GPUS_PER_NODE")
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
    if (( ${NNODES:-1} > 1 )) && [[ -z "${RAY_ADDRESS:-}" ]]; then
      echo "launch_dapo.sh: NNODES=$NNODES and the driver runs here: this node must be the head of a running Ray" \
        "cluster (ray start --head; the others joined), or submit with scripts/ray_job_submit.sh" >&2
    fi
    exec "$PYTHON" -m recipe_dapo.main_dapo "${OVERRIDES[@]}"
    ;;
  ray)
    source "$ROOT/scripts/lib/ray_submit.sh"
    submit_ray_job "${OVERRIDES[@]}"
    ;;
  *) die "LAUNCH_MODE=$LAUNCH_MODE: use local or ray" ;;
esac
