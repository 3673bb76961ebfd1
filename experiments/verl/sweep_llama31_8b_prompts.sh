#!/usr/bin/env bash
# Prompt-length sweep, Llama-3.1-8B-Instruct, GRPO N=32, R<=2048, two nodes of 8 x H100-80GB, FusedLinearForPPO on,
# vLLM gpu_memory_utilization=0.4: P in {8K,16K,32K,48K,64K,96K} x mb in {4,8,16} (the paper's memory law; FA2
# OOMs at these sizes, so the paper projects it — SYSTEM=fa2 runs it anyway). Builds each P's dataset if missing.
# Needs the Ray cluster of grpo_moe_qwen3_30b_a3b.sh.  Peak memory: trainer metric perf/max_memory_allocated_gb.
#   MODEL=/models/Llama-3.1-8B-Instruct DATA=data SYSTEM=dualkv STEPS=3 bash experiments/verl/sweep_llama31_8b_prompts.sh
source "$(dirname "$0")/common.sh"
STEPS="${STEPS:-3}"
for P in 8192 16384 32768 49152 65536 98304; do
  set_dir="$DATA/longprompt-$P"
  if [ "${DRY_RUN:-0}" != 1 ] && [ ! -f "$set_dir/train.parquet" ]; then
    python3 "$HERE/build_longprompt_dataset.py" --out "$set_dir" --prompt-tokens "$P" --num-train 1024 \
      --num-val 32 --tokenizer "$MODEL"
  fi
  for MB in 4 8 16; do
    mapfile -t ARGS < <(DATA="$set_dir" grpo_args "$P" 2048 "$MB"; system_args)
    launch_main_ppo "${ARGS[@]}" \
        actor_rollout_ref.model.use_fused_kernels=true \
        actor_rollout_ref.model.fused_kernel_options.impl_backend=triton \
        actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
        trainer.n_gpus_per_node=8 trainer.nnodes=2 trainer.total_training_steps="$STEPS" trainer.test_freq=-1 \
        trainer.project_name=dualkv-llama-sweep trainer.experiment_name="llama31-8b-${SYSTEM}-P${P}-mb${MB}" "$@" \
      || echo "P=$P mb=$MB failed (OOM?)" >&2
  done
done
