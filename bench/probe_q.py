"""Where an fp8-q call spends its time, next to the bf16-q call: leaderboard timing (bench.py's
Timer) and the device kernels of one call (torch.profiler), for
  bf16     q as given (bf16)
  fp8_in   q quantized to fp8 on the device (q_amax_kernel + in-kernel recipe)
  fp8_pre  q already fp8 with its scale (the caller quantized it; no pre-pass)
`python bench/probe_q.py [--shapes 4x1024,256x1024] [--format fp8] [--out probe_q.json]`"""
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


def kernel_times(fn):
    """{kernel name: device us} of one call (after a warm-up call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name[:90]] = round(out.get(e.name[:90], 0.0) + e.device_time_total, 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default="4x1024,32x1024,256x1024,256x8192")
    ap.add_argument("--format", default="fp8")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    timer = Timer(torch, dev, 512 << 20)
    res = {}
    for batch, kv_len in C.parse_shapes(a.shapes):
        inp = C.make_inputs(batch, kv_len, 3, dev)
        args = (inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"])
        q8, qs = quant.quantize_q_fp8(inp["q"])
        calls = {
            "bf16": lambda: mlagen.decode(*args, kv_format=a.format),
            "fp8_in": lambda: mlagen.decode(*args, kv_format=a.format, q_dtype="fp8"),
            "fp8_pre": lambda: mlagen.decode(q8, *args[1:], kv_format=a.format, q_dtype="fp8", q_scale=qs),
        }
        row = {}
        for name, fn in calls.items():
            for _ in range(3):
                timer.once(fn)
            med = statistics.median(timer.once(fn) for _ in range(a.reps))
            row[name] = dict(leaderboard_median_us=round(med, 2), kernels_us=kernel_times(fn),
                             kernel=mlagen.last_kernel()["name"])
        res[f"{batch}x{kv_len}"] = row
        print(f"{batch}x{kv_len}: " + "  ".join(f"{n} {r['leaderboard_median_us']:.1f}us {r['kernels_us']}"
                                                for n, r in row.items()), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
