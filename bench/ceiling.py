"""The compute ceiling of the H200 as this GPU reaches it: dense GEMM TFLOP/s by cuBLAS (torch.matmul
on bf16, torch._scaled_mm on e4m3 with and without fast accumulation), CUDA events around each call,
mean and median, beside the datasheet's dense peaks (989 bf16, 1979 fp8 on an H200 SXM).

From the fastest of each it prints the compute floor of the query-rows cases (bench.py --rows) at
the precision mlagen computes them with: S^T = K Q^T as e4m3 wgmmas, N = 2 x rows for a bf16 q (hi
and lo parts) or N = rows for an fp8 q, and O^T = V^T P^T as f16 wgmmas (P and V in f16):

    floor = S flop x (2 for a bf16 q) / fp8 ceiling + O flop / bf16 ceiling

the time no kernel computing those products can beat on this GPU at cuBLAS's rate, next to the
issue-18 targets (FlashMLA bf16's time / 1.3 and / 1.8 at 128 heads, q_len 1 x 1.5 at q_len 4).
A target under its floor asks for more than the GPU's GEMM rate at that precision.

`python bench/ceiling.py [--reps 30] [--out FILE] [--targets bench.json]`
  --targets: a bench.py --rows JSON of the same run, for the targets and mlagen's own times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

PEAK = {"bf16": 989.4, "fp8": 1978.9}  # H200 SXM dense TFLOP/s (NVIDIA datasheet)
SHAPES = ((8192, 8192, 8192), (4096, 4096, 16384), (16384, 16384, 4096))


def time_calls(torch, fn, reps: int) -> dict:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return dict(mean_us=statistics.fmean(ts), median_us=statistics.median(ts))


def gemm_ceilings(torch, reps: int) -> dict:
    out = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda", generator=g).to(torch.bfloat16)
        flop = 2.0 * m * n * k
        key = f"{m}x{n}x{k}"
        r = time_calls(torch, lambda: torch.matmul(a, b), reps)
        out[f"bf16 {key}"] = dict(kind="bf16", **r, tflops=flop / r["mean_us"] / 1e6)
        a8 = (a * 0.5).to(torch.float8_e4m3fn)
        b8 = (b.t().contiguous() * 0.5).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm takes it
        one = torch.ones((), device="cuda", dtype=torch.float32)
        for fast in (False, True):
            try:
                fn = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)
                r = time_calls(torch, fn, reps)
                out[f"fp8{' fast' if fast else ''} {key}"] = dict(kind="fp8", **r, tflops=flop / r["mean_us"] / 1e6)
            except Exception as e:  # (an older torch without _scaled_mm's keywords)
                out[f"fp8{' fast' if fast else ''} {key}"] = dict(kind="fp8", error=repr(e)[:200])
        del a, b, a8, b8
        torch.cuda.empty_cache()
    return out


def rows_floor(batch, kv_len, heads, q_len, q8: bool, c8: float, c16: float) -> float:
    """us: the S and O products of a rows case at mlagen's precision on the given ceilings (TFLOP/s)."""
    rows_tokens = batch * heads * q_len * kv_len
    s = 2.0 * rows_tokens * 576 * (1 if q8 else 2)
    o = 2.0 * rows_tokens * 512
    return (s / c8 + o / c16) / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--targets", default=None, help="bench.py --rows JSON of the same run")
    args = p.parse_args()
    import torch
    res = gemm_ceilings(torch, args.reps)
    for k, v in res.items():
        if "error" in v:
            print(f"{k:28s} {v['error']}")
        else:
            print(f"{k:28s} mean {v['mean_us']:9.1f} us  median {v['median_us']:9.1f} us  {v['tflops']:7.1f} TFLOP/s"
                  f"  ({100 * v['tflops'] / PEAK[v['kind']]:.0f}% of the {PEAK[v['kind']]:.0f} peak)")
    best = {kind: max((v["tflops"] for v in res.values() if v.get("kind") == kind and "tflops" in v), default=None)
            for kind in ("bf16", "fp8")}
    print(f"ceilings: bf16 {best['bf16']:.0f} TFLOP/s, fp8 {best['fp8']:.0f} TFLOP/s (the fastest GEMM of each)")
    out = dict(torch=torch.__version__, device=torch.cuda.get_device_name(), peak_tflops=PEAK, gemms=res,
               ceiling_tflops=best, cases=[])
    if args.targets:
        rows = json.load(open(args.targets)).get("query_rows", [])
        print(f"{'case':20s} {'q':5s} {'floor':>7s} {'floor@peak':>10s} {'mlagen':>7s} {'target':>7s}  what")
        for r in rows:
            cols = r["columns"]
            fl = (cols.get("FlashMLA bf16") or {}).get("mean_us")
            base = next((b for b in rows if (b["batch"], b["kv_len"], b["heads"], b["q_len"]) ==
                         (r["batch"], r["kv_len"], r["heads"], 1)), None)
            for col, q8 in (("fp8 KV, bf16 q", False), ("fp8 KV, fp8 q", True)):
                me = (cols.get(col) or {}).get("mean_us")
                if me is None:
                    continue
                floor = rows_floor(r["batch"], r["kv_len"], r["heads"], r["q_len"], q8, best["fp8"], best["bf16"])
                floor_peak = rows_floor(r["batch"], r["kv_len"], r["heads"], r["q_len"], q8, PEAK["fp8"], PEAK["bf16"])
                target, what = None, ""
                if r["heads"] == 128 and fl:
                    target, what = fl / (1.8 if q8 else 1.3), f"FlashMLA / {1.8 if q8 else 1.3}"
                elif r["heads"] == 16 and r["q_len"] > 1 and base and not q8:
                    b = (base["columns"].get(col) or {}).get("mean_us")
                    k = 1.2 if r["q_len"] == 2 else 1.5
                    target, what = (b * k if b else None), f"q_len 1 x {k}"
                out["cases"].append(dict(case=r["shape"], column=col, floor_us=floor, floor_at_peak_us=floor_peak,
                                         mlagen_mean_us=me, target_us=target, target_is=what))
                t = f"{target:7.1f}" if target else f"{'':7s}"
                print(f"{r['shape']:20s} {'fp8' if q8 else 'bf16':5s} {floor:7.1f} {floor_peak:10.1f} {me:7.1f} {t}  {what}"
                      + ("  TARGET UNDER THE FLOOR" if target and target < floor else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
