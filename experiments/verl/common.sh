# Shared pieces of the veRL launch scripts (sourced, not run).
#   SYSTEM=dualkv|fa2   which attention/packing (default dualkv)
#   MODEL=...           local model folder or HF id
#   DATA=...            folder with train.parquet / test.parquet (build_longprompt_dataset.py)
#   EXTRA overrides are passed through: script.sh key=value ...
#   DRY_RUN=1           print the Hydra overrides instead of launching

set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SYSTEM="${SYSTEM:-dualkv}"
: "${MODEL:?set MODEL to the model folder or HF id}"
: "${DATA:?set DATA to the folder holding train.parquet and test.parquet}"

# The one line a stock veRL recipe gets for dualkv (actor, and the ref, which follows it; the critic is untouched).
# dualkv must be installed (`pip install -e .` in the repository) so veRL loads its plugin.
DUALKV_ARGS=(
  +actor_rollout_ref.actor.use_dualkv=true
)

system_args() {
  case "$SYSTEM" in
    dualkv) printf '%s\n' "${DUALKV_ARGS[@]}" ;;
    fa2)    echo +actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2 ;;
    *) echo "SYSTEM must be dualkv or fa2, got '$SYSTEM'" >&2; exit 2 ;;
  esac
}

# GRPO on long prompts (the paper's LongReason setup): N=32, P<=8192, R<=2048, batch 128 / mini-batch 64,
# FSDP2 + bf16 + gradient checkpointing, vLLM TP=2.
grpo_args() {
  local p="$1" r="$2" mb="$3"
  cat <<ARGS
algorithm.adv_estimator=grpo
data.train_files=$DATA/train.parquet
data.val_files=$DATA/test.parquet
data.train_batch_size=128
data.max_prompt_length=$((p + 512))
data.max_response_length=$r
data.filter_overlong_prompts=true
actor_rollout_ref.model.path=$MODEL
actor_rollout_ref.model.use_remove_padding=true
actor_rollout_ref.model.enable_gradient_checkpointing=true
actor_rollout_ref.actor.strategy=fsdp2
actor_rollout_ref.ref.strategy=fsdp2
actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$mb
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$mb
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$mb
actor_rollout_ref.actor.use_kl_loss=true
actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.gpu_memory_utilization=0.5
actor_rollout_ref.rollout.n=32
reward.custom_reward_function.path=$HERE/reward.py
reward.custom_reward_function.name=compute_score
trainer.logger=[console]
trainer.val_before_train=false
trainer.test_freq=2
trainer.save_freq=-1
ARGS
}

# DRY_RUN=1: print the overrides, one per line, instead of launching (the test suite checks them with Hydra).
launch_main_ppo() {
  if [ "${DRY_RUN:-0}" = 1 ]; then printf '%s\n' "$@"; echo "---"; return 0; fi
  (cd "$REPO" && echo "+ python3 -m verl.trainer.main_ppo $*" >&2 && python3 -m verl.trainer.main_ppo "$@")
}
