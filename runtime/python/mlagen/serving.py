"""The engine-facing decode: MLA decode on the tensors a serving engine holds, laid out its way.

    from mlagen.serving import MLADecoder
    dec = MLADecoder(num_heads=16, kv_cache_dtype="fp8", block_size=64, sm_scale=s, q_dtype="fp8")
    dec.plan(batch, max_blocks, num_blocks, q_len=1)        # once per batch shape, before any capture
    o, lse = dec.forward(q, kv_cache, block_table, seq_lens, k_scale=k_scale, q_scale=q_scale)

Independent of any engine (mlagen.integrations.vllm is one user). The tensors, as vLLM, SGLang
and FlashMLA lay them out:

  q            (T, H, 576) with T = batch * q_len (sequence b's tokens are rows b*q_len ..
               b*q_len + q_len - 1, causal among themselves: token i of n sees the first
               seq_len - n + 1 + i rows), latent (512) first, RoPE (64) last; or the two parts
               (q_nope (T, H, 512), q_pe (T, H, 64)), which are copied into one preallocated
               (T, H, 576) buffer (the kernels read q as one 576-dim row with token and head
               strides); a q given whole is read in place. bf16, or fp8 (float8_e4m3fn) with
               q_scale (dequant = q * q_scale); with q_dtype="fp8" a bf16 q is quantized on the
               device per tensor instead.
  kv_cache     (num_blocks, block_size, 576), or (num_blocks, block_size, 1, 576): bf16, or fp8
               stored as uint8 or float8_e4m3fn (e4m3fnuz on gfx942), with k_scale (one float32:
               dequant = kv * k_scale; vLLM's layer._k_scale). A uint8 cache is read as fp8 where
               it lies (no copy).
  block_table  (batch, max_blocks) int32, row b the blocks of sequence b in order (entries past
               a sequence's last block are never read); any row stride.
  seq_lens     (batch,) int32 on the device, read by the kernels each call (never by the host).

Returns (o (T, H, 512) bf16, lse (T, H) float32 | None): lse = ln sum_j exp(sm_scale q.k_j), the
natural log (FlashAttention's / FlashMLA's softmax_lse, what vLLM's DCP combine takes with
lse_base_on_e=True); a row that sees no key gives zeros and -inf (a padding sequence of length 0).

What is fixed where: a plan (mlagen.prepare: kernel chosen, workspace sized) holds every
tensor's shape, strides and dtype, the batch, q_len and the number of cache blocks, never a
pointer's contents: each forward passes that call's pointers (Plan.run), and the kernels read the
block table and seq_lens on the device. A CUDA graph captured around forward therefore replays
correctly with new block-table contents and new lengths written into the same tensors. Nothing
is copied per call (the cache, the block table and seq_lens are read where they lie; q is copied
only when given as two parts); nothing is allocated but the outputs (unless out / lse are given)
and, the first time a (T, dtype, launch target) is seen, the q buffer. A forward whose tensors differ
in any planned property finds or makes the plan for them (an engine's different batch sizes each
get one, once). CUDA graphs: a plan may be made inside a capture, but the query offsets of its
(batch, q_len) (arange * q_len on the device, written when made) must exist before it: plan(),
one eager forward, or qo_indptr(batch, q_len, device) (vLLM's metadata builder calls it).
"""
from __future__ import annotations

import ctypes
import sys

from . import _facts, _launch, lib, prepare, MlagenError, NUM_HEADS, MAX_Q_LEN

__all__ = ["MLADecoder", "KV_CACHE_DTYPES", "BLOCK_SIZES", "qo_indptr"]

QK, DV = _facts.QK_DIM, _facts.V_DIM
KV_CACHE_DTYPES = ("bf16", "fp8")
BLOCK_SIZES = _facts.PAGE_SIZES  # every power of two 1..256: the kernels' page sizes

_torch_mod = None
_package = sys.modules[__package__]  # the mlagen package: its _native (the C++ operators) is set at import


def _torch():
    global _torch_mod
    if _torch_mod is None:
        import torch
        _torch_mod = torch
    return _torch_mod


_fp8 = None


def _fp8_dtype():
    """The fp8 (e4m3) dtype of this build's cache and q: float8_e4m3fnuz for gfx942 (MI300),
    float8_e4m3fn elsewhere; a uint8 cache is viewed as it."""
    global _fp8
    if _fp8 is None:
        torch = _torch()
        try:
            archs = lib().mlagen_build_archs().decode()
        except Exception:  # no library: the plan will say so
            archs = ""
        _fp8 = torch.float8_e4m3fnuz if "gfx942" in archs and hasattr(torch, "float8_e4m3fnuz") else torch.float8_e4m3fn
    return _fp8


_qo_cache: dict = {}  # (device, batch, q_len) -> int32 (batch + 1,) arange * q_len


def qo_indptr(batch: int, q_len: int, device):
    """The uniform-batch query offsets [0, q_len, 2 q_len, ..., batch q_len] (int32, on `device`),
    made once per (device, batch, q_len) and kept: a graph captured with it reads the same buffer
    on every replay. Make it outside a CUDA-graph capture (its values are written when made)."""
    torch = _torch()
    device = torch.device(device)
    key = (device, batch, q_len)
    t = _qo_cache.get(key)
    if t is None:
        if device.type == "cuda" and _launch.capturing(device.index if device.index is not None else
                                                       torch.cuda.current_device()):
            raise MlagenError(1, f"qo_indptr(batch={batch}, q_len={q_len}): first made during a CUDA-graph capture, "
                                 f"where its values would not be written; plan this batch shape before capturing")
        t = _qo_cache[key] = torch.arange(batch + 1, dtype=torch.int32, device=device) * q_len
    return t


def _fast_key(q, kv_cache, block_table, seq_lens, q_scale, k_scale):
    """What MLADecoder._plan_for checks of a call, strides excepted (forward() builds it inline)."""
    return (q.shape, q.dtype, q.get_device(), kv_cache.shape, kv_cache.dtype, block_table.shape, seq_lens.shape,
            q_scale is None, k_scale is None)


class _Planned:
    """One batch shape's mlagen Plan with what forward passes it per call."""
    __slots__ = ("plan", "qo", "device", "device_index", "out_shape", "lse_shape")

    def __init__(self, plan, qo, lse: bool):
        self.plan, self.qo = plan, qo
        self.device, self.device_index = plan.device, plan.device_index
        self.out_shape = plan.out_shape
        self.lse_shape = plan.out_shape[:2] if lse else None


class MLADecoder:
    """MLA decode for one attention configuration (heads, cache dtype, block size, scale, q
    dtype, LSE or not); plans per batch shape, runs per call. Safe to share between the layers
    of a model (they run one after another; a plan's scratch is per launch target, _launch.handle),
    which is what an engine should do: one decoder per configuration, not per layer."""

    def __init__(self, num_heads: int, *, kv_cache_dtype: str = "bf16", block_size: int, sm_scale: float,
                 q_dtype: str = "bf16", max_q_len: int = MAX_Q_LEN, return_lse: bool = False):
        if num_heads not in NUM_HEADS:
            raise MlagenError(1, f"num_heads={num_heads!r}: expected one of {NUM_HEADS} (query heads per GPU)")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise MlagenError(1, f"kv_cache_dtype={kv_cache_dtype!r}: expected one of {KV_CACHE_DTYPES}")
        if block_size not in BLOCK_SIZES:
            raise MlagenError(1, f"block_size={block_size!r}: expected a power of two 1..256 {BLOCK_SIZES}")
        if q_dtype not in ("bf16", "fp8"):
            raise MlagenError(1, f"q_dtype={q_dtype!r}: expected 'bf16' or 'fp8' (fp8: an fp8 q with q_scale, or a "
                                 f"bf16 q quantized per tensor on the device)")
        if not 1 <= max_q_len <= MAX_Q_LEN:
            raise MlagenError(1, f"max_q_len={max_q_len!r}: expected 1..{MAX_Q_LEN}")
        try:
            sm_scale = float(sm_scale)
        except (TypeError, ValueError):
            sm_scale = float("nan")
        if not 0 < sm_scale < float("inf"):
            raise MlagenError(1, f"sm_scale={sm_scale!r}: expected a finite number > 0")
        self.num_heads, self.kv_cache_dtype, self.block_size = num_heads, kv_cache_dtype, block_size
        self.sm_scale, self.q_dtype, self.max_q_len, self.return_lse = sm_scale, q_dtype, max_q_len, return_lse
        self._plans: dict = {}   # per-call key (see _key) -> _Planned
        self._qbuf: dict = {}    # (T, dtype, device index, launch target) -> (T, H, 576) buffer, split q
        self._fast: dict = {}    # _fast_key -> the C++ per-call entry's arguments (see _plan_for)

    # ---- planning ---------------------------------------------------------------------------
    def plan(self, batch: int, max_blocks: int, num_blocks: int, q_len: int = 1, *, device=None,
             block_table_stride: int | None = None, q_storage=None, kv_storage=None):
        """Plans a batch shape ahead of its first forward(): batch sequences of q_len tokens,
        block tables max_blocks wide at row stride block_table_stride (default max_blocks), a
        cache of num_blocks blocks, a concatenated contiguous q, on `device` (default the current
        CUDA device). q_storage / kv_storage: the torch dtypes forward() will get (default: bf16,
        or float8_e4m3fn for fp8; a uint8 fp8 cache is its own plan). Call it before capturing
        a CUDA graph of forward()."""
        torch = _torch()
        device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
        fp8 = _fp8_dtype()
        q_storage = q_storage or (fp8 if self.q_dtype == "fp8" else torch.bfloat16)
        kv_storage = kv_storage or (fp8 if self.kv_cache_dtype == "fp8" else torch.bfloat16)
        stride = block_table_stride if block_table_stride is not None else max_blocks
        table = torch.empty((batch, stride), dtype=torch.int32, device=device)[:, :max_blocks]
        lens = torch.empty(batch, dtype=torch.int32, device=device)
        cache = torch.empty((num_blocks, self.block_size, QK), dtype=kv_storage, device=device)
        q = torch.empty((batch * q_len, self.num_heads, QK), dtype=q_storage, device=device)
        one = torch.ones(1, dtype=torch.float32, device=device)
        q_scale = one if q_storage != torch.bfloat16 else None
        k_scale = one if self.kv_cache_dtype == "fp8" else None
        return self._plan_for(self._key(q, cache, table, lens, q_scale, k_scale), q, cache, table, lens, q_scale,
                              k_scale)

    @staticmethod
    def _key(q, kv_cache, block_table, seq_lens, q_scale, k_scale):
        """Everything a plan holds about a call's tensors, pointers excepted (forward() builds
        the same tuple inline)."""
        return (q.shape, q.stride(), q.dtype, q.get_device(), kv_cache.shape, kv_cache.stride(), kv_cache.dtype,
                block_table.shape, block_table.stride(), block_table.dtype, seq_lens.shape, seq_lens.dtype,
                q_scale is None, k_scale is None)

    def _plan_for(self, key, q, kv_cache, block_table, seq_lens, q_scale, k_scale) -> _Planned:
        torch = _torch()
        T, heads = q.shape[0], q.shape[1]
        batch = block_table.shape[0] if block_table.dim() == 2 else -1
        if heads != self.num_heads:
            raise MlagenError(1, f"q: {heads} heads: expected num_heads={self.num_heads}")
        if batch < 1 or T % batch or not 1 <= T // batch <= self.max_q_len:
            raise MlagenError(1, f"q: {T} token rows for block_table {tuple(block_table.shape)}: expected batch * q_len "
                                 f"rows, q_len 1..{self.max_q_len} (a uniform batch)")
        q_len = T // batch
        if seq_lens.shape != (batch,):
            raise MlagenError(1, f"seq_lens: shape {tuple(seq_lens.shape)}: expected ({batch},) (one length a sequence)")
        kv = kv_cache
        if self.kv_cache_dtype == "fp8":
            if kv.dtype == torch.uint8:
                kv = kv.view(_fp8_dtype())  # vLLM's storage; zero-copy (the plan holds the dtype)
            if k_scale is None:
                raise MlagenError(1, "k_scale: None with an fp8 cache: expected one float32 (dequant = kv * k_scale)")
        elif k_scale is not None:
            raise MlagenError(1, "k_scale: given with a bf16 cache; expected None")
        if kv.dim() not in (3, 4) or kv.shape[1] != self.block_size:
            raise MlagenError(1, f"kv_cache: shape {tuple(kv.shape)}: expected (num_blocks, block_size={self.block_size}, "
                                 f"[1,] {QK})")
        config = {"batch_size": batch, "num_heads": heads, "sm_scale": self.sm_scale, "kv_seq_len": None}
        qo = qo_indptr(batch, q_len, q.device)
        plan = prepare(q, kv, k_scale, qo, None, config, kv_format=self.kv_cache_dtype, q_dtype=self.q_dtype,
                       q_scale=q_scale, page_size=self.block_size, page_table=block_table, kv_lens=seq_lens,
                       return_lse=self.return_lse, q_len=q_len)
        planned = self._plans[key] = _Planned(plan, qo, self.return_lse)
        # the C++ per-call entry where it is loaded, for a cache that needs no view (an fp8 cache stored
        # as uint8 keeps Plan.run): what forward passes it past the call's tensors, under a key of what
        # this method checked (shapes, dtypes, device, scales present); the strides are the entry's to
        # check (its own plan a layout), its output new each call
        if _package._native is not None and _package._native.fast is not None and kv is kv_cache:
            self._fast[_fast_key(q, kv_cache, block_table, seq_lens, q_scale, k_scale)] = (
                qo, self.kv_cache_dtype, self.q_dtype, self.sm_scale, q_len, self.block_size, self.return_lse)
        return planned

    # ---- the per-call path ------------------------------------------------------------------
    def _join(self, q):
        """(q_nope, q_pe) -> one (T, H, 576) buffer (kept per T, dtype, device and launch target)."""
        torch = _torch_mod
        nope, pe = q
        dev = nope.get_device()
        key = (nope.shape[0], nope.dtype, dev, _launch.handle(dev))
        buf = self._qbuf.get(key)
        if buf is None:
            buf = self._qbuf[key] = torch.empty((nope.shape[0], nope.shape[1], QK), dtype=nope.dtype,
                                                device=nope.device)
        torch.cat(q, dim=-1, out=buf)
        return buf

    def forward(self, q, kv_cache, block_table, seq_lens, k_scale=None, q_scale=None, out=None, lse=None):
        """One decode step: (o (T, H, 512) bf16, lse (T, H) float32 or None); see the module doc.
        out / lse: contiguous tensors of those shapes to write into (else new ones)."""
        if q.__class__ is tuple or q.__class__ is list:
            q = self._join(q)
        if out is None and lse is None:
            f = self._fast.get((q.shape, q.dtype, q.get_device(), kv_cache.shape, kv_cache.dtype, block_table.shape,
                                seq_lens.shape, q_scale is None, k_scale is None))  # _fast_key's, inline
            if f is not None:
                res = _package._native.fast(q, kv_cache, k_scale, f[0], None, f[1], f[2], 0, f[3], q_scale, f[4],
                                            block_table, seq_lens, f[5], None, None, f[6])
                if res is not NotImplemented:
                    return res if f[6] else (res, None)
        key = (q.shape, q.stride(), q.dtype, q.get_device(), kv_cache.shape, kv_cache.stride(), kv_cache.dtype,
               block_table.shape, block_table.stride(), block_table.dtype, seq_lens.shape, seq_lens.dtype,
               q_scale is None, k_scale is None)
        p = self._plans.get(key)
        if p is None:
            p = self._plan_for(key, q, kv_cache, block_table, seq_lens, q_scale, k_scale)
        torch = _torch_mod
        if out is None:
            out = torch.empty(p.out_shape, dtype=torch.bfloat16, device=p.device)
        elif out.shape != p.out_shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise MlagenError(1, f"out: {out.dtype} {tuple(out.shape)}: expected contiguous bf16 {p.out_shape}")
        if p.lse_shape is not None:
            if lse is None:
                lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.device)
            elif lse.shape != p.lse_shape or lse.dtype != torch.float32 or not lse.is_contiguous():
                raise MlagenError(1, f"lse: {lse.dtype} {tuple(lse.shape)}: expected contiguous float32 {p.lse_shape}")
        elif lse is not None:
            raise MlagenError(1, "lse: given to a decoder made with return_lse=False")
        p.plan.run(q, q_scale, kv_cache, k_scale, p.qo, None, out, _launch.handle(p.device_index), lse,
                   (block_table, seq_lens, None, None))
        return out, lse

    __call__ = forward

    def check_device_errors(self) -> None:
        """Synchronizes; raises MlagenError if a kernel of this decoder flagged its inputs (a block
        id outside the cache or a block list longer than the table: that sequence's rows are NaN,
        nothing outside the cache is read). Reads and clears each plan's error word, as
        mlagen.check_device_errors() does for mlagen.decode's plans."""
        torch = _torch()
        L, first = lib(), None
        for p in self._plans.values():
            for where, ws in list(p.plan.bound.items()):
                errors = ctypes.c_uint32(0)
                with torch.cuda.device(p.device_index):
                    status = L.mlagen_take_device_errors(ws.data_ptr(), where, ctypes.byref(errors))
                if status and first is None:
                    first = (status, L.mlagen_last_error().decode())
        if first is not None:
            raise MlagenError(first[0], f"{L.mlagen_status_name(first[0]).decode()}: {first[1]}")
