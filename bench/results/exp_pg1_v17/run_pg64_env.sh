#!/usr/bin/env bash
# Why page 64 at 64x8192 reads +3.6-3.9% in the long bench and +2.0-2.5% in the A/B runs, same
# kernel: the paged section after (A) the A/B's set-up, (B) the same with the seed peer and bmm,
# (C) all eight leaderboard shapes without them, (A) again.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
make build JOBS=16 > /tmp/build.log 2>&1 || tail /tmp/build.log; tail -1 /tmp/build.log
common="--paged --formats '' --no-host-overhead --json-only --reps 60"
run() {  # name, extra args
  eval timeout 150 python3 bench/bench.py --out /tmp/env_$1 $common $2 --label env_$1 > /tmp/env_$1.log 2>&1
  cp /tmp/env_$1/latest.json $OUT/env_$1.json || { tail -5 /tmp/env_$1.log; return; }
  python3 -c "
import json; j=json.load(open('$OUT/env_$1.json'))
print('$1', '  '.join(f\"{r['shape']} pg64 {100*(r['columns']['fp8 page 64']['vs_contiguous']-1):+.1f}% pg1 {100*(r['columns']['fp8 page 1']['vs_contiguous']-1):+.1f}% ({r['columns']['fp8 contiguous']['median_us']:.1f}/{r['columns']['fp8 page 64']['median_us']:.1f})\" for r in j['paged']))"
}
run A1 "--shapes 4x1024 --no-seed --no-bmm"
run B "--shapes 4x1024"
run C "--no-seed --no-bmm"
run A2 "--shapes 4x1024 --no-seed --no-bmm"
