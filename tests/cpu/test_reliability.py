"""CPU tests of the runtime's reliability checks that need no GPU: what the runtime refuses
before any launch, the launch target of the binding, extra shapes generating outside the
committed tree."""
import ctypes
import os
import subprocess

import pytest

from mlagen import _lib  # noqa: E402
from mlagen._lib import Problem  # noqa: E402

from codegen import catalog  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout


def _refused(p, match):
    with pytest.raises(_lib.MlagenError, match=match) as e:
        _lib.select(p)
    assert e.value.status == _lib.ERR_INVALID


def test_batch_beyond_a_grid_dimension_is_refused(L):
    """gridDim.y is at most 65535: a larger batch used to pass validation and fail at launch,
    after the combine had been launched on stale partials."""
    _refused(Problem.make(65536, 64), r"batch=65536: expected 1\.\.65535")
    assert _lib.select(Problem.make(65535, 64))["generic"]


@pytest.mark.parametrize("field,value,match", [
    ("kv_scale", 0x3002, "kv_scale: address 0x3002 not 4-byte aligned"),
    ("q_scale", 0x7001, "q_scale: address 0x7001 not 4-byte aligned"),
    ("qo_indptr", 0x4002, "qo_indptr: address 0x4002 not 4-byte aligned"),
    ("kv_indptr", 0x5003, "kv_indptr: address 0x5003 not 4-byte aligned"),
])
def test_scale_and_indptr_alignment_is_checked(L, field, value, match):
    kw = dict(q_dtype="fp8") if field == "q_scale" else {}
    assert _lib.select(Problem.make(4, 1024, **kw))  # aligned: accepted
    _refused(Problem.make(4, 1024, **{field: value}, **kw), match)


def test_a_named_kernel_refuses_other_splits(L):
    """decode(kernel=<specialized>, splits=3) used to run the kernel's own split count silently."""
    spec = next(s for s in catalog.build_catalog() if (s.arch, s.batch, s.kv_len, s.q_dtype, s.kv_dtype)
                == ("sm90a", 4, 1024, "bf16", "fp8e4m3fn"))
    wrong = 3 if spec.splits != 3 else 5
    _refused(Problem.make(4, 1024, kernel_name=spec.name.encode(), splits=wrong),
             f"splits={wrong}: kernel_name={spec.name} runs {spec.splits} splits")
    assert _lib.select(Problem.make(4, 1024, kernel_name=spec.name.encode(), splits=spec.splits))["splits"] == spec.splits
    generic = catalog.generic_spec("sm90a", "bf16", "fp8e4m3fn").name
    assert _lib.select(Problem.make(4, 1024, kernel_name=generic.encode(), splits=3))["splits"] == 3


def test_device_field(L):
    _refused(Problem.make(4, 1024, device=-2), "device=-2: expected a device index, or -1")
    assert Problem.make(4, 1024).device == -1  # the current device


def test_problem_has_no_stream_and_an_older_abi_version_is_refused(L):
    """The stream is a launch argument (mlagen_decode / mlagen_run), not part of the problem;
    a problem of a previous ABI is refused by its version."""
    assert "stream" not in {f for f, _ in Problem._fields_}
    old = _lib.ABI_VERSION - 1
    _refused(Problem.make(4, 1024, abi_version=old), f"abi_version={old}: expected {_lib.ABI_VERSION}")


def test_extra_shapes_generate_into_the_build_folder():
    """`make SHAPES=...` leaves the committed generated/ alone: the generator writes the extra
    kernels under the build folder (a dry run shows the commands)."""
    r = subprocess.run(["make", "-n", "build", "SHAPES=48x2048", "BUILD=build/shapes-test"], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    gen = [line for line in r.stdout.splitlines() if "codegen generate" in line]
    want = os.path.join(ROOT, "build", "shapes-test", "generated")
    assert gen and all(f"--out {want}" in line for line in gen), r.stdout
    assert f"-DMLAGEN_GEN_DIR={want}" in r.stdout
    plain = subprocess.run(["make", "-n", "build"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"--out {os.path.join(ROOT, 'generated')}" in plain


def test_workspace_bytes_follow_the_layout(L):
    """Per-plan scratch is sized from mlagen_workspace_bytes: the error word and q maxima
    (1 KB), when split the fixed region of split arrival counters (4 x 65536 bytes), then per
    split and head (m, l) and a 512-float partial output."""
    p = Problem.make(32, 8192)
    splits = _lib.select(p)["splits"]
    ml = 32 * splits * 16 * 8
    o_off = (1024 + 4 * 65536 + ml + 255) // 256 * 256
    assert L.mlagen_workspace_bytes(ctypes.byref(p)) == o_off + 32 * splits * 16 * 512 * 4
    one = Problem.make(256, 8192)
    assert _lib.select(one)["splits"] == 1 and L.mlagen_workspace_bytes(ctypes.byref(one)) == 1024
