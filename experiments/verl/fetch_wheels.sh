#!/usr/bin/env bash
# Download the wheels of wheels.txt for the GPU machine (CPython 3.12, manylinux x86_64) into
# experiments/verl/wheels/ (git-ignored; pass it to the device run with carry=["experiments/verl/wheels"]).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$HERE/wheels}"
PIP="${PIP:-python3 -m pip}"
mkdir -p "$OUT"
mapfile -t SPECS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HERE/wheels.txt" | grep -v '^$')
for spec in "${SPECS[@]}"; do
  if [[ "$spec" == antlr4-python3-runtime==* ]]; then
    $PIP wheel --no-deps -q -w "$OUT" "$spec"          # sdist only; pure Python
  else
    $PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -q -d "$OUT" "$spec"
  fi
done
ls -la "$OUT"
du -sh "$OUT"
