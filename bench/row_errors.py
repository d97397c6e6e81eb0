"""Per-(token, head)-row error of what the kernels compute against the task's a8w8 reference,
emulated with torch (CPU or GPU): the measurement behind task_inputs.ROW_REL_L2 (the numbers
are in tests/tolerances.py, ROW_REL_L2_MEASURED).

    PYTHONPATH=runtime/python:. python3 bench/row_errors.py [--shapes 4x1024,...] [--seeds 3]
                                                            [--device cpu] [--formats] [--json out.json]

For each shape and seed: the task's inputs (task_inputs.generate_input), the check's reference
(reference_a8w8: fp8 q, fp8 KV, float32), and these emulations, each rounded to bf16 as the
kernels' output is:
  fp8kv_bf16q_f32 / _f64   bf16 q, dequantized fp8 KV, float32 / float64 attention
  fp8kv_fp8q_f32 / _f64    the same with q quantized to fp8 (the reference's recipe)
  --formats adds bf16kv_bf16q_f32 and mxfp4kv_bf16q_f32 (the bf16 / mxfp4 KV kernels).
  --kernels (a GPU and the library: MLAGEN_LIBRARY) adds the kernels themselves,
    kernel_<kv format>_<q dtype>q, each also against float32 attention on the values it
    computes with (same_inputs: the kernel's own rounding, the tolerances.py "same_inputs" rows).
Printed per emulation: the max over rows of ||out - ref|| / ||ref||, the whole-output rel-L2,
and the task's check (mismatch fraction).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
for _p in (REPO, os.path.join(REPO, "runtime", "python")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

from tests.leaderboard import task_inputs as ti  # noqa: E402

SHAPES = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]
# the harness's seeds (tests/leaderboard/harness.py BENCH_SHAPES), then + 1, + 2, ...
SEEDS = {(4, 1024): 4237, (4, 8192): 4251, (32, 1024): 5432, (32, 8192): 5415,
         (64, 1024): 6432, (64, 8192): 6445, (256, 1024): 7801, (256, 8192): 7824}


def emulations(data, formats: bool):
    q, kv_data, qo, kvp, config = data
    kv8, ks = kv_data["fp8"]
    kv8 = kv8.reshape(kv8.shape[0], -1)
    fp8_rows = lambda a, b: ti.dequantize_fp8(kv8[a:b], ks)  # noqa: E731
    q8, qs = ti.quantize_q_fp8(q)
    q_fp8 = ti.dequantize_fp8(q8, qs)
    sm = float(config["sm_scale"])
    runs = {
        "fp8kv_bf16q_f32": (q, fp8_rows, torch.float32),
        "fp8kv_bf16q_f64": (q, fp8_rows, torch.float64),
        "fp8kv_fp8q_f32": (q_fp8, fp8_rows, torch.float32),
        "fp8kv_fp8q_f64": (q_fp8, fp8_rows, torch.float64),
    }
    if formats:
        kvb = kv_data["bf16"].reshape(-1, ti.QK_HEAD_DIM)
        d4, s4 = ti.quantize_mxfp4(kv_data["bf16"])
        d4 = d4.reshape(d4.shape[0], -1)
        runs["bf16kv_bf16q_f32"] = (q, lambda a, b: kvb[a:b], torch.float32)
        runs["mxfp4kv_bf16q_f32"] = (q, lambda a, b: ti.dequantize_mxfp4(d4[a:b], s4[a:b]), torch.float32)
    for name, (qq, rows, dt) in runs.items():
        yield name, ti.attention_reference(qq, rows, qo, kvp, sm, dtype=dt).to(torch.bfloat16), None


def kernels(data):
    """The library's kernels on the task's inputs: (name, output, float32 reference on the
    values the kernel sees, kernel name)."""
    import mlagen
    q, kv_data, qo, kvp, config = data
    sm = float(config["sm_scale"])
    kv8, ks = kv_data["fp8"]
    kv8 = kv8.reshape(kv8.shape[0], -1)
    kvb = kv_data["bf16"].reshape(-1, ti.QK_HEAD_DIM)
    d4, s4 = kv_data["mxfp4"]
    d4 = d4.view(torch.uint8).reshape(d4.shape[0], -1)
    s4 = s4.view(torch.uint8)
    seen = {"fp8": lambda a, b: ti.dequantize_fp8(kv8[a:b], ks), "bf16": lambda a, b: kvb[a:b],
            "mxfp4": lambda a, b: ti.dequantize_mxfp4(d4[a:b], s4[a:b])}
    q8, qs = ti.quantize_q_fp8(q)
    q_seen = {"bf16": q, "fp8": ti.dequantize_fp8(q8, qs)}
    for fmt in ("fp8", "bf16", "mxfp4"):
        for qd in ("bf16", "fp8"):
            out = mlagen.decode(q, kv_data, qo, kvp, config, kv_format=fmt, q_dtype=qd)
            torch.cuda.synchronize()
            name = mlagen.last_kernel()["name"]
            same = ti.attention_reference(q_seen[qd], seen[fmt], qo, kvp, sm)
            yield f"kernel_{fmt}kv_{qd}q", out, (same, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="", help="e.g. 4x1024,256x8192 (default: the eight leaderboard shapes)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds a shape (the harness's, then +1, ...)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--formats", action="store_true", help="also the bf16 and mxfp4 KV paths")
    ap.add_argument("--kernels", action="store_true", help="also the library's kernels (GPU)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    torch.set_grad_enabled(False)
    records = []
    for b, l in shapes:
        for k in range(args.seeds):
            seed = SEEDS.get((b, l), 1000 * b + l) + k
            t0 = time.time()
            data = ti.generate_input(b, l, seed, device=args.device, mxfp4=args.kernels)
            ref = ti.reference_a8w8(data)
            runs = emulations(data, args.formats)
            if args.kernels:
                runs = itertools.chain(runs, kernels(data))
            for name, out, extra in runs:
                chk = ti.check_output(data, out, reference=lambda _d: ref, row_bound=None)
                rec = dict(batch=b, kv_len=l, seed=seed, emulation=name, max_row_rel_l2=chk.max_row_rel_l2,
                           rel_l2=chk.rel_l2, mismatch=chk.mismatch, task_ok=chk.task_ok)
                line = (f"{b}x{l} seed {seed} {name:18s} max row {chk.max_row_rel_l2:.4e}  rel_l2 {chk.rel_l2:.4e}"
                        f"  mismatch {chk.mismatch:.4%}")
                if extra is not None:
                    same, kname = extra
                    rows = ti.row_rel_l2(out, same)
                    rec.update(kernel=kname, same_inputs_max_row_rel_l2=rows.max().item(),
                               same_inputs_rel_l2=((out.double() - same.double()).norm() / same.double().norm()).item())
                    line += (f"  | same inputs: max row {rec['same_inputs_max_row_rel_l2']:.4e} rel_l2 "
                             f"{rec['same_inputs_rel_l2']:.4e}  {kname}")
                records.append(rec)
                print(line, flush=True)
            del data, ref
            print(f"  ({time.time() - t0:.0f} s)", flush=True)
    print("\nworst max-row rel-L2 per shape and emulation:")
    names = sorted({r["emulation"] for r in records})
    print("shape      " + " ".join(f"{n:>18s}" for n in names))
    for b, l in shapes:
        sel = [r for r in records if (r["batch"], r["kv_len"]) == (b, l)]
        print(f"{b}x{l:<8d} " + " ".join(f"{max(r['max_row_rel_l2'] for r in sel if r['emulation'] == n):18.4e}"
                                        for n in names))
    same = sorted({r["emulation"] for r in records if "same_inputs_max_row_rel_l2" in r})
    if same:
        print("\nkernels against float32 on the values they see: worst max-row / worst whole-output rel-L2")
        for n in same:
            sel = [r for r in records if r["emulation"] == n]
            for b, l in shapes:
                rs = [r for r in sel if (r["batch"], r["kv_len"]) == (b, l)]
                print(f"{n:22s} {b}x{l:<6d} {max(r['same_inputs_max_row_rel_l2'] for r in rs):.4e} "
                      f"{max(r['same_inputs_rel_l2'] for r in rs):.4e}  {rs[0]['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=args.device, torch=torch.__version__, records=records), f, indent=1)


if __name__ == "__main__":
    main()
