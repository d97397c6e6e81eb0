#!/usr/bin/env bash
# Branch wip/rows-s-as-m (on wip/rows-pv): the rows body's S at 64 rows as S = Q K^T, the query rows
# the wgmma's M, where q is one part (bf16 KV; fp8 KV with an fp8 q): group 0 keeps two rows' state a
# thread, a row's maximum and sum its quad's, P stored as it is; setmaxnreg 104 / 200 / 200 there.
# One H200 call, after wip/rows-pv's verification:
#   git rev-parse --short HEAD > .commit
#   rm -rf .peers/base_pv && mkdir -p .peers/base_pv && git archive wip/rows-pv | tar -x -C .peers/base_pv
#   run(command="bash bench/experiments/s_rows_ab.sh", carry=[".peers", ".commit"], timeout_s=600)
# build both trees; the rows-body tests on this one (every bf16 64-row case: float64 per row, pages,
# splits, causal rows); bench.py --rows alternated twice against wip/rows-pv.
# Predicted (docs/perf.md): 0-3% faster at 64 rows (group 0's per-element work is the same; the grow
# tiles' exchange and a quarter to a third of the kernel's code go), more for an fp8 q if the O
# groups' spills (now none) were on the path; fp8 KV with a bf16 q and 32 rows: the same SASS.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
LOG=/tmp/ab_logs; mkdir -p "$LOG"
export MLAGEN_COMMIT=$(cat .commit 2>/dev/null || echo unknown) PYTHONUNBUFFERED=1
t0=$SECONDS
make build JOBS=16 > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
(cd .peers/base_pv && make build JOBS=16 > "$LOG/base_build.log" 2>&1) || { tail -20 "$LOG/base_build.log"; exit 1; }
echo "built both in $((SECONDS - t0)) s"
ln -sfn .. .peers/base_pv/.peers
timeout 240 python3 -m pytest -q -x tests/gpu/test_rows.py 2>&1 | tail -4
for i in 1 2; do
  for t in base new; do
    d=$([ $t = base ] && echo .peers/base_pv || echo .)
    (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out "$OUT/ab_${t}_$i" --no-seed \
       --no-bmm --formats "" --shapes 4x1024 --rows --no-host-overhead --json-only --reps 15 --label "A/B $t $i") 2>&1 \
      | grep -E "^\[rows" | sed "s/^/$t$i /" | cut -c1-300
    cp "$OUT/ab_${t}_$i/latest.json" "$OUT/ab_${t}_$i.json" 2>/dev/null; rm -rf "$OUT/ab_${t}_$i"
  done
done
echo "total $((SECONDS - t0)) s"
