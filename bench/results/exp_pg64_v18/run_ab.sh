#!/usr/bin/env bash
# v18 A/B, paged only: head (45fba0b), v1 (the next tile's page touched by prefetch.global.L2 as
# tile j's copies go out) and new (v1 + the first tiles' ids loaded beside q, one round trip),
# alternated twice; GPU tests of the new tree first. Prepare here:
#   .peers/head = git archive 45fba0b, .peers/v1 = the v1 tree (each with .peers -> ..); carry .peers and .commit
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
make build JOBS=6 > /tmp/build_new.log 2>&1 &
for t in head v1; do (cd .peers/$t && make build JOBS=5 > /tmp/build_$t.log 2>&1) & done; wait
tail -1 /tmp/build_new.log /tmp/build_head.log /tmp/build_v1.log
MLAGEN_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q tests/test_gpu_paged.py tests/test_gpu_reliability.py tests/test_gpu_decode.py \
  tests/test_gpu_formats.py > $OUT/pytest_new.txt 2>&1; tail -3 $OUT/pytest_new.txt
for i in 1 2; do for t in head v1 new; do
  d=$([ $t = new ] && echo . || echo .peers/$t)
  (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --paged \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 40 --copy-reps 5 --label "v18_$t") 2>&1 \
     | grep -E "^\[paged" | sed "s/^/$t$i /" | cut -c1-100
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
for f in $OUT/ab_*.json; do python3 -c "
import json,sys; j=json.load(open('$f'))
print('$(basename $f .json)', '  '.join(f\"{r['shape']} c {r['columns']['fp8 contiguous']['median_us']:.1f} pg64 {100*(r['columns']['fp8 page 64']['vs_contiguous']-1):+.1f}% pg1 {100*(r['columns']['fp8 page 1']['vs_contiguous']-1):+.1f}%\" for r in j['paged']))"; done
