"""One call each of the 64x8192 rows-body cases (128 heads: bf16 KV, fp8 KV with a bf16 q; 64 heads: bf16
KV), for ncu to count the DRAM bytes a kernel reads (docs/perf.md, query rows: does the 128-head bf16
rows body read the KV twice, 1.21 GB, or once, 604 MB?):

    ncu --clock-control none --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
        -k regex:mla_decode_sm90a python3 bench/experiments/rows_dram.py

Each case is called twice (the first call plans and loads); ncu reports every decode kernel launch.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from bench import _common as C  # noqa: E402

C.ensure_mlagen_importable()
import torch  # noqa: E402
import mlagen  # noqa: E402

B, KV = 64, 8192
g = torch.Generator(device="cuda").manual_seed(3)
kv = torch.randn((B * KV, 1, C.QK_DIM), generator=g, device="cuda").to(torch.bfloat16)
fp8, scale = C.quantize_fp8(kv)
kvi = torch.arange(0, (B + 1) * KV, KV, dtype=torch.int32, device="cuda")
qo = torch.arange(0, B + 1, dtype=torch.int32, device="cuda")
for heads, fmt in ((128, "bf16"), (128, "fp8"), (64, "bf16")):
    q = torch.randn((B, heads, C.QK_DIM), generator=g, device="cuda").to(torch.bfloat16)
    config = dict(C.make_config(B, KV), num_heads=heads)
    data = {"bf16": kv} if fmt == "bf16" else {"fp8": (fp8, scale)}
    for _ in range(2):
        mlagen.decode(q, data, qo, kvi, config, kv_format=fmt)
    torch.cuda.synchronize()
    print(f"{heads} heads {fmt} KV: {mlagen.last_kernel()['name']}, KV bytes {kv.numel() * (2 if fmt == 'bf16' else 1)}")
