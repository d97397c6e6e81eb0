"""Where the time of one decode call goes: host pieces (wall clock over many calls) and
device kernel durations (torch.profiler). `python bench/probe.py [--shapes 4x1024,...]`"""
import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

C.ensure_mlagen_importable()
import torch  # noqa: E402
import mlagen  # noqa: E402
from mlagen import _lib  # noqa: E402


def per_call_us(fn, n):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x1024,32x8192,256x8192")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda")
    res = {"library": _lib.library_path()}
    inp = C.make_inputs(4, 1024, 1, dev, keep_bf16=False)
    args = (inp["q"], inp["kv_fp8"], inp["scale"], inp["qo_indptr"], inp["kv_indptr"])
    plan = mlagen.prepare(*args, inp["config"])
    out = torch.empty((4, 16, 512), dtype=torch.bfloat16, device=dev)
    L = _lib.lib()
    info = _lib.KernelInfo()
    pp = ctypes.byref(plan.problem)
    stream = torch.cuda.current_stream().cuda_stream
    host = {}
    host["c_select"] = per_call_us(lambda: L.mlagen_select(pp, ctypes.byref(info)), 20000)
    host["c_decode_ptrs"] = per_call_us(lambda: plan.run(args[0], None, *args[1:], out, stream), 3000)
    host["torch_empty"] = per_call_us(lambda: torch.empty((4, 16, 512), dtype=torch.bfloat16, device=dev), 20000)
    host["current_stream"] = per_call_us(lambda: torch.cuda.current_stream(dev).cuda_stream, 20000)
    host["data_ptr_x6"] = per_call_us(lambda: [t.data_ptr() for t in args + (out,)], 20000)
    host["decode"] = per_call_us(lambda: mlagen.decode(inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"],
                                                       inp["config"]), 3000)
    res["host_us_per_call"] = host
    kernels = {}
    for b, l in C.parse_shapes(a.shapes):
        x = C.make_inputs(b, l, 2, dev, keep_bf16=False)
        call = lambda: mlagen.decode(x["q"], x["kv_data"], x["qo_indptr"], x["kv_indptr"], x["config"])  # noqa
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                call()
            torch.cuda.synchronize()
        rows = {}
        for e in prof.key_averages():
            if e.device_type == torch.autograd.DeviceType.CUDA or "kernel" in e.key:
                d = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0)
                rows[e.key[:90]] = dict(count=e.count, avg_us=round(d, 2))
        kernels[f"{b}x{l}"] = dict(kernel=mlagen.last_kernel()["name"], device=rows,
                                   bytes=C.fp8_bytes(b, l))
        del x
    res["kernels"] = kernels
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
