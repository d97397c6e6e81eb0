"""The vLLM 0.33 MLA backend classes (imported through mlagen.integrations.vllm, which see).

Written against vllm/model_executor/layers/attention/mla_attention.py (MLACommonBackend,
MLACommonMetadataBuilder, MLACommonImpl, QueryLenSupport) and vllm/v1/attention/backend.py
(AttentionBackend's checks, AttentionCGSupport, the impl's LSE flags) of vLLM 0.33.0. What the
MLA layer hands forward_mqa (MLAAttention.forward_impl there): q (T, H, 576) fp8 quantized with
layer._q_scale when the cache is fp8 (MLACommonImpl sets supports_quant_query_input), else the
pair (ql_nope (T, H, 512), q_pe (T, H, 64)); the cache (num_blocks, block_size, 576), an fp8 one
already viewed as fp8 (stored as uint8); the decodes first in the batch, their metadata in
attn_metadata.decode (block_table (B, max_blocks) int32, seq_lens (B,) int32 on the device).
Prefill stays on vLLM's MLA prefill backend (forward_mha, inherited).
"""
from __future__ import annotations

import logging
from typing import ClassVar

import torch
from vllm.model_executor.layers.attention.mla_attention import (MLACommonBackend, MLACommonImpl,
                                                                MLACommonMetadata, MLACommonMetadataBuilder,
                                                                QueryLenSupport)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, max_decode_query_len
from vllm.v1.kv_cache_layout import KVCacheLayout

from .. import MAX_Q_LEN, NUM_HEADS, lib
from .. import serving

logger = logging.getLogger(__name__)

_FP8_CACHE = ("fp8", "fp8_e4m3")            # e4m3 stored as uint8, one float32 scale (layer._k_scale)
_BF16_CACHE = ("auto", "bfloat16")          # "auto": the model dtype, which must be bf16
# vLLM's DeviceCapability of each arch an mlagen library is built for (CUDA: sm_90a; ROCm reports
# gfx942 / gfx950 as 9.4 / 9.5)
_ARCH_CAPABILITY = {"sm90a": (9, 0), "gfx942": (9, 4), "gfx950": (9, 5)}


def _library_archs() -> tuple[str, ...]:
    """The archs the loaded mlagen library holds kernels for (loading touches no GPU)."""
    names = lib().mlagen_build_archs().decode()
    return tuple(a for a in names.replace(",", " ").split() if a)


class MlagenMLABackend(MLACommonBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list] = [*_BF16_CACHE, *_FP8_CACHE]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # the AttentionBackendEnum member it is registered under

    @staticmethod
    def get_builder_cls() -> type["MlagenMLAMetadataBuilder"]:
        return MlagenMLAMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["MlagenMLAImpl"]:
        return MlagenMLAImpl

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        # Every page size the kernels take (they read it at run time); exact sizes, so a larger
        # manager block is split into the largest of them that divides it (vllm/v1/worker/utils.py
        # select_common_block_size), never handed over whole.
        return list(serving.BLOCK_SIZES)

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        # Without --block-size: 64, where the sm90a kernels are fastest (pages of 64+ rows take
        # the 32 / 64-row generic kernels and the _pg64 specializations; README "Paged KV").
        return 64

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [serving.QK]  # kv_lora_rank 512 + qk_rope_head_dim 64

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        try:
            archs = _library_archs()
        except Exception as e:  # no library: say why once, and decline
            logger.warning("mlagen: the library does not load (%s); the CUSTOM backend declines", e)
            return False
        return any(_ARCH_CAPABILITY.get(a) == (capability.major, capability.minor) for a in archs)

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # A uniform batch's query offsets are arange * q_len, from the host's token count; a
        # batch trimmed on the device (adaptive verification) would not match them.
        return False

    @classmethod
    def supported_kv_cache_layouts(cls):
        # Layer-outermost layouts, where one layer's blocks are (num_blocks, block_size, 576)
        # at one stride (the kernels' paged form); block-outer ones interleave layers.
        return (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC, KVCacheLayout.LHBNC)


class MlagenMLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    # Decode metadata is MLACommonDecodeMetadata as is: the block table and seq_lens tensors, read
    # on the device at every call, so a captured graph replays with whatever they hold.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device, MLACommonMetadata)
        widest = max_decode_query_len(vllm_config)
        if self.reorder_batch_threshold is not None and self.reorder_batch_threshold > MAX_Q_LEN:
            raise ValueError(f"mlagen decodes 1..{MAX_Q_LEN} query tokens a sequence; this configuration decodes up "
                             f"to {widest} (num_speculative_tokens <= {MAX_Q_LEN - 1} with the CUSTOM backend)")
        heads = self.num_heads * max(1, self.dcp_world_size)
        if heads not in NUM_HEADS:
            raise ValueError(f"mlagen decodes {NUM_HEADS} query heads; this layer has {heads} "
                             f"({self.num_heads} per GPU x decode context parallel {self.dcp_world_size})")

    def _build_decode(self, block_table_tensor, seq_lens_device, max_seq_len, query_start_loc_cpu,
                      query_start_loc_device, num_decode_tokens, max_query_len, dcp_tot_seq_lens_device):
        batch = seq_lens_device.shape[0]
        q_len, rest = divmod(num_decode_tokens, batch)
        if rest or not 1 <= q_len <= MAX_Q_LEN:
            raise ValueError(f"mlagen: {num_decode_tokens} decode tokens over {batch} sequences: expected a uniform "
                             f"batch of 1..{MAX_Q_LEN} tokens a sequence")
        # the query offsets the decode will read, made here: builds run outside CUDA-graph capture
        serving.qo_indptr(batch, q_len, self.device)
        return super()._build_decode(block_table_tensor, seq_lens_device, max_seq_len, query_start_loc_cpu,
                                     query_start_loc_device, num_decode_tokens, max_query_len,
                                     dcp_tot_seq_lens_device)


_decoders: dict = {}  # one MLADecoder per configuration, shared by the layers that have it


class MlagenMLAImpl(MLACommonImpl[MLACommonMetadata]):
    can_return_lse_for_decode: bool = True
    lse_base_on_e: bool = True  # mlagen's LSE is ln sum exp(sm_scale q.k) (vLLM's DCP combine: IS_BASE_E)
    supports_dcp: bool = True

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                 logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args) -> None:
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                         logits_soft_cap, attn_type, kv_sharing_target_layer_name, **mla_args)
        if any((alibi_slopes, sliding_window, logits_soft_cap)):
            raise NotImplementedError("mlagen MLA: alibi_slopes, sliding_window and logits_soft_cap are not supported")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"mlagen MLA: attention type {attn_type}: only decoder self-attention")
        if (self.kv_lora_rank, self.qk_rope_head_dim) != (serving.DV, serving.QK - serving.DV):
            raise NotImplementedError(f"mlagen MLA: kv_lora_rank {self.kv_lora_rank}, qk_rope_head_dim "
                                      f"{self.qk_rope_head_dim}: expected 512 and 64 (DeepSeek-V2/V3's latent)")
        if kv_cache_dtype in _FP8_CACHE:
            self._cache = "fp8"
        elif kv_cache_dtype in _BF16_CACHE:
            self._cache = "bf16"
        else:
            raise NotImplementedError(f"mlagen MLA: kv_cache_dtype {kv_cache_dtype!r}: expected one of "
                                      f"{_BF16_CACHE + _FP8_CACHE}")
        self._q_heads = num_heads * max(1, self.dcp_world_size)  # DCP gathers every rank's heads
        if self._q_heads not in NUM_HEADS:
            raise NotImplementedError(f"mlagen MLA: {self._q_heads} query heads: expected one of {NUM_HEADS}")
        self._decoder = None  # made at the first decode, when the cache's block size is known

    def _make_decoder(self, block_size: int) -> serving.MLADecoder:
        key = (self._q_heads, self._cache, block_size, self.scale, self.need_to_return_lse_for_decode)
        dec = _decoders.get(key)
        if dec is None:
            dec = _decoders[key] = serving.MLADecoder(
                self._q_heads, kv_cache_dtype=self._cache, block_size=block_size, sm_scale=self.scale,
                q_dtype="fp8" if self._cache == "fp8" else "bf16", return_lse=self.need_to_return_lse_for_decode)
        self._decoder = dec
        return dec

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        decode = attn_metadata.decode
        dec = self._decoder or self._make_decoder(kv_c_and_k_pe_cache.shape[1])
        fp8_q = q.__class__ is not tuple and q.dtype != torch.bfloat16
        return dec.forward(q, kv_c_and_k_pe_cache, decode.block_table, decode.seq_lens,
                           k_scale=layer._k_scale if self._cache == "fp8" else None,
                           q_scale=layer._q_scale if fp8_q else None)
