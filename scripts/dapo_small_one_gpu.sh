#!/usr/bin/env bash
# DAPO on a small model on one GPU: the quickest real run with vLLM, dynamic sampling, the dapo loss and the
# recipe_dapo reward manager.
#
# Assumes:   1 GPU with 24 GB or more, Qwen2.5-0.5B-Instruct (or any small Qwen2-family model) in MODELS_DIR
#            ($DAPO_HOME/models/Qwen2.5-0.5B-Instruct, or MODEL_PATH), DAPO-Math-17k and MATH-500 in DATA_DIR.
# Settings:  size=small_one_gpu: prompt 1,024 + response 2,048 (512-token buffer), train 32 / generation 96 prompts,
#            G=8, mini-batch 16, 200 steps, validation on MATH-500 (4 samples) every 20 steps.
# Card:      24 GB GPUs: dapo.memory.gpu_memory_gib=23.6 (GiB as torch reports it), so the memory plan
#            is checked at start-up; on another card pass its figure (the dry run prints the plan).
# Launch:    bash scripts/dapo_small_one_gpu.sh
# Override:  MODEL_PATH=/models/my-qwen2 TRAIN_FILE=train.parquet VAL_FILES=val.parquet \
#              bash scripts/dapo_small_one_gpu.sh trainer.total_training_steps=5 trainer.val_before_train=false
# Check:     DRY_RUN=1 bash scripts/dapo_small_one_gpu.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" size=small_one_gpu dapo.memory.gpu_memory_gib=23.6 "$@"
