#!/usr/bin/env bash
# One H200 call: does main read 2-4 us slower than a48d13a on the serving matrix's small cells
# (docs/perf.md, the serving matrix, "Since")? Six of the --quick cells, the two small ones first in
# round 1 and last in round 2 (their code then no longer the run's first), on a48d13a's tree
# (.peers/base_ab = git archive a48d13a, built here) and this one, alternated twice. Before it, here:
#   git rev-parse --short HEAD > .commit
#   rm -rf .peers/base_ab && mkdir -p .peers/base_ab && git archive a48d13a | tar -x -C .peers/base_ab
#   echo a48d13a > .peers/base_ab/.commit
# then run(command="bash bench/experiments/serving_ab.sh", carry=[".peers", ".commit"]): ~6 min
# cold (two builds of ~100 s), ~4 warm. Prediction: if the paged call's C++ entry costs device time,
# this tree stays 2-4 us behind on 8 heads 1x1024 and 16 heads 4x1024 in both rounds (small cells
# first, then last); if it is the run's first cells' cold code, the gap closes in round 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"; LOG=/tmp/ab_logs; mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
t0=$SECONDS
make build JOBS=16 > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
(cd .peers/base_ab && make build JOBS=16 > "$LOG/base.log" 2>&1) || { tail -20 "$LOG/base.log"; exit 1; }
ln -sfn .. .peers/base_ab/.peers  # (its serving.py finds FlashMLA where this one does)
echo "built: $((SECONDS - t0)) s"
big="32x16x8192,128x4x8192,64x64x8192,128x64x8192"
for i in 1 2; do
  cells=$([ $i = 1 ] && echo "8x1x1024,16x4x1024,$big" || echo "$big,8x1x1024,16x4x1024")
  for t in base this; do
    d=$([ $t = this ] && echo . || echo .peers/base_ab); c=$(cat $d/.commit)
    [ $((SECONDS - t0)) -lt 520 ] || { echo "($t $i: out of time)"; continue; }
    (cd $d && env -u PYTHONPATH -u MLAGEN_LIBRARY MLAGEN_COMMIT=$c timeout 80 python3 bench/serving.py --cells "$cells" \
       --out "$LOG/s_${t}_$i" --budget-s 50 --no-png --no-floor --label "A/B $t $i ($c)" 2>&1) \
      | grep -E "^\[h" | sed -E "s/^/$t$i /; s/ \| host.*//" | cut -c1-190
    cp "$LOG/s_${t}_$i/serving.json" "$OUT/serving_${t}_$i.json" 2>/dev/null
  done
done
echo "total $((SECONDS - t0)) s"
