#!/usr/bin/env bash
# A/B of prebuilt libraries: LIBS="name:path;name:path" bench/ab_libs.sh [bench.py args]
# benchmarks each (no peers) on EXP_SHAPES (default the eight), JSON to $OUT/exp_<name>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/runtime/python:$PWD PYTHONUNBUFFERED=1
IFS=';' read -ra libs <<< "${LIBS:?name:path;name:path}"
for e in "${libs[@]}"; do n=${e%%:*}; lib=${e#*:}
  echo "== $n ($lib)"
  MLAGEN_LIBRARY=$lib python3 bench/bench.py --out /tmp/exp-$n --reps ${EXP_REPS:-30} \
    ${EXP_SHAPES:+--shapes $EXP_SHAPES} --no-seed --no-bmm --no-host-overhead --label "$n" "$@" 2>&1 |
    grep -E "^\[|copy ceiling|geomean"
  cp /tmp/exp-$n/latest.json "$OUT/exp_$n.json"
done
