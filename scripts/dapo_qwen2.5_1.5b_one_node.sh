#!/usr/bin/env bash
# DAPO on Qwen2.5-Math-1.5B on one node of 8 GPUs.
#
# Assumes:   1 node x 8 GPUs with 40 GB or more, Qwen2.5-Math-1.5B in MODELS_DIR ($DAPO_HOME/models/Qwen2.5-Math-1.5B,
#            or MODEL_PATH), DAPO-Math-17k, AIME 2024 and MATH-500 in DATA_DIR.
# Settings:  size=qwen2.5_1.5b_one_node: prompt 1,024 + response 3,072 (512-token buffer), train 128 / generation 384
#            prompts, G=16, mini-batch 32, vLLM TP 1, no offload; validation on AIME 2024 and MATH-500, 8 samples each.
#            A 3B model: MODEL_PATH=.../Qwen2.5-3B (32k context: the response length and overlong buffer may grow).
# Card:      40 GB GPUs: dapo.memory.gpu_memory_gib=39.4 (GiB as torch reports it), so the memory plan
#            is checked at start-up; on another card pass its figure (the dry run prints the plan).
# Expected:  vLLM's KV cache holds fewer full-length sequences than a replica runs at once, not fewer expected
#            ones: the exec line says why (dapo.memory.kv_waves_expected), so the plan states it, not a warning.
# Launch:    bash scripts/dapo_qwen2.5_1.5b_one_node.sh
# Override:  MODEL_PATH=/models/Qwen2.5-3B bash scripts/dapo_qwen2.5_1.5b_one_node.sh data.max_response_length=8192 \
#              reward.reward_kwargs.overlong_buffer_cfg.len=2048 trainer.save_freq=50
# Check:     DRY_RUN=1 bash scripts/dapo_qwen2.5_1.5b_one_node.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" size=qwen2.5_1.5b_one_node "dapo.memory.kv_waves_expected='full length is the worst case: at the expected length the cache holds a whole wave, and a larger vLLM share would take the headroom of the actor, which stays on the GPU'" dapo.memory.gpu_memory_gib=39.4 "$@"
