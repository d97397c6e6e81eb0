#!/usr/bin/env python3
"""Build the leaderboard submission: ONE self-contained Python file carrying libmlagen.so.

    python tools/bundle.py --lib build/slim-gfx950-fp8/libmlagen.so --arch gfx950 \
        --gen-dir build/slim-gfx950-fp8/generated --kv-format fp8 --out dist/submission.py
    (make bundle: the MI355X file to submit; make bundle-local: dist/submission_sm90a.py, H200 tests)

The submission file starts with the two POPCORN lines and `from task import input_t, output_t`
(a --local-test file with a comment saying it is not one to submit), then carries
  * the binding: the .py files of runtime/python/mlagen, read now and embedded as text, which the
    bundle writes out as an ordinary package in a private temporary folder and imports with a plain
    `import` (no exec, compile or importlib anywhere: the server's third gate rejects those).
    `mlagen._launch` is replaced by LAUNCH_SOURCE: the bundle launches on the device's default
    (NULL) handle, where the evaluation records its events, and uses no API that picks one;
  * the library, lzma- (or zlib-) compressed and base64-encoded, with its sha256. Its host part
    links no GPU runtime; its kernels are code objects it loads through the HIP runtime the
    process already has (torch's), so the same file loads on ROCm 6 or 7.
At import the bundle writes both out, loads them, checks the GPU, loads every kernel and removes
the folder. The first call of each shape checks mlagen's output on two sequences against float32;
if the library, the GPU, that check or a launch fails, it says why in one line on stderr and
serves every later call with the reference's path (aiter's mla_decode_fwd; torch without aiter):
tools/submission_template.py.

The server's gates (gpu-mode/kernelbot: src/kernelbot/api/api_utils.py and
src/kernelbot/cogs/leaderboard_cog.py) refuse a file containing "stream" in any letter case
(comments, strings and the payload included) and a file over 1,000,000 bytes, and kernelguard
(PyPI, pinned 0.3.1 by kernelbot) must classify it `valid`. gate_problems() applies the first two
to the written text, kernelguard_problems() runs kernelguard on the default and strict profiles
and takes nothing but `valid` with no pattern matched; a file that fails is not written (a --local-test file over
the size limit only warns: it is never submitted). If the base64 payload happens to spell the
word, the next compression setting or line width is tried, and the log says which was taken.

The library is loaded here (ctypes, no GPU needed) to check that it was built for --arch and
to record its kernel fingerprint in the bundle's header.
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import json
import lzma
import os
import subprocess
import sys
import zlib

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GENERATED = os.path.join(REPO, "generated")
if REPO not in sys.path:
    sys.path.insert(0, REPO)  # codegen (the kv format names)
from codegen.catalog import kv_dtype_of  # noqa: E402
from codegen.facts import KV_BINDINGS  # noqa: E402
BINDING_DIR = os.path.join(REPO, "runtime", "python", "mlagen")
PACKAGE = "mlagen"
B64_LINE = 100

HEADER = ("#!POPCORN leaderboard amd-mixed-mla\n"
          "#!POPCORN gpu MI355X\n"
          "from task import input_t, output_t\n")
LOCAL_HEADER = ("# LOCAL TEST BUNDLE ({arch}): for the harness on this GPU only, NOT a leaderboard submission.\n"
                "# Submit dist/submission.py (MI355X, gfx950), made by `make bundle`.\n"
                "from task import input_t, output_t\n")
SIZE_LIMIT = 1_000_000  # bytes; the server answers HTTP 413 above it
FORBIDDEN = "stream"    # in any letter case; the server answers HTTP 500
SERVER_MESSAGES = {
    "word": "Your code contains work on another stream. This is not allowed and may result in your "
            "disqualification.",
    "size": "Submission file is too large (limit: 1MB)",
}
# The bundle's mlagen._launch: the default handle (NULL), the queue the evaluation's events are on.
LAUNCH_SOURCE = (
    '"""The leaderboard bundle\'s launch target: None, the device\'s default (NULL) handle, where the\n'
    'evaluation records its CUDA events. Written by tools/bundle.py in place of the package\'s module."""\n'
    "\n\n"
    "def handle(device_index):\n"
    "    return None\n")
# Binding modules custom_kernel never reaches: the torch operator, `python -m mlagen`, the
# multi-GPU merge (dcp.py), the engine-facing decode (serving.py) and the engine plugins (integrations/).
NOT_BUNDLED = ("ops.py", "__main__.py", "dcp.py", "serving.py")
NOT_BUNDLED_DIRS = ("integrations",)
# (compression, base64 line width) in the order tried when the payload spells the forbidden word
ENCODINGS = (("lzma", 100), ("lzma", 76), ("lzma", 64), ("zlib", 100), ("zlib", 76))


def gate_problems(text: str, submission: bool = True) -> list[str]:
    """What the submission server would refuse in `text`, one line each (empty: accepted).
    submission=False (a local-test file) leaves the size out (see size_note)."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if FORBIDDEN in line.lower():
            problems.append(f"line {n}: contains {FORBIDDEN!r} ({SERVER_MESSAGES['word']!r}): "
                            f"{line.strip()[:100]}")
    size = len(text.encode("utf-8"))
    if submission and size > SIZE_LIMIT:
        problems.append(f"size: {size} bytes > {SIZE_LIMIT} ({SERVER_MESSAGES['size']!r})")
    return problems


def size_note(text: str) -> str | None:
    size = len(text.encode("utf-8"))
    return f"{size} bytes, over the server's {SIZE_LIMIT}" if size > SIZE_LIMIT else None

# The runtime part of the bundle: tools/submission_template.py, placeholders @NAME@ filled by
# build(). Everything it defines at module level except custom_kernel / input_t / output_t /
# mlagen / MLAGEN_BUNDLE starts with an underscore. The submission server's third gate
# (kernelguard) rejects a file with exec / eval / compile / importlib in it and reads everything
# after custom_kernel as its body: the template writes the binding out as an ordinary package and
# imports it with a plain `import`, and custom_kernel is the file's last definition.
TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "submission_template.py")
# kernelguard as kernelbot runs it (pinned there: 0.3.1), on the default and the strict profile
KERNELGUARD_VERSION = "0.3.1"
KERNELGUARD_PROFILES = ("default", "strict")


def kernelguard_verdicts(text: str) -> dict:
    """profile -> kernelguard's --api-mode verdict on `text` (SystemExit when it is not installed)."""
    try:
        from importlib import metadata
        version = metadata.version("kernelguard")
    except Exception:  # noqa: BLE001 - not installed
        raise SystemExit(f"bundle: kernelguard is not installed: pip install kernelguard=={KERNELGUARD_VERSION} "
                         "(the submission server's third gate; make setup installs it)")
    if version != KERNELGUARD_VERSION:
        print(f"bundle: WARNING: kernelguard {version} installed; the server pins {KERNELGUARD_VERSION}")
    out = {}
    for profile in KERNELGUARD_PROFILES:
        argv = ["--api-mode"] + ([] if profile == "default" else ["--profile", profile])
        r = subprocess.run([sys.executable, "-c", "import sys, kernelguard; sys.argv[0] = 'kernelguard'; kernelguard.main()",
                            *argv], input=text, capture_output=True, text=True, timeout=600)
        try:
            out[profile] = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise SystemExit(f"bundle: kernelguard ({profile}) gave no verdict: rc {r.returncode} {r.stderr[-400:]}")
    return out


def kernelguard_problems(text: str) -> list[str]:
    """What kernelguard says against `text`: a filter verdict, a classification other than
    'valid', or any matched pattern, one line each (empty: a clean pass)."""
    problems = []
    for profile, v in kernelguard_verdicts(text).items():
        if v.get("should_filter") or v.get("classification") != "valid" or v.get("matched_patterns"):
            pats = ", ".join(f"{m.get('pattern')} ({m.get('severity')}: {m.get('evidence')})"
                             for m in v.get("matched_patterns", []))
            problems.append(f"kernelguard {profile}: classification {v.get('classification')!r}, should_filter "
                            f"{v.get('should_filter')}, matched: {pats or 'nothing'}")
    return problems


def read_binding(binding_dir: str = BINDING_DIR, package: str = PACKAGE) -> dict:
    """path inside the bundle's package folder (e.g. mlagen/_lib.py) -> source, for every .py file of
    the binding package, with mlagen/_launch.py replaced by the bundle's LAUNCH_SOURCE."""
    sources = {}
    for root, dirs, files in os.walk(binding_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith(".")
                         and not (root == binding_dir and d in NOT_BUNDLED_DIRS))
        for fn in sorted(files):
            if not fn.endswith(".py") or (root == binding_dir and fn in NOT_BUNDLED):
                continue
            rel = os.path.relpath(os.path.join(root, fn), binding_dir).replace(os.sep, "/")
            with open(os.path.join(root, fn), encoding="utf-8") as f:
                sources[f"{package}/{rel}"] = f.read()
    for must in ("__init__.py", "_lib.py", "_launch.py", "quant.py"):
        if f"{package}/{must}" not in sources:
            raise SystemExit(f"bundle: {binding_dir} has no {must}: not the mlagen binding")
    sources[f"{package}/_launch.py"] = LAUNCH_SOURCE
    for name, src in sources.items():
        compile(src, f"{name} (binding)", "exec")  # fail here, not at the leaderboard
    return sources


def read_manifest(gen_dir: str, arch: str) -> dict:
    """The generated kernel set a library was built from: fingerprint, this arch's kernels."""
    path = os.path.join(gen_dir, "manifest.json")
    if not os.path.exists(path):
        raise SystemExit(f"bundle: no {path}: pass --gen-dir, the generated folder the library was built from")
    with open(path) as f:
        m = json.load(f)
    return {"fingerprint": m["fingerprint"], "kernels": [k for k in m["kernels"] if k["arch"] == arch]}


def inspect_library(path: str, arch: str, manifest: dict) -> dict:
    """Load the library (no GPU needed) and read its build arch, fingerprint, kernels and code objects."""
    L = ctypes.CDLL(os.path.abspath(path))  # the host part links no GPU runtime: it loads on any Linux
    for name in ("mlagen_build_archs", "mlagen_fingerprint"):
        getattr(L, name).restype = ctypes.c_char_p
        getattr(L, name).argtypes = []
    L.mlagen_num_kernels.restype, L.mlagen_num_kernels.argtypes = ctypes.c_int32, []
    for name in ("mlagen_check_device", "mlagen_run", "mlagen_plan", "mlagen_select"):
        getattr(L, name)  # AttributeError if the ABI the binding needs is missing
    L.mlagen_num_code_objects.restype, L.mlagen_num_code_objects.argtypes = ctypes.c_int32, []
    meta = {"arch": L.mlagen_build_archs().decode(), "fingerprint": L.mlagen_fingerprint().decode(),
            "num_kernels": int(L.mlagen_num_kernels()), "code_objects": int(L.mlagen_num_code_objects())}
    if meta["code_objects"] != meta["num_kernels"]:
        raise SystemExit(f"bundle: {path} has {meta['num_kernels']} kernels but {meta['code_objects']} code objects")
    if meta["arch"] == arch and meta["fingerprint"] != manifest["fingerprint"]:
        raise SystemExit(f"bundle: {path} has fingerprint {meta['fingerprint']}, its --gen-dir manifest "
                         f"{manifest['fingerprint']}: not built from that kernel set")
    return meta


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compress(raw: bytes, method: str) -> bytes:
    if method == "lzma":
        return lzma.compress(raw, format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)
    return zlib.compress(raw, 9)


def resolve_kv_format(kv_format: str, arch: str) -> str:
    """'fastest' made concrete at bundle time (a slim library carries one format)."""
    if kv_format != "fastest":
        return kv_format
    sys.path.insert(0, os.path.dirname(BINDING_DIR))
    try:
        from mlagen import FASTEST_ORDER  # the binding's table; importing it needs no torch
    finally:
        sys.path.pop(0)
    return FASTEST_ORDER[arch][0]


def build(lib_path: str, arch: str, kv_format: str = "fp8", compression: str | None = None,
          binding_dir: str = BINDING_DIR, gen_dir: str = GENERATED, local_test: bool = False,
          log=print, kernelguard: bool = True) -> str:
    """The text of the bundle, checked against the server's gates (SystemExit naming the
    offending lines when a submission file would be refused)."""
    with open(lib_path, "rb") as f:
        raw = f.read()
    kv_format = resolve_kv_format(kv_format, arch)
    manifest = read_manifest(gen_dir, arch)
    meta = inspect_library(lib_path, arch, manifest)
    if meta["arch"] != arch:
        raise SystemExit(f"bundle: {lib_path} was built for {meta['arch']}, not --arch {arch}")
    formats = {k["kv_dtype"] for k in manifest["kernels"]}
    if kv_dtype_of(arch, kv_format) not in formats:
        raise SystemExit(f"bundle: --kv-format {kv_format}: the library's kernels are for kv {sorted(formats)}")
    sources = read_binding(binding_dir)
    sha = hashlib.sha256(raw).hexdigest()
    fields = {
        "ARCH": arch, "KV_FORMAT": kv_format, "LIB_SIZE": str(len(raw)), "LIB_SHA256": sha,
        "NUM_KERNELS": str(meta["num_kernels"]), "FINGERPRINT": meta["fingerprint"], "COMMIT": git_commit(),
        "KIND": f"LOCAL TEST bundle for {arch} (not a leaderboard submission)" if local_test
        else "leaderboard submission",
    }
    tries = [e for e in ENCODINGS if compression in (None, e[0])]
    for method, width in tries:
        out = _render(raw, method, width, fields, sources, local_test)
        if not any(FORBIDDEN in line.lower() for line in _payload_lines(out)):
            if (method, width) != tries[0]:
                log(f"bundle: the payload spelled {FORBIDDEN!r} with {tries[0]}; took {method} at width {width}")
            break
        log(f"bundle: the {method} payload at width {width} spells {FORBIDDEN!r}: trying the next encoding")
    problems = gate_problems(out, submission=not local_test) + (kernelguard_problems(out) if kernelguard else [])
    if problems:
        raise SystemExit("bundle: the submission server would refuse this file:\n  " + "\n  ".join(problems))
    note = size_note(out)
    if note:
        log(f"bundle: WARNING: {note}; fine for a local-test bundle, never submit it")
    compile(out, "submission.py", "exec")
    return out


def unpack_library(text: str) -> bytes:
    """The library a bundle's text carries (what its import writes out), checked against its sha256."""
    import ast
    fields = {}
    for line in text.splitlines():
        for key in ("_COMPRESSION", "_LIB_SHA256"):
            if line.startswith(key + " = "):
                fields[key] = ast.literal_eval(line.split(" = ", 1)[1])
    packed = base64.b64decode("".join(_payload_lines(text)))
    raw = lzma.decompress(packed) if fields["_COMPRESSION"] == "lzma" else zlib.decompress(packed)
    if hashlib.sha256(raw).hexdigest() != fields["_LIB_SHA256"]:
        raise ValueError("the bundle's library does not match its sha256")
    return raw


def _payload_lines(text: str) -> list[str]:
    start = text.index('_LIB_PAYLOAD = """') + len('_LIB_PAYLOAD = """')
    return text[start:text.index('"""', start)].splitlines()


def _render(raw: bytes, method: str, width: int, fields: dict, sources: dict, local_test: bool) -> str:
    payload = base64.b64encode(compress(raw, method)).decode("ascii")
    lines = "\n".join(payload[i:i + width] for i in range(0, len(payload), width))
    with open(TEMPLATE_PATH, encoding="utf-8") as f:
        text = f.read()
    for key in ("ARCH", "KV_FORMAT", "LIB_SHA256", "FINGERPRINT", "COMMIT"):
        text = text.replace(f"@{key}_R@", repr(fields[key]))
    text = text.replace("@COMPRESSION_R@", repr(method)).replace("@PACKAGE_R@", repr(PACKAGE))
    text = text.replace("@SOURCES_R@", "{\n" + "".join(f"    {name!r}: {src!r},\n" for name, src in sorted(sources.items()))
                        + "}")
    for key, value in fields.items():
        text = text.replace(f"@{key}@", value)
    text = text.replace("@PAYLOAD@", lines)  # last: the payload alphabet has no '@'
    return (LOCAL_HEADER.format(arch=fields["ARCH"]) if local_test else HEADER) + text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="the built libmlagen.so (make bundle: the slim one)")
    ap.add_argument("--arch", required=True, help="the arch it was built for (checked against the library)")
    ap.add_argument("--out", required=True, help="the file to write")
    ap.add_argument("--gen-dir", default=GENERATED,
                    help="the generated folder the library was built from (its manifest: fingerprint, kernels)")
    ap.add_argument("--kv-format", default="fp8", choices=("fastest",) + KV_BINDINGS,
                    help="which kv_data entry custom_kernel passes to mlagen.decode (default fp8; fastest: the "
                         "first of mlagen.FASTEST_ORDER for the arch, resolved now)")
    ap.add_argument("--compression", default=None, choices=("lzma", "zlib"),
                    help="default: lzma, then the other encodings if the payload spells the forbidden word")
    ap.add_argument("--binding-dir", default=BINDING_DIR, help="the mlagen Python package to embed")
    ap.add_argument("--no-kernelguard", action="store_true",
                    help="skip the third gate (tests that build many local bundles of a full library; make bundle and "
                         "make bundle-local always run it, and tests/cpu/test_bundle.py checks the files they wrote)")
    ap.add_argument("--local-test", action="store_true",
                    help="a bundle for the local harness (not for submission): its own header; size only warns")
    args = ap.parse_args(argv)
    text = build(args.lib, args.arch, args.kv_format, args.compression, args.binding_dir, args.gen_dir,
                 local_test=args.local_test, kernelguard=not args.no_kernelguard)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"bundle: wrote {args.out} ({len(text.encode())} bytes; {args.arch}, kv {args.kv_format}, "
          f"{text.count(chr(10))} lines; gates: no {FORBIDDEN!r} in any case"
          + ("" if args.local_test else f", <= {SIZE_LIMIT} bytes")
          + ("" if args.no_kernelguard else f", kernelguard {KERNELGUARD_VERSION} valid") + "; library sha256 "
          f"{hashlib.sha256(open(args.lib, 'rb').read()).hexdigest()[:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
