"""Host time a decode call costs against an empty torch op, back to back on 4x1024 (fp8 KV) and a
paged case (bench/host.py, fewer loops): issue 41's targets, mlagen.decode and the leaderboard
entry at most 1.2x the empty op and torch.ops.mlagen.decode at most 1.4x, asserted with a
generous margin (the figures are printed: `pytest -s`; bench/host.py measures them properly).
Every path's output is checked equal to mlagen.decode's first."""
import argparse

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402,F401  (the package under test, before bench/host.py puts the checkout's on the path)
from bench import host  # noqa: E402

pytestmark = pytest.mark.gpu
MARGIN = 1.5  # on the ratios: a shared host's noise, not the design's budget


def test_host_time_against_an_empty_op():
    args = argparse.Namespace(shape=(4, 1024), calls=200, reps=15, warmup=3, page_size=64, json=None)
    res = host.measure(args)
    print("\n" + host.report(res))
    assert all(res["outputs_equal"].values()), res["outputs_equal"]
    ratio = res["ratio_to_empty_op"]
    if res["registration"] != "native":
        # the default build (no C++ operators: CMakeLists.txt MLAGEN_TORCH_OP): the ctypes path, a
        # regression bound, not issue 41's target: at 58e585c on the H200 decode took 18.6 us (2.42x an
        # empty op of 7.8 us), paged 22.1 (2.85x); the bound leaves ~25% for a shared host's noise
        for name, bound in (("decode", 3.0), ("paged_decode", 3.5)):
            assert ratio[name] <= bound, f"{name}: {ratio[name]:.2f}x the empty op (ctypes path; bound {bound}x)"
        return
    for name, target in host.TARGETS.items():
        assert ratio[name] <= target * MARGIN, f"{name}: {ratio[name]:.2f}x the empty op (target {target}x)"
    # the paged decode is the same call on a block table: within the contiguous decode's budget too
    assert ratio["paged_decode"] <= host.TARGETS["decode"] * MARGIN, f"paged_decode: {ratio['paged_decode']:.2f}x"
