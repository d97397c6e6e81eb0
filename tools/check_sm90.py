#!/usr/bin/env python3
"""Compile-check the generated sm_90a warpgroup kernels and read what ptxas says of them.

    tools/check_sm90.py [--sources generated/] [--pattern GLOB ...] [--out DIR] [--jobs N]

Every file in --sources matching the patterns (default: the warpgroup bodies, `*_bn64*` and
`*_bm*`, whose wgmma chains ptxas may serialize) is compiled the way CMake compiles it
(nvcc -O3, sm_90a, -cubin) with -Xptxas -v, and each entry function's report is checked:

  * no ptxas performance message of the C75xx family. These are printed as "info", not as
    warnings, and -Werror does not catch them. C7510-C7515 say that ptxas serialized every
    wgmma of the function (a non-wgmma instruction touching an accumulator inside a pipeline
    stage, too few registers, ...), and C7517 that it injected a wait. A kernel built so runs
    its tensor-core chains one at a time and can be several times slower. Measuring such a
    build measures the serialization, not the schedule (one such build read 117.8 -> 157.3 us).
  * no spills (spill stores / loads, bytes), except the known ones in KNOWN_SPILLS, each with
    its bound and reason.

This reads no GPU: it runs wherever nvcc runs (CI). Writes DIR/check_sm90.json.
Exit status: 0 all good, 1 a kernel fails, 2 usage error or nvcc missing.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATTERNS = ("mla_decode_sm90a_*_bn64*.hip", "mla_decode_sm90a_*_bm*.hip")
# kernel source (fnmatch) -> (most spill bytes, stores or loads, allowed; why)
KNOWN_SPILLS = {  # first match wins; the mxfp4 ones present at 640134c, when this check was written
    # The 64-row rows body since its O groups issue the copies (setmaxnreg 152 for group 0, 176
    # for each O group: all the block has; 144/184/184 hung). With the bulk tensor copy
    # the specialized 64-row kernels spill 32-104 B (was up to 168): the O groups reload a few
    # 4-8 byte values in their rescale branch and copy path; the causal 256x8192 kernel also in its
    # Q staging; the generic kernels in their epilogue. The 32-row kernels spill nothing.
    "mla_decode_sm90a_b256_kv8192_s1_qbf16_kvfp8e4m3fn_ql4_bn64_st3_bm64.hip":
        (148, "64-row rows body, causal rows: Q staging, group 0 (one value a tile), O groups (see above)"),
    "mla_decode_sm90a_bany_kvany_sany_q*_kvfp8e4m3fn_bn64*_bm64.hip":
        (700, "generic 64-row rows body: the O groups' epilogue, once a block (runtime shape values reloaded "
              "per row: ~120 of the reloads), and 5 reloads a tile in the loops"),
    "mla_decode_sm90a_*_kvfp8e4m3fn_*_bm64.hip":
        (168, "64-row rows body: the O groups' rescale branch and copy issue (see above)"),
    "mla_decode_sm90a_bany_kvany_sany_qbf16_kvmxfp4_bn64_st3.hip":
        (16, "generic mxfp4 warpgroup kernel, 3 stages: a tuning tile (make tune), not a default (4 B; 16 with the "
             "in-launch split merge inlined, f9f8f82)"),
}
ENTRY = re.compile(r"Compiling entry function '([^']+)'")
USED = re.compile(r"Used (\d+) registers")
SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PERF = re.compile(r"\((C75\d\d)\)\s*(.*)")
FUNC = re.compile(r"function '([^']+)'")


def parse_ptxas(text: str) -> list[dict]:
    """ptxas -v output -> one record an entry function: name, registers, stack, spill bytes,
    and its C75xx messages (code, text). ptxas prints those messages before any entry's lines,
    naming the function; a message naming none, or a function with no entry, gets a record of
    its own (name '?' or that name)."""
    funcs: list[dict] = []
    by_name: dict[str, dict] = {}
    messages: list[tuple[str | None, str, str]] = []

    def record(name: str) -> dict:
        rec = by_name.get(name)
        if rec is None:
            rec = by_name[name] = dict(name=name, registers=None, stack=0, spill_stores=0, spill_loads=0, perf=[])
            funcs.append(rec)
        return rec

    current = None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            current = record(m[1])
            continue
        m = PERF.search(line)
        if m:
            named = FUNC.search(line)
            messages.append((named[1] if named else None, m[1], m[2].strip()[:200]))
            continue
        if current is None:
            continue
        m = SPILL.search(line)
        if m:
            current.update(stack=int(m[1]), spill_stores=int(m[2]), spill_loads=int(m[3]))
        m = USED.search(line)
        if m:
            current["registers"] = int(m[1])
    for name, code, msg in messages:
        record(name or "?")["perf"].append(dict(code=code, text=msg))
    return funcs


def judge(source: str, funcs: list[dict]) -> list[str]:
    """What is wrong with a source's kernels (empty: nothing)."""
    bad = []
    allowed = next((b for pat, (b, _) in KNOWN_SPILLS.items() if fnmatch.fnmatch(source, pat)), 0)
    for f in funcs:
        short = f["name"][:60]
        for p in f["perf"]:
            bad.append(f"{short}: ptxas {p['code']}: {p['text']}")
        worst = max(f["spill_stores"], f["spill_loads"])
        if worst > allowed:
            bad.append(f"{short}: spills {f['spill_stores']} B stored / {f['spill_loads']} B loaded "
                       f"(allowed: {allowed})")
    if not funcs:
        bad.append("ptxas reported no entry function")
    return bad


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")


def compile_one(nvcc: str, path: str, include: list[str]) -> tuple[int, str]:
    cmd = [nvcc, "-x", "cu", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-cubin",
           "-Xptxas", "-v", "-o", os.devnull, *[f"-I{d}" for d in include], path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sources", default=os.path.join(REPO, "generated"))
    p.add_argument("--pattern", action="append", default=None, help="file name glob (repeatable)")
    p.add_argument("--out", default=os.path.join(REPO, "build", "sm90-check"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    nvcc = nvcc_path()
    if nvcc is None:
        print("check_sm90: nvcc not found (PATH, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    patterns = tuple(args.pattern or DEFAULT_PATTERNS)
    files = sorted(f for f in os.listdir(args.sources) if any(fnmatch.fnmatch(f, pat) for pat in patterns))
    if not files:
        print(f"check_sm90: no source in {args.sources} matches {', '.join(patterns)}", file=sys.stderr)
        return 2
    include = [os.path.join(REPO, "runtime", "include"), args.sources]
    results = []
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {ex.submit(compile_one, nvcc, os.path.join(args.sources, f), include): f for f in files}
        for fut in cf.as_completed(futs):
            f = futs[fut]
            rc, text = fut.result()
            funcs = parse_ptxas(text) if rc == 0 else []
            bad = judge(f, funcs) if rc == 0 else [f"nvcc failed (rc {rc}): {text.strip()[-400:]}"]
            results.append(dict(source=f, ok=not bad, problems=bad, kernels=funcs))
    results.sort(key=lambda r: r["source"])
    for r in results:
        regs = "/".join(str(k["registers"]) for k in r["kernels"])
        spills = max((max(k["spill_stores"], k["spill_loads"]) for k in r["kernels"]), default=0)
        print(f"{r['source']:72s} regs {regs:9s} spill {spills:3d} B  {'ok' if r['ok'] else 'FAIL'}")
        for b in r["problems"]:
            print(f"    {b}")
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, "check_sm90.json")
    with open(out, "w") as fh:
        json.dump(dict(nvcc=nvcc, patterns=patterns, known_spills={k: v[1] for k, v in KNOWN_SPILLS.items()},
                       ok=all(r["ok"] for r in results), sources=results), fh, indent=1)
    failed = [r["source"] for r in results if not r["ok"]]
    print(f"check_sm90: {len(results) - len(failed)}/{len(results)} sources ok; wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
