"""bench/floor.py --paged: the tile read (contiguous and through a page table in random order)
against torch on the gathered rows, on the CPU under Triton's interpreter (no GPU touched).
A subprocess, because TRITON_INTERPRET must be set before triton is first imported."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout

CODE = """
import sys
sys.path.insert(0, "bench")
import torch
import floor as F
k = F.build_tile_read()
print("checked", F.check_paged_small(torch, k, torch.device("cpu"), [1, 64, 16]))  # 2 formats x 4 layouts x 12
# a read that ignores the page table has the same total but not the same partials
cache = F.paged_cache(torch, 2, 256, "bf16", 1, "cpu")
table = F.page_table(torch, 2, 256, 64, 5, "cpu")
sums = cache.view(torch.int32).sum(-1, dtype=torch.int64)
part = torch.zeros(8, dtype=torch.int32)
F.tile_launch(torch, k, cache, table, part, 0, 2, 256, "bf16", (64, 1, 4), "")()
paged = F.partials_of(torch, sums[F.gathered_rows(torch, table, 64, 2, 256, "cpu")], 64)
assert not torch.equal(part.long() & F.MASK32, paged)
assert int(part.long().sum()) & F.MASK32 == int(paged.sum()) & F.MASK32
"""


def test_paged_tile_read_interpreted():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked 96" in r.stdout, r.stdout
