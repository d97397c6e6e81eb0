"""The libraries' code objects and host dependencies, read without a GPU.

* Every entry point the library may launch (mlagen_entry_point_at: the arguments the host packs)
  is declared by its code object with exactly those arguments: for the gfx950 library the
  leaderboard bundle embeds, from the object's own amdhsa.kernels note (offsets, sizes,
  by_value), code object v5; for the sm90a library, the entry exists in its cubin.
* Each object's LaunchInfo constant, read from the object's bytes, is the one the library's table
  holds (tools/embed.py copied it at build time).
* The libraries need no GPU runtime at link time (no libamdhip64 / libcuda / libcudart among NEEDED)
  and no glibc symbol version newer than Ubuntu 24.04's (2.39), no libstdc++ at all (linked in).
"""
import ctypes
import os
import re
import struct
import subprocess
import sys

import pytest

from tool_module import ROOT, load_tool

sys.path.insert(0, ROOT)
from tools.codeobj import Elf, amdgpu_kernels, code_object_version  # noqa: E402

bundle = load_tool("bundle.py", "bundle_for_code_objects")
embed = load_tool("embed.py", "embed_for_code_objects")

SUBMISSION = os.path.join(ROOT, "dist", "submission.py")
SM90A = os.environ.get("MLAGEN_LIBRARY") or os.path.join(ROOT, "build", "sm90a", "libmlagen.so")
UBUNTU_2404_GLIBC = (2, 39)


class CodeObject(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class EntryPoint(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("code_object", ctypes.c_int32), ("num_args", ctypes.c_int32),
                ("arg_bytes", ctypes.c_int32 * 2), ("arg_align", ctypes.c_int32 * 2), ("threads", ctypes.c_int32),
                ("smem_bytes", ctypes.c_int32)]


def _open(path):
    L = ctypes.CDLL(path)
    L.mlagen_num_code_objects.restype = L.mlagen_num_entry_points.restype = ctypes.c_int32
    L.mlagen_code_object_at.argtypes = [ctypes.c_int32, ctypes.POINTER(CodeObject)]
    L.mlagen_entry_point_at.argtypes = [ctypes.c_int32, ctypes.POINTER(EntryPoint)]
    L.mlagen_build_archs.restype = ctypes.c_char_p
    objects = []
    for i in range(L.mlagen_num_code_objects()):
        o = CodeObject()
        assert L.mlagen_code_object_at(i, ctypes.byref(o)) == 0
        objects.append((o.name.decode(), ctypes.string_at(o.data, o.size)))
    entries = []
    for i in range(L.mlagen_num_entry_points()):
        e = EntryPoint()
        assert L.mlagen_entry_point_at(i, ctypes.byref(e)) == 0
        entries.append({"name": e.name.decode(), "object": e.code_object,
                        "args": [(e.arg_bytes[k], e.arg_align[k]) for k in range(e.num_args)],
                        "threads": e.threads, "smem": e.smem_bytes})
    return L, objects, entries


@pytest.fixture(scope="module")
def gfx950_library(tmp_path_factory):
    """The library dist/submission.py carries (make bundle), written out as its import would."""
    if not os.path.exists(SUBMISSION):
        pytest.skip(f"{SUBMISSION} not built (make bundle; CI builds it before the tests)")
    path = tmp_path_factory.mktemp("bundle") / "libmlagen.so"
    path.write_bytes(bundle.unpack_library(open(SUBMISSION, encoding="utf-8").read()))
    return str(path)


def _host_packing(args):
    """(offset, size, 'by_value') of each argument as packed one after another at its alignment."""
    out, offset = [], 0
    for size, align in args:
        offset = (offset + align - 1) // align * align
        out.append((offset, size, "by_value"))
        offset += size
    return out, offset


def test_bundle_code_objects_declare_what_the_host_packs(gfx950_library):
    L, objects, entries = _open(gfx950_library)
    assert L.mlagen_build_archs() == b"gfx950"
    assert objects and len(entries) >= len(objects)
    notes = {}
    for name, data in objects:
        elf = Elf(data)
        assert elf.vendor == "amd", name
        assert code_object_version(elf) == 5, name  # what ROCm 6.x and 7.x runtimes both load
        assert len(data) == elf.end, f"{name}: the embedded bytes are not exactly one ELF file"
        notes[name] = amdgpu_kernels(elf)
    for e in entries:
        obj_name = objects[e["object"]][0]
        k = notes[obj_name].get(e["name"])
        assert k is not None, f"{e['name']}: not in {obj_name}'s metadata ({sorted(notes[obj_name])})"
        want, end = _host_packing(e["args"])
        explicit = [a for a in k["args"] if not a[2].startswith("hidden_")]
        assert explicit == want, f"{e['name']}: object declares {explicit}, the host packs {want}"
        assert k["kernarg_segment_size"] >= end
        assert k["max_flat_workgroup_size"] >= e["threads"], e["name"]
        assert (k["group_segment_fixed_size"] or 0) + e["smem"] <= 160 * 1024, f"{e['name']}: over gfx950's LDS"
        assert not k["vgpr_spill_count"], e["name"]  # (an SGPR spill lands in a VGPR lane: check_amd allows it)
    # every kernel's decode entry is there, by its real name
    assert {n for n, _ in objects} <= {e["name"] for e in entries}


def _launch_infos(objects):
    return {name: dict(zip(embed.LAUNCH_FIELDS, struct.unpack(embed.LAUNCH_FORMAT,
                                                              Elf(data).symbol_bytes(name + "_launch"))))
            for name, data in objects}


def test_bundle_launch_info_is_the_objects_own(gfx950_library):
    L, objects, entries = _open(gfx950_library)
    infos = _launch_infos(objects)
    for e in entries:
        name = objects[e["object"]][0]
        i = infos[name]
        assert i["magic"] == embed.MAGIC and i["params_bytes"] == embed.PARAMS_BYTES
        kind = e["name"][len(name):]
        want = {"": (i["threads"], i["smem_bytes"]), "_q8": (i["q8_threads"], i["q8_smem_bytes"]),
                "_amax": (i["amax_threads"], 0), "_combine": (i["combine_threads"], 0)}[kind]
        assert (e["threads"], e["smem"]) == want, e["name"]


def test_sm90a_cubins_hold_every_entry_point():
    if not os.path.exists(SM90A):
        pytest.skip(f"{SM90A} not built (make)")
    L, objects, entries = _open(SM90A)
    assert L.mlagen_build_archs() == b"sm90a"
    symbols = {name: Elf(data) for name, data in objects}
    for name, elf in symbols.items():
        assert elf.vendor == "nvidia", name
    for e in entries:
        name = objects[e["object"]][0]
        assert e["name"] in symbols[name].symbols, f"{e['name']} not in {name}'s cubin"
        if e["name"] in (name, name + "_q8"):
            rows = _launch_infos([(name, symbols[name].data)])[name]["rows_body"]
            assert len(e["args"]) == (2 if rows else 1), e
    infos = _launch_infos(objects)
    assert all(i["params_bytes"] == embed.PARAMS_BYTES for i in infos.values())


# The `_q8` entry (a bf16 q quantized to fp8 in the kernel) against the same kernel's decode entry:
# it adds the wait for the pre-pass, the max|q| reduction and one out-of-line quantizer
# (formats.cuh quantize_q4): 5.6-9.0 KB at aa5e226. Inlined, the quantizer's 18 copies were
# 37-44 KB of code every block runs once, and the generic `_q8` decode paid 14.7 us more kernel
# time than it does out of line (docs/perf.md, fp8 q).
Q8_CODE_GROWTH_MAX = 12 * 1024


def test_sm90a_q8_entries_stay_near_their_decode_entries_code():
    if not os.path.exists(SM90A):
        pytest.skip(f"{SM90A} not built (make)")
    _, objects, _ = _open(SM90A)
    checked = 0
    for name, data in objects:
        text = {s.name[len(".text."):]: s.size for s in Elf(data).sections if s.name.startswith(".text.")}
        if name + "_q8" not in text:
            continue
        growth = text[name + "_q8"] - text[name]
        assert growth <= Q8_CODE_GROWTH_MAX, (
            f"{name}_q8: {text[name + '_q8']} bytes of code against {text[name]} for {name}: +{growth} "
            f"(at most {Q8_CODE_GROWTH_MAX}: keep the q quantizer out of line)")
        checked += 1
    assert checked >= 10, f"only {checked} sm90a objects have a _q8 entry"


def _readelf(path, *flags):
    return subprocess.run(["readelf", *flags, path], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("which", ["gfx950 bundle", "sm90a"])
def test_library_links_no_gpu_runtime_and_ubuntu_2404_glibc(which, request):
    path = request.getfixturevalue("gfx950_library") if which == "gfx950 bundle" else SM90A
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(path, "-d"))
    assert needed, "readelf found no NEEDED entries"
    bad = [n for n in needed if re.match(r"lib(amdhip64|cuda|cudart|hsa-runtime64|stdc\+\+)", n)]
    assert not bad, f"{which}: links {bad} (the runtime is resolved at run time; libstdc++ is linked in)"
    assert set(needed) <= {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "ld-linux-x86-64.so.2"}, needed
    versions = set(re.findall(r"\b(GLIBC_\d+(?:\.\d+)*|GLIBCXX_[\d.]+|CXXABI_[\d.]+)\b", _readelf(path, "-V")))
    assert not [v for v in versions if not v.startswith("GLIBC_")], f"{which}: needs {versions}"
    newest = max(tuple(int(x) for x in v[6:].split(".")) for v in versions)
    assert newest <= UBUNTU_2404_GLIBC, f"{which}: needs GLIBC {newest}, Ubuntu 24.04 has 2.39"


@pytest.mark.parametrize("which", ["gfx950 bundle", "sm90a"])
def test_library_exports_only_its_c_abi(which, request):
    """The statically linked libstdc++ stays private (CMakeLists.txt: --exclude-libs, a version
    script): an exported std:: symbol would be bound across copies in a process that also loads the
    system's libstdc++ (torch), one copy's locale facets and stream state used by the other's code."""
    path = request.getfixturevalue("gfx950_library") if which == "gfx950 bundle" else SM90A
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    out = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True, check=True).stdout
    defined = [f[7] for f in (line.split() for line in out.splitlines())
               if len(f) >= 8 and f[6] != "UND" and f[4] in ("GLOBAL", "WEAK") and f[3] in ("FUNC", "OBJECT")]
    assert any(n.startswith("mlagen_run") for n in defined), f"{which}: mlagen_run not exported: {defined[:10]}"
    foreign = [n for n in defined if not n.startswith("mlagen_")]
    assert not foreign, f"{which}: exports {len(foreign)} symbols beyond the C ABI, e.g. {foreign[:5]}"
