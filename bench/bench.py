#!/usr/bin/env python3
"""Benchmark mlagen's MLA decode against its peers, timed the leaderboard's way.

    python bench/bench.py --out bench/results [--shapes 4x1024,32x8192] [--reps 60]

For each (batch, kv_len) shape: build inputs the task's way (bf16 standard normal q and
KV, per-tensor fp8 e4m3fn KV), check mlagen against a float32 reference on the
dequantized fp8 KV (relative L2 < --tol, else the row is FAILED), then time side by side,
interleaved repetition by repetition:
  mlagen   mlagen.decode(q, kv_data, qo_indptr, kv_indptr, config), the whole Python call
  seed     the seed's Triton kernels through SeedPeer (.peers/ or /work/shared/peers/)
  bmm      torch bmm on the bf16 KV (the leaderboard entry's fallback)
and the fp8 bound = bytes / copy bandwidth, the copy measured in the same run.
Each repetition: synchronize, flush L2 (zero a 512 MiB buffer), record an event, one
call, record an event, synchronize. Median and mean over --reps, after --warmup calls,
rotating among --sets input sets. Writes <out>/bench_<UTC>.json, <out>/latest.json and
<out>/latest.png. See bench/NOTES.md.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _common as C  # noqa: E402

COLUMNS = ("mlagen", "seed", "bmm")


def err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:4000]


def log(*a) -> None:
    print(*a, flush=True)


def stats(times: list[float]) -> dict | None:
    if not times:
        return None
    s = sorted(times)
    n = len(s)

    def pct(p):
        return s[min(n - 1, max(0, int(round(p * (n - 1)))))]

    return dict(median_us=statistics.median(s), mean_us=statistics.fmean(s), min_us=s[0], max_us=s[-1],
                p10_us=pct(0.10), p90_us=pct(0.90), stdev_us=statistics.stdev(s) if n > 1 else 0.0, n=n)


def geomean(vals) -> float | None:
    vals = [v for v in vals if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------

class Timer:
    """The leaderboard's method: sync, flush L2, event, ONE call, event, sync."""

    def __init__(self, torch, device, flush_bytes: int, hold_us: float = 0.0):
        """hold_us > 0: after each flush the stream also sleeps that long on the device (no memory
        touched, so the L2 is as the flush left it), so that a call whose host path is slower than
        the flush alone is still launched before its start event fires: the events then time the
        device's work, not the host's (a comparison of kernels; the leaderboard's method is 0)."""
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.flush_bytes = flush_bytes
        self.flush = torch.empty(flush_bytes // 4, dtype=torch.float32, device=device)
        self.hold_us = hold_us if self.cuda else 0.0
        self._hold_cycles = None

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _device_us(self, fn) -> float:
        """Microseconds between events around fn's launches (synchronized before and after)."""
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3

    def _cycles_for_hold(self) -> int:
        """torch.cuda._sleep's cycles for hold_us, from one timed sleep."""
        n = 1 << 20
        self._device_us(lambda: self.torch.cuda._sleep(n))  # warm
        return max(1, int(n * self.hold_us / self._device_us(lambda: self.torch.cuda._sleep(n))))

    def flush_l2(self) -> None:
        """The leaderboard's flush: write a buffer much larger than the L2 (then the hold, if any)."""
        self.flush.zero_()
        if self.hold_us:
            if self._hold_cycles is None:
                self._hold_cycles = self._cycles_for_hold()
            self.torch.cuda._sleep(self._hold_cycles)

    def once(self, fn) -> float:
        """Microseconds for one call of fn, L2 cold."""
        return self.once_detail(fn)[0]

    def once_detail(self, fn) -> tuple[float, float, float]:
        """once(fn), and beside it the host's side of the same repetition: (event us, the host clock
        over the Python call, the host clock from the flush's launch to the call's return). The
        events start when the flush ends on the device, so a call whose launch comes later than that
        (a slow host path, or one that waits for the device) is timed with the gap in it: compare the
        third figure with the flush's own device time."""
        if not self.cuda:
            t0 = time.perf_counter()
            self.flush_l2()
            t1 = time.perf_counter()
            fn()
            t2 = time.perf_counter()
            return (t2 - t1) * 1e6, (t2 - t1) * 1e6, (t2 - t0) * 1e6
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self.flush_l2()
        start.record()
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3, (t2 - t1) * 1e6, (t2 - t0) * 1e6

    def flush_device_us(self, n: int = 5) -> float:
        """The flush's own device time with its hold (median of n): how much host time a timed call
        can hide."""
        if not self.cuda:
            return 0.0
        return statistics.median(self._device_us(self.flush_l2) for _ in range(n))

    def back_to_back_events(self, fn, n: int) -> float:
        """Microseconds per call for n calls in a row, no flush, events around all of them."""
        if not self.cuda:
            return self.wall(fn, n)

        def calls():
            for _ in range(n):
                fn()
        return self._device_us(calls) / n

    def wall(self, fn, n: int) -> float:
        """Microseconds per call by the host clock over n calls, synchronizing only at the end."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        self.sync()
        return (time.perf_counter() - t0) * 1e6 / n


def measure_copy(torch, timer: Timer, nbytes: int, reps: int, warmup: int = 3) -> dict:
    """Device-to-device copy bandwidth: (bytes read + bytes written) / time, median of reps."""
    device = timer.device
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(warmup + reps):
        if timer.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            dst.copy_(src)
            end.record()
            torch.cuda.synchronize()
            t = start.elapsed_time(end) * 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            t = (time.perf_counter() - t0) * 1e6
        if i >= warmup:
            times.append(t)
    ok = bool(torch.equal(src[: 1 << 20], dst[: 1 << 20]))
    del src, dst
    st = stats(times)
    moved = 2 * nbytes
    return dict(bytes_copied=nbytes, bytes_moved=moved, tbps=moved / (st["median_us"] * 1e-6) / 1e12,
                tbps_best=moved / (st["min_us"] * 1e-6) / 1e12, verified=ok, times=st,
                method="dst.copy_(src), uint8, CUDA events around each copy; TB/s = (read + written) / median")


# --------------------------------------------------------------------------------------
# peers
# --------------------------------------------------------------------------------------

def import_mlagen(cpu_smoke: bool):
    if cpu_smoke:
        return FakeMlagen(), None
    try:
        C.ensure_mlagen_importable()
        import mlagen
        mlagen.fingerprint()  # loads the library
        return mlagen, None
    except Exception as e:  # noqa: BLE001
        return None, err_text(e)


def import_seed_peer():
    """SeedPeer from <repo>/.peers, else /work/shared/peers. Returns (peer, path, error)."""
    candidates = [os.path.join(C.REPO, ".peers"), "/work/shared/peers"]
    errors = []
    for path in candidates:
        if not os.path.isfile(os.path.join(path, "seed_peer.py")):
            errors.append(f"{path}: no seed_peer.py")
            continue
        sys.path.insert(0, path)
        try:
            sys.modules.pop("seed_peer", None)
            import seed_peer  # noqa: F401
            peer = seed_peer.SeedPeer()
            return peer, path, None
        except Exception as e:  # noqa: BLE001
            errors.append(f"{path}: {err_text(e)}")
        finally:
            try:
                sys.path.remove(path)
            except ValueError:
                pass
    return None, None, "; ".join(errors)


class FakeMlagen:
    """Stands in for mlagen in --cpu-smoke: the float32 reference, rounded to bf16."""

    class _Plan:
        def __init__(self, fake):
            self.fake = fake

        def run(self, q, q_scale, kv, kv_scale, qo_indptr, kv_indptr, out, stream):
            out.copy_(self.fake._compute(q, kv, kv_scale, kv_indptr))

    def __init__(self):
        self._last = None

    def _compute(self, q, kv, scale, kv_indptr):
        import torch
        ptr = [int(x) for x in kv_indptr.tolist()]
        lengths = [b - a for a, b in zip(ptr, ptr[1:])]
        uniform = len(set(lengths)) == 1
        inp = dict(q=q, kv_fp8=kv, scale=scale, batch=q.shape[0], uniform=uniform,
                   kv_len=lengths[0] if uniform else 0, kv_indptr_host=ptr, kv_indptr=kv_indptr,
                   qo_indptr=torch.arange(q.shape[0] + 1, dtype=torch.int32))
        return C.reference_fp8(inp).to(torch.bfloat16)

    def decode(self, q, kv_data, qo_indptr, kv_indptr, config, **kw):
        kv, scale = kv_data["fp8"]
        self._last = {"name": "cpu_smoke_reference", "generic": not config.get("kv_seq_len"), "splits": 1}
        return self._compute(q, kv, scale, kv_indptr)

    def prepare(self, q, kv, kv_scale, qo_indptr, kv_indptr, config, **kw):
        return self._Plan(self)

    def last_kernel(self):
        return self._last

    def fingerprint(self):
        return "cpu-smoke"

    def library_path(self):
        return None

    def check_device_errors(self, device=None):
        return None


# --------------------------------------------------------------------------------------
# one shape
# --------------------------------------------------------------------------------------

class Ctx:
    pass


def bench_shape(ctx, index: int, batch: int, kv_len: int) -> dict:
    torch, timer, args = ctx.torch, ctx.timer, ctx.args
    name = C.shape_name(batch, kv_len)
    nbytes = C.fp8_bytes(batch, kv_len)
    row = dict(shape=name, batch=batch, kv_len=kv_len, bytes=nbytes,
               bound_us=nbytes / (ctx.copy_tbps * 1e12) * 1e6 if ctx.copy_tbps else None,
               status="n/a", kernel=None, kernel_info=None,
               mlagen={}, seed={}, bmm={}, eff_bw_tbps=None, pct_of_copy=None,
               speedup_vs_seed=None, speedup_vs_bmm=None, errors=[])
    anc = C.ANCHORS_US.get((batch, kv_len))
    if anc:
        row["anchor"] = dict(bmm_us=anc[0], seed_us=anc[1], seed_variant=anc[2], flashmla_us=anc[3])
    t_shape = time.perf_counter()

    # ---- inputs
    try:
        # the bf16 KV: for torch bmm, and as what the bf16 / mxfp4 columns run on (mxfp4 is
        # quantized from it): without it, `--no-bmm --formats mxfp4` had nothing to quantize
        need_bf16 = not args.no_bmm or any(f in ("bf16", "mxfp4") for f, _ in ctx.extra_formats)
        sets = [C.make_inputs(batch, kv_len, seed=args.seed + 1000 * index + i, device=ctx.device,
                              keep_bf16=need_bf16)
                for i in range(args.sets)]
        timer.sync()
    except Exception as e:  # noqa: BLE001
        row["status"] = "ERROR"
        row["errors"].append(f"inputs: {err_text(e)}")
        log(f"[{name}] inputs failed: {err_text(e)}")
        return row

    refs: dict[int, object] = {}

    def ref(i):
        if i not in refs:
            refs[i] = C.reference_fp8(sets[i])
        return refs[i]

    fns: dict[str, list] = {}

    # ---- (a) mlagen: check on every input set, then time
    if ctx.mlagen is not None:
        col = row["mlagen"]
        try:
            errs = []
            for i, s in enumerate(sets):
                out = ctx.mlagen.decode(s["q"], s["kv_data"], s["qo_indptr"], s["kv_indptr"], s["config"],
                                        **ctx.decode_kwargs)
                timer.sync()
                errs.append(C.rel_l2(out, ref(i)))
                del out
            info = ctx.mlagen.last_kernel()
            if timer.cuda:
                ctx.mlagen.check_device_errors()
            row["kernel_info"] = info
            row["kernel"] = info.get("name") if isinstance(info, dict) else None
            col["rel_err"] = max(errs)
            col["rel_err_per_set"] = errs
            ok = all(e < args.tol for e in errs)
            row["status"] = "ok" if ok else "FAILED"
            if not ok:
                row["errors"].append(f"mlagen: relative L2 error {max(errs):.3g} >= {args.tol:g}")
            if ok or not args.skip_failed:
                fns["mlagen"] = [functools.partial(ctx.mlagen.decode, s["q"], s["kv_data"], s["qo_indptr"],
                                                   s["kv_indptr"], s["config"], **ctx.decode_kwargs)
                                 for s in sets]
        except Exception as e:  # noqa: BLE001
            row["status"] = "ERROR"
            col["error"] = err_text(e)
            row["errors"].append(f"mlagen: {err_text(e)}")
            log(f"[{name}] mlagen failed: {err_text(e)}")
            if args.verbose:
                traceback.print_exc()
    else:
        row["mlagen"]["error"] = ctx.mlagen_error

    # ---- (a2) mlagen's other formats (issue 4), each checked against float32 attention on
    # the values it computes with (its own dequantized KV / q), then timed in the same run
    for fmt, q_dtype in ctx.extra_formats if ctx.mlagen is not None and timer.cuda else ():
        cname = format_column(fmt, q_dtype)
        col = row.setdefault(cname, {})
        try:
            errs = []
            # "fp8s": an fp8 q the caller quantized (the recipe's q8 and scale, made outside the
            # timed call), passed with its q_scale; "fp8": a bf16 q quantized in the call
            qd = "fp8" if q_dtype == "fp8s" else q_dtype
            from mlagen import quant

            def q_and_kw(s):
                if q_dtype != "fp8s":
                    return s["q"], {}
                q8, qs = quant.quantize_q_fp8(s["q"])
                return q8, {"q_scale": qs}
            q_kw = [q_and_kw(s) for s in sets]
            for s, (q_in, kw) in zip(sets, q_kw):
                ref32 = C.reference_as_seen(s, fmt, qd)
                out = ctx.mlagen.decode(q_in, s["kv_data"], s["qo_indptr"], s["kv_indptr"], s["config"],
                                        kv_format=fmt, q_dtype=qd, **kw)
                timer.sync()
                errs.append(C.rel_l2(out, ref32))
                del out, ref32
            col["kernel"] = ctx.mlagen.last_kernel().get("name")
            col["rel_err"] = max(errs)
            if max(errs) >= args.tol:
                row["errors"].append(f"{cname}: relative L2 error {max(errs):.3g} >= {args.tol:g}")
                col["error"] = "check failed"
            else:
                fns[cname] = [functools.partial(ctx.mlagen.decode, q_in, s["kv_data"], s["qo_indptr"],
                                                s["kv_indptr"], s["config"], kv_format=fmt, q_dtype=qd, **kw)
                              for s, (q_in, kw) in zip(sets, q_kw)]
        except Exception as e:  # noqa: BLE001
            col["error"] = err_text(e)
            row["errors"].append(f"{cname}: {err_text(e)}")
            log(f"[{name}] {cname} failed: {err_text(e)}")
            if args.verbose:
                traceback.print_exc()

    # ---- (c) the seed's Triton kernels; the variant pick runs here, outside the timed region
    if ctx.peer is not None:
        col = row["seed"]
        try:
            s0 = sets[0]
            key = (batch, kv_len)
            if args.seed_pick == "anchors" and anc and key not in ctx.peer.best:
                ctx.peer.best[key] = anc[2]
            t0 = time.perf_counter()
            out = ctx.peer(s0["q"], s0["kv_fp8"], s0["scale"], batch, kv_len)
            timer.sync()
            col["pick_s"] = time.perf_counter() - t0
            col["variant"] = ctx.peer.best.get(key)
            col["rel_err_vs_fp8_ref"] = C.rel_l2(out, ref(0))
            del out
            fns["seed"] = [functools.partial(ctx.peer, s["q"], s["kv_fp8"], s["scale"], batch, kv_len)
                           for s in sets]
        except Exception as e:  # noqa: BLE001
            col["error"] = err_text(e)
            log(f"[{name}] seed peer failed: {err_text(e)}")
            if args.verbose:
                traceback.print_exc()
    elif not args.no_seed:
        row["seed"]["error"] = ctx.peer_error

    # ---- (b) torch bmm on the bf16 KV
    if not args.no_bmm:
        col = row["bmm"]
        try:
            s0 = sets[0]
            out = C.bmm_reference_bf16(s0["q"], s0["kv_bf16"], batch, kv_len)
            timer.sync()
            col["rel_err_vs_fp8_ref"] = C.rel_l2(out, ref(0))
            del out
            fns["bmm"] = [functools.partial(C.bmm_reference_bf16, s["q"], s["kv_bf16"], batch, kv_len)
                          for s in sets]
        except Exception as e:  # noqa: BLE001
            col["error"] = err_text(e)
            log(f"[{name}] bmm failed: {err_text(e)}")

    refs.clear()

    # ---- warm-up, then interleaved timing
    for cname in list(fns):
        try:
            for w in range(args.warmup):
                timer.once(fns[cname][w % len(sets)])
        except Exception as e:  # noqa: BLE001
            row[cname]["error"] = f"warm-up: {err_text(e)}"
            log(f"[{name}] {cname} warm-up failed: {err_text(e)}")
            del fns[cname]
    times: dict[str, list[float]] = {c: [] for c in fns}
    for r in range(args.reps):
        for cname in list(fns):
            try:
                times[cname].append(timer.once(fns[cname][r % len(sets)]))
            except Exception as e:  # noqa: BLE001
                row[cname]["error"] = f"timed call {r}: {err_text(e)}"
                log(f"[{name}] {cname} timed call failed: {err_text(e)}")
                del fns[cname]
    for cname, ts in times.items():
        st = stats(ts)
        if st:
            row[cname].update(st)
            row[cname]["times_us"] = [round(t, 3) for t in ts]

    # ---- derived figures
    for fmt, q_dtype in ctx.extra_formats:
        col = row.get(format_column(fmt, q_dtype), {})
        if col.get("median_us"):
            col["bytes"] = C.format_bytes(batch, kv_len, fmt)
            col["eff_bw_tbps"] = col["bytes"] / (col["median_us"] * 1e-6) / 1e12
            if ctx.copy_tbps:
                col["pct_of_copy"] = 100.0 * col["eff_bw_tbps"] / ctx.copy_tbps
    m = row["mlagen"].get("median_us")
    if m:
        row["eff_bw_tbps"] = nbytes / (m * 1e-6) / 1e12
        if ctx.copy_tbps:
            row["pct_of_copy"] = 100.0 * row["eff_bw_tbps"] / ctx.copy_tbps
        for peer_name, key in (("seed", "speedup_vs_seed"), ("bmm", "speedup_vs_bmm")):
            p = row[peer_name].get("median_us")
            if p:
                row[key] = p / m
    row["wall_s"] = time.perf_counter() - t_shape

    del sets, fns
    if timer.cuda:
        torch.cuda.empty_cache()
    log(shape_line(row))
    return row


def format_column(fmt_name: str, q_dtype: str) -> str:
    # fp8 KV with bf16 q is the main column (leaderboard entry); as an extra column it is the
    # same kernel through decode(), the call the fp8-q columns make (for a like-for-like ratio)
    return f"mlagen_{fmt_name}" + {"fp8": "_q8", "fp8s": "_q8s"}.get(q_dtype, "_decode" if fmt_name == "fp8" else "")


def fmt(x, spec=".1f", na="n/a"):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return na
    return format(x, spec)


def shape_line(row: dict) -> str:
    m, s, b = row["mlagen"], row["seed"], row["bmm"]
    parts = [f"[{row['shape']}] {row['status']}",
             f"kernel={row['kernel'] or 'n/a'}",
             f"mlagen med/mean={fmt(m.get('median_us'))}/{fmt(m.get('mean_us'))} us",
             f"err={fmt(m.get('rel_err'), '.2e')}",
             f"seed({s.get('variant') or 'n/a'})={fmt(s.get('median_us'))}/{fmt(s.get('mean_us'))} us",
             f"bmm={fmt(b.get('median_us'))}/{fmt(b.get('mean_us'))} us",
             f"bound={fmt(row['bound_us'])} us",
             f"bytes={row['bytes']}",
             f"{fmt(row['eff_bw_tbps'], '.2f')} TB/s ({fmt(row['pct_of_copy'])}% of copy)",
             f"x seed={fmt(row['speedup_vs_seed'], '.2f')} x bmm={fmt(row['speedup_vs_bmm'], '.2f')}"]
    return "  ".join(parts)


# --------------------------------------------------------------------------------------
# host overhead
# --------------------------------------------------------------------------------------

def host_overhead(ctx, batch: int, kv_len: int) -> dict:
    """Python-call overhead on one (small) shape: the leaderboard-timed decode, the same for
    the prepared plan's lower layer (Plan.run with a preallocated output), an empty call,
    and per-call host cost from back-to-back calls (events, and host wall clock)."""
    torch, timer, args = ctx.torch, ctx.timer, ctx.args
    res = dict(shape=C.shape_name(batch, kv_len))
    inp = C.make_inputs(batch, kv_len, seed=args.seed + 999_999, device=ctx.device, keep_bf16=False)
    mg = ctx.mlagen
    decode = functools.partial(mg.decode, inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"],
                               inp["config"], **ctx.decode_kwargs)
    ref_out = decode()
    plan = mg.prepare(inp["q"], inp["kv_fp8"], inp["scale"], inp["qo_indptr"], inp["kv_indptr"], inp["config"],
                      **ctx.decode_kwargs)
    out = torch.empty((batch, C.NUM_HEADS, C.V_DIM), dtype=torch.bfloat16, device=ctx.device)
    stream = torch.cuda.current_stream(ctx.device).cuda_stream if timer.cuda else 0
    run = functools.partial(plan.run, inp["q"], None, inp["kv_fp8"], inp["scale"], inp["qo_indptr"], inp["kv_indptr"],
                            out, stream)
    run()
    timer.sync()
    res["plan_run_matches_decode"] = bool(torch.equal(out, ref_out))

    def lb(fn):
        for _ in range(args.warmup):
            timer.once(fn)
        return stats([timer.once(fn) for _ in range(args.reps)])

    def nothing():
        return None

    res["empty_call_leaderboard"] = lb(nothing)
    res["decode_leaderboard"] = lb(decode)
    res["plan_run_leaderboard"] = lb(run)
    n_ev, n_wall = args.b2b_calls, args.wall_calls
    for label, fn in (("decode", decode), ("plan_run", run)):
        fn()
        res[f"{label}_b2b_events_us_per_call"] = statistics.median(
            [timer.back_to_back_events(fn, n_ev) for _ in range(5)])
        res[f"{label}_wall_us_per_call"] = statistics.median([timer.wall(fn, n_wall) for _ in range(3)])
    res["python_layer_wall_us"] = res["decode_wall_us_per_call"] - res["plan_run_wall_us_per_call"]
    res["summary"] = dict(
        leaderboard_median_us=res["decode_leaderboard"]["median_us"],
        leaderboard_plan_run_median_us=res["plan_run_leaderboard"]["median_us"],
        leaderboard_empty_call_median_us=res["empty_call_leaderboard"]["median_us"],
        per_call_wall_us=res["decode_wall_us_per_call"],
        per_call_b2b_events_us=res["decode_b2b_events_us_per_call"],
        python_layer_wall_us=res["python_layer_wall_us"])
    res["method"] = (f"leaderboard: median of {args.reps} flushed single calls; b2b_events: CUDA events around "
                     f"{n_ev} back-to-back calls (median of 5) / {n_ev}; wall: perf_counter over {n_wall} calls "
                     f"with one synchronize at the end (median of 3) / {n_wall}; python_layer = decode wall - "
                     f"Plan.run wall (Plan.run: preallocated output, prepared problem)")
    del inp, out, ref_out
    return res


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------

def device_info(torch, device) -> dict:
    info = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                host=platform.node())
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton"] = f"n/a ({err_text(e)[:200]})"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    sm_count=props.multi_processor_count, total_memory_gib=round(props.total_memory / 2**30, 1),
                    l2_bytes=getattr(props, "L2_cache_size", None))
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm,"
                                "power.draw,temperature.gpu,utilization.gpu", "--format=csv"],
                               capture_output=True, text=True, timeout=15)
            if q.returncode == 0:
                info["nvidia_smi"] = q.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    else:
        info["name"] = f"CPU ({platform.processor() or platform.machine()})"
    return info


def column_geomeans(rows: list[dict], n_shapes: int) -> dict:
    out = {}
    for cname in COLUMNS:
        vals = [r[cname].get("median_us") for r in rows]
        got = [v for v in vals if v]
        entry = dict(us=geomean(got), n=len(got), complete=len(got) == n_shapes)
        if cname == "mlagen":
            entry["all_ok"] = all(r["status"] == "ok" for r in rows) and len(rows) == n_shapes
        out[cname] = entry
        means = [r[cname].get("mean_us") for r in rows if r[cname].get("mean_us")]
        entry["mean_us_geomean"] = geomean(means)
    bounds = [r["bound_us"] for r in rows if r["bound_us"]]
    out["bound"] = dict(us=geomean(bounds), n=len(bounds), complete=len(bounds) == n_shapes)
    anchors = [r["anchor"]["flashmla_us"] for r in rows if r.get("anchor")]
    out["flashmla_anchor"] = dict(us=geomean(anchors), n=len(anchors), complete=len(anchors) == n_shapes)
    # geomean of per-shape speedups, over the shapes both columns have
    for peer, key in (("seed", "speedup_vs_seed"), ("bmm", "speedup_vs_bmm")):
        pairs = [(r["mlagen"].get("median_us"), r[peer].get("median_us")) for r in rows]
        pairs = [(x, y) for x, y in pairs if x and y]
        out[key] = geomean([y / x for x, y in pairs]) if pairs else None
    return out


def table(results: dict) -> str:
    rows = results["rows"]
    hdr = (f"{'shape':<10} {'status':<6} {'kernel':<10} {'mlagen med':>10} {'mean':>8} {'seed':>8} {'var':<7} "
           f"{'bmm':>8} {'bound':>7} {'TB/s':>5} {'%copy':>6} {'xseed':>6} {'xbmm':>6} {'rel_err':>8} "
           f"{'FlashMLA*':>9}")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        info = r.get("kernel_info") or {}
        kern = "n/a"
        if info:
            role = info.get("role") or ("generic" if info.get("generic") else "specialized")
            kern = {"specialized": "spec", "candidate": "cand"}.get(role, role) + f"/s{info.get('splits', '?')}"
        m, s, b = r["mlagen"], r["seed"], r["bmm"]
        lines.append(
            f"{r['shape']:<10} {r['status']:<6} {kern:<10} {fmt(m.get('median_us')):>10} {fmt(m.get('mean_us')):>8} "
            f"{fmt(s.get('median_us')):>8} {str(s.get('variant') or '-'):<7} {fmt(b.get('median_us')):>8} "
            f"{fmt(r['bound_us']):>7} {fmt(r['eff_bw_tbps'], '.2f'):>5} {fmt(r['pct_of_copy']):>6} "
            f"{fmt(r['speedup_vs_seed'], '.2f'):>6} {fmt(r['speedup_vs_bmm'], '.2f'):>6} "
            f"{fmt(m.get('rel_err'), '.2e'):>8} {fmt((r.get('anchor') or {}).get('flashmla_us')):>9}")
    g = results["geomean_us"]
    star = lambda e: "" if e["complete"] else f"({e['n']})"  # noqa: E731
    lines.append("-" * len(hdr))
    lines.append(
        f"{'geomean':<10} {'ok' if g['mlagen'].get('all_ok') else 'NOT OK':<6} {'':<10} "
        f"{fmt(g['mlagen']['us']) + star(g['mlagen']):>10} {fmt(g['mlagen'].get('mean_us_geomean')):>8} "
        f"{fmt(g['seed']['us']) + star(g['seed']):>8} {'':<7} {fmt(g['bmm']['us']) + star(g['bmm']):>8} "
        f"{fmt(g['bound']['us']):>7} {'':>5} {'':>6} {fmt(g['speedup_vs_seed'], '.2f'):>6} "
        f"{fmt(g['speedup_vs_bmm'], '.2f'):>6} {'':>8} {fmt(g['flashmla_anchor']['us']):>9}")
    cp = results.get("copy") or {}
    for f, q in results.get("extra_formats", []):
        c = format_column(f, q)
        vals = [(r.get(c) or {}).get("median_us") for r in rows]
        cells = " ".join(f"{r['shape']} {fmt(v)}us/{fmt((r.get(c) or {}).get('eff_bw_tbps'), '.2f')}TB/s"
                         for r, v in zip(rows, vals))
        errs = [e for e in ((r.get(c) or {}).get("error") for r in rows) if e]
        gm = geomean([v for v in vals if v]) if all(vals) else None
        lines.append(f"{c:<18} geomean {fmt(gm)} us | {cells}" + (f" | errors: {errs}" if errs else ""))
    lines.append(f"copy ceiling {fmt(cp.get('tbps'), '.2f')} TB/s (end of run {fmt((results.get('copy_end') or {}).get('tbps'), '.2f')})"
                 f"; us = microseconds, median of {results['args']['reps']} flushed calls; "
                 f"FlashMLA* = anchors.md (bf16 KV, not run here)")
    ho = (results.get("host_overhead_us") or {}).get("summary")
    if ho:
        lines.append(f"host overhead ({results['host_overhead_us']['shape']}): leaderboard decode "
                     f"{fmt(ho['leaderboard_median_us'], '.2f')} us, Plan.run {fmt(ho['leaderboard_plan_run_median_us'], '.2f')} us, "
                     f"empty call {fmt(ho['leaderboard_empty_call_median_us'], '.2f')} us; back-to-back per call "
                     f"{fmt(ho['per_call_b2b_events_us'], '.2f')} us (events), {fmt(ho['per_call_wall_us'], '.2f')} us (wall); "
                     f"python layer {fmt(ho['python_layer_wall_us'], '.2f')} us")
    elif results.get("host_overhead_error"):
        lines.append(f"host overhead: {results['host_overhead_error']}")
    g_ = results.get("git") or {}
    lines.append(f"device {results['device'].get('name')}; mlagen {results['mlagen'].get('fingerprint')}; "
                 f"commit {(g_.get('commit') or 'unknown')[:12]}{' (dirty)' if g_.get('dirty') else ''}")
    return "\n".join(lines)


def make_chart(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    labels = [r["shape"] for r in rows]
    fcols = [format_column(f, q) for f, q in results.get("extra_formats", [])]
    fcolors = ["#9467bd", "#8c564b", "#e377c2", "#17becf"]
    series = [("mlagen", [r["mlagen"].get("median_us") for r in rows], "#1f77b4", None)]
    series += [(c.replace("mlagen_", "mlagen ").replace("_q8s", " (fp8 q given)").replace("_q8", " (fp8 q)").replace("_decode", " (decode() call)") + " KV",
                [(r.get(c) or {}).get("median_us") for r in rows], fcolors[i % 4], None) for i, c in enumerate(fcols)]
    series += [
               ("seed Triton", [r["seed"].get("median_us") for r in rows], "#ff7f0e", None),
              ("torch bmm (bf16 KV)", [r["bmm"].get("median_us") for r in rows], "#7f7f7f", None),
              ("fp8 bound (copy BW)", [r["bound_us"] for r in rows], "#2ca02c", "//")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(rows) + 3), 5.5))
    for k, (label, vals, color, hatch) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        hs = [v if v else 0 for v in vals]
        bars = ax.bar(xs, hs, width, label=label, color=color, hatch=hatch,
                      edgecolor="white" if hatch else None, linewidth=0)
        if label == "mlagen":
            for bar, v, r in zip(bars, vals, rows):
                if v:
                    txt = f"{v:.1f}" if r["status"] == "ok" else f"{v:.1f}\n{r['status']}"
                    ax.annotate(txt, (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom",
                                fontsize=7, color="red" if r["status"] != "ok" else "black")
                elif r["status"] in ("ERROR", "FAILED"):
                    ax.annotate(r["status"], (bar.get_x() + bar.get_width() / 2, 1), ha="center",
                                va="bottom", fontsize=7, color="red", rotation=90)
    fl = [(i, r["anchor"]["flashmla_us"]) for i, r in enumerate(rows) if r.get("anchor")]
    if fl:
        ax.scatter([i for i, _ in fl], [v for _, v in fl], marker="_", s=400, color="black", zorder=5,
                   label="FlashMLA bf16 (anchors.md)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels)
    ax.set_xlabel("batch x kv_len")
    ax.set_ylabel("latency, us (median, L2 flushed; log scale)")
    g = results.get("git") or {}
    commit = (g.get("commit") or "unknown")[:10] + (" (dirty)" if g.get("dirty") else "")
    gm = results["geomean_us"]
    ax.set_title(f"mlagen MLA decode - {results['device'].get('name')} - commit {commit}\n"
                 f"geomean: mlagen {fmt(gm['mlagen']['us'])} us, seed {fmt(gm['seed']['us'])} us, "
                 f"bmm {fmt(gm['bmm']['us'])} us, bound {fmt(gm['bound']['us'])} us "
                 f"(copy {fmt((results.get('copy') or {}).get('tbps'), '.2f')} TB/s)", fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=5, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------
# paged KV: mlagen contiguous vs paged (pages of 64 and 1 in random order), FlashMLA bf16 on the
# same block table
# --------------------------------------------------------------------------------------

def check_and_time(ctx, row: dict, calls: dict, reference) -> dict:
    """The columns of one shape: each called once and judged against reference(col) (rel_l2 over
    the tolerance is an error, an exception too), then the ones that gave an answer timed
    interleaved, warm-ups first, one flushed call a sample. Fills row["columns"] / ["kernels"] /
    ["errors"]; returns the live columns' medians."""
    torch, mg, timer, args = ctx.torch, ctx.mlagen, ctx.timer, ctx.args
    for col, fn in calls.items():
        try:
            out = fn()
            torch.cuda.synchronize()
            e = C.rel_l2(out, reference(col))
            row["columns"][col] = dict(rel_err=e)
            if not col.startswith("FlashMLA"):
                row["kernels"][col] = (mg.last_kernel() or {}).get("name")
            if e > args.tol:
                row["errors"].append(f"{col}: rel_l2 {e:.2e} > {args.tol}")
        except Exception as e:  # noqa: BLE001
            row["errors"].append(f"{col}: {err_text(e)}")
    live = {c: fn for c, fn in calls.items() if "rel_err" in row["columns"].get(c, {})}
    times = {c: [] for c in live}
    for _ in range(args.warmup):
        for fn in live.values():
            fn()
    for _ in range(args.reps):
        for c, fn in live.items():
            times[c].append(timer.once(fn))
    for c, t in times.items():
        row["columns"][c].update(stats(t))
    return {c: row["columns"][c]["median_us"] for c in live}


def import_flashmla():
    """FlashMLA's package from .peers/flashmla (or ../shared/peers/flashmla), or (None, why)."""
    for d in (os.path.join(C.REPO, ".peers", "flashmla"), os.path.join(os.path.dirname(C.REPO), "shared", "peers",
                                                                          "flashmla")):
        if os.path.isdir(d):
            sys.path.insert(0, d)
            try:
                import flash_mla  # noqa: F401
                return flash_mla, None
            except Exception as e:  # noqa: BLE001
                return None, err_text(e)
    return None, "no .peers/flashmla"


def paged_inputs(torch, batch, kv_len, page, seed, device):
    """A cache of batch*kv_len rows in pages of `page` (random page order, every format from one
    bf16 cache), the block table, and the contiguous view of the same rows."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = kv_len // page
    num_pages = batch * pages_per_seq
    cache = torch.randn((num_pages * page, 1, 576), generator=g, device=device).to(torch.bfloat16)
    fp8, scale = C.quantize_fp8(cache)
    perm = torch.randperm(num_pages, generator=g, device=device).to(torch.int32)
    table = perm.view(batch, pages_per_seq).contiguous()
    rows = (table.long().view(batch, pages_per_seq, 1) * page + torch.arange(page, device=device)).reshape(-1)
    q = torch.randn((batch, 16, 576), generator=g, device=device).to(torch.bfloat16)
    kv_lens = torch.full((batch,), kv_len, dtype=torch.int32, device=device)
    return dict(q=q, cache={"bf16": cache, "fp8": (fp8, scale)}, table=table, kv_lens=kv_lens, rows=rows,
                contig={"bf16": cache[rows], "fp8": (fp8[rows], scale)},
                qo_indptr=torch.arange(batch + 1, dtype=torch.int32, device=device),
                kv_indptr=torch.arange(0, (batch + 1) * kv_len, kv_len, dtype=torch.int32, device=device),
                config=C.make_config(batch, kv_len))


def bench_paged(ctx, shapes) -> list[dict]:
    torch, mg, timer, args = ctx.torch, ctx.mlagen, ctx.timer, ctx.args
    fm, fm_error = import_flashmla()
    if fm_error:
        log(f"FlashMLA: {fm_error}")
    rows = []
    for batch, kv_len in shapes:
        name = C.shape_name(batch, kv_len)
        row = dict(shape=name, batch=batch, kv_len=kv_len, flashmla_error=fm_error, columns={}, kernels={}, errors=[])
        inps = {pg: paged_inputs(torch, batch, kv_len, pg, args.seed + 7 * pg, ctx.device) for pg in (64, 1)}
        calls = {}
        for fmt in ("fp8", "bf16"):
            x = inps[64]
            calls[f"{fmt} contiguous"] = functools.partial(mg.decode, x["q"], x["contig"], x["qo_indptr"],
                                                           x["kv_indptr"], x["config"], kv_format=fmt)
            for pg, x in inps.items():
                calls[f"{fmt} page {pg}"] = functools.partial(mg.decode, x["q"], x["cache"], x["qo_indptr"], None,
                                                              x["config"], kv_format=fmt, page_table=x["table"],
                                                              page_size=pg, kv_lens=x["kv_lens"])
        if fm is not None:
            x = inps[64]
            kc = x["cache"]["bf16"].view(-1, 64, 1, 576)
            meta, _ = fm.get_mla_metadata()
            def flashmla(x=x, kc=kc, meta=meta):
                return fm.flash_mla_with_kvcache(x["q"].unsqueeze(1), kc, x["table"], x["kv_lens"], 512, meta, None,
                                                 softmax_scale=576 ** -0.5, causal=False)[0].squeeze(1)
            calls["FlashMLA bf16 page 64"] = flashmla
        # correctness: every column against float32 on the values it reads (the same logical rows)
        refs = {}

        def reference(col):
            fmt = "fp8" if col.startswith("fp8") else "bf16"
            x = inps[1] if col.endswith("page 1") else inps[64]
            key = (fmt, id(x))
            if key not in refs:
                kvs = x["contig"]["bf16"].float() if fmt == "bf16" else x["contig"]["fp8"][0].float() * x["contig"]["fp8"][1]
                kvs = kvs.view(batch, kv_len, 576)
                p = torch.softmax(torch.einsum("bhd,bnd->bhn", x["q"].float(), kvs) * 576 ** -0.5, -1)
                refs[key] = torch.einsum("bhn,bnd->bhd", p, kvs[..., :512])
            return refs[key]

        med = check_and_time(ctx, row, calls, reference)
        refs.clear()
        for fmt in ("fp8", "bf16"):
            base = med.get(f"{fmt} contiguous")
            for pg in (64, 1):
                v = med.get(f"{fmt} page {pg}")
                if base and v:
                    row["columns"][f"{fmt} page {pg}"]["vs_contiguous"] = v / base
        fl = med.get("FlashMLA bf16 page 64")
        for c in med:
            if fl and not c.startswith("FlashMLA"):
                row["columns"][c]["speedup_vs_flashmla"] = fl / med[c]
        log(f"[paged {name}] " + "  ".join(f"{c} {med[c]:.1f}" for c in med) +
            ("" if not row["errors"] else "  ERRORS: " + "; ".join(row["errors"])))
        rows.append(row)
        del inps, calls
        torch.cuda.empty_cache()
    return rows


def make_paged_chart(rows, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = [c for c in ("fp8 contiguous", "fp8 page 64", "fp8 page 1", "bf16 contiguous", "bf16 page 64",
                        "bf16 page 1", "FlashMLA bf16 page 64") if any(c in r["columns"] for r in rows)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    w = 0.8 / max(1, len(cols))
    for i, c in enumerate(cols):
        ys = [(r["columns"].get(c) or {}).get("median_us") or 0 for r in rows]
        ax.bar([k + i * w for k in range(len(rows))], ys, w, label=c)
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(rows))], [r["shape"] for r in rows])
    ax.set_ylabel("median us (L2 flushed, one call)")
    ax.set_title("paged KV on the H200: mlagen contiguous vs pages in random order, FlashMLA on the same table")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)

# --------------------------------------------------------------------------------------
# query rows: 32..128 heads against FlashMLA on the same (contiguous, viewed as pages of 64)
# KV, and q_len 1 / 2 / 4 at 16 heads (causal among the query tokens)
# --------------------------------------------------------------------------------------
H200_DENSE_TFLOPS = {"bf16": 989.4, "fp8": 1978.9}  # H200 SXM dense tensor peaks (NVIDIA's datasheet)


def rows_inputs(torch, batch, kv_len, heads, q_len, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn((batch * kv_len, 1, 576), generator=g, device=device).to(torch.bfloat16)
    fp8, scale = C.quantize_fp8(kv)
    q = torch.randn((batch * q_len, heads, 576), generator=g, device=device).to(torch.bfloat16)
    config = dict(C.make_config(batch, kv_len), num_heads=heads, q_seq_len=q_len)
    return dict(q=q, kv={"bf16": kv, "fp8": (fp8, scale)},
                qo_indptr=torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=device),
                kv_indptr=torch.arange(0, (batch + 1) * kv_len, kv_len, dtype=torch.int32, device=device),
                table=torch.arange(batch * kv_len // 64, dtype=torch.int32, device=device).view(batch, -1),
                kv_lens=torch.full((batch,), kv_len, dtype=torch.int32, device=device), config=config)


def rows_reference(torch, x, fmt, batch, kv_len, heads, q_len, q8=False):
    """float32 on the values each column reads (q8: the q as quantized to fp8 per tensor),
    causal among the query tokens."""
    from mlagen import quant
    kvs = x["kv"]["bf16"].float() if fmt == "bf16" else x["kv"]["fp8"][0].float() * x["kv"]["fp8"][1]
    kvs = kvs.view(batch, kv_len, 576)
    q = x["q"].float()
    if q8:
        qq, qs = quant.quantize_q_fp8(x["q"])
        q = qq.float() * qs
    q = q.view(batch, q_len, heads, 576)
    s = torch.einsum("bthd,bnd->bthn", q, kvs) * 576 ** -0.5
    key = torch.arange(kv_len, device=q.device).view(1, 1, 1, -1)
    end = (kv_len - q_len + 1 + torch.arange(q_len, device=q.device)).view(1, -1, 1, 1)
    p = torch.softmax(s.masked_fill(key >= end, float("-inf")), -1)
    return torch.einsum("bthn,bnd->bthd", p, kvs[..., :512]).reshape(batch * q_len, heads, 512)


def bench_rows(ctx, cases) -> list[dict]:
    """cases: (batch, kv_len, heads, q_len). Columns: mlagen fp8 KV with a bf16 q and with the q
    quantized to fp8, bf16 KV, fp8 KV on pages of 64 (bf16 q), FlashMLA bf16."""
    torch, mg, timer, args = ctx.torch, ctx.mlagen, ctx.timer, ctx.args
    fm, fm_error = import_flashmla()
    rows = []
    for batch, kv_len, heads, q_len in cases:
        name = f"{batch}x{kv_len} h{heads} ql{q_len}"
        row = dict(shape=name, batch=batch, kv_len=kv_len, heads=heads, q_len=q_len, flashmla_error=fm_error,
                   columns={}, kernels={}, errors=[])
        x = rows_inputs(torch, batch, kv_len, heads, q_len, args.seed + heads + q_len, ctx.device)
        kw = ctx.decode_kwargs  # (--force-generic, --kernel)
        calls = {
            "fp8 KV, bf16 q": (("fp8", False), functools.partial(mg.decode, x["q"], x["kv"], x["qo_indptr"], x["kv_indptr"],
                                                        x["config"], kv_format="fp8", **kw)),
            "fp8 KV, fp8 q": (("fp8", True), functools.partial(mg.decode, x["q"], x["kv"], x["qo_indptr"], x["kv_indptr"],
                                                       x["config"], kv_format="fp8", q_dtype="fp8", **kw)),
            "bf16 KV": (("bf16", False), functools.partial(mg.decode, x["q"], x["kv"], x["qo_indptr"], x["kv_indptr"],
                                                  x["config"], kv_format="bf16", **kw)),
            # the same rows as pages of 64 through FlashMLA's block table (the generic rows body)
            "fp8 KV, bf16 q, pages of 64": (("fp8", False), functools.partial(
                mg.decode, x["q"], x["kv"], x["qo_indptr"], None, x["config"], kv_format="fp8", page_table=x["table"],
                page_size=64, kv_lens=x["kv_lens"], **kw)),
        }
        if fm is not None:
            kc = x["kv"]["bf16"].view(-1, 64, 1, 576)
            meta, _ = fm.get_mla_metadata()
            qf = x["q"].view(batch, q_len, heads, 576)

            def flashmla(qf=qf, kc=kc, meta=meta, x=x):
                return fm.flash_mla_with_kvcache(qf, kc, x["table"], x["kv_lens"], 512, meta, None,
                                                 softmax_scale=576 ** -0.5, causal=q_len > 1)[0].reshape(-1, heads, 512)
            calls["FlashMLA bf16"] = (("bf16", False), flashmla)
        refs = {}

        def reference(col):  # float32, on the values the column reads
            key = calls[col][0]
            if key not in refs:
                refs[key] = rows_reference(torch, x, key[0], batch, kv_len, heads, q_len, q8=key[1])
            return refs[key]

        live = check_and_time(ctx, row, {c: fn for c, (_, fn) in calls.items()}, reference)
        refs.clear()
        flop = 2.0 * batch * q_len * heads * kv_len * (576 + 512)
        for c in live:
            row["columns"][c]["tflops"] = flop / (row["columns"][c]["median_us"] * 1e-6) / 1e12
        fl = (row["columns"].get("FlashMLA bf16") or {}).get("median_us")
        for c in live:
            if fl and not c.startswith("FlashMLA"):
                row["columns"][c]["speedup_vs_flashmla"] = fl / row["columns"][c]["median_us"]
        log(f"[rows {name}] " + "  ".join(f"{c} {row['columns'][c]['median_us']:.1f} us "
                                          f"({row['columns'][c]['tflops']:.0f} TF/s)" for c in live) +
            ("" if not row["errors"] else "  ERRORS: " + "; ".join(row["errors"])))
        rows.append(row)
        del x, calls, live
        torch.cuda.empty_cache()
    for r in rows:  # q_len n against q_len 1 of the same shape and heads
        base = next((b for b in rows if (b["batch"], b["kv_len"], b["heads"], b["q_len"]) ==
                     (r["batch"], r["kv_len"], r["heads"], 1)), None)
        if base is not None and r["q_len"] > 1:
            for c, v in r["columns"].items():
                b = base["columns"].get(c, {}).get("median_us")
                if b and v.get("median_us"):
                    v["vs_q_len1"] = v["median_us"] / b
    return rows


ROWS_CASES = ([(64, 8192, 128, 1), (128, 4096, 128, 1), (64, 8192, 64, 1), (64, 8192, 32, 1)] +
              [(b, 8192, 16, n) for b in (32, 64, 256) for n in (1, 2, 4)])


def make_rows_chart(rows, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = ("fp8 KV, bf16 q", "fp8 KV, fp8 q", "fp8 KV, bf16 q, pages of 64", "bf16 KV", "FlashMLA bf16")
    fig, ax = plt.subplots(figsize=(12, 4.5))
    w = 0.8 / len(cols)
    for i, c in enumerate(cols):
        ys = [(r["columns"].get(c) or {}).get("median_us") or 0 for r in rows]
        ax.bar([k + i * w for k in range(len(rows))], ys, w, label=c)
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(rows))], [r["shape"] for r in rows], rotation=30, fontsize=7)
    ax.set_ylabel("median us (L2 flushed, one call)")
    ax.set_title("query rows on the H200: heads x query tokens, mlagen vs FlashMLA (same KV, pages of 64)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(C.REPO, "bench", "results"), help="output folder")
    p.add_argument("--shapes", default=None, help="BATCHxKV_LEN list, e.g. 4x1024,32x8192 (default: the eight)")
    p.add_argument("--reps", type=int, default=60, help="timed repetitions per column and shape (default 60)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per column before timing (default 5)")
    p.add_argument("--sets", type=int, default=3, help="input sets to rotate among (default 3)")
    p.add_argument("--seed", type=int, default=0, help="base random seed")
    p.add_argument("--tol", type=float, default=2e-2, help="relative L2 error limit for mlagen (default 2e-2)")
    p.add_argument("--flush-mb", type=int, default=512, help="L2 flush buffer, MiB (default 512)")
    p.add_argument("--copy-gib", type=float, default=2.0, help="copy-bandwidth tensor size, GiB (default 2)")
    p.add_argument("--copy-reps", type=int, default=20, help="timed copies (default 20)")
    p.add_argument("--b2b-calls", type=int, default=200, help="back-to-back calls for the event host-cost figure")
    p.add_argument("--wall-calls", type=int, default=1000, help="back-to-back calls for the wall-clock host cost")
    p.add_argument("--seed-pick", choices=("auto", "anchors"), default="auto",
                   help="seed variant: auto = SeedPeer times its variants (default); anchors = anchors.md's best")
    p.add_argument("--no-seed", action="store_true", help="skip the seed Triton column")
    p.add_argument("--no-bmm", action="store_true", help="skip the torch bmm column")
    p.add_argument("--formats", default="bf16,mxfp4,fp8:bf16,fp8:fp8,fp8:fp8s",
                   help="extra mlagen columns, FORMAT[:QDTYPE] list (fp8 / bf16 / mxfp4; q bf16, fp8 = a bf16 q "
                        "quantized in the call, fp8s = an fp8 q given with its scale); '' for none (default: "
                        "bf16, mxfp4, and fp8 KV with bf16 q through decode() as the fp8 q columns are called, "
                        "and with both fp8 q routes)")
    p.add_argument("--no-host-overhead", action="store_true", help="skip the host-overhead measurement")
    p.add_argument("--rows", action="store_true",
                   help="also time 32..128 heads (with FlashMLA) and q_len 1/2/4 at 16 heads (ROWS_CASES)")
    p.add_argument("--paged", default=None, const="32x8192,64x8192,256x8192", nargs="?",
                   help="also time paged KV on these shapes (default with no value: 32x8192,64x8192,256x8192): "
                        "fp8 / bf16 contiguous vs a block table of pages of 64 and 1 in random order, and "
                        "FlashMLA bf16 on the same pages of 64")
    p.add_argument("--kernel", default=None,
                   help="force this mlagen kernel (a name from mlagen.kernels(); tuning) instead of its dispatch")
    p.add_argument("--force-generic", action="store_true", help="force mlagen's generic kernel")
    p.add_argument("--skip-failed", action="store_true", help="do not time mlagen on shapes where the check FAILED")
    p.add_argument("--json-only", action="store_true", help="write JSON only, no PNG (e.g. without matplotlib)")
    p.add_argument("--label", default="", help="free text stored in the JSON (what this run is)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of recorded errors")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="test this script without a GPU: CPU tensors, a reference stand-in for mlagen, "
                        "small buffers; the numbers mean nothing")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    shapes = C.parse_shapes(args.shapes)
    os.makedirs(args.out, exist_ok=True)
    import torch

    if args.cpu_smoke:
        device = torch.device("cpu")
        if args.flush_mb == 512:
            args.flush_mb = 16
        if args.copy_gib == 2.0:
            args.copy_gib = 0.0625
    else:
        if not torch.cuda.is_available():
            log("no CUDA device: bench.py times on an NVIDIA GPU (use --cpu-smoke to test the script)")
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
    args.sets = max(1, args.sets)

    ctx = Ctx()
    ctx.torch, ctx.args, ctx.device = torch, args, device
    # only non-default overrides are passed, so the timed call is the plain leaderboard-style call
    ctx.decode_kwargs = {}
    ctx.extra_formats = [tuple((f.split(":") + ["bf16"])[:2]) for f in args.formats.split(",") if f]
    if args.kernel:
        ctx.decode_kwargs["kernel"] = args.kernel
    if args.force_generic:
        ctx.decode_kwargs["force_generic"] = True
    ts = datetime.datetime.now(datetime.timezone.utc)
    results = dict(schema="mlagen-bench/1", timestamp_utc=ts.strftime("%Y-%m-%dT%H:%M:%SZ"), argv=sys.argv,
                   args=vars(args), label=args.label, device=device_info(torch, device), git=C.git_commit(),
                   tolerance=args.tol, shapes=[C.shape_name(*s) for s in shapes])
    if not results["git"]["commit"]:
        results["git"]["commit"] = None
    dinfo = results["device"]
    flush_bytes = args.flush_mb << 20
    l2 = dinfo.get("l2_bytes")
    if l2 and flush_bytes < 8 * l2:
        flush_bytes = 8 * l2
    results["flush_bytes"] = flush_bytes
    results["method"] = ("per repetition: synchronize; zero a flush buffer (L2 cold); record event; one Python call; "
                         "record event; synchronize. Columns interleaved per repetition, input sets rotated. "
                         f"median/mean over {args.reps} after {args.warmup} warm-ups; {args.sets} input sets. "
                         "bytes = batch*kv_len*576 (fp8 KV) + batch*16*576*2 (q) + batch*16*512*2 (out); "
                         "bound = bytes / copy bandwidth")
    log(f"device: {dinfo.get('name')}  torch {dinfo['torch']}  triton {dinfo.get('triton')}  "
        f"commit {results['git'].get('commit')}")

    ctx.timer = Timer(torch, device, flush_bytes)
    ctx.timer.flush_l2()

    # mlagen
    ctx.mlagen, ctx.mlagen_error = import_mlagen(args.cpu_smoke)
    mres = dict(import_error=ctx.mlagen_error)
    if ctx.mlagen is not None:
        try:
            mres["fingerprint"] = ctx.mlagen.fingerprint()
            mres["library"] = ctx.mlagen.library_path()
        except Exception as e:  # noqa: BLE001
            mres["fingerprint_error"] = err_text(e)
    results["mlagen"] = mres
    log(f"mlagen: {mres.get('fingerprint') or mres.get('import_error')}")

    # seed peer
    ctx.peer, ctx.peer_error = None, None
    if not args.no_seed:
        ctx.peer, path, ctx.peer_error = import_seed_peer()
        results["seed_peer"] = dict(path=path, import_error=ctx.peer_error, pick=args.seed_pick)
        log(f"seed peer: {path or ctx.peer_error}")

    # copy ceiling
    ctx.copy_tbps = None
    try:
        results["copy"] = measure_copy(torch, ctx.timer, int(args.copy_gib * (1 << 30)), args.copy_reps)
        ctx.copy_tbps = results["copy"]["tbps"]
        log(f"copy ceiling: {ctx.copy_tbps:.3f} TB/s (best {results['copy']['tbps_best']:.3f})")
    except Exception as e:  # noqa: BLE001
        results["copy"] = dict(error=err_text(e))
        ctx.copy_tbps = None
        log(f"copy measurement failed: {err_text(e)}")
    if ctx.timer.cuda:
        torch.cuda.empty_cache()

    rows = []
    for index, (batch, kv_len) in enumerate(shapes):
        try:
            rows.append(bench_shape(ctx, index, batch, kv_len))
        except Exception as e:  # noqa: BLE001  (anything bench_shape did not catch itself)
            log(f"[{C.shape_name(batch, kv_len)}] unexpected error: {err_text(e)}")
            traceback.print_exc()
            rows.append(dict(shape=C.shape_name(batch, kv_len), batch=batch, kv_len=kv_len,
                             bytes=C.fp8_bytes(batch, kv_len), bound_us=None, status="ERROR", kernel=None,
                             kernel_info=None, mlagen={}, seed={}, bmm={}, eff_bw_tbps=None, pct_of_copy=None,
                             speedup_vs_seed=None, speedup_vs_bmm=None, errors=[err_text(e)]))
    results["rows"] = rows
    results["geomean_us"] = column_geomeans(rows, len(shapes))
    results["extra_formats"] = [list(f) for f in ctx.extra_formats]
    for f, q in ctx.extra_formats:
        vals = [(r.get(format_column(f, q)) or {}).get("median_us") for r in rows]
        results["geomean_us"][format_column(f, q)] = dict(us=geomean(vals) if all(vals) else None,
                                                           complete=all(vals), n=sum(1 for v in vals if v))

    # host overhead on the smallest shape
    if not args.no_host_overhead and ctx.mlagen is not None and shapes:
        b, l = min(shapes, key=lambda s: C.fp8_bytes(*s))
        try:
            results["host_overhead_us"] = host_overhead(ctx, b, l)
        except Exception as e:  # noqa: BLE001
            results["host_overhead_error"] = err_text(e)
            log(f"host overhead failed: {err_text(e)}")
            if args.verbose:
                traceback.print_exc()

    if args.rows and ctx.mlagen is not None and not args.cpu_smoke:
        try:
            results["query_rows"] = bench_rows(ctx, ROWS_CASES)
        except Exception as e:  # noqa: BLE001
            results["query_rows_error"] = err_text(e)
            log(f"rows bench failed: {err_text(e)}")
    if args.paged and ctx.mlagen is not None and not args.cpu_smoke:
        try:
            results["paged"] = bench_paged(ctx, C.parse_shapes(args.paged))
        except Exception as e:  # noqa: BLE001
            results["paged_error"] = err_text(e)
            log(f"paged bench failed: {err_text(e)}")
            traceback.print_exc()

    # copy again at the end: a drift check
    try:
        results["copy_end"] = measure_copy(torch, ctx.timer, int(args.copy_gib * (1 << 30)),
                                           max(5, args.copy_reps // 2))
    except Exception as e:  # noqa: BLE001
        results["copy_end"] = dict(error=err_text(e))
    results["elapsed_s"] = time.perf_counter() - t_start

    # write
    stamp = ts.strftime("%Y%m%dT%H%M%SZ")
    paths = [os.path.join(args.out, f"bench_{stamp}.json"), os.path.join(args.out, "latest.json")]
    results["files"] = dict(json=paths[0], latest=paths[1], png=None)
    if not args.json_only:
        png = os.path.join(args.out, "latest.png")
        try:
            make_chart(results, png)
            results["files"]["png"] = png
            if results.get("paged"):
                make_paged_chart(results["paged"], os.path.join(args.out, "paged.png"))
            if results.get("query_rows"):
                make_rows_chart(results["query_rows"], os.path.join(args.out, "rows.png"))
        except Exception as e:  # noqa: BLE001
            results["chart_error"] = err_text(e)
            log(f"chart not written: {err_text(e)} (use --json-only to skip it)")
    clean = C.json_clean(results)
    for path in paths:
        with open(path, "w") as f:
            json.dump(clean, f, indent=1)
            f.write("\n")
    log(f"wrote {paths[0]}, {paths[1]}" + (f", {results['files']['png']}" if results["files"]["png"] else ""))
    log("")
    log(table(results))
    bad = [r["shape"] for r in rows if r["status"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
