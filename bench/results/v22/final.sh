#!/usr/bin/env bash
# v22 verification at the submitted commit: build, every test, then every GPU test against the
# pip-installed package (.ci/gpu installed)
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
T0=$(date +%s)
make build JOBS=16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; echo "build $(( $(date +%s) - T0 )) s"
MLAGEN_REQUIRE_GPU=1 timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests > $OUT/pytest.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - T0 )) s"; tail -n3 $OUT/pytest.txt
grep -E "FAILED|Error" $OUT/pytest.txt | head -20
OUT=$OUT LOGS=/tmp/logs timeout 200 .ci/gpu installed 2>&1 | tail -8
echo "done $(( $(date +%s) - T0 )) s"
