"""Run a submission file the way the leaderboard does, in a fresh process.

    python -m tests.leaderboard.harness dist/submission.py --mode test
    python -m tests.leaderboard.harness dist/submission.py --mode benchmark [--seed-peer] [--json out.json]
    python -m tests.leaderboard.harness dist/submission.py --mode test --shapes 4x1024,64x8192

The command re-runs itself as a child process (`--worker`) with the `task.py` stand-in
(tests/leaderboard/stub) first on sys.path, MLAGEN_LIBRARY unset and runtime/python off
PYTHONPATH (the submission must carry everything), imports the submission as module
`submission` from its path, and for each shape (batch x kv_len):

test       one call per shape on fixed-seed inputs (the kernel gets a copy), synchronize,
           the task's check (tests/leaderboard/task_inputs.check_output).
benchmark  like the ranked leaderboard run: one warm-up on the first shape; per shape one
           checked, untimed call, then repetitions each with a NEW seed and fresh inputs:
           synchronize, flush L2 (write a 512 MB buffer), event, ONE custom_kernel call, event,
           synchronize, re-check. Stops after --reps, or when the mean's standard error is
           below 0.1% (after 3), or after --max-seconds. Reports mean / median per shape and
           the geometric mean of the medians. --seed-peer times the seed's Triton kernels the
           same way on the same inputs (its variant pick happens before timing).

Every check failure (and --max-rel-l2, a stricter gate than the task's: an all-zero output
passes the task's check, see check_output) makes the exit status 1. --json writes the results.
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
FLUSH_BYTES = 512 * 1024 * 1024
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
    cmd = [sys.executable, "-m", "tests.leaderboard.harness", "--worker", *argv]
    try:
        rc = subprocess.run(cmd, cwd=REPO, env=child_env()).returncode
    except KeyboardInterrupt:
        return 130
    if rc < 0:
        print(f"harness: the submission process died of signal {-rc}", file=sys.stderr)
        return 1
    return rc


# --------------------------------------------------------------------------- worker

class Timer:
    """CUDA events around one call, or perf_counter on CPU (for smoke tests off a GPU)."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.flush_buf = None
        if self.cuda:
            self.flush_buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def flush(self, i: int):
        if self.flush_buf is not None:
            self.flush_buf.fill_(i)

    def time_call(self, fn, data, i: int):
        """sync, flush L2, event, fn(data), event, sync -> (result, milliseconds)."""
        torch = self.torch
        self.sync()
        self.flush(i)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(data)
            end.record()
            torch.cuda.synchronize()
            return out, start.elapsed_time(end)
        t0 = time.perf_counter()
        out = fn(data)
        return out, (time.perf_counter() - t0) * 1e3


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


def run_tests(args, torch, ti, kernel, device, shapes) -> tuple[list, bool]:
    results, ok_all = [], True
    for shape in shapes:
        b, l = shape
        seed = seed_for(shape, TEST_SHAPES)
        rec = {"batch": b, "kv_len": l, "seed": seed}
        try:
            data = ti.generate_input(b, l, seed, device=device, mxfp4=not args.no_mxfp4)
            if device.type == "cuda":
                torch.cuda.synchronize()
            out = kernel(ti.clone_data(data))
            if device.type == "cuda":
                torch.cuda.synchronize()
            rec["kernel"] = kernel_info()
            chk = ti.check_output(data, out)
            rec.update(chk.as_dict())
            err = device_errors(torch)
            if err:
                chk.ok, rec["ok"], rec["message"] = False, False, chk.message + "; device errors: " + err
            strict = args.max_rel_l2 > 0 and not chk.rel_l2 <= args.max_rel_l2
            rec["rel_l2_gate"] = not strict
            ok = chk.ok and not strict
            status = "PASS" if ok else ("FAIL" if not chk.ok else "FAIL(rel_l2)")
            print(f"test {b:>4}x{l:<5} seed {seed:<6} {status:<12} {rec['message']}"
                  + (f"  [{rec['kernel'].get('name')}]" if isinstance(rec.get("kernel"), dict) else ""), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on to the next shape
            ok = False
            rec.update(ok=False, message=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
            print(f"test {b:>4}x{l:<5} seed {seed:<6} ERROR        {rec['message']}", flush=True)
            if args.verbose:
                print(rec["traceback"], flush=True)
        rec["passed"] = ok
        ok_all &= ok
        results.append(rec)
    return results, ok_all


def bench_one(args, torch, ti, timer, call, shape, device, label) -> dict:
    """Time `call(data)` on one shape like the ranked run; the first call is checked, untimed."""
    b, l = shape
    seed0 = seed_for(shape, BENCH_SHAPES, salt=17)
    rec = {"batch": b, "kv_len": l, "seed0": seed0, "ok": True, "failures": []}
    worst = {"mismatch": 0.0, "rel_l2": 0.0}

    def checked(data_copy, out, what):
        chk = ti.check_output(data_copy, out)
        worst["mismatch"] = max(worst["mismatch"], chk.mismatch)
        worst["rel_l2"] = max(worst["rel_l2"], chk.rel_l2)
        strict = args.max_rel_l2 > 0 and not chk.rel_l2 <= args.max_rel_l2
        if not chk.ok or strict:
            rec["ok"] = False
            rec["failures"].append(f"{what}: {chk.message}" + (" (over --max-rel-l2)" if chk.ok else ""))
        return chk.ok and not strict

    try:
        data = ti.generate_input(b, l, seed0, device=device, mxfp4=not args.no_mxfp4)
        copy = ti.clone_data(data)
        out = call(data)
        timer.sync()
        rec["kernel"] = kernel_info() if label == "submission" else None
        if not checked(copy, out, f"seed {seed0} (untimed)"):
            return finish(rec, [], worst)
        del data, copy, out
        times, t_start, seed = [], time.perf_counter(), seed0
        for i in range(args.reps):
            seed += 13
            data = ti.generate_input(b, l, seed, device=device, mxfp4=not args.no_mxfp4)
            copy = ti.clone_data(data)
            out, ms = timer.time_call(call, data, i)
            good = checked(copy, out, f"seed {seed}")
            del out, data, copy
            if not good:
                break
            times.append(ms)
            if i > 1:
                s = stats(times)
                if (s["err_us"] / s["mean_us"] < 0.001 or time.perf_counter() - t_start > args.max_seconds):
                    break
        return finish(rec, times, worst)
    except Exception as e:  # noqa: BLE001
        rec["ok"] = False
        rec["failures"].append(f"{type(e).__name__}: {e}")
        rec["traceback"] = traceback.format_exc()
        if args.verbose:
            print(rec["traceback"], flush=True)
        return finish(rec, [], worst)


def finish(rec, times, worst) -> dict:
    rec.update(stats(times))
    rec["times_us"] = [round(t * 1e3, 3) for t in times]
    rec["worst_mismatch"], rec["worst_rel_l2"] = worst["mismatch"], worst["rel_l2"]
    return rec


def run_benchmark(args, torch, ti, kernel, device, shapes) -> tuple[dict, bool]:
    timer = Timer(torch, device)
    peer = None
    if args.seed_peer:
        peer, peer_dir = load_peer()
        print(f"seed peer: {peer_dir}/seed_peer.py", flush=True)

    # warm-up (the ranked run's: a few untimed calls on the first shape)
    b, l = shapes[0]
    data = ti.generate_input(b, l, seed_for(shapes[0], BENCH_SHAPES), device=device, mxfp4=not args.no_mxfp4)
    t0 = time.perf_counter()
    try:
        for _ in range(100):
            kernel(data)
            timer.sync()
            if time.perf_counter() - t0 > 0.1:
                break
    except Exception as e:  # noqa: BLE001 - the shape's own run reports it
        print(f"warm-up failed: {type(e).__name__}: {e}", flush=True)
    del data

    rows, ok_all = [], True
    print(f"{'shape':>11} {'runs':>5} {'mean us':>9} {'median us':>9}"
          + (f" {'peer med':>9} {'speedup':>7}" if peer else "") + "  worst mismatch / rel_l2   kernel", flush=True)
    for shape in shapes:
        rec = bench_one(args, torch, ti, timer, kernel, shape, device, "submission")
        if peer is not None:
            prec = bench_one(args, torch, ti, timer,
                             lambda d, s=shape: peer(d[0], d[1]["fp8"][0], d[1]["fp8"][1], s[0], s[1]),
                             shape, device, "peer")
            rec["peer"] = prec
        ok_all &= rec["ok"]
        kname = rec["kernel"].get("name") if isinstance(rec.get("kernel"), dict) else ""
        line = f"{shape[0]:>5}x{shape[1]:<5} {rec.get('runs', 0):>5} {fmt_us(rec.get('mean_us'))} " \
               f"{fmt_us(rec.get('median_us'))}"
        if peer is not None:
            pm = rec["peer"].get("median_us")
            sp = (pm / rec["median_us"]) if pm and rec.get("median_us") else None
            line += f" {fmt_us(pm)} {(f'{sp:6.2f}x' if sp else '-'):>7}"
        line += f"  {rec['worst_mismatch']:8.4%} / {rec['worst_rel_l2']:.3e}   {kname}"
        print(line + ("" if rec["ok"] else "   FAIL"), flush=True)
        for f in rec["failures"]:
            print(f"      FAIL: {f}", flush=True)
        if peer is not None and not rec["peer"]["ok"]:
            for f in rec["peer"]["failures"]:
                print(f"      peer FAIL (not counted): {f}", flush=True)
        rows.append(rec)
    summary = {"shapes": rows,
               "geomean_median_us": geomean([r.get("median_us") for r in rows]) if all(r["ok"] for r in rows) else None,
               "geomean_mean_us": geomean([r.get("mean_us") for r in rows]) if all(r["ok"] for r in rows) else None}
    gm = summary["geomean_median_us"]
    text = f"geomean of medians: {gm:.2f} us" if gm else "geomean of medians: - (a shape failed)"
    if peer is not None:
        pr = [r["peer"] for r in rows]
        summary["peer_geomean_median_us"] = geomean([p.get("median_us") for p in pr]) if all(p["ok"] for p in pr) \
            else None
        pg = summary["peer_geomean_median_us"]
        text += f"   seed peer: {pg:.2f} us" if pg else "   seed peer: - (a shape failed)"
        if gm and pg:
            text += f"   speedup {pg / gm:.2f}x"
    print(text, flush=True)
    return summary, ok_all


def run_worker(args) -> int:
    import torch

    from . import task_inputs as ti

    if args.device == "cuda" and not torch.cuda.is_available():
        print("harness: no CUDA device (use --device cpu for a CPU smoke run of a CPU submission)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    with open(args.submission, "rb") as f:
        sub_sha = hashlib.sha256(f.read()).hexdigest()
    t0 = time.perf_counter()
    module = load_submission(args.submission)
    import_s = time.perf_counter() - t0
    bundle = getattr(module, "MLAGEN_BUNDLE", None)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"submission {args.submission} (sha256 {sub_sha[:16]}, imported in {import_s:.2f} s) on {gpu}, "
          f"torch {torch.__version__}" + (f"; bundle {bundle.get('arch')} kv {bundle.get('kv_format')} "
                                          f"library {bundle.get('library_sha256', '')[:16]}" if bundle else ""),
          flush=True)
    shapes = parse_shapes(args.shapes) or list(TEST_SHAPES if args.mode == "test" else BENCH_SHAPES)
    result = {"mode": args.mode, "submission": os.path.abspath(args.submission), "submission_sha256": sub_sha,
              "bundle": bundle, "device": gpu, "torch": torch.__version__, "import_seconds": import_s,
              "max_rel_l2": args.max_rel_l2}
    if args.mode == "test":
        result["shapes"], ok = run_tests(args, torch, ti, module.custom_kernel, device, shapes)
        print(f"{sum(r['passed'] for r in result['shapes'])} passed, "
              f"{sum(not r['passed'] for r in result['shapes'])} failed", flush=True)
    else:
        summary, ok = run_benchmark(args, torch, ti, module.custom_kernel, device, shapes)
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
    ap = argparse.ArgumentParser(prog="python -m tests.leaderboard.harness", description=__doc__.splitlines()[0])
    ap.add_argument("submission", help="the submission file (e.g. dist/submission.py)")
    ap.add_argument("--mode", choices=("test", "benchmark"), default="test")
    ap.add_argument("--shapes", nargs="+", action="extend",
                    help="BATCHxKV_LEN ... (space or comma separated; default: the task's test / benchmark shapes)")
    ap.add_argument("--seed-peer", action="store_true", help="also time the seed's Triton kernels (benchmark)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--reps", type=int, default=100, help="timed repetitions per shape at most (default 100)")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="per shape wall-clock limit (default 120)")
    ap.add_argument("--max-rel-l2", type=float, default=0.1,
                    help="also fail a shape whose relative L2 error vs the reference exceeds this "
                         "(the task's check alone passes an all-zero output); 0 disables (default 0.1)")
    ap.add_argument("--no-mxfp4", action="store_true", help="leave kv_data['mxfp4'] out of the inputs (faster)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: smoke-run a CPU submission without a GPU (perf_counter timing, no L2 flush)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print tracebacks")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not os.path.isfile(args.submission):
        ap.error(f"no such file: {args.submission}")
    if args.mode == "benchmark" and args.reps < 1:
        ap.error("--reps must be >= 1")
    if not args.worker:
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
