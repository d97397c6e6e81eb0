"""CPU test of the leaderboard bundle (tools/bundle.py): its structure, its embedded library
and binding. Builds a bundle from the built library into a temporary directory; does not
import torch (tests/leaderboard/test_harness_cpu.py imports a bundle where torch is)."""
import ast
import base64
import ctypes
import hashlib
import lzma
import os
import subprocess
import sys
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLE = os.path.join(ROOT, "tools", "bundle.py")
BINDING = os.path.join(ROOT, "runtime", "python", "mlagen")
DEFAULT_LIB = os.path.join(ROOT, "build", "sm90a", "libmlagen.so")
# what the bundle may import at module level: torch and the standard library only
ALLOWED_IMPORTS = {"task", "torch", "atexit", "base64", "hashlib", "importlib.abc", "importlib.util", "os", "sys",
                   "tempfile"}


def _library():
    for path in (os.environ.get("MLAGEN_LIBRARY"), DEFAULT_LIB):
        if path and os.path.exists(path):
            return path
    pytest.skip(f"no built library ({DEFAULT_LIB} missing; run `make`): nothing to bundle")


def _arch(lib):
    L = ctypes.CDLL(lib)
    L.mlagen_build_archs.restype = ctypes.c_char_p
    return L.mlagen_build_archs().decode()


def _build(lib, out, *extra, check=True):
    return subprocess.run([sys.executable, BUNDLE, "--lib", lib, "--arch", extra[0] if extra else _arch(lib),
                           "--out", out, *extra[1:]], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    lib = _library()
    out = str(tmp_path_factory.mktemp("bundle") / "submission.py")
    _build(lib, out)
    with open(out, encoding="utf-8") as f:
        text = f.read()
    return lib, out, text


def _constants(tree) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def test_header_lines(bundle):
    _, _, text = bundle
    lines = text.splitlines()
    assert lines[0] == "#!POPCORN leaderboard amd-mixed-mla"
    assert lines[1] == "#!POPCORN gpu MI355X"
    assert lines[2] == "from task import input_t, output_t"


def test_compiles_and_defines_custom_kernel(bundle):
    _, out, text = bundle
    code = compile(text, out, "exec")
    assert code is not None
    tree = ast.parse(text)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "custom_kernel" in funcs
    assert [a.arg for a in funcs["custom_kernel"].args.args] == ["data"]
    assert "def custom_kernel(data" in text


def test_payload_is_the_library(bundle):
    lib, _, text = bundle
    c = _constants(ast.parse(text))
    with open(lib, "rb") as f:
        raw = f.read()
    packed = base64.b64decode(c["_LIB_PAYLOAD"])
    unpacked = lzma.decompress(packed) if c["_COMPRESSION"] == "lzma" else zlib.decompress(packed)
    assert hashlib.sha256(unpacked).hexdigest() == hashlib.sha256(raw).hexdigest() == c["_LIB_SHA256"]
    assert unpacked == raw and c["_LIB_SIZE"] == len(raw)
    assert c["_ARCH"] == _arch(lib) and c["_KV_FORMAT"] == "fastest"


def test_embeds_the_current_binding(bundle):
    _, _, text = bundle
    sources = _constants(ast.parse(text))["_SOURCES"]
    assert set(sources) >= {"mlagen", "mlagen._lib"}
    with open(os.path.join(BINDING, "__init__.py"), encoding="utf-8") as f:
        assert sources["mlagen"] == (True, f.read())
    with open(os.path.join(BINDING, "_lib.py"), encoding="utf-8") as f:
        assert sources["mlagen._lib"] == (False, f.read())


def test_standalone_imports_only_torch(bundle):
    _, _, text = bundle
    tree = ast.parse(text)
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS
    assert ROOT not in text  # nothing points back into this checkout


def test_kv_format_option_and_arch_check(tmp_path):
    lib = _library()
    out = str(tmp_path / "mx.py")
    _build(lib, out, _arch(lib), "--kv-format", "mxfp4", "--compression", "zlib")
    with open(out, encoding="utf-8") as f:
        c = _constants(ast.parse(f.read()))
    assert c["_KV_FORMAT"] == "mxfp4" and c["_COMPRESSION"] == "zlib"
    with open(lib, "rb") as f:
        assert zlib.decompress(base64.b64decode(c["_LIB_PAYLOAD"])) == f.read()
    wrong = _build(lib, str(tmp_path / "wrong.py"), "sm80", check=False)
    assert wrong.returncode != 0 and "was built for" in wrong.stderr
    assert not os.path.exists(tmp_path / "wrong.py")


def test_reproducible(bundle, tmp_path):
    lib, _, text = bundle
    again = str(tmp_path / "again.py")
    _build(lib, again)
    with open(again, encoding="utf-8") as f:
        assert f.read() == text


AMD_LIB = os.path.join(ROOT, "build", "gfx950", "libmlagen.so")


def test_mi355x_bundle_from_the_gfx950_library(tmp_path):
    """`make bundle-amd ARCH=gfx950` output: the MI355X submission carries the gfx950
    library (checked statically here: it needs libamdhip64 to load)."""
    if not os.path.exists(AMD_LIB):
        pytest.skip(f"no gfx950 library ({AMD_LIB} missing; `make lib-amd ARCH=gfx950` builds it)")
    out = str(tmp_path / "submission_gfx950.py")
    _build(AMD_LIB, out, "gfx950")
    with open(out, encoding="utf-8") as f:
        text = f.read()
    assert text.splitlines()[:3] == ["#!POPCORN leaderboard amd-mixed-mla", "#!POPCORN gpu MI355X",
                                     "from task import input_t, output_t"]
    compile(text, out, "exec")
    c = _constants(ast.parse(text))
    packed = base64.b64decode(c["_LIB_PAYLOAD"])
    unpacked = lzma.decompress(packed) if c["_COMPRESSION"] == "lzma" else zlib.decompress(packed)
    with open(AMD_LIB, "rb") as f:
        assert unpacked == f.read()
    assert c["_ARCH"] == "gfx950"
    r = _build(AMD_LIB, str(tmp_path / "x.py"), "sm90a", check=False)
    assert r.returncode != 0  # the arch string is checked even without loading
