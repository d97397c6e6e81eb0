"""The AMD kernel source, run on the CPU.

There is no AMD GPU here, so tools/amd/emu/emu_hip.h stands in for the few HIP/AMDGPU
features the gfx9 kernel uses (threads, barriers, wave shuffles, the MFMA builtins with
their documented operand layouts, v_perm_b32, the fp8 decode of each arch), and
tools/amd/emu/run_gfx9.cpp runs the real mla_decode_gfx9.cuh + combine kernels on inputs
with split, tail, empty and over-split sequences against a float64 reference on the
dequantized inputs (and a bf16 q beyond f16's range), for each format pair the gfx9 kernel implements: fp8 KV (f16 MFMA) with
bf16 or fp8 q, bf16 KV and mxfp4 KV (bf16 MFMA; mxfp4 scale row strides 18 and 24) with bf16
or fp8 q; KV rows contiguous or paged (page sizes 1, 16, 32, 64 in random order, a shared page,
block table or FlashInfer's form, a compile-time page size), the LSE of every case, and page ids
outside the cache (NaN for that sequence alone, error bit 4); and query rows other than 16 heads
x 1 token (8, 32, 128 heads; 2 and 4 query tokens, causal: token t of n sees the first
kv_len - n + 1 + t KV rows, a row seeing none gives 0 and LSE -inf; non-uniform query lengths
on the generic kernel; splits in which some rows see no key; compile-time heads / q_len shapes);
a bf16 q that the library quantizes to fp8 (QFormat::kFp8FromBf16: q_amax_kernel's per-block
maxima, then the per-tensor recipe in the decode) with 32 heads x 2 tokens and 128 heads x 1
token, against float64 on q quantized by that recipe, for the 3 KV formats of an fp8-q kernel;
and a qo_indptr that disagrees with q_len 2 (fp8, bf16 and mxfp4 KV; the generic kernel: a
sequence of 3 tokens, or of 0 in the middle with the grid run last block first, or last; a
static shape: entries off b * q_len), which must set error bit 2 and NaN the rows shapes.cuh
read_query names, the other sequences right. The KV and scale tensors end at a PROT_NONE page,
so an out-of-bounds read crashes the run. This checks every index map of the
AMD kernel (fragments, transposes, masking, dequantization, paging, epilogue, splits); it cannot
check the hardware's speed or the emulation's own reading of the ISA.
"""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
EMU = os.path.join(ROOT, "tools", "amd", "emu")


def _clang():
    for c in ("clang++-21", "clang++-20", "clang++-19", "clang++"):
        path = shutil.which(c)
        if path:
            return path
    return None


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_gfx9_kernel_source_matches_float64_reference(arch, tmp_path):
    clang = _clang()
    if not clang:
        pytest.skip("no clang++ (needs _Float16 and ext_vector_type; `make check-amd` installs clang-19)")
    exe = tmp_path / f"emu_{arch}"
    cmd = [clang, "-std=c++20", "-O1", "-pthread", "-D__HIP_PLATFORM_AMD__", "-DMLAGEN_NO_HIP_RUNTIME_HEADERS",
           "-D__HIP_DEVICE_COMPILE__", f"-D__{arch}__",
           "-include", os.path.join(EMU, "emu_hip.h"), "-I", os.path.join(ROOT, "runtime", "include"),
           os.path.join(EMU, "run_gfx9.cpp"), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    # 6 format pairs x (6 contiguous + 7 paged cases) + |q| > 65504 for the 3 bf16-q pairs + a strided KV view
    # for the 2 fp8-KV pairs, then 6 x 12 query-row cases (one of them paged), 5 bad-qo_indptr cases for one
    # format pair a KV format, and 3 KV formats x 2 cases of the fp8 q quantized from bf16 on the device
    assert run.stdout.count(" ok\n") == 6 * 13 + 3 + 2 + 6 * 12 + 3 * 5 + 3 * 2
    assert run.stdout.count(" combine-split-groups ") == 6  # 19 splits: the combine's three split groups
    assert run.stdout.count("paged") == 6 * 8
    assert run.stdout.count("q-beyond-f16") == 3
    assert run.stdout.count(" rows-") == 6 * 12
    assert run.stdout.count(" qo-") == 3 * 5
    assert run.stdout.count(" q8-") == 3 * 2
    assert run.stdout.count(" q-amax-ok=1 ") == 3 * 2
