#!/usr/bin/env bash
# Ablation of the paper's 32B run: without token-level loss and without dynamic sampling (Table 1: 41 on AIME 2024),
# i.e. clip-higher and soft overlong punishment only.
#
# Assumes:   as scripts/dapo_qwen2.5_32b.sh: 16 nodes x 8 GPUs (80 GB), Qwen2.5-32B at MODEL_PATH, DAPO-Math-17k and
#            AIME 2024 in DATA_DIR. Same settings except actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
#            and algorithm.filter_groups.enable=false (overlays no_token_level_loss, no_dynamic_sampling).
# Launch:    bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh
# Override:  EXP_NAME=early-dapo bash scripts/ray_job_submit.sh scripts/dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh
# Check:     DRY_RUN=1 bash scripts/dapo_qwen2.5_32b_no_token_loss_no_dynamic_sampling.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/launch_dapo.sh" --overlay no_token_level_loss --overlay no_dynamic_sampling "$@"
