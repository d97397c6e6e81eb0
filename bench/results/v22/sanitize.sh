#!/usr/bin/env bash
# v22 sanitizers at the submitted commit (the fp8-q rows kernels of 31c7e77 had not run under them):
# build, then memcheck (every KV format, bf16 and fp8 q) / synccheck / racecheck (fp8 KV, bf16 and fp8 q)
# on 4x1024 and the child's rows cases (b3_kv1000 q_len 4 takes the new fp8-q ql4 kernel)
set -u
export PYTHONUNBUFFERED=1 MLAGEN_COMMIT=$(cat .commit)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
T0=$(date +%s)
make build JOBS=16 > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }; echo "build $(( $(date +%s) - T0 )) s"
timeout 400 python3 bench/sanitize.py --out /tmp/san --tools memcheck,synccheck,racecheck --shapes 4x1024 \
   --formats fp8,bf16,mxfp4,fp8:fp8 --racecheck-formats fp8,fp8:fp8 --timeout 120 2>&1 | grep -E "summary|memcheck:|racecheck:|synccheck:|FAIL"
echo "sanitize rc=${PIPESTATUS[0]}"
grep -h "^\[child\]" /tmp/san/sanitize_*.log | grep -c " ok "; grep -h "^\[child\]" /tmp/san/sanitize_*.log | grep -v " ok " | head
grep -h "^\[child\] rows" /tmp/san/sanitize_racecheck.log | cut -c1-160
cp /tmp/san/sanitize.json $OUT/ 2>/dev/null; cp /tmp/san/sanitize_*.log $OUT/ 2>/dev/null
echo "done $(( $(date +%s) - T0 )) s"
