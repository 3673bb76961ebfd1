#!/usr/bin/env bash
# GRPO, Qwen3-30B-A3B (MoE), two nodes of 8 x H100-80GB with EFA, mb=8, P<=8192, R<=2048, N=32, 29 steps.
# Paper's configurations: SYSTEM=dualkv SP=1; SYSTEM=fa2 SP=4 (FA2 SP=2 OOMs in the first backward).
# Start a Ray cluster over both nodes first (ray start --head on one, ray start --address=<head>:6379 on the
# other), with dualkv and veRL installed on both, then run this on the head node:
#   MODEL=/models/Qwen3-30B-A3B DATA=data/longprompt-8k SYSTEM=dualkv SP=1 bash experiments/verl/grpo_moe_qwen3_30b_a3b.sh
source "$(dirname "$0")/common.sh"
SP="${SP:-1}"
mapfile -t ARGS < <(grpo_args 8192 2048 8; system_args)
launch_main_ppo "${ARGS[@]}" \
  actor_rollout_ref.actor.ulysses_sequence_parallel_size="$SP" actor_rollout_ref.ref.ulysses_sequence_parallel_size="$SP" \
  trainer.n_gpus_per_node=8 trainer.nnodes=2 trainer.total_training_steps=29 \
  trainer.project_name=dualkv-moe trainer.experiment_name="grpo-qwen3-30b-a3b-${SYSTEM}-sp${SP}" "$@"
