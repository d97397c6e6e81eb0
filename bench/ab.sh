#!/usr/bin/env bash
# A/B of experiment libraries on the GPU, each benchmarked (no peers) on EXP_SHAPES (default:
# the eight) one after the other with the copy ceiling in each run; JSON to $OUT/exp_<name>.json.
#   EXP_FLAGS="base:;ef:-DFLAG=1" bench/ab.sh [bench.py args]   builds build/exp-<name> per entry
#   LIBS="base:/path/libmlagen.so;new:/path2" bench/ab.sh [...]  takes prebuilt libraries
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/runtime/python:$PWD PYTHONUNBUFFERED=1
if [ -z "${LIBS:-}" ]; then
  IFS=';' read -ra exps <<< "${EXP_FLAGS:?EXP_FLAGS or LIBS: name:flags;name:flags}"
  LIBS=""
  for e in "${exps[@]}"; do n=${e%%:*}; f=${e#*:}
    cmake -S . -B build/exp-$n -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLAGEN_CUDA_FLAGS="$f" > /dev/null &&
      cmake --build build/exp-$n -j "$(nproc)" > /tmp/build-exp-$n.log 2>&1 || { tail /tmp/build-exp-$n.log; exit 1; }
    LIBS="$LIBS${LIBS:+;}$n:$PWD/build/exp-$n/libmlagen.so"
  done
fi
IFS=';' read -ra libs <<< "$LIBS"
for e in "${libs[@]}"; do n=${e%%:*}; lib=${e#*:}
  echo "== $n ($lib)"
  MLAGEN_LIBRARY=$lib python3 bench/bench.py --out /tmp/exp-$n --reps ${EXP_REPS:-30} \
    ${EXP_SHAPES:+--shapes $EXP_SHAPES} --no-seed --no-bmm --no-host-overhead --label "$n" "$@" 2>&1 |
    grep -E "^\[|copy ceiling|geomean"
  cp /tmp/exp-$n/latest.json "$OUT/exp_$n.json"
done
