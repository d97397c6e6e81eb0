"""mxfp4 KV through the rows body (branch wip/mxfp4-rows) against the 16-row kernel it replaces at
32..128 heads, fp8 KV (rows body) and bf16 KV (rows body) on the same cells, in one run.

Per repetition: synchronize, write a 256 MB flush buffer, event, one mlagen.decode call, event;
contenders interleaved; median and mean of --reps. Contiguous KV, q_len 1, bf16 q (and fp8 q with
--fp8-q). Checked first: the mxfp4 rows kernel's output is bit-identical to the bf16 rows kernel's on
the dequantized rows (same splits), and within 2e-2 relative L2 of the 16-row mxfp4 kernel.

    python3 bench/experiments/mxfp4_rows.py [--cells 32x64x8192,128x4x1024,...] [--reps 30] [--json F]

Predictions written before any run (docs/perf.md, mxfp4 KV): 32 heads 64x8192 80-100 us (fp8 KV,
bf16 q: ~116); 128 heads 64x8192 280-330 us (fp8 KV, bf16 q: ~262); the 16-row mxfp4 kernel several
times slower at 64-128 heads.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import os

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from bench import _common as C  # noqa: E402

C.ensure_mlagen_importable()
import torch  # noqa: E402
import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402

CELLS = "32x4x1024,32x16x8192,32x64x8192,64x4x8192,64x16x8192,64x64x1024,64x64x8192,128x4x8192,128x16x8192,128x64x8192"


def kernel(role, q, kv, block_m=None):
    for k in mlagen.kernels():
        if k["role"] == role and k["q_dtype"] == q and k["kv_dtype"] == kv and \
                (block_m is None or k["name"].endswith(f"_bm{block_m}")):
            return k["name"]
    raise SystemExit(f"no {role} kernel for q {q} kv {kv} bm {block_m}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--fp8-q", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    qd = "fp8" if a.fp8_q else "bf16"
    res = []
    for cell in a.cells.split(","):
        heads, batch, kv_len = map(int, cell.split("x"))
        g = torch.Generator(device="cuda").manual_seed(heads * 7 + batch)
        kvb = torch.randn((batch * kv_len, 1, 576), generator=g, device=dev).to(torch.bfloat16)
        q = torch.randn((batch, heads, 576), generator=g, device=dev).to(torch.bfloat16)
        mx = quant.quantize_mxfp4(kvb)
        exp = quant.dequantize_mxfp4(*mx, 576).to(torch.bfloat16).reshape(-1, 1, 576)
        fp8 = C.quantize_fp8(kvb)
        qo = torch.arange(batch + 1, dtype=torch.int32, device=dev)
        kvp = torch.arange(batch + 1, dtype=torch.int32, device=dev) * kv_len
        cfg = dict(batch_size=batch, num_heads=heads, kv_seq_len=kv_len, sm_scale=576 ** -0.5)
        kw = dict(q_dtype="fp8") if a.fp8_q else {}
        calls = {
            "mxfp4 (default)": lambda: mlagen.decode(q, {"mxfp4": mx}, qo, kvp, cfg, kv_format="mxfp4", **kw),
            "mxfp4 16-row": lambda: mlagen.decode(q, {"mxfp4": mx}, qo, kvp, cfg, kv_format="mxfp4",
                                                  kernel=kernel("generic", qd, "mxfp4"), **kw),
            "fp8 (default)": lambda: mlagen.decode(q, {"fp8": fp8}, qo, kvp, cfg, kv_format="fp8", **kw),
            "bf16 (default)": lambda: mlagen.decode(q, {"bf16": kvb}, qo, kvp, cfg, kv_format="bf16", **kw),
        }
        # checks: bits against the bf16 rows body on the expansion (same splits); the 16-row kernel
        mk, bk = kernel("generic_rows", qd, "mxfp4", 32), kernel("generic_rows", qd, "bf16", 32)
        out_m = mlagen.decode(q, {"mxfp4": mx}, qo, kvp, cfg, kv_format="mxfp4", kernel=mk, splits=2, **kw)
        out_b = mlagen.decode(q, {"bf16": exp}, qo, kvp, cfg, kv_format="bf16", kernel=bk, splits=2, **kw)
        same = bool(torch.equal(out_m.view(torch.int16), out_b.view(torch.int16)))
        d = calls["mxfp4 (default)"]()
        k_default = mlagen.last_kernel()["name"]
        r = calls["mxfp4 16-row"]()
        err = C.rel_l2(d, r)
        times = {k: [] for k in calls}
        for k, f in calls.items():
            f()
        torch.cuda.synchronize()
        for _ in range(a.reps):
            for k, f in calls.items():
                flush.fill_(1)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                f()
                e1.record()
                torch.cuda.synchronize()
                times[k].append(e0.elapsed_time(e1) * 1e3)
        row = dict(cell=cell, q=qd, mxfp4_kernel=k_default, bits_equal_bf16_rows=same, rel_l2_vs_16row=err,
                   median_us={k: statistics.median(v) for k, v in times.items()},
                   mean_us={k: statistics.fmean(v) for k, v in times.items()})
        res.append(row)
        m = row["median_us"]
        print(f"{cell:12s} {qd} mx {m['mxfp4 (default)']:8.1f} mx16 {m['mxfp4 16-row']:8.1f} fp8 {m['fp8 (default)']:8.1f} "
              f"bf16 {m['bf16 (default)']:8.1f} us  bits {same} err {err:.2e}  {k_default}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(git=C.git_commit(), device=torch.cuda.get_device_name(), rows=res), f, indent=1)
    return 0 if all(r["bits_equal_bf16_rows"] and r["rel_l2_vs_16row"] < 2e-2 for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
