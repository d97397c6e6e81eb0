"""Which kernels get built: the leaderboard shapes by default, plus user shapes.

A shape is `BATCHxKV_LEN` (e.g. `48x2048`). Split count and tile choices come from the
tuning table (codegen/tuning.json, written by `make tune`), else from a heuristic.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable

from .spec import (ANY, ARCHS, GENERIC_COSTS, IMPLEMENTED, KV_FORMATS, NATIVE_FP8_TARGET_BLOCKS, ROWS_A_BLOCK,
                   ROWS_BODY_TARGET_BLOCKS, SPLIT_MAX,
                   SPLIT_MIN_TOKENS, SPLIT_PARTIAL_COST, KernelSpec,
                   SpecError, default_tiles, row_groups, rows_body_tiles, ROWS_BODY_BLOCK_MS)

HERE = os.path.dirname(os.path.abspath(__file__))
TUNING_FILE = os.path.join(HERE, "tuning.json")
SHAPES_FILE = os.path.join(HERE, "shapes.txt")

# The amd-mixed-mla benchmark shapes (../shared/leaderboard.md), batch x kv_len.
LEADERBOARD_SHAPES = ((4, 1024), (4, 8192), (32, 1024), (32, 8192),
                      (64, 1024), (64, 8192), (256, 1024), (256, 8192))
DEFAULT_ARCHS = ("sm90a", "gfx950", "gfx942")
# (q dtype, kv dtype) pairs per arch that get a specialized kernel for every catalog shape
# (each arch with the fp8 flavour its hardware decodes). Every other implemented pair gets
# the generic kernel (GENERIC_DTYPES).
DEFAULT_DTYPES = {"sm90a": (("bf16", "fp8e4m3fn"), ("fp8", "fp8e4m3fn"), ("bf16", "bf16"), ("bf16", "mxfp4")),
                  "gfx950": (("bf16", "fp8e4m3fn"),),
                  "gfx942": (("bf16", "fp8e4m3fnuz"),)}
GENERIC_DTYPES = {arch: tuple((q, kv) for kv in have["kv_dtype"] for q in have["q_dtype"])
                  for arch, have in IMPLEMENTED.items()}
# Specialized kernels for paged KV (a block table, pages of a fixed size): vLLM's page sizes 1
# (its ROCm aiter backend) and 64 (FlashMLA) on the long leaderboard shapes, per arch. Every
# other page size and shape is the generic kernel's (it reads the page size at run time).
PAGED_SPECIALIZED = {"sm90a": dict(dtypes=(("bf16", "fp8e4m3fn"), ("bf16", "bf16")),
                                   shapes=((32, 8192), (64, 8192), (256, 8192)), page_sizes=(1, 64))}
# Specialized kernels for other query rows (heads x query tokens a sequence): the shapes an
# engine runs most (128 heads: TP1 / data-parallel attention; 64, 32: TP2, TP4; q_len 2 and 4:
# MTP / speculative verification at TP8). Every other (heads, q_len) is the generic kernel's.
# (num_heads, q_len) -> ((q dtype, kv dtype) pairs, shapes)
# Rows of 64 and more (128 and 64 heads, 16 heads x 4 tokens) take the rows body with spec block_m
# 64, rows of 32 (32 heads, 16 heads x 2 tokens) with block_m 32 (fp8 KV, and bf16 KV with a bf16 q); the (2, 1000) / (3, 1000) shapes
# are there so that its short last tile and splits run in the tests (tests/gpu/test_rows.py
# test_rows_body_matches_float64).
ROWS_SPECIALIZED = {"sm90a": {(128, 1): ((("bf16", "fp8e4m3fn"), ("fp8", "fp8e4m3fn"), ("bf16", "bf16")),
                                         ((64, 8192), (128, 4096), (2, 1000))),
                              (64, 1): ((("bf16", "fp8e4m3fn"), ("fp8", "fp8e4m3fn"), ("bf16", "bf16")), ((64, 8192),)),
                              (32, 1): ((("bf16", "fp8e4m3fn"), ("fp8", "fp8e4m3fn"), ("bf16", "bf16")), ((64, 8192),)),
                              (16, 2): ((("bf16", "fp8e4m3fn"), ("fp8", "fp8e4m3fn")), ((32, 8192), (64, 8192), (256, 8192), (3, 1000))),
                              (16, 4): ((("bf16", "fp8e4m3fn"), ("fp8", "fp8e4m3fn")), ((32, 8192), (64, 8192), (256, 8192), (3, 1000)))}}
# The rows body (spec.ROWS_BODY): the specialized kernels above whose heads x q_len is a multiple
# of 32 take it (64 rows a block where 64 divides them), and so do two generic kernels (role 3,
# block_m 64 and 32) that the runtime takes instead of the generic kernel for contiguous problems
# with such rows (any lengths; the larger block first).
# Tile choices built as generic kernels besides the default, so `make tune` can measure
# them on any shape without regenerating: (block_n, stages) per (arch, kv dtype). sm90a: the
# warpgroup body's third stage (fp8, mxfp4; bf16 takes 2 only, the default).
TUNING_TILES = {("sm90a", "fp8e4m3fn"): ((64, 3),),
                ("sm90a", "mxfp4"): ((64, 3),)}


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'4x1024, 48x2048' or one shape a line (# comments) -> [(4, 1024), (48, 2048)]."""
    shapes = []
    for tok in re.split(r"[,\s]+", re.sub(r"#[^\n]*", "", text)):
        if not tok:
            continue
        m = re.fullmatch(r"(\d+)x(\d+)", tok)
        if not m or int(m[1]) <= 0 or int(m[2]) <= 0:
            raise SpecError(f"shape {tok!r}: expected BATCHxKV_LEN with positive integers, e.g. 48x2048")
        shapes.append((int(m[1]), int(m[2])))
    return shapes


def load_tuning(path: str = TUNING_FILE) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def generic_spec(arch: str, q_dtype: str, kv_dtype: str) -> KernelSpec:
    """The generic kernel of a dtype pair (default tiles): what the runtime falls back to."""
    return KernelSpec(arch, ANY, ANY, ANY, q_dtype, kv_dtype, **default_tiles(arch))


def native_fp8_splits(batch: int, kv_len: int) -> int:
    """Splits of the gfx950 native fp8 kernel: just enough blocks for one on each of the 256
    CUs, never a wave without a tile (a split of 4 waves x 32 tokens at least), at most 64.
    Splitting further would cut each wave's serial walk but add partial-output traffic
    (32 KB a split, about 56 tokens of KV) where the KV stream already fills the GPU:
    tools/amd/check_amd.py models both (docs/perf.md, AMD)."""
    tiles = -(-kv_len // 32)
    return max(1, min(-(-NATIVE_FP8_TARGET_BLOCKS // batch), -(-tiles // 4), 64))


def heuristic_params(arch: str, batch: int, kv_len: int, kv_dtype: str = "fp8e4m3fn", row_groups: int = 1,
                     rows: int | None = None) -> dict:
    """Splits that fill the GPU without letting the partial outputs (32 KB a split, about
    56 tokens of fp8 KV) rival the KV bytes: at least 256 tokens a split. row_groups: blocks
    of 16 query rows a sequence (heads x query tokens / 16); rows: heads x query tokens (16 x row_groups
    when not given)."""
    generic = generic_spec(arch, "bf16", kv_dtype)  # the q format changes no tiling
    if generic.native_fp8:
        return dict(splits=native_fp8_splits(batch * row_groups, kv_len), block_n=generic.block_n,
                    stages=generic.stages)
    rows = 16 * row_groups if rows is None else rows
    return dict(splits=heuristic_splits(generic.target_blocks, batch * row_groups, kv_len, arch, batch * rows),
                block_n=generic.block_n, stages=generic.stages)


def rows_params(arch: str, batch: int, kv_len: int, q_dtype: str, kv_dtype: str, heads: int, q_len: int) -> dict:
    """A query-rows kernel's tiling: the rows body (64 or 32 rows a block, one block an SM) where it
    applies (sm90a fp8 or bf16 KV, heads x q_len a multiple of 32), else the 16-row body's heuristic."""
    rows = heads * q_len
    tiles = rows_body_tiles(arch, q_dtype, kv_dtype, rows)
    if tiles:
        blocks = batch * rows // tiles["block_m"]
        return dict(splits=heuristic_splits(ROWS_BODY_TARGET_BLOCKS, blocks, kv_len, arch, batch * rows), **tiles)
    return heuristic_params(arch, batch, kv_len, kv_dtype, row_groups(heads, q_len), rows)


def _split_walk(target_blocks: int, blocks: int, kv_len: int, splits: int) -> tuple[int, int]:
    """(waves of target_blocks resident blocks, 64-token tiles a split) at this many splits
    (runtime.cpp split_walk)."""
    return -(-blocks * splits // target_blocks), -(-kv_len // (splits * SPLIT_MIN_TOKENS))


def _least_splits(kv_len: int, cost) -> tuple[int, float]:
    """The split count of least cost(s) over 1, 2, 4 .. SPLIT_MAX with at least SPLIT_MIN_TOKENS a
    split (the first of equal costs), and that cost (runtime.cpp least_splits)."""
    best, best_cost, s = 1, cost(1), 2
    while s <= SPLIT_MAX and kv_len // s >= SPLIT_MIN_TOKENS:
        c = cost(s)
        if c < best_cost - 1e-9:
            best, best_cost = s, c
        s *= 2
    return best, best_cost


def heuristic_splits(target_blocks: int, blocks: int, kv_len: int, arch: str | None = None,
                     query_rows: int = 0) -> int:
    """The same rule as the runtime's generic_splits() for an unmodelled kernel (runtime/src/runtime.cpp).
    blocks: batch x row blocks (the blocks a split of every sequence makes); query_rows: batch x heads
    x q_len. An arch with a SPLIT_PARTIAL_COST: the least modelled cost (spec.py says how); else round
    half up, at least 1, at most one split per 256 tokens and 64 in all."""
    cost = SPLIT_PARTIAL_COST.get(arch or "", 0.0)
    if not cost:
        splits = max(1, int(target_blocks / blocks + 0.5))
        return min(splits, max(1, kv_len // 256), 64)

    def walk_cost(s):
        waves, tiles = _split_walk(target_blocks, blocks, kv_len, s)
        return waves * tiles + (s * query_rows * cost if s > 1 else 0.0)
    return _least_splits(kv_len, walk_cost)[0]


def modelled_splits(spec: KernelSpec, batch: int, kv_len: int, heads: int, q_len: int) -> tuple[int, float]:
    """A modelled generic kernel's split count of least modelled time (spec.py GENERIC_COSTS), and
    that time in us (runtime.cpp modelled_splits)."""
    block_us, tile_us, split_us, split_row_us = spec.cost
    blocks = batch * row_groups(heads, q_len) // (spec.block_m // ROWS_A_BLOCK)

    def modelled_us(s):
        waves, tiles = _split_walk(spec.target_blocks, blocks, kv_len, s)
        return waves * (block_us + tiles * tile_us) + (split_us + s * batch * heads * q_len * split_row_us
                                                       if s > 1 else 0.0)
    return _least_splits(kv_len, modelled_us)


def generic_choice(arch: str, q_dtype: str, kv_dtype: str, batch: int, kv_len: int, heads: int = 16,
                   q_len: int = 1, page_size: int = 0) -> tuple[KernelSpec, int] | None:
    """The runtime's generic kernel and splits where the pair is modelled (spec.py GENERIC_COSTS;
    runtime.cpp find_modelled): the least modelled time among the 16-row generic kernel and the rows
    bodies whose block_m divides heads x q_len (contiguous KV, or pages of at least a tile), in the
    registry's order (by name); None for an unmodelled pair."""
    if (arch, kv_dtype) not in GENERIC_COSTS:
        return None
    cands = [generic_spec(arch, q_dtype, kv_dtype)]
    for block_m in ROWS_BODY_BLOCK_MS:
        tiles = rows_body_tiles(arch, q_dtype, kv_dtype, block_m=block_m)
        if tiles and (heads * q_len) % block_m == 0 and (page_size == 0 or page_size >= tiles["block_n"]):
            cands.append(KernelSpec(arch, ANY, ANY, ANY, q_dtype, kv_dtype, **tiles))
    best = None
    for spec in sorted(cands, key=lambda c: c.name):
        s, us = modelled_splits(spec, batch, kv_len, heads, q_len)
        if best is None or us < best[2] - 1e-9:
            best = (spec, s, us)
    return best[0], best[1]


def params_for(arch: str, batch: int, kv_len: int, q_dtype: str, kv_dtype: str, tuning: dict, page_size: int = 0) -> dict:
    table = tuning.get(arch, {})
    shape = f"{batch}x{kv_len}"
    # the q format changes no tiling: an fp8-q kernel takes the bf16-q measurement if it has none;
    # a paged kernel takes its own (q{..}_kv{..}_pg{P}) or else the contiguous one
    entry = table.get(f"q{q_dtype}_kv{kv_dtype}_pg{page_size}", {}).get(shape) if page_size else None
    entry = entry or table.get(f"q{q_dtype}_kv{kv_dtype}", {}).get(shape) or table.get(f"qbf16_kv{kv_dtype}", {}).get(shape)
    if entry:
        return {k: entry[k] for k in ("splits", "block_n", "stages")}
    return heuristic_params(arch, batch, kv_len, kv_dtype)


def build_catalog(shapes: Iterable[tuple[int, int]] | None = None,
                  archs: Iterable[str] = DEFAULT_ARCHS,
                  dtypes: dict | None = None,
                  tuning: dict | None = None,
                  include_shapes_file: bool = True) -> list[KernelSpec]:
    """The sorted, duplicate-free list of specs to generate."""
    tuning = load_tuning() if tuning is None else tuning
    all_shapes = list(LEADERBOARD_SHAPES)
    if include_shapes_file and os.path.exists(SHAPES_FILE):
        with open(SHAPES_FILE) as f:
            all_shapes += parse_shapes(f.read())
    all_shapes += list(shapes or ())
    specs = []
    for arch in archs:
        if arch not in ARCHS:
            raise SpecError(f"arch {arch!r}: expected one of {sorted(ARCHS)}")
        specialized = (dtypes or DEFAULT_DTYPES)[arch]
        for q_dtype, kv_dtype in dict.fromkeys(specialized + GENERIC_DTYPES.get(arch, ())):
            specs.append(generic_spec(arch, q_dtype, kv_dtype))
            for block_m in ROWS_BODY_BLOCK_MS:  # the generic rows bodies (role 3): rows in blocks of 32 or 64
                rows_tiles = rows_body_tiles(arch, q_dtype, kv_dtype, block_m=block_m)
                if rows_tiles:
                    specs.append(KernelSpec(arch, ANY, ANY, ANY, q_dtype, kv_dtype, **rows_tiles))
            if q_dtype == "bf16":  # tile candidates: the q format does not change the tiling
                for block_n, stages in TUNING_TILES.get((arch, kv_dtype), ()):
                    specs.append(KernelSpec(arch, ANY, ANY, ANY, q_dtype, kv_dtype, block_n=block_n, stages=stages))
            if (q_dtype, kv_dtype) not in specialized:
                continue
            for batch, kv_len in sorted(set(all_shapes)):
                p = params_for(arch, batch, kv_len, q_dtype, kv_dtype, tuning)
                specs.append(KernelSpec(arch, batch, kv_len, q_dtype=q_dtype, kv_dtype=kv_dtype, **p))
        paged = PAGED_SPECIALIZED.get(arch)
        if paged:  # the contiguous kernel's tiling and splits unless the tuning table has the page's
            for q_dtype, kv_dtype in paged["dtypes"]:
                for batch, kv_len in paged["shapes"]:
                    for page in paged["page_sizes"]:
                        p = params_for(arch, batch, kv_len, q_dtype, kv_dtype, tuning, page)
                        specs.append(KernelSpec(arch, batch, kv_len, q_dtype=q_dtype, kv_dtype=kv_dtype,
                                                page_size=page, **p))
        for (heads, q_len), (pairs, shapes_) in ROWS_SPECIALIZED.get(arch, {}).items():
            groups = row_groups(heads, q_len)
            for q_dtype, kv_dtype in pairs:
                for batch, kv_len in shapes_:
                    p = rows_params(arch, batch, kv_len, q_dtype, kv_dtype, heads, q_len)
                    specs.append(KernelSpec(arch, batch, kv_len, q_dtype=q_dtype, kv_dtype=kv_dtype, num_heads=heads,
                                            q_len=q_len, **p))
    check_unique(specs)
    unimplemented = [s.name for s in specs if not s.implemented]
    if unimplemented:
        raise SpecError("no device code yet for: " + ", ".join(unimplemented)
                        + f" (implemented: {IMPLEMENTED})")
    return sorted(specs, key=lambda s: s.name)


# The leaderboard's kv_data keys -> the spec's kv dtype on an arch (fp8: the arch's flavour).
def kv_dtype_of(arch: str, kv_format: str) -> str:
    if arch not in ARCHS:
        raise SpecError(f"arch {arch!r}: expected one of {sorted(ARCHS)}")
    table = {f.binding: name for name, f in KV_FORMATS.items() if arch in f.archs}
    if kv_format not in table:
        raise SpecError(f"kv format {kv_format!r}: expected one of {sorted(table)}")
    return table[kv_format]


def bundle_catalog(arch: str, kv_format: str, q_dtype: str = "bf16") -> list[KernelSpec]:
    """What a leaderboard bundle's custom_kernel can dispatch to, and nothing else: the
    specialized kernels of the eight leaderboard shapes and the generic kernel (default
    tiles) of one (q, kv) dtype pair on one arch. Shapes of codegen/shapes.txt stay out."""
    kv_dtype = kv_dtype_of(arch, kv_format)
    full = build_catalog(archs=[arch], include_shapes_file=False)
    keep = [s for s in full if (s.q_dtype, s.kv_dtype) == (q_dtype, kv_dtype)
            and (s.role == 1 or (s.role == 0 and s.page_size == 0 and (s.num_heads, s.q_len) == (16, 1)
                                 and (s.batch, s.kv_len) in LEADERBOARD_SHAPES))]
    if not any(s.role == 1 for s in keep):
        raise SpecError(f"no generic kernel for q {q_dtype} / kv {kv_dtype} on {arch}: not a format a bundle can carry")
    return keep


def check_unique(specs: list[KernelSpec]) -> None:
    names, keys = {}, {}
    for s in specs:
        if s.name in names:
            raise SpecError(f"duplicate kernel name {s.name}")
        if s.key in keys:
            raise SpecError(f"{s.name} and {keys[s.key]} answer the same registry key {s.key}")
        names[s.name] = s
        keys[s.key] = s.name
