#!/usr/bin/env python3
"""Compile-check the generated AMD HIP sources device-only and inspect their assembly.

    tools/amd/check_amd.py [--sources generated/] [--archs gfx942,gfx950] [--out DIR]
                           [--expect KEY=VALUE ...] [--gfx942-route clang19[,clang21]]
    tools/amd/check_amd.py --selftest          # tools/amd/selftest.hip, both arches

Every file in --sources named mla_decode_gfx942_*.hip or mla_decode_gfx950_*.hip is compiled
for the arch in its name, device-only, to assembly (-S), with -O3 -Werror:

  gfx942, route clang19 (default): Debian bookworm's clang++-19 on the host, with -nogpulib
      -nogpuinc -DMLAGEN_NO_HIP_RUNTIME_HEADERS -include tools/amd/hip_min.h (no ROCm at all;
      hip_min.h declares the HIP spellings the sources use, see there why).
  gfx942, route clang19-hip: clang++-19 with the HIP 6.4 headers of the sid chroot
      (--rocm-path) and -nogpulib: a header check only, since threadIdx/blockIdx and libm become
      calls into device libraries that are not linked (the resource numbers are then not final).
  gfx942, route clang21 / gfx950: clang++-21 inside the Debian sid chroot made by
      tools/amd/setup_toolchains.sh, with its HIP headers and device libraries. The sources are
      copied into <chroot>/work/mlagen-check-<pid>/ and removed afterwards (no mounts).

Each kernel in the assembly is then checked against the expectations (defaults: it compiles, at
least one v_mfma instruction (kernels matching mfma_exempt, default *_combine and *_amax, excepted:
the split combine is a plain reduction), no VGPR spills, no scratch, no dynamic stack, no calls
to functions outside the file). Override with --expect KEY=VALUE (all sources) or a sidecar
<source>.expect.json ({"KEY": VALUE, ...}) next to a source; keys: see DEFAULT_EXPECT.

Exit status: 0 all good (or a toolchain is missing: reported loudly as SKIPPED, with the reason
from setup_toolchains.sh's status.json; or no AMD source exists yet), 1 a kernel fails, 2 usage
error, 3 a toolchain is missing and --require-toolchains was given.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SELFTEST = os.path.join(HERE, "selftest.hip")
HIP_MIN = os.path.join(HERE, "hip_min.h")
ARCHS = ("gfx942", "gfx950")
SOURCE_RE = re.compile(r"^mla_decode_(gfx942|gfx950)_.*\.hip$")
GFX942_ROUTES = ("clang19", "clang19-hip", "clang21")

DEFAULT_EXPECT = {
    "min_kernels": 1,           # kernels in the source's assembly
    "min_mfma": 1,              # v_mfma*/v_smfmac* instructions per kernel (its callees included)
    "mfma_exempt": "*_combine,*_amax",  # matrix-free helpers; comma list of globs (demangled or mangled kernel name)
                                # that min_mfma does not apply to: the split combine is a reduction
    "max_vgpr_spills": 0,
    "max_sgpr_spills": None,    # SGPR spills go to VGPR lanes, not memory: reported, not checked
    "max_scratch": 0,           # private segment bytes per lane
    "allow_dynamic_stack": False,
    "allow_external_calls": False,
    "max_vgprs": None,          # architectural VGPRs (NumVgprs)
    "max_agprs": None,
    "max_sgprs": None,
    "max_lds": None,            # static LDS bytes per workgroup
    "min_occupancy": None,      # waves per SIMD
    "require_mfma": "arch",     # comma list of MFMA mnemonics every non-exempt kernel must use;
                                # "arch" = the intended ones of its arch and KV format
                                # (REQUIRED_MFMA via required_mfma()), "" = none
}
# The matrix instructions each arch's decode kernel is meant to use, per compute path: the fp8
# path runs on f16 operands (the fp8 KV decodes to f16 exactly), the wide path (bf16 and mxfp4
# KV, mxfp4 dequantized to bf16 in LDS) on bf16 operands. gfx950: 16x16x32 (PV, QK pairs);
# gfx942: 16x16x16.
REQUIRED_MFMA = {("gfx950", "f16"): "v_mfma_f32_16x16x32_f16", ("gfx942", "f16"): "v_mfma_f32_16x16x16_f16",
                 # gfx950 fp8 KV: the native fp8 kernel (fp8 x fp8, nothing dequantized)
                 ("gfx950", "fp8"): "v_mfma_f32_16x16x128_f8f6f4,v_mfma_f32_16x16x32_fp8_fp8",
                 ("gfx950", "bf16"): "v_mfma_f32_16x16x32_bf16", ("gfx942", "bf16"): "v_mfma_f32_16x16x16_bf16"}
sys.path.insert(0, REPO)
from codegen.spec import KV_FORMATS  # noqa: E402  (the formats whose MMAs take bf16 operands)

# the KV dtype tag of a generated kernel's name, for the formats computed on bf16 operands
WIDE_KV_RE = re.compile(r"_kv(" + "|".join(n for n, f in KV_FORMATS.items() if f.bf16_operand) + r")(_|\.hip$)")


def required_mfma(arch: str, source: str) -> str:
    """The intended MFMA mnemonic of the kernel in `source` (a generated file name carries its
    KV dtype): bf16 for bf16 / mxfp4 KV, f16 otherwise (fp8 KV, the self-test)."""
    base = os.path.basename(source)
    operands = "bf16" if WIDE_KV_RE.search(base) else ("fp8" if arch == "gfx950" and "_kvfp8" in base else "f16")
    return REQUIRED_MFMA.get((arch, operands), "")


def default_chroot() -> str:
    return os.environ.get("MLAGEN_AMD_CHROOT") or os.path.join(REPO, ".toolchains", "sid")


def rel(path: str) -> str:
    try:
        r = os.path.relpath(path, REPO)
    except ValueError:
        return path
    return path if r.startswith("..") else r


# ----------------------------------------------------------------------------- assembly parsing

@dataclass
class KernelInfo:
    name: str
    demangled: str = ""
    mfma: dict = field(default_factory=dict)        # mnemonic -> count (kernel + local callees)
    vgprs: int | None = None                        # architectural VGPRs (; NumVgprs)
    agprs: int | None = None                        # accumulation VGPRs (.agpr_count)
    vgpr_total: int | None = None                   # unified VGPR file use (.vgpr_count)
    sgprs: int | None = None
    vgpr_spills: int | None = None
    sgpr_spills: int | None = None
    scratch: int | None = None                      # bytes per lane
    dynamic_stack: bool | None = None
    lds: int | None = None                          # static group segment bytes
    occupancy: int | None = None
    max_flat_workgroup_size: int | None = None
    wavefront_size: int | None = None
    code_bytes: int | None = None
    local_calls: list = field(default_factory=list)
    external_calls: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    @property
    def mfma_total(self) -> int:
        return sum(self.mfma.values())

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["mfma_total"] = self.mfma_total
        return d


_INT = re.compile(r"^-?\d+$")


def _num(v: str):
    v = v.strip().strip("'\"")
    if _INT.match(v):
        return int(v)
    if v in ("true", "false"):
        return v == "true"
    return v


MFMA_RE = re.compile(r"^\s*(v_mfma_\w+|v_smfmac_\w+)\b")
CALL_RE = re.compile(r"^\s*(s_swappc_b64|s_setpc_b64|s_call_b64)\b")
SYMREF_RE = re.compile(r"\b([A-Za-z_.$][\w.$]*)@(?:rel32|gotpcrel32|gotpcrel|rel64|abs32)@?(?:lo|hi)?")
COMMENT_KV = re.compile(r"^;\s*([A-Za-z][\w ]*?)\s*[:=]\s*(-?\d+)")


def parse_asm(text: str) -> list[KernelInfo]:
    """Kernels of one AMDGPU assembly file (clang -S): MFMA counts and resource metadata."""
    lines = text.splitlines()
    # functions: ".type NAME,@function" ... "NAME:" ... ".Lfunc_endN:"
    funcs: dict[str, list[str]] = {}
    func_types = set()
    cur = None
    for ln in lines:
        m = re.match(r"^\s*\.type\s+([^,\s]+)\s*,\s*@function", ln)
        if m:
            func_types.add(m.group(1))
            continue
        m = re.match(r"^([A-Za-z_.$][\w.$]*):", ln)
        if m and m.group(1) in func_types and not m.group(1).startswith(".L"):
            cur = m.group(1)
            funcs[cur] = []
            continue
        if cur is not None:
            if re.match(r"^\.Lfunc_end\d+:", ln):
                cur = None
            else:
                funcs[cur].append(ln)

    def body_stats(name: str):
        mf: dict[str, int] = {}
        refs: list[str] = []
        has_call = False
        for ln in funcs.get(name, []):
            code = ln.split(";", 1)[0]
            m = MFMA_RE.match(code)
            if m:
                mf[m.group(1)] = mf.get(m.group(1), 0) + 1
            if CALL_RE.match(code):
                has_call = True
            for r in SYMREF_RE.findall(code):
                if r not in refs:
                    refs.append(r)
        return mf, refs, has_call

    # metadata (YAML between .amdgpu_metadata and .end_amdgpu_metadata)
    meta: dict[str, dict] = {}
    in_meta = False
    entry = None
    for ln in lines:
        s = ln.strip()
        if s == ".amdgpu_metadata":
            in_meta = True
            continue
        if s == ".end_amdgpu_metadata":
            in_meta = False
            continue
        if not in_meta:
            continue
        m = re.match(r"^  - (\.[\w]+):\s*(.*)$", ln)
        if m:                                   # new kernel entry: "  - .agpr_count: 4"
            entry = {m.group(1)[1:]: _num(m.group(2))} if m.group(2) else {}
            meta.setdefault("__entries__", []).append(entry)
            continue
        m = re.match(r"^    (\.[\w]+):\s*(.*)$", ln)
        if m and entry is not None:
            entry[m.group(1)[1:]] = _num(m.group(2)) if m.group(2) else None
        elif re.match(r"^\S", ln):             # "amdhsa.target: ..." ends the list
            entry = None
    by_name = {e.get("name"): e for e in meta.get("__entries__", []) if e.get("name")}

    # ".amdhsa_kernel NAME" blocks, "; Kernel info:" comments and ".set NAME.key, v" symbols
    hsa: dict[str, dict] = {}
    info: dict[str, dict] = {}
    sets: dict[str, dict] = {}
    cur_k = None
    for ln in lines:
        s = ln.strip()
        m = re.match(r"^\.amdhsa_kernel\s+(\S+)", s)
        if m:
            cur_k = m.group(1)
            hsa[cur_k] = {}
            continue
        m = re.match(r"^\.(amdhsa_\w+)\s+(\S+)", s)
        if m and cur_k is not None:
            hsa[cur_k][m.group(1)] = _num(m.group(2))
            continue
        m = re.match(r"^\.set\s+([^,\s]+)\.(\w+)\s*,\s*(\S+)", s)
        if m:
            sets.setdefault(m.group(1), {})[m.group(2)] = _num(m.group(3))
            continue
        if cur_k is not None:
            m = COMMENT_KV.match(s)
            if m:
                info.setdefault(cur_k, {})[m.group(1).strip()] = int(m.group(2))
            if s.startswith("; LDSByteSize:"):
                mm = re.search(r"(\d+)", s)
                if mm:
                    info.setdefault(cur_k, {})["LDSByteSize"] = int(mm.group(1))

    kernel_names = list(by_name) or list(hsa)
    for k in hsa:
        if k not in kernel_names:
            kernel_names.append(k)

    def first(*vals):
        for v in vals:
            if isinstance(v, bool) or isinstance(v, int):
                return v
        return None

    out = []
    for k in kernel_names:
        md, h, ci, st = by_name.get(k, {}), hsa.get(k, {}), info.get(k, {}), sets.get(k, {})
        ki = KernelInfo(name=k)
        # MFMA: the kernel body plus local (defined here) callees, transitively
        seen, todo = set(), [k]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            mf, refs, has_call = body_stats(f)
            for mn, c in mf.items():
                ki.mfma[mn] = ki.mfma.get(mn, 0) + c
            for r in refs:
                if r in funcs:
                    if r != f and r not in ki.local_calls and r != k:
                        ki.local_calls.append(r)
                    todo.append(r)
                elif has_call and not r.startswith((".L", "__hip_cuid")) and r not in ki.external_calls:
                    ki.external_calls.append(r)
        ki.vgprs = first(ci.get("NumVgprs"), st.get("num_vgpr"))
        ki.agprs = first(md.get("agpr_count"), ci.get("NumAgprs"), st.get("num_agpr"))
        ki.vgpr_total = first(md.get("vgpr_count"), ci.get("TotalNumVgprs"), h.get("amdhsa_next_free_vgpr"))
        if ki.vgprs is None:
            ki.vgprs = ki.vgpr_total
        ki.sgprs = first(md.get("sgpr_count"), ci.get("TotalNumSgprs"), ci.get("NumSgprs"))
        ki.vgpr_spills = first(md.get("vgpr_spill_count"))
        ki.sgpr_spills = first(md.get("sgpr_spill_count"))
        scr = [v for v in (md.get("private_segment_fixed_size"), ci.get("ScratchSize"),
                           h.get("amdhsa_private_segment_fixed_size"), st.get("private_seg_size"))
               if isinstance(v, int) and not isinstance(v, bool)]
        ki.scratch = max(scr) if scr else None
        dyn = [v for v in (md.get("uses_dynamic_stack"), h.get("amdhsa_uses_dynamic_stack"),
                           st.get("has_dyn_sized_stack")) if v is not None]
        ki.dynamic_stack = any(bool(v) for v in dyn) if dyn else None
        ki.lds = first(md.get("group_segment_fixed_size"), ci.get("LDSByteSize"),
                       h.get("amdhsa_group_segment_fixed_size"))
        ki.occupancy = first(ci.get("Occupancy"))
        ki.max_flat_workgroup_size = first(md.get("max_flat_workgroup_size"))
        ki.wavefront_size = first(md.get("wavefront_size"))
        ki.code_bytes = first(ci.get("codeLenInByte"))
        out.append(ki)
    return out


def mfma_exempt(ki: KernelInfo, exp: dict) -> bool:
    globs = [g.strip() for g in (exp.get("mfma_exempt") or "").split(",") if g.strip()]
    return any(fnmatch.fnmatchcase(n, g) for g in globs for n in (ki.name, ki.demangled or ki.name))


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> demangled (c++filt from binutils; names stay as they are without it)."""
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    mangled = [n for n in names if n.startswith("_Z")]
    if not tool or not mangled:
        return {}
    try:
        r = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = r.stdout.splitlines()
    return dict(zip(mangled, out)) if r.returncode == 0 and len(out) == len(mangled) else {}


def short_name(k: KernelInfo) -> str:
    n = k.demangled or k.name
    n = re.sub(r"\b(mlagen::device::|mlagen::)", "", n)
    n = re.sub(r"^void\s+", "", n)
    n = re.sub(r"\(.*\)$", "", n)                 # drop the parameter list
    return n.replace(", ", ",")


def check_kernel(ki: KernelInfo, exp: dict) -> list[str]:
    f = []
    if ki.mfma_total < (exp.get("min_mfma") or 0) and not mfma_exempt(ki, exp):
        f.append(f"{ki.mfma_total} MFMA instructions (expected >= {exp['min_mfma']})")

    def cap(val, key, what):
        lim = exp.get(key)
        if lim is None:
            return
        if val is None:
            f.append(f"{what}: not found in the assembly metadata")
        elif val > lim:
            f.append(f"{what} {val} > {lim}")

    cap(ki.vgpr_spills, "max_vgpr_spills", "VGPR spills")
    cap(ki.sgpr_spills, "max_sgpr_spills", "SGPR spills")
    cap(ki.scratch, "max_scratch", "scratch bytes")
    cap(ki.vgprs, "max_vgprs", "VGPRs")
    cap(ki.agprs, "max_agprs", "AGPRs")
    cap(ki.sgprs, "max_sgprs", "SGPRs")
    cap(ki.lds, "max_lds", "LDS bytes")
    if exp.get("min_occupancy") is not None and (ki.occupancy or 0) < exp["min_occupancy"]:
        f.append(f"occupancy {ki.occupancy} < {exp['min_occupancy']}")
    if ki.dynamic_stack and not exp.get("allow_dynamic_stack"):
        f.append("uses a dynamic stack (calls / recursion / dynamic alloca): scratch not bounded")
    if ki.external_calls and not exp.get("allow_external_calls"):
        f.append("calls functions outside the file: " + ", ".join(ki.external_calls[:4]) +
                 " (with -nogpulib: device-library calls; resource numbers are not final)")
    return f


# ----------------------------------------------------------------------------- toolchains

@dataclass
class Toolchain:
    key: str            # route name, e.g. "clang19", "clang21"
    arch: str
    usable: bool
    why: str = ""
    compiler: str = ""
    version: str = ""
    in_chroot: bool = False


def read_status(chroot: str) -> dict:
    p = os.path.join(os.path.dirname(os.path.abspath(chroot).rstrip("/")), "status.json")
    try:
        with open(p) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def _version(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=60)
        return r.stdout.splitlines()[0] if r.returncode == 0 and r.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def chroot_env() -> dict:
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LC_ALL": "C", "HOME": "/root", "TMPDIR": "/tmp"}


def find_toolchain(arch: str, route: str, chroot: str, status: dict) -> Toolchain:
    setup_hint = "run tools/amd/setup_toolchains.sh"
    st_arch = status.get(arch, {}) if isinstance(status.get(arch), dict) else {}
    if route in ("clang19", "clang19-hip"):
        tc = Toolchain(route, arch, False, compiler="clang++-19")
        exe = shutil.which("clang++-19")
        if not exe:
            tc.why = st_arch.get("why") or f"clang++-19 not found ({setup_hint})"
            return tc
        if route == "clang19-hip" and not os.path.isfile(os.path.join(chroot, "usr/include/hip/hip_runtime.h")):
            tc.why = f"no HIP headers in {chroot}/usr/include/hip ({setup_hint})"
            return tc
        tc.usable, tc.version = True, _version([exe])
        return tc
    # clang21 in the chroot
    tc = Toolchain(route, arch, False, compiler="clang++-21", in_chroot=True)
    if not os.path.lexists(os.path.join(chroot, "usr/bin/clang++-21")):
        st950 = status.get("gfx950", {}) if isinstance(status.get("gfx950"), dict) else {}
        tc.why = st950.get("why") or f"no sid chroot with clang++-21 at {chroot} ({setup_hint})"
        return tc
    if os.geteuid() != 0:
        tc.why = "chroot needs root"
        return tc
    try:
        r = subprocess.run(["chroot", chroot, "/usr/bin/clang++-21", "--version"], capture_output=True,
                           text=True, timeout=120, env=chroot_env())
    except (OSError, subprocess.SubprocessError) as e:
        tc.why = f"chroot {chroot} clang++-21 --version failed: {e}"
        return tc
    if r.returncode != 0:
        tc.why = f"chroot {chroot} clang++-21 --version failed: {(r.stderr or r.stdout).strip()[:300]}"
        return tc
    tc.usable, tc.version = True, r.stdout.splitlines()[0] if r.stdout else ""
    return tc


# ----------------------------------------------------------------------------- compiling

@dataclass
class Job:
    source: str           # path on the host
    arch: str
    tc: Toolchain
    expect: dict
    asm: str = ""
    log: str = ""
    cmd: list = field(default_factory=list)
    compile_ok: bool = False
    seconds: float = 0.0
    errors: str = ""
    kernels: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.compile_ok and not self.failures and all(not k.failures for k in self.kernels)


def flags_for(tc: Toolchain, chroot: str) -> list[str]:
    base = ["-x", "hip", f"--offload-arch={tc.arch}", "--offload-device-only", "-O3", "-Werror", "-S"]
    if tc.key == "clang19":
        return base + ["-nogpulib", "-nogpuinc", "-DMLAGEN_NO_HIP_RUNTIME_HEADERS", "-include", HIP_MIN]
    if tc.key == "clang19-hip":
        return base + ["-nogpulib", f"--rocm-path={os.path.join(chroot, 'usr')}"]
    return base


class ChrootStage:
    """Copies runtime/include and the source folders into <chroot>/work/mlagen-check-<pid>/."""

    def __init__(self, chroot: str, src_dirs: list[str]):
        self.chroot = os.path.abspath(chroot)
        self.inner = f"/work/mlagen-check-{os.getpid()}"
        self.host = self.chroot + self.inner
        self.map: dict[str, str] = {}      # host dir -> inner dir
        if os.path.exists(self.host):
            shutil.rmtree(self.host)
        os.makedirs(self.host + "/out")
        shutil.copytree(os.path.join(REPO, "runtime", "include"), self.host + "/runtime/include")
        self.map[os.path.join(REPO, "runtime", "include")] = self.inner + "/runtime/include"
        for i, d in enumerate(dict.fromkeys(os.path.abspath(x) for x in src_dirs)):
            dst = f"/src{i}"
            shutil.copytree(d, self.host + dst, ignore=shutil.ignore_patterns("*.s", "*.o", "__pycache__"))
            self.map[d] = self.inner + dst

    def inside(self, host_path: str) -> str:
        host_path = os.path.abspath(host_path)
        for h, i in sorted(self.map.items(), key=lambda kv: -len(kv[0])):
            if host_path == h or host_path.startswith(h + "/"):
                return i + host_path[len(h):]
        raise KeyError(host_path)

    def unmap(self, text: str) -> str:
        for h, i in sorted(self.map.items(), key=lambda kv: -len(kv[1])):
            text = text.replace(i, rel(h))
        return text.replace(self.inner + "/out/", "")

    def cleanup(self):
        shutil.rmtree(self.host, ignore_errors=True)


def compile_job(job: Job, out_dir: str, chroot: str, stage: ChrootStage | None, timeout: int) -> Job:
    name = os.path.splitext(os.path.basename(job.source))[0]
    tag = f"{job.arch}-{job.tc.key}"
    os.makedirs(os.path.join(out_dir, tag), exist_ok=True)
    job.asm = os.path.join(out_dir, tag, name + ".s")
    job.log = os.path.join(out_dir, tag, name + ".log")
    flags = flags_for(job.tc, chroot)
    src_dir = os.path.dirname(os.path.abspath(job.source))
    if job.tc.in_chroot:
        assert stage is not None
        inner_asm = f"{stage.inner}/out/{tag}-{name}.s"
        cmd = ["chroot", stage.chroot, "/usr/bin/clang++-21"] + flags + [
            "-I", stage.inside(os.path.join(REPO, "runtime", "include")), "-I", stage.inside(src_dir),
            "-o", inner_asm, stage.inside(job.source)]
        env = chroot_env()
    else:
        cmd = [shutil.which("clang++-19") or "clang++-19"] + flags + [
            "-I", os.path.join(REPO, "runtime", "include"), "-I", src_dir, "-o", job.asm, job.source]
        env = dict(os.environ)
    job.cmd = cmd
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, outtxt = r.returncode, (r.stdout or "") + (r.stderr or "")
    except subprocess.TimeoutExpired:
        rc, outtxt = -1, f"compile timed out after {timeout} s"
    job.seconds = time.time() - t
    if stage is not None:
        outtxt = stage.unmap(outtxt)
    with open(job.log, "w") as fh:
        fh.write(" ".join(cmd) + "\n" + outtxt)
    if rc != 0:
        job.errors = outtxt.strip()
        job.failures.append(f"compile failed (rc={rc})")
        return job
    if job.tc.in_chroot:
        shutil.move(stage.host + inner_asm[len(stage.inner):], job.asm)
    job.compile_ok = True
    with open(job.asm, errors="replace") as fh:
        text = fh.read()
    m = re.search(r'\.amdgcn_target\s+"([^"]+)"', text)
    if not m or not m.group(1).split("--")[-1].startswith(job.arch):
        job.failures.append(f"assembly targets {m.group(1) if m else '?'}, not {job.arch}")
    job.kernels = parse_asm(text)
    dm = demangle([k.name for k in job.kernels])
    for k in job.kernels:
        k.demangled = dm.get(k.name, k.name)
    if len(job.kernels) < (job.expect.get("min_kernels") or 0):
        job.failures.append(f"{len(job.kernels)} kernels in the assembly (expected >= {job.expect['min_kernels']})")
    for k in job.kernels:
        k.failures = check_kernel(k, job.expect)
        req = job.expect.get("require_mfma")
        req = required_mfma(job.arch, job.source) if req == "arch" else (req or "")
        if not mfma_exempt(k, job.expect):
            have = set(k.mfma)
            for mn in filter(None, (x.strip() for x in req.split(","))):
                if mn not in have:
                    k.failures.append(f"intended MFMA {mn} not in the assembly (has: {' '.join(sorted(have)) or 'none'})")
    return job


# ----------------------------------------------------------------------------- reporting

def short_mfma(mf: dict) -> str:
    if not mf:
        return "-"
    return " ".join(f"{k[len('v_mfma_'):] if k.startswith('v_mfma_') else k}:{v}" for k, v in sorted(mf.items()))


def fmt(v) -> str:
    return "?" if v is None else str(v)


def print_table(jobs: list[Job]):
    rows = [("source", "arch", "compiler", "kernel", "mfma (mnemonic:count)", "vgpr", "agpr", "sgpr",
             "spill v/s", "scratch", "lds", "occ", "result")]
    for j in jobs:
        src = os.path.basename(j.source)
        comp = j.tc.key
        if not j.compile_ok or not j.kernels:
            rows.append((src, j.arch, comp, "-", "-", "-", "-", "-", "-", "-", "-", "-",
                         "FAIL" if not j.ok else "ok"))
            continue
        for k in j.kernels:
            res = "ok" if (not k.failures and not j.failures) else "FAIL"
            rows.append((src, j.arch, comp, short_name(k), short_mfma(k.mfma), fmt(k.vgprs), fmt(k.agprs), fmt(k.sgprs),
                         f"{fmt(k.vgpr_spills)}/{fmt(k.sgpr_spills)}",
                         fmt(k.scratch) + ("+dyn" if k.dynamic_stack else ""), fmt(k.lds), fmt(k.occupancy), res))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(width[i]) for i, c in enumerate(r)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in width))
    for j in jobs:
        for f in j.failures:
            print(f"FAIL {rel(j.source)} [{j.arch}/{j.tc.key}]: {f}")
        if j.errors:
            for ln in j.errors.splitlines()[:40]:
                print(f"    {ln}")
            print(f"    (full log: {rel(j.log)})")
        for k in j.kernels:
            for f in k.failures:
                print(f"FAIL {rel(j.source)} [{j.arch}/{j.tc.key}] {short_name(k)}: {f}")


def loud_skip(arch: str, route: str, why: str):
    bar = "*" * 78
    print(f"\n{bar}\nSKIPPED (TOOLCHAIN UNAVAILABLE): {arch} [{route}]: {why}\n{bar}\n", flush=True)


# ----------------------------------------------------------------------------- main

def parse_expect(items: list[str]) -> dict:
    out = {}
    for it in items or []:
        if "=" not in it:
            raise SystemExit(f"--expect wants KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        k = k.strip()
        if k not in DEFAULT_EXPECT:
            raise SystemExit(f"--expect: unknown key {k!r} (known: {', '.join(DEFAULT_EXPECT)})")
        v = v.strip()
        if k in ("mfma_exempt", "require_mfma"):
            out[k] = "" if v.lower() in ("none", "") else v
            continue
        out[k] = None if v.lower() in ("none", "any", "") else (
            v.lower() in ("1", "true", "yes") if k.startswith("allow_") else int(v))
    return out


def sidecar_expect(source: str) -> dict:
    p = os.path.splitext(source)[0] + ".expect.json"
    if not os.path.isfile(p):
        return {}
    with open(p) as fh:
        d = json.load(fh)
    bad = [k for k in d if k not in DEFAULT_EXPECT]
    if bad:
        raise SystemExit(f"{p}: unknown keys {bad}")
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sources", default=os.path.join(REPO, "generated"),
                    help="folder with the generated sources (default generated/)")
    ap.add_argument("--archs", default=",".join(ARCHS), help="comma list (default gfx942,gfx950)")
    ap.add_argument("--out", default=os.path.join(REPO, "build", "amd-check"),
                    help="assembly, logs and check_amd.json (default build/amd-check)")
    ap.add_argument("--chroot", default=default_chroot(),
                    help="the sid chroot (default $MLAGEN_AMD_CHROOT or .toolchains/sid)")
    ap.add_argument("--gfx942-route", default=None,
                    help=f"comma list of {', '.join(GFX942_ROUTES)} (default clang19; --selftest: clang19,clang21)")
    ap.add_argument("--expect", action="append", default=[], metavar="KEY=VALUE",
                    help="override an expectation for every kernel, e.g. max_vgprs=256, min_mfma=4")
    ap.add_argument("--selftest", action="store_true", help="check tools/amd/selftest.hip for every arch")
    ap.add_argument("--require-toolchains", action="store_true",
                    help="exit 3 instead of 0 when a toolchain is missing")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per compile")
    a = ap.parse_args(argv)

    archs = [x.strip() for x in a.archs.split(",") if x.strip()]
    for x in archs:
        if x not in ARCHS:
            ap.error(f"unknown arch {x} (known: {', '.join(ARCHS)})")
    routes942 = [x.strip() for x in (a.gfx942_route or ("clang19,clang21" if a.selftest else "clang19")).split(",")]
    for x in routes942:
        if x not in GFX942_ROUTES:
            ap.error(f"unknown gfx942 route {x} (known: {', '.join(GFX942_ROUTES)})")
    expect_cli = parse_expect(a.expect)
    if a.selftest:  # the self-test exercises bf16/fp8 MFMA builtins, not the decode kernels' f16
        expect_cli.setdefault("require_mfma", "")
    chroot = os.path.abspath(a.chroot)
    out_dir = os.path.abspath(a.out)
    os.makedirs(out_dir, exist_ok=True)

    # what to compile: (source, arch)
    if a.selftest:
        pairs = [(SELFTEST, arch) for arch in archs]
        print(f"check_amd: self-test {rel(SELFTEST)} for {', '.join(archs)}")
    else:
        src_dir = os.path.abspath(a.sources)
        names = sorted(os.listdir(src_dir)) if os.path.isdir(src_dir) else []
        pairs = []
        for n in names:
            m = SOURCE_RE.match(n)
            if m and m.group(1) in archs:
                pairs.append((os.path.join(src_dir, n), m.group(1)))
        print(f"check_amd: {len(pairs)} AMD sources in {rel(src_dir)} for {', '.join(archs)}")

    report = {"written_by": "tools/amd/check_amd.py", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "selftest": a.selftest, "chroot": chroot, "toolchains": {}, "skipped": [], "results": [],
              "expect_defaults": {**DEFAULT_EXPECT, **expect_cli}}

    def finish(rc: int) -> int:
        report["exit_status"] = rc
        p = os.path.join(out_dir, "check_amd.json")
        with open(p, "w") as fh:
            json.dump(report, fh, indent=1)
        print(f"check_amd: wrote {rel(p)}; exit {rc}")
        return rc

    if not pairs:
        print("check_amd: NO AMD SOURCES yet (no mla_decode_gfx942_*.hip / mla_decode_gfx950_*.hip): nothing to check")
        report["summary"] = {"sources": 0, "compiled": 0, "failed": 0, "skipped": 0, "note": "no AMD sources"}
        return finish(0)

    status = read_status(chroot)
    tcs: dict[tuple[str, str], Toolchain] = {}
    jobs: list[Job] = []
    skipped = []
    for src, arch in pairs:
        for route in (routes942 if arch == "gfx942" else ["clang21"]):
            if (arch, route) not in tcs:
                tcs[(arch, route)] = find_toolchain(arch, route, chroot, status)
                tc = tcs[(arch, route)]
                report["toolchains"][f"{arch}/{route}"] = {"usable": tc.usable, "why": tc.why,
                                                            "compiler": tc.compiler, "version": tc.version,
                                                            "in_chroot": tc.in_chroot}
                if tc.usable:
                    print(f"check_amd: {arch} [{route}]: {tc.version or tc.compiler}"
                          f"{' (chroot ' + rel(chroot) + ')' if tc.in_chroot else ''}")
                else:
                    loud_skip(arch, route, tc.why)
            tc = tcs[(arch, route)]
            if not tc.usable:
                skipped.append({"source": rel(src), "arch": arch, "route": route, "why": tc.why})
                continue
            exp = {**DEFAULT_EXPECT, **sidecar_expect(src), **expect_cli}
            jobs.append(Job(source=src, arch=arch, tc=tc, expect=exp))
    report["skipped"] = skipped

    stage = None
    if any(j.tc.in_chroot for j in jobs):
        stage = ChrootStage(chroot, sorted({os.path.dirname(os.path.abspath(j.source)) for j in jobs}))

    def on_term(signum, frame):
        raise SystemExit(128 + signum)
    old = signal.signal(signal.SIGTERM, on_term)
    t0 = time.time()
    try:
        with cf.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            futs = [pool.submit(compile_job, j, out_dir, chroot, stage, a.timeout) for j in jobs]
            for f in cf.as_completed(futs):
                j = f.result()
                print(f"  {'ok  ' if j.ok else 'FAIL'} {rel(j.source)} [{j.arch}/{j.tc.key}] {j.seconds:.1f} s", flush=True)
    finally:
        if stage is not None:
            stage.cleanup()
        signal.signal(signal.SIGTERM, old)

    print()
    print_table(jobs)
    failed = [j for j in jobs if not j.ok]
    for j in jobs:
        report["results"].append({
            "source": rel(j.source), "arch": j.arch, "route": j.tc.key, "compiler": j.tc.version or j.tc.compiler,
            "ok": j.ok, "compile_ok": j.compile_ok, "seconds": round(j.seconds, 2), "asm": rel(j.asm),
            "log": rel(j.log), "command": " ".join(j.cmd), "errors": j.errors[:20000], "failures": j.failures,
            "expect": j.expect, "kernels": [k.to_json() for k in j.kernels]})
    report["summary"] = {"sources": len({p[0] for p in pairs}), "compiled": len(jobs), "failed": len(failed),
                         "skipped": len(skipped), "seconds": round(time.time() - t0, 1)}
    print(f"\ncheck_amd: {len(jobs) - len(failed)} passed, {len(failed)} failed, {len(skipped)} skipped "
          f"(toolchain missing) in {time.time() - t0:.1f} s")
    if not a.selftest and not failed and any(j.arch == "gfx950" for j in jobs):
        sys.path.insert(0, HERE)
        import cost_model
        cost = cost_model.cost_report(REPO, chroot, out_dir, report["results"])
        with open(os.path.join(out_dir, "cost.json"), "w") as fh:
            json.dump(cost, fh, indent=1)
        cost_model.print_cost(cost)
        report["cost"] = {"file": rel(os.path.join(out_dir, "cost.json")), "calibration": {
            k: cost["calibration"].get(k) for k in ("modelled_us", "measured_us", "error", "within_15pct", "skipped")}}
        cal = cost["calibration"]
        if "skipped" not in cal and not cal["within_15pct"]:
            print("check_amd: FAIL: the cost model misses the calibration kernel by more than 15%: fix the model first")
            failed.append(None)
    if failed:
        return finish(1)
    if skipped:
        print("check_amd: WARNING: some toolchains are missing (see SKIPPED above); nothing failed")
        return finish(3 if a.require_toolchains else 0)
    return finish(0)


if __name__ == "__main__":
    sys.exit(main())
