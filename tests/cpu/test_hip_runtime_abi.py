"""The loader's view of HIP (runtime/src/gpu.cpp declares the few HIP types and values it uses
instead of including ROCm's headers) against a real HIP runtime: Debian's ROCm 6.4 in the AMD
toolchain's sid chroot (no ROCm 7 runtime is in Debian or on PyPI; the module API's names and these
values are the same in 7.x, and tests/cpu/test_rocm7_load.py loads the bundle under ROCm 7's file name).

* HIP's own header agrees with what gpu.cpp assumes: hipSuccess 0, hipMemcpyDeviceToHost 2, handles
  pointer-sized, and every function the loader resolves declared with the signature it calls.
* The gfx950 library the bundle carries, told to use that real libamdhip64.so.6, resolves every entry
  point from it and then fails only where a machine without a GPU must: at the first device call,
  with the runtime's own error, never with a missing symbol.
"""
import json
import os
import shutil
import subprocess

import pytest

from tool_module import ROOT, load_tool

bundle = load_tool("bundle.py", "bundle_for_hip_abi")
CHROOT = os.environ.get("MLAGEN_AMD_CHROOT") or os.path.join(ROOT, ".toolchains", "sid")
HIP_LIB = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.6"
SUBMISSION = os.path.join(ROOT, "dist", "submission.py")

# The declarations gpu.cpp makes, checked against hip_runtime_api.h by the compiler.
HEADER_CHECK = r'''
#include <hip/hip_runtime_api.h>
#include <type_traits>
static_assert(hipSuccess == 0, "gpu.cpp: hipSuccess 0");
static_assert(hipMemcpyDeviceToHost == 2, "gpu.cpp: hipMemcpyDeviceToHost 2");
static_assert(sizeof(hipError_t) == sizeof(int), "gpu.cpp: hipError_t is an int");
static_assert(sizeof(hipModule_t) == sizeof(void*) && sizeof(hipFunction_t) == sizeof(void*) &&
              sizeof(hipStream_t) == sizeof(void*), "gpu.cpp: handles are pointers");
using E = hipError_t;
static_assert(std::is_same_v<decltype(&hipGetDevice), E (*)(int*)>);
static_assert(std::is_same_v<decltype(&hipSetDevice), E (*)(int)>);
static_assert(std::is_same_v<decltype(&hipGetDeviceCount), E (*)(int*)>);
static_assert(std::is_same_v<decltype(&hipModuleLoadData), E (*)(hipModule_t*, const void*)>);
static_assert(std::is_same_v<decltype(&hipModuleGetFunction), E (*)(hipFunction_t*, hipModule_t, const char*)>);
static_assert(std::is_same_v<decltype(&hipModuleLaunchKernel),
              E (*)(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, hipStream_t,
                    void**, void**)>);
static_assert(std::is_same_v<decltype(&hipMemcpyAsync), E (*)(void*, const void*, size_t, hipMemcpyKind, hipStream_t)>);
static_assert(std::is_same_v<decltype(&hipMemsetAsync), E (*)(void*, int, size_t, hipStream_t)>);
static_assert(std::is_same_v<decltype(&hipStreamSynchronize), E (*)(hipStream_t)>);
static_assert(std::is_same_v<decltype(&hipGetErrorString), const char* (*)(hipError_t)>);
int main() { return 0; }
'''

PROBE = r'''
#include <dlfcn.h>
#include <cstdio>
int main(int, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW);
  if (!h) { std::printf("{\"dlopen\": false}\n"); return 1; }
  auto load = (int (*)(int))dlsym(h, "mlagen_load_kernels");
  auto err = (const char* (*)())dlsym(h, "mlagen_last_error");
  auto rt = (const char* (*)())dlsym(h, "mlagen_gpu_runtime");
  int st = load(-1);
  std::printf("{\"status\": %d, \"runtime\": \"%s\", \"error\": \"", st, rt());
  for (const char* c = err(); *c; ++c) if (*c != '"' && *c != '\\') std::putchar(*c);
  std::printf("\"}\n");
  return 0;
}
'''


def _chroot_or_skip():
    if not os.path.exists(os.path.join(CHROOT, "usr", "bin", "clang++-21")) or \
            not os.path.exists(CHROOT + HIP_LIB):
        pytest.skip(f"no AMD toolchain chroot with clang-21 and {HIP_LIB} at {CHROOT} (tools/amd/setup_toolchains.sh)")
    if os.geteuid() != 0:
        pytest.skip("the chroot needs root")


def _in_chroot(tmp_name, files, *cmd):
    work = os.path.join(CHROOT, "work", f"hipabi-{os.getpid()}-{tmp_name}")
    os.makedirs(work, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(work, name), "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
    inner = "/work/" + os.path.basename(work)
    r = subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", CHROOT, *[c.replace("@", inner) for c in cmd]], capture_output=True, text=True,
                       timeout=600, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": "/root", **{
                           k: v.replace("@", inner) for k, v in os.environ.items() if k == "MLAGEN_HIP_RUNTIME"}})
    subprocess.run(["rm", "-rf", "--one-file-system", work])
    return r


def test_gpu_cpp_hip_declarations_match_the_real_header():
    _chroot_or_skip()
    r = _in_chroot("hdr", {"check.cpp": HEADER_CHECK}, "/usr/bin/clang++-21", "-std=c++17", "-D__HIP_PLATFORM_AMD__",
                   "-fsyntax-only", "@/check.cpp")
    assert r.returncode == 0, r.stderr[-3000:]


def test_bundle_library_resolves_every_entry_point_from_real_hip(monkeypatch):
    _chroot_or_skip()
    if not os.path.exists(SUBMISSION):
        pytest.skip(f"{SUBMISSION} not built (make bundle)")
    lib = bundle.unpack_library(open(SUBMISSION, encoding="utf-8").read())
    monkeypatch.setenv("MLAGEN_HIP_RUNTIME", HIP_LIB)
    r = _in_chroot("probe", {"probe.cpp": PROBE, "libmlagen.so": lib}, "sh", "-c",
                   "/usr/bin/clang++-21 -std=c++17 -o @/probe @/probe.cpp && MLAGEN_HIP_RUNTIME=" + HIP_LIB +
                   " @/probe @/libmlagen.so")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["runtime"] == HIP_LIB  # the runtime it was pointed at, no other
    assert "has no hip" not in out["error"] and "no GPU runtime" not in out["error"], out
    # no GPU here: the first device call fails with HIP's own error, after every symbol resolved
    assert out["status"] == 4 and out["error"].startswith("hipGetDevice: "), out
    print("real HIP runtime without a GPU:", out)
