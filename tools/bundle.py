#!/usr/bin/env python3
"""Build the leaderboard submission: ONE self-contained Python file carrying libmlagen.so.

    python tools/bundle.py --lib build/slim-gfx950-fp8/libmlagen.so --arch gfx950 \
        --gen-dir build/slim-gfx950-fp8/generated --kv-format fp8 --out dist/submission.py
    (make bundle: the MI355X file to submit; make bundle-local: dist/submission_sm90a.py, H200 tests)

The submission file starts with the two POPCORN lines and `from task import input_t, output_t`
(a --local-test file with a comment saying it is not one to submit), then carries
  * the binding (the .py files of runtime/python/mlagen, read now, embedded as source strings
    and served at import by an in-memory importer as the package `mlagen`), so the bundle always
    has the binding of the tree it was built from and needs no checkout. `mlagen._launch` is
    replaced by LAUNCH_SOURCE: the bundle launches on the device's default (NULL) handle, where
    the evaluation records its events, and uses no API that picks one;
  * the library, lzma- (or zlib-) compressed and base64-encoded, with its sha256.
At import the bundle decompresses the library, checks its sha256, writes it to a private
temporary file (mkstemp, mode 0600), loads it and removes the file (the mapping stays), and,
when torch sees a GPU, calls mlagen_check_device() so that a GPU the library has no code for
fails at import with a message naming both archs. Importing it again reuses the loaded
library. `custom_kernel(data)` is one call of mlagen.leaderboard_entry's cached path
(mlagen.decode on a shape's first call). At run time the bundle needs only torch.

The server's gates (gpu-mode/kernelbot: src/kernelbot/api/api_utils.py and
src/kernelbot/cogs/leaderboard_cog.py) refuse a file containing "stream" in any letter case
(comments, strings and the payload included) and a file over 1,000,000 bytes. gate_problems()
applies both to the written text; a file that fails is not written (a --local-test file over
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
# Binding modules custom_kernel never reaches: the torch operator and `python -m mlagen`.
NOT_BUNDLED = ("ops.py", "__main__.py")
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

# The runtime part of the bundle. Placeholders @NAME@ are filled by build(); everything the
# bundle defines at module level except custom_kernel / input_t / output_t / mlagen /
# MLAGEN_BUNDLE starts with an underscore.
TEMPLATE = r'''
# mlagen @KIND@, generated by tools/bundle.py: do not edit, rebuild instead.
#   arch @ARCH@, kv format @KV_FORMAT@, library @LIB_SIZE@ bytes, sha256 @LIB_SHA256@
#   kernels: @NUM_KERNELS@, fingerprint @FINGERPRINT@, source commit @COMMIT@
# At import: unpack the embedded libmlagen.so to a private temp file, load it through the
# embedded binding (package `mlagen`), remove the file, check the GPU. custom_kernel() is one
# mlagen.decode().
import base64 as _base64
import hashlib as _hashlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import os as _os
import sys as _sys
import tempfile as _tempfile

import torch

_ARCH = @ARCH_R@
_KV_FORMAT = @KV_FORMAT_R@
_LIB_SHA256 = @LIB_SHA256_R@
_LIB_SIZE = @LIB_SIZE@
_COMPRESSION = @COMPRESSION_R@
_FINGERPRINT = @FINGERPRINT_R@
_COMMIT = @COMMIT_R@
_PACKAGE = @PACKAGE_R@


class _EmbeddedBinding(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """Serves the embedded binding sources as importable modules (first on sys.meta_path,
    so a `mlagen` elsewhere on sys.path cannot shadow the one matching this library)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _SOURCES:
            return None
        is_package = _SOURCES[fullname][0]
        return _importlib_util.spec_from_loader(fullname, self, origin=self._origin(fullname),
                                                is_package=is_package)

    @staticmethod
    def _origin(fullname):
        path = fullname.replace(".", "/") + ("/__init__.py" if _SOURCES[fullname][0] else ".py")
        return "<mlagen bundle %s>/%s" % (_LIB_SHA256[:12], path)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        origin = module.__spec__.origin
        module.__file__ = origin
        exec(compile(_SOURCES[module.__name__][1], origin, "exec"), module.__dict__)

    def get_source(self, fullname):  # for tracebacks (linecache) and inspect
        return _SOURCES[fullname][1]


def _unpack_library():
    packed = _base64.b64decode(_LIB_PAYLOAD)
    if _COMPRESSION == "lzma":
        import lzma
        raw = lzma.decompress(packed)
    else:
        import zlib
        raw = zlib.decompress(packed)
    digest = _hashlib.sha256(raw).hexdigest()
    if len(raw) != _LIB_SIZE or digest != _LIB_SHA256:
        raise ImportError("mlagen bundle: the embedded library is corrupt (sha256 %s, %d bytes; expected %s, %d "
                          "bytes): rebuild the bundle with tools/bundle.py" % (digest, len(raw), _LIB_SHA256,
                                                                               _LIB_SIZE))
    return raw


def _candidate_dirs():
    seen = []
    for d in (_os.environ.get("MLAGEN_BUNDLE_DIR"), _tempfile.gettempdir(),
              _os.path.join(_os.path.expanduser("~"), ".cache", "mlagen"), "/dev/shm", _os.getcwd()):
        if d and d not in seen:
            seen.append(d)
    return seen


def _remove(path):
    try:
        _os.unlink(path)
    except OSError:
        pass


def _install_library(raw, binding_lib):
    """Write the library to a private file (0600) in the first directory where it can be
    written and dlopen()ed (a noexec /tmp refuses the mapping), and load it there."""
    errors = []
    for d in _candidate_dirs():
        path = None
        try:
            _os.makedirs(d, mode=0o700, exist_ok=True)
            fd, path = _tempfile.mkstemp(prefix="libmlagen-%s-" % _LIB_SHA256[:12], suffix=".so", dir=d)
            try:
                view = memoryview(raw)
                while view:
                    view = view[_os.write(fd, view):]
            finally:
                _os.close(fd)
            with open(path, "rb") as f:
                if _hashlib.sha256(f.read()).hexdigest() != _LIB_SHA256:
                    raise OSError("written file does not read back identical")
            _os.environ["MLAGEN_LIBRARY"] = path  # the binding's library_path(): lib() loads and keeps it
            handle = binding_lib.lib()
            _remove(path)  # mapped now; nothing is left behind however the process ends
            return path, handle
        except OSError as e:  # not writable, full, or not mappable: try the next place
            errors.append("%s: %s" % (d, e))
            if path:
                _remove(path)
    raise ImportError("mlagen bundle: could not write and load libmlagen.so in any of: " + "; ".join(errors) +
                      " (set MLAGEN_BUNDLE_DIR to a writable directory on an exec-mounted filesystem)")


def _load_binding():
    for name in [m for m in _sys.modules if m == _PACKAGE or m.startswith(_PACKAGE + ".")]:
        if getattr(_sys.modules[name], "__loader__", None).__class__ is not _EmbeddedBinding:
            del _sys.modules[name]  # another copy of the binding: this library goes with its own
    _sys.meta_path[:] = [f for f in _sys.meta_path if f.__class__.__name__ != "_EmbeddedBinding"]
    _sys.meta_path.insert(0, _EmbeddedBinding())
    import importlib
    package = importlib.import_module(_PACKAGE)
    return package, importlib.import_module(_PACKAGE + "._lib")


def _check_gpu(package, binding_lib, handle):
    built = handle.mlagen_build_archs().decode()
    if built != _ARCH:
        raise ImportError("mlagen bundle: the embedded library reports arch %s, the bundle was made for %s"
                          % (built, _ARCH))
    if not torch.cuda.is_available():
        return  # no GPU in this process: decode() will say so on its first call
    try:
        binding_lib.raise_for(handle.mlagen_check_device(), handle)
    except package.MlagenError as e:
        try:
            major, minor = torch.cuda.get_device_capability()
            gpu = "%s (sm%d%d)" % (torch.cuda.get_device_name(), major, minor)
        except Exception:  # noqa: BLE001 - the message matters more than the detail
            gpu = "unknown"
        raise package.MlagenError(e.status, "%s [mlagen submission bundle built for %s; running GPU: %s]"
                                  % (e, _ARCH, gpu)) from None


def _bootstrap():
    loaded = _sys.modules.get(_PACKAGE)
    if getattr(loaded, "MLAGEN_BUNDLE", {}).get("library_sha256") == _LIB_SHA256:
        return loaded, loaded.MLAGEN_BUNDLE  # imported before: one library, one binding
    raw = _unpack_library()
    package, binding_lib = _load_binding()
    path, handle = _install_library(raw, binding_lib)
    _check_gpu(package, binding_lib, handle)
    info = {"arch": _ARCH, "kv_format": _KV_FORMAT, "library_sha256": _LIB_SHA256, "library_bytes": _LIB_SIZE,
            "library_path": path, "fingerprint": _FINGERPRINT, "commit": _COMMIT, "compression": _COMPRESSION}
    package.MLAGEN_BUNDLE = info
    return package, info


def custom_kernel(data: input_t) -> output_t:
    return _entry(data)  # (q, kv_data, qo_indptr, kv_indptr, config) -> (total_q, 16, 512) bf16


# ---- data: the binding's sources and the compressed library; the bootstrap runs at the end
# module name -> (is_package, source) of the binding, read from runtime/python/mlagen at bundle time
_SOURCES = @SOURCES_R@
_LIB_PAYLOAD = """
@PAYLOAD@
"""

mlagen, MLAGEN_BUNDLE = _bootstrap()
_entry = mlagen.leaderboard_entry(_KV_FORMAT)  # bound once: the cached per-call path, decode() on a miss
'''


def read_binding(binding_dir: str = BINDING_DIR, package: str = PACKAGE) -> dict:
    """module name -> (is_package, source) for every .py file of the binding package, with
    mlagen._launch replaced by the bundle's LAUNCH_SOURCE."""
    sources = {}
    for root, dirs, files in os.walk(binding_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for fn in sorted(files):
            if not fn.endswith(".py") or (root == binding_dir and fn in NOT_BUNDLED):
                continue
            rel = os.path.relpath(os.path.join(root, fn), binding_dir)[:-3].split(os.sep)
            is_package = rel[-1] == "__init__"
            parts = [package] + (rel[:-1] if is_package else rel)
            with open(os.path.join(root, fn), encoding="utf-8") as f:
                sources[".".join(parts)] = (is_package, f.read())
    if package not in sources or package + "._lib" not in sources or package + "._launch" not in sources:
        raise SystemExit(f"bundle: {binding_dir} has no __init__.py / _lib.py / _launch.py: not the mlagen binding")
    sources[package + "._launch"] = (False, LAUNCH_SOURCE)
    for name, (_, src) in sources.items():
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


def inspect_library_static(path: str, arch: str, manifest: dict) -> dict:
    """For a library this machine cannot load (an AMD build needs libamdhip64, which lives
    in the toolchain chroot): check its bytes for the exported ABI names, the arch string
    and the fingerprint of the generated kernel set it was built from; count its kernels
    from that set's manifest, every kernel's symbol checked present."""
    with open(path, "rb") as f:
        raw = f.read()
    for name in (b"mlagen_build_archs", b"mlagen_fingerprint", b"mlagen_check_device", b"mlagen_run",
                 b"mlagen_select"):
        if name not in raw:
            raise SystemExit(f"bundle: {path} does not export {name.decode()}")
    if arch.encode() + b"\0" not in raw:
        raise SystemExit(f"bundle: {path} has no build arch string {arch!r}")
    fp = manifest["fingerprint"]
    if fp.encode() not in raw:
        raise SystemExit(f"bundle: {path} was not built from this generated set (fingerprint {fp} missing)")
    missing = [k["name"] for k in manifest["kernels"] if k["name"].encode() + b"\0" not in raw]
    if missing:
        raise SystemExit(f"bundle: {path} lacks kernels of its manifest: {', '.join(missing)}")
    return {"arch": arch, "fingerprint": fp, "num_kernels": len(manifest["kernels"]),
            "inspected": "static (not loadable here)"}


def inspect_library(path: str, arch: str, manifest: dict) -> dict:
    """Load the library (no GPU needed) and read its build arch, fingerprint and kernels."""
    try:
        L = ctypes.CDLL(os.path.abspath(path))
    except OSError as e:
        if arch.startswith("gfx"):
            print(f"bundle: cannot load {path} here ({e}); checking it statically")
            return inspect_library_static(path, arch, manifest)
        raise
    for name in ("mlagen_build_archs", "mlagen_fingerprint"):
        getattr(L, name).restype = ctypes.c_char_p
        getattr(L, name).argtypes = []
    L.mlagen_num_kernels.restype, L.mlagen_num_kernels.argtypes = ctypes.c_int32, []
    for name in ("mlagen_check_device", "mlagen_run", "mlagen_plan", "mlagen_select"):
        getattr(L, name)  # AttributeError if the ABI the binding needs is missing
    meta = {"arch": L.mlagen_build_archs().decode(), "fingerprint": L.mlagen_fingerprint().decode(),
            "num_kernels": int(L.mlagen_num_kernels())}
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
          log=print) -> str:
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
    problems = gate_problems(out, submission=not local_test)
    if problems:
        raise SystemExit("bundle: the submission server would refuse this file:\n  " + "\n  ".join(problems))
    note = size_note(out)
    if note:
        log(f"bundle: WARNING: {note}; fine for a local-test bundle, never submit it")
    compile(out, "submission.py", "exec")
    return out


def _payload_lines(text: str) -> list[str]:
    start = text.index('_LIB_PAYLOAD = """') + len('_LIB_PAYLOAD = """')
    return text[start:text.index('"""', start)].splitlines()


def _render(raw: bytes, method: str, width: int, fields: dict, sources: dict, local_test: bool) -> str:
    payload = base64.b64encode(compress(raw, method)).decode("ascii")
    lines = "\n".join(payload[i:i + width] for i in range(0, len(payload), width))
    text = TEMPLATE
    for key in ("ARCH", "KV_FORMAT", "LIB_SHA256", "FINGERPRINT", "COMMIT"):
        text = text.replace(f"@{key}_R@", repr(fields[key]))
    text = text.replace("@COMPRESSION_R@", repr(method)).replace("@PACKAGE_R@", repr(PACKAGE))
    text = text.replace("@SOURCES_R@", "{\n" + "".join(f"    {name!r}: ({pkg!r}, {src!r}),\n"
                                                         for name, (pkg, src) in sorted(sources.items())) + "}")
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
    ap.add_argument("--kv-format", default="fp8", choices=("fastest", "fp8", "mxfp4", "bf16"),
                    help="which kv_data entry custom_kernel passes to mlagen.decode (default fp8; fastest: the "
                         "first of mlagen.FASTEST_ORDER for the arch, resolved now)")
    ap.add_argument("--compression", default=None, choices=("lzma", "zlib"),
                    help="default: lzma, then the other encodings if the payload spells the forbidden word")
    ap.add_argument("--binding-dir", default=BINDING_DIR, help="the mlagen Python package to embed")
    ap.add_argument("--local-test", action="store_true",
                    help="a bundle for the local harness (not for submission): its own header; size only warns")
    args = ap.parse_args(argv)
    text = build(args.lib, args.arch, args.kv_format, args.compression, args.binding_dir, args.gen_dir,
                 local_test=args.local_test)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"bundle: wrote {args.out} ({len(text.encode())} bytes; {args.arch}, kv {args.kv_format}, "
          f"{text.count(chr(10))} lines; gates: no {FORBIDDEN!r} in any case"
          + ("" if args.local_test else f", <= {SIZE_LIMIT} bytes") + "; library sha256 "
          f"{hashlib.sha256(open(args.lib, 'rb').read()).hexdigest()[:16]}...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
