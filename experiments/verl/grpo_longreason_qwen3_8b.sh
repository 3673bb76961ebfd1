#!/usr/bin/env bash
# GRPO, Qwen3-8B, long prompts (P<=8192, R<=2048, N=32), one node of 8 x H100-80GB (paper: p5.48xlarge), 25 steps.
# The paper's four configurations: SYSTEM=fa2 MB=4, SYSTEM=dualkv MB=4, SYSTEM=dualkv MB=8 (FA2 MB=8 OOMs).
#   MODEL=/models/Qwen3-8B DATA=data/longprompt-8k SYSTEM=dualkv MB=8 bash experiments/verl/grpo_longreason_qwen3_8b.sh
source "$(dirname "$0")/common.sh"
MB="${MB:-4}"
mapfile -t ARGS < <(grpo_args 8192 2048 "$MB"; system_args)
launch_main_ppo "${ARGS[@]}" \
  trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_training_steps=25 \
  trainer.project_name=dualkv-longreason trainer.experiment_name="grpo-qwen3-8b-${SYSTEM}-mb${MB}" "$@"
