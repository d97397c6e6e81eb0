"""mlagen as PyTorch operators: `torch.ops.mlagen.decode` and `torch.ops.mlagen.decode_lse`
(importing this module registers them).

    import mlagen.ops
    out = torch.ops.mlagen.decode(q, kv, kv_scale, qo_indptr, kv_indptr, "fp8", "bf16", kv_seq_len, sm_scale)
    out, lse = torch.ops.mlagen.decode_lse(q, kv, kv_scale, qo_indptr, None, "fp8", "bf16", 0, sm_scale,
                                           q_len=2, page_table=block_table, kv_lens=seq_lens, page_size=64)

Functional ops (no argument is mutated; the outputs are new) with fake implementations, so they
pass torch.library.opcheck, trace under torch.compile(fullgraph=True) and record into CUDA
graphs (they launch where mlagen.decode does). The arguments are mlagen.decode's, flattened
into what an operator schema can hold:

  q          (total_q, num_heads, 576) bf16, or fp8 with q_scale (q_dtype "fp8"); 8..128 heads
  kv         the KV rows of kv_format: fp8 (total_kv, 1, 576), bf16 (total_kv, 1, 576),
             mxfp4 (total_kv, 1, 288) packed E2M1; paged: the cache (num_pages, page_size, [1,] row)
  kv_scale   fp8: (1,) float32; mxfp4: the E8M0 scale rows (>= total_kv, >= 18); bf16: None
  qo_indptr  (batch + 1,) int32; kv_indptr (batch + 1,) int32, or None with page_table + kv_lens
  kv_format  "fp8" | "bf16" | "mxfp4";  q_dtype "bf16" | "fp8" (a bf16 q quantized on the device)
  kv_seq_len every sequence's length when all are equal, else 0 (lengths from kv_indptr / kv_lens)
  sm_scale   the softmax scale (1/sqrt(576) for DeepSeek MLA)
  q_scale    fp8 q given quantized: (1,) float32, else None
  q_len      query tokens a sequence, 1..4 (0: total_q / batch); causal among them
  page_table (batch, max_pages) int32 block table, kv_lens (batch,) int32, page_size: paged KV;
             or FlashInfer's form: kv_indices (pages,) int32 with kv_indptr the page offsets and
             kv_last_page_len (batch,) int32

decode returns (total_q, num_heads, 512) bf16; decode_lse also the LSE (total_q, num_heads)
float32 (natural log of the scaled scores). Errors are mlagen.MlagenError, naming the field.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import NUM_HEADS, decode

_DV = 512


def _call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale, q_len,
          page_table, kv_lens, page_size, kv_indices, kv_last_page_len, return_lse):
    config = {"batch_size": qo_indptr.numel() - 1, "kv_seq_len": kv_seq_len or None, "sm_scale": sm_scale}
    entry = kv if kv_format == "bf16" else (kv, kv_scale)
    paged = dict(page_table=page_table, kv_lens=kv_lens, page_size=page_size, kv_indices=kv_indices,
                 kv_last_page_len=kv_last_page_len) if page_size else {}
    return decode(q, {kv_format: entry}, qo_indptr, kv_indptr, config, kv_format=kv_format, q_dtype=q_dtype,
                  q_scale=q_scale, q_len=q_len or None, return_lse=return_lse, **paged)


@torch.library.custom_op("mlagen::decode", mutates_args=(), device_types="cuda")
def _decode_op(q: torch.Tensor, kv: torch.Tensor, kv_scale: Optional[torch.Tensor], qo_indptr: torch.Tensor,
               kv_indptr: Optional[torch.Tensor], kv_format: str, q_dtype: str, kv_seq_len: int, sm_scale: float,
               q_scale: Optional[torch.Tensor] = None, q_len: int = 0, page_table: Optional[torch.Tensor] = None,
               kv_lens: Optional[torch.Tensor] = None, page_size: int = 0, kv_indices: Optional[torch.Tensor] = None,
               kv_last_page_len: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale, q_len,
                 page_table, kv_lens, page_size, kv_indices, kv_last_page_len, False)


@torch.library.custom_op("mlagen::decode_lse", mutates_args=(), device_types="cuda")
def _decode_lse_op(q: torch.Tensor, kv: torch.Tensor, kv_scale: Optional[torch.Tensor], qo_indptr: torch.Tensor,
                   kv_indptr: Optional[torch.Tensor], kv_format: str, q_dtype: str, kv_seq_len: int, sm_scale: float,
                   q_scale: Optional[torch.Tensor] = None, q_len: int = 0, page_table: Optional[torch.Tensor] = None,
                   kv_lens: Optional[torch.Tensor] = None, page_size: int = 0,
                   kv_indices: Optional[torch.Tensor] = None,
                   kv_last_page_len: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale, q_len,
                 page_table, kv_lens, page_size, kv_indices, kv_last_page_len, True)


def _check_q(q):
    torch._check(q.dim() == 3 and q.shape[1] in NUM_HEADS,
                 lambda: f"q: shape {tuple(q.shape)}: expected (total_q, num_heads 8..128, 576)")


@_decode_op.register_fake
def _decode_fake(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale=None,
                 q_len=0, page_table=None, kv_lens=None, page_size=0, kv_indices=None, kv_last_page_len=None):
    _check_q(q)
    return q.new_empty((q.shape[0], q.shape[1], _DV), dtype=torch.bfloat16)


@_decode_lse_op.register_fake
def _decode_lse_fake(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale=None,
                     q_len=0, page_table=None, kv_lens=None, page_size=0, kv_indices=None, kv_last_page_len=None):
    _check_q(q)
    return (q.new_empty((q.shape[0], q.shape[1], _DV), dtype=torch.bfloat16),
            q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


decode_op = torch.ops.mlagen.decode
decode_lse_op = torch.ops.mlagen.decode_lse
