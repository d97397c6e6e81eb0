"""mlagen as a PyTorch operator: `torch.ops.mlagen.decode` (importing this module registers it).

    import mlagen.ops
    out = torch.ops.mlagen.decode(q, kv, kv_scale, qo_indptr, kv_indptr, "fp8", "bf16", kv_seq_len, sm_scale)

A functional op (no argument is mutated; the output is new) with a fake implementation, so it
passes torch.library.opcheck, traces under torch.compile(fullgraph=True) and records into CUDA
graphs (it launches where mlagen.decode does). The arguments are mlagen.decode's, flattened
into what an operator schema can hold:

  q          (total_q, 16, 576) bf16, or fp8 with q_scale (q_dtype "fp8")
  kv         the KV rows of kv_format: fp8 (total_kv, 1, 576), bf16 (total_kv, 1, 576),
             mxfp4 (total_kv, 1, 288) packed E2M1
  kv_scale   fp8: (1,) float32; mxfp4: the E8M0 scale rows (>= total_kv, >= 18); bf16: None
  qo_indptr, kv_indptr   (batch + 1,) int32
  kv_format  "fp8" | "bf16" | "mxfp4";  q_dtype "bf16" | "fp8" (a bf16 q quantized on the device)
  kv_seq_len every sequence's length when all are equal, else 0 (lengths from kv_indptr)
  sm_scale   the softmax scale (1/sqrt(576) for DeepSeek MLA)
  q_scale    fp8 q given quantized: (1,) float32, else None

Returns (total_q, 16, 512) bf16. Errors are mlagen.MlagenError, naming the field.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import decode

_HEADS, _DV = 16, 512


@torch.library.custom_op("mlagen::decode", mutates_args=(), device_types="cuda")
def _decode_op(q: torch.Tensor, kv: torch.Tensor, kv_scale: Optional[torch.Tensor], qo_indptr: torch.Tensor,
               kv_indptr: torch.Tensor, kv_format: str, q_dtype: str, kv_seq_len: int, sm_scale: float,
               q_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    config = {"batch_size": qo_indptr.numel() - 1, "kv_seq_len": kv_seq_len or None, "sm_scale": sm_scale}
    entry = kv if kv_format == "bf16" else (kv, kv_scale)
    return decode(q, {kv_format: entry}, qo_indptr, kv_indptr, config, kv_format=kv_format, q_dtype=q_dtype,
                  q_scale=q_scale)


@_decode_op.register_fake
def _decode_fake(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale=None):
    torch._check(q.dim() == 3 and q.shape[1] == _HEADS, lambda: f"q: shape {tuple(q.shape)}: expected (total_q, 16, 576)")
    return q.new_empty((q.shape[0], _HEADS, _DV), dtype=torch.bfloat16)


decode_op = torch.ops.mlagen.decode
