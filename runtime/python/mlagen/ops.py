"""mlagen as PyTorch operators: `torch.ops.mlagen.decode` and `torch.ops.mlagen.decode_lse`,
registered by `import mlagen` (which imports this module) where torch is installed.

    import mlagen
    out = torch.ops.mlagen.decode(q, kv, kv_scale, qo_indptr, kv_indptr, "fp8", "bf16", kv_seq_len, sm_scale)
    out, lse = torch.ops.mlagen.decode_lse(q, kv, kv_scale, qo_indptr, None, "fp8", "bf16", 0, sm_scale,
                                           q_len=2, page_table=block_table, kv_lens=seq_lens, page_size=64)

One schema, registered one of two ways (REGISTRATION says which):
  "native"  libmlagen_torch.so (runtime/torch/ops.cpp): registered from C++ (TORCH_LIBRARY), its
            CUDA kernel keeps the plan cache (keyed on the tensors' metadata), allocates the output
            and calls the library's mlagen_run; meta kernels give the outputs' shapes. Built beside
            libmlagen.so against the torch it runs with (the file records that torch's version).
  "python"  torch.library.custom_op over mlagen.decode's ctypes path, with fake implementations:
            where the C++ object is absent (not built: no torch at build time, an AMD build), was
            built against another torch, or does not load. One warning line says why.
MLAGEN_TORCH_LIBRARY names the C++ object to load instead of the one beside the library ("" for none).

Functional ops (no argument is mutated; the outputs are new) that pass torch.library.opcheck,
trace under torch.compile(fullgraph=True) and record into CUDA graphs (they launch on torch's
current queue of the tensors' device). The arguments are mlagen.decode's, flattened into what an
operator schema can hold:

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
float32 (natural log of the scaled scores). Errors name the field: RuntimeErrors whose text starts
with the status (MLAGEN_ERR_INVALID: ...) from the C++ operators, mlagen.MlagenError (a
RuntimeError) from the Python ones; mlagen.decode raises MlagenError either way.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

import torch

from . import _facts, _lib

_MARK = "mlagen-torch-built-with:"
REGISTRATION = None  # "native" | "python", set below
NATIVE_PATH = None  # the C++ object loaded, if any


def native_path() -> str:
    """MLAGEN_TORCH_LIBRARY, else libmlagen_torch.so beside the library the binding loads."""
    env = os.environ.get("MLAGEN_TORCH_LIBRARY")
    if env is not None:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(_lib.library_path())), "libmlagen_torch.so")


def built_with(path: str) -> str | None:
    """The torch version the C++ object at `path` was built against (read from its bytes, unloaded)."""
    with open(path, "rb") as f:
        data = f.read()
    i = data.find(_MARK.encode())
    if i < 0:
        return None
    j = data.find(b";", i)
    return data[i + len(_MARK):j].decode(errors="replace")


class _Native:
    """The C++ operators' entry points: the ops' C++ callables (the OpOverloads' own, past their
    Python wrapper) and the object's C functions (the library path, the last plan, the error words)."""

    def __init__(self, path: str):
        self.path = path
        h = ctypes.CDLL(path)
        h.mlagen_torch_set_library.restype, h.mlagen_torch_set_library.argtypes = None, [ctypes.c_char_p]
        h.mlagen_torch_last_plan.restype, h.mlagen_torch_last_plan.argtypes = ctypes.c_void_p, []
        h.mlagen_torch_forget_last.restype, h.mlagen_torch_forget_last.argtypes = None, []
        h.mlagen_torch_num_plans.restype, h.mlagen_torch_num_plans.argtypes = ctypes.c_int64, []
        h.mlagen_torch_take_device_errors.restype = ctypes.c_int
        h.mlagen_torch_take_device_errors.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        self._h = h
        h.mlagen_torch_set_library(os.path.abspath(_lib.library_path()).encode())
        self.forget_last = h.mlagen_torch_forget_last
        self.num_plans = h.mlagen_torch_num_plans
        self.decode = getattr(torch.ops.mlagen.decode.default, "_op", torch.ops.mlagen.decode.default)
        self.decode_lse = getattr(torch.ops.mlagen.decode_lse.default, "_op", torch.ops.mlagen.decode_lse.default)
        # the per-call entry (ops.cpp, built where the configuring Python had its headers): the
        # operators' arguments and the LSE flag; NotImplemented where the dispatcher must see the call
        self.fast = None
        if hasattr(h, "mlagen_torch_fast_entry"):
            entry = ctypes.PyDLL(path).mlagen_torch_fast_entry  # PyDLL: called with the GIL held
            entry.restype, entry.argtypes = ctypes.py_object, []
            self.fast = entry()
        # the leaderboard call's entry, config included: (q, kv_data, qo_indptr, kv_indptr, config,
        # kv_format, q_dtype) through the fields remember_config(config copy, *fields) was given for an
        # equal config; NotImplemented wherever the binding has a check or a message of its own
        self.call = self.remember_config = None
        if hasattr(h, "mlagen_torch_call_entries"):
            entries = ctypes.PyDLL(path).mlagen_torch_call_entries
            entries.restype, entries.argtypes = ctypes.py_object, []
            self.call, self.remember_config = entries()
        self._infos: dict = {}

    def last_kernel(self) -> dict | None:
        """The kernel of the most recent call through these operators (None after a ctypes call)."""
        plan = self._h.mlagen_torch_last_plan()
        if not plan:
            return None
        info = self._infos.get(plan)
        if info is None:  # the C++ plans live as long as the process: their info once each
            L = _lib.lib()
            k, n = _lib.KernelInfo(), ctypes.c_size_t(0)
            _lib.raise_for(L.mlagen_plan_info(ctypes.c_void_p(plan), ctypes.byref(k), ctypes.byref(n)), L)
            info = self._infos[plan] = k.as_dict()
        return info

    def take_device_errors(self, device: int) -> tuple[int, str]:
        """(the first failing status, its message) over the C++ plans' scratch on `device` (0, "": none)."""
        buf = ctypes.create_string_buffer(1024)
        status = self._h.mlagen_torch_take_device_errors(device, buf, len(buf))
        return status, buf.value.decode(errors="replace")


def _registered() -> str | None:
    """How torch.ops.mlagen is registered in this process already (another copy of the binding, or
    this one imported again), else None."""
    return getattr(torch.ops.mlagen, "_mlagen_registration", None)


def _load_native() -> str | None:
    """Loads the C++ operators; None when they serve, else why not."""
    path = native_path()
    if not path:
        return "MLAGEN_TORCH_LIBRARY is empty (the C++ operators are off)"
    if not os.path.exists(path):
        return f"no C++ operators at {path} (built beside the library where torch is importable: make build)"
    try:
        built = built_with(path)
    except OSError as e:
        return f"cannot read {path}: {e}"
    if built != torch.__version__:
        return f"{path} was built against torch {built}, this is torch {torch.__version__} (rebuild it: make build)"
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as e:
        return f"{path} does not load: {e}"
    return None


def _register_python():
    """The same schema from Python: custom ops over mlagen.decode (its ctypes path), fake kernels."""

    def _call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale, q_len,
              page_table, kv_lens, page_size, kv_indices, kv_last_page_len, return_lse):
        from . import decode
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
                   kv_lens: Optional[torch.Tensor] = None, page_size: int = 0,
                   kv_indices: Optional[torch.Tensor] = None,
                   kv_last_page_len: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale, q_len,
                     page_table, kv_lens, page_size, kv_indices, kv_last_page_len, False)

    @torch.library.custom_op("mlagen::decode_lse", mutates_args=(), device_types="cuda")
    def _decode_lse_op(q: torch.Tensor, kv: torch.Tensor, kv_scale: Optional[torch.Tensor], qo_indptr: torch.Tensor,
                       kv_indptr: Optional[torch.Tensor], kv_format: str, q_dtype: str, kv_seq_len: int,
                       sm_scale: float, q_scale: Optional[torch.Tensor] = None, q_len: int = 0,
                       page_table: Optional[torch.Tensor] = None, kv_lens: Optional[torch.Tensor] = None,
                       page_size: int = 0, kv_indices: Optional[torch.Tensor] = None,
                       kv_last_page_len: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        return _call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale, q_len,
                     page_table, kv_lens, page_size, kv_indices, kv_last_page_len, True)

    def _check_q(q):
        torch._check(q.dim() == 3 and q.shape[1] in _facts.NUM_HEADS,
                     lambda: f"q: shape {tuple(q.shape)}: expected (total_q, num_heads {_facts.HEADS_TEXT}, "
                             f"{_facts.QK_DIM})")

    @_decode_op.register_fake
    def _decode_fake(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale, q_scale=None,
                     q_len=0, page_table=None, kv_lens=None, page_size=0, kv_indices=None, kv_last_page_len=None):
        _check_q(q)
        return q.new_empty((q.shape[0], q.shape[1], _facts.V_DIM), dtype=torch.bfloat16)

    @_decode_lse_op.register_fake
    def _decode_lse_fake(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len, sm_scale,
                         q_scale=None, q_len=0, page_table=None, kv_lens=None, page_size=0, kv_indices=None,
                         kv_last_page_len=None):
        _check_q(q)
        return (q.new_empty((q.shape[0], q.shape[1], _facts.V_DIM), dtype=torch.bfloat16),
                q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))


def _register():
    global REGISTRATION, NATIVE_PATH
    package = sys.modules[__name__.rpartition(".")[0]]
    done = _registered()
    if done is None:
        why = _load_native()
        if why is None:
            torch.ops.mlagen._mlagen_registration = done = "native"
            torch.ops.mlagen._mlagen_native_path = native_path()
        else:
            # not built is the default (CMake MLAGEN_TORCH_OP=OFF): quiet; anything else is said once
            if os.environ.get("MLAGEN_TORCH_LIBRARY") is not None or os.path.exists(native_path()):
                _lib.warn(f"{why}; torch.ops.mlagen.decode / decode_lse are registered from Python instead "
                          "(the same schema, a slower call)")
            _register_python()
            torch.ops.mlagen._mlagen_registration = done = "python"
    REGISTRATION = done
    if done == "native":
        NATIVE_PATH = torch.ops.mlagen._mlagen_native_path
        package._native = _Native(NATIVE_PATH)
        package._call = package._native.call


_register()
decode_op = torch.ops.mlagen.decode
decode_lse_op = torch.ops.mlagen.decode_lse
