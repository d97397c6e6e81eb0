#!/usr/bin/env bash
# Three H200 calls for branch wip/rows-s-as-m = wip/next (main + wip/mxfp4-rows + wip/paged-entry)
# + wip/rows-pv (the bf16 rows body's O = P V at 64 rows) + S = Q K^T at 64 rows where q is one part
# (written 2026-12-05, when no device was lent). Before them, here:
#   git rev-parse --short HEAD > .commit
#   for b in next rows-pv; do rm -rf .peers/base_$b && mkdir -p .peers/base_$b && git archive wip/$b | tar -x -C .peers/base_$b; done
# then
#   run(command="bash bench/experiments/verify_rows.sh test",     carry=[".peers", ".commit"], timeout_s=600)
#   run(command="bash bench/experiments/verify_rows.sh sanitize", carry=[".peers", ".commit"], timeout_s=600)
#   run(command="bash bench/experiments/verify_rows.sh bench",    carry=[".peers", ".commit"], timeout_s=600)
# (each builds this tree first: a no-op on a machine still warm from the call before)
# test:     the new tests first (mxfp4 rows, the paged C++ entry, every rows-body test), then every GPU
#           test; host.py. If a rows test failed: rows_pv_diag.py (where a 64-row bf16 output is off).
# sanitize: compute-sanitizer racecheck / synccheck / memcheck on a bf16 64-row case, an fp8-q 64-row
#           case and an mxfp4 rows case; ncu's DRAM bytes of the 64x8192 rows cases; the two base trees
#           built for the bench call where the time allows (each call stays under the 600 s limit).
# bench:    bench.py --rows (32-128 heads with FlashMLA bf16; 16 heads x q_len 1/2/4) on wip/next,
#           wip/rows-pv and this tree, alternated twice; the mxfp4 rows bench.
# If a test fails here, bench/experiments/verify_rows_pv.sh on branch wip/rows-pv verifies the O step alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
LOG=/tmp/verify_logs; mkdir -p "$LOG"  # (logs stay there unless a step fails: at most 8 files come back)
export MLAGEN_COMMIT=$(cat .commit 2>/dev/null || echo unknown) PYTHONUNBUFFERED=1
t0=$SECONDS
make build JOBS=16 > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
echo "built in $((SECONDS - t0)) s"
case "${1:-test}" in
  test)
    timeout 150 python3 -m pytest -q -x tests/gpu/test_rows.py tests/gpu/test_ops.py \
      -k "mxfp4_rows or paged_call or plain_call or bf16_rows or bf16_kv or rows_body or generic_rows" 2>&1 \
      | tail -8 | tee "$OUT/new_tests.log"
    grep -q "FAILED" "$OUT/new_tests.log" && timeout 60 python3 bench/experiments/rows_pv_diag.py
    MLAGEN_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q tests/gpu > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
    grep -E "FAILED|Error" "$OUT/pytest.log" | head -20
    timeout 40 python3 bench/host.py --json "$OUT/host.json" 2>&1 | tail -14 ;;
  sanitize)
    for case in "test_bf16_rows_body_matches_float64 and 128-1-bf16" \
                "test_generic_rows_bodies_match_float64 and 64-1-64-fp8" \
                "mxfp4_rows_body_is_the_bf16 and 128-1-bf16-3"; do
      for tool in racecheck synccheck memcheck; do
        timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x tests/gpu/test_rows.py \
          -k "$case" > "$LOG/sanitize.log" 2>&1
        rc=$?; echo "$tool [$case] rc=$rc $(grep -E 'ERROR SUMMARY|passed|failed' "$LOG/sanitize.log" | tail -2 | tr '\n' ' ')"
        [ $rc = 0 ] || cp "$LOG/sanitize.log" "$OUT/sanitize_${tool}.log"
      done
    done
    # does the 128-head bf16 rows body read the KV twice? (docs/perf.md, query rows)
    timeout 60 ncu --clock-control none --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
      -k regex:mla_decode_sm90a python3 bench/experiments/rows_dram.py 2>&1 \
      | grep -E "heads|mla_decode_sm90a|dram__bytes|lts__t_sector" | cut -c1-160
    for b in next rows-pv; do  # (the bench call's trees, while this call has the time: each ~1-2 min)
      [ $((SECONDS - t0)) -lt 420 ] || break
      (cd .peers/base_$b && timeout $((560 - SECONDS + t0)) make build JOBS=16 > "$LOG/base_$b.log" 2>&1) \
        && echo "base $b built: $((SECONDS - t0)) s" || echo "base $b: not built here (the bench call builds it)"
    done ;;
  bench)
    for b in next rows-pv; do  # (built by the sanitize call where it had the time; else now)
      (cd .peers/base_$b && make build JOBS=16 > "$LOG/base_$b.log" 2>&1) || { tail -20 "$LOG/base_$b.log"; exit 1; }
      ln -sfn .. .peers/base_$b/.peers  # (their bench finds FlashMLA where this one does)
    done
    echo "base trees ready: $((SECONDS - t0)) s"
    for i in 1 2; do
      for t in next rows-pv this; do
        d=$([ $t = this ] && echo . || echo .peers/base_$t)
        [ $((SECONDS - t0)) -lt 500 ] || { echo "($t $i: out of time)"; continue; }
        (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 75 python3 bench/bench.py --out "$OUT/ab_${t}_$i" --no-seed \
           --no-bmm --formats "" --shapes 4x1024 --rows --no-host-overhead --json-only --reps 10 --label "A/B $t $i") 2>&1 \
          | grep -E "^\[rows" | sed "s/^/$t$i /" | cut -c1-300
        cp "$OUT/ab_${t}_$i/latest.json" "$OUT/ab_${t}_$i.json" 2>/dev/null; rm -rf "$OUT/ab_${t}_$i"  # (6 files)
      done
    done
    [ $((SECONDS - t0)) -lt 530 ] && timeout $((585 - SECONDS + t0)) python3 bench/experiments/mxfp4_rows.py --reps 15 \
      --json "$OUT/mxfp4_rows.json" 2>&1 | tail -12 ;;
esac
echo "total $((SECONDS - t0)) s"
