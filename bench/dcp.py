#!/usr/bin/env python3
"""Decode context parallelism over N GPUs: the torchrun example, its check and its benchmark.

A batch's paged KV is split by pages over the N ranks (mlagen.dcp.shard: page j on rank j % N as
vLLM's DCP does, or each sequence's pages in N contiguous chunks); each rank decodes its share
with return_lse=True from a cache of its own pages only (dcp.compact / dcp.take_pages); the
partials are all-gathered (NCCL all_gather, one collective: dcp.gather_partials) and merged by
their LSE (dcp.merge_partials). One process a GPU.

    torchrun --standalone --nproc_per_node=2 bench/dcp.py --check [--out FILE]
    torchrun --standalone --nproc_per_node=N bench/dcp.py --bench [--out DIR]     # N = 1, 2, 4, 8
    python3 bench/dcp.py --plot DIR [--png DIR/dcp_scaling.png]                   # the N runs' JSON

    # the scaling run on a machine of 8 GPUs:
    for n in 1 2 4 8; do torchrun --standalone --nproc_per_node=$n bench/dcp.py --bench; done
    python3 bench/dcp.py --plot bench/results

--check: heads 16 and 128, fp8 and bf16 KV, q_len 1 and 2, round-robin and contiguous pages,
  sequences of --lens tokens (an empty one, one shorter than q_len, ones shorter than N pages:
  ranks with nothing of them). Each rank also decodes the whole cache on its own GPU (the
  single-GPU answer); the merged output must match it per (token, head) row within ROW_REL_L2
  relative L2 and its LSE within LSE_ABS, rows that see no key 0 with lse -inf in both, nothing
  NaN. Rank 0 prints one JSON line (and writes it to --out FILE); the exit status is 0 when
  every case passed, 1 otherwise, on every rank. Without torchrun it runs as one rank.
--bench: one decode step at the rank count it runs with (the rank's decode with LSE, the
  all_gather, the merge), for 1 x 256k, 512k and 1M tokens and 8 x 128k (--shapes), 128 and 16
  heads, fp8 and bf16 KV: CUDA events, L2 flushed before each step (the leaderboard's method,
  bench/NOTES.md), the step's time the slowest rank's, mean and median, the three phases;
  and the same step captured in a CUDA graph (the host's launch work out of it, as a serving
  engine runs decode). At N = 1 also the plain single-GPU decode (no LSE, no gather, no
  merge): the plot's baseline. Rank 0 writes DIR/dcp_n{N}.json.
--plot: latency and speedup against N from those files (matplotlib), DIR/dcp_scaling.png.

NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are set below before torch is imported (os.environ.setdefault; a launcher
should set them too, as tests/gpu/test_dcp.py does), and a run where one of them is set to
anything else stops before touching a GPU. Nothing here creates a multicast object.
"""
import os

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _name, _value in NO_MULTICAST.items():
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
QK, DV = 576, 512
SM_SCALE = QK ** -0.5
BAD_PAGE = 1 << 30  # what block-table entries past a sequence's pages hold: reading one flags it (NaN row)
# Per (token, head) row, merged against the single-GPU decode. Each of the two is within the
# kernel's own rounding of the exact attention on the same inputs: per row at most 4.3e-3 (fp8
# KV, warpgroup kernel, 256x8192) / 4.4e-3 (bf16 and mxfp4 paths), tests/tolerances.py;
# the merge adds the bf16 rounding of each partial (2^-9 relative an element, ~1.1e-3 rel-L2 a
# row) and computes in float32. 1e-2 covers their sum; a wrong page, length or mask gives ~1e-1.
ROW_REL_L2 = 1e-2
# The merged LSE against the single GPU's: both are float32 logs of sums of the same scores
# (the same q and KV bytes), differing in summation order only (~1e-6 at lse ~ 10). The bound.
LSE_ABS = 1e-4
CHECK_HEADS, CHECK_KV, CHECK_Q_LENS = "16,128", "fp8,bf16", "1,2"
LAYOUTS = "round_robin,contiguous"
CHECK_LENS = "0,1,100,3001,9037"
BENCH_SHAPES = "1x262144,1x524288,1x1048576,8x131072"
BENCH_HEADS, BENCH_KV = "128,16", "fp8,bf16"


def csv(text, kind=str):
    return [kind(x) for x in text.replace(" ", "").split(",") if x]


def shapes(text):
    out = []
    for item in csv(text):
        b, n = item.lower().split("x")
        out.append((int(b), int(n)))
    return out


def check_no_multicast():
    bad = {k: os.environ.get(k) for k, v in NO_MULTICAST.items() if os.environ.get(k) != v}
    if bad:
        raise SystemExit(f"bench/dcp.py: NVLink multicast must stay off: {bad} set; expected {NO_MULTICAST}")


def import_mlagen():
    try:
        import mlagen  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "runtime", "python"))
    import mlagen
    from mlagen import dcp, quant
    return mlagen, dcp, quant


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def init_dist():
    """(rank, world, device) from torchrun's environment (one rank without it), NCCL."""
    import torch
    import torch.distributed as dist
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if local >= torch.cuda.device_count():
        raise SystemExit(f"bench/dcp.py: local rank {local} but torch sees {torch.cuda.device_count()} GPUs")
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    try:
        dist.init_process_group("nccl", device_id=dev)
    except TypeError:  # a torch without device_id
        dist.init_process_group("nccl")
    return rank, world, dev


def git_commit():
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ----------------------------------------------------------------------------- inputs

def block_table(lens, page_size, seed, spare=3):
    """A global block table: each sequence's pages drawn from one shuffled pool (in random order
    in the cache), entries past them BAD_PAGE; returns (table int32 [B, width] on the CPU,
    num_pages)."""
    import torch
    rng = random.Random(seed)
    need = [-(-n // page_size) for n in lens]
    num_pages = sum(need) + spare
    pool = list(range(num_pages))
    rng.shuffle(pool)
    table = torch.full((len(lens), max(1, max(need))), BAD_PAGE, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        del pool[:n]
    return table, num_pages


def kv_entry(cache_bf16, fmt, quant):
    """decode()'s kv_data for one format from a bf16 cache [rows, 1, 576]."""
    if fmt == "bf16":
        return {"bf16": cache_bf16}
    if fmt == "fp8":
        return {"fp8": quant.quantize_fp8(cache_bf16)}
    raise SystemExit(f"--kv {fmt}: expected fp8 or bf16")


def local_share(dcp, torch, table, lens, page_size, world, rank, layout, q_len):
    """This rank's Shard and the pages of its own cache (at least one: an empty cache is not a
    valid kv tensor; with no page of its own a rank decodes empty sequences from it)."""
    sh = dcp.shard(table, lens, page_size, world, rank, layout, q_len=q_len, fill=BAD_PAGE)
    pages, local = dcp.compact(sh.page_table, sh.kv_lens, page_size, fill=BAD_PAGE)
    if pages.numel() == 0:
        pages = torch.zeros(1, dtype=torch.int64)
    return sh, pages, local


def compare(out, lse, ref_out, ref_lse):
    """(worst row relative L2, worst |lse - ref lse|, problems) of a merged result against the
    single-GPU one, over the (token, head) rows; rows that see no key (ref lse -inf) must be 0
    with lse -inf in both."""
    import torch
    o, r = out.double(), ref_out.double()
    live = torch.isfinite(ref_lse)
    problems = []
    if torch.isnan(o).any() or torch.isnan(lse).any():
        problems.append("NaN in the merged result")
    if torch.isnan(r).any() or torch.isnan(ref_lse).any():
        problems.append("NaN in the single-GPU result")
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)):
        problems.append("rows that see no key differ (lse -inf)")
    dead = ~live
    if (o[dead] != 0).any() or (r[dead] != 0).any():
        problems.append("a row that sees no key is not 0")
    if not live.any():
        return 0.0, 0.0, problems
    err = (o - r).norm(dim=-1) / r.norm(dim=-1).clamp(min=1e-30)
    row = err[live].max().item()
    lse_d = (lse.double() - ref_lse.double())[live].abs().max().item()
    if not row <= ROW_REL_L2:
        problems.append(f"row rel L2 {row:.3g} > {ROW_REL_L2}")
    if not lse_d <= LSE_ABS:
        problems.append(f"|lse diff| {lse_d:.3g} > {LSE_ABS}")
    return row, lse_d, problems


def agree_on_error(err, dev):
    """Every rank learns whether any rank failed its local part (so none waits in a collective
    the others skip): the ranks' messages, or [] when all went well."""
    import torch
    import torch.distributed as dist
    flag = torch.tensor([1 if err else 0], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not flag.item():
        return []
    msgs = [None] * dist.get_world_size()
    dist.all_gather_object(msgs, err)
    return [f"rank {i}: {m}" for i, m in enumerate(msgs) if m]


# ----------------------------------------------------------------------------- --check

def run_check(args):
    import torch
    import torch.distributed as dist
    mlagen, dcp, quant = import_mlagen()
    rank, world, dev = init_dist()
    lens, page_size = csv(args.lens, int), args.page_size
    table_cpu, num_pages = block_table(lens, page_size, args.seed)
    g = torch.Generator().manual_seed(args.seed)
    cache = torch.randn((num_pages * page_size, 1, QK), generator=g).to(torch.bfloat16).to(dev)
    table = table_cpu.to(dev)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    cases, all_ok = [], True
    for heads in csv(args.heads, int):
        for fmt in csv(args.kv):
            kv_full = kv_entry(cache, fmt, quant)
            for q_len in csv(args.q_lens, int):
                q = torch.randn((len(lens) * q_len, heads, QK), generator=g).to(torch.bfloat16).to(dev)
                config = dict(batch_size=len(lens), sm_scale=SM_SCALE, num_heads=heads, q_seq_len=q_len,
                              kv_seq_len=None)
                qo = (torch.arange(len(lens) + 1, dtype=torch.int32) * q_len).to(dev)
                for layout in csv(args.layouts):
                    case = dict(heads=heads, kv=fmt, q_len=q_len, layout=layout)
                    err, res = None, None
                    try:
                        ref = mlagen.decode(q, kv_full, qo, None, config, kv_format=fmt, page_table=table,
                                            page_size=page_size, kv_lens=lens_t, return_lse=True, q_len=q_len)
                        case["ref_kernel"] = (mlagen.last_kernel() or {}).get("name")
                        sh, pages, local = local_share(dcp, torch, table_cpu, lens, page_size, world, rank, layout,
                                                       q_len)
                        kv_local = dcp.take_pages(kv_full, pages.to(dev), page_size)
                        part = mlagen.decode(q, kv_local, sh.qo_indptr.to(dev), None, sh.config(config),
                                             kv_format=fmt, page_table=local.to(dev), page_size=page_size,
                                             kv_lens=sh.kv_lens.to(dev), return_lse=True, q_len=sh.q_len)
                        case["kernel"] = (mlagen.last_kernel() or {}).get("name")
                        mlagen.check_device_errors(dev)
                    except Exception as e:  # noqa: BLE001 - reported in the case, every rank agrees first
                        err = f"{type(e).__name__}: {e}"
                    errors = agree_on_error(err, dev)
                    if not errors:
                        out, lse = dcp.gather_merge(*part)
                        row, lse_d, problems = compare(out, lse, *ref)
                        worst = torch.tensor([row, lse_d, float(len(problems))], dtype=torch.float64, device=dev)
                        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank merged: the worst of them
                        row, lse_d, n_problems = worst.tolist()
                        case.update(row_rel_l2=row, lse_abs=lse_d, problems=problems,
                                    ok=n_problems == 0 and not problems)
                    else:
                        case.update(errors=errors, ok=False)
                    all_ok &= case["ok"]
                    cases.append(case)
                    if rank == 0 and args.verbose:
                        print(json.dumps(case), file=sys.stderr, flush=True)
            del kv_full
    result = dict(mode="check", ok=all_ok, world_size=world, page_size=page_size, lens=lens, seed=args.seed,
                  bounds=dict(row_rel_l2=ROW_REL_L2, lse_abs=LSE_ABS), cases=cases,
                  device=torch.cuda.get_device_name(dev), env={k: os.environ.get(k) for k in NO_MULTICAST},
                  commit=git_commit())
    if rank == 0:
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(line + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all_ok else 1


# ----------------------------------------------------------------------------- --bench

def summary(values):
    return dict(mean=statistics.fmean(values), median=statistics.median(values), min=min(values), n=len(values))


def time_eager(step, reps, warmup, flush, dev):
    """Per rep [decode, gather, merge, step] ms on this rank: step(events) records its phases."""
    import torch
    import torch.distributed as dist
    for _ in range(warmup):
        step(None)
    torch.cuda.synchronize(dev)
    rows = []
    for _ in range(reps):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        dist.barrier()
        if flush is not None:
            flush.zero_()
        step(ev)
        torch.cuda.synchronize(dev)
        rows.append([ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2]), ev[2].elapsed_time(ev[3]),
                     ev[0].elapsed_time(ev[3])])
    return rows


def capture_graph(step, warmup, dev):
    """The step captured in a CUDA graph (NCCL's all_gather included), after warm-up calls on
    the capture's own queue (where the plans make their scratch for it)."""
    import torch
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 2)):
            step(None)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step(None)
    torch.cuda.synchronize(dev)
    return graph


def time_graph(graph, reps, warmup, flush, dev):
    """Per rep [step] ms of the graph's replay on this rank."""
    import torch
    import torch.distributed as dist
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize(dev)
    rows = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        if flush is not None:
            flush.zero_()
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize(dev)
        rows.append([e0.elapsed_time(e1)])
    return rows


def slowest(rows, dev, world):
    """Every rank's per-rep rows gathered; per rep the row of the rank whose step (last column)
    took longest."""
    import torch
    import torch.distributed as dist
    mine = torch.tensor(rows, dtype=torch.float64, device=dev)
    every = torch.empty((world * mine.shape[0],) + tuple(mine.shape[1:]), dtype=mine.dtype, device=dev)
    dist.all_gather_into_tensor(every, mine)  # the ranks' rows one after the other
    every = every.view((world,) + tuple(mine.shape))
    pick = every[..., -1].argmax(dim=0)  # [reps]
    return every[pick, torch.arange(mine.shape[0], device=dev)].tolist()


def run_bench(args):
    import torch
    import torch.distributed as dist
    mlagen, dcp, quant = import_mlagen()
    rank, world, dev = init_dist()
    page_size = args.page_size
    flush = torch.empty(args.flush_mb << 20, dtype=torch.uint8, device=dev) if args.flush_mb else None
    cases = []
    for batch, kv_len in shapes(args.shapes):
        lens = [kv_len] * batch
        table, _ = block_table(lens, page_size, args.seed + kv_len + batch, spare=0)
        for fmt in csv(args.kv):
            sh, pages, local = local_share(dcp, torch, table, lens, page_size, world, rank, args.layout, 1)
            local, kv_lens, qo = local.to(dev), sh.kv_lens.to(dev), sh.qo_indptr.to(dev)
            gen = torch.Generator(device=dev).manual_seed(args.seed + 7919 * rank)
            cache = torch.randn((pages.numel() * page_size, 1, QK), generator=gen, device=dev).to(torch.bfloat16)
            kv_data = kv_entry(cache, fmt, quant)
            del cache
            for heads in csv(args.heads, int):
                case = dict(shape=f"{batch}x{kv_len}", batch=batch, kv_len=kv_len, heads=heads, kv=fmt,
                            layout=args.layout, local_tokens=None)
                q = torch.randn((batch, heads, QK), generator=torch.Generator().manual_seed(args.seed + heads))
                q = q.to(torch.bfloat16).to(dev)
                config = sh.config(dict(batch_size=batch, sm_scale=SM_SCALE, num_heads=heads, q_seq_len=1,
                                        kv_seq_len=kv_len))
                held = {}

                def step(ev):
                    if ev:
                        ev[0].record()
                    part = mlagen.decode(q, kv_data, qo, None, config, kv_format=fmt, page_table=local,
                                         page_size=page_size, kv_lens=kv_lens, return_lse=True, q_len=1)
                    if ev:
                        ev[1].record()
                    outs, lses = dcp.gather_partials(*part)
                    if ev:
                        ev[2].record()
                    held["res"] = dcp.merge_partials(outs, lses)
                    if ev:
                        ev[3].record()
                    return held["res"]

                err = None
                try:
                    step(None)
                    case["kernel"] = (mlagen.last_kernel() or {}).get("name")
                    mlagen.check_device_errors(dev)
                except Exception as e:  # noqa: BLE001
                    err = f"{type(e).__name__}: {e}"
                errors = agree_on_error(err, dev)
                if errors:
                    case["errors"] = errors
                    cases.append(case)
                    continue
                toks = [None] * world
                dist.all_gather_object(toks, int(sh.kv_lens.sum()))
                case["local_tokens"] = toks
                out, lse = held["res"]
                case["finite"] = bool(torch.isfinite(out.float()).all() and torch.isfinite(lse).all())
                rows = slowest(time_eager(step, args.reps, args.warmup, flush, dev), dev, world)
                case["step_us"] = summary([1e3 * r[3] for r in rows])
                case["phases_us"] = {name: summary([1e3 * r[i] for r in rows])["median"]
                                     for i, name in enumerate(("decode", "gather", "merge"))}
                if args.graph:
                    graph, err = None, None
                    try:
                        graph = capture_graph(step, args.warmup, dev)
                    except Exception as e:  # noqa: BLE001 - recorded; the eager numbers stand
                        err = f"{type(e).__name__}: {e}"
                    errors = agree_on_error(err, dev)
                    if errors:
                        case["graph_error"] = errors
                    else:
                        grows = slowest(time_graph(graph, args.reps, args.warmup, flush, dev), dev, world)
                        case["graph_us"] = summary([1e3 * r[0] for r in grows])
                    del graph
                if world == 1:  # the single GPU's own decode: no LSE, nothing to gather or merge
                    def plain(ev):
                        if ev:
                            ev[0].record()
                        mlagen.decode(q, kv_data, qo, None, config, kv_format=fmt, page_table=local,
                                      page_size=page_size, kv_lens=kv_lens, q_len=1)
                        if ev:
                            for e in ev[1:]:
                                e.record()
                    prow = time_eager(plain, args.reps, args.warmup, flush, dev)
                    case["plain_kernel"] = (mlagen.last_kernel() or {}).get("name")
                    case["plain_us"] = summary([1e3 * r[3] for r in prow])
                cases.append(case)
                if rank == 0:
                    print(f"N={world} {case['shape']} h{heads} {fmt}: step {case['step_us']['median']:.1f} us "
                          f"(decode {case['phases_us']['decode']:.1f}, gather {case['phases_us']['gather']:.1f}, "
                          f"merge {case['phases_us']['merge']:.1f})"
                          + (f", graph {case['graph_us']['median']:.1f}" if "graph_us" in case else "")
                          + (f", plain {case['plain_us']['median']:.1f}" if "plain_us" in case else ""), flush=True)
            del kv_data
            torch.cuda.empty_cache()
    result = dict(mode="bench", world_size=world, page_size=page_size, layout=args.layout, reps=args.reps,
                  warmup=args.warmup, flush_mb=args.flush_mb, cases=cases, device=torch.cuda.get_device_name(dev),
                  env={k: os.environ.get(k) for k in NO_MULTICAST}, commit=git_commit(),
                  mlagen=mlagen.fingerprint(), utc=datetime.datetime.now(datetime.timezone.utc).isoformat())
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"dcp_n{world}.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all("errors" not in c for c in cases) else 1


# ----------------------------------------------------------------------------- --plot

def load_runs(paths):
    files = []
    for p in paths:
        files += sorted(glob.glob(os.path.join(p, "dcp_n*.json"))) if os.path.isdir(p) else [p]
    runs = {}
    for path in files:
        with open(path) as f:
            data = json.load(f)
        if data.get("mode") == "bench":
            runs[int(data["world_size"])] = data
    if not runs:
        raise SystemExit(f"--plot: no bench JSON (dcp_n*.json) in {paths}")
    return runs


def scaling_table(runs):
    """{(shape, heads, kv): {"baseline": us, "eager": {N: us}, "graph": {N: us}}} (medians);
    the baseline is N = 1's plain decode, else its step."""
    table = {}
    for n, data in sorted(runs.items()):
        for c in data["cases"]:
            if "step_us" not in c:
                continue
            s = table.setdefault((c["shape"], c["heads"], c["kv"]), {"baseline": None, "eager": {}, "graph": {}})
            s["eager"][n] = c["step_us"]["median"]
            if "graph_us" in c:
                s["graph"][n] = c["graph_us"]["median"]
            if n == 1:
                s["baseline"] = (c.get("plain_us") or c["step_us"])["median"]
    return table


def run_plot(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load_runs(args.plot)
    table = scaling_table(runs)
    ns = sorted(runs)
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(13, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((shape, heads, kv), s) in enumerate(sorted(table.items())):
        color = colors[i % len(colors)]
        label = f"{shape} h{heads} {kv}"
        for mode, style in (("eager", "-"), ("graph", "--")):
            pts = sorted(s[mode].items())
            if not pts:
                continue
            ax_t.plot([n for n, _ in pts], [v for _, v in pts], style, marker="o", color=color,
                      label=label + (" (graph)" if mode == "graph" else ""))
            if s["baseline"]:
                ax_s.plot([n for n, _ in pts], [s["baseline"] / v for _, v in pts], style, marker="o", color=color,
                          label=label + (" (graph)" if mode == "graph" else ""))
    ax_s.plot(ns, ns, ":", color="gray", label="ideal (N x)")
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("GPUs (N)")
        ax.grid(alpha=0.3, which="both")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("one decode step (decode + all_gather + merge), us")
    ax_s.set_ylabel("speedup over one GPU's plain decode")
    any_run = runs[ns[0]]
    ax_t.set_title(f"mlagen DCP, {any_run.get('device')}, pages of {any_run.get('page_size')}, "
                   f"{any_run.get('layout')}: median of the slowest rank, L2 flushed", fontsize=10)
    ax_s.set_title("solid: eager calls; dashed: the step as a CUDA graph", fontsize=10)
    ax_s.legend(fontsize=7, loc="upper left", ncol=1)
    fig.tight_layout()
    png = args.png or os.path.join(args.plot[0] if os.path.isdir(args.plot[0]) else
                                   os.path.dirname(os.path.abspath(args.plot[0])), "dcp_scaling.png")
    fig.savefig(png, dpi=120)
    plt.close(fig)
    print(f"wrote {png}")
    return 0


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Modes: --check, --bench (under torchrun), --plot. See the module docstring.")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="merged N-GPU decode == one GPU's (JSON line on rank 0)")
    mode.add_argument("--bench", action="store_true", help="time one decode step at this rank count")
    mode.add_argument("--plot", nargs="+", metavar="JSON_OR_DIR", help="draw the scaling PNG from dcp_n*.json files")
    ap.add_argument("--out", help="--check: a file for the JSON line; --bench: the folder for dcp_n{N}.json "
                                  "(default bench/results)")
    ap.add_argument("--png", help="--plot: the PNG (default dcp_scaling.png beside the JSON)")
    ap.add_argument("--heads", help=f"query heads (--check default {CHECK_HEADS}, --bench {BENCH_HEADS})")
    ap.add_argument("--kv", help=f"KV formats (--check default {CHECK_KV}, --bench {BENCH_KV})")
    ap.add_argument("--q-lens", default=CHECK_Q_LENS, help=f"--check: query tokens a sequence (default {CHECK_Q_LENS})")
    ap.add_argument("--layouts", default=LAYOUTS, help=f"--check: page layouts (default {LAYOUTS})")
    ap.add_argument("--layout", default="round_robin", choices=("round_robin", "contiguous"), help="--bench: layout")
    ap.add_argument("--lens", default=CHECK_LENS, help=f"--check: sequence lengths (default {CHECK_LENS})")
    ap.add_argument("--shapes", default=BENCH_SHAPES, help=f"--bench: BATCHxKV_LEN list (default {BENCH_SHAPES})")
    ap.add_argument("--page-size", type=int, default=64, help="the cache's page size (default 64)")
    ap.add_argument("--reps", type=int, default=50, help="--bench: timed steps (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="--bench: untimed steps first (default 5)")
    ap.add_argument("--flush-mb", type=int, default=512, help="--bench: L2 flush buffer zeroed before each step, "
                                                              "MiB (0: none; default 512)")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="--bench: skip the CUDA-graph timing")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--verbose", action="store_true", help="--check: each case on stderr as it finishes")
    args = ap.parse_args(argv)
    if args.heads is None:
        args.heads = CHECK_HEADS if args.check else BENCH_HEADS
    if args.kv is None:
        args.kv = CHECK_KV if args.check else BENCH_KV
    if args.bench and not args.out:
        args.out = os.path.join(REPO, "bench", "results")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.plot:
        return run_plot(args)
    check_no_multicast()
    return run_check(args) if args.check else run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
