#!/usr/bin/env bash
# ncu of the rows body (exp/rows-o-pipe): 128 heads 64x8192 and 16 heads x 2 at 256x8192, bf16 q
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
export MLAGEN_COMMIT=$(cat .commit)
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu: $NCU"
make build JOBS=16 > /tmp/build.log 2>&1; tail -n1 /tmp/build.log
python3 .peers/probe_ncu.py 64 8192 128 1 || exit 1
for c in "64 8192 128 1" "256 8192 16 2"; do
  tag=$(echo $c | tr ' ' _)
  timeout 200 $NCU --kernel-name regex:mla_decode_kernel --launch-skip 2 --launch-count 1 --set full --import-source no \
     -f -o /tmp/p_$tag python3 .peers/probe_ncu.py $c > /tmp/ncu_$tag.log 2>&1; tail -n3 /tmp/ncu_$tag.log
  $NCU --import /tmp/p_$tag.ncu-rep --page source --csv --print-source sass > $OUT/src_$tag.csv 2>/dev/null
  $NCU --import /tmp/p_$tag.ncu-rep --page details --csv > $OUT/details_$tag.csv 2>/dev/null
  ls -la $OUT/src_$tag.csv $OUT/details_$tag.csv
done
