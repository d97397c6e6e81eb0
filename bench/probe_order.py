"""Does a call's latency depend on which kernel ran before it (leaderboard timing)? For each
shape: the fp8-KV decode with bf16 q (A) and with an fp8 q given with its scale (B), each
timed (1) alone, call after call, and (2) alternating A, B, A, B, ... Per-SM instruction
caches survive the L2 flush, so a kernel that follows itself may start warmer than one that
follows another kernel; bench.py interleaves its columns, the leaderboard repeats one kernel.
`python bench/probe_order.py [--shapes 4x8192,32x1024] [--reps 40] [--out FILE]`"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from bench import Timer  # noqa: E402

C.ensure_mlagen_importable()
import torch  # noqa: E402
import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4x1024,4x8192,32x1024,32x8192,64x1024,64x8192,256x1024,256x8192")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    timer = Timer(torch, dev, 512 << 20)
    res = {}
    for batch, kv_len in C.parse_shapes(a.shapes):
        inp = C.make_inputs(batch, kv_len, 5, dev, keep_bf16=False)
        args = (inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"])
        q8, qs = quant.quantize_q_fp8(inp["q"])
        fa = lambda: mlagen.decode(*args, kv_format="fp8")  # noqa: E731
        fb = lambda: mlagen.decode(q8, *args[1:], kv_format="fp8", q_dtype="fp8", q_scale=qs)  # noqa: E731
        for f in (fa, fb):
            for _ in range(3):
                timer.once(f)
        row = {}
        row["A_alone"] = statistics.median(timer.once(fa) for _ in range(a.reps))
        row["B_alone"] = statistics.median(timer.once(fb) for _ in range(a.reps))
        ta, tb = [], []
        for _ in range(a.reps):
            ta.append(timer.once(fa))
            tb.append(timer.once(fb))
        row["A_after_B"], row["B_after_A"] = statistics.median(ta), statistics.median(tb)
        row = {k: round(v, 2) for k, v in row.items()}
        res[f"{batch}x{kv_len}"] = row
        print(f"{batch}x{kv_len}: {row}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
