#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
t0=$(date +%s)
for t in base v1 v2; do (cd .peers/$t && make build JOBS=16 > /tmp/build_$t.log 2>&1) || { echo "build $t failed"; tail -20 /tmp/build_$t.log; } & done; wait
echo "builds $(( $(date +%s) - t0 )) s"
for t in v1 v2; do (cd .peers/$t && MLAGEN_REQUIRE_GPU=1 timeout 120 python3 -m pytest -q tests/test_gpu_paged.py -k "specialized or bit_identical" > $OUT/pytest_$t.txt 2>&1; tail -1 $OUT/pytest_$t.txt | sed "s/^/$t /"); done
for i in 1 2; do for t in base v1 v2; do
  (cd .peers/$t && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --paged \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 40 --copy-reps 5 --label "probe $t") 2>&1 \
     | grep -E "^\[paged|ERROR|rror" | sed "s/^/$t$i /" | cut -c1-150
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
echo "total $(( $(date +%s) - t0 )) s"
