#!/usr/bin/env python3
"""Run mlagen's kernels under compute-sanitizer (memcheck and racecheck).

    python bench/sanitize.py [--out bench/results] [--tools memcheck,racecheck]
                             [--memcheck-shapes 4x1024,...] [--racecheck-shapes 4x1024,...]

Each tool runs bench/_sanitize_child.py (one mlagen.decode per shape plus a non-uniform
batch through the generic kernel) as
    compute-sanitizer --tool TOOL --error-exitcode 1 --report-api-errors no python _sanitize_child.py ...
with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor is its own allocation (an
out-of-bounds access inside PyTorch's cached pool would otherwise go unseen). memcheck
runs all eight benchmark shapes by default, racecheck the four kv_len=1024 ones. The
tool 'plain' runs the child without a sanitizer (a baseline). Prints "TOOL: N errors"
per tool, writes <out>/sanitize.json (after each tool) and <out>/sanitize_<tool>.log,
and exits 1 if any tool reported an error or the child failed, 2 if no compute-sanitizer.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _common as C  # noqa: E402

CHILD = os.path.join(HERE, "_sanitize_child.py")
DEFAULT_MEMCHECK = ",".join(C.shape_name(b, l) for b, l in C.BENCH_SHAPES)
DEFAULT_RACECHECK = DEFAULT_MEMCHECK  # the eight shapes (issue 2); pass --racecheck-shapes to narrow

ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
CHILD_RESULT = re.compile(r"^CHILD_RESULT (.*)$", re.M)


def find_sanitizer(explicit: str | None) -> str | None:
    if explicit:
        return explicit if os.path.isfile(explicit) else shutil.which(explicit)
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidates = ["/usr/local/cuda/bin/compute-sanitizer",
                  "/usr/local/cuda/compute-sanitizer/compute-sanitizer"]
    candidates += sorted(glob.glob("/usr/local/cuda-*/bin/compute-sanitizer"), reverse=True)
    candidates += sorted(glob.glob("/opt/nvidia/*/compute-sanitizer/compute-sanitizer"), reverse=True)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def sanitizer_version(path: str) -> str | None:
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        return (r.stdout or r.stderr).strip().splitlines()[-1] if (r.stdout or r.stderr).strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


HEADLINES = ("Invalid ", "Error:", "Race reported", "Program hit", "Uninitialized", "Barrier error",
             "Warning:", "Malloc/Free error", "Out-of-range", "Target application returned")


def run_logged(cmd: list[str], env: dict, log_path: str, timeout: float) -> tuple[int | None, bool, float]:
    """Run cmd in its own process group, stdout+stderr to log_path, with a few lines echoed
    live. Returns (returncode or None on timeout, timed_out, seconds)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", bufsize=1, start_new_session=True)
        echoed = [0]

        def pump():
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                s = line.strip("= \n")
                if (line.startswith("[child]") or "SUMMARY" in line or line.startswith("Traceback")
                        or (s.startswith(HEADLINES) and echoed[0] < 20)):
                    if s.startswith(HEADLINES):
                        echoed[0] += 1
                    print("   " + line.rstrip(), flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the group this call started (sanitizer + python)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        reader.join(timeout=30)
        if timed_out:
            log.write(f"\n[sanitize.py] timed out after {timeout:.0f} s; process group {proc.pid} killed\n")
    return (None if timed_out else proc.returncode), timed_out, time.perf_counter() - t0


def parse_log(text: str) -> dict:
    res = {}
    m = ERROR_SUMMARY.findall(text)
    res["errors"] = int(m[-1]) if m else None
    r = RACE_SUMMARY.findall(text)
    if r:
        hz, er, wa = r[-1]
        res["race_hazards"], res["race_errors"], res["race_warnings"] = int(hz), int(er), int(wa)
    c = CHILD_RESULT.findall(text)
    if c:
        try:
            res["child"] = json.loads(c[-1])
        except json.JSONDecodeError as e:
            res["child"] = dict(ok=False, error=f"unparsable CHILD_RESULT: {e}")
    else:
        res["child"] = None
    # the first few distinct error headlines, for the JSON
    heads = []
    for line in text.splitlines():
        s = line.strip("= ").strip()
        if s.startswith(HEADLINES) and s not in heads:
            heads.append(s)
            if len(heads) >= 20:
                break
    res["first_reports"] = heads
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(C.REPO, "build", "sanitize"),
                   help="output folder (default build/sanitize: a run never overwrites a committed result)")
    p.add_argument("--tools", default="memcheck,racecheck,racecheck_wide",
                   help="comma list of compute-sanitizer tools (memcheck, racecheck, initcheck, synccheck) "
                        "or 'plain' (no sanitizer); racecheck_wide = racecheck of the bf16/mxfp4 kernels; "
                        "default memcheck,racecheck,racecheck_wide")
    p.add_argument("--memcheck-shapes", default=DEFAULT_MEMCHECK, help="shapes for memcheck (default: the eight)")
    p.add_argument("--racecheck-shapes", default=DEFAULT_RACECHECK,
                   help=f"shapes for racecheck (default {DEFAULT_RACECHECK})")
    p.add_argument("--shapes", default=None, help="shapes for every tool (overrides the two above)")
    p.add_argument("--no-nonuniform", action="store_true", help="skip the non-uniform generic-kernel case")
    p.add_argument("--formats", default="fp8,bf16,mxfp4,fp8:fp8",
                   help="KV formats memcheck runs every case with (FORMAT[:fp8] = with an fp8 q quantized on the device)")
    p.add_argument("--racecheck-formats", default="fp8", help="KV formats racecheck runs on its shapes")
    p.add_argument("--racecheck-wide-shapes", default="4x1024,32x1024",
                   help="tool racecheck_wide: racecheck of the bf16 / mxfp4 kernels on these shapes")
    p.add_argument("--ref", action="store_true", help="child also checks against the float32 reference (slow)")
    p.add_argument("--sanitizer", default=None, help="compute-sanitizer binary (default: PATH, /usr/local/cuda)")
    p.add_argument("--sanitizer-args", default="",
                   help="extra compute-sanitizer arguments, one string, e.g. \"--print-limit 20\"")
    p.add_argument("--api-errors", action="store_true",
                   help="let the sanitizer count failed CUDA API calls as errors (default: --report-api-errors "
                        "no, since PyTorch probes the API and some probes fail by design)")
    p.add_argument("--caching-allocator", action="store_true",
                   help="keep PyTorch's caching allocator (default: PYTORCH_NO_CUDA_MEMORY_CACHING=1)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per tool (default 1800)")
    args = p.parse_args(argv)

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    needs_sanitizer = any(t != "plain" for t in tools)
    san = find_sanitizer(args.sanitizer) if needs_sanitizer else None
    report = dict(schema="mlagen-sanitize/1",
                  timestamp_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  argv=sys.argv, git=C.git_commit(), sanitizer=san,
                  sanitizer_version=sanitizer_version(san) if san else None, tools={}, ok=None)
    out_json = os.path.join(args.out, "sanitize.json")

    def write():
        with open(out_json, "w") as f:
            json.dump(C.json_clean(report), f, indent=1)
            f.write("\n")

    if needs_sanitizer and not san:  # nothing ran: say so, and write no result file
        print("sanitize: compute-sanitizer not found (PATH, /usr/local/cuda/bin; pass --sanitizer PATH); "
              "nothing was run", flush=True)
        return 2

    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    py_path = os.path.join(C.REPO, "runtime", "python")
    env["PYTHONPATH"] = py_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not args.caching_allocator:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    report["env"] = {k: env.get(k) for k in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "MLAGEN_LIBRARY", "PYTHONPATH")}

    all_ok = True
    for tool in tools:
        shapes = args.shapes or {"racecheck": args.racecheck_shapes,
                                 "racecheck_wide": args.racecheck_wide_shapes}.get(tool, args.memcheck_shapes)
        formats = {"racecheck": args.racecheck_formats, "racecheck_wide": "bf16,mxfp4"}.get(tool, args.formats)
        child = [sys.executable, CHILD, "--shapes", shapes or "none", "--formats", formats]
        if args.no_nonuniform:
            child.append("--no-nonuniform")
        if args.ref:
            child.append("--ref")
        if tool == "plain":
            cmd = child
        else:
            cmd = [san, "--tool", tool.replace("_wide", ""), "--error-exitcode", "1"]
            if not args.api_errors:
                cmd += ["--report-api-errors", "no"]
            cmd += shlex.split(args.sanitizer_args) + child
        log_path = os.path.join(args.out, f"sanitize_{tool}.log")
        print(f"== {tool}: {shlex.join(cmd)}", flush=True)
        rc, timed_out, secs = run_logged(cmd, env, log_path, args.timeout)
        with open(log_path, errors="replace") as f:
            text = f.read()
        parsed = parse_log(text)
        child_res = parsed.get("child")
        child_ok = bool(child_res and child_res.get("ok"))
        errors = parsed.get("errors")
        if errors is None and tool.startswith("racecheck") and "race_errors" in parsed:
            errors = parsed["race_errors"]  # racecheck ends with RACECHECK SUMMARY, not ERROR SUMMARY
        if tool == "plain":
            ok = rc == 0 and child_ok
        else:
            ok = (rc == 0 and errors == 0 and child_ok and not timed_out
                  and parsed.get("race_errors", 0) == 0)
        entry = dict(command=cmd, shapes=shapes, returncode=rc, timed_out=timed_out, seconds=round(secs, 1),
                     log=log_path, ok=ok, **parsed)
        report["tools"][tool] = entry
        all_ok &= ok
        report["ok"] = all_ok if tool == tools[-1] else None
        write()
        if tool == "plain":
            headline = "ok" if ok else "FAILED"
        else:
            headline = f"{errors} errors" if errors is not None else "no ERROR SUMMARY (did not finish)"
        extra = []
        if "race_hazards" in parsed:
            extra.append(f"{parsed['race_hazards']} hazards ({parsed['race_errors']} errors, "
                         f"{parsed['race_warnings']} warnings)")
        if timed_out:
            extra.append(f"TIMED OUT after {args.timeout:.0f} s")
        elif rc not in (0, None):
            extra.append(f"exit {rc}")
        if not child_ok:
            why = (child_res or {}).get("error") or ("check failed" if child_res else "no CHILD_RESULT line")
            bad = [c.get("case") for c in (child_res or {}).get("cases", []) if not c.get("ok")]
            extra.append(f"child: {why}" + (f" in {bad}" if bad else ""))
        print(f"{tool}: {headline}" + (f"; {'; '.join(extra)}" if extra else "") + f"  [{secs:.0f} s, {log_path}]",
              flush=True)

    report["ok"] = all_ok
    write()
    print("")
    print("sanitize summary: " + ", ".join(
        f"{t}: {'ok' if e['ok'] else 'FAIL'}"
        + (f" ({e['errors']} errors)" if e.get("errors") is not None else "")
        for t, e in report["tools"].items()) + f"  -> {out_json}", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
