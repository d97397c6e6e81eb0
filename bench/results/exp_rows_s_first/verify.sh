#!/usr/bin/env bash
# v19 verification at the merged commit, one call: every test, the bench (leaderboard shapes fp8
# + --rows with FlashMLA), then memcheck / synccheck / racecheck on 4x1024 + the rows cases.
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
make build JOBS=16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; tail -n1 /tmp/build.log
MLAGEN_REQUIRE_GPU=1 timeout 320 python3 -m pytest -q -rs tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$?"; tail -n3 $OUT/pytest.txt
grep -E "FAILED|Error" $OUT/pytest.txt | head -10
timeout 110 python3 bench/bench.py --out /tmp/bench --rows --formats "" --no-seed --no-bmm --no-host-overhead --reps 30 \
   --copy-reps 5 --label "v19 verification" 2>&1 | grep -E "^\[rows|geomean|FAIL" | sed -E 's/ \([0-9]+ TF\/s\)//g' | cut -c1-170
for f in latest.json latest.png rows.png; do [ -f /tmp/bench/$f ] && cp /tmp/bench/$f $OUT/; done
timeout 130 python3 bench/sanitize.py --out /tmp/san --tools memcheck,synccheck,racecheck --shapes 4x1024 --formats fp8,fp8:fp8 \
   --timeout 60 2>&1 | grep -E "summary|memcheck:|racecheck:|synccheck:"
cp /tmp/san/sanitize.json $OUT/ 2>/dev/null; ls $OUT
