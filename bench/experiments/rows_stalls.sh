#!/usr/bin/env bash
# One H200 call: why did O = P V make the split bf16 64-row kernels 2-5% slower (64 heads 64x8192 at 2
# splits 172.4 -> 180.9 us) while the 128-head one gained 1%? (docs/perf.md, query rows.) ncu on the
# bf16 rows kernels of rows_dram.py's cases, in wip/next's tree (.peers/base_next = git archive
# wip/next: O^T) and this one: duration, tensor-pipe activity, shared-memory wavefronts and bank
# conflicts, and where the warps stall (WarpStateStats, its raw page), one line a metric a tree;
# the whole reports come back under $OUT. Before it, here:
#   rm -rf .peers/base_next && mkdir -p .peers/base_next && git archive wip/next | tar -x -C .peers/base_next
# then run(command="bash bench/experiments/rows_stalls.sh", carry=[".peers"]): ~5 min cold.
# What would tell: the same tensor and shared-memory figures with longer barrier / wgmma waits on the
# O groups (the slot held longer: a schedule question), or more shared-memory wavefronts a tile for
# the transposed V reads at N = 256 (an operand-path cost the 128-head kernel hides in L2 hits).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; LOG=/tmp/stall_logs; mkdir -p "$LOG"
t0=$SECONDS
make build JOBS=16 > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
(cd .peers/base_next && make build JOBS=16 > "$LOG/base.log" 2>&1) || { tail -20 "$LOG/base.log"; exit 1; }
echo "built: $((SECONDS - t0)) s"
# (metric names as the H200's ncu printed them in v15; the stall breakdown from the section's raw page)
metrics=gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,\
l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed,\
dram__bytes_read.sum
for t in next this; do
  d=$([ $t = this ] && echo . || echo .peers/base_next)
  [ $t = this ] || cp bench/experiments/rows_dram.py $d/bench/experiments/  # (wip/next has none)
  (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 200 ncu --clock-control none --metrics "$metrics" \
     --section WarpStateStats --page raw -k regex:'mla_decode_sm90a_b64_kv8192_s.*kvbf16' -c 8 \
     python3 bench/experiments/rows_dram.py > "$OUT/ncu_$t.txt" 2>&1)
  echo "== $t ($((SECONDS - t0)) s)"
  grep -E "mla_decode_sm90a_b64|gpu__time_duration.sum|tensor_cycles|bank_reads|lsu_wavefronts|dram__bytes_read.sum |issue_stalled_(barrier|long_scoreboard|math_pipe_throttle|wait|membar|sleeping|short_scoreboard|mio_throttle|lg_throttle)_per_issue_active" \
    "$OUT/ncu_$t.txt" | grep -v "not_issued" | sed -E 's/ +/ /g' | cut -c1-150
done
echo "total $((SECONDS - t0)) s"
