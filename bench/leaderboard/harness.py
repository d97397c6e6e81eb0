"""Run a submission file the way the leaderboard does, in a fresh process.

    python -m bench.leaderboard.harness dist/submission_sm90a.py --mode test
    python -m bench.leaderboard.harness dist/submission_sm90a.py --mode leaderboard [--seed-peer] [--json out.json]
    python -m bench.leaderboard.harness dist/submission_sm90a.py --mode benchmark --shapes 4x1024,64x8192

First the submission server's gates (tools/bundle.py gate_problems: no "stream" in any letter
case, at most 1,000,000 bytes); a failure ends the run with the server's message (a file whose
header says LOCAL TEST only warns about its size). Then the command re-runs itself as a child
process (`--worker`) with the `task.py` stand-in (bench/leaderboard/stub) on sys.path,
MLAGEN_LIBRARY unset and runtime/python off PYTHONPATH (the submission must carry everything).

It mirrors gpu-mode/reference-kernels problems/amd_202602/eval.py and utils.py (read, not
copied) in every point that moves a result:
  * a `spawn` multiprocessing pool of one worker imports the submission; every shape runs in it;
  * test: one call per shape on fixed-seed inputs, the task's check;
  * benchmark / leaderboard: a warm-up (the first shape, untimed, up to 100 calls / 10 ms of
    mean*runs in leaderboard mode, 100 ms in benchmark mode), then per shape one checked,
    untimed call, then repetitions: [leaderboard: fresh inputs, seed += 13], synchronize, the
    flush clear_l2_cache_large() (torch.randn((16000, 1024, 1024)) on the GPU, 64 GiB of fresh
    float32, then del), events around ONE custom_kernel call, synchronize, [leaderboard: re-check].
    Stops (after 3) when the standard error is under 0.1% of the mean, when mean*runs passes the
    mode's budget (leaderboard 30 s, benchmark 50 s), after 120 s of wall clock, or at the
    mode's cap (leaderboard 100, benchmark 1000 repetitions; --reps lowers it);
  * the figure per shape is the MEAN of the event intervals; the rank the geometric mean of
    the means. The median is printed and saved beside it.
The inputs are the task's (bench/leaderboard/task_inputs.py: the reference quantizes q to fp8
per tensor with fp8 KV; mxfp4 scales padded, float8_e8m0fnu, data float4_e2m1fn_x2).
--seed-peer times the seed's Triton kernels the same way on the same inputs.

Every check failure (and --max-rel-l2 / the per-row bound, stricter gates than the task's: an
all-zero output passes the task's check, see check_output) makes the exit status 1. --json
writes the results.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
STUB_DIR = os.path.join(HERE, "stub")

# (batch, kv_len) -> seed. Test seeds are fixed; a benchmark's repetition r uses seed + 13 * r.
TEST_SHAPES = {(4, 1024): 4220, (32, 1024): 5412, (64, 8192): 6415, (256, 8192): 7816}
BENCH_SHAPES = {(4, 1024): 4237, (4, 8192): 4251, (32, 1024): 5432, (32, 8192): 5415,
                (64, 1024): 6432, (64, 8192): 6445, (256, 1024): 7801, (256, 8192): 7824}
PEER_DIRS = ("{repo}/.peers", "{repo}/shared/peers", "/work/shared/peers")


def parse_shapes(specs) -> list[tuple[int, int]]:
    shapes = []
    for spec in specs or ():
        for item in spec.replace(";", ",").split(","):
            item = item.strip().lower()
            if not item:
                continue
            sep = "x" if "x" in item else ":"
            try:
                b, l = (int(v) for v in item.split(sep))
            except ValueError:
                raise SystemExit(f"harness: bad shape {item!r}: expected BATCHxKV_LEN, e.g. 32x8192") from None
            shapes.append((b, l))
    return shapes


def seed_for(shape, table, salt=0) -> int:
    return table.get(shape, 1000 + 7 * shape[0] + shape[1] + salt)


# --------------------------------------------------------------------------- parent

def child_env() -> dict:
    env = dict(os.environ)
    env.pop("MLAGEN_LIBRARY", None)
    runtime = os.path.join(REPO, "runtime", "python")
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.abspath(p) != runtime]
    env["PYTHONPATH"] = os.pathsep.join([REPO] + keep)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_parent(argv) -> int:
    cmd = [sys.executable, "-m", "bench.leaderboard.harness", "--worker", *argv]
    try:
        rc = subprocess.run(cmd, cwd=REPO, env=child_env()).returncode
    except KeyboardInterrupt:
        return 130
    if rc < 0:
        print(f"harness: the submission process died of signal {-rc}", file=sys.stderr)
        return 1
    return rc


# --------------------------------------------------------------------------- gates

def _gates():
    """tools/bundle.py's gate functions (one implementation of the server's two checks)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from tools import bundle  # noqa: PLC0415 - the repo's bundler
    return bundle


def check_gates(path: str) -> tuple[bool, list[str]]:
    """The submission server's checks on the file: (ok, lines to print). A local-test bundle
    (its header says so) only warns about its size."""
    bundle = _gates()
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    local = text.startswith("# LOCAL TEST BUNDLE")
    problems = bundle.gate_problems(text, submission=not local)
    lines = [f"gate FAIL: {p}" for p in problems]
    note = bundle.size_note(text)
    if local and note:
        lines.append(f"gate WARNING (local-test bundle, never submitted): {note}")
    if not problems:
        lines.append(f"gates: passed (no {bundle.FORBIDDEN!r} in any case; {len(text.encode())} bytes"
                     + (", local-test bundle: size not gated)" if local else f" <= {bundle.SIZE_LIMIT})"))
    return not problems, lines


# --------------------------------------------------------------------------- the pool worker
# Everything below runs in the spawn pool's one process (like eval.py's), which imports the
# submission once; each shape is one pool.apply().

MODES = {  # mode -> (recheck, max repeats, mean*runs budget in ns, warm-up budget in ns), as eval.py
    "leaderboard": (True, 100, 30e9, 1e7),
    "benchmark": (False, 1000, 50e9, 10e7),
}
WALL_LIMIT_NS = 120e9
_W: dict = {}


def _pool_init(submission: str, device: str, stub_dir: str):
    if stub_dir not in sys.path:
        sys.path.insert(0, stub_dir)
    import torch

    from bench.leaderboard import task_inputs as ti
    _W.update(torch=torch, ti=ti, device=torch.device(device), submission=submission)


def _kernel():
    if "kernel" not in _W:
        t0 = time.perf_counter()
        _W["module"] = load_submission(_W["submission"])
        _W["import_s"] = time.perf_counter() - t0
        _W["kernel"] = _W["module"].custom_kernel
    return _W["kernel"]


def _call(label):
    if label == "submission":
        return _kernel()
    if "peer" not in _W:
        _W["peer"] = load_peer()[0]
    peer = _W["peer"]
    return lambda d: peer(d[0], d[1]["fp8"][0], d[1]["fp8"][1], d[4]["batch_size"], d[4]["kv_seq_len"])


def _pool_info() -> dict:
    _kernel()
    torch, device = _W["torch"], _W["device"]
    return {"bundle": getattr(_W["module"], "MLAGEN_BUNDLE", None), "import_seconds": _W["import_s"],
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}


def clear_l2_cache_large(torch, device):
    """eval.py's flush (utils.clear_l2_cache_large): 64 GiB of fresh randn float32, deleted."""
    if device.type == "cuda":
        dummy = torch.randn((16000, 1024, 1024), device="cuda")
        del dummy


def _check(ti, data_copy, out, opts):
    chk = ti.check_output(data_copy, out, row_bound=opts["row_bound"])
    strict = opts["max_rel_l2"] > 0 and not chk.rel_l2 <= opts["max_rel_l2"]
    ok = chk.ok and not strict
    msg = chk.message + (" (over --max-rel-l2)" if chk.ok and strict else "")
    return ok, chk, msg


def _pool_test(shape, seed, opts) -> dict:
    torch, ti, device = _W["torch"], _W["ti"], _W["device"]
    b, l = shape
    rec = {"batch": b, "kv_len": l, "seed": seed}
    try:
        kernel = _kernel()
        data = ti.generate_input(b, l, seed, device=device, mxfp4=not opts["no_mxfp4"])
        if device.type == "cuda":
            torch.cuda.synchronize()
        out = kernel(ti.clone_data(data))
        if device.type == "cuda":
            torch.cuda.synchronize()
        rec["kernel"] = kernel_info()
        ok, chk, msg = _check(ti, data, out, opts)
        rec.update(chk.as_dict())
        rec["message"] = msg
        err = device_errors(torch)
        if err:
            ok, rec["message"] = False, msg + "; device errors: " + err
    except Exception as e:  # noqa: BLE001 - report and go on to the next shape
        ok = False
        rec.update(ok=False, message=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    rec["passed"] = ok
    return rec


def _pool_bench(shape, seed0, mode, opts, label, warmup=False) -> dict:
    """eval.py's _run_single_benchmark for one shape (see the module docstring)."""
    torch, ti, device = _W["torch"], _W["ti"], _W["device"]
    recheck, max_repeats, budget_ns, warm_ns = MODES[mode]
    if warmup:
        recheck, budget_ns = False, warm_ns
    max_repeats = min(max_repeats, opts["reps"]) if not warmup else max_repeats
    cuda = device.type == "cuda"
    b, l = shape
    rec = {"batch": b, "kv_len": l, "seed0": seed0, "ok": True, "failures": []}
    worst = {"mismatch": 0.0, "rel_l2": 0.0}

    def checked(copy, out, what):
        ok, chk, msg = _check(ti, copy, out, opts)
        worst["mismatch"] = max(worst["mismatch"], chk.mismatch)
        worst["rel_l2"] = max(worst["rel_l2"], chk.rel_l2)
        if not ok:
            rec["ok"] = False
            rec["failures"].append(f"{what}: {msg}")
        return ok

    try:
        call = _call(label)
        seed = seed0
        data = ti.generate_input(b, l, seed, device=device, mxfp4=not opts["no_mxfp4"])
        copy = ti.clone_data(data)
        out = call(data)
        if cuda:
            torch.cuda.synchronize()
        rec["kernel"] = kernel_info() if label == "submission" else None
        if not checked(copy, out, f"seed {seed} (untimed)"):
            return finish(rec, [], worst)
        del out
        times, t0 = [], time.perf_counter_ns()
        for i in range(max_repeats):
            if recheck:
                seed += 13
                data = ti.generate_input(b, l, seed, device=device, mxfp4=not opts["no_mxfp4"])
                copy = ti.clone_data(data)
            if cuda:
                torch.cuda.synchronize()
                clear_l2_cache_large(torch, device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = call(data)
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end)
            else:
                c0 = time.perf_counter()
                out = call(data)
                ms = (time.perf_counter() - c0) * 1e3
            if recheck and not checked(copy, out, f"seed {seed}"):
                break
            del out
            times.append(ms)
            if i > 1:
                st = stats(times)
                if (st["err_us"] / st["mean_us"] < 0.001 or st["mean_us"] * 1e3 * st["runs"] > budget_ns
                        or time.perf_counter_ns() - t0 > min(WALL_LIMIT_NS, opts["max_seconds"] * 1e9)):
                    break
        return finish(rec, times, worst)
    except Exception as e:  # noqa: BLE001
        rec["ok"] = False
        rec["failures"].append(f"{type(e).__name__}: {e}")
        rec["traceback"] = traceback.format_exc()
        return finish(rec, [], worst)


def stats(ms: list[float]) -> dict:
    n = len(ms)
    if not n:
        return {"runs": 0}
    mean = sum(ms) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in ms) / (n - 1)) if n > 1 else 0.0
    return {"runs": n, "mean_us": mean * 1e3, "median_us": statistics.median(ms) * 1e3, "std_us": std * 1e3,
            "err_us": std / math.sqrt(n) * 1e3, "best_us": min(ms) * 1e3, "worst_us": max(ms) * 1e3}


def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def load_submission(path: str):
    if STUB_DIR not in sys.path:
        sys.path.insert(0, STUB_DIR)
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "custom_kernel", None)):
        raise SystemExit(f"harness: {path} defines no custom_kernel(data)")
    return module


def load_peer():
    tried = []
    for d in [os.environ.get("MLAGEN_SEED_PEER_DIR")] + [p.format(repo=REPO) for p in PEER_DIRS]:
        if d and os.path.isfile(os.path.join(d, "seed_peer.py")):
            sys.path.insert(0, d)
            from seed_peer import SeedPeer  # noqa: PLC0415 - found at run time
            return SeedPeer(), d
        tried.append(d)
    raise SystemExit(f"harness: --seed-peer: no seed_peer.py in any of {[t for t in tried if t]}")


def kernel_info():
    mod = sys.modules.get("mlagen")
    fn = getattr(mod, "last_kernel", None)
    try:
        return fn() if fn else None
    except Exception:  # noqa: BLE001 - diagnostics only
        return None


def device_errors(torch):
    """The binding's device-side input flags, where the submission carries the binding."""
    fn = getattr(sys.modules.get("mlagen"), "check_device_errors", None)
    if fn is None:
        return None
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def fmt_us(v) -> str:
    return f"{v:9.2f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>9}"


def finish(rec, times, worst) -> dict:
    rec.update(stats(times))
    rec["times_us"] = [round(t * 1e3, 3) for t in times]
    rec["worst_mismatch"], rec["worst_rel_l2"] = worst["mismatch"], worst["rel_l2"]
    return rec


# --------------------------------------------------------------------------- the driver

def run_tests(pool, args, opts, shapes) -> tuple[list, bool]:
    results, ok_all = [], True
    for shape in shapes:
        b, l = shape
        seed = seed_for(shape, TEST_SHAPES)
        rec = pool.apply(_pool_test, (shape, seed, opts))
        status = "PASS" if rec["passed"] else "FAIL"
        kname = rec["kernel"].get("name") if isinstance(rec.get("kernel"), dict) else ""
        print(f"test {b:>4}x{l:<5} seed {seed:<6} {status:<5} {rec['message']}" + (f"  [{kname}]" if kname else ""),
              flush=True)
        if args.verbose and rec.get("traceback"):
            print(rec["traceback"], flush=True)
        ok_all &= rec["passed"]
        results.append(rec)
    return results, ok_all


def run_benchmark(pool, args, opts, shapes) -> tuple[dict, bool]:
    peer = args.seed_peer
    if peer:
        print(f"seed peer: {pool.apply(_peer_dir)}", flush=True)
    first = shapes[0]
    warm = pool.apply(_pool_bench, (first, seed_for(first, BENCH_SHAPES), args.mode, opts, "submission", True))
    if not warm["ok"]:
        print(f"warm-up failed: {warm['failures']}", flush=True)
    rows, ok_all = [], True
    print(f"mode {args.mode}: flush = 64 GiB randn per repetition; figure = mean (median beside)", flush=True)
    print(f"{'shape':>11} {'runs':>5} {'mean us':>9} {'median us':>9}"
          + (f" {'peer mean':>9} {'peer med':>9} {'speedup':>7}" if peer else "")
          + "  worst mismatch / rel_l2   kernel", flush=True)
    for shape in shapes:
        seed0 = seed_for(shape, BENCH_SHAPES, salt=17)
        rec = pool.apply(_pool_bench, (shape, seed0, args.mode, opts, "submission"))
        if peer:
            rec["peer"] = pool.apply(_pool_bench, (shape, seed0, args.mode, opts, "peer"))
        ok_all &= rec["ok"]
        kname = rec["kernel"].get("name") if isinstance(rec.get("kernel"), dict) else ""
        line = f"{shape[0]:>5}x{shape[1]:<5} {rec.get('runs', 0):>5} {fmt_us(rec.get('mean_us'))} " \
               f"{fmt_us(rec.get('median_us'))}"
        if peer:
            pm = rec["peer"].get("mean_us")
            sp = (pm / rec["mean_us"]) if pm and rec.get("mean_us") else None
            line += f" {fmt_us(pm)} {fmt_us(rec['peer'].get('median_us'))} {(f'{sp:6.2f}x' if sp else '-'):>7}"
        line += f"  {rec['worst_mismatch']:8.4%} / {rec['worst_rel_l2']:.3e}   {kname}"
        print(line + ("" if rec["ok"] else "   FAIL"), flush=True)
        for f in rec["failures"]:
            print(f"      FAIL: {f}", flush=True)
        if args.verbose and rec.get("traceback"):
            print(rec["traceback"], flush=True)
        if peer and not rec["peer"]["ok"]:
            for f in rec["peer"]["failures"]:
                print(f"      peer FAIL (not counted): {f}", flush=True)
        rows.append(rec)
    good = all(r["ok"] for r in rows)
    summary = {"shapes": rows, "geomean_mean_us": geomean([r.get("mean_us") for r in rows]) if good else None,
               "geomean_median_us": geomean([r.get("median_us") for r in rows]) if good else None}
    gm, gmed = summary["geomean_mean_us"], summary["geomean_median_us"]
    text = (f"geomean of means (the rank): {gm:.2f} us (of medians {gmed:.2f} us)" if gm
            else "geomean of means: - (a shape failed)")
    if peer:
        pr = [r["peer"] for r in rows]
        pok = all(p["ok"] for p in pr)
        summary["peer_geomean_mean_us"] = geomean([p.get("mean_us") for p in pr]) if pok else None
        summary["peer_geomean_median_us"] = geomean([p.get("median_us") for p in pr]) if pok else None
        pg = summary["peer_geomean_mean_us"]
        text += f"   seed peer: {pg:.2f} us" if pg else "   seed peer: - (a shape failed)"
        if gm and pg:
            text += f"   speedup {pg / gm:.2f}x"
    print(text, flush=True)
    return summary, ok_all


def row_bound_for(bundle) -> float | None:
    """The per-(token, head)-row bound against the a8w8 reference for the bundle's KV format
    (tests/tolerances.py ROW_REL_L2_VS_A8W8: fp8 0.1, bf16 0.17; mxfp4 none, its rows differ
    from the fp8 reference by up to ~26%: --max-rel-l2 still catches a wrong output)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from tests.tolerances import ROW_REL_L2_VS_A8W8  # noqa: PLC0415
    fmt = (bundle or {}).get("kv_format", "fp8")
    bound = ROW_REL_L2_VS_A8W8.get({"fp8": "fp8e4m3fn"}.get(fmt, fmt), ROW_REL_L2_VS_A8W8["fp8e4m3fn"])
    print(f"per-row bound vs the a8w8 reference (kv {fmt}): {bound if bound else 'none'}", flush=True)
    return bound


def _peer_dir():
    return load_peer()[1]


def run_worker(args) -> int:
    import multiprocessing

    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("harness: no CUDA device (use --device cpu for a CPU smoke run of a CPU submission)", file=sys.stderr)
        return 2
    with open(args.submission, "rb") as f:
        sub_sha = hashlib.sha256(f.read()).hexdigest()
    opts = {"max_rel_l2": args.max_rel_l2, "no_mxfp4": args.no_mxfp4, "reps": args.reps,
            "max_seconds": args.max_seconds, "row_bound": None}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1, initializer=_pool_init, initargs=(args.submission, args.device, STUB_DIR)) as pool:
        try:
            info = pool.apply(_pool_info)
        except BaseException as e:  # noqa: BLE001 - an import failure is the submission's
            print(f"harness: importing {args.submission} failed: {type(e).__name__}: {e}", flush=True)
            return 1
        bundle = info["bundle"]
        opts["row_bound"] = row_bound_for(bundle)
        print(f"submission {args.submission} (sha256 {sub_sha[:16]}, imported in {info['import_seconds']:.2f} s) "
              f"on {info['device']}, torch {info['torch']}"
              + (f"; bundle {bundle.get('arch')} kv {bundle.get('kv_format')} library "
                 f"{bundle.get('library_sha256', '')[:16]}" if bundle else ""), flush=True)
        shapes = parse_shapes(args.shapes) or list(TEST_SHAPES if args.mode == "test" else BENCH_SHAPES)
        result = {"mode": args.mode, "submission": os.path.abspath(args.submission), "submission_sha256": sub_sha,
                  "max_rel_l2": args.max_rel_l2, "commit": os.environ.get("MLAGEN_COMMIT"), **info}
        if args.mode == "test":
            result["shapes"], ok = run_tests(pool, args, opts, shapes)
            print(f"{sum(r['passed'] for r in result['shapes'])} passed, "
                  f"{sum(not r['passed'] for r in result['shapes'])} failed", flush=True)
        else:
            summary, ok = run_benchmark(pool, args, opts, shapes)
            result.update(summary)
    result["ok"] = ok
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"results: {args.json}", flush=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench.leaderboard.harness", description=__doc__.splitlines()[0])
    ap.add_argument("submission", help="the submission file (e.g. dist/submission_sm90a.py)")
    ap.add_argument("--mode", choices=("test", "benchmark", "leaderboard"), default="test")
    ap.add_argument("--shapes", nargs="+", action="extend",
                    help="BATCHxKV_LEN ... (space or comma separated; default: the task's test / benchmark shapes)")
    ap.add_argument("--seed-peer", action="store_true", help="also time the seed's Triton kernels")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=1000,
                    help="timed repetitions per shape at most, below the mode's own cap (leaderboard 100, "
                         "benchmark 1000)")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="per shape wall-clock limit (default 120, "
                                                                      "eval.py's)")
    ap.add_argument("--max-rel-l2", type=float, default=0.1,
                    help="also fail a shape whose relative L2 error vs the reference exceeds this "
                         "(the task's check alone passes an all-zero output); 0 disables (default 0.1)")
    ap.add_argument("--no-mxfp4", action="store_true", help="leave kv_data['mxfp4'] out of the inputs (faster)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: smoke-run a CPU submission without a GPU (perf_counter timing, no flush)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print tracebacks")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not os.path.isfile(args.submission):
        ap.error(f"no such file: {args.submission}")
    if args.mode != "test" and args.reps < 1:
        ap.error("--reps must be >= 1")
    if not args.worker:
        ok, lines = check_gates(args.submission)
        for line in lines:
            print(line, flush=True)
        if not ok:
            print("harness: the submission server refuses this file before running it", flush=True)
            return 1
        return run_parent(child_argv(args))
    return run_worker(args)


def child_argv(args) -> list[str]:
    """The worker's command line: the parsed options, paths made absolute (its cwd is the repo)."""
    out = [os.path.abspath(args.submission), "--mode", args.mode, "--reps", str(args.reps),
           "--max-seconds", repr(args.max_seconds), "--max-rel-l2", repr(args.max_rel_l2), "--device", args.device]
    if args.shapes:
        out += ["--shapes", *args.shapes]
    if args.json:
        out += ["--json", os.path.abspath(args.json)]
    out += [flag for flag, on in (("--seed-peer", args.seed_peer), ("--no-mxfp4", args.no_mxfp4),
                                  ("--verbose", args.verbose)) if on]
    return out


if __name__ == "__main__":
    sys.exit(main())
