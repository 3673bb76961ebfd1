#!/usr/bin/env bash
# One device call for the Hopper kernel work: precompile every sm_90 specialization (parallel NVRTC), the session
# script (checks + timings, one process, JSON), then the GPU tests named in $TESTS. Everything lands in $OUT.
#   bash experiments/gpu/run_hopper.sh [hopper_session.py arguments]
set -u
source "$(dirname "$0")/device_env.sh"
timeout ${SESSION_S:-300} python3 experiments/gpu/hopper_session.py --out "$OUT" "$@" 2>&1 | tee "$OUT/session.log"
if [ -n "${TESTS:-}" ]; then
    timeout ${TESTS_S:-200} python3 -m pytest -q -x -m gpu -p no:cacheprovider $TESTS > "$OUT/pytest.log" 2>&1
    tail -25 "$OUT/pytest.log"
fi
cat "$OUT/gpu.txt"; tail -3 "$OUT/compile.log"
