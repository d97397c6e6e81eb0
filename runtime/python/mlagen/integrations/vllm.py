"""mlagen as a vLLM attention backend for DeepSeek's MLA decode (vLLM 0.33).

    pip install mlagen[vllm]
    vllm serve deepseek-ai/DeepSeek-V3 --attention-backend CUSTOM [--kv-cache-dtype fp8] ...

vLLM runs every `vllm.general_plugins` entry point in each of its processes (vllm/plugins/
__init__.py, load_general_plugins); mlagen's (pyproject.toml) is register() below, which points
AttentionBackendEnum.CUSTOM at MlagenMLABackend (vllm/v1/attention/backends/registry.py,
register_backend). Nothing else happens at plugin load: the backend classes, and the vLLM modules
they subclass, are imported when vLLM first resolves the backend (the attribute access below,
PEP 562), so a vLLM process that never selects CUSTOM pays nothing.

The classes (mlagen/integrations/_vllm_backend.py):
  MlagenMLABackend          MLACommonBackend: head size 576, bf16 model dtype, kv-cache dtypes
                            auto / bfloat16 / fp8 / fp8_e4m3, every block size 1..256 (powers of
                            two), the arch mlagen was built for
  MlagenMLAMetadataBuilder  MLACommonMetadataBuilder: CUDA graphs for uniform batches, uniform
                            multi-token decode (MTP / speculative verification, 1..4 tokens)
  MlagenMLAImpl             MLACommonImpl: forward_mqa -> mlagen.serving.MLADecoder.forward;
                            LSE in natural log, for decode context parallelism
"""
from __future__ import annotations

BACKEND = "mlagen.integrations.vllm.MlagenMLABackend"
_CLASSES = ("MlagenMLABackend", "MlagenMLAMetadataBuilder", "MlagenMLAImpl")


def register() -> None:
    """The `vllm.general_plugins` entry point: AttentionBackendEnum.CUSTOM -> MlagenMLABackend.
    Idempotent (vLLM may load plugins more than once per process)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)


def __getattr__(name: str):
    if name in _CLASSES:
        from . import _vllm_backend
        return getattr(_vllm_backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
