#!/usr/bin/env bash
# DAPO on Qwen2.5-Math-7B: one 8-GPU node by default, more with NNODES.
#
# Assumes:   1 node x 8 GPUs with 80 GB each (NNODES=N for N nodes in one Ray cluster), Qwen2.5-Math-7B in MODELS_DIR
#            ($DAPO_HOME/models/Qwen2.5-Math-7B, or MODEL_PATH), DAPO-Math-17k and AIME 2024 in DATA_DIR.
# Settings:  size=qwen2.5_7b_math: the paper's algorithm with sizes for a 4k-context model: prompt 1,024 + response
#            3,072 (512-token overlong buffer), train 128 / generation 384 prompts, G=16, mini-batch 32, no sequence
#            parallel, vLLM TP 2, no offload.
# Card:      80 GB GPUs: dapo.memory.gpu_memory_gib=79.2 (GiB as torch reports it), so the memory plan
#            is checked at start-up; on another card pass its figure (the dry run prints the plan).
# Launch:    bash scripts/dapo_qwen2.5_7b_math.sh                                # one node, driver here
#            NNODES=4 bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_7b_math.sh data.train_batch_size=512
# Override:  MODEL_PATH=Qwen/Qwen2.5-Math-7B DATA_DIR=/data/dapo bash scripts/dapo_qwen2.5_7b_math.sh trainer.total_epochs=5
# Check:     DRY_RUN=1 bash scripts/dapo_qwen2.5_7b_math.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" size=qwen2.5_7b_math dapo.memory.gpu_memory_gib=79.2 "$@"
