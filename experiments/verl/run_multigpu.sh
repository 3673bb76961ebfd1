#!/usr/bin/env bash
# Everything for one multi-GPU host, in one command (repo root; carry experiments/verl/wheels, filled on a machine
# with network by experiments/verl/fetch_wheels.sh):
#
#   bash experiments/verl/run_multigpu.sh 2gpu     # parity DP=2 and SP=2, then the policy-update benchmark
#   bash experiments/verl/run_multigpu.sh 4gpu     # parity DP=2 x SP=2 (then DP=2 and SP=2 again if time is left)
#   PARTS=trie bash experiments/verl/run_multigpu.sh 2gpu   # parity DP=2 and SP=2 with dualkv_packing=trie
#   PARTS=control,pytest ...   # the DP=2 batch on one GPU (dp1 control); the pytest multigpu tests
#   PARTS=fit1,speed / PARTS=fit2 ...   # longest prompt near SP=1's limit / at SP=2; dualkv vs stock (mb=1) at SP=2
#
# Writes JSON under $OUT (default out/multigpu): distributed_parity-<mode>.json, multigpu-*.json,
# multigpu_summary.json, and a log per step (bundled into logs.tgz at the end). Whole run bounded by BUDGET_S (default 450 s): each step gets what is
# left (minus a margin) and a later step is skipped when too little is left. The carried wheels go to a temporary
# --target folder on PYTHONPATH (pip never resolves dependencies); the kernels are precompiled first.
set -uo pipefail
MODE="${1:?usage: run_multigpu.sh 2gpu|4gpu}"
OUT="${OUT:-out/multigpu}"
BUDGET_S="${BUDGET_S:-450}"
PARTS="${PARTS:-parity,bench}"      # 2gpu: PARTS=bench (or parity) runs one half, e.g. in a second call
WHEELS="${WHEELS:-experiments/verl/wheels}"
mkdir -p "$OUT"
START=$SECONDS
log() { echo "[run_multigpu $MODE +$((SECONDS - START)) s] $*" | tee -a "$OUT/run_multigpu.log"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }

export PYTHONWARNINGS=ignore VERL_LOGGING_LEVEL=ERROR TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1      # the hosts run with NVLink multicast off
export DUALKV_COMMIT="${DUALKV_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
SITE="$(mktemp -d /tmp/verl-site.XXXXXX)"
ls "$WHEELS"/*.whl > /dev/null 2>&1 || { log "no wheels in $WHEELS (run experiments/verl/fetch_wheels.sh and carry it)"; exit 1; }
python3 -m pip install -q --no-deps --no-index --target "$SITE" "$WHEELS"/*.whl || { log "wheel install failed"; exit 1; }
export PYTHONPATH="$PWD:$SITE"
log "wheels installed into $SITE; $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"

# step NAME MAX_S CMD...: run CMD under min(MAX_S, what is left - 15 s); skipped when under 30 s are left.
step() {
  local name="$1" max_s="$2"; shift 2
  local limit=$(( $(left) - 15 ))
  (( limit > max_s )) && limit=$max_s
  if (( limit < 30 )); then log "SKIP $name (budget: $(left) s left)"; return 0; fi
  log "start $name (limit $limit s)"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "end   $name rc=$rc"
  grep -E "^\[(dp1|dp2|sp2|dp2sp2)\]|passed|failed|^  rank|^\[w[0-9]|^wrote|FAILED|Error" "$OUT/$name.log" | tail -20
  return 0
}

# The device tool returns at most 8 files per call: keep the JSON results, bundle every log into one archive.
finish() {
  log "done; results in $OUT"
  tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log 2>/dev/null) && (cd "$OUT" && rm -f *.log)
  ls -la "$OUT"
}

TR="python3 -m torch.distributed.run --standalone"
PARITY=experiments/verl/distributed_parity.py
# a parity run covers 4 batches on a GPU (--batches): ~4x the one-batch 8-13 s, plus start-up
PARITY_S=${PARITY_S:-240}
BENCH=experiments/verl/multigpu_bench.py
MODELS=/tmp/dualkv-multigpu-models

log "precompiling kernels"
step kernels 150 python3 -m dualkv kernels --compile-only --arch sm_90 --jobs 16 --no-progress &
KERNELS=$!
want() { [[ ",$PARTS," == *",$1,"* ]]; }
if [[ "$MODE" == 2gpu ]] && { want bench || want fit1 || want fit2 || want speed; }; then
  # A random-weight Qwen3-1.7B, saved while the kernels compile: DP scaling at P=8K and the longest-prompt search.
  # (Qwen3-4B was tried first: its fp32 weights, gradients and Adam states left stock no room for P=8K at SP=1 or
  # SP=2 on 80 GB cards, so nothing could be compared there; 2xH100, 1777adb.)
  python3 $BENCH --save-model $MODELS/qwen3-1.7b --model qwen3-1.7b --max-positions 470000 > "$OUT/save_1.7b.log" 2>&1 &
  SAVE1=$!
fi
wait $KERNELS

case "$MODE" in
  2gpu)
    if want parity; then
      step parity_dp2 $PARITY_S $TR --nproc-per-node 2 $PARITY --mode dp2 --out "$OUT"
      step parity_sp2 $PARITY_S $TR --nproc-per-node 2 $PARITY --mode sp2 --out "$OUT"
    fi
    if want control; then  # the DP=2 global batch on one process: is a bf16 gap the distribution's or the batch's?
      step parity_dp1 $PARITY_S $TR --nproc-per-node 1 $PARITY --mode dp1 --groups-per-rank 8 --out "$OUT"
    fi
    if want pytest; then   # the multi-GPU tests (2 GPUs; the DP=2 x SP=2 case skips)
      step pytest_multigpu ${PYTEST_S:-420} python3 -m pytest -q -m multigpu -p no:cacheprovider \
        proofs_tests/test_cuda_multigpu.py proofs_tests/test_verl_distributed_parity.py
    fi
    if want trie; then     # micro-batches packed as tries; every prompt starts with the same 32-token system prompt
      step parity_dp2_trie $PARITY_S $TR --nproc-per-node 2 $PARITY --mode dp2 --packing trie --system-prompt 32 --out "$OUT"
      step parity_sp2_trie $PARITY_S $TR --nproc-per-node 2 $PARITY --mode sp2 --packing trie --system-prompt 32 --out "$OUT"
    fi
    { want bench || want fit1 || want fit2 || want speed; } || { finish; exit 0; }
    wait $SAVE1; log "models saved: $(du -sh $MODELS | cut -f1)"
    common=(--R 2048 --N 8 --out "$OUT")
    # The longest prompt around where the memory model (peak GiB linear in P, fitted on the search below at
    # 8K-131K: SP=1 ~0.24 GiB, SP=2 ~0.12 GiB per 1K prompt tokens) puts SP=1's limit, and twice the largest SP=1
    # prompt at SP=2: dualkv only, one timed run each (a search from 8K up would not fit a call).
    if want fit1; then
      step fit_sp1 330 $TR --nproc-per-node 1 $BENCH --task maxp --sp 1 --model-dir $MODELS/qwen3-1.7b --systems dualkv \
        --P 196608,229376,262144 --warmup 0 --reps 1 --tag fit "${common[@]}"
    fi
    if want fit2; then
      step fit_sp2 420 $TR --nproc-per-node 2 $BENCH --task maxp --sp 2 --model-dir $MODELS/qwen3-1.7b --systems dualkv \
        --P "${FIT2_P:-393216,458752}" --warmup 0 --reps 1 --tag fit "${common[@]}"
    fi
    # dualkv (the group in one micro-batch) vs stock at its own best fit (one N-copy row per micro-batch) at SP=2
    if want speed; then
      step speed_sp2 240 $TR --nproc-per-node 2 $BENCH --task maxp --sp 2 --model-dir $MODELS/qwen3-1.7b \
        --P 8192,16384,32768 --stock-mb 1 --reps 1 --tag speed "${common[@]}"
    fi
    want bench || { python3 $BENCH --summarize "$OUT" > "$OUT/summary.log" 2>&1; finish; exit 0; }
    step tp_w1 75 $TR --nproc-per-node 1 $BENCH --task throughput --model-dir $MODELS/qwen3-1.7b --systems dualkv \
      --P 8192 --time-budget-s 50 "${common[@]}"
    step tp_w2 75 $TR --nproc-per-node 2 $BENCH --task throughput --model-dir $MODELS/qwen3-1.7b --systems dualkv \
      --P 8192 --time-budget-s 50 "${common[@]}"
    GRID=8192,16384,24576,32768,49152,65536,98304,131072
    step maxp_sp1 90 $TR --nproc-per-node 1 $BENCH --task maxp --sp 1 --model-dir $MODELS/qwen3-1.7b --P $GRID \
      --reps 1 --time-budget-s 65 "${common[@]}"
    # SP=2 searches up to twice SP=1's longest dualkv prompt (enough to show >= 1.8x; bounded time).
    CAP=$(python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
try:
    rows = json.loads(next(Path(sys.argv[1]).glob("multigpu-maxp-w1-sp1-*.json")).read_text())["rows"]
    ok = [r["P"] for r in rows if r["system"] == "dualkv" and r["status"] == "ok"]
    print(2 * max(ok) if ok else 65536)
except StopIteration:
    print(65536)
EOF
)
    step maxp_sp2 150 $TR --nproc-per-node 2 $BENCH --task maxp --sp 2 --model-dir $MODELS/qwen3-1.7b --P $GRID \
      --max-p "$CAP" --reps 1 --time-budget-s 120 "${common[@]}"
    python3 $BENCH --summarize "$OUT" > "$OUT/summary.log" 2>&1; log "summary: $OUT/multigpu_summary.json"
    cat "$OUT/multigpu_summary.json" 2>/dev/null | head -80
    ;;
  4gpu)
    step parity_dp2sp2 $PARITY_S $TR --nproc-per-node 4 $PARITY --mode dp2sp2 --out "$OUT"
    step parity_dp2 $PARITY_S $TR --nproc-per-node 2 $PARITY --mode dp2 --out "$OUT"
    step parity_sp2 $PARITY_S $TR --nproc-per-node 2 $PARITY --mode sp2 --out "$OUT"
    ;;
  *) log "unknown mode $MODE (2gpu or 4gpu)"; exit 2 ;;
esac
finish
