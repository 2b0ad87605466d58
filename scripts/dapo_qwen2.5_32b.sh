#!/usr/bin/env bash
# DAPO as in the paper (section 4.1): Qwen2.5-32B base, AIME 2024 avg@32 of 50 after training.
#
# Assumes:   16 nodes x 8 GPUs with 80 GB each (H100/A100-80G) in one Ray cluster, a filesystem every node sees
#            holding $MODELS_DIR/Qwen2.5-32B (MODELS_DIR=$DAPO_HOME/models) and DATA_DIR ($DAPO_HOME/data, from
#            `bash scripts/prepare_data.sh "$DATA_DIR"`: dapo-math-17k.parquet, aime-2024.parquet).
# Settings:  size=paper_32b: train 512 / generation 1,536 prompts, G=16, mini-batch 32, lr 1e-6 (20 warm-up steps),
#            weight decay 0.1, grad clip 1.0, eps 0.2/0.28, clip_ratio_c 10, prompt 2,048 + response 20,480 (4,096
#            overlong buffer, penalty 1.0), temperature 1.0, validation top-p 0.7 x 32 samples, Ulysses SP 8, vLLM TP 4,
#            FSDP offload; sampling=paper: dynamic sampling exactly as the paper.
# Card:      80 GB GPUs: dapo.memory.gpu_memory_gib=79.2 (GiB as torch reports it), so the memory plan
#            is checked at start-up; on another card pass its figure (the dry run prints the plan).
# Expected:  vLLM's KV cache holds fewer full-length sequences than a replica runs at once (the paper's lengths):
#            the exec line says why (dapo.memory.kv_waves_expected), so the plan states it instead of warning.
# Launch:    bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b.sh          # submit to the cluster at RAY_ADDRESS
#            bash scripts/dapo_qwen2.5_32b.sh                                    # or run the driver here (head node)
# Override:  DAPO_HOME=/shared/dapo bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b.sh \
#              trainer.logger='["console","wandb"]' trainer.save_freq=10
# Check:     DRY_RUN=1 bash scripts/dapo_qwen2.5_32b.sh       (composes and checks the config; no Ray, GPU or model)
# Every variable and mode: bash scripts/launch_dapo.sh --help
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" size=paper_32b sampling=paper "dapo.memory.kv_waves_expected='the paper lengths at the paper TP 4: no 80 GB setting holds a wave of full-length sequences, and a lower max_num_seqs would idle the cache while responses are short'" dapo.memory.gpu_memory_gib=79.2 "$@"
