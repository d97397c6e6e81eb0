#!/usr/bin/env bash
# v22: a = this tree (fp8-q rows kernels for h64 and 16 x 4), b = main 1c70ebb (.peers/base).
# Rows tests on a, bench.py --rows alternated a b a b (FlashMLA in each), then bench/ceiling.py
# (cuBLAS GEMM ceilings, the rows cases' compute floor) against a's second run.
set -u
export PYTHONUNBUFFERED=1
A=$(cat .commit); B=1c70ebb
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
T0=$(date +%s)
make build JOBS=10 > /tmp/build_a.log 2>&1 &
(cd .peers/base && make build JOBS=6 > /tmp/build_b.log 2>&1) & wait
for t in a b; do tail -n1 /tmp/build_$t.log; done; echo "built $(( $(date +%s) - T0 )) s"
MLAGEN_COMMIT=$A MLAGEN_REQUIRE_GPU=1 timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_rows.py tests/test_gpu_ops.py > $OUT/pytest_rows_a.txt 2>&1; echo "a tests rc=$?"; tail -n2 $OUT/pytest_rows_a.txt; grep -E "FAILED|Error" $OUT/pytest_rows_a.txt | head -5
echo "tested $(( $(date +%s) - T0 )) s"
for i in 1 2; do for t in a b; do
  d=$([ $t = a ] && echo . || echo .peers/base); c=$([ $t = a ] && echo $A || echo $B)
  (cd $d && MLAGEN_COMMIT=$c env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 110 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --rows \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 30 --copy-reps 5 --label "v22rows_$t") 2>&1 \
     | grep -E "^\[rows" | sed "s/^/$t$i /" | sed -E 's/ \([0-9]+ TF\/s\)//g; s/fp8 KV, //g' | cut -c1-170
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
  [ $(( $(date +%s) - T0 )) -gt 500 ] && { echo "time's up after $t$i"; break 2; }
done; done
timeout 80 python3 bench/ceiling.py --reps 20 --out $OUT/ceiling.json --targets $OUT/ab_a_2.json 2>&1 || timeout 60 python3 bench/ceiling.py --reps 20 --out $OUT/ceiling.json --targets $OUT/ab_a_1.json
echo "done $(( $(date +%s) - T0 )) s"
