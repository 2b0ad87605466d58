#!/usr/bin/env bash
# Ablation of the paper's 32B run: without token-level loss and without dynamic sampling (Table 1: 41 on AIME 2024),
# i.e. clip-higher and soft overlong punishment only.
#
# Assumes:   as scripts/dapo_qwen2.5_32b.sh: 16 nodes x 8 GPUs (80 GB), Qwen2.5-32B in MODELS_DIR, DAPO-Math-17k and
#            AIME 2024 in DATA_DIR. Same settings except actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
#            and algorithm.filter_groups.enable=false (ablation=table1_soft_overlong, Table 1's fourth row).
# Card:      80 GB GPUs: dapo.memory.gpu_memory_gib=79.2 (GiB as torch reports it), so the memory plan
#            is checked at start-up; on another card pass its figure (the dry run prints the plan).
# Expected:  vLLM's KV cache holds fewer full-length sequences than a replica runs at once (the paper's lengths):
#            the exec line says why (dapo.memory.kv_waves_expected), so the plan states it instead of warning.
# Launch:    bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh
# Override:  bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh \
#              trainer.experiment_name=early-dapo
# Check:     DRY_RUN=1 bash scripts/dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" size=paper_32b ablation=table1_soft_overlong "dapo.memory.kv_waves_expected='the paper lengths at the paper TP 4: no 80 GB setting holds a wave of full-length sequences, and a lower max_num_seqs would idle the cache while responses are short'" dapo.memory.gpu_memory_gib=79.2 "$@"
