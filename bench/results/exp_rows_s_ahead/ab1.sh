#!/usr/bin/env bash
# v21 A/B: a = S one tile ahead (exp/rows-s-ahead, this tree), b = main (ac732c6), c = main + the page ids prefetched a tile ahead (exp/rows-ids-ahead2).
# Tests on a (rows, ops, paged) and c (paged), then bench.py --rows alternated twice.
set -u
export PYTHONUNBUFFERED=1
A=$(cat .commit); B=ac732c6; C=04d1c2f
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
T0=$(date +%s)
make build JOBS=6 > /tmp/build_a.log 2>&1 &
(cd .peers/base && make build JOBS=5 > /tmp/build_b.log 2>&1) &
(cd .peers/bc && make build JOBS=5 > /tmp/build_c.log 2>&1) & wait
for t in a b c; do tail -n1 /tmp/build_$t.log; done; echo "built $(( $(date +%s) - T0 )) s"
MLAGEN_COMMIT=$A MLAGEN_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_rows.py tests/test_gpu_ops.py tests/test_gpu_paged.py > $OUT/pytest_a.txt 2>&1; echo "a tests rc=$?"; tail -n2 $OUT/pytest_a.txt; grep -E "FAILED|Error" $OUT/pytest_a.txt | head -5
(cd .peers/bc && MLAGEN_COMMIT=$C MLAGEN_REQUIRE_GPU=1 env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_paged.py tests/test_gpu_rows.py -k "page" > $OUT/pytest_c.txt 2>&1; echo "c tests rc=$?"; tail -n2 $OUT/pytest_c.txt; grep -E "FAILED|Error" $OUT/pytest_c.txt | head -5)
echo "tested $(( $(date +%s) - T0 )) s"
for i in 1 2; do for t in a b c; do
  d=$([ $t = a ] && echo . || echo .peers/$([ $t = b ] && echo base || echo bc))
  c=$([ $t = a ] && echo $A || ([ $t = b ] && echo $B || echo $C))
  (cd $d && MLAGEN_COMMIT=$c env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --rows \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 30 --copy-reps 5 --label "v21rows_$t") 2>&1 \
     | grep -E "^\[rows" | sed "s/^/$t$i /" | sed -E 's/ \([0-9]+ TF\/s\)//g; s/fp8 KV, //g' | cut -c1-150
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
  [ $(( $(date +%s) - T0 )) -gt 540 ] && { echo "time's up after $t$i"; break 2; }
done; done
echo "done $(( $(date +%s) - T0 )) s"
