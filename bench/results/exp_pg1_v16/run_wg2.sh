#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
t0=$(date +%s)
make build JOBS=16 > /tmp/build.log 2>&1 || { echo "build failed"; tail -30 /tmp/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
MLAGEN_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -x tests/test_gpu_paged.py -k two_consumer > $OUT/pytest_wg2.txt 2>&1; tail -3 $OUT/pytest_wg2.txt; grep -E "Error|assert" $OUT/pytest_wg2.txt | head -10
MLAGEN_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q tests/test_gpu_decode.py -k candidates >> $OUT/pytest_wg2.txt 2>&1; tail -2 $OUT/pytest_wg2.txt
echo "tests $(( $(date +%s) - t0 )) s"
OUT=$OUT timeout 200 python3 .peers/probe_wg2.py > $OUT/probe.txt 2>&1; grep -v ": ok" $OUT/probe.txt | tail; tail -2 $OUT/probe.txt
echo "total $(( $(date +%s) - t0 )) s"
