# Same-call A/B of two versions of the package: `dualkv bench kernel ARGS...` alternately from this tree and from
# another copy of it (OTHER, a folder holding a `dualkv/` package, e.g. an older commit's), each process started from
# inside its own tree so that it imports that tree's package (`python -m` puts the working directory first on
# sys.path, ahead of PYTHONPATH: session 27's first try imported this tree twice). Every process checks and prints the
# package it imported. Before the device call, here:
#   mkdir -p _ab && git archive eca2523 dualkv | tar -x -C _ab      # untracked: travels with the working tree
# then, on the device (RUNS alternations, default 2):
#   OTHER=_ab OTHER_NAME=eca2523 bash experiments/gpu/ab_trees.sh --systems dualkv_mma --shapes 8:8192 --mode bwd
# or, per kernel (torch.profiler; kernel_times.py's arguments):
#   TOOL=kernel_times OTHER=_ab OTHER_NAME=eca2523 bash experiments/gpu/ab_trees.sh --system dualkv_mma --shapes 8:8192
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OTHER=$(cd "$ROOT" && cd "${OTHER:?OTHER must name the other tree}" && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
unset PYTHONPATH
here=$(cat "$ROOT/.commit" 2>/dev/null || echo this-tree)
for i in $(seq 1 "${RUNS:-2}"); do
    for side in other here; do
        if [ $side = other ]; then tree=$OTHER; name=${OTHER_NAME:-other}; else tree=$ROOT; name=$here; fi
        log="$OUT/ab_${side}$i.log"
        if [ "${TOOL:-bench}" = kernel_times ]; then  # per-kernel times (experiments/gpu/kernel_times.py, this tree's)
            run="sys.argv = ['kernel_times', *sys.argv[1:]]; runpy.run_path('$ROOT/experiments/gpu/kernel_times.py', run_name='__main__')"
            out=(--out "$OUT/bench/ab_${side}$i.json")
        else
            run="sys.argv = ['dualkv', 'bench', 'kernel', *sys.argv[1:]]; runpy.run_module('dualkv', run_name='__main__')"
            out=(--out "$OUT/bench/ab_${side}$i")
        fi
        (cd "$tree" && DUALKV_COMMIT=$name timeout "${LIMIT:-200}" "${PYTHON:-python3}" -c "
import runpy, sys
import dualkv
assert dualkv.__file__.startswith('$tree/'), ('imported', dualkv.__file__, 'expected under', '$tree')
print('package:', dualkv.__file__, flush=True)
$run
" "$@" "${out[@]}") > "$log" 2>&1
        echo "== $side$i ($name): exit $?"; grep -E "^package:" "$log"; tail -"${TAIL:-4}" "$log"
    done
done
