#!/usr/bin/env bash
# v18 bf16: main (d6f38b0, .peers/base) against this tree (the bf16 body's first ids beside q):
# every test on this tree, memcheck + racecheck_wide, then the paged bench alternated twice.
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
make build JOBS=8 > /tmp/build_new.log 2>&1 &
(cd .peers/base && make build JOBS=8 > /tmp/build_base.log 2>&1) & wait
tail -n1 /tmp/build_new.log; tail -n1 /tmp/build_base.log
MLAGEN_REQUIRE_GPU=1 timeout 330 python3 -m pytest -q -rs tests > $OUT/pytest.txt 2>&1; tail -n3 $OUT/pytest.txt; grep -E "FAILED" $OUT/pytest.txt | head
timeout 120 python3 bench/sanitize.py --out /tmp/san --tools memcheck,racecheck_wide --timeout 110 2>&1 | grep -E "summary|memcheck:|racecheck_wide:"
cp /tmp/san/sanitize.json $OUT/ 2>/dev/null
for i in 1 2; do for t in base new; do
  d=$([ $t = new ] && echo . || echo .peers/base)
  c=$([ $t = new ] && cat .commit || echo d6f38b0de04090edfaf3aa316671cc65b1b2cfc0)
  (cd $d && MLAGEN_COMMIT=$c env -u PYTHONPATH -u MLAGEN_LIBRARY timeout 100 python3 bench/bench.py --out /tmp/ab_${t}_$i --shapes 4x1024 --paged \
     --formats "" --no-seed --no-bmm --no-host-overhead --json-only --reps 40 --copy-reps 5 --label "v18bf16_$t") 2>&1 \
     | grep -E "^\[paged" | sed "s/^/$t$i /" | cut -c1-200
  cp /tmp/ab_${t}_$i/latest.json $OUT/ab_${t}_$i.json
done; done
