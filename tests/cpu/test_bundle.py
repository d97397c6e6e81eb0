"""CPU test of the leaderboard bundle (tools/bundle.py): its structure, its embedded library
and binding. Builds a bundle from the built library into a temporary directory; does not
import torch (tests/cpu/test_harness.py imports a bundle where torch is)."""
import ast
import base64
import ctypes
import hashlib
import lzma
import os
import re
import subprocess
import sys
import zlib

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
BUNDLE = os.path.join(ROOT, "tools", "bundle.py")
BINDING = os.path.join(ROOT, "runtime", "python", "mlagen")
DEFAULT_LIB = os.path.join(ROOT, "build", "sm90a", "libmlagen.so")
# what the bundle may import at module level: torch and the standard library only
ALLOWED_IMPORTS = {"task", "torch", "base64", "hashlib", "os", "shutil", "sys", "tempfile"}


def _library():
    for path in (os.environ.get("MLAGEN_LIBRARY"), DEFAULT_LIB):
        if path and os.path.exists(path):
            return path
    pytest.skip(f"no built library ({DEFAULT_LIB} missing; run `make`): nothing to bundle")


def _arch(lib):
    L = ctypes.CDLL(lib)
    L.mlagen_build_archs.restype = ctypes.c_char_p
    return L.mlagen_build_archs().decode()


def _build(lib, out, *extra, check=True, local=True):
    """tools/bundle.py on `lib` (a full build: a local-test bundle, the size is not gated)."""
    return subprocess.run([sys.executable, BUNDLE, "--lib", lib, "--arch", extra[0] if extra else _arch(lib),
                           "--out", out, *(["--local-test"] if local else []), "--no-kernelguard", *extra[1:]],
                          capture_output=True, text=True, check=check)


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


def test_local_test_header_lines(bundle):
    _, _, text = bundle
    lines = text.splitlines()
    assert lines[0].startswith("# LOCAL TEST BUNDLE (sm90a)") and "NOT a leaderboard submission" in lines[0]
    assert "#!POPCORN" not in text.split("\n_SOURCES", 1)[0]  # the server could not take it for an entry
    assert lines[2] == "from task import input_t, output_t"


def test_compiles_and_defines_custom_kernel(bundle):
    _, out, text = bundle
    code = compile(text, out, "exec")  # raises on a syntax error
    assert "custom_kernel" in code.co_names  # defined at module level by the compiled file
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
    assert c["_ARCH"] == _arch(lib) and c["_KV_FORMAT"] == "fp8"


def test_embeds_the_current_binding(bundle):
    _, _, text = bundle
    sources = _constants(ast.parse(text))["_SOURCES"]  # the package's files, written out at import
    assert set(sources) >= {"mlagen/__init__.py", "mlagen/_lib.py", "mlagen/_launch.py"}
    with open(os.path.join(BINDING, "__init__.py"), encoding="utf-8") as f:
        assert sources["mlagen/__init__.py"] == f.read()
    with open(os.path.join(BINDING, "_lib.py"), encoding="utf-8") as f:
        assert sources["mlagen/_lib.py"] == f.read()
    # the launch target: the default handle, no API that picks one
    assert sources["mlagen/_launch.py"] == _tools_bundle().LAUNCH_SOURCE
    ns = {}
    exec(sources["mlagen/_launch.py"], ns)
    assert ns["handle"](0) is None and ns["handle"](3) is None


def _tools_bundle():
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from tools import bundle as b  # noqa: PLC0415
    return b


def test_binding_names_no_stream_outside_launch():
    """The submission server refuses the word in any case; the bundle carries every binding
    module but _launch.py (replaced), so none of them may contain it."""
    for fn in sorted(os.listdir(BINDING)):
        if fn.endswith(".py") and fn != "_launch.py":
            with open(os.path.join(BINDING, fn), encoding="utf-8") as f:
                hits = [n for n, line in enumerate(f, 1) if "stream" in line.lower()]
            assert not hits, f"runtime/python/mlagen/{fn} lines {hits} name the forbidden word"
    with open(os.path.join(BINDING, "_launch.py"), encoding="utf-8") as f:
        assert "current_stream" in f.read()  # the package's own module is the one that picks the target


def test_gates_name_the_offending_lines():
    b = _tools_bundle()
    text = "ok\n# a Stream here\nx = 'STREAM'\nfine\n"
    problems = b.gate_problems(text)
    assert [p.split(":")[0] for p in problems] == ["line 2", "line 3"]
    assert all("another stream" in p for p in problems)  # the server's message quoted
    big = "#" * (b.SIZE_LIMIT + 1)
    assert any(p.startswith("size: 1000001 bytes") for p in b.gate_problems(big))
    assert b.gate_problems(big, submission=False) == [] and "over the server's" in b.size_note(big)
    assert b.gate_problems("#" * b.SIZE_LIMIT) == []


def test_payload_that_spells_the_word_takes_another_encoding(monkeypatch, tmp_path):
    """If the encoded library happens to contain the word, the next encoding is taken (and
    logged); the file still holds the library."""
    b = _tools_bundle()
    lib = _library()
    real = b.compress
    spelled = base64.b64decode("xxStReAmxx==")
    assert "stream" in base64.b64encode(spelled).decode().lower()

    def fake(raw, method):
        return spelled if method == "lzma" else real(raw, method)
    monkeypatch.setattr(b, "compress", fake)
    logs = []
    text = b.build(lib, _arch(lib), local_test=True, log=logs.append, kernelguard=False)
    assert "stream" not in text.lower()
    assert any("spells 'stream'" in line for line in logs) and any("took zlib" in line for line in logs)
    c = _constants(ast.parse(text))
    assert c["_COMPRESSION"] == "zlib"
    with open(lib, "rb") as f:
        assert zlib.decompress(base64.b64decode(c["_LIB_PAYLOAD"])) == f.read()


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
    sl = _slim("sm90a")
    if sl:  # a slim library carries one format: another one is refused
        r = _build(sl[0], str(tmp_path / "no.py"), "sm90a", "--gen-dir", sl[1], "--kv-format", "mxfp4", check=False)
        assert r.returncode != 0 and "kernels are for kv" in r.stderr
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


def _slim(arch):
    """(library, generated folder) of `make bundle` / `make bundle-local`'s slim build, or None."""
    d = os.path.join(ROOT, "build", f"slim-{arch}-fp8")
    lib = os.path.join(d, "libmlagen.so")
    return (lib, os.path.join(d, "generated")) if os.path.exists(lib) else None


DIST = {"gfx950": os.path.join(ROOT, "dist", "submission.py"), "sm90a": os.path.join(ROOT, "dist", "submission_sm90a.py")}


@pytest.mark.parametrize("arch", ["gfx950", "sm90a"])
def test_made_bundles_pass_the_server_gates(arch):
    """The files `make bundle` (MI355X, the one to submit) and `make bundle-local` (H200
    tests) write: both gates, the slim kernel set, the launch target."""
    path = DIST[arch]
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (make {'bundle' if arch == 'gfx950' else 'bundle-local'}; CI builds both)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert "stream" not in text.lower()
    assert len(text.encode()) <= 1_000_000, len(text.encode())
    lines = text.splitlines()
    if arch == "gfx950":
        assert lines[:3] == ["#!POPCORN leaderboard amd-mixed-mla", "#!POPCORN gpu MI355X",
                             "from task import input_t, output_t"]
    else:
        assert lines[0].startswith("# LOCAL TEST BUNDLE (sm90a)")
    header = next(line for line in lines if line.startswith("#   kernels: "))
    assert header.startswith("#   kernels: 9,"), header  # 8 shape kernels + the generic one
    c = _constants(ast.parse(text))
    assert c["_ARCH"] == arch and c["_KV_FORMAT"] == "fp8"
    assert c["_SOURCES"]["mlagen/_launch.py"] == _tools_bundle().LAUNCH_SOURCE
    packed = base64.b64decode(c["_LIB_PAYLOAD"])
    raw = lzma.decompress(packed) if c["_COMPRESSION"] == "lzma" else zlib.decompress(packed)
    assert hashlib.sha256(raw).hexdigest() == c["_LIB_SHA256"]
    # the registry's names: the fp8-KV bf16-q kernels only (a slim build), nine of them (the code
    # objects' own symbols add their entries' and constants' names: _q8, _amax, _combine, _launch)
    kernel_names = {k for k in re.findall(rb"(mla_decode_%s_[a-z0-9_]+)\x00" % arch.encode(), raw)
                    if not k.endswith((b"_q8", b"_amax", b"_combine", b"_launch"))}
    assert len(kernel_names) == 9 and all(b"_qbf16_kvfp8e4m3fn" in k for k in kernel_names), sorted(kernel_names)


def test_mi355x_bundle_from_the_gfx950_library(tmp_path):
    """`make bundle` output: the MI355X submission carries the slim gfx950 library (its host part
    loads here: it links no HIP runtime), and passes the gates."""
    sl = _slim("gfx950")
    if not sl:
        pytest.skip("no slim gfx950 library (build/slim-gfx950-fp8; `make bundle` builds it)")
    out = str(tmp_path / "submission_gfx950.py")
    _build(sl[0], out, "gfx950", "--gen-dir", sl[1], local=False)
    with open(out, encoding="utf-8") as f:
        text = f.read()
    assert text.splitlines()[:3] == ["#!POPCORN leaderboard amd-mixed-mla", "#!POPCORN gpu MI355X",
                                     "from task import input_t, output_t"]
    assert _tools_bundle().gate_problems(text) == []
    compile(text, out, "exec")
    c = _constants(ast.parse(text))
    packed = base64.b64decode(c["_LIB_PAYLOAD"])
    unpacked = lzma.decompress(packed) if c["_COMPRESSION"] == "lzma" else zlib.decompress(packed)
    with open(sl[0], "rb") as f:
        assert unpacked == f.read()
    assert c["_ARCH"] == "gfx950"
    r = _build(sl[0], str(tmp_path / "x.py"), "sm90a", "--gen-dir", sl[1], check=False)
    assert r.returncode != 0 and "was built for gfx950" in r.stderr


def _kernelguard_or_skip():
    try:
        from importlib import metadata
        metadata.version("kernelguard")
    except Exception:  # noqa: BLE001
        if os.environ.get("MLAGEN_REQUIRE_KERNELGUARD") == "1":  # CI (.ci/run) installs it
            pytest.fail("kernelguard is not installed (pip install kernelguard==0.3.1)")
        pytest.skip("kernelguard is not installed here (pip install kernelguard==0.3.1; CI runs this test)")


@pytest.mark.parametrize("arch", ["gfx950", "sm90a"])
def test_made_bundles_pass_kernelguard(arch):
    """The server's third gate, as kernelbot runs it (kernelguard 0.3.1 --api-mode), default and
    strict profiles: `valid`, should_filter false, no pattern matched at all."""
    path = DIST[arch]
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    _kernelguard_or_skip()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    verdicts = _tools_bundle().kernelguard_verdicts(text)
    for profile, v in verdicts.items():
        assert v["classification"] == "valid" and not v["should_filter"] and v["matched_patterns"] == [], (profile, v)


@pytest.mark.parametrize("arch", ["gfx950", "sm90a"])
def test_made_bundles_exec_nothing_and_end_with_custom_kernel(arch):
    """No exec / eval / compile / importlib anywhere in the file (embedded binding included), and
    custom_kernel is the last top-level definition with nothing after it."""
    path = DIST[arch]
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert not re.findall(r"\b(?:exec|eval|compile)\s*\(|importlib|__import__", text)
    tree = ast.parse(text)
    assert isinstance(tree.body[-1], ast.FunctionDef) and tree.body[-1].name == "custom_kernel"
    assert [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))][-1] == "custom_kernel"


def test_kernelguard_refuses_an_exec_bundle(tmp_path):
    """The gate is real: the old way (an importer that execs embedded source) is refused."""
    _kernelguard_or_skip()
    b = _tools_bundle()
    bad = "import base64\nsrc = base64.b64decode('cHJpbnQoMSk=')\nexec(compile(src, 'x', 'exec'))\n" \
          "def custom_kernel(data):\n    return data\n"
    problems = b.kernelguard_problems(bad)
    assert problems and any("OBFUSCATED_EXEC" in p for p in problems), problems
