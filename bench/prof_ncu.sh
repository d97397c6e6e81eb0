#!/usr/bin/env bash
# Per-instruction profile (SASS, stall samples, executed counts) of the generic fp8 warpgroup
# kernel on the device: bench/prof_ncu.sh [SHAPE...] (default 32x1024 256x2048); CSVs to $OUT.
set -u
export PYTHONPATH=$PWD/runtime/python:$PWD
G=${KERNEL:-mla_decode_sm90a_bany_kvany_sany_qbf16_kvfp8e4m3fn_bn64_st2}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
OUT=${OUT:-/tmp/prof}; mkdir -p "$OUT"
for sh in ${*:-32x1024 256x2048}; do
  $NCU --kernel-name regex:mla_decode_kernel --launch-skip 2 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight -o /tmp/r$sh -f python3 bench/ncu_probe.py $sh $G > /tmp/ncu_$sh.log 2>&1
  tail -1 /tmp/ncu_$sh.log
  $NCU -i /tmp/r$sh.ncu-rep --page source --csv --print-source sass > "$OUT/src_$sh.csv"
  $NCU -i /tmp/r$sh.ncu-rep --page details --csv > "$OUT/details_$sh.csv"
done
