#!/usr/bin/env bash
# Download the wheels of wheels.txt for the GPU machine (CPython 3.12, manylinux x86_64) into .whl/ at the repo
# root (git-ignored; carry it to the device run). WITH_ARROW=1 adds pyarrow, pandas, python-dateutil.
# Usage: bash experiments/trl_grpo/fetch_wheels.sh [OUT_DIR]   (PYVER=3.11 PYVER_NODOT=311: wheels for a local check)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$HERE/../../.whl}"
PIP="${PIP:-python3 -m pip}"
mkdir -p "$OUT"
while read -r line; do
  spec="${line%%#*}"; spec="$(echo "$spec" | xargs)"
  [[ -z "$spec" ]] && continue
  if [[ "$spec" == @arrow* ]]; then
    [[ "${WITH_ARROW:-0}" == 1 ]] || continue
    spec="$(echo "${spec#@arrow}" | xargs)"
  fi
  $PIP download --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp --abi "cp${PYVER_NODOT:-312}" --abi abi3 \
    --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -q -d "$OUT" "$spec" 2>&1 | grep -v "is ignored" || true
  ls "$OUT" | grep -qi "^$(echo "${spec%%==*}" | tr '-' '_')-" || { echo "missing wheel for $spec" >&2; exit 1; }
done < "$HERE/wheels.txt"
ls -la "$OUT"
total=$(du -cb "$OUT"/*.whl | tail -1 | cut -f1)
echo "total: $((total / 1024 / 1024)) MiB in $(ls "$OUT"/*.whl | wc -l) wheels"
[[ $total -le $((64 * 1024 * 1024)) ]] || { echo "over the 64 MiB carry limit" >&2; exit 1; }
