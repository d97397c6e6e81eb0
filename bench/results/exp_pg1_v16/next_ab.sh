#!/usr/bin/env bash
# The first run for next time (not run yet): the merged kernel (HEAD) against the measured v3 tree and
# the ids three tiles ahead, alternated, paged only. Prepare here, then carry .peers:
#   for t in v3 ids3; do mkdir -p .peers/$t && git archive 8c662d3 | tar -x -C .peers/$t && ln -sfn .. .peers/$t/.peers; done
#   (cd .peers/v3 && patch -p1 < ../../bench/results/exp_pg1_v16/v3.patch)
#   rm -rf .peers/ids3 && mkdir -p .peers/ids3 && git archive HEAD | tar -x -C .peers/ids3 && ln -sfn .. .peers/ids3/.peers
#   (cd .peers/ids3 && patch -p1 < ../../bench/results/exp_pg1_v16/ids3.patch)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
make build JOBS=6 > /tmp/build_head.log 2>&1 &
for t in v3 ids3; do (cd .peers/$t && make build JOBS=5 > /tmp/build_$t.log 2>&1) & done; wait
(cd .peers/ids3 && MLAGEN_REQUIRE_GPU=1 timeout 120 python3 -m pytest -q tests/test_gpu_paged.py > $OUT/pytest_ids3.txt 2>&1; tail -1 $OUT/pytest_ids3.txt)
for i in 1 2; do for t in head v3 ids3; do
  d=$([ $t = head ] && echo . || echo .peers/$t)
  (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --paged \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 40 --copy-reps 5 --label "next $t") 2>&1 \
     | grep -E "^\[paged" | sed "s/^/$t$i /" | cut -c1-110
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
