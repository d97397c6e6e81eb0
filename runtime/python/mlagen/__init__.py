"""mlagen: MLA decode attention from generated kernels. Thin torch binding over the C ABI.

    import mlagen
    out = mlagen.decode(q, kv_data, qo_indptr, kv_indptr, config)   # the leaderboard tuple

The first call for a shape validates it through the runtime and caches a prepared
problem; later calls pass pointers only. Nothing is allocated per call but the output
(the workspace is kept per device and grows when a larger problem needs it), and nothing
synchronizes with the host. Device-side input checks (indptr contents) are read with
`check_device_errors()`, which synchronizes.
"""
from __future__ import annotations

import ctypes

from ._lib import (DTYPE, KernelInfo, MlagenError, Problem, fingerprint, kernels, lib,  # noqa: F401
                   library_path, raise_for, select)

__all__ = ["decode", "leaderboard_entry", "prepare", "check_device_errors", "kernels", "select", "fingerprint", "MlagenError",
           "Problem", "library_path", "last_kernel"]

_QK, _DV, _HEADS = 576, 512, 16


_torch_mod = None


def _torch():
    global _torch_mod
    if _torch_mod is None:
        import torch
        _torch_mod = torch
    return _torch_mod


def _get_raw_stream(device_index: int) -> int:
    global _get_raw_stream
    torch = _torch()
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fast is not None:
        _get_raw_stream = fast  # rebind: later calls go straight to torch's accessor
        return fast(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _kv_dtype_name(t) -> str:
    torch = _torch()
    names = {torch.float8_e4m3fn: "fp8e4m3fn", torch.bfloat16: "bf16"}
    if hasattr(torch, "float8_e4m3fnuz"):
        names[torch.float8_e4m3fnuz] = "fp8e4m3fnuz"
    if t not in names:
        raise MlagenError(1, f"kv: dtype {t}: expected torch.float8_e4m3fn (fp8 KV)")
    return names[t]


class _Workspace:
    """One zeroed device buffer per device, shared by every plan on that device (so the
    device error word has one home); grows, never shrinks."""
    buffers: dict = {}

    @classmethod
    def get(cls, device, nbytes: int):
        torch = _torch()
        buf = cls.buffers.get(device)
        if buf is None or buf.numel() < nbytes:
            new = torch.zeros(max(nbytes, 1 << 20), dtype=torch.uint8, device=device)
            if buf is not None:
                new[:4].copy_(buf[:4])  # keep flagged device errors (stream-ordered)
                for plan in _plans.values():
                    if plan.device == device:
                        plan.set_workspace(new)
            cls.buffers[device] = buf = new
        return buf


class Plan:
    """A validated problem for one shape / layout; `run` passes the per-call pointers."""

    def __init__(self, problem: Problem, info: dict, workspace, device):
        self.problem, self.info, self.device = problem, info, device
        self.device_index = device.index if device.index is not None else _torch().cuda.current_device()
        self.out_shape = (problem.total_q, _HEADS, _DV)
        self.out_dtype = _torch().bfloat16
        self._pp = ctypes.byref(problem)
        self._run = lib().mlagen_decode_ptrs
        self.set_workspace(workspace)

    def set_workspace(self, ws) -> None:
        self.workspace = ws
        self.problem.workspace, self.problem.workspace_bytes = ws.data_ptr(), ws.numel()

    def run(self, q, kv, kv_scale, qo_indptr, kv_indptr, out, stream) -> None:
        status = self._run(self._pp, q.data_ptr(), kv.data_ptr(), kv_scale.data_ptr(), qo_indptr.data_ptr(),
                           kv_indptr.data_ptr(), out.data_ptr(), stream)
        if status:
            raise_for(status)


_plans: dict = {}       # (tensor metadata, overrides) -> Plan
_fast_plans: dict = {}  # tensor metadata -> Plan, for calls without overrides
_last_plan = None


def last_kernel() -> dict | None:
    """The kernel the most recent decode() ran (name, generic, splits, ...)."""
    return _last_plan.info if _last_plan is not None else None


def _unpack_kv(kv_data, kv_format: str):
    if isinstance(kv_data, dict):
        if kv_format not in kv_data:
            raise MlagenError(1, f"kv_data: no {kv_format!r} entry (has {sorted(kv_data)}); "
                                 f"expected kv_data['{kv_format}'] = (tensor, scale)")
        kv_data = kv_data[kv_format]
    if not (isinstance(kv_data, (tuple, list)) and len(kv_data) == 2):
        raise MlagenError(1, "kv_data: expected (kv tensor [total_kv, 1, 576], scale tensor (1,) float32)")
    return kv_data


def prepare(q, kv, kv_scale, qo_indptr, kv_indptr, config: dict, *, force_generic=False, splits=0,
            kernel=None) -> Plan:
    torch = _torch()
    dev = q.device
    if dev.type != "cuda":
        raise MlagenError(1, f"q: on {dev}, expected a CUDA tensor")
    for name, t in (("kv", kv), ("kv_scale", kv_scale), ("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        if t.device != dev:
            raise MlagenError(1, f"{name}: on {t.device}, expected {dev} (the device of q)")
    if q.dtype != torch.bfloat16:
        raise MlagenError(1, f"q: dtype {q.dtype}: expected torch.bfloat16")
    if q.dim() != 3 or q.shape[2] != _QK or q.stride(2) != 1:
        raise MlagenError(1, f"q: shape {tuple(q.shape)} strides {q.stride()}: expected (total_q, 16, 576) "
                             f"with contiguous dims")
    if kv.dim() == 3:
        if kv.shape[1] != 1:
            raise MlagenError(1, f"kv: shape {tuple(kv.shape)}: expected (total_kv, 1, 576) (one KV head)")
        kv_rows, kv_stride = kv.shape[0], kv.stride(0)
    elif kv.dim() == 2:
        kv_rows, kv_stride = kv.shape[0], kv.stride(0)
    else:
        raise MlagenError(1, f"kv: shape {tuple(kv.shape)}: expected (total_kv, 1, 576)")
    if kv.shape[-1] != _QK or kv.stride(-1) != 1:
        raise MlagenError(1, f"kv: shape {tuple(kv.shape)}: expected last dim 576, contiguous")
    if kv_scale.dtype != torch.float32 or kv_scale.numel() != 1:
        raise MlagenError(1, f"kv_scale: {kv_scale.dtype} with {kv_scale.numel()} elements: expected one float32")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous():
            raise MlagenError(1, f"{name}: {t.dtype} shape {tuple(t.shape)}: expected contiguous int32 (batch+1,)")
    batch = int(config.get("batch_size", qo_indptr.numel() - 1))
    if qo_indptr.numel() != batch + 1 or kv_indptr.numel() != batch + 1:
        raise MlagenError(1, f"qo_indptr/kv_indptr: {qo_indptr.numel()}/{kv_indptr.numel()} elements: "
                             f"expected batch_size+1 = {batch + 1}")
    kv_len = int(config.get("kv_seq_len") or 0)
    if kv_len and kv_rows != batch * kv_len:
        kv_len = 0  # lengths are not uniform: the generic kernel reads them from kv_indptr
    p = Problem(abi_version=1, batch=batch, num_heads=int(config.get("num_heads", q.shape[1])),
                num_kv_heads=int(config.get("num_kv_heads", 1)), q_len=int(config.get("q_seq_len", 1)),
                qk_dim=int(config.get("qk_head_dim", _QK)), v_dim=int(config.get("v_head_dim", _DV)),
                kv_len=kv_len, total_q=q.shape[0], total_kv=kv_rows, q_dtype=DTYPE["bf16"],
                kv_dtype=DTYPE[_kv_dtype_name(kv.dtype)], sm_scale=float(config.get("sm_scale", _QK ** -0.5)),
                splits=splits, force_generic=int(bool(force_generic)),
                q=q.data_ptr(), q_stride_token=q.stride(0), q_stride_head=q.stride(1),
                kv=kv.data_ptr(), kv_stride_token=kv_stride, kv_scale=kv_scale.data_ptr(),
                qo_indptr=qo_indptr.data_ptr(), kv_indptr=kv_indptr.data_ptr(),
                out=0x100, out_stride_token=_HEADS * _DV, out_stride_head=_DV,
                kernel_name=kernel.encode() if kernel else None)
    if q.shape[1] != p.num_heads:
        raise MlagenError(1, f"q: {q.shape[1]} heads but config num_heads={p.num_heads}")
    L = lib()
    info = KernelInfo()
    raise_for(L.mlagen_select(ctypes.byref(p), ctypes.byref(info)), L)
    nbytes = L.mlagen_workspace_bytes(ctypes.byref(p))
    _check_device_once(dev)
    return Plan(p, info.as_dict(), _Workspace.get(dev, nbytes), dev)


_checked_devices = set()


def _check_device_once(dev):
    if dev not in _checked_devices:
        torch = _torch()
        with torch.cuda.device(dev):
            raise_for(lib().mlagen_check_device())
        _checked_devices.add(dev)


def _stream_of(dev) -> int:
    return _get_raw_stream(dev.index if dev.index is not None else _torch().cuda.current_device())


def _decode_cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format):
    """The per-call path once a plan exists for these tensors' metadata (None otherwise):
    the metadata is the cache key (everything the plan validated once: shapes, strides,
    dtypes, device, the uniform length and scale), then an output and one C call with six
    pointers. Positional, no keyword parsing: the leaderboard entry calls it directly."""
    global _last_plan
    try:
        kv, kv_scale = kv_data[kv_format]
    except (KeyError, TypeError, ValueError):
        return None
    plan = _fast_plans.get((q.shape, q.stride(), q.dtype, q.get_device(), kv.shape, kv.stride(), kv.dtype,
                            kv_scale.dtype, qo_indptr.shape, qo_indptr.dtype, kv_indptr.shape, kv_indptr.dtype,
                            config.get("kv_seq_len"), config.get("sm_scale")))
    if plan is None:
        return None
    out = _torch_mod.empty(plan.out_shape, dtype=plan.out_dtype, device=plan.device)
    status = plan._run(plan._pp, q.data_ptr(), kv.data_ptr(), kv_scale.data_ptr(), qo_indptr.data_ptr(),
                       kv_indptr.data_ptr(), out.data_ptr(), _get_raw_stream(plan.device_index))
    if status:
        raise_for(status)
    _last_plan = plan
    return out


def leaderboard_entry(kv_format: str = "fp8"):
    """custom_kernel(data) for the leaderboard tuple: the cached path first, decode() for the
    first call of a shape (which makes the plan) and for anything unusual."""
    cached, full = _decode_cached, decode

    def custom_kernel(data):
        q, kv_data, qo_indptr, kv_indptr, config = data
        out = cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format)
        return out if out is not None else full(q, kv_data, qo_indptr, kv_indptr, config, kv_format=kv_format)
    return custom_kernel


def decode(q, kv_data, qo_indptr, kv_indptr, config: dict, *, kv_format: str = "fp8", out=None,
           force_generic: bool = False, splits: int = 0, kernel: str | None = None):
    """MLA decode: softmax(q K^T * sm_scale) V with K the 576-dim latent rows, V their first 512.

    q (total_q, 16, 576) bf16; kv_data = {"fp8": (kv (total_kv, 1, 576) float8_e4m3fn, scale (1,) f32), ...}
    or directly (kv, scale); qo_indptr / kv_indptr (batch+1,) int32; config the leaderboard's dict.
    Returns (total_q, 16, 512) bf16. force_generic / splits / kernel (a name from kernels())
    override the dispatch, for tests and tuning.

    Per call this reads the tensors' metadata once (the plan cache key), allocates the
    output and passes six pointers to the library: everything else happened when the
    plan for this shape was made.
    """
    global _last_plan
    if out is None and not (force_generic or splits or kernel):
        res = _decode_cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format)
        if res is not None:
            return res
    kv, kv_scale = _unpack_kv(kv_data, kv_format)
    meta = (q.shape, q.stride(), q.dtype, q.get_device(), kv.shape, kv.stride(), kv.dtype, kv_scale.dtype,
            qo_indptr.shape, qo_indptr.dtype, kv_indptr.shape, kv_indptr.dtype,
            config.get("kv_seq_len"), config.get("sm_scale"))
    key = meta + (force_generic, splits, kernel)
    plan = _plans.get(key)
    if plan is None:
        plan = prepare(q, kv, kv_scale, qo_indptr, kv_indptr, config, force_generic=force_generic, splits=splits,
                       kernel=kernel)
        _plans[key] = plan
        if not (force_generic or splits or kernel):
            _fast_plans[meta] = plan
    torch = _torch_mod
    if out is None:
        out = torch.empty(plan.out_shape, dtype=torch.bfloat16, device=plan.device)
    elif (out.dtype != torch.bfloat16 or out.shape != plan.out_shape or not out.is_contiguous()):
        raise MlagenError(1, f"out: {out.dtype} {tuple(out.shape)}: expected contiguous bf16 {plan.out_shape}")
    plan.run(q, kv, kv_scale, qo_indptr, kv_indptr, out, _get_raw_stream(plan.device_index))
    _last_plan = plan
    return out


def check_device_errors(device=None) -> None:
    """Synchronize and raise MlagenError if a kernel flagged its inputs (e.g. an indptr
    that disagrees with the sizes; the affected outputs are NaN). Clears the flag."""
    torch = _torch()
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    ws = _Workspace.buffers.get(device)
    if ws is None:
        return
    errors = ctypes.c_uint32(0)
    raise_for(lib().mlagen_take_device_errors(ws.data_ptr(), _stream_of(device), ctypes.byref(errors)))
