#!/usr/bin/env bash
# One device call for the Hopper kernel work: precompile every sm_90 specialization (parallel NVRTC), the session
# script (checks + timings, one process, JSON), then the GPU tests named in $TESTS. Everything lands in $OUT.
#   bash experiments/gpu/run_hopper.sh [hopper_session.py arguments]
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# the copy there has no usable git history: name the commit ($DUALKV_COMMIT, read by dualkv/_provenance.py)
export DUALKV_COMMIT=${DUALKV_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
git rev-parse HEAD >> "$OUT/gpu.txt" 2>/dev/null
( time timeout ${COMPILE_S:-150} python3 -m dualkv kernels --compile-only --arch sm_90 --jobs 16 --no-progress ) \
    > "$OUT/compile.log" 2>&1
timeout ${SESSION_S:-300} python3 experiments/gpu/hopper_session.py --out "$OUT" "$@" 2>&1 | tee "$OUT/session.log"
if [ -n "${TESTS:-}" ]; then
    timeout ${TESTS_S:-200} python3 -m pytest -q -x -m gpu -p no:cacheprovider $TESTS > "$OUT/pytest.log" 2>&1
    tail -25 "$OUT/pytest.log"
fi
cat "$OUT/gpu.txt"; tail -3 "$OUT/compile.log"
