"""Host time a decode call costs, back to back on a small shape, against an empty torch op.

Every variant is called `--calls` times in a row with no flush and no synchronization between
the calls; `host` is the host's time to issue them (perf_counter around the loop, before the one
synchronize: the queue never fills at the default 200 calls), `wall` the same with the final
synchronize (the device's time where it is the longer), each the median of `--reps` loops,
variants interleaved loop by loop. Issue 41's targets read the host figure against the empty op:
mlagen.decode and the leaderboard entry at most 1.2x, torch.ops.mlagen.decode at most 1.4x.

  empty_op               torch.add on two one-element tensors (torch's Python API)
  empty_op_dispatcher    torch.ops.aten.add on the same (the route torch.ops.mlagen.* takes)
  decode                 mlagen.decode(q, kv_data, qo_indptr, kv_indptr, config), fp8 KV, bf16 q
  leaderboard_entry      mlagen.leaderboard_entry("fp8")(data): the package's entry (the C++
                         operators where loaded)
  leaderboard_ctypes     the same through ctypes only, as the leaderboard bundle runs it
  torch_ops_decode       torch.ops.mlagen.decode(q, kv, kv_scale, qo_indptr, kv_indptr, ...)
  paged_decode           mlagen.decode on a paged cache (pages of --page-size, a shuffled block table)
  plan_run               Plan.run with a preallocated output (the ctypes layer under decode)
  *_in_launch            decode, the leaderboard entry and torch.ops under mlagen.set_split_merge("in_launch"):
                         one launch a call (merger blocks in the decode's launch), not two

    python bench/host.py [--shape 4x1024] [--calls 200] [--reps 50] [--page-size 64] [--json [FILE]]

--json prints the JSON (or writes it to FILE); the text table goes to stderr then. Exits 2
without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from bench import _common as C  # noqa: E402

C.ensure_mlagen_importable()

TARGETS = {"decode": 1.2, "leaderboard_entry": 1.2, "torch_ops_decode": 1.4}  # issue 41, x the empty op
IN_LAUNCH = ("decode", "leaderboard_entry", "torch_ops_decode")  # also timed with the split merge in the launch
TARGETS.update({k + "_in_launch": TARGETS[k] for k in IN_LAUNCH})


def _inputs(torch, mlagen, batch: int, kv_len: int, page_size: int, device):
    """The contiguous inputs (the leaderboard's tuple) and a paged cache holding the same rows in
    pages of page_size, shuffled."""
    inp = C.make_inputs(batch, kv_len, seed=1234, device=device, keep_bf16=False)
    kv8, scale = inp["kv_fp8"], inp["scale"]
    pages = batch * kv_len // page_size
    g = torch.Generator(device="cpu").manual_seed(7)
    order = torch.randperm(pages, generator=g).to(device)
    cache = torch.empty((pages, page_size, 1, C.QK_DIM), dtype=torch.uint8, device=device)
    cache[order] = kv8.view(torch.uint8).view(pages, page_size, 1, C.QK_DIM)  # page i of the rows -> page order[i]
    cache = cache.view(kv8.dtype)
    table = order.view(batch, kv_len // page_size).to(torch.int32)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
    return inp, dict(cache=cache, table=table, lens=lens)


def measure(args) -> dict:
    import torch
    import mlagen
    from mlagen import ops

    device = torch.device("cuda", torch.cuda.current_device())
    batch, kv_len = args.shape
    inp, pg = _inputs(torch, mlagen, batch, kv_len, args.page_size, device)
    q, kv_data, qo, kvp, config = inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"]
    kv8, scale = inp["kv_fp8"], inp["scale"]
    data = (q, kv_data, qo, kvp, config)
    entry = mlagen.leaderboard_entry("fp8")
    entry_ctypes = mlagen.leaderboard_entry("fp8", native=False)
    paged_data = {"fp8": (pg["cache"], scale)}
    paged_cfg = dict(config)
    plan = mlagen.prepare(q, kv8, scale, qo, kvp, config)
    out = torch.empty(plan.out_shape, dtype=torch.bfloat16, device=device)
    where = mlagen._launch.handle(device.index)
    x, y = torch.ones(1, device=device), torch.ones(1, device=device)
    aten_add = torch.ops.aten.add
    op = torch.ops.mlagen.decode
    sm = config["sm_scale"]

    variants = {
        "empty_op": lambda: torch.add(x, y),
        "empty_op_dispatcher": lambda: aten_add(x, y),
        "decode": lambda: mlagen.decode(q, kv_data, qo, kvp, config),
        "leaderboard_entry": lambda: entry(data),
        "leaderboard_ctypes": lambda: entry_ctypes(data),
        "torch_ops_decode": lambda: op(q, kv8, scale, qo, kvp, "fp8", "bf16", kv_len, sm),
        "paged_decode": lambda: mlagen.decode(q, paged_data, qo, None, paged_cfg, page_table=pg["table"],
                                              kv_lens=pg["lens"], page_size=args.page_size),
        "plan_run": lambda: plan.run(q, None, kv8, scale, qo, kvp, out, where),
    }
    for k in IN_LAUNCH:
        variants[k + "_in_launch"] = variants[k]
    default_mode = mlagen.split_merge()

    def mode_of(name):
        return "in_launch" if name.endswith("_in_launch") else default_mode
    # every path gives the same output (and makes its plans before the timing)
    want = mlagen.decode(q, kv_data, qo, kvp, config)
    checks = {}
    for name in ("decode", "leaderboard_entry", "leaderboard_ctypes", "torch_ops_decode") + tuple(k + "_in_launch" for k in IN_LAUNCH):
        mlagen.set_split_merge(mode_of(name))
        got = variants[name]()
        if name.endswith("_in_launch"):  # another merge order: equal to bf16 rounding
            checks[name] = bool(torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2))
        else:
            checks[name] = bool(torch.equal(got, want))
        mlagen.set_split_merge(default_mode)
    # another kernel reads the pages: the same rows, so the same result to bf16 rounding
    checks["paged_decode"] = bool(torch.allclose(variants["paged_decode"]().float(), want.float(), atol=2e-2, rtol=2e-2))
    kernels = {"decode": mlagen.last_kernel()}
    variants["paged_decode"]()
    kernels["paged_decode"] = mlagen.last_kernel()
    variants["plan_run"]()
    torch.cuda.synchronize()
    checks["plan_run"] = bool(torch.equal(out, want))

    host = {k: [] for k in variants}
    wall = {k: [] for k in variants}
    for _ in range(args.warmup):
        for name, fn in variants.items():
            mlagen.set_split_merge(mode_of(name))
            fn()
    mlagen.set_split_merge(default_mode)
    torch.cuda.synchronize()
    for _ in range(args.reps):
        for name, fn in variants.items():
            mlagen.set_split_merge(mode_of(name))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            mlagen.set_split_merge(default_mode)
            host[name].append((t1 - t0) * 1e6 / args.calls)
            wall[name].append((t2 - t0) * 1e6 / args.calls)
    us = {k: {"host": statistics.median(host[k]), "wall": statistics.median(wall[k]),
              "host_min": min(host[k])} for k in variants}
    empty = us["empty_op"]["host"]
    ratios = {k: v["host"] / empty for k, v in us.items()}
    return dict(
        shape=C.shape_name(batch, kv_len), page_size=args.page_size, calls=args.calls, reps=args.reps,
        registration=ops.REGISTRATION, native_path=ops.NATIVE_PATH, torch=torch.__version__,
        device=torch.cuda.get_device_name(device), host=os.uname().nodename, git=C.git_commit(),
        us=us, ratio_to_empty_op=ratios,
        ratio_to_dispatcher_op={k: v["host"] / us["empty_op_dispatcher"]["host"] for k, v in us.items()},
        targets={k: dict(max_ratio=t, ratio=ratios[k], met=ratios[k] <= t) for k, t in TARGETS.items()},
        outputs_equal=checks, kernels=kernels,
        method=(f"host: perf_counter around {args.calls} back-to-back calls before one synchronize, / calls; wall: "
                f"the same with the synchronize; median of {args.reps} loops, variants interleaved; no flush"))


def report(res: dict) -> str:
    lines = [f"host time a call, back to back, {res['shape']} fp8 KV (paged: pages of {res['page_size']}), "
             f"torch.ops.mlagen: {res['registration']}, torch {res['torch']}, {res['device']}",
             f"{'variant':22s} {'host us':>8s} {'wall us':>8s} {'x empty':>8s} {'x aten':>8s}  target"]
    for k, v in res["us"].items():
        t = res["targets"].get(k)
        mark = f"<= {t['max_ratio']}: {'met' if t['met'] else 'NOT met'}" if t else ""
        lines.append(f"{k:22s} {v['host']:8.2f} {v['wall']:8.2f} {res['ratio_to_empty_op'][k]:8.2f} "
                     f"{res['ratio_to_dispatcher_op'][k]:8.2f}  {mark}")
    bad = [k for k, ok in res["outputs_equal"].items() if not ok]
    lines.append("outputs: " + ("every path equal to mlagen.decode's" if not bad else f"DIFFER: {', '.join(bad)}"))
    names = [f"{k} {v['name'] if v else None}" for k, v in res["kernels"].items()]
    lines.append("kernels: " + ", ".join(names))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="4x1024", help="BATCHxKV_LEN (default 4x1024)")
    p.add_argument("--calls", type=int, default=200, help="back-to-back calls a loop (default 200)")
    p.add_argument("--reps", type=int, default=50, help="loops a variant; the median is reported (default 50)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="write the JSON to FILE (no FILE: to stdout, the table to stderr)")
    args = p.parse_args(argv)
    args.shape = C.parse_shapes(args.shape)[0]
    try:
        import torch
    except ImportError:
        print("bench/host.py: needs torch and a CUDA GPU (torch is not installed)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench/host.py: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    res = measure(args)
    text = report(res)
    if args.json == "-":
        print(text, file=sys.stderr)
        print(json.dumps(C.json_clean(res), indent=1))
    else:
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(C.json_clean(res), f, indent=1)
    return 0 if all(res["outputs_equal"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
