#!/usr/bin/env bash
# One H200 call for branch wip/next = main + wip/mxfp4-rows + wip/paged-entry (written 2026-12-04, when no
# device was lent):  run(command="bash bench/experiments/verify_next.sh", carry=[".peers", ".commit"])
# build; the new tests first (mxfp4 rows, the paged C++ entry), then every GPU test; compute-sanitizer
# on one mxfp4 rows case; the mxfp4 rows bench; the host bench (paged decode through the C++ entry).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export MLAGEN_COMMIT=$(cat .commit 2>/dev/null || echo unknown) PYTHONUNBUFFERED=1
t0=$SECONDS
make build JOBS=16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "built in $((SECONDS - t0)) s"
timeout 150 python3 -m pytest -q -x tests/gpu/test_rows.py tests/gpu/test_ops.py -k "mxfp4_rows or paged_call or plain_call" \
  2>&1 | tail -8 | tee "$OUT/new_tests.log"
MLAGEN_REQUIRE_GPU=1 timeout 220 python3 -m pytest -q tests/gpu > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
grep -E "FAILED|Error" "$OUT/pytest.log" | head -20
for tool in racecheck synccheck memcheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x tests/gpu/test_rows.py \
    -k "mxfp4_rows_body_is_the_bf16 and 128-1-bf16-3" > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize_$tool.log" | tail -2 | tr '\n' ' ')"
done
timeout 120 python3 bench/experiments/mxfp4_rows.py --json "$OUT/mxfp4_rows.json" 2>&1 | tail -12
timeout 40 python3 bench/host.py --json "$OUT/host.json" 2>&1 | tail -14
echo "total $((SECONDS - t0)) s"
