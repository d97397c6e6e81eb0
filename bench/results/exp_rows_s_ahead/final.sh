#!/usr/bin/env bash
# v21 verification at the submitted commit: build, every test, memcheck / synccheck / racecheck
# (4x1024 + the rows cases, bf16 and fp8 q)
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
T0=$(date +%s)
make build JOBS=16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; echo "build $(( $(date +%s) - T0 )) s"
MLAGEN_REQUIRE_GPU=1 timeout 340 python3 -m pytest -q -rs -p no:cacheprovider tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - T0 )) s"; tail -n3 $OUT/pytest.txt
grep -E "FAILED|Error" $OUT/pytest.txt | head -20
timeout 100 python3 bench/sanitize.py --out /tmp/san --tools memcheck,synccheck,racecheck --shapes 4x1024 --formats fp8,fp8:fp8 \
   --racecheck-formats fp8,fp8:fp8 --timeout 45 2>&1 | grep -E "summary|memcheck:|racecheck:|synccheck:|FAIL"
cp /tmp/san/sanitize.json $OUT/ 2>/dev/null; cp /tmp/san/sanitize_racecheck.log $OUT/ 2>/dev/null; echo "sanitized $(( $(date +%s) - T0 )) s"
echo "done $(( $(date +%s) - T0 )) s"
