"""ctypes mirror of runtime/include/mlagen/mlagen.h. No torch here: usable on a CPU machine."""
from __future__ import annotations

import ctypes
import os
import warnings

from . import _facts
from ._facts import ABI_VERSION, DTYPE, QK_DIM, V_DIM  # generated from codegen/facts.py (as the library's facts.inc)

OK, ERR_INVALID, ERR_UNSUPPORTED, ERR_WORKSPACE, ERR_DEVICE, ERR_INPUT_DATA = range(6)
DTYPE_NAME = {v: k for k, v in DTYPE.items()}
DEVERR_KV_INDPTR, DEVERR_QO_INDPTR, DEVERR_PAGE_TABLE = 1, 2, 4

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEFAULT_LIBRARY = os.path.join(_REPO, "build", "sm90a", "libmlagen.so")


class Problem(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_int32), ("batch", ctypes.c_int32), ("num_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32), ("q_len", ctypes.c_int32), ("qk_dim", ctypes.c_int32),
        ("v_dim", ctypes.c_int32), ("kv_len", ctypes.c_int32), ("total_q", ctypes.c_int64),
        ("total_kv", ctypes.c_int64), ("q_dtype", ctypes.c_int32), ("kv_dtype", ctypes.c_int32),
        ("sm_scale", ctypes.c_float), ("splits", ctypes.c_int32), ("force_generic", ctypes.c_int32),
        ("q", ctypes.c_void_p), ("q_stride_token", ctypes.c_int64), ("q_stride_head", ctypes.c_int64),
        ("kv", ctypes.c_void_p), ("kv_stride_token", ctypes.c_int64), ("kv_scale", ctypes.c_void_p),
        ("qo_indptr", ctypes.c_void_p), ("kv_indptr", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("out_stride_token", ctypes.c_int64), ("out_stride_head", ctypes.c_int64),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
        ("kernel_name", ctypes.c_char_p), ("kv_scale_stride", ctypes.c_int64), ("q_scale", ctypes.c_void_p),
        ("q_from_bf16", ctypes.c_int32), ("device", ctypes.c_int32),
        ("page_size", ctypes.c_int32), ("page_table_width", ctypes.c_int32),
        ("page_table_stride", ctypes.c_int64), ("page_table_len", ctypes.c_int64),
        ("page_table", ctypes.c_void_p), ("kv_lens", ctypes.c_void_p), ("page_indptr", ctypes.c_void_p),
        ("last_page_len", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("lse_stride_token", ctypes.c_int64),
    ]

    @classmethod
    def make(cls, batch, kv_len, *, total_kv=None, num_heads=16, q_len=1, qk_dim=QK_DIM, v_dim=V_DIM,
             q_dtype="bf16", kv_dtype="fp8e4m3fn", sm_scale=QK_DIM ** -0.5, **fields):
        """A problem with contiguous default strides and placeholder (non-null, aligned)
        pointers, for selection and validation on a machine without a GPU."""
        total_kv = batch * kv_len if total_kv is None else total_kv
        p = cls(abi_version=ABI_VERSION, batch=batch, num_heads=num_heads, num_kv_heads=1, q_len=q_len,
                qk_dim=qk_dim, v_dim=v_dim, kv_len=kv_len, total_q=batch * q_len, total_kv=total_kv,
                q_dtype=DTYPE.get(q_dtype, q_dtype), kv_dtype=DTYPE.get(kv_dtype, kv_dtype), sm_scale=sm_scale,
                q=0x1000, q_stride_token=num_heads * qk_dim, q_stride_head=qk_dim,
                kv=0x2000, kv_stride_token=qk_dim, kv_scale=0x3000, qo_indptr=0x4000, kv_indptr=0x5000,
                out=0x6000, out_stride_token=num_heads * v_dim, out_stride_head=v_dim,
                kv_scale_stride=18, q_scale=0x7000, device=-1)
        fmt = next((f for f in _facts.KV_FORMATS.values() if f["code"] == p.kv_dtype), None)
        if fmt is not None:  # a row of qk_dim, in the format's stride unit (an unknown code: the library refuses it)
            p.kv_stride_token = qk_dim * fmt["row_bytes"] // (fmt["stride_unit"] * QK_DIM)
            if fmt["scale"] == 2:
                p.kv_scale_stride = qk_dim // fmt["scale_block"]
        for k, v in fields.items():
            setattr(p, k, v)
        if "total_q" not in fields:
            p.total_q = p.batch * p.q_len
        return p


class KernelInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("generic", ctypes.c_int32), ("splits", ctypes.c_int32),
                ("block_n", ctypes.c_int32), ("stages", ctypes.c_int32), ("batch", ctypes.c_int32),
                ("kv_len", ctypes.c_int32), ("q_dtype", ctypes.c_int32), ("kv_dtype", ctypes.c_int32),
                ("page_size", ctypes.c_int32), ("role", ctypes.c_int32), ("num_heads", ctypes.c_int32),
                ("q_len", ctypes.c_int32)]

    def as_dict(self) -> dict:
        return {"name": self.name.decode(), "generic": bool(self.generic), "splits": self.splits,
                "block_n": self.block_n, "stages": self.stages, "batch": self.batch, "kv_len": self.kv_len,
                "q_dtype": DTYPE_NAME.get(self.q_dtype), "kv_dtype": DTYPE_NAME.get(self.kv_dtype),
                "page_size": self.page_size, "num_heads": self.num_heads, "q_len": self.q_len,
                "role": ("specialized", "generic", "candidate", "generic_rows")[self.role]}


class Args(ctypes.Structure):
    """mlagen_args: one call's pointers (mlagen_run)."""
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "q_scale", "kv", "kv_scale", "qo_indptr", "kv_indptr",
                                               "page_table", "kv_lens", "page_indptr", "last_page_len", "out",
                                               "lse", "workspace")]


class MlagenError(RuntimeError):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


class MlagenWarning(UserWarning):
    pass


def warn(message: str) -> None:
    """One warning line on stderr (filterable as MlagenWarning)."""
    warnings.warn_explicit(message, MlagenWarning, "mlagen", 0)


_lib = None


PACKAGED_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libmlagen.so")  # pip install .


def library_path() -> str:
    """MLAGEN_LIBRARY, else the library installed inside the package (pip install .), else the
    checkout's build/sm90a/libmlagen.so."""
    env = os.environ.get("MLAGEN_LIBRARY")
    if env:
        return env
    return PACKAGED_LIBRARY if os.path.exists(PACKAGED_LIBRARY) else DEFAULT_LIBRARY


def lib(path: str | None = None):
    """The loaded library (once). Loading touches no GPU."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    path = path or library_path()
    if not os.path.exists(path):
        raise MlagenError(ERR_DEVICE, f"mlagen library not found at {path}: build it with `make` "
                                      f"or point MLAGEN_LIBRARY at it")
    L = ctypes.CDLL(path)
    P, I = ctypes.POINTER(Problem), ctypes.POINTER(KernelInfo)
    vp = ctypes.c_void_p
    sig = {
        "mlagen_select": (ctypes.c_int, [P, I]),
        "mlagen_workspace_bytes": (ctypes.c_size_t, [P]),
        "mlagen_decode": (ctypes.c_int, [P, I, vp]),
        "mlagen_plan": (ctypes.c_int, [P, ctypes.POINTER(vp)]),
        "mlagen_plan_info": (ctypes.c_int, [vp, I, ctypes.POINTER(ctypes.c_size_t)]),
        "mlagen_run": (ctypes.c_int, [vp, ctypes.POINTER(Args), vp]),
        "mlagen_plan_destroy": (None, [vp]),
        "mlagen_take_device_errors": (ctypes.c_int, [vp, vp, ctypes.POINTER(ctypes.c_uint32)]),
        "mlagen_last_error": (ctypes.c_char_p, []),
        "mlagen_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "mlagen_num_kernels": (ctypes.c_int32, []),
        "mlagen_kernel_at": (ctypes.c_int, [ctypes.c_int32, I]),
        "mlagen_fingerprint": (ctypes.c_char_p, []),
        "mlagen_build_archs": (ctypes.c_char_p, []),
        "mlagen_check_device": (ctypes.c_int, []),
        "mlagen_load_kernels": (ctypes.c_int, [ctypes.c_int32]),
        "mlagen_gpu_runtime": (ctypes.c_char_p, []),
        "mlagen_set_split_merge": (ctypes.c_int, [ctypes.c_int32]),
        "mlagen_get_split_merge": (ctypes.c_int32, []),
        "mlagen_num_code_objects": (ctypes.c_int32, []),
        "mlagen_num_entry_points": (ctypes.c_int32, []),
    }
    for name, (res, args) in sig.items():
        f = getattr(L, name)
        f.restype, f.argtypes = res, args
    if path == library_path():
        _lib = L
    return L


def raise_for(status: int, L=None) -> None:
    if status != OK:
        L = L or lib()
        raise MlagenError(status, f"{L.mlagen_status_name(status).decode()}: {L.mlagen_last_error().decode()}")


def select(problem: Problem) -> dict:
    """Which kernel a problem goes to (no GPU needed)."""
    L = lib()
    info = KernelInfo()
    raise_for(L.mlagen_select(ctypes.byref(problem), ctypes.byref(info)), L)
    return info.as_dict()


def kernels() -> list[dict]:
    L = lib()
    out = []
    for i in range(L.mlagen_num_kernels()):
        info = KernelInfo()
        raise_for(L.mlagen_kernel_at(i, ctypes.byref(info)), L)
        out.append(info.as_dict())
    return out


def fingerprint() -> str:
    return lib().mlagen_fingerprint().decode()
