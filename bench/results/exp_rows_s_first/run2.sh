#!/usr/bin/env bash
# v19 rows body A/B, second run: main (32fa3e5, .peers/base) / d = S first + the O groups'
# per-wgmma commit groups (this tree, exp/rows-s-first) / e = the O pipeline alone (.peers/e,
# exp/rows-o-pipe): rows + ops tests on d and e, then bench.py --rows alternated twice.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
D=$(cat .commit); B=32fa3e578f2773b2c771222c86543129cc8dd43f; E=149f93115634f068d2ff1fa1c525ebebb962f541
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
make build JOBS=6 > /tmp/build_d.log 2>&1 &
(cd .peers/base && make build JOBS=5 > /tmp/build_b.log 2>&1) &
(cd .peers/e && make build JOBS=5 > /tmp/build_e.log 2>&1) & wait
for t in d b e; do tail -n1 /tmp/build_$t.log; done
MLAGEN_COMMIT=$D MLAGEN_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x tests/test_gpu_rows.py tests/test_gpu_ops.py > $OUT/pytest_d.txt 2>&1; tail -n2 $OUT/pytest_d.txt
(cd .peers/e && MLAGEN_COMMIT=$E env -u PYTHONPATH -u MLAGEN_LIBRARY MLAGEN_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x tests/test_gpu_rows.py tests/test_gpu_ops.py) > $OUT/pytest_e.txt 2>&1; tail -n2 $OUT/pytest_e.txt
for i in 1 2; do for t in d b e; do
  d=$([ $t = d ] && echo . || echo .peers/$([ $t = b ] && echo base || echo e))
  c=$([ $t = d ] && echo $D || ([ $t = b ] && echo $B || echo $E))
  (cd $d && MLAGEN_COMMIT=$c env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 110 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --rows \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 30 --copy-reps 5 --label "v19rows_$t") 2>&1 \
     | grep -E "^\[rows" | sed "s/^/$t$i /" | sed -E 's/ \([0-9]+ TF\/s\)//g; s/fp8 KV, //g' | cut -c1-150
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
