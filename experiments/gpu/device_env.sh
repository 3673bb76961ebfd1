# Sourced by the device-call scripts of experiments/gpu (run from anywhere): the repository root as the working
# directory, the environment the GPU machine needs, $OUT, the GPU's name in $OUT/gpu.txt, and every sm_90 kernel
# specialization precompiled (parallel NVRTC, log in $OUT/compile.log).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# the copy there has no usable git history: name the commit ($DUALKV_COMMIT, read by dualkv/_provenance.py)
export DUALKV_COMMIT=${DUALKV_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
( time timeout ${COMPILE_S:-150} python3 -m dualkv kernels --compile-only --arch sm_90 --jobs 16 --no-progress ) \
    > "$OUT/compile.log" 2>&1
