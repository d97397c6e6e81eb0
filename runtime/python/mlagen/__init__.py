"""mlagen: MLA decode attention from generated kernels. Thin torch binding over the C ABI.

    import mlagen
    out = mlagen.decode(q, kv_data, qo_indptr, kv_indptr, config)   # the leaderboard tuple
    out = torch.ops.mlagen.decode(q, kv, kv_scale, qo_indptr, kv_indptr, "fp8", "bf16", kv_len, sm_scale)

`import mlagen` registers the torch operators when torch is installed (mlagen.ops says how); the
library and its C ABI need no torch, and the library itself is loaded at the first call. The first
call for a layout maps the tensors onto the library's problem and makes its plan (the library
validates it: one validation, in C); later calls with the same metadata pass pointers only.
Where the torch operators are the C++ ones (libmlagen_torch.so), decode() is a thin wrapper over
them: the plan cache, the output allocation and the launch are C++; otherwise (and for the
options out / force_generic / splits / kernel, and prepare() / Plan.run) the same happens here
through ctypes. Nothing is allocated per call but the outputs (a plan's scratch is its own, one
buffer per launch target, made once), and nothing synchronizes with the host. Where the launches
go is `_launch.handle`'s answer (see that module). Device-side input checks (indptr contents)
are read with `check_device_errors()`, which synchronizes.
"""
from __future__ import annotations

import ctypes
import operator
import threading

from . import _facts, _launch, _lib
from ._facts import MAX_Q_LEN, NUM_HEADS, QK_DIM, V_DIM
from ._lib import (DTYPE, KernelInfo, MlagenError, Problem, fingerprint, kernels, lib,  # noqa: F401
                   library_path, raise_for, select)

__all__ = ["decode", "leaderboard_entry", "prepare", "resolve_format", "KV_FORMATS", "FASTEST_ORDER", "check_device_errors", "kernels", "select", "fingerprint", "MlagenError",
           "Problem", "library_path", "last_kernel", "NUM_HEADS", "MAX_Q_LEN", "set_split_merge", "split_merge"]

# The leaderboard config's fields with the one value the kernels implement (any other value is
# an error naming the field; batch_size, kv_seq_len, sm_scale, num_heads and q_seq_len are read).
_CONFIG_FIXED = {"num_kv_heads": _facts.NUM_KV_HEADS, "qk_head_dim": QK_DIM, "kv_lora_rank": V_DIM,
                 "qk_rope_head_dim": QK_DIM - V_DIM, "v_head_dim": V_DIM}


_torch_mod = None


def _torch():
    global _torch_mod
    if _torch_mod is None:
        import torch
        _torch_mod = torch
    return _torch_mod


# The KV formats decode() takes, and the order "fastest" tries them in per arch. sm90a:
# measured on the H200 (bench/results/latest.json at e34e110: geomean over the eight
# shapes fp8 42.1 us, mxfp4 51.1 us, bf16 61.6 us; the same order in every run since). bf16 stays ahead of mxfp4 although
# slower: every format passes the leaderboard check on its shapes with 0% outside
# (tests/gpu/test_formats.py), but mxfp4's margin is thin for very short sequences (a single
# KV token: 4.9% outside against the 5% limit, ../shared/anchors.md). AMD: the H200's order
# until measured on an MI300X / MI355X (both AMD kernels dequantize mxfp4 in LDS).
KV_FORMATS = _facts.KV_BINDINGS  # ("fp8", "bf16", "mxfp4"): codegen/facts.py KV_FORMATS' names
FASTEST_ORDER = {"sm90a": ("fp8", "bf16", "mxfp4"), "gfx950": ("fp8", "bf16", "mxfp4"),
                 "gfx942": ("fp8", "bf16", "mxfp4")}
# the formats whose kv_data entry may be the bare tensor (no scale)
_UNSCALED = frozenset(f["binding"] for f in _facts.KV_FORMATS.values() if f["scale"] == 0)


def _fp8_names():
    torch = _torch()
    names = {torch.float8_e4m3fn: "fp8e4m3fn"}
    if hasattr(torch, "float8_e4m3fnuz"):
        names[torch.float8_e4m3fnuz] = "fp8e4m3fnuz"
    return names


def _kv_dtype_name(kv_format: str, kv, kv_scale) -> str:
    """The C dtype of a KV entry (codegen/facts.py KV_FORMATS: the format of that name whose data
    dtype kv has), checking its scale tensor by the format's scale kind."""
    torch = _torch()
    if kv_format not in KV_FORMATS:
        raise MlagenError(1, f"kv_format={kv_format!r}: expected one of {KV_FORMATS} or 'fastest'")
    name, want = None, []
    for n, f in _facts.KV_FORMATS.items():
        if f["binding"] != kv_format:
            continue
        for t in f["torch_dtypes"]:
            want.append(f"torch.{t}")
            if getattr(torch, t, None) == kv.dtype:
                name = n
    if name is None:
        raise MlagenError(1, f"kv: dtype {kv.dtype}: expected {' or '.join(want)} for kv_format={kv_format!r}")
    f = _facts.KV_FORMATS[name]
    if f["scale"] == 1 and (kv_scale is None or kv_scale.dtype != torch.float32 or kv_scale.numel() != 1):
        raise MlagenError(1, f"kv_scale: {None if kv_scale is None else (kv_scale.dtype, kv_scale.numel())}: "
                             f"expected one float32 (the per-tensor {kv_format} scale)")
    if f["scale"] == 2:  # E8M0 rows
        scale_types = tuple(getattr(torch, t) for t in _facts.SCALE_ROW_DTYPES if hasattr(torch, t))
        if kv_scale is None or kv_scale.dtype not in scale_types or kv_scale.dim() != 2 or kv_scale.stride(1) != 1:
            raise MlagenError(1, f"kv_scale: expected the E8M0 scale rows, uint8 (total_kv, >= "
                                 f"{QK_DIM // f['scale_block']}) with contiguous blocks; got "
                                 f"{None if kv_scale is None else (kv_scale.dtype, tuple(kv_scale.shape))}")
    return name


class Plan:
    """A validated problem for one shape / layout: the library's plan (mlagen_plan: kernel
    chosen, workspace sized) and its scratch, one buffer per launch target (the raw handle the
    launches go on), made when first used there and kept for the plan's life: two concurrent
    callers never share scratch, and a decode captured in a CUDA graph keeps valid buffers for
    as long as the process (and so the plan cache) lives. Each run passes that call's pointers
    only (mlagen_run)."""

    def __init__(self, problem: Problem, device, return_lse: bool = False):
        self.problem, self.device = problem, device
        self.device_index = device.index if device.index is not None else _torch().cuda.current_device()
        self.problem.device = self.device_index
        self.out_shape = (problem.total_q, problem.num_heads, V_DIM)
        self.lse_shape = (problem.total_q, problem.num_heads) if return_lse else None
        self.out_dtype = _torch().bfloat16
        # a stand-in of the output's shape and dtype on its device (one element of memory): outputs are
        # made as empty_like(it), torch's cheapest allocation call
        self.out_like = _torch().empty((1, 1, 1), dtype=self.out_dtype, device=device).expand(self.out_shape)
        self.bound: dict = {}  # launch handle -> its workspace tensor
        self.config = None  # the config it validated (a copy; decode sets it)
        self._handle = None
        self._tls = threading.local()  # per thread: launch handle -> (mlagen_args, its byref)
        self.rebuild()

    def rebuild(self):
        """(Re)makes the library plan from self.problem (after a test changed a field)."""
        L = lib()
        handle = ctypes.c_void_p()
        raise_for(L.mlagen_plan(ctypes.byref(self.problem), ctypes.byref(handle)), L)
        if self._handle:
            L.mlagen_plan_destroy(self._handle)
        self._handle = handle
        info, nbytes = KernelInfo(), ctypes.c_size_t(0)
        raise_for(L.mlagen_plan_info(handle, ctypes.byref(info), ctypes.byref(nbytes)), L)
        self.info = info.as_dict()
        self.workspace_bytes = max(int(nbytes.value), 1024)
        self.bound.clear()
        self._tls = threading.local()
        self._run, self._destroy = L.mlagen_run, L.mlagen_plan_destroy

    def __del__(self):
        if getattr(self, "_handle", None) and self._destroy is not None:
            self._destroy(self._handle)
            self._handle = None

    def workspace(self, where):
        """This plan's scratch for launches on `where` (made on first use)."""
        ws = self.bound.get(where)
        if ws is None:
            ws = self.bound[where] = _torch().zeros(self.workspace_bytes, dtype=_torch().uint8, device=self.device)
        return ws

    def _args(self, where):
        """This thread's mlagen_args for launches on `where` (its workspace set once): every
        pointer field is set by each run, so threads never share one, and a call builds no
        ctypes object (the host cost of a call is the leaderboard's small shapes' latency)."""
        a = _Args()
        a.workspace = self.workspace(where).data_ptr()
        got = (a, ctypes.byref(a))
        try:
            self._tls.args[where] = got
        except AttributeError:
            self._tls.args = {where: got}
        return got

    def run(self, q, q_scale, kv, kv_scale, qo_indptr, kv_indptr, out, where, lse=None, pages=None) -> None:
        try:
            a, ref = self._tls.args[where]
        except (AttributeError, KeyError):
            a, ref = self._args(where)
        a.q = q.data_ptr()
        a.q_scale = q_scale.data_ptr() if q_scale is not None else None
        a.kv = kv.data_ptr()
        a.kv_scale = kv_scale.data_ptr() if kv_scale is not None else None
        a.qo_indptr = qo_indptr.data_ptr()
        a.kv_indptr = kv_indptr.data_ptr() if kv_indptr is not None else None
        a.out = out.data_ptr()
        if pages is not None or a.page_table is not None:
            pt, kl, pi, lp = pages if pages is not None else (None, None, None, None)
            a.page_table = pt.data_ptr() if pt is not None else None
            a.kv_lens = kl.data_ptr() if kl is not None else None
            a.page_indptr = pi.data_ptr() if pi is not None else None
            a.last_page_len = lp.data_ptr() if lp is not None else None
        if lse is not None or a.lse is not None:
            a.lse = lse.data_ptr() if lse is not None else None
        status = self._run(self._handle, ref, where)
        if status:
            raise_for(status)

    def __call__(self, q, q_scale, kv, kv_scale, qo_indptr, kv_indptr):
        """One call of the common case (contiguous rows, no LSE): a new output, one C call."""
        out = _torch_mod.empty_like(self.out_like)
        self.run(q, q_scale, kv, kv_scale, qo_indptr, kv_indptr, out, _launch.handle(self.device_index))
        return out


_Args = _lib.Args
_plans: dict = {}  # everything a plan validated (tensor metadata, format, options, config) -> Plan
_last_plan = None  # the plan of the last decode() run through ctypes here
_native = None  # the C++ operators (ops.py sets it where libmlagen_torch.so is loaded), else None
_call = None  # their entry for the leaderboard's call, config included (_Native.call), else None


SPLIT_MERGE = {"combine": 0, "in_launch": 1}  # mlagen.h mlagen_split_merge


def set_split_merge(mode: str) -> None:
    """How split decodes merge their partials, for the whole process (every path: decode(), the
    operators, plans). "combine" (the default): a combine kernel after the decode, the least device
    time. "in_launch": one launch a call where the kernel can (sm90a, 16 query rows a block) and
    its grid is resident at once: about one launch's host time less a call, 1-2 us more device time
    on split shapes on the H200 (docs/perf.md): for an engine whose decode calls are host-bound."""
    if mode not in SPLIT_MERGE:
        raise MlagenError(1, f"split merge mode={mode!r}: expected one of {', '.join(map(repr, SPLIT_MERGE))}")
    raise_for(lib().mlagen_set_split_merge(SPLIT_MERGE[mode]))


def split_merge() -> str:
    """The process's split-merge mode (set_split_merge)."""
    code = lib().mlagen_get_split_merge()
    return next(k for k, v in SPLIT_MERGE.items() if v == code)


def last_kernel() -> dict | None:
    """The kernel the most recent decode() ran (name, generic, splits, ...): through the C++
    operators (torch.ops.mlagen.* or decode()'s common path) or through ctypes here."""
    if _native is not None:
        info = _native.last_kernel()
        if info is not None:
            return info
    return _last_plan.info if _last_plan is not None else None


_arch = None


def _build_arch() -> str:
    global _arch
    if _arch is None:
        _arch = lib().mlagen_build_archs().decode()
    return _arch


def _fastest_order() -> tuple:
    """This build's arch's measured order, then any format it has not ranked (a new one) last."""
    order = FASTEST_ORDER.get(_build_arch(), ())
    return tuple(order) + tuple(f for f in KV_FORMATS if f not in order)


def resolve_format(kv_data, kv_format: str) -> str:
    """kv_format, with "fastest" made concrete: the first of this build's FASTEST_ORDER
    that kv_data holds."""
    if kv_format != "fastest":
        return kv_format
    if not isinstance(kv_data, dict):
        raise MlagenError(1, "kv_format='fastest': expected kv_data as the leaderboard's dict of formats")
    for f in _fastest_order():
        if f in kv_data:
            return f
    raise MlagenError(1, f"kv_data: none of {KV_FORMATS} present (has {sorted(kv_data)})")


def _unpack_kv(kv_data, kv_format: str):
    """(kv tensor, its scale tensor or None) of one format. kv_data is the leaderboard's dict
    ({"bf16": tensor, "fp8": (tensor, scale), "mxfp4": (data, scales)}) or one entry."""
    if isinstance(kv_data, dict):
        if kv_format not in kv_data:
            raise MlagenError(1, f"kv_data: no {kv_format!r} entry (has {sorted(kv_data)}); "
                                 f"expected kv_data['{kv_format}']")
        kv_data = kv_data[kv_format]
    if kv_format in _UNSCALED and not isinstance(kv_data, (tuple, list)):
        return kv_data, None
    if not (isinstance(kv_data, (tuple, list)) and len(kv_data) == 2):
        raise MlagenError(1, f"kv_data[{kv_format!r}]: expected (kv tensor, scale tensor)"
                             + (f" or the {kv_format} tensor" if kv_format in _UNSCALED else ""))
    return kv_data[0], kv_data[1]


def _check_q(q, q_dtype: str, q_scale):
    """fp8 q: an fp8 tensor with q_scale, or a bf16 tensor the library quantizes on the
    device per tensor, as the leaderboard's reference does it (no q_scale then)."""
    torch = _torch()
    if q_dtype == "bf16":
        if q.dtype != torch.bfloat16:
            raise MlagenError(1, f"q: dtype {q.dtype}: expected torch.bfloat16 for q_dtype='bf16'")
        return
    if q_dtype != "fp8":
        raise MlagenError(1, f"q_dtype={q_dtype!r}: expected 'bf16' or 'fp8'")
    if q.dtype == torch.bfloat16:
        if q_scale is not None:
            raise MlagenError(1, "q_scale: given with a bf16 q; pass an fp8 q with its scale, or neither")
        return
    if q.dtype not in _fp8_names():
        raise MlagenError(1, f"q: dtype {q.dtype}: expected bf16 (quantized here) or fp8 for q_dtype='fp8'")
    if q_scale is None or q_scale.dtype != torch.float32 or q_scale.numel() != 1 or q_scale.device != q.device:
        raise MlagenError(1, "q_scale: expected one float32 on q's device (fp8 q: dequant = q * q_scale)")


def _as_int(v):
    """An integer config value (int, numpy / torch integer scalars), else None."""
    try:
        return operator.index(v)
    except TypeError:
        return None


# ---- the leaderboard config -------------------------------------------------------------------
# What decode() reads from a config: (batch_size | None, num_heads | None, kv_len (0: lengths
# differ), sm_scale, q_seq_len | None), read once per distinct config (its items are the key). The
# values' ranges are the library's to check (its message then names the config's key too).
_configs: dict = {}
_last_config = (None, None)  # (a copy of the last config read, its fields): equal content skips the lookup
_CONFIG_SOURCES = {"batch": "batch_size", "kv_len": "kv_seq_len", "sm_scale": "sm_scale", "q_len": "q_seq_len"}


def _config_fields(config) -> tuple:
    if not isinstance(config, dict):
        raise MlagenError(1, f"config: {type(config).__name__}: expected the leaderboard's dict")
    for field, want in _CONFIG_FIXED.items():
        if field in config and config[field] != want:
            raise MlagenError(1, f"config['{field}']={config[field]!r}: expected {want} (the only value the "
                                 f"kernels implement)")

    def integer(field):
        v = config.get(field)
        if v is None:
            return None
        n = _as_int(v)
        if n is None:
            raise MlagenError(1, f"config['{field}']={v!r}: expected an int")
        return n

    try:
        sm_scale = float(config.get("sm_scale", QK_DIM ** -0.5))
    except (TypeError, ValueError):
        raise MlagenError(1, f"config['sm_scale']={config.get('sm_scale')!r}: expected a number") from None
    fields = (integer("batch_size"), integer("num_heads"), integer("kv_seq_len") or 0, sm_scale, integer("q_seq_len"))
    try:
        if len(_configs) < 4096:
            _configs[tuple(config.items())] = fields
    except TypeError:  # an unhashable value: read again each call
        pass
    return fields


def _naming_config(e: MlagenError, sources: dict) -> MlagenError:
    """The library's error, with the config key its field's value came from."""
    text = str(e)
    field = text.split(": ", 1)[-1].split("=", 1)[0]
    if field in sources:
        return MlagenError(e.status, f"{text} (from config['{sources[field]}'])")
    return e


_STATUS = {name: code for code, name in enumerate(("MLAGEN_OK", "MLAGEN_ERR_INVALID", "MLAGEN_ERR_UNSUPPORTED",
                                                   "MLAGEN_ERR_WORKSPACE", "MLAGEN_ERR_DEVICE",
                                                   "MLAGEN_ERR_INPUT_DATA"))}


def _native_call(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype, q_scale, q_len, paged, return_lse):
    """decode() through the C++ operators: the kv entry and the config here, the rest in C++ (the
    plan cache keyed on the tensors' metadata, the output, the launch). None when an argument is
    not what the operator takes (decode() then goes the ctypes way, which names it)."""
    global _last_config
    try:
        if kv_format == "fastest":
            kv_format = resolve_format(kv_data, kv_format)
        entry = kv_data[kv_format] if isinstance(kv_data, dict) else kv_data
        if entry.__class__ is tuple and len(entry) == 2:
            kv, kv_scale = entry
        else:
            kv, kv_scale = _unpack_kv(kv_data, kv_format)
        last = _last_config
        if config == last[0]:
            fields = last[1]
        else:
            try:
                fields = _configs[tuple(config.items())]
            except KeyError:
                fields = _config_fields(config)
            _last_config = (dict(config), fields)
            if _native.remember_config is not None:  # the C++ entry reads an equal config through these
                _native.remember_config(_last_config[0], *fields)
        batch, heads, kv_len, sm_scale, config_q_len = fields
        if batch is not None and qo_indptr.numel() != batch + 1:
            raise MlagenError(1, f"qo_indptr: shape {tuple(qo_indptr.shape)}: expected ({batch + 1},) "
                                 "(config['batch_size']+1)")
        if heads is not None and q.shape[1] != heads and q.dim() == 3:  # (any other q: the operator names it)
            raise MlagenError(1, f"config['num_heads']={heads}: expected {q.shape[1]} (q's heads)")
        n = q_len if q_len is not None else config_q_len
        if paged is None:
            args = (q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_len, sm_scale, q_scale, n or 0,
                    None, None, 0, None, None)
        else:
            page_table, kv_lens, page_size, kv_indices, kv_last_page_len = paged
            args = (q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_len, sm_scale, q_scale, n or 0,
                    page_table, kv_lens, operator.index(page_size), kv_indices, kv_last_page_len)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError):
        return None
    try:
        fast = _native.fast
        if fast is not None:
            res = fast(*args, return_lse)
            if res is not NotImplemented:
                return res
        return (_native.decode_lse if return_lse else _native.decode)(*args)
    except RuntimeError as e:
        text = str(e)
        status = _STATUS.get(text.split(":", 1)[0])
        if status is None:
            return None  # not the operator's own error (an argument of the wrong type): the ctypes way names it
        sources = {f: k for f, k in _CONFIG_SOURCES.items() if k in config and not (f == "q_len" and q_len is not None)}
        raise _naming_config(MlagenError(status, text), sources) from None


def prepare(q, kv, kv_scale, qo_indptr, kv_indptr, config: dict, *, kv_format: str = "fp8", q_dtype: str = "bf16",
            q_scale=None, force_generic=False, splits=0, kernel=None, page_size: int = 0, page_table=None,
            kv_lens=None, kv_indices=None, kv_last_page_len=None, return_lse: bool = False, q_len=None) -> Plan:
    """A Plan for these inputs (see decode() for the arguments). What only the binding can see is
    checked here (dtypes against the formats, devices, the tensors' shapes); every value the
    problem holds is the library's to validate (mlagen_plan), its message naming the field."""
    torch = _torch()
    dev = q.device
    if dev.type != "cuda":
        raise MlagenError(1, f"q: on {dev}, expected a CUDA tensor")
    for name, t in (("kv", kv), ("kv_scale", kv_scale), ("q_scale", q_scale), ("qo_indptr", qo_indptr),
                    ("kv_indptr", kv_indptr), ("page_table", page_table), ("kv_lens", kv_lens),
                    ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len)):
        if t is not None and t.device != dev:
            raise MlagenError(1, f"{name}: on {t.device}, expected {dev} (the device of q)")
    _check_q(q, q_dtype, q_scale)
    q_from_bf16 = int(q_dtype == "fp8" and q.dtype == torch.bfloat16)
    if q.dim() != 3 or q.stride(2) != 1:
        raise MlagenError(1, f"q: shape {tuple(q.shape)} strides {q.stride()}: expected (total_q, num_heads, {QK_DIM}) "
                             f"with contiguous dims")
    kv_dtype = _kv_dtype_name(kv_format, kv, kv_scale)
    page_size = _as_int(page_size)
    if page_size is None:
        raise MlagenError(1, "page_size: expected an int (0: contiguous rows, else the cache's page size)")
    paged = page_size != 0
    if not paged and any(t is not None for t in (page_table, kv_lens, kv_indices, kv_last_page_len)):
        raise MlagenError(1, "page_table / kv_lens / kv_indices / kv_last_page_len: given without page_size; "
                             "expected page_size = the cache's page size")
    if paged and (page_table is None) == (kv_indices is None):
        raise MlagenError(1, "page_table / kv_indices: expected exactly one (a block table, or FlashInfer's "
                             "kv_indices with kv_indptr in pages and kv_last_page_len)")
    fmt = _facts.KV_FORMATS[kv_dtype]
    row = fmt["row_bytes"] // fmt["stride_unit"]  # in kv's elements
    kv_rows, kv_stride = _kv_rows(kv, row, kv_format, max(page_size, 0))
    scale_stride = 0
    if fmt["scale"] == 2:
        blocks = QK_DIM // fmt["scale_block"]
        if kv_scale.shape[0] < kv_rows or kv_scale.shape[1] < blocks:
            raise MlagenError(1, f"kv_scale: shape {tuple(kv_scale.shape)}: expected at least ({kv_rows}, {blocks}) "
                                 f"(one E8M0 scale per {fmt['scale_block']} dims of every token)")
        scale_stride = kv_scale.stride(0)
    config_batch, config_heads, kv_len, sm_scale, config_q_len = _config_fields(config)
    batch = config_batch if config_batch is not None else qo_indptr.numel() - 1
    _check_int32("qo_indptr", qo_indptr, batch + 1, what="batch_size+1")
    sources = {f: k for f, k in _CONFIG_SOURCES.items() if k in config}
    if q_len is not None:
        sources.pop("q_len", None)
    else:
        q_len = config_q_len
        if q_len is None:  # every sequence has total_q / batch tokens (a batch below 1 is the library's to refuse)
            if batch >= 1 and q.shape[0] % batch:
                raise MlagenError(1, f"q_len: None with total_q={q.shape[0]} not a multiple of batch_size={batch}: "
                                     f"expected q_len = the most query tokens a sequence (1..{MAX_Q_LEN})")
            q_len = q.shape[0] // batch if batch >= 1 else 1
    if kv_indptr is not None:
        _check_int32("kv_indptr", kv_indptr, batch + 1, what="batch_size+1")
    elif not (paged and kv_lens is not None):
        raise MlagenError(1, "kv_indptr: None: expected int32 (batch+1,) (or, with a block table, kv_lens)")
    if kv_len > 0 and not paged and kv_rows != batch * kv_len:
        kv_len = 0  # lengths are not uniform: the generic kernel reads them from kv_indptr
    heads = q.shape[1]
    fields = {}
    if paged:
        fields.update(page_size=page_size)
        if page_table is not None:
            _check_int32("page_table", page_table, dims=2)
            if page_table.shape[0] < batch:
                raise MlagenError(1, f"page_table: shape {tuple(page_table.shape)}: expected (batch={batch}, max_pages)")
            if kv_last_page_len is not None:
                raise MlagenError(1, "kv_last_page_len: given with page_table; it belongs to the kv_indices form")
            if kv_lens is not None:
                _check_int32("kv_lens", kv_lens, batch, what="batch_size")
            fields.update(page_table=page_table.data_ptr(), page_table_width=page_table.shape[1],
                          page_table_stride=page_table.stride(0) if page_table.shape[0] > 1 else page_table.shape[1],
                          page_table_len=(batch - 1) * (page_table.stride(0) if batch > 1 else 0) + page_table.shape[1],
                          kv_lens=kv_lens.data_ptr() if kv_lens is not None else None)
        else:
            _check_int32("kv_indices", kv_indices)
            if kv_indptr is None:
                raise MlagenError(1, "kv_indptr: None: with kv_indices it holds each sequence's page offsets (batch+1,)")
            if kv_last_page_len is None:
                raise MlagenError(1, "kv_last_page_len: None: expected int32 (batch,) with kv_indices")
            _check_int32("kv_last_page_len", kv_last_page_len, batch, what="batch_size")
            if kv_lens is not None:
                raise MlagenError(1, "kv_lens: given with kv_indices; expected None (lengths come from the pages)")
            fields.update(page_table=kv_indices.data_ptr(), page_table_len=max(1, kv_indices.numel()),
                          page_indptr=kv_indptr.data_ptr(), last_page_len=kv_last_page_len.data_ptr())
            kv_indptr = None  # the token indptr of the contiguous form: not this one
    if return_lse:
        fields.update(lse=0x100, lse_stride_token=heads)  # presence only: each call passes its own
    p = Problem(abi_version=_facts.ABI_VERSION, batch=batch, num_heads=heads, num_kv_heads=_facts.NUM_KV_HEADS,
                q_len=q_len, qk_dim=q.shape[2], v_dim=V_DIM, kv_len=kv_len, total_q=q.shape[0], total_kv=kv_rows,
                q_dtype=DTYPE[q_dtype], kv_dtype=DTYPE[kv_dtype], sm_scale=sm_scale,
                splits=splits, force_generic=int(bool(force_generic)),
                q=q.data_ptr(), q_stride_token=q.stride(0), q_stride_head=q.stride(1),
                kv=kv.data_ptr(), kv_stride_token=kv_stride,
                kv_scale=kv_scale.data_ptr() if kv_scale is not None else None,
                qo_indptr=qo_indptr.data_ptr(), kv_indptr=kv_indptr.data_ptr() if kv_indptr is not None else None,
                out=0x100, out_stride_token=heads * V_DIM, out_stride_head=V_DIM,
                kernel_name=kernel.encode() if kernel else None, kv_scale_stride=scale_stride,
                q_scale=q_scale.data_ptr() if q_scale is not None else None, q_from_bf16=q_from_bf16,
                device=dev.index if dev.index is not None else torch.cuda.current_device(), **fields)
    _check_device_once(dev)
    try:
        plan = Plan(p, dev, return_lse)
    except MlagenError as e:
        raise _naming_config(e, sources) from None
    if config_heads is not None and config_heads != heads:  # (after the library's check of q's heads)
        raise MlagenError(1, f"config['num_heads']={config['num_heads']!r}: expected {heads} (q's heads)")
    return plan


def _kv_rows(kv, row: int, kv_format: str, page_size: int):
    """(rows, row stride) of the KV tensor: (rows, 1, row) or (rows, row), dims contiguous; with
    pages also (num_pages, page_size, row) or (num_pages, page_size, 1, row), the rows of all
    pages at one stride."""
    shape, st = tuple(kv.shape), kv.stride()
    if kv.dim() in (2, 3, 4) and shape[-1] == row and st[-1] == 1:
        if kv.dim() == 2 or (kv.dim() == 3 and shape[1] == 1):
            return shape[0], st[0]
        if page_size and shape[1] == page_size and (kv.dim() == 3 or shape[2] == 1) and \
                (shape[0] == 1 or st[0] == page_size * st[1]):
            return shape[0] * page_size, st[1]
    want = f"(total_kv, 1, {row})" + (f" or (num_pages, page_size={page_size}, [1,] {row})" if page_size else "")
    raise MlagenError(1, f"kv: shape {shape} strides {st}: expected {want} with contiguous dims ({kv_format})")


def _check_int32(name, t, numel=None, dims=1, what=None):
    torch = _torch()
    if t.dtype != torch.int32 or t.dim() != dims or t.stride(-1) != 1 or (numel is not None and t.numel() != numel):
        want = f"({numel},)" if numel is not None else ("a 1-d tensor" if dims == 1 else "(batch, max_pages)")
        want += f" ({what})" if what else ""
        raise MlagenError(1, f"{name}: {t.dtype} shape {tuple(t.shape)} strides {t.stride()}: expected int32 {want}"
                             f" with contiguous last dim")


_checked_devices = set()


def _check_device_once(dev):
    if dev not in _checked_devices:
        torch = _torch()
        with torch.cuda.device(dev):
            raise_for(lib().mlagen_check_device())
        _checked_devices.add(dev)


def _tensor_meta(t):
    return None if t is None else (t.size(), t.stride(), t.dtype, t.get_device())


def _meta(q, kv, kv_scale, qo_indptr, kv_indptr, q_dtype, q_scale):
    """Everything a plan validated about its tensors: every one's shape, strides, dtype and
    device (with the format, the options and the config: the plan-cache key). Pointer
    alignment is checked by the library on every call."""
    return (q.size(), q.stride(), q.dtype, q.get_device(), kv.size(), kv.stride(), kv.dtype, kv.get_device(),
            _tensor_meta(kv_scale), qo_indptr.size(), qo_indptr.stride(), qo_indptr.dtype, qo_indptr.get_device(),
            _tensor_meta(kv_indptr), q_dtype, _tensor_meta(q_scale))


_NO_OPTIONS = (False, 0, None, 0, None, None, None, None, False, None)  # decode()'s defaults, as in its key


def _decode_cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype="bf16", q_scale=None):
    """The per-call path of the common case (contiguous rows, no LSE, no overrides): the C++
    operator where it is loaded; else, once a plan exists for these inputs (None otherwise), the
    plan-cache key (everything the plan validated, the config's items included), then an output
    and one C call (Plan.__call__). Positional, no keyword parsing: the leaderboard entry calls it
    directly."""
    if _native is not None:
        return _native_call(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype, q_scale, None, None, False)
    return _ctypes_cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype, q_scale)


def _ctypes_cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype="bf16", q_scale=None):
    global _last_plan
    try:
        entry = kv_data[kv_format]
        kv, kv_scale = (entry, None) if kv_format in _UNSCALED and entry.__class__ is not tuple else entry
        plan = _plans.get((_meta(q, kv, kv_scale, qo_indptr, kv_indptr, q_dtype, q_scale), kv_format, _NO_OPTIONS,
                           tuple(config.items())))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if plan is None:
        return None
    out = plan(q, q_scale, kv, kv_scale, qo_indptr, kv_indptr)
    _last_plan = plan
    return out


def leaderboard_entry(kv_format: str = "fastest", q_dtype: str = "bf16", *, native: bool | None = None):
    """custom_kernel(data) for the leaderboard tuple: the cached path first, decode() for the
    first call of a shape (which makes the plan) and for anything unusual. "fastest" takes
    the first format of FASTEST_ORDER for this build's arch that the data holds. native: the C++
    operators' per-call path (None: where they are loaded; False: ctypes, as the leaderboard bundle
    runs it)."""
    ctypes_only = _native is not None and native is not None and not native
    cached, full = (_ctypes_cached, _decode_python) if ctypes_only else (_decode_cached, decode)
    order, last = None, None  # "fastest": the arch's order, and the format the last call took

    def custom_kernel(data):
        nonlocal order, last
        q, kv_data, qo_indptr, kv_indptr, config = data
        fmt = kv_format
        if fmt == "fastest":
            if order is None:
                order = _fastest_order()
            # the same dict layout every call: one membership test, unless the first choice
            # is absent (then the order is walked again)
            if last is None or last not in kv_data or (last != order[0] and order[0] in kv_data):
                last = next((f for f in order if f in kv_data), "fp8")
            fmt = last
        if _call is not None and not ctypes_only:  # the C++ entry, config included
            out = _call(q, kv_data, qo_indptr, kv_indptr, config, fmt, q_dtype)
            if out is not NotImplemented:
                return out
        out = cached(q, kv_data, qo_indptr, kv_indptr, config, fmt, q_dtype)
        return out if out is not None else full(q, kv_data, qo_indptr, kv_indptr, config, kv_format=fmt,
                                                q_dtype=q_dtype)
    return custom_kernel


def decode(q, kv_data, qo_indptr, kv_indptr, config: dict, *, kv_format: str = "fp8", q_dtype: str = "bf16",
           q_scale=None, out=None, force_generic: bool = False, splits: int = 0, kernel: str | None = None,
           page_table=None, page_size: int = 0, kv_lens=None, kv_indices=None, kv_last_page_len=None,
           return_lse: bool = False, q_len: int | None = None):
    """MLA decode: softmax(q K^T * sm_scale) V with K the 576-dim latent rows, V their first 512.

    q (total_q, num_heads, 576) bf16 (or fp8 with q_scale), num_heads 8, 16, 32, 64 or 128;
    q_len the query tokens a sequence, 1..4 (default config['q_seq_len'], else total_q /
    batch): sequence b's tokens are q rows qo_indptr[b] .. qo_indptr[b+1] (q_len of them, or
    1..q_len when they differ: the generic kernel), causal among themselves: token i of n sees
    the sequence's first kv_len - n + 1 + i KV rows (the MTP / speculative verification mask).
    kv_data the leaderboard's dict
    {"bf16": kv (total_kv, 1, 576) bf16, "fp8": (kv float8_e4m3fn, scale (1,) f32),
     "mxfp4": (data (total_kv, 1, 288) uint8, scales (total_kv, >= 18) uint8 E8M0)}
    or one entry of it; qo_indptr / kv_indptr (batch+1,) int32; config the leaderboard's dict.
    kv_format: "fp8" | "bf16" | "mxfp4" | "fastest" (FASTEST_ORDER for this build's arch).
    q_dtype: "bf16" (as given) or "fp8": the query quantized per tensor to fp8 as the
    leaderboard's reference does (a bf16 q is quantized on the device by a pre-pass fused
    into the launch; an fp8 q needs q_scale).

    Paged KV (page_size > 0: a power of two 1..256): the kv tensor is the cache, (num_pages,
    page_size, [1,] row) or its rows flattened, and mxfp4 scales are indexed by the same rows.
      block table (vLLM / FlashMLA): page_table (batch, max_pages) int32, row b the pages of
        sequence b in order; lengths kv_lens (batch,) int32, or kv_indptr differences.
      FlashInfer: kv_indices (pages,) int32, kv_indptr (batch+1,) the page offsets of each
        sequence in it, kv_last_page_len (batch,) the rows of each last page (1..page_size).
    Pages in any order, shared between sequences. A bad page id or list makes that sequence's
    output NaN (check_device_errors() raises), never a read outside the cache.

    Returns (total_q, num_heads, 512) bf16, and with return_lse=True (out, lse): lse (total_q, num_heads)
    float32 = ln sum_j exp(sm_scale q.k_j), the natural log of the scaled scores (FlashAttention's
    and FlashMLA's softmax_lse, what vLLM's merge_attn_states takes); -inf for an empty sequence.
    force_generic / splits / kernel (a name from kernels()) override the dispatch, for tests and tuning.

    Per call this reads the inputs' metadata once (the plan cache key), allocates the outputs
    and passes the pointers to the library: everything else happened when the plan was made.
    Where the C++ operators are loaded (mlagen.ops), the common case (no out / force_generic /
    splits / kernel) is one call of torch.ops.mlagen.decode's C++ path; the launches go on
    torch's current queue of the tensors' device (the ctypes way: where `_launch.handle` points
    them), with that device made current.
    """
    if _native is not None and out is None and not force_generic and not splits and kernel is None:
        paged = None
        if page_size or page_table is not None or kv_indices is not None or kv_lens is not None or \
                kv_last_page_len is not None:
            paged = (page_table, kv_lens, page_size, kv_indices, kv_last_page_len)
        if _call is not None and q_scale is None and q_len is None and not return_lse:
            # the plain call (and the paged one), in C++
            res = _call(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype, *(paged or ()))
            if res is not NotImplemented:
                return res
        res = _native_call(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype, q_scale, q_len, paged,
                           return_lse)
        if res is not None:
            return res
    return _decode_python(q, kv_data, qo_indptr, kv_indptr, config, kv_format=kv_format, q_dtype=q_dtype,
                          q_scale=q_scale, out=out, force_generic=force_generic, splits=splits, kernel=kernel,
                          page_table=page_table, page_size=page_size, kv_lens=kv_lens, kv_indices=kv_indices,
                          kv_last_page_len=kv_last_page_len, return_lse=return_lse, q_len=q_len)


def _decode_python(q, kv_data, qo_indptr, kv_indptr, config: dict, *, kv_format: str = "fp8", q_dtype: str = "bf16",
                   q_scale=None, out=None, force_generic: bool = False, splits: int = 0, kernel: str | None = None,
                   page_table=None, page_size: int = 0, kv_lens=None, kv_indices=None, kv_last_page_len=None,
                   return_lse: bool = False, q_len: int | None = None):
    """decode() through ctypes: Python's plan cache (prepare(), Plan.run)."""
    global _last_plan
    kv_format = resolve_format(kv_data, kv_format)
    options = (force_generic, splits, kernel, page_size, _tensor_meta(page_table), _tensor_meta(kv_lens),
               _tensor_meta(kv_indices), _tensor_meta(kv_last_page_len), return_lse, q_len)
    if out is None and options == _NO_OPTIONS:
        res = _ctypes_cached(q, kv_data, qo_indptr, kv_indptr, config, kv_format, q_dtype, q_scale)
        if res is not None:
            if _native is not None:
                _native.forget_last()
            return res
    kv, kv_scale = _unpack_kv(kv_data, kv_format)
    for name, t in (("q", q), ("kv", kv), ("kv_scale", kv_scale), ("q_scale", q_scale), ("qo_indptr", qo_indptr),
                    ("kv_indptr", kv_indptr), ("page_table", page_table), ("kv_lens", kv_lens),
                    ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len)):
        if t is not None and not hasattr(t, "data_ptr"):
            raise MlagenError(1, f"{name}: {type(t).__name__}: expected a torch tensor")
    if not isinstance(config, dict):
        raise MlagenError(1, f"config: {type(config).__name__}: expected the leaderboard's dict")
    try:
        key = (_meta(q, kv, kv_scale, qo_indptr, kv_indptr, q_dtype, q_scale), kv_format, options,
               tuple(config.items()))
        plan = _plans.get(key)
    except TypeError:  # an unhashable config value: plan every call
        key, plan = None, None
    if plan is None:
        plan = prepare(q, kv, kv_scale, qo_indptr, kv_indptr, config, kv_format=kv_format, q_dtype=q_dtype,
                       q_scale=q_scale, force_generic=force_generic, splits=splits, kernel=kernel,
                       page_size=page_size, page_table=page_table, kv_lens=kv_lens, kv_indices=kv_indices,
                       kv_last_page_len=kv_last_page_len, return_lse=return_lse, q_len=q_len)
        plan.config = dict(config)
        if key is not None:
            _plans[key] = plan
    torch = _torch_mod
    if out is None:
        out = torch.empty(plan.out_shape, dtype=torch.bfloat16, device=plan.device)
    elif (out.dtype != torch.bfloat16 or out.shape != plan.out_shape or not out.is_contiguous()
          or out.device != plan.device):
        raise MlagenError(1, f"out: {out.dtype} {tuple(out.shape)} on {out.device}: expected contiguous bf16 "
                             f"{plan.out_shape} on {plan.device}")
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=plan.device) if return_lse else None
    pages = None
    if page_size:
        pages = ((page_table, kv_lens, None, None) if page_table is not None
                 else (kv_indices, None, kv_indptr, kv_last_page_len))
        if kv_indices is not None:
            kv_indptr = None  # passed as the page offsets
    plan.run(q, q_scale, kv, kv_scale, qo_indptr, kv_indptr, out, _launch.handle(plan.device_index), lse, pages)
    _last_plan = plan
    if _native is not None:
        _native.forget_last()
    return (out, lse) if return_lse else out


def check_device_errors(device=None) -> None:
    """Synchronize and raise MlagenError if a kernel flagged its inputs (e.g. an indptr
    that disagrees with the sizes; the affected outputs are NaN). Reads and clears the error
    word of every plan's scratch on the device (default: the current one), the C++ operators'
    plans included."""
    torch = _torch()
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    index = device.index if device.index is not None else torch.cuda.current_device()
    first = None
    for plan in _plans.values():  # each plan is cached under one key
        if plan.device_index != index:
            continue
        for where, ws in list(plan.bound.items()):
            errors = ctypes.c_uint32(0)
            with torch.cuda.device(index):
                status = lib().mlagen_take_device_errors(ws.data_ptr(), where, ctypes.byref(errors))
            if status and first is None:
                first = status
                message = lib().mlagen_last_error().decode()
    if _native is not None:
        status, text = _native.take_device_errors(index)
        if status and first is None:
            first, message = status, text
    if first is not None:
        raise MlagenError(first, f"{lib().mlagen_status_name(first).decode()}: {message}")


def _register_operators():
    """torch.ops.mlagen.decode / decode_lse, where torch is installed (mlagen.ops: the C++ operators,
    else the Python ones with one warning line). Never fails the import: without torch, or in the
    leaderboard bundle (which carries no operators), there is nothing to register."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    import os
    if not os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops.py")):
        return  # the leaderboard bundle: no operators carried
    try:
        from . import ops  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != __name__ + ".ops":
            _lib.warn(f"torch.ops.mlagen.* not registered: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - the import of the library's binding must not fail for its operators
        _lib.warn(f"torch.ops.mlagen.* not registered: {type(e).__name__}: {e}")


_register_operators()
