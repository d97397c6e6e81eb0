"""Where the latency of a decode call goes, measured the leaderboard's way (L2 flushed,
events around one Python call, median) next to the device time of each kernel
(torch.profiler, L2 flushed before every call too):

  floor     an empty Python call and a call that launches one tiny kernel;
  shapes    every leaderboard shape with its selected kernel: latency, decode / combine
            kernel durations, the rest (launch gaps, host work not hidden); shapes_q8: the
            same with fp8 q quantized in the call;
  tiles     one block per split at a fixed grid (batch 4, 16 splits) with 1, 2, 4, 8 tiles
            per block: the per-block fixed cost and the per-tile latency of a lone block;
  scaling   batch 256, one split, kv_len 512 .. 8192: the slope (steady-state bandwidth)
            and the intercept (fixed cost of a full grid);
  (the %globaltimer trace points inside the warpgroup kernel, a build switch in a product
  header, live on the branch experiments/wg-trace; what they found is docs/perf.md's v4)

`python bench/breakdown.py [--parts floor,shapes,tiles,scaling] [--kernel NAME] [--out FILE]`
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _common as C  # noqa: E402
from bench import Timer  # noqa: E402

C.ensure_mlagen_importable()


def device_times(torch, timer, fn, n=10):
    """Average device microseconds of each kernel fn launches (L2 flushed before each call)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            timer.flush.zero_()
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.key
        if "fill" in name.lower() or "zero" in name.lower() or "Memset" in name:
            continue  # the flush
        d = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0)
        short = "combine" if "combine" in name else "q_amax" if "amax" in name else "decode" if "decode" in name else name[:60]
        rows[short] = round(d, 2)
    return rows


def latency(timer, fn, reps):
    for _ in range(3):
        timer.once(fn)
    return round(statistics.median(timer.once(fn) for _ in range(reps)), 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parts", default="floor,shapes,tiles,scaling")
    ap.add_argument("--kernel", default=None, help="generic kernel for tiles/scaling (default: the catalog's)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--flush-mb", type=int, default=512, help="L2 flush buffer (MiB); the leaderboard's is far over L2")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import torch
    import mlagen
    dev = torch.device("cuda")
    timer = Timer(torch, dev, a.flush_mb << 20)
    parts = set(a.parts.split(","))
    res = {"git": C.git_commit(), "device": torch.cuda.get_device_name(dev), "flush_mb": a.flush_mb}
    generic = a.kernel or next(k["name"] for k in mlagen.kernels()
                               if k["generic"] and "kvfp8e4m3fn" in k["name"] and "qbf16" in k["name"]
                               and "bn64" in k["name"])
    res["generic"] = generic

    def call(x, **kw):
        return functools.partial(mlagen.decode, x["q"], x["kv_data"], x["qo_indptr"], x["kv_indptr"], x["config"], **kw)

    def measure(b, l, **kw):
        x = C.make_inputs(b, l, 5, dev, keep_bf16=False)
        fn = call(x, **kw)
        out = fn()
        ref = C.reference_fp8(x)
        err = C.rel_l2(out, ref)
        row = dict(shape=f"{b}x{l}", kernel=mlagen.last_kernel()["name"], splits=mlagen.last_kernel().get("splits"),
                   rel_l2=float(f"{err:.3g}"), latency_us=latency(timer, fn, a.reps), device_us=device_times(torch, timer, fn))
        row["other_us"] = round(row["latency_us"] - sum(row["device_us"].values()), 2)
        row["tbps"] = round(C.fp8_bytes(b, l) / row["latency_us"] / 1e6, 3)
        print(json.dumps(row), flush=True)
        del x
        return row

    if "floor" in parts:
        tiny = torch.ones(1, device=dev)
        res["floor"] = dict(empty_call_us=latency(timer, lambda: None, a.reps),
                            one_kernel_us=latency(timer, lambda: tiny.add_(1), a.reps))
        print(res["floor"], flush=True)
    if "shapes" in parts:
        res["shapes"] = [measure(b, l) for b, l in C.BENCH_SHAPES]
    if "shapes_q8" in parts:  # fp8 q quantized in the call (amax pre-pass + decode + combine)
        res["shapes_q8"] = [measure(b, l, q_dtype="fp8") for b, l in C.BENCH_SHAPES]
    if "tiles" in parts:
        res["tiles"] = [measure(4, 1024 * k, kernel=generic, splits=16) for k in (1, 2, 4, 8)]
        res["tiles"] += [measure(4, 1024, kernel=generic, splits=s) for s in (1, 2, 4, 8)]
    if "scaling" in parts:
        res["scaling"] = [measure(256, l, kernel=generic, splits=1) for l in (512, 1024, 2048, 4096, 8192)]
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
