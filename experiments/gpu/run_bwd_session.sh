#!/usr/bin/env bash
# Device calls for the Hopper backward work, in parts that each fit one call (a warm machine keeps the kernel cache):
#   bash experiments/gpu/run_bwd_session.sh check   # precompile; WS backward checks, determinism, timing; variants;
#                                                   # Nsight Compute profiles of dualkv's and the cuDNN cascade's bwd
#   bash experiments/gpu/run_bwd_session.sh table   # Table 1 (dualkv vs cuDNN cascade, fwd/bwd/fwd+bwd, memory)
#   bash experiments/gpu/run_bwd_session.sh tests   # the GPU test suite and `dualkv verify`
# Everything lands in $OUT; each step has its own time limit so one hang does not take the rest.
set -u
source "$(dirname "$0")/device_env.sh"
tail -3 "$OUT/compile.log"
SHAPE=${SHAPE:-16:32768}
# Nsight Compute: every kernel of one dualkv backward (full sections) and of one cuDNN cascade backward (speed of
# light, warp states), reports and text pages in $OUT.
profile() {
    local sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
--section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy"
    timeout 150 ncu --clock-control none --profile-from-start off $sections -f -o "$OUT/ncu_dualkv_bwd" \
        python3 experiments/gpu/profile_bwd.py --systems dualkv --shape "$SHAPE" > "$OUT/ncu_dualkv.log" 2>&1
    timeout 120 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        -f -o "$OUT/ncu_cudnn_bwd" python3 experiments/gpu/profile_bwd.py --systems cudnn --shape "$SHAPE" \
        > "$OUT/ncu_cudnn.log" 2>&1
    for r in ncu_dualkv_bwd ncu_cudnn_bwd; do
        [ -f "$OUT/$r.ncu-rep" ] && ncu --import "$OUT/$r.ncu-rep" --page details > "$OUT/$r.txt" 2>&1
        grep -E "^  [a-z_]|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Warp Cycles Per Issued" \
            "$OUT/$r.txt" 2>/dev/null | head -40
    done
}
case "${1:-check}" in
check)
    timeout 150 python3 experiments/gpu/hopper_session.py --sections bwd --shapes "$SHAPE" --out "$OUT" --tag bwd \
        2>&1 | tail -40
    timeout 150 python3 experiments/gpu/debug_ws_bwd.py --timing "$SHAPE" --out "$OUT" \
        --variants "${VARIANTS:-base,serial_dq,nosem,nodq}" 2>&1 | tail -8
    profile
    ;;
profile)
    profile
    ;;
table)
    [ -n "${PROFILE:-}" ] && profile
    timeout 400 python3 experiments/gpu/hopper_session.py --sections table --systems dualkv,cudnn_cascade \
        --shapes "${SHAPES:-28:4096,8:8192,28:16384,16:32768,16:65536,4:131072}" --modes fwd,bwd,fwdbwd \
        --out "$OUT" --tag table1 2>&1 | tail -30
    ;;
tests)
    timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-proofs_tests} > "$OUT/pytest.log" 2>&1
    tail -15 "$OUT/pytest.log"
    timeout 200 python3 -m dualkv verify --no-progress --json "$OUT/verify-$(date -u +%Y%m%dT%H%MZ).json" \
        > "$OUT/verify.log" 2>&1
    tail -8 "$OUT/verify.log"
    ;;
esac
cat "$OUT/gpu.txt"
