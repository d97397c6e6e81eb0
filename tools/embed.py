#!/usr/bin/env python3
"""Embed the compiled code objects of one arch into the host library.

    python tools/embed.py --arch sm90a --gen-dir generated --objects build/sm90a/objects \
        --out-asm build/sm90a/code_objects.S --out-inc build/sm90a/code_objects.inc

For each kernel of the arch in the generated set's manifest (sorted by name, as the registry),
reads its code object (<objects>/<name>.cubin on NVIDIA, .hsaco on AMD) and checks it before the
library can carry it: the object is for the arch's vendor; it defines exactly the entry points
its spec names (codegen/spec.py KernelSpec.entry_points); its `<name>_launch` constant (kernel_abi.h
LaunchInfo) has the right magic and version and says that the device compiler laid out Params and
the KV maps at the sizes the host packs; on AMD, the object's own metadata note declares for each
entry point the arguments the host packs (offsets and sizes) and the object is code object v5.
Writes an assembly file that includes each object's bytes (.incbin) and the C++ table
(runtime/src/gpu.h CodeObject) with each object's LaunchInfo as the device compiler wrote it.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
from codegen.spec import KernelSpec  # noqa: E402
from tools.codeobj import Elf, amdgpu_kernels, code_object_version  # noqa: E402

LAUNCH_FIELDS = ("magic", "version", "threads", "smem_bytes", "q8_threads", "q8_smem_bytes", "rows_per_block",
                 "fused_combine", "rows_body", "params_bytes", "maps_bytes", "combine_threads", "amax_threads",
                 "merge_in_launch")
LAUNCH_FORMAT = "<I13i"
MAGIC, VERSION = 0x4C414C4D, 2  # kernel_abi.h kLaunchInfoMagic / kLaunchInfoVersion
PARAMS_BYTES, PARAMS_ALIGN = 288, 8  # kernel_abi.h: static_assert(sizeof(Params) == 288)
MAPS_BYTES, MAPS_ALIGN = 256, 128  # kernel_abi.h KvMapsAbi
SUFFIXES = ("", "_q8", "_amax", "_combine")  # runtime/src/gpu.h kEntrySuffix (bit k)
EXTENSION = {"nvidia": ".cubin", "amd": ".hsaco"}
AMD_CODE_OBJECT_VERSION = 5


class EmbedError(Exception):
    pass


def launch_info(elf: Elf, name: str) -> dict:
    raw = elf.symbol_bytes(name + "_launch")
    if len(raw) != struct.calcsize(LAUNCH_FORMAT):
        raise EmbedError(f"{name}_launch: {len(raw)} bytes, expected {struct.calcsize(LAUNCH_FORMAT)} (kernel_abi.h "
                         f"LaunchInfo)")
    info = dict(zip(LAUNCH_FIELDS, struct.unpack(LAUNCH_FORMAT, raw)))
    if info["magic"] != MAGIC or info["version"] != VERSION:
        raise EmbedError(f"{name}_launch: magic 0x{info['magic']:x} version {info['version']}, expected "
                         f"0x{MAGIC:x} version {VERSION}")
    return info


def host_args(spec: KernelSpec, entry: str, info: dict) -> list[tuple[int, int]]:
    """(size, alignment) of each argument the host packs for `entry` (runtime.cpp entry_at)."""
    decode = entry in (spec.name, spec.name + "_q8")
    args = [(PARAMS_BYTES, PARAMS_ALIGN)]
    if decode and info["rows_body"]:
        args.append((MAPS_BYTES, MAPS_ALIGN))
    return args


def check_amd_args(elf: Elf, spec: KernelSpec, entries: list[str], info: dict) -> None:
    """The object's amdhsa.kernels note against what the host packs, entry by entry."""
    version = code_object_version(elf)
    if version != AMD_CODE_OBJECT_VERSION:
        raise EmbedError(f"{spec.name}: code object v{version}, expected v{AMD_CODE_OBJECT_VERSION} (-mcode-object-version=5)")
    kernels = amdgpu_kernels(elf)
    for entry in entries:
        k = kernels.get(entry)
        if k is None:
            raise EmbedError(f"{spec.name}: the metadata note has no kernel {entry} (has: {', '.join(sorted(kernels))})")
        explicit = [a for a in k["args"] if not a[2].startswith("hidden_")]
        offset, want = 0, []
        for size, align in host_args(spec, entry, info):
            offset = (offset + align - 1) // align * align
            want.append((offset, size, "by_value"))
            offset += size
        if explicit != want:
            raise EmbedError(f"{entry}: the code object declares arguments {explicit}, the host packs {want}")
        if k["kernarg_segment_size"] < offset:
            raise EmbedError(f"{entry}: kernarg segment {k['kernarg_segment_size']} bytes < the {offset} the host packs")


def check(spec: KernelSpec, elf: Elf, vendor: str) -> tuple[dict, int]:
    if elf.vendor != vendor:
        raise EmbedError(f"{spec.name}: a {elf.vendor} code object, expected {vendor} for {spec.arch}")
    info = launch_info(elf, spec.name)
    want = list(spec.entry_points)
    have = [spec.name + s for s in SUFFIXES if spec.name + s in elf.symbols]
    if sorted(have) != sorted(want):
        raise EmbedError(f"{spec.name}: entry points {have}, its spec names {want}")
    if info["params_bytes"] != PARAMS_BYTES:
        raise EmbedError(f"{spec.name}: the device compiler made Params {info['params_bytes']} bytes, the host packs "
                         f"{PARAMS_BYTES}")
    if info["rows_body"] != int(spec.rows_body) or info["maps_bytes"] != (MAPS_BYTES if spec.rows_body else 0):
        raise EmbedError(f"{spec.name}: rows_body {info['rows_body']} maps_bytes {info['maps_bytes']} disagree with the spec")
    if (info["q8_threads"] > 0) != (spec.name + "_q8" in want):
        raise EmbedError(f"{spec.name}: q8_threads {info['q8_threads']} but entries {want}")
    if info["fused_combine"] != int(spec.merges_own_splits):
        raise EmbedError(f"{spec.name}: fused_combine {info['fused_combine']}, spec merges_own_splits {spec.merges_own_splits}")
    if info["merge_in_launch"] != int(spec.merges_in_launch):
        raise EmbedError(f"{spec.name}: merge_in_launch {info['merge_in_launch']}, spec merges_in_launch {spec.merges_in_launch}")
    if vendor == "amd":
        check_amd_args(elf, spec, want, info)
    bits = sum(1 << i for i, s in enumerate(SUFFIXES) if spec.name + s in want)
    return info, bits


def embed(arch: str, gen_dir: str, objects: str, out_asm: str, out_inc: str) -> int:
    with open(os.path.join(gen_dir, "manifest.json")) as f:
        manifest = json.load(f)
    specs = sorted((KernelSpec(**{k: v for k, v in d.items() if k != "name"}) for d in manifest["kernels"]
                    if d["arch"] == arch), key=lambda s: s.name)
    if not specs:
        raise EmbedError(f"no {arch} kernels in {gen_dir}/manifest.json")
    vendor = specs[0].vendor
    asm = ["/* Generated by tools/embed.py: the code objects of this build, one symbol pair each. */",
           '\t.section .rodata.mlagen_code_objects,"a",@progbits']
    rows = []
    for i, s in enumerate(specs):
        path = os.path.abspath(os.path.join(objects, s.name + EXTENSION[vendor]))
        with open(path, "rb") as f:
            elf = Elf(f.read())
        info, bits = check(s, elf, vendor)
        if any(c in path for c in '"\\\n'):
            raise EmbedError(f"{path}: a path .incbin cannot quote")
        asm += ["\t.balign 64", f"\t.globl mlagen_co_{i}", f"\t.globl mlagen_co_{i}_end", f"\t.hidden mlagen_co_{i}",
                f"\t.hidden mlagen_co_{i}_end",
                f"mlagen_co_{i}:", f'\t.incbin "{path}"', f"mlagen_co_{i}_end:"]
        fields = ", ".join(str(info[k]) if k != "magic" else f"0x{info[k]:x}u" for k in LAUNCH_FIELDS)
        rows.append(f'    {{"{s.name}", mlagen_co_{i}, mlagen_co_{i}_end, {bits}, {{{fields}}}}},')
    asm.append('\t.section .note.GNU-stack,"",@progbits')
    inc = [f"// Generated by tools/embed.py for {arch} ({len(specs)} code objects, fingerprint {manifest['fingerprint']}); "
           "do not edit.",
           "// Each row: a kernel's code object (its bytes come from code_objects.S), its entry points (gpu.h",
           "// EntryKind bits) and the LaunchInfo its device compile wrote (kernel_abi.h field order).",
           'extern "C" {']
    inc += [f"extern const unsigned char mlagen_co_{i}[], mlagen_co_{i}_end[];" for i in range(len(specs))]
    inc += ["}", "static const mlagen::CodeObject kCodeObjects[] = {"] + rows + ["};"]
    for path, lines in ((out_asm, asm), (out_inc, inc)):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        text = "\n".join(lines) + "\n"
        if os.path.exists(path) and open(path).read() == text:
            continue
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return len(specs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True)
    ap.add_argument("--gen-dir", required=True, help="the generated folder (its manifest.json)")
    ap.add_argument("--objects", required=True, help="folder of <kernel>.cubin / <kernel>.hsaco")
    ap.add_argument("--out-asm", required=True)
    ap.add_argument("--out-inc", required=True)
    a = ap.parse_args(argv)
    try:
        n = embed(a.arch, a.gen_dir, a.objects, a.out_asm, a.out_inc)
    except (EmbedError, OSError, ValueError) as e:
        print(f"embed: {e}", file=sys.stderr)
        return 1
    print(f"embed: {n} {a.arch} code objects checked and embedded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
