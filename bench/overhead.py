"""Host cost of one call: the bundle's custom_kernel vs the leanest direct library call.

    python bench/overhead.py dist/submission.py [--out overhead.json]

Both paths are timed by the host clock over many calls on a tiny problem (1 sequence of
64 tokens) so the GPU work per call is far below the host work and the wall time per call
is the host cost. "direct" is what any caller must do: allocate the output and pass six
pointers and the stream to mlagen_decode_ptrs with a prepared problem. "custom_kernel" is
the leaderboard entry point of the bundle (plan cache lookup, output, the same C call).
The difference is the Python-layer overhead the leaderboard pays per call.
"""
import argparse
import ctypes
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _common as C  # noqa: E402


def per_call_us(torch, fn, n=3000, rounds=5):
    fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        res.append((t1 - t0) / n * 1e6)
    return statistics.median(res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("submission")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "leaderboard", "stub"))  # task.py stand-in
    spec = importlib.util.spec_from_file_location("submission", os.path.abspath(a.submission))
    sub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sub)
    import torch
    import mlagen  # the bundle's embedded binding (served by its importer)
    dev = torch.device("cuda")
    inp = C.make_inputs(1, 64, 3, dev, keep_bf16=False)
    data = (inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"])
    out = sub.custom_kernel(data)
    plan = next(iter(mlagen._plans.values()))
    L = mlagen._lib.lib()
    target = mlagen._launch.handle(0)  # the bundle's launch target (the default handle)
    pp = plan.bind(target)[0]          # the plan's problem with its scratch for that target
    q, (kv, scale), qo, kvi = inp["q"], inp["kv_data"]["fp8"], inp["qo_indptr"], inp["kv_indptr"]
    shape, bf16 = plan.out_shape, torch.bfloat16

    def direct():
        o = torch.empty(shape, dtype=bf16, device=dev)
        st = L.mlagen_decode_ptrs(pp, q.data_ptr(), None, kv.data_ptr(), scale.data_ptr(), qo.data_ptr(),
                                  kvi.data_ptr(), o.data_ptr(), target)
        assert st == 0, L.mlagen_last_error()
        return o

    def entry():
        return sub.custom_kernel(data)

    assert torch.equal(direct(), out) and torch.equal(entry(), out)
    r = {}
    for k in range(3):  # interleave to see drift
        r.setdefault("direct_us", []).append(per_call_us(torch, direct))
        r.setdefault("custom_kernel_us", []).append(per_call_us(torch, entry))
    res = dict(direct_us=min(r["direct_us"]), custom_kernel_us=min(r["custom_kernel_us"]), raw=r,
               empty_only_us=per_call_us(torch, lambda: torch.empty(shape, dtype=bf16, device=dev)))
    res["overhead_us"] = res["custom_kernel_us"] - res["direct_us"]
    res["method"] = __doc__.strip().splitlines()[0]
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
