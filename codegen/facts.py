"""The problem facts: what every layer states about the problem (its dimensions, query lengths,
head counts, page sizes, limits, the dtype codes), in one place. `python -m codegen generate`
writes them into generated/facts.inc (the runtime's validation, runtime/src/runtime.cpp, and the
torch operator, runtime/torch/ops.cpp) and runtime/python/mlagen/_facts.py (the binding); the
public header runtime/include/mlagen/mlagen.h states the dtype enum and the ABI version for C
callers, and facts.inc checks them against these values at compile time."""
from __future__ import annotations

QK_DIM = 576          # K: the 512-dim latent + 64 rope dims (DeepSeek MLA's absorbed form)
V_DIM = 512           # V: the first 512 dims of the same row
NUM_KV_HEADS = 1      # one latent row a token, shared by every query head (MQA)
NUM_HEADS = (8, 16, 32, 64, 128)  # query heads (DeepSeek's 128 over TP 1..16; device/shapes.cuh QueryRows)
MAX_Q_LEN = 4         # query tokens a sequence: decode, or MTP / speculative verification
MAX_BATCH = 65535     # sequences (a grid dimension)
MAX_SPLITS = 64       # KV splits a sequence
PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # rows a KV page (device/kv_rows.cuh: a power of two)
ABI_VERSION = 5       # mlagen_problem.abi_version (mlagen.h MLAGEN_ABI_VERSION)
# mlagen_dtype (mlagen.h): the code of each q / KV dtype; "fp8" is a q dtype only (the arch's flavour)
DTYPE_CODES = {"bf16": 1, "fp8e4m3fn": 2, "fp8e4m3fnuz": 3, "mxfp4": 4, "fp8": 5}


def heads_text() -> str:
    """NUM_HEADS as the runtime's messages say it: "8, 16, 32, 64 or 128"."""
    h = [str(x) for x in NUM_HEADS]
    return ", ".join(h[:-1]) + " or " + h[-1]


def as_dict() -> dict:
    return dict(qk_dim=QK_DIM, v_dim=V_DIM, num_kv_heads=NUM_KV_HEADS, num_heads=NUM_HEADS, max_q_len=MAX_Q_LEN,
                max_batch=MAX_BATCH, max_splits=MAX_SPLITS, page_sizes=PAGE_SIZES, abi_version=ABI_VERSION,
                dtype_codes=DTYPE_CODES, heads_text=heads_text())
