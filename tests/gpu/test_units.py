"""GPU unit checks of device helpers, compiled with nvcc and run on the GPU (skipped, with the
reason, where there is no GPU)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
pytestmark = pytest.mark.gpu


def _nvcc():
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def test_mxfp4_table_decode_matches_the_fp32_route(tmp_path):
    nvcc = _nvcc()
    assert nvcc, "nvcc not found (the GPU machine builds the library with it)"
    exe = tmp_path / "mxfp4_table_decode"
    build = subprocess.run([nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a",
                            "-I", os.path.join(ROOT, "runtime", "include"), "-o", str(exe),
                            os.path.join(ROOT, "tests", "gpu", "mxfp4_table_decode.cu")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    print(run.stdout)
    assert run.returncode == 0 and "mismatches: 0 " in run.stdout, run.stdout + run.stderr
