#!/usr/bin/env bash
# The paper's baseline: naive GRPO on Qwen2.5-32B (Table 1: 30 on AIME 2024).
#
# Assumes:   as scripts/dapo_qwen2.5_32b.sh: 16 nodes x 8 GPUs (80 GB), Qwen2.5-32B in MODELS_DIR, DAPO-Math-17k and
#            AIME 2024 in DATA_DIR. Same sizes and optimiser; symmetric clip 0.2/0.2, sample-level loss
#            (seq-mean-token-mean), no overlong shaping or filtering, no dynamic sampling, no KL (ablation=grpo_baseline).
#            Table 1's other rows are ablation=table1_* choices: see docs/launching.md.
# Card:      80 GB GPUs: dapo.memory.gpu_memory_gib=79.2 (GiB as torch reports it), so the memory plan
#            is checked at start-up; on another card pass its figure (the dry run prints the plan).
# Expected:  vLLM's KV cache holds fewer full-length sequences than a replica runs at once (the paper's lengths):
#            the exec line says why (dapo.memory.kv_waves_expected), so the plan states it instead of warning.
# Launch:    bash scripts/ray_job_submit.sh scripts/grpo_qwen2.5_32b_baseline.sh
# Override:  bash scripts/ray_job_submit.sh scripts/grpo_qwen2.5_32b_baseline.sh \
#              actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.001
# Check:     DRY_RUN=1 bash scripts/grpo_qwen2.5_32b_baseline.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" size=paper_32b ablation=grpo_baseline "dapo.memory.kv_waves_expected='the paper lengths at the paper TP 4: no 80 GB setting holds a wave of full-length sequences, and a lower max_num_seqs would idle the cache while responses are short'" dapo.memory.gpu_memory_gib=79.2 "$@"
