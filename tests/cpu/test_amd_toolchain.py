"""CPU tests of the AMD compile check (tools/amd/): the assembly parser on a fixed snippet, and,
where tools/amd/setup_toolchains.sh has set the toolchains up, the self-test kernel compiled
device-only for gfx942 (clang-19) and gfx950 (clang-21 in the sid chroot), a failing kernel
that must fail, and the gfx950 shared-library link. A missing toolchain is a skip whose reason
is the one setup_toolchains.sh recorded in status.json; a kernel that does not compile fails."""
import json
import os
import subprocess
import sys

import pytest

from tool_module import load_tool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
AMD = os.path.join(ROOT, "tools", "amd")
CHECK = os.path.join(AMD, "check_amd.py")
ca = load_tool("amd/check_amd.py", "mlagen_check_amd")
CHROOT = ca.default_chroot()
STATUS = ca.read_status(CHROOT)

# (arch, route) -> the MFMA mnemonics the self-test must produce there
SELFTEST_MFMA = {
    ("gfx942", "clang19"): {"v_mfma_f32_16x16x16_bf16": 2, "v_mfma_f32_16x16x32_fp8_fp8": 1},
    ("gfx942", "clang21"): {"v_mfma_f32_16x16x16_bf16": 2, "v_mfma_f32_16x16x32_fp8_fp8": 1},
    ("gfx950", "clang21"): {"v_mfma_f32_16x16x32_bf16": 1, "v_mfma_f32_16x16x32_fp8_fp8": 1},
}


def _toolchain_or_skip(arch, route):
    tc = ca.find_toolchain(arch, route, CHROOT, STATUS)
    if not tc.usable:
        hint = "" if STATUS else " (no status.json: tools/amd/setup_toolchains.sh has not run here)"
        pytest.skip(f"AMD toolchain {arch}/{route} unavailable: {tc.why}{hint}")
    return tc


def _run_check(args, tmp_path):
    out = tmp_path / "amd-check"
    r = subprocess.run([sys.executable, CHECK, "--out", str(out), "--chroot", CHROOT] + args,
                       capture_output=True, text=True, timeout=900)
    report_path = out / "check_amd.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return r, report


# ------------------------------------------------------------------ parser (no toolchain needed)

SNIPPET = """\t.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
\t.text
\t.globl\tkern
\t.type\tkern,@function
kern:
\tv_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], 0
\tv_mfma_f32_16x16x32_bf16 a[0:3], v[4:7], v[8:11], a[0:3]
\ts_getpc_b64 s[16:17]
\ts_add_u32 s16, s16, helper@rel32@lo+4
\ts_addc_u32 s17, s17, helper@rel32@hi+12
\ts_swappc_b64 s[30:31], s[16:17]
\ts_getpc_b64 s[16:17]
\ts_add_u32 s16, s16, __ocml_exp_f32@rel32@lo+4
\ts_addc_u32 s17, s17, __ocml_exp_f32@rel32@hi+12
\ts_swappc_b64 s[30:31], s[16:17]
\ts_endpgm
.Lfunc_end0:
\t.type\thelper,@function
helper:
\tv_mfma_f32_16x16x32_fp8_fp8 a[0:3], v[0:1], v[2:3], a[0:3]
\ts_setpc_b64 s[30:31]
.Lfunc_end1:
\t.amdhsa_kernel kern
\t\t.amdhsa_group_segment_fixed_size 4096
\t\t.amdhsa_private_segment_fixed_size 16
\t\t.amdhsa_uses_dynamic_stack 1
\t.end_amdhsa_kernel
; Kernel info:
; NumVgprs: 40
; NumAgprs: 4
; TotalNumVgprs: 44
; ScratchSize: 16
; LDSByteSize: 4096 bytes/workgroup (compile time only)
; Occupancy: 8
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     4
    .args:
      - .offset:         0
        .size:           8
        .value_kind:     global_buffer
    .group_segment_fixed_size: 4096
    .name:           kern
    .private_segment_fixed_size: 16
    .sgpr_count:     22
    .sgpr_spill_count: 1
    .symbol:         kern.kd
    .uses_dynamic_stack: true
    .vgpr_count:     44
    .vgpr_spill_count: 3
    .wavefront_size: 64
amdhsa.target:   amdgcn-amd-amdhsa--gfx950
...
\t.end_amdgpu_metadata
"""


def test_parse_asm_snippet():
    (k,) = ca.parse_asm(SNIPPET)
    assert k.name == "kern"
    assert k.mfma == {"v_mfma_f32_16x16x32_bf16": 2, "v_mfma_f32_16x16x32_fp8_fp8": 1}  # + local callee
    assert (k.vgprs, k.agprs, k.vgpr_total, k.sgprs) == (40, 4, 44, 22)
    assert (k.vgpr_spills, k.sgpr_spills, k.scratch, k.lds, k.occupancy) == (3, 1, 16, 4096, 8)
    assert k.dynamic_stack is True
    assert k.local_calls == ["helper"] and k.external_calls == ["__ocml_exp_f32"]
    fails = " | ".join(ca.check_kernel(k, dict(ca.DEFAULT_EXPECT)))
    for what in ("VGPR spills 3 > 0", "scratch bytes 16 > 0", "dynamic stack", "__ocml_exp_f32"):
        assert what in fails
    assert ca.check_kernel(k, {**ca.DEFAULT_EXPECT, "min_mfma": 4})[0].startswith("3 MFMA")


def test_no_amd_sources_is_not_a_failure(tmp_path):
    src = tmp_path / "gen"
    src.mkdir()
    (src / "mla_decode_sm90a_x.hip").write_text("// not AMD\n")
    r, report = _run_check(["--sources", str(src)], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "NO AMD SOURCES" in r.stdout and report["summary"]["sources"] == 0


# ------------------------------------------------------------------ with the toolchains

@pytest.mark.parametrize("arch,route", sorted(SELFTEST_MFMA), ids=lambda v: v)
def test_selftest_compiles_with_mfma_and_no_spills(tmp_path, arch, route):
    _toolchain_or_skip(arch, route)
    r, report = _run_check(["--selftest", "--archs", arch, "--gfx942-route", route], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    (res,) = [x for x in report["results"] if x["arch"] == arch and x["route"] == route]
    assert res["ok"] and res["compile_ok"], res
    (k,) = res["kernels"]
    assert k["name"] == "mlagen_selftest_kernel"
    assert k["mfma"] == SELFTEST_MFMA[(arch, route)]
    assert k["vgpr_spills"] == 0 and k["scratch"] == 0 and not k["dynamic_stack"]
    assert not k["external_calls"]
    assert k["lds"] == 2 * 4 * 64 * 8 * 2          # sa + sb: 4 waves x 64 lanes x 8 bf16 each
    assert 0 < k["vgprs"] <= 512 and k["agprs"] >= 4 and k["wavefront_size"] == 64
    assert k["max_flat_workgroup_size"] == 256
    with open(os.path.join(ROOT, res["asm"]) if not os.path.isabs(res["asm"]) else res["asm"]) as fh:
        assert f'amdgcn-amd-amdhsa--{arch}' in fh.read()


def test_failing_kernel_fails(tmp_path):
    _toolchain_or_skip("gfx942", "clang19")
    src = tmp_path / "gen"
    src.mkdir()
    (src / "mla_decode_gfx942_nomfma.hip").write_text(
        '#include "mlagen/platform.h"\n'
        'extern "C" __global__ void k_nomfma(float* p) { p[threadIdx.x] = __shfl_xor(p[threadIdx.x], 1); }\n')
    (src / "mla_decode_gfx942_combine.hip").write_text(       # exempt from the MFMA rule by name
        '#include "mlagen/platform.h"\n'
        'extern "C" __global__ void my_kernel_combine(float* p) { p[threadIdx.x] *= 2.0f; }\n')
    (src / "mla_decode_gfx942_broken.hip").write_text(
        '#include "mlagen/platform.h"\nextern "C" __global__ void k_broken(float* p) { p[0] = nope; }\n')
    r, report = _run_check(["--sources", str(src), "--archs", "gfx942"], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    by = {os.path.basename(x["source"]): x for x in report["results"]}
    assert not by["mla_decode_gfx942_broken.hip"]["compile_ok"]
    assert "nope" in by["mla_decode_gfx942_broken.hip"]["errors"]
    nomfma = by["mla_decode_gfx942_nomfma.hip"]
    assert nomfma["compile_ok"] and not nomfma["ok"]
    assert "0 MFMA instructions" in nomfma["kernels"][0]["failures"][0]
    assert by["mla_decode_gfx942_combine.hip"]["ok"]


def test_gfx950_code_object_through_the_chroot_compiler(tmp_path):
    """tools/amd/hip-device-cc (the device compiler of make bundle / make lib-amd without ROCm)
    turns a HIP source into a plain gfx950 code object v5 that tools/codeobj.py reads."""
    _toolchain_or_skip("gfx950", "clang21")
    sys.path.insert(0, ROOT)
    from tools.codeobj import Elf, amdgpu_kernels, code_object_version
    out = tmp_path / "selftest.hsaco"
    r = subprocess.run([os.path.join(AMD, "hip-device-cc"), "-x", "hip", "--offload-arch=gfx950", "--offload-device-only",
                        "--no-gpu-bundle-output", "-O3", "-mcode-object-version=5", "-I", os.path.join(ROOT, "runtime", "include"),
                        "-o", str(out), os.path.join(AMD, "selftest.hip")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    elf = Elf(out.read_bytes())
    assert elf.vendor == "amd" and code_object_version(elf) == 5
    assert any("mlagen_selftest" in k for k in amdgpu_kernels(elf)), sorted(amdgpu_kernels(elf))
