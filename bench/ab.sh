#!/usr/bin/env bash
# A/B of experiment libraries on the GPU: builds one library per "name:nvcc flags" entry of
# EXP_FLAGS (build/exp-<name>), then benchmarks each on EXP_SHAPES (default: the eight),
# one after the other, with the copy ceiling in each run; JSON to $OUT/exp_<name>.json.
#   EXP_FLAGS="base:;ef:-DMLAGEN_KV_L2_EVICT_FIRST=1" OUT=/tmp/o bench/ab.sh [extra bench.py args]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/runtime/python:$PWD PYTHONUNBUFFERED=1
IFS=';' read -ra exps <<< "${EXP_FLAGS:?name:flags;name:flags}"
for e in "${exps[@]}"; do n=${e%%:*}; f=${e#*:}
  cmake -S . -B build/exp-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGEN_CUDA_FLAGS="$f" > /dev/null &&
    cmake --build build/exp-$n -j "$(nproc)" > /tmp/build-exp-$n.log 2>&1 || { tail /tmp/build-exp-$n.log; exit 1; }
done
for e in "${exps[@]}"; do n=${e%%:*}
  echo "== exp $n (${e#*:})"
  MLAGEN_LIBRARY=$PWD/build/exp-$n/libmlagen.so python3 bench/bench.py --out /tmp/exp-$n --reps ${EXP_REPS:-30} \
    ${EXP_SHAPES:+--shapes $EXP_SHAPES} --no-seed --no-bmm --no-host-overhead --label "$n" "$@" 2>&1 |
    grep -E "^\[|copy ceiling|geomean"
  cp /tmp/exp-$n/latest.json "$OUT/exp_$n.json"
done
