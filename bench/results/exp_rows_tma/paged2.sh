#!/usr/bin/env bash
# v20 call 6: the rows body's bad-page flag without a block barrier (synccheck): build, rows / paged / ops tests, sanitizers
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
T0=$(date +%s)
make build JOBS=16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; echo "build $(( $(date +%s) - T0 )) s"
MLAGEN_REQUIRE_GPU=1 timeout 110 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_rows.py tests/test_gpu_paged.py \
  tests/test_gpu_ops.py > $OUT/pytest_rows_paged_ops.txt 2>&1
echo "pytest rc=$? $(( $(date +%s) - T0 )) s"; tail -n2 $OUT/pytest_rows_paged_ops.txt; grep -E "FAILED|Error" $OUT/pytest_rows_paged_ops.txt | head -10
timeout 70 python3 bench/sanitize.py --out /tmp/san --tools synccheck,memcheck,racecheck --shapes 4x1024 --formats fp8,fp8:fp8 \
   --racecheck-formats fp8 --timeout 25 2>&1 | grep -E "summary|memcheck:|racecheck:|synccheck:|FAIL"
cp /tmp/san/sanitize.json $OUT/ 2>/dev/null; echo "done $(( $(date +%s) - T0 )) s"
