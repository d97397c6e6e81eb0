"""The vLLM plugin (mlagen.integrations.vllm) against the real vLLM 0.33, on the CPU.

Run by `make test-vllm` (its own virtual environment: vLLM pins its own torch), where a missing
vLLM is a failure (MLAGEN_REQUIRE_VLLM=1); elsewhere the module skips without vLLM. Checked with
vLLM's own code: the installed distribution's entry point and vLLM's plugin loader, the backend
registry, the checks vLLM's platforms run on a selected backend (validate_configuration with an
AttentionSelectorConfig, the call vllm/platforms/cuda.py get_attn_backend_cls makes; that module
itself needs libcuda), the block-size and layout resolution, the builder and impl under a
VllmConfig of a small DeepSeek-V3 (a local config.json: nothing downloaded), and metadata built
by the builder from vLLM's CommonAttentionMetadata turning into exactly one engine-facing call
(MLADecoder.forward recorded: the GPU launch is what a CPU cannot run; tests/gpu/test_serving.py
runs that call on the H200).
"""
import json
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("MLAGEN_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401  (make test-vllm: missing vLLM is an error, not a skip)
    assert vllm.__version__.startswith("0.33."), f"vLLM {vllm.__version__}: the plugin is written against 0.33"
else:
    vllm = pytest.importorskip("vllm", reason="needs vLLM 0.33: `make test-vllm` (its own virtual environment)")
    if not vllm.__version__.startswith("0.33."):
        pytest.skip(f"vLLM {vllm.__version__} here; the plugin is written against 0.33 (make test-vllm)",
                    allow_module_level=True)

import torch  # noqa: E402
from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig,  # noqa: E402
                         VllmConfig, set_current_vllm_config)
from vllm.platforms.interface import DeviceCapability, Platform  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.selector import AttentionSelectorConfig  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec, get_kv_quant_mode  # noqa: E402

import mlagen  # noqa: E402
from mlagen import serving  # noqa: E402
from mlagen.integrations import vllm as plugin  # noqa: E402

LAYER = "model.layers.0.self_attn.attn"
ARCH_CAPABILITY = {"sm90a": DeviceCapability(9, 0), "gfx942": DeviceCapability(9, 4), "gfx950": DeviceCapability(9, 5)}


@pytest.fixture(scope="module")
def backend():
    plugin.register()
    return AttentionBackendEnum.CUSTOM.get_class()


@pytest.fixture(scope="module")
def capability():
    arch = mlagen.lib().mlagen_build_archs().decode().replace(",", " ").split()[0]
    return ARCH_CAPABILITY[arch]


def _model_config(tmp_path_factory, heads):
    """A DeepSeek-V3 config (MLA: kv_lora_rank 512, qk_rope_head_dim 64) read by vLLM's ModelConfig."""
    d = tmp_path_factory.mktemp(f"dsv3_h{heads}")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": heads, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 128, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 1024, "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16", "rope_theta": 10000}))
    return ModelConfig(model=str(d), skip_tokenizer_init=True, dtype="bfloat16")


@pytest.fixture(scope="module")
def model16(tmp_path_factory):
    return _model_config(tmp_path_factory, 16)


def vllm_config(model, cache_dtype="auto", block_size=64, spec_tokens=0):
    spec = None
    if spec_tokens:  # n-gram speculation: no draft model; verification decodes 1 + spec_tokens tokens
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=spec_tokens, prompt_lookup_max=3,
                                 target_model_config=model, target_parallel_config=ParallelConfig())
    return VllmConfig(model_config=model, cache_config=CacheConfig(block_size=block_size, cache_dtype=cache_dtype),
                      device_config=DeviceConfig(device="cpu"), speculative_config=spec)


class _PrefillStub:
    """The layer's MLA prefill backend (vLLM picks one per platform; the decode path never calls it)."""

    def clone(self):
        return self

    def prepare_metadata(self, metadata):
        self.metadata = metadata

    def get_name(self):
        return "STUB"


def attention_layer(cfg):
    """What MLAAttention registers in static_forward_context, the fields the builder and
    forward_mqa read: the MLA dims and the quant scales (vLLM's set_default_quant_scales: 0-dim
    float32 tensors)."""
    layer = types.SimpleNamespace(q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                  v_head_dim=128, prefill_backend=_PrefillStub(), _k_scale=torch.tensor(0.37),
                                  _q_scale=torch.tensor(0.05))
    cfg.compilation_config.static_forward_context[LAYER] = layer
    return layer


def builder_and_impl(backend, cfg, heads=16):
    layer = attention_layer(cfg)
    spec = MLAAttentionSpec(block_size=cfg.cache_config.block_size, num_kv_heads=1, head_size=576,
                            dtype=torch.uint8 if cfg.cache_config.cache_dtype.startswith("fp8") else torch.bfloat16,
                            cache_dtype_str=cfg.cache_config.cache_dtype,
                            kv_quant_mode=get_kv_quant_mode(cfg.cache_config.cache_dtype))
    with set_current_vllm_config(cfg):
        builder = backend.get_builder_cls()(spec, [LAYER], cfg, torch.device("cpu"))
        impl = make_impl(backend, heads, cfg.cache_config.cache_dtype)
    return builder, impl, layer


def make_impl(backend, heads, cache_dtype):
    """The impl as MLAAttention.__init__ constructs it (keyword arguments, vLLM 0.33)."""
    return backend.get_impl_cls()(
        num_heads=heads, head_size=576, scale=0.1147, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
        kv_cache_dtype=cache_dtype, logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
        q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, qk_head_dim=192,
        v_head_dim=128, kv_b_proj=None, indexer=None)


# ---- registration ---------------------------------------------------------------------------

def test_entry_point_is_in_the_installed_distribution_and_vllm_loads_it():
    import importlib.metadata
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        declared = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert declared == {"mlagen": "mlagen.integrations.vllm:register"}
    (ep,) = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "mlagen"]
    assert ep.value == declared["mlagen"] and ep.dist.name == "mlagen"
    extra = importlib.metadata.distribution("mlagen").requires
    assert any(r.startswith("vllm==0.33.*") and 'extra == "vllm"' in r for r in extra), extra
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    assert DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["mlagen"] is plugin.register


def test_vllm_plugin_loader_registers_custom(monkeypatch):
    import vllm.plugins
    AttentionBackendEnum.CUSTOM.clear_override()
    with pytest.raises(ValueError, match="must be registered"):
        AttentionBackendEnum.CUSTOM.get_path()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()  # what every vLLM process runs (engine core, workers, arg parsing)
    assert AttentionBackendEnum.CUSTOM.get_path() == plugin.BACKEND == "mlagen.integrations.vllm.MlagenMLABackend"
    assert AttentionBackendEnum.CUSTOM.get_class() is plugin.MlagenMLABackend
    plugin.register()  # loaded again (another process / a repeat): the same answer
    assert AttentionBackendEnum.CUSTOM.get_class() is plugin.MlagenMLABackend
    from vllm.config.attention import AttentionConfig
    assert AttentionConfig(backend="CUSTOM").backend is AttentionBackendEnum.CUSTOM  # --attention-backend CUSTOM


def test_plugin_load_imports_no_backend_code():
    """import mlagen never imports vLLM; the plugin's register() imports vLLM's registry only (the
    MLA layer's module and the backend classes load when vLLM resolves CUSTOM)."""
    code = ("import sys, mlagen; assert 'vllm' not in sys.modules, 'import mlagen imported vllm'\n"
            "import mlagen.integrations.vllm as p; p.register()\n"
            "heavy = [m for m in ('vllm.model_executor.layers.attention.mla_attention',"
            " 'mlagen.integrations._vllm_backend') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


# ---- vLLM's checks on the backend --------------------------------------------------------------

def selector(**kw):
    base = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True)
    base.update(kw)
    return AttentionSelectorConfig(**base)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16", "fp8", "fp8_e4m3"])
@pytest.mark.parametrize("block_size", [None, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
def test_vllm_accepts_the_supported_configurations(backend, capability, kv_cache_dtype, block_size):
    reasons = backend.validate_configuration(device_capability=capability,
                                             **selector(kv_cache_dtype=kv_cache_dtype, block_size=block_size)._asdict())
    assert reasons == []
    dcp = backend.validate_configuration(device_capability=capability, **selector(use_dcp=True)._asdict())
    assert dcp == []


@pytest.mark.parametrize("change,reason", [
    (dict(head_size=512), "head_size not supported"),
    (dict(dtype=torch.float16), "dtype not supported"),
    (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype not supported"),
    (dict(kv_cache_dtype="float16"), "kv_cache_dtype not supported"),
    (dict(kv_cache_dtype="fp8_ds_mla"), "kv_cache_dtype not supported"),
    (dict(use_mla=False), "non-MLA not supported"),
    (dict(use_sparse=True), "sparse not supported"),
    (dict(has_sink=True), "attention sinks not supported"),
    (dict(use_adaptive_verification=True), "device-cpu query lens mismatch not supported"),
])
def test_vllm_refuses_what_the_kernels_do_not_do(backend, capability, change, reason):
    reasons = backend.validate_configuration(device_capability=capability, **selector(**change)._asdict())
    assert any(r.startswith(reason) for r in reasons), reasons


def test_only_the_libraries_arch_is_accepted(backend, capability):
    for cap in (DeviceCapability(8, 0), DeviceCapability(10, 0), DeviceCapability(12, 0), *ARCH_CAPABILITY.values()):
        reasons = backend.validate_configuration(device_capability=cap, **selector()._asdict())
        assert (reasons == []) == (cap == capability), (cap, reasons)


def test_block_sizes_resolve_to_kernel_pages(backend, model16):
    """Every power of two 1..256 as the kernel page; a larger or odd manager block is split into
    the largest of them dividing it (vLLM's select_common_block_size); 64 without --block-size."""
    from vllm.v1.worker.utils import select_common_block_size
    for n in serving.BLOCK_SIZES:
        assert select_common_block_size(n, [backend]) == n
    assert select_common_block_size(96, [backend]) == 32
    assert select_common_block_size(512, [backend]) == 256
    assert select_common_block_size(1024, [backend]) == 256
    assert Platform._preferred_block_size_for_backends([backend], 16, vllm_config(model16)) == 64


def test_kv_cache_layouts_keep_each_layer_contiguous(backend):
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    layouts = get_supported_kv_cache_layouts([backend])
    assert layouts and all(layout.is_layer_compact for layout in layouts)


@pytest.mark.parametrize("heads", [4, 8, 16, 32, 64, 128, 256])
def test_head_counts(backend, model16, heads):
    cfg = vllm_config(model16)
    with set_current_vllm_config(cfg):
        if heads in mlagen.NUM_HEADS:
            impl = make_impl(backend, heads, "auto")
            assert impl.num_heads == heads
        else:
            with pytest.raises(NotImplementedError, match=f"{heads} query heads"):
                make_impl(backend, heads, "auto")


def test_flags_vllm_reads(backend, model16):
    cfg = vllm_config(model16)
    builder_cls, impl_cls = backend.get_builder_cls(), backend.get_impl_cls()
    assert builder_cls.get_cudagraph_support(cfg, None) is AttentionCGSupport.UNIFORM_BATCH
    from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend, QueryLenSupport
    assert builder_cls.query_len_support is QueryLenSupport.UNIFORM
    assert issubclass(backend, MLACommonBackend) and backend.is_mla() and backend.supports_dcp()
    assert impl_cls.can_return_lse_for_decode and impl_cls.lse_base_on_e  # natural log (DCP combine IS_BASE_E)
    assert backend.get_name() == "CUSTOM" and AttentionBackendEnum[backend.get_name()] is AttentionBackendEnum.CUSTOM


@pytest.mark.parametrize("spec_tokens,threshold", [(0, 1), (1, 2), (3, 4)])
def test_mtp_widths_up_to_four_tokens(backend, model16, spec_tokens, threshold):
    builder, _, _ = builder_and_impl(backend, vllm_config(model16, spec_tokens=spec_tokens))
    assert builder.reorder_batch_threshold == threshold  # decodes of up to this many tokens take forward_mqa


def test_five_token_verification_is_refused(backend, model16):
    with pytest.raises(ValueError, match="1..4 query tokens"):
        builder_and_impl(backend, vllm_config(model16, spec_tokens=4))


# ---- vLLM metadata -> the engine-facing call -----------------------------------------------

class DecodeRecorder:
    def __init__(self, monkeypatch):
        self.calls = []
        self.decoders = []
        rec = self

        def forward(self, q, kv_cache, block_table, seq_lens, k_scale=None, q_scale=None, out=None, lse=None):
            rec.calls.append(dict(decoder=self, q=q, kv_cache=kv_cache, block_table=block_table, seq_lens=seq_lens,
                                  k_scale=k_scale, q_scale=q_scale, out=out, lse=lse))
            return "o", "lse"

        monkeypatch.setattr(serving.MLADecoder, "forward", forward)


def same_storage(view, base):
    return view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() and view.data_ptr() == base.data_ptr()


BATCHES = {  # name -> per-request (query_len, seq_len); "padded": a full CUDA graph's padding requests
    "decode": [(1, 70), (1, 5), (1, 300), (1, 64)],
    "mixed": [(1, 70), (1, 129), (5, 5)],
    "padded": [(1, 70), (1, 1), (1, 300), (0, 0), (0, 0)],
}


def common_metadata(rows, q_len, width=8, spare=2):
    """vLLM's CommonAttentionMetadata for requests (query_len, seq_len), decode rows scaled to
    q_len tokens; the block table is a leading slice of a wider persistent buffer, as the model
    runner's is."""
    rows = [(n * q_len if n == 1 else n, max(s, n * q_len if n == 1 else s)) for n, s in rows]
    qsl = [0]
    for n, _ in rows:
        qsl.append(qsl[-1] + n)
    batch = len(rows)
    table = torch.randint(1, 500, (batch + spare, width), dtype=torch.int32)
    seq = torch.zeros(batch + spare, dtype=torch.int32)
    seq[:batch] = torch.tensor([s for _, s in rows], dtype=torch.int32)
    q_loc = torch.tensor(qsl, dtype=torch.int32)
    padded = any(n == 0 for n, _ in rows)
    tokens = batch * q_len if padded else qsl[-1]  # full-graph padding: every request q_len token rows
    cm = CommonAttentionMetadata(
        query_start_loc=q_loc, query_start_loc_cpu=q_loc.clone(), seq_lens=seq[:batch], num_reqs=batch,
        num_actual_tokens=tokens, max_query_len=max(n for n, _ in rows), max_seq_len=max(s for _, s in rows),
        block_table_tensor=table[:batch], slot_mapping=torch.zeros(tokens, dtype=torch.int64),
        seq_lens_cpu_upper_bound=seq[:batch].clone())
    return cm, table, seq


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("cache_dtype", ["auto", "fp8"])
def test_metadata_becomes_exactly_the_engine_call(backend, model16, monkeypatch, batch, q_len, cache_dtype):
    cfg = vllm_config(model16, cache_dtype=cache_dtype, spec_tokens=q_len - 1)
    builder, impl, layer = builder_and_impl(backend, cfg)
    rec = DecodeRecorder(monkeypatch)
    serving._qo_cache.clear()
    import vllm.model_executor.layers.attention.mla_attention as mla
    monkeypatch.setattr(mla, "PIN_MEMORY", False)  # the prefill half's host buffers: no pinning without a GPU
    cm, table, seq = common_metadata(BATCHES[batch], q_len)
    md = builder.build(0, cm)
    decodes = 2 if batch == "mixed" else cm.num_reqs
    assert md.num_decodes == decodes and md.num_decode_tokens == decodes * q_len
    assert (torch.device("cpu"), decodes, q_len) in serving._qo_cache  # made by the build, outside any capture
    fp8 = cache_dtype == "fp8"
    T = md.num_decode_tokens
    # what MLAAttention.forward_impl hands forward_mqa (vLLM 0.33): fp8 cache -> one fp8 q and the
    # cache viewed as fp8; bf16 -> (ql_nope, q_pe) and the bf16 cache
    cache = torch.zeros((40, 64, 576), dtype=torch.uint8 if fp8 else torch.bfloat16)
    if fp8:
        cache = cache.view(torch.float8_e4m3fn)
        q = torch.zeros((T, 16, 576), dtype=torch.float8_e4m3fn)
    else:
        q = (torch.zeros((T, 16, 512), dtype=torch.bfloat16), torch.zeros((T, 16, 192), dtype=torch.bfloat16)[..., 128:])
    with set_current_vllm_config(cfg):
        result = impl.forward_mqa(q, cache, md, layer)
    assert result == ("o", "lse")
    (call,) = rec.calls
    assert call["q"] is q and call["kv_cache"] is cache and call["out"] is None and call["lse"] is None
    bt, sl = call["block_table"], call["seq_lens"]
    assert bt.shape == (decodes, 8) and bt.dtype == torch.int32 and same_storage(bt, table) and bt.stride() == (8, 1)
    assert sl.shape == (decodes,) and sl.dtype == torch.int32 and same_storage(sl, seq)
    assert call["k_scale"] is (layer._k_scale if fp8 else None)
    assert call["q_scale"] is (layer._q_scale if fp8 else None)
    dec = call["decoder"]
    assert (dec.num_heads, dec.block_size, dec.kv_cache_dtype, dec.q_dtype) == (16, 64, "fp8" if fp8 else "bf16",
                                                                                "fp8" if fp8 else "bf16")
    assert dec.sm_scale == impl.scale and dec.return_lse is False  # no DCP: vLLM asks for no LSE


def test_layers_share_one_decoder(backend, model16, monkeypatch):
    cfg = vllm_config(model16, cache_dtype="fp8")
    builder, impl, layer = builder_and_impl(backend, cfg)
    with set_current_vllm_config(cfg):
        impl2 = make_impl(backend, 16, "fp8")
    rec = DecodeRecorder(monkeypatch)
    cm, _, _ = common_metadata(BATCHES["decode"], 1)
    md = builder.build(0, cm)
    cache = torch.zeros((40, 64, 576), dtype=torch.float8_e4m3fn)
    q = torch.zeros((4, 16, 576), dtype=torch.float8_e4m3fn)
    impl.forward_mqa(q, cache, md, layer)
    impl2.forward_mqa(q, cache.clone(), md, layer)
    assert rec.calls[0]["decoder"] is rec.calls[1]["decoder"]
