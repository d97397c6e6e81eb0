"""Read GPU code objects (an sm_90a cubin, a gfx9 hsaco: both ELF64) without a GPU or a toolkit:
sections, symbols, a symbol's bytes, and the AMDGPU metadata note (msgpack: the kernels' names,
kernarg segment sizes and each argument's offset and size). Used by the build (tools/embed.py:
it reads each kernel's LaunchInfo out of its object) and by the tests that check what the host
packs against what the object declares.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

EM_CUDA, EM_AMDGPU = 190, 224
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS = 2, 7, 8
NT_AMDGPU_METADATA = 32


class CodeObjectError(ValueError):
    pass


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    shndx: int
    bind: int
    type: int


class Elf:
    def __init__(self, data: bytes):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise CodeObjectError("not a little-endian ELF64 file")
        self.data = bytes(data)
        (self.type, self.machine) = struct.unpack_from("<HH", data, 16)
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx]
        self.sections = [Section(self._str(names[4], r[0]), r[1], r[3], r[4], r[5], r[6]) for r in raw]
        self.end = max([shoff + shnum * shentsize] +
                       [s.offset + s.size for s in self.sections if s.type != SHT_NOBITS])
        self.symbols: dict[str, Symbol] = {}
        for s in self.sections:
            if s.type != SHT_SYMTAB:
                continue
            strtab = self.sections[s.link]
            for j in range(s.size // 24):
                n, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, s.offset + j * 24)
                name = self._str(strtab.offset, n)
                if name:
                    self.symbols[name] = Symbol(name, value, size, shndx, info >> 4, info & 0xF)

    def _str(self, table_offset: int, index: int) -> str:
        start = table_offset + index
        return self.data[start:self.data.index(b"\0", start)].decode()

    @property
    def vendor(self) -> str:
        return {EM_CUDA: "nvidia", EM_AMDGPU: "amd"}.get(self.machine, f"machine {self.machine}")

    def symbol_bytes(self, name: str) -> bytes:
        """The initial bytes of a data symbol (a constant the device code defines)."""
        sym = self.symbols.get(name)
        if sym is None:
            raise CodeObjectError(f"no symbol {name!r} in the code object")
        sec = self.sections[sym.shndx]
        if sec.type == SHT_NOBITS:
            raise CodeObjectError(f"symbol {name!r} lives in {sec.name} (no initial bytes)")
        # cubin: a symbol's value is its offset in the section (addr 0); hsaco: a virtual address
        start = sec.offset + sym.value - sec.addr
        return self.data[start:start + sym.size]

    def amdgpu_metadata(self) -> dict:
        """The NT_AMDGPU_METADATA note ("AMDGPU" owner) decoded: amdhsa.version, amdhsa.kernels..."""
        for s in self.sections:
            if s.type != SHT_NOTE:
                continue
            pos, end = s.offset, s.offset + s.size
            while pos + 12 <= end:
                namesz, descsz, ntype = struct.unpack_from("<III", self.data, pos)
                name = self.data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
                desc_at = pos + 12 + (namesz + 3) // 4 * 4
                if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                    value, _ = unpack_msgpack(self.data, desc_at)
                    return value
                pos = desc_at + (descsz + 3) // 4 * 4
        raise CodeObjectError("no AMDGPU metadata note (not a code object v3+ hsaco)")


def unpack_msgpack(buf: bytes, pos: int = 0):
    """One msgpack value at buf[pos:] -> (value, next position). The subset AMDGPU notes use:
    maps, arrays, strings, integers, booleans, nil, floats, binary."""
    b = buf[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F:
        return _map(buf, pos, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _array(buf, pos, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return buf[pos:pos + n].decode(), pos + n
    if b == 0xC0:
        return None, pos
    if b in (0xC2, 0xC3):
        return b == 0xC3, pos
    fixed = {0xCC: "<B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
             0xCA: ">f", 0xCB: ">d"}
    if b in fixed:
        fmt = fixed[b]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    sized = {0xD9: (">B", "str"), 0xDA: (">H", "str"), 0xDB: (">I", "str"), 0xC4: (">B", "bin"),
             0xC5: (">H", "bin"), 0xC6: (">I", "bin"), 0xDC: (">H", "arr"), 0xDD: (">I", "arr"),
             0xDE: (">H", "map"), 0xDF: (">I", "map")}
    if b in sized:
        fmt, kind = sized[b]
        n = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        if kind == "str":
            return buf[pos:pos + n].decode(), pos + n
        if kind == "bin":
            return bytes(buf[pos:pos + n]), pos + n
        return (_array if kind == "arr" else _map)(buf, pos, n)
    raise CodeObjectError(f"msgpack: unsupported type byte 0x{b:02x}")


def _array(buf, pos, n):
    out = []
    for _ in range(n):
        v, pos = unpack_msgpack(buf, pos)
        out.append(v)
    return out, pos


def _map(buf, pos, n):
    out = {}
    for _ in range(n):
        k, pos = unpack_msgpack(buf, pos)
        v, pos = unpack_msgpack(buf, pos)
        out[k] = v
    return out, pos


def amdgpu_kernels(elf: Elf) -> dict:
    """kernel name -> {'kernarg_segment_size', 'args': [(offset, size, value_kind), ...], ...}."""
    meta = elf.amdgpu_metadata()
    out = {}
    for k in meta.get("amdhsa.kernels", []):
        args = [(a[".offset"], a[".size"], a[".value_kind"]) for a in k.get(".args", [])]
        out[k[".name"]] = {"kernarg_segment_size": k[".kernarg_segment_size"], "args": args,
                           "group_segment_fixed_size": k.get(".group_segment_fixed_size"),
                           "max_flat_workgroup_size": k.get(".max_flat_workgroup_size"),
                           "vgpr_spill_count": k.get(".vgpr_spill_count"), "sgpr_spill_count": k.get(".sgpr_spill_count"),
                           "symbol": k.get(".symbol")}
    return out


def code_object_version(elf: Elf) -> int | None:
    """The AMDGPU code object version (amdhsa.version [1, minor]: v5 is 1.2, v6 is 1.3; v4 is 1.1)."""
    v = elf.amdgpu_metadata().get("amdhsa.version")
    return {1: 4, 2: 5, 3: 6}.get(v[1]) if v and v[0] == 1 else None
