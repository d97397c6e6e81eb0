#!/usr/bin/env bash
# v20 call 5: the generic rows bodies on pages of 64+ (runtime selection only; kernels as at e34e110):
# build, the rows / paged / ops / reliability tests, the sanitizers with the paged rows cases, bench --rows
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
T0=$(date +%s)
make build JOBS=16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; echo "build $(( $(date +%s) - T0 )) s"
MLAGEN_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_gpu_rows.py tests/test_gpu_paged.py \
  tests/test_gpu_ops.py tests/test_gpu_reliability.py tests/test_runtime_cpu.py > $OUT/pytest_paged_rows.txt 2>&1
echo "pytest rc=$? $(( $(date +%s) - T0 )) s"; tail -n2 $OUT/pytest_paged_rows.txt; grep -E "FAILED|Error" $OUT/pytest_paged_rows.txt | head -10
timeout 90 python3 bench/sanitize.py --out /tmp/san --tools memcheck,synccheck,racecheck --shapes 4x1024 --formats fp8,fp8:fp8 \
   --racecheck-formats fp8 --timeout 40 2>&1 | grep -E "summary|memcheck:|racecheck:|synccheck:|FAIL|pg64"
cp /tmp/san/sanitize.json $OUT/ 2>/dev/null; echo "sanitized $(( $(date +%s) - T0 )) s"
left=$(( 330 - ($(date +%s) - T0) ))
timeout $left python3 bench/bench.py --out /tmp/bench --shapes 4x1024 --rows --formats "" --no-seed --no-bmm --no-host-overhead \
  --reps 30 --copy-reps 5 --label "v20 rows on pages of 64" 2>&1 | grep -E "^\[rows" | sed -E 's/ \([0-9]+ TF\/s\)//g; s/fp8 KV, //g' | cut -c1-190
cp /tmp/bench/latest.json $OUT/rows_paged.json 2>/dev/null; cp /tmp/bench/rows.png $OUT/rows_paged.png 2>/dev/null; echo "done $(( $(date +%s) - T0 )) s"
