#!/usr/bin/env bash
# The paper's baseline: naive GRPO on Qwen2.5-32B (Table 1: 30 on AIME 2024).
#
# Assumes:   as scripts/dapo_qwen2.5_32b.sh: 16 nodes x 8 GPUs (80 GB), Qwen2.5-32B at MODEL_PATH, DAPO-Math-17k and
#            AIME 2024 in DATA_DIR. Same sizes and optimiser; symmetric clip 0.2/0.2, sample-level loss
#            (seq-mean-token-mean), no overlong shaping or filtering, no dynamic sampling, no KL (overlay grpo_baseline).
#            Table 1's intermediate rows add one technique back each: see docs/launching.md.
# Launch:    bash scripts/ray_job_submit.sh scripts/grpo_qwen2.5_32b_baseline.sh
# Override:  USE_KL_LOSS=true KL_LOSS_COEF=0.001 bash scripts/ray_job_submit.sh scripts/grpo_qwen2.5_32b_baseline.sh
# Check:     DRY_RUN=1 bash scripts/grpo_qwen2.5_32b_baseline.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" --overlay grpo_baseline "$@"
