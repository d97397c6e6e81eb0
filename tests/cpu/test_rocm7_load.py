"""The leaderboard bundle (dist/submission.py, gfx950) imports in a process whose torch carries
ROCm 7's HIP runtime under ROCm 7's name, and only that: torch is stood in by a package whose
lib/ holds a libamdhip64.so.7 (tests/fixtures/hip_runtime_stub.cpp: the module API, answering
as the runtime would, recording each call) that the package loads on import, as torch's own
libraries do. The import must succeed without falling back; the loader must take that runtime
(found among the loaded objects, whatever its suffix); every code object handed to
hipModuleLoadData must be byte for byte one the bundle embeds; each entry point must be looked up
by its real name in its own object. No GPU and no ROCm here: what runs on the MI355X is the same
library and the same calls against the real runtime.
"""
import ctypes
import os
import subprocess
import sys

import pytest

from tool_module import ROOT, load_tool

bundle = load_tool("bundle.py", "bundle_for_rocm7")
SUBMISSION = os.path.join(ROOT, "dist", "submission.py")
STUB_SRC = os.path.join(ROOT, "tests", "fixtures", "hip_runtime_stub.cpp")
TASK_STUB = os.path.join(ROOT, "bench", "leaderboard", "stub")

FAKE_TORCH = '''"""Stands in for torch 2.10+rocm7.1: loads its lib/libamdhip64.so.7 as torch's libraries would."""
import ctypes as _ctypes
import os as _os

_hip = _ctypes.CDLL(_os.path.join(_os.path.dirname(__file__), "lib", "libamdhip64.so.7"))
__version__ = "2.10.0+rocm7.1 (stand-in)"


class Tensor:
    pass


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_name(*args):
        return "stub HIP runtime"
'''

PROBE = '''
import json, sys
import submission
print(json.dumps({"bundle": submission.MLAGEN_BUNDLE, "fallback": submission._STATE["why"]}))
'''


def fnv1a64(data: bytes) -> str:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.fixture(scope="module")
def rocm7_torch(tmp_path_factory):
    if not os.path.exists(SUBMISSION):
        pytest.skip(f"{SUBMISSION} not built (make bundle; CI builds it before the tests)")
    root = tmp_path_factory.mktemp("rocm7")
    lib = root / "torch" / "lib"
    lib.mkdir(parents=True)
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wl,-soname,libamdhip64.so.7", "-o",
                        str(lib / "libamdhip64.so.7"), STUB_SRC], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH)
    assert sorted(os.listdir(lib)) == ["libamdhip64.so.7"]  # no other runtime name to find
    return root


def test_bundle_imports_against_rocm7_named_runtime(rocm7_torch, tmp_path):
    log = tmp_path / "hip_calls.log"
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "submission.py").write_text(open(SUBMISSION, encoding="utf-8").read(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLAGEN_", "LD_", "PYTHON"))}
    env.update(PYTHONPATH=os.pathsep.join([str(rocm7_torch), TASK_STUB, str(dist)]), MLAGEN_STUB_LOG=str(log),
               MLAGEN_BUNDLE_DIR=str(tmp_path / "unpack"), PYTHONNOUSERSITE="1")
    r = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "falling back" not in r.stderr, r.stderr
    import json
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["fallback"] is None
    info = result["bundle"]
    assert info["arch"] == "gfx950"
    assert info["gpu_runtime"] == str(rocm7_torch / "torch" / "lib" / "libamdhip64.so.7"), info
    assert not os.listdir(tmp_path / "unpack"), "the bundle left its package folder behind"

    # what the library embeds: its code objects and entry points
    raw = bundle.unpack_library(open(SUBMISSION, encoding="utf-8").read())
    libfile = tmp_path / "libmlagen.so"
    libfile.write_bytes(raw)
    from tests.cpu.test_code_objects import _open
    _, objects, entries = _open(str(libfile))

    calls = log.read_text().splitlines()
    loads = [c.split()[1:] for c in calls if c.startswith("load ")]
    functions = [c.split()[1:] for c in calls if c.startswith("function ")]
    embedded = {(str(len(data)), fnv1a64(data)): name for name, data in objects}
    loaded_names = [embedded.get(tuple(x)) for x in loads]
    assert None not in loaded_names, f"an image that is not one of the embedded code objects was loaded: {loads}"
    assert sorted(loaded_names) == sorted(n for n, _ in objects), "every code object loaded once (mlagen_load_kernels)"
    looked_up = {(loaded_names[int(m)], name) for m, name in functions}
    want = {(objects[e["object"]][0], e["name"]) for e in entries}
    assert looked_up == want, f"missing {sorted(want - looked_up)[:4]}, unexpected {sorted(looked_up - want)[:4]}"
    assert not [c for c in calls if c == "launch"], "the import launched a kernel"
