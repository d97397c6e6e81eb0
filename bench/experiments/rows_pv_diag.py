"""Where a 64-row bf16 rows-body output is wrong, if it is (branch wip/rows-pv: O += P V with P from
registers and V the N-major B operand): the generic bf16 64-row kernel on 2 sequences at 128 heads,
one split and three, against float64 per (warp's 16-row group, 64-dim block of an O group), so that
one call tells the descriptor's blocks (a wrong LBO: dims 64-255 of each half off, 0-63 right) from
P's fragment (every block off) from the rescale or the epilogue (rows off by 8 or rows of one
split). Prints a grid of rel-L2 a (row group, dim block); exits 1 if any cell is over 1e-2.

    python3 bench/experiments/rows_pv_diag.py
"""
from __future__ import annotations

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from bench import _common as C  # noqa: E402

C.ensure_mlagen_importable()
import torch  # noqa: E402
import mlagen  # noqa: E402

QK, DV, HEADS = 576, 512, 128


def main() -> int:
    g = torch.Generator(device="cuda").manual_seed(7)
    lens = [1000, 333]
    kv = torch.randn((sum(lens), 1, QK), generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn((len(lens), HEADS, QK), generator=g, device="cuda").to(torch.bfloat16)
    qo = torch.arange(0, len(lens) + 1, dtype=torch.int32, device="cuda")
    kvi = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    config = dict(C.make_config(len(lens), None), num_heads=HEADS, q_seq_len=1)  # (lengths differ)
    name = next(k["name"] for k in mlagen.kernels() if k["role"] == "generic_rows" and k["q_dtype"] == "bf16"
                and k["kv_dtype"] == "bf16" and k["name"].endswith("_bm64"))
    ref = torch.zeros((len(lens), HEADS, DV), dtype=torch.float64, device="cuda")
    s0 = 0
    for b, n in enumerate(lens):
        k = kv[s0:s0 + n, 0].double()
        s = q[b].double() @ k.T / math.sqrt(QK)
        ref[b] = torch.softmax(s, -1) @ k[:, :DV]
        s0 += n
    bad = 0
    for splits in (1, 3):
        out = torch.full((len(lens), HEADS, DV), float("nan"), dtype=torch.bfloat16, device="cuda")
        mlagen.decode(q, {"bf16": kv}, qo, kvi, config, kv_format="bf16", out=out, kernel=name, splits=splits)
        torch.cuda.synchronize()
        print(f"{name} splits {splits}: rows (16-row groups of 64) x dims (64-dim blocks), rel-L2 x 1e3")
        for b in range(len(lens)):
            for rg in range(HEADS // 16):
                cells = []
                for db in range(DV // 64):
                    o = out[b, 16 * rg:16 * rg + 16, 64 * db:64 * db + 64].double()
                    r = ref[b, 16 * rg:16 * rg + 16, 64 * db:64 * db + 64]
                    e = float(((o - r).norm() / r.norm()).item()) if not o.isnan().any() else float("inf")
                    bad += e > 1e-2
                    cells.append(f"{1e3 * e:6.1f}" if e < 1e3 else "   inf")
                print(f"  seq {b} rows {16 * rg:3d}.. " + " ".join(cells))
    print("bad cells:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
