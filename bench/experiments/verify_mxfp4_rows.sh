#!/usr/bin/env bash
# The first H200 call for branch wip/mxfp4-rows (written 2026-12-04, when no device was lent):
#   run(command="bash bench/experiments/verify_mxfp4_rows.sh", carry=[".peers", ".commit"], timeout_s=600)
# 1. build; 2. the new rows tests (bit-identity with the bf16 rows body on the expansion, pages, bad
# ids) first, then every GPU test; 3. compute-sanitizer on one mxfp4 rows case (racecheck, synccheck,
# memcheck); 4. the bench against the 16-row mxfp4 kernel, fp8 and bf16 KV. Everything lands in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export MLAGEN_COMMIT=$(cat .commit 2>/dev/null || echo unknown) PYTHONUNBUFFERED=1
make build JOBS=16 > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
timeout 120 python3 -m pytest -q -x tests/gpu/test_rows.py -k mxfp4_rows 2>&1 | tail -15 | tee "$OUT/rows_mxfp4.log"
MLAGEN_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q tests/gpu > "$OUT/pytest.log" 2>&1; tail -4 "$OUT/pytest.log"
grep -E "FAILED|Error" "$OUT/pytest.log" | head -20
for tool in racecheck synccheck memcheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x tests/gpu/test_rows.py \
    -k "mxfp4_rows_body_is_the_bf16 and 128-1-bf16-3" > "$OUT/sanitize_$tool.log" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize_$tool.log" | tail -2 | tr '\n' ' ')"
done
timeout 150 python3 bench/experiments/mxfp4_rows.py --json "$OUT/mxfp4_rows.json" 2>&1 | tail -12
