"""KernelSpec: the one source of truth for a generated kernel.

A spec's name is fixed-order and tagged; it is the generated file's stem, the C symbol,
the registry entry and the pytest id, and `KernelSpec.parse(name)` gives the spec back.

    mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn
    mla_decode_sm90a_bany_kvany_sany_qbf16_kvfp8e4m3fn      (the generic, runtime-shaped kernel)

Fields that keep their default value are left out of the name; any other value adds a
tag in fixed order after the dtypes (`_h32`, `_ql4`, `_bn64`, `_st3`, `_pg64`).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .facts import KV_FORMATS, MAX_Q_LEN, MAX_SPLITS, NUM_HEADS, PAGE_SIZES, QK_DIM, V_DIM  # noqa: F401 (re-exported)
from .facts import KvFormatFacts  # noqa: F401 (re-exported)

PREFIX = "mla_decode"

# arch -> (vendor, lanes per warp/wavefront, fp8 flavour the arch's hardware decodes)
ARCHS = {
    "sm90a": ("nvidia", 32, "fp8e4m3fn"),
    "gfx950": ("amd", 64, "fp8e4m3fn"),
    "gfx942": ("amd", 64, "fp8e4m3fnuz"),
}
# sm90a's 16-row kernels are the warpgroup (wgmma) body (runtime/include/mlagen/device/
# mla_decode_sm90_wgmma.cuh, every KV format a policy of it), which walks KV in tiles of 64 tokens.
WARPGROUP_BLOCK_N = 64
# KV dtype -> (the most stages, the most that leave two blocks an SM) of its warpgroup kernel
# (facts.py KV_FORMATS warpgroup_stages)
WARPGROUP_KV = {name: f.warpgroup_stages for name, f in KV_FORMATS.items() if "sm90a" in f.archs}
# Tiles an arch's kernels use when neither the tuning table nor the caller says otherwise (every KV
# format alike): sm90a the warpgroup body's 64 tokens and 2 stages (two fp8 / mxfp4 blocks an SM, the
# most a bf16 one takes); AMD tiles of 32, register-staged double buffering.
ARCH_TILES = {"sm90a": dict(block_n=WARPGROUP_BLOCK_N, stages=2), "gfx950": dict(block_n=32, stages=2),
              "gfx942": dict(block_n=32, stages=2)}


def default_tiles(arch: str) -> dict:
    return dict(ARCH_TILES[arch])
# Resident blocks the split heuristic aims for (SMs x blocks per SM of the default tile).
# The generator's heuristic and the runtime's (for the generic kernel, through the
# generated registry) both read this table.
TARGET_BLOCKS = {"sm90a": 132 * 2, "gfx950": 256 * 2, "gfx942": 304 * 2}
NATIVE_FP8_TARGET_BLOCKS = 256  # gfx950 native fp8: one block (144 KB of LDS) on each of 256 CUs
ROWS_BODY_TARGET_BLOCKS = TARGET_BLOCKS["sm90a"] // 2  # the rows body: one block an SM
# The split rule per arch (catalog.heuristic_splits at generation, runtime.cpp generic_splits at run
# time, from the generated registry): the cost of one query row's split partial (its 512 floats
# written and merged), in units of one wave's walk over a 64-token tile. An arch with a cost takes
# the split count of least modelled cost, waves x tiles a split + splits x query rows x cost, over
# 1, 2, 4 .. SPLIT_MAX with at least SPLIT_MIN_TOKENS a split; one without keeps the round-half
# rule (fill the target blocks, at least 256 tokens a split). sm90a: fitted to a sweep of forced
# splits on the H200 (heads 16..128 x batch 1..64 x kv 1k / 8k, bf16 / fp8 q and KV, paged 64):
# within 0.8% of the best split count measured there on the geomean, where the round-half rule was
# 4.7% off (docs/perf.md, splits).
SPLIT_PARTIAL_COST = {"sm90a": 0.0006}
SPLIT_MAX, SPLIT_MIN_TOKENS = 32, 64
# The generic rows body takes a problem only from this much work: batch x tokens a sequence x 16-row
# groups a sequence. Below it the 16-row generic kernel is faster on the H200 (a sweep of fp8 caches,
# paged 64, 32..128 heads x batch 1..64 x kv 1k / 8k, bf16 and fp8 q: 4..11 us faster at 64 and 128
# heads up to 2^17; a tie at 2^18; the rows body 10..50% faster from 2^19): each block of the rows
# body has few tiles to walk there, and its prologue and 64-row partials cost more than re-reading
# the few KV tiles from L2 once per 16 rows (docs/perf.md, query rows). Specialized kernels
# (shapes.txt) keep the catalog's choice.
ROWS_BODY_MIN_WORK = 1 << 18
# The generic kernels' modelled time where it was measured (per (arch, KV dtype)): the runtime picks
# the generic kernel (16-row body or a rows body) and its split count together, the least of
#   waves x (block_us + tiles a split x tile_us) + [splits > 1] x (split_us + splits x query rows x split_row_us)
# over the generic kernels that take the problem and splits 1, 2, 4 .. SPLIT_MAX (at least
# SPLIT_MIN_TOKENS a split); waves: the blocks of a split of every sequence x splits over the kernel's
# target_blocks; query rows: batch x heads x q_len. block_us / tile_us by (q dtype, block_m);
# split_us: a split's fixed cost (the combine launch, the partials' writes), split_row_us: a query row's
# split partial. Where a pair has no entry, the rows body from ROWS_BODY_MIN_WORK on and
# SPLIT_PARTIAL_COST's split rule (the rule before this model). sm90a fp8 KV: least squares on the log times
# of a forced (kernel x splits) sweep of issue 41's 52 serving cells on the H200 (paged 64, shuffled,
# each call after another kernel and the 256 MB flush, both q dtypes, ~1,800 points): the model's pick
# is 0.75% above each cell's fastest on the geomean (worst 1.16x), the rows-body threshold and
# SPLIT_PARTIAL_COST's rule 2.1% (worst 1.61x: 64 heads 64x1024 took the 64-row body at 2 splits,
# 57.8 us, where the 32-row body at 1 split takes 35.9). bf16 KV's sweep fitted the same form to 1.4%
# with a worst pick 1.30x (32 heads 64x1024): not taken (docs/perf.md, the serving matrix).
GENERIC_COSTS = {
    ("sm90a", "fp8e4m3fn"): dict(split_us=7.28, split_row_us=0.00092, blocks={
        ("fp8", 16): (4.94, 1.75), ("bf16", 16): (5.00, 1.75),
        ("fp8", 32): (7.89, 1.27), ("bf16", 32): (8.71, 1.31),
        ("fp8", 64): (14.6, 1.59), ("bf16", 64): (15.9, 1.93)}),
}
Q_DTYPES = ("bf16", "fp8")
# The KV formats: codegen/facts.py KV_FORMATS, one row each (row bytes, stride unit, scale kind, the
# device enum, bf16 operands, the archs that implement it, the warpgroup body's stages).
KV_DTYPES = tuple(KV_FORMATS)

# What the device code implements, per arch. The spec grammar is wider on purpose: formats
# slot in by widening these sets, not by changing names. fp8 means the arch's flavour.
IMPLEMENTED = {arch: {"q_dtype": ("bf16", "fp8"), "kv_dtype": tuple(n for n, f in KV_FORMATS.items() if arch in f.archs)}
               for arch in ARCHS}

ANY = 0  # batch / kv_len / splits of the generic kernel: sizes come at run time

DEFAULTS = dict(num_heads=16, q_len=1, qk_dim=QK_DIM, v_dim=V_DIM, block_n=32, stages=4, block_m=16, page_size=0)
# optional tags, in name order: tag -> field
OPTIONAL_TAGS = (("h", "num_heads"), ("ql", "q_len"), ("dk", "qk_dim"), ("dv", "v_dim"),
                 ("bn", "block_n"), ("st", "stages"), ("bm", "block_m"), ("pg", "page_size"))
# KernelSpec.body -> the device code's name for it (runtime/include/mlagen/device/mla_common.cuh
# enum Body), which the generated file passes in the kernel's tiling type.
BODIES = {
    "sm90_wgmma": "Body::kSm90Wgmma",           # 16 rows, one warpgroup, every format (decode_wgmma: WgKv)
    "sm90_rows": "Body::kSm90Rows",             # 32 / 64 rows, three warpgroups: fp8, bf16 KV (a RowsKv policy)
    "gfx9": "Body::kGfx9",                      # 16 rows, MFMA, every format (mla_decode_gfx9.cuh decode_gfx9: Gfx9*Kv)
    "gfx950_fp8": "Body::kGfx950Fp8",           # the native fp8 datapath
}
ROWS_A_BLOCK = 16  # query rows a row group (shapes.cuh QueryRows::kRows): the block of every body but the rows one
# block_m 32 / 64: the sm90a rows body (runtime/include/mlagen/device/mla_decode_sm90_rows.cuh),
# three warpgroups (S, and O by halves) over 32 or 64 query rows, fp8 or bf16 KV in tiles of 64
# (a format is a policy of the body: RowsKv), one block an SM
ROWS_BODY_BLOCK_M = 64  # the rows of 64 and more
ROWS_BODY_BLOCK_MS = (32, 64)  # 32: heads x q_len of 32 (32 heads, or 16 heads x 2 tokens); a generic kernel each
# The rows body's tiles (facts.py KV_FORMATS rows_tile), with what their kernels are built with.
# Stages by (block_m, q dtype), also the validation's limit: the O groups hold one ring slot while
# S reads the next, so the body wants several stages beside Q and the P slots, under 227 KB.
# "e4m3", fp8 KV (36 KB stages; Q block_m x 576 bytes, twice for a bf16 q's hi + lo; two P slots of
# block_m x 64 f16): 64 rows as many as fit; 32 rows 4 with a bf16 q (5 fit; 5 measured 159.8
# against 157.3 us with 4, in a build whose wgmmas ptxas had serialized: no measured gain), 5 with
# an fp8 q. "bf16" (72 KB stages, Q block_m x 1152 bytes of bf16 for either q): 2, all that fits
# (64 rows: 144 + 72 KB of Q = 216 KB; each tile's P^T goes into its own rope atom, 219 KB in all);
# "bf16_expanded" (mxfp4): the bf16 tile, each O thread reading its share of the next tile's rows
# into registers (no staging memory); 32 rows only: at 64 rows those ~25 registers beside the 128
# accumulators made ptxas spill (334 B stored / 888 B loaded, in every warpgroup's code), so 64..128
# rows a sequence run in blocks of 32.
ROWS_TILES = {"e4m3": dict(block_n=WARPGROUP_BLOCK_N, stage_kb=36,
                           stages={(64, "bf16"): 3, (64, "fp8"): 4, (32, "bf16"): 4, (32, "fp8"): 5}),
              "bf16": dict(block_n=WARPGROUP_BLOCK_N, stage_kb=72,
                           stages={(64, "bf16"): 2, (64, "fp8"): 2, (32, "bf16"): 2, (32, "fp8"): 2})}
ROWS_TILES["bf16_expanded"] = dict(ROWS_TILES["bf16"], stages={k: n for k, n in ROWS_TILES["bf16"]["stages"].items()
                                                                if k[0] == 32})
# (arch, kv dtype) -> the rows body's tiles: where it exists
ROWS_BODY = {("sm90a", name): ROWS_TILES[f.rows_tile] for name, f in KV_FORMATS.items()
             if f.rows_tile is not None and "sm90a" in f.archs}


def rows_body_tiles(arch: str, q_dtype: str, kv_dtype: str, rows: int | None = None,
                    block_m: int | None = None) -> dict | None:
    """The rows body's KernelSpec tiles (block_n, stages, block_m) for these formats and
    heads x q_len rows (the largest block_m the tile has that divides them), or for block_m itself
    (a generic rows kernel), or None where it does not apply."""
    tiles = ROWS_BODY.get((arch, kv_dtype))
    if tiles is None:
        return None
    if block_m is None:
        rows = ROWS_BODY_BLOCK_M if rows is None else rows
        block_m = next((m for m in sorted(ROWS_BODY_BLOCK_MS, reverse=True)
                        if rows % m == 0 and (m, q_dtype) in tiles["stages"]), None)
    if block_m is None or (block_m, q_dtype) not in tiles["stages"]:
        return None
    return dict(block_n=tiles["block_n"], stages=tiles["stages"][(block_m, q_dtype)], block_m=block_m)


def row_groups(num_heads: int, q_len: int) -> int:
    """Blocks of ROWS_A_BLOCK query rows a sequence (runtime/include/mlagen/internal.h row_groups)."""
    return -(-num_heads * q_len // ROWS_A_BLOCK)
# KV row bytes, the unit of kv_stride_token in bytes, and the scale kind (KV_FORMATS)
KV_LAYOUT = {name: (f.row_bytes, f.stride_unit, f.scale) for name, f in KV_FORMATS.items()}


class SpecError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class KernelSpec:
    arch: str
    batch: int          # 0 = any (generic kernel)
    kv_len: int         # 0 = any (generic kernel)
    splits: int         # 0 = chosen at run time (generic kernel)
    q_dtype: str = "bf16"
    kv_dtype: str = "fp8e4m3fn"
    num_heads: int = 16
    q_len: int = 1
    qk_dim: int = QK_DIM
    v_dim: int = V_DIM
    block_n: int = 32   # KV tokens per pipeline tile
    stages: int = 4     # tiles in flight (cp.async ring depth)
    block_m: int = 16   # query rows a block: 16 (a row group), or 32 / 64 (the sm90a rows body)
    page_size: int = 0  # specialized: KV rows in pages of this many (0 = contiguous rows); the
                        # generic kernel (0) reads contiguous or paged rows, page size at run time

    def __post_init__(self):
        self.validate()

    # ---- identity -------------------------------------------------------------------
    @property
    def generic(self) -> bool:
        return self.batch == ANY

    @property
    def name(self) -> str:
        def size(tag, v):
            return f"{tag}any" if v == ANY else f"{tag}{v}"
        parts = [PREFIX, self.arch, size("b", self.batch), size("kv", self.kv_len),
                 size("s", self.splits), f"q{self.q_dtype}", f"kv{self.kv_dtype}"]
        for tag, field in OPTIONAL_TAGS:
            v = getattr(self, field)
            if v != DEFAULTS[field]:
                parts.append(f"{tag}{v}")
        return "_".join(parts)

    @property
    def filename(self) -> str:
        return f"{self.name}.hip"

    @property
    def vendor(self) -> str:
        return ARCHS[self.arch][0]

    @property
    def lanes(self) -> int:
        return ARCHS[self.arch][1]

    @property
    def warpgroup(self) -> bool:
        """An sm90a warpgroup (wgmma) kernel of 16 rows a block (one warpgroup; fp8, mxfp4 or bf16
        KV): every sm90a kernel but the rows body's."""
        return self.arch == "sm90a" and not self.rows_body

    @property
    def rows_body(self) -> bool:
        """The sm90a rows body: 32 or 64 query rows a block (three warpgroups), fp8 or bf16 KV."""
        return self.block_m in ROWS_BODY_BLOCK_MS

    @property
    def native_fp8(self) -> bool:
        """The gfx950 kernel on the native fp8 datapath (fp8 KV x fp8 q on the fp8 MFMAs, no
        dequantization: runtime/include/mlagen/device/mla_decode_gfx950_fp8.cuh). Its block
        is 4 waves that each walk their own 32-token tiles, one block a CU (144 KB of LDS),
        and it merges its own splits."""
        return self.arch == "gfx950" and self.kv_dtype == "fp8e4m3fn"

    @property
    def merges_own_splits(self) -> bool:
        """The decode merges its own splits (its last block of a sequence combines the partials):
        no `_combine` entry. The generated file static_asserts this against the body's own trait."""
        return self.native_fp8

    @property
    def merges_in_launch(self) -> bool:
        """The decode can merge its splits inside its own launch (the 16-row sm90a bodies: every
        split block of a row group merges a slice of it once all have arrived). The host uses it
        when the grid is resident at once (a cooperative launch); its `_combine` entry serves the
        rest. The generated file static_asserts this against the body's own trait."""
        return self.vendor == "nvidia" and not self.rows_body and not self.merges_own_splits

    @property
    def entry_points(self) -> tuple[str, ...]:
        """The code object's kernels (templates/kernel.hip.j2): the decode; `_q8` and `_amax` for an
        fp8 q (the decode that quantizes a bf16 q itself, after its amax pre-pass); `_combine` when
        the kernel may split and does not merge its own splits."""
        names = [self.name]
        if self.q_dtype == "fp8":
            names += [self.name + "_q8", self.name + "_amax"]
        if self.splits != 1 and not self.merges_own_splits:
            names.append(self.name + "_combine")
        return tuple(names)

    @property
    def body(self) -> str:
        """Which device-code body the kernel runs (BODIES: the name the generated file passes to
        the device code, which never infers a body from the tiles)."""
        if self.vendor == "nvidia":
            if self.rows_body:  # one body, the KV format a policy of it (RowsKv)
                return "sm90_rows"
            return "sm90_wgmma"  # one body, the KV format a policy of it (WgKv)
        if self.native_fp8:
            return "gfx950_fp8"
        return "gfx9"  # one body, the format a policy of it

    @property
    def row_bytes(self) -> int:
        return KV_LAYOUT[self.kv_dtype][0]

    @property
    def stride_unit(self) -> int:
        return KV_LAYOUT[self.kv_dtype][1]

    @property
    def scale_kind(self) -> int:
        return KV_LAYOUT[self.kv_dtype][2]

    @property
    def cost(self) -> tuple:
        """(block_us, tile_us, split_us, split_row_us) of GENERIC_COSTS for a generic kernel the runtime
        chooses by the model (role 1 or 3 of a measured (arch, KV dtype)); zeros otherwise."""
        model = GENERIC_COSTS.get((self.arch, self.kv_dtype))
        if not model or self.role not in (1, 3):
            return (0.0, 0.0, 0.0, 0.0)
        block_us, tile_us = model["blocks"][(self.q_dtype, self.block_m)]
        return (block_us, tile_us, model["split_us"], model["split_row_us"])

    @property
    def target_blocks(self) -> int:
        """Resident blocks the split heuristic aims for: SMs x blocks an SM of this tiling
        (the fp8 / mxfp4 warpgroup kernel fits two an SM with 2 stages, 95 / 103 KB; one with
        more; the bf16 one, 165 KB with its 2 stages, one)."""
        if self.native_fp8:
            return NATIVE_FP8_TARGET_BLOCKS
        if self.rows_body:
            return ROWS_BODY_TARGET_BLOCKS
        one_a_sm = self.warpgroup and self.stages > WARPGROUP_KV[self.kv_dtype][1]
        return TARGET_BLOCKS[self.arch] // 2 if one_a_sm else TARGET_BLOCKS[self.arch]

    @property
    def role(self) -> int:
        """0: specialized; 1: the generic kernel; 2: a generic tuning candidate with
        non-default tiles, reachable by name only (make tune measures them); 3: the generic
        rows-body kernel, which the runtime takes instead of 1 when heads x q_len is a multiple
        of 64."""
        if not self.generic:
            return 0
        if self.rows_body:
            return 3
        default = default_tiles(self.arch)
        return 1 if (self.block_n, self.stages) == (default["block_n"], default["stages"]) else 2

    @property
    def key(self) -> tuple:
        """What the runtime looks a problem up by: everything but the tuning choices
        (tuning candidates are told apart by their tiles)."""
        tiles = (self.block_n, self.stages) if self.role == 2 else ("rows", self.block_m) if self.role == 3 else ()
        return (self.arch, self.batch, self.kv_len, self.q_dtype, self.kv_dtype,
                self.num_heads, self.q_len, self.page_size) + tiles

    @property
    def implemented(self) -> bool:
        have = IMPLEMENTED.get(self.arch, {})
        return all(getattr(self, f) in allowed for f, allowed in have.items())

    # ---- parsing --------------------------------------------------------------------
    _NAME_RE = re.compile(
        r"^" + PREFIX + r"_(?P<arch>[a-z0-9]+)_b(?P<batch>any|\d+)_kv(?P<kv_len>any|\d+)"
        r"_s(?P<splits>any|\d+)_q(?P<q>[a-z0-9]+)_kv(?P<kv>[a-z0-9]+)(?P<rest>(_[a-z]+\d+)*)$")

    @classmethod
    def parse(cls, name: str) -> "KernelSpec":
        m = cls._NAME_RE.match(name)
        if not m:
            raise SpecError(f"not a kernel name: {name!r} (expected e.g. "
                            f"'{PREFIX}_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn')")
        def size(v):
            return ANY if v == "any" else int(v)
        kw = dict(arch=m["arch"], batch=size(m["batch"]), kv_len=size(m["kv_len"]),
                  splits=size(m["splits"]), q_dtype=m["q"], kv_dtype=m["kv"])
        tags = dict(OPTIONAL_TAGS)
        seen = []
        for part in filter(None, m["rest"].split("_")):
            tag, val = re.match(r"([a-z]+)(\d+)", part).groups()
            if tag not in tags:
                raise SpecError(f"{name!r}: unknown tag {tag!r} (known: {', '.join(tags)})")
            seen.append(tag)
            kw[tags[tag]] = int(val)
        order = [t for t, _ in OPTIONAL_TAGS if t in seen]
        if seen != order:
            raise SpecError(f"{name!r}: tags out of order; expected {order}")
        spec = cls(**kw)
        if spec.name != name:  # e.g. a default value spelled out
            raise SpecError(f"{name!r} is not canonical; the canonical name is {spec.name!r}")
        return spec

    # ---- validation -----------------------------------------------------------------
    def validate(self):
        def bad(field, expected):
            raise SpecError(f"KernelSpec.{field}={getattr(self, field)!r}: expected {expected}")
        if self.arch not in ARCHS:
            bad("arch", f"one of {sorted(ARCHS)}")
        if self.q_dtype not in Q_DTYPES:
            bad("q_dtype", f"one of {Q_DTYPES}")
        if self.kv_dtype not in KV_DTYPES:
            bad("kv_dtype", f"one of {KV_DTYPES}")
        if self.kv_dtype.startswith("fp8") and self.kv_dtype != ARCHS[self.arch][2]:
            bad("kv_dtype", f"{ARCHS[self.arch][2]} on {self.arch} (the fp8 flavour its hardware decodes)")
        generic = (self.batch == ANY, self.kv_len == ANY, self.splits == ANY)
        if any(generic) and not all(generic):
            bad("batch", "batch, kv_len and splits all 'any' (generic kernel) or all > 0")
        for f in ("batch", "kv_len", "splits"):
            if getattr(self, f) < 0:
                bad(f, "a positive integer (or 0 = any)")
        if self.num_heads not in NUM_HEADS:
            bad("num_heads", f"one of {NUM_HEADS} (query heads: 128 over TP 1..16)")
        if not 1 <= self.q_len <= MAX_Q_LEN:
            bad("q_len", f"1..{MAX_Q_LEN} (query tokens a sequence)")
        if self.generic and (self.num_heads, self.q_len) != (16, 1):
            bad("num_heads", "16 with q_len 1 for the generic kernel (it reads heads and q_len at run time)")
        if (self.qk_dim, self.v_dim) != (QK_DIM, V_DIM):
            bad("qk_dim", f"{QK_DIM} with v_dim {V_DIM} (DeepSeek MLA latent + rope)")
        if self.page_size and self.page_size not in PAGE_SIZES:
            bad("page_size", f"0 (contiguous rows) or one of {PAGE_SIZES}")
        if self.page_size and self.generic:
            bad("page_size", "0 for the generic kernel (it reads the page size at run time)")
        if self.block_n not in (32, 64):
            bad("block_n", "32 or 64")
        if self.arch == "sm90a" and self.block_n != WARPGROUP_BLOCK_N:
            bad("block_n", f"{WARPGROUP_BLOCK_N} on sm90a (the warpgroup and rows bodies walk KV in tiles of "
                           f"{WARPGROUP_BLOCK_N} tokens)")
        wg_top = WARPGROUP_KV[self.kv_dtype][0] if self.warpgroup else None
        if wg_top and self.stages > wg_top:
            bad("stages", f"{'2' if wg_top == 2 else f'2..{wg_top}'} with block_n {WARPGROUP_BLOCK_N} on sm90a "
                          f"{self.kv_dtype} (the warpgroup kernel's stages beside its q and P, under 227 KB)")
        if self.block_m not in (ROWS_A_BLOCK,) + ROWS_BODY_BLOCK_MS:
            bad("block_m", f"{ROWS_A_BLOCK} or {' or '.join(map(str, ROWS_BODY_BLOCK_MS))} (query rows a block)")
        if self.rows_body:
            tiles = ROWS_BODY.get((self.arch, self.kv_dtype))
            if not tiles or self.block_n != tiles["block_n"]:
                bad("block_m", f"{ROWS_A_BLOCK} except for {', '.join(f'{a} {k}' for a, k in ROWS_BODY)} KV with "
                               f"block_n {WARPGROUP_BLOCK_N} (the rows body)")
            if not self.generic and (self.num_heads * self.q_len) % self.block_m:
                bad("block_m", f"{ROWS_A_BLOCK} unless the kernel's heads x q_len is a multiple of {self.block_m} "
                               "(the generic rows kernel: checked at run time)")
            if self.page_size:
                bad("page_size", f"0 with block_m {self.block_m} (the rows body's kernels read contiguous rows; paged "
                                 "problems take the generic kernel)")
            top = tiles["stages"].get((self.block_m, self.q_dtype)) if tiles else None
            if tiles and top is None:
                bad("block_m", f"one of {sorted({m for m, _ in tiles['stages']})} with {self.kv_dtype} KV (the rows "
                               "body's blocks for this format)")
            elif top is not None and not 2 <= self.stages <= top:
                bad("stages", f"{'2' if top == 2 else f'2..{top}'} with block_m {self.block_m}, a {self.q_dtype} q "
                              f"and {self.kv_dtype} KV (the rows body: {tiles['stage_kb']} KB a stage beside q and "
                              "the P slots, under 227 KB)")
        if not 2 <= self.stages <= 8:
            bad("stages", "2..8")
        if self.vendor == "amd" and self.stages != 2:
            bad("stages", "2 on AMD (register-staged double buffering)")
        if not self.generic:
            tiles = -(-self.kv_len // self.block_n)
            if self.splits > max(1, tiles):
                bad("splits", f"at most {max(1, tiles)} (kv_len {self.kv_len} is {tiles} tiles of {self.block_n})")
            if self.splits > MAX_SPLITS:
                bad("splits", f"at most {MAX_SPLITS}")

    def replace(self, **kw) -> "KernelSpec":
        return dataclasses.replace(self, **kw)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["name"] = self.name
        return d
