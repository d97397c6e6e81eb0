make build JOBS=16 >/tmp/b0.log 2>&1 || tail -20 /tmp/b0.log
export PYTHONPATH=$PWD/runtime/python:$PWD
python3 -m pytest -q -m gpu tests -k "indptr" 2>&1 | tail -2
G=mla_decode_sm90a_bany_kvany_sany_qbf16_kvfp8e4m3fn_bn64_st2
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo ncu=$NCU; $NCU --version | tail -1
for sh in 32x1024 256x2048; do
  $NCU --kernel-name regex:mla_decode_kernel --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight -o /tmp/r$sh -f python3 bench/ncu_probe.py $sh $G > /tmp/ncu_$sh.log 2>&1; tail -3 /tmp/ncu_$sh.log
  $NCU -i /tmp/r$sh.ncu-rep --page source --csv --print-source sass > $OUT/src_$sh.csv 2>$OUT/src_$sh.err; echo "src rc=$? $(wc -c < $OUT/src_$sh.csv)"; head -c 600 $OUT/src_$sh.err
  $NCU -i /tmp/r$sh.ncu-rep --page details --csv > $OUT/details_$sh.csv 2>&1
done
