#!/usr/bin/env bash
# DAPO, Qwen3-8B, long prompts (P<=8192, R<=2048, N=32), one node of 8 x H100-80GB, 25 steps.
# DAPO as veRL expresses it: no KL (so no ref pass), clip-higher (0.2 / 0.28), token-level loss, dynamic sampling
# (filter_groups on accuracy) and the DAPO reward manager's overlong penalty.
#   MODEL=/models/Qwen3-8B DATA=data/longprompt-8k SYSTEM=dualkv MB=8 bash experiments/verl/dapo_longreason_qwen3_8b.sh
source "$(dirname "$0")/common.sh"
MB="${MB:-4}"
mapfile -t ARGS < <(grpo_args 8192 2048 "$MB"; system_args)
launch_main_ppo "${ARGS[@]}" \
  actor_rollout_ref.actor.use_kl_loss=false algorithm.use_kl_in_reward=false \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  algorithm.filter_groups.enable=true algorithm.filter_groups.metric=acc algorithm.filter_groups.max_num_gen_batches=10 \
  reward.reward_manager.name=dapo \
  +reward.reward_kwargs.max_resp_len=2048 +reward.reward_kwargs.overlong_buffer_cfg.enable=true \
  +reward.reward_kwargs.overlong_buffer_cfg.len=512 +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
  +reward.reward_kwargs.overlong_buffer_cfg.log=false \
  trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_training_steps=25 \
  trainer.project_name=dualkv-longreason trainer.experiment_name="dapo-qwen3-8b-${SYSTEM}-mb${MB}" "$@"
