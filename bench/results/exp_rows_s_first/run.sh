#!/usr/bin/env bash
# v19 rows body A/B: main (32fa3e5, .peers/base) / S first (this tree, exp/rows-s-first) /
# S first + the O groups' V^T loads ahead (.peers/c, exp/rows-s-first-vload):
# rows + ops tests on both new trees, then bench.py --rows alternated twice.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
A=$(cat .commit); B=32fa3e578f2773b2c771222c86543129cc8dd43f; C=771b3cca39fd78cfe1016dad11020f7373e60592
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
make build JOBS=6 > /tmp/build_a.log 2>&1 &
(cd .peers/base && make build JOBS=5 > /tmp/build_b.log 2>&1) &
(cd .peers/c && make build JOBS=5 > /tmp/build_c.log 2>&1) & wait
for t in a b c; do tail -n1 /tmp/build_$t.log; done
MLAGEN_COMMIT=$A MLAGEN_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x tests/test_gpu_rows.py tests/test_gpu_ops.py > $OUT/pytest_a.txt 2>&1; tail -n2 $OUT/pytest_a.txt
(cd .peers/c && MLAGEN_COMMIT=$C env -u PYTHONPATH -u MLAGEN_LIBRARY MLAGEN_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x tests/test_gpu_rows.py tests/test_gpu_ops.py) > $OUT/pytest_c.txt 2>&1; tail -n2 $OUT/pytest_c.txt
for i in 1 2; do for t in a b c; do
  d=$([ $t = a ] && echo . || echo .peers/$([ $t = b ] && echo base || echo c))
  c=$([ $t = a ] && echo $A || ([ $t = b ] && echo $B || echo $C))
  (cd $d && MLAGEN_COMMIT=$c env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 110 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --rows \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 30 --copy-reps 5 --label "v19rows_$t") 2>&1 \
     | grep -E "^\[rows" | sed "s/^/$t$i /" | cut -c1-230
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
