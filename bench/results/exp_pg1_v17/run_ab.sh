#!/usr/bin/env bash
# v17 A/B: main before (head: page ids in registers, kIdsAhead 2 as an array), the v3 tree (two
# named registers, measured best in v16), and this tree (page ids staged in shared memory,
# StagedTileIds), alternated, paged only; GPU tests of this tree first. Prepare here:
#   rm -rf .peers/head && mkdir -p .peers/head && git archive <base> | tar -x -C .peers/head && ln -sfn .. .peers/head/.peers
#   (.peers/v3 as in exp_pg1_v16/next_ab.sh); carry .peers and .commit
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
make build JOBS=6 > /tmp/build_new.log 2>&1 &
for t in head v3; do (cd .peers/$t && make build JOBS=5 > /tmp/build_$t.log 2>&1) & done; wait
tail -2 /tmp/build_new.log
MLAGEN_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q tests/test_gpu_paged.py tests/test_gpu_reliability.py tests/test_gpu_decode.py \
  tests/test_gpu_formats.py > $OUT/pytest_new.txt 2>&1; tail -3 $OUT/pytest_new.txt
for i in 1 2; do for t in head v3 new; do
  d=$([ $t = new ] && echo . || echo .peers/$t)
  (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --paged \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 40 --copy-reps 5 --label "v17 $t") 2>&1 \
     | grep -E "^\[paged" | sed "s/^/$t$i /" | cut -c1-100
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
