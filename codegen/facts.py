"""The problem facts: what every layer states about the problem (its dimensions, query lengths,
head counts, page sizes, limits, the dtype codes, the KV formats), in one place. `python -m codegen generate`
writes them into generated/facts.inc (the runtime's validation, runtime/src/runtime.cpp, and the
torch operator, runtime/torch/ops.cpp) and runtime/python/mlagen/_facts.py (the binding); the
public header runtime/include/mlagen/mlagen.h states the dtype enum and the ABI version for C
callers, and facts.inc checks them against these values at compile time."""
from __future__ import annotations

from dataclasses import dataclass

QK_DIM = 576          # K: the 512-dim latent + 64 rope dims (DeepSeek MLA's absorbed form)
V_DIM = 512           # V: the first 512 dims of the same row
NUM_KV_HEADS = 1      # one latent row a token, shared by every query head (MQA)
NUM_HEADS = (8, 16, 32, 64, 128)  # query heads (DeepSeek's 128 over TP 1..16; device/shapes.cuh QueryRows)
MAX_Q_LEN = 4         # query tokens a sequence: decode, or MTP / speculative verification
MAX_BATCH = 65535     # sequences (a grid dimension)
MAX_SPLITS = 64       # KV splits a sequence
PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # rows a KV page (device/kv_rows.cuh: a power of two)
ABI_VERSION = 5       # mlagen_problem.abi_version (mlagen.h MLAGEN_ABI_VERSION)


# The KV formats, one row each: everything a layer outside the device code needs of a format (its
# code, the name callers give it, the tensors that hold it, its row layout, its scale), so that a
# new format is a row here, its device code and its quantizer (docs/design-policies.md, "Adding a
# KV format"). Generated into generated/facts.inc (the runtime's validation, the launcher, the
# torch operator) and runtime/python/mlagen/_facts.py (the binding, the bundle); codegen/spec.py
# reads the generator's fields.
#   code         mlagen_dtype (mlagen.h states it for C callers; facts.inc checks the two agree)
#   binding      the name callers pass (kv_format=, the leaderboard's kv_data key); the fp8 flavours
#                share "fp8" and the data tensor's dtype tells them apart
#   torch_dtypes the data tensor's torch dtypes (names in torch's Python namespace; the first is
#                what quant.py produces, the others are accepted where torch has them)
#   row_bytes    a token's data bytes; stride_unit: bytes of kv_stride_token's unit (its element)
#   scale        0 none; 1 one float32 a tensor (kv_scale); 2 E8M0 rows, one byte a scale_block dims
#                of every token (kv_scale a (rows, >= QK_DIM / scale_block) uint8 tensor, its rows
#                SCALE_ROWS_ALIGN-byte aligned and at most SCALE_ROWS_MAX_STRIDE bytes apart)
#   device       the device code's enum (runtime/include/mlagen/device/formats.cuh KvFormat)
#   bf16_operand the MMAs take bf16 operands (as stored, or expanded from the format), not fp8 / f16
#   archs        the archs whose bodies implement it
#   warpgroup_stages  sm90a's 16-row warpgroup body: (the most stages, the most that leave two blocks
#                an SM); fp8 / mxfp4 stages are 37 / 21 KB, a bf16 one 72 KB
#   rows_tile    the tile sm90a's rows body (32 / 64 query rows a block) holds: "e4m3" (the fp8 rows as
#                stored), "bf16" (the bf16 rows as stored), "bf16_expanded" (a format's rows expanded
#                into the bf16 tile on the way in); None: no rows body (codegen/spec.py ROWS_TILES)
@dataclass(frozen=True)
class KvFormatFacts:
    code: int
    binding: str
    torch_dtypes: tuple
    row_bytes: int
    stride_unit: int
    scale: int
    scale_block: int
    device: str
    bf16_operand: bool
    archs: tuple
    warpgroup_stages: tuple
    rows_tile: str | None = None


KV_FORMATS = {
    "bf16": KvFormatFacts(1, "bf16", ("bfloat16",), 1152, 2, 0, 0, "KvFormat::kBf16", True,
                          ("sm90a", "gfx950", "gfx942"), (2, 0), "bf16"),
    "fp8e4m3fn": KvFormatFacts(2, "fp8", ("float8_e4m3fn",), 576, 1, 1, 0, "KvFormat::kFp8", False,
                               ("sm90a", "gfx950"), (5, 2), "e4m3"),
    "fp8e4m3fnuz": KvFormatFacts(3, "fp8", ("float8_e4m3fnuz",), 576, 1, 1, 0, "KvFormat::kFp8", False,
                                 ("gfx942",), (5, 2)),
    "mxfp4": KvFormatFacts(4, "mxfp4", ("uint8", "float4_e2m1fn_x2"), 288, 1, 2, 32, "KvFormat::kMxfp4", True,
                           ("sm90a", "gfx950", "gfx942"), (5, 2), "bf16_expanded"),
}
# the names callers pass, in the order the binding lists them (fp8 first: the leaderboard's)
KV_BINDINGS = ("fp8",) + tuple(dict.fromkeys(f.binding for f in KV_FORMATS.values() if f.binding != "fp8"))
SCALE_KINDS = {0: "none", 1: "one float32", 2: "E8M0 rows"}
SCALE_ROWS_ALIGN, SCALE_ROWS_MAX_STRIDE = 16, 32  # scale kind 2: the rows' base alignment, the most bytes apart
SCALE_ROW_DTYPES = ("uint8", "float8_e8m0fnu")    # scale kind 2: the scale tensor's torch dtypes
# mlagen_dtype (mlagen.h): the code of each q / KV dtype; "fp8" is a q dtype only (the arch's flavour)
Q_ONLY_DTYPES = {"fp8": 5}
DTYPE_CODES = {**{name: f.code for name, f in KV_FORMATS.items()}, **Q_ONLY_DTYPES}


def heads_text() -> str:
    """NUM_HEADS as the runtime's messages say it: "8, 16, 32, 64 or 128"."""
    h = [str(x) for x in NUM_HEADS]
    return ", ".join(h[:-1]) + " or " + h[-1]


def or_text(names) -> str:
    """"a, b or c"."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def kv_format_rows() -> list[dict]:
    """The KV formats by code, as the generated tables carry them."""
    rows = []
    for name, f in sorted(KV_FORMATS.items(), key=lambda kv: kv[1].code):
        rows.append(dict(name=name, code=f.code, binding=f.binding, torch_dtypes=f.torch_dtypes,
                         row_bytes=f.row_bytes,
                         stride_unit=f.stride_unit, scale=f.scale, scale_block=f.scale_block))
    return rows


def as_dict() -> dict:
    return dict(qk_dim=QK_DIM, v_dim=V_DIM, num_kv_heads=NUM_KV_HEADS, num_heads=NUM_HEADS, max_q_len=MAX_Q_LEN,
                max_batch=MAX_BATCH, max_splits=MAX_SPLITS, page_sizes=PAGE_SIZES, abi_version=ABI_VERSION,
                dtype_codes=DTYPE_CODES, heads_text=heads_text(), kv_formats=kv_format_rows(),
                kv_bindings=KV_BINDINGS, kv_names_text=or_text(r["name"] for r in kv_format_rows()),
                kv_bindings_text=str(KV_BINDINGS), scale_rows_align=SCALE_ROWS_ALIGN,
                scale_rows_max_stride=SCALE_ROWS_MAX_STRIDE, scale_row_dtypes=SCALE_ROW_DTYPES)
