"""CPU tests of the runtime through the C ABI: registry, dispatch decisions, error messages.
They load the built library (no GPU is touched by selection and validation)."""
import ctypes
import re
import json
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout

from mlagen import _lib  # noqa: E402
from mlagen._lib import Problem  # noqa: E402

from codegen import catalog  # noqa: E402
from codegen import spec as spec_mod  # noqa: E402


def _unbuilt_shape():
    """A (batch, kv_len) with no specialized kernel in the catalog (the README's add-a-shape
    example, 48x2048, may have been added to codegen/shapes.txt)."""
    built = {(s.batch, s.kv_len) for s in catalog.build_catalog()}
    return next(sh for sh in ((48, 2048), (47, 2000), (45, 1999), (43, 1777)) if sh not in built)


UNBUILT = _unbuilt_shape()


def manifest():
    with open(os.path.join(ROOT, "generated", "manifest.json")) as f:
        return json.load(f)


def test_registry_matches_manifest(L):
    m = manifest()
    names = [k["name"] for k in _lib.kernels()]
    assert names == sorted(k["name"] for k in m["kernels"] if k["arch"] == "sm90a")
    assert _lib.fingerprint() == m["fingerprint"]
    assert L.mlagen_build_archs() == b"sm90a"


@pytest.mark.parametrize("batch,kv_len", catalog.LEADERBOARD_SHAPES, ids=lambda v: str(v))
def test_leaderboard_shapes_dispatch_to_their_kernel(L, batch, kv_len):
    for q_dtype, kv_dtype in catalog.DEFAULT_DTYPES["sm90a"]:
        info = _lib.select(Problem.make(batch, kv_len, q_dtype=q_dtype, kv_dtype=kv_dtype))
        spec = next(s for s in catalog.build_catalog()
                    if (s.arch, s.batch, s.kv_len, s.q_dtype, s.kv_dtype, s.page_size, s.num_heads, s.q_len) ==
                    ("sm90a", batch, kv_len, q_dtype, kv_dtype, 0, 16, 1))
        assert info["name"] == spec.name and not info["generic"] and info["splits"] == spec.splits
        assert (info["q_dtype"], info["kv_dtype"]) == (q_dtype, kv_dtype)


@pytest.mark.parametrize("q_dtype,kv_dtype", catalog.GENERIC_DTYPES["sm90a"])
def test_every_format_has_a_generic_kernel(L, q_dtype, kv_dtype):
    info = _lib.select(Problem.make(*UNBUILT, q_dtype=q_dtype, kv_dtype=kv_dtype))
    assert info["generic"] and (info["q_dtype"], info["kv_dtype"]) == (q_dtype, kv_dtype)


@pytest.mark.parametrize("fields", [dict(batch=UNBUILT[0], kv_len=UNBUILT[1]), dict(batch=4, kv_len=1000),
                                    dict(batch=4, kv_len=0, total_kv=4 * 1024),
                                    dict(batch=4, kv_len=1024, force_generic=1),
                                    dict(batch=4, kv_len=1024, splits=3)])
def test_other_requests_go_to_the_generic_kernel(L, fields):
    info = _lib.select(Problem.make(**fields))
    assert info["generic"] and info["name"] == catalog.generic_spec("sm90a", "bf16", "fp8e4m3fn").name
    if fields.get("splits"):
        assert info["splits"] == fields["splits"]
    assert 1 <= info["splits"] <= 64


def test_generic_split_heuristic_scales_with_batch(L):
    small = _lib.select(Problem.make(2, 4096, force_generic=1))["splits"]
    large = _lib.select(Problem.make(512, 4096, force_generic=1))["splits"]
    short = _lib.select(Problem.make(2, 100, force_generic=1))["splits"]
    assert small > large == 1 and short == 1


@pytest.mark.parametrize("batch", [1, 3, 4, 16, 48, 64, 100, 256, 528, 1000])
@pytest.mark.parametrize("kv_len", [1, 100, 255, 256, 1000, 4096, 65536])
def test_generic_splits_follow_the_generators_rule(L, batch, kv_len):
    """One rule, two places: the runtime's generic kernel and splits, and the generator's. fp8 KV
    (modelled: spec.py GENERIC_COSTS) against catalog.generic_choice; bf16 KV (no model) against the
    split count the generator gives an untuned shape (catalog.heuristic_splits)."""
    got = _lib.select(Problem.make(batch, kv_len, force_generic=1))
    spec, splits = catalog.generic_choice("sm90a", "bf16", "fp8e4m3fn", batch, kv_len)
    assert (got["name"], got["splits"]) == (spec.name, splits)
    got = _lib.select(Problem.make(batch, kv_len, force_generic=1, kv_dtype="bf16", kv_scale=None))["splits"]
    assert got == catalog.heuristic_params("sm90a", batch, kv_len, "bf16")["splits"]


def _workspace_layout_bytes(batch, splits, heads=16, v_dim=512):
    """runtime/include/mlagen/internal.h workspace_layout: [0, 1024) the error word and the
    fp8-q maxima; with splits > 1 then the fixed region of split arrival counters (4 bytes x
    65536), the split maxima/sums (8 bytes a (sequence, split, head)), aligned to 256, then the
    split outputs (float32, v_dim a (sequence, split, head))."""
    if splits <= 1:
        return 1024
    o_offset = -(-(1024 + 4 * 65536 + batch * splits * heads * 8) // 256) * 256
    return o_offset + batch * splits * heads * v_dim * 4


@pytest.mark.parametrize("fields", [dict(batch=32, kv_len=8192), dict(batch=256, kv_len=8192),
                                    dict(batch=4, kv_len=1024), dict(batch=48, kv_len=2048),
                                    dict(batch=4, kv_len=1024, force_generic=1, splits=3),
                                    dict(batch=4, kv_len=1024, force_generic=1, splits=1)],
                         ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_workspace_size(L, fields):
    p = Problem.make(**fields)
    splits = _lib.select(p)["splits"]
    assert L.mlagen_workspace_bytes(ctypes.byref(p)) == _workspace_layout_bytes(fields["batch"], splits)


def test_workspace_size_exact_values(L):
    # the layout worked by hand: one split is the 1024-byte header alone; batch 4 x 3 splits x
    # 16 heads: 1024 + 262144 (the fixed split-counter region) + 4*3*16*8 = 264704 (256-aligned
    # already) + 4*3*16*512*4 = 393216 bytes of partials
    assert L.mlagen_workspace_bytes(ctypes.byref(Problem.make(4, 1024, force_generic=1, splits=1))) == 1024
    assert L.mlagen_workspace_bytes(ctypes.byref(Problem.make(4, 1024, force_generic=1, splits=3))) == 264704 + 393216
    assert L.mlagen_workspace_bytes(ctypes.byref(Problem.make(4, 1024, num_heads=12))) == 0  # invalid: no kernel
    # 128 heads x 2 tokens = 16 blocks of 16 rows a sequence: partials 16x the 16-head ones
    assert L.mlagen_workspace_bytes(ctypes.byref(Problem.make(4, 1024, num_heads=128, q_len=2, total_q=8,
                                                              force_generic=1, splits=3))) == \
        _workspace_layout_bytes(4, 3, heads=256)


def test_head_counts_are_the_specs_everywhere(L):
    """codegen/facts.py NUM_HEADS is the one list: the library's validation (generated into
    facts.inc) takes exactly those head counts, and the binding states the same."""
    import mlagen
    assert tuple(mlagen.NUM_HEADS) == spec_mod.NUM_HEADS
    for heads in range(1, 257):
        ok = L.mlagen_workspace_bytes(ctypes.byref(Problem.make(4, 1024, num_heads=heads, force_generic=1))) > 0
        assert ok == (heads in spec_mod.NUM_HEADS), heads


PAGED = dict(page_size=16, page_table=0x8000, page_table_width=64, page_table_stride=64, page_table_len=4 * 64, kv_lens=0x9000)
BAD = [
    (dict(num_heads=12), "num_heads=12: expected 8, 16, 32, 64 or 128"),
    (dict(num_kv_heads=2), "num_kv_heads=2: expected 1"),
    (dict(q_len=5), "q_len=5: expected 1..4"),
    (dict(q_len=2, total_q=9), "total_q=9: expected batch..batch\\*q_len = 4..8"),
    (dict(qk_dim=512), "qk_dim=512: expected 576"),
    (dict(v_dim=576), "v_dim=576: expected 512"),
    (dict(batch=0), "batch=0: expected 1..65535"),
    (dict(total_q=5), "total_q=5: expected batch..batch\\*q_len = 4..4"),
    (dict(total_q=3, q_len=2), "total_q=3: expected batch..batch\\*q_len = 4..8"),
    (dict(total_kv=4000), "total_kv=4000: expected batch\\*kv_len = 4096"),
    (dict(sm_scale=float("nan")), "sm_scale=nan"),
    (dict(splits=65), "splits=65"),
    (dict(q=None), "q: NULL pointer"),
    (dict(kv=None), "kv: NULL pointer"),
    (dict(kv_scale=None), "kv_scale: NULL pointer"),
    (dict(qo_indptr=None), "qo_indptr: NULL pointer"),
    (dict(kv_indptr=None), "kv_indptr: NULL pointer"),
    (dict(out=None), "out: NULL pointer"),
    (dict(q=0x1002), "q: address .* not 8-byte aligned"),
    (dict(kv_stride_token=580), "kv_stride_token=580"),
    (dict(kv_stride_token=512), "kv_stride_token=512"),
    (dict(kv_stride_token=(1 << 24) + 16), "kv_stride_token=16777232: expected at most 16777216"),
    (dict(out_stride_head=500), "out_stride_head=500"),
    (dict(out_stride_token=512), "out_stride_token=512"),
    (dict(q_dtype=9), "q_dtype=9"),
    (dict(abi_version=7), "abi_version=7: expected 5"),
    (dict(page_size=12, page_table=0x8000), "page_size=12: expected a power of two 1..256"),
    (dict(page_size=512, page_table=0x8000), "page_size=512: expected a power of two"),
    (dict(page_size=16), "page_table: NULL pointer"),
    (dict(page_table=0x8000), "page_table / kv_lens / page_indptr / last_page_len: given with page_size=0"),
    (dict(PAGED, page_table=0x8002), "page_table: address .* not 4-byte aligned"),
    (dict(PAGED, page_table_width=0), "page_table_width=0: expected >= 1"),
    (dict(PAGED, page_table_stride=32), "page_table_stride=32: expected >= page_table_width=64"),
    (dict(PAGED, page_table_len=100), "page_table_len=100: expected >= \\(batch-1\\)\\*page_table_stride"),
    (dict(PAGED, page_table_width=8, page_table_stride=8, page_table_len=32), "page_table_width=8: expected >= 64 pages"),
    (dict(PAGED, total_kv=4100), "total_kv=4100: expected a multiple of page_size=16"),
    (dict(PAGED, kv_lens=None, kv_indptr=None), "kv_lens: NULL pointer"),
    (dict(PAGED, last_page_len=0xa000), "last_page_len: given without page_indptr"),
    (dict(PAGED, kv_lens=None, page_indptr=0xb000), "last_page_len: NULL pointer"),
    (dict(PAGED, page_indptr=0xb000, last_page_len=0xa000), "kv_lens: given with page_indptr"),
    (dict(lse=0x8002, lse_stride_token=16), "lse: address .* not 4-byte aligned"),
    (dict(lse=0x8000, lse_stride_token=8), "lse_stride_token=8: expected >= num_heads=16"),
]


# Format-specific fields: (problem dtypes, bad fields, message naming the field).
BAD_FORMAT = [
    (dict(kv_dtype="mxfp4"), dict(kv_scale_stride=17), "kv_scale_stride=17: expected 18..32"),
    (dict(kv_dtype="mxfp4"), dict(kv_scale_stride=40), "kv_scale_stride=40: expected 18..32"),
    (dict(kv_dtype="mxfp4"), dict(kv_scale=0x3008), "kv_scale: address 0x3008 not 16-byte aligned"),
    (dict(kv_dtype="mxfp4"), dict(kv_scale=None), "kv_scale: NULL pointer \\(mxfp4"),
    (dict(kv_dtype="mxfp4"), dict(kv_stride_token=280), "kv_stride_token=280: expected a multiple of 16 that is >= 288"),
    (dict(kv_dtype="bf16"), dict(kv_stride_token=572), "kv_stride_token=572: expected a multiple of 8 that is >= 576"),
    (dict(q_dtype="fp8"), dict(q_scale=None), "q_scale: NULL pointer \\(fp8 q"),
    (dict(q_dtype="fp8"), dict(q_from_bf16=1), "q_scale: expected NULL with q_from_bf16=1"),
    (dict(q_dtype="bf16"), dict(q_from_bf16=1), "q_from_bf16=1: expected q_dtype fp8"),
    (dict(q_dtype="fp8"), dict(q_from_bf16=2), "q_from_bf16=2: expected 0 or 1"),
    (dict(q_dtype="fp8"), dict(q_from_bf16=1, q_scale=None, q=0x1008), "q: address 0x1008 not 16-byte aligned"),
    (dict(q_dtype="fp8"), dict(q=0x1002), "q: address 0x1002 not 4-byte aligned"),
]


@pytest.mark.parametrize("dtypes,fields,msg", BAD_FORMAT, ids=[m.split(":")[0] + str(i) for i, (_, _, m) in enumerate(BAD_FORMAT)])
def test_invalid_format_fields_name_field_and_expectation(L, dtypes, fields, msg):
    p = Problem.make(4, 1024, **dtypes)
    assert _lib.select(p)["kv_dtype"] == dtypes.get("kv_dtype", "fp8e4m3fn")  # valid before the change
    for k, v in fields.items():
        setattr(p, k, v)
    with pytest.raises(_lib.MlagenError, match=msg) as e:
        _lib.select(p)
    assert e.value.status == _lib.ERR_INVALID


def test_fp8_q_from_bf16_needs_no_scale(L):
    p = Problem.make(4, 1024, q_dtype="fp8", q_scale=None, q_from_bf16=1)
    assert _lib.select(p)["q_dtype"] == "fp8"


def test_bf16_kv_needs_no_scale(L):
    assert _lib.select(Problem.make(4, 1024, kv_dtype="bf16", kv_scale=None))["kv_dtype"] == "bf16"


@pytest.mark.parametrize("fields,msg", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_invalid_input_names_field_and_expectation(L, fields, msg):
    p = Problem.make(4, 1024)
    for k, v in fields.items():
        setattr(p, k, v)
    with pytest.raises(_lib.MlagenError, match=msg) as e:
        _lib.select(p)
    assert e.value.status == _lib.ERR_INVALID
    assert "MLAGEN_ERR_INVALID" in str(e.value)


def test_unsupported_dtype_prints_the_key(L):
    with pytest.raises(_lib.MlagenError, match=r"no kernel for key \{arch=sm90a, batch=4, kv_len=1024, "
                                               r"q_dtype=bf16, kv_dtype=fp8e4m3fnuz") as e:
        _lib.select(Problem.make(4, 1024, kv_dtype="fp8e4m3fnuz"))
    assert e.value.status == _lib.ERR_UNSUPPORTED


def test_decode_refuses_a_missing_or_small_workspace_before_touching_the_gpu(L):
    p = Problem.make(32, 8192)
    st = L.mlagen_decode(ctypes.byref(p), None, None)
    assert st == _lib.ERR_WORKSPACE and b"workspace" in L.mlagen_last_error()
    p.workspace, p.workspace_bytes = 0x10000, 1024
    st = L.mlagen_decode(ctypes.byref(p), None, None)
    assert st == _lib.ERR_WORKSPACE and b"expected >=" in L.mlagen_last_error()


def test_null_problem(L):
    assert L.mlagen_select(None, None) == _lib.ERR_INVALID
    assert L.mlagen_last_error() == b"problem: NULL pointer"
    assert L.mlagen_run(None, None, None) == _lib.ERR_INVALID
    assert L.mlagen_last_error() == b"plan: NULL pointer"
    assert L.mlagen_plan(None, None) == _lib.ERR_INVALID


def test_kernel_at_out_of_range(L):
    info = _lib.KernelInfo()
    assert L.mlagen_kernel_at(L.mlagen_num_kernels(), ctypes.byref(info)) == _lib.ERR_INVALID
    assert b"kernel index" in L.mlagen_last_error()


def test_kernel_by_name(L):
    names = {k["name"]: k for k in _lib.kernels()}
    cand = [n for n, k in names.items() if k["role"] == "candidate" and k["kv_dtype"] == "fp8e4m3fn"]
    assert cand, "tuning candidates are built"
    info = _lib.select(Problem.make(48, 2048, kernel_name=cand[0].encode()))
    assert info["name"] == cand[0] and info["generic"]
    spec = next(s.name for s in catalog.build_catalog() if (s.arch, s.batch, s.kv_len, s.q_dtype, s.kv_dtype)
                == ("sm90a", 32, 8192, "bf16", "fp8e4m3fn"))
    assert _lib.select(Problem.make(32, 8192, kernel_name=spec.encode()))["name"] == spec
    with pytest.raises(_lib.MlagenError, match="serves batch=32 kv_len=8192 only"):
        _lib.select(Problem.make(4, 1024, kernel_name=spec.encode()))
    with pytest.raises(_lib.MlagenError, match="kernel_name=nope: no such kernel") as e:
        _lib.select(Problem.make(4, 1024, kernel_name=b"nope"))
    assert e.value.status == _lib.ERR_UNSUPPORTED


def test_paged_problems_select_the_page_size_kernels(L):
    """Specialized _pg1 / _pg64 kernels for a block table of their page size; every other page
    size, and FlashInfer's indices form, goes to the generic kernel (page size read at run time)."""
    def paged(page, **kw):
        width = -(-8192 // page)
        return Problem.make(32, 8192, page_size=page, page_table=0x8000, page_table_width=width,
                            page_table_stride=width, page_table_len=32 * width, kv_lens=0x9000, kv_indptr=None, **kw)
    for page in (1, 64):
        got = _lib.select(paged(page))
        assert got["name"].endswith(f"_pg{page}") and got["page_size"] == page and not got["generic"], got
        # the paged kernel's own tuning entry, else the contiguous kernel's splits
        want = catalog.params_for("sm90a", 32, 8192, "bf16", "fp8e4m3fn", catalog.load_tuning(), page)["splits"]
        assert got["splits"] == want
    for page in (16, 256):
        assert _lib.select(paged(page))["generic"]
    fi = paged(64, page_indptr=0xb000, last_page_len=0xa000)
    fi.kv_lens = None
    assert _lib.select(fi)["generic"]
    name = _lib.select(paged(64))["name"]
    with pytest.raises(_lib.MlagenError, match=f"kernel_name={name}: reads pages from a block table"):
        _lib.select(Problem.make(32, 8192, kernel_name=name.encode()))


def test_plan_and_run_check_the_call_against_the_plan(L):
    """mlagen_plan validates once; mlagen_run checks only the call's pointers (presence as planned,
    alignment) before launching: these fail before any device work, so they run without a GPU."""
    p = Problem.make(4, 1024)
    plan = ctypes.c_void_p()
    assert L.mlagen_plan(ctypes.byref(p), ctypes.byref(plan)) == _lib.OK
    info, nbytes = _lib.KernelInfo(), ctypes.c_size_t()
    assert L.mlagen_plan_info(plan, ctypes.byref(info), ctypes.byref(nbytes)) == _lib.OK
    assert info.name.decode() == _lib.select(p)["name"] and nbytes.value == L.mlagen_workspace_bytes(ctypes.byref(p))
    base = dict(q=0x1000, q_scale=0x7000, kv=0x2000, kv_scale=0x3000, qo_indptr=0x4000, kv_indptr=0x5000, out=0x6000,
                workspace=0x10000)

    def run(**kw):
        a = _lib.Args(**dict(base, **kw))
        st = L.mlagen_run(plan, ctypes.byref(a), None)
        return st, L.mlagen_last_error().decode()

    for kw, msg in [(dict(q=None), "q: NULL pointer, but the plan was made with it"),
                    (dict(lse=0x7100), "lse: given, but the plan was made without it"),
                    (dict(page_table=0x7100), "page_table: given, but the plan was made without it"),
                    (dict(kv=0x2008), "kv: address .* not 16-byte aligned"),
                    (dict(out=0x6004), "out: address .* not 16-byte aligned"),
                    (dict(workspace=None), "workspace: NULL pointer"),
                    (dict(workspace=0x10010), "workspace: expected 256-byte alignment")]:
        st, err = run(**kw)
        assert st != _lib.OK and re.search(msg, err), (kw, err)
    L.mlagen_plan_destroy(plan)
    bad = Problem.make(4, 1024, num_heads=12)
    assert L.mlagen_plan(ctypes.byref(bad), ctypes.byref(plan)) == _lib.ERR_INVALID
    assert "num_heads=12" in L.mlagen_last_error().decode()


@pytest.mark.parametrize("heads,q_len,batch,kv_len,tag", [(128, 1, 64, 8192, "h128"), (128, 1, 128, 4096, "h128"),
                                                          (64, 1, 64, 8192, "h64"), (32, 1, 64, 8192, "h32"),
                                                          (16, 2, 32, 8192, "ql2"), (16, 4, 256, 8192, "ql4")])
def test_row_shapes_select_their_specialized_kernel(heads, q_len, batch, kv_len, tag):
    got = _lib.select(Problem.make(batch, kv_len, num_heads=heads, q_len=q_len))
    assert not got["generic"] and tag in got["name"].split("_"), got["name"]
    # fewer query tokens than q_len in some sequence (total_q < batch * q_len): the generic kernel
    if q_len > 1:
        assert _lib.select(Problem.make(batch, kv_len, num_heads=heads, q_len=q_len, total_q=batch * q_len - 1))["generic"]
    # the same heads / q_len at a shape without a specialization: the generic kernel
    assert _lib.select(Problem.make(48, 2048, num_heads=heads, q_len=q_len))["generic"]


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("heads,q_len", [(128, 1), (64, 3), (16, 4), (32, 2), (32, 1), (8, 4), (16, 2), (32, 3),
                                         (16, 1), (8, 2), (16, 3), (8, 3), (64, 1), (128, 4)])
def test_generic_fp8_kernel_and_splits_are_the_models(heads, q_len, q_dtype):
    """fp8 KV without a specialization: the generic kernel (16-row, or a rows body whose block_m
    divides heads x q_len) and its splits of least modelled time (spec.py GENERIC_COSTS), the
    runtime's pick equal to catalog.generic_choice's over batch x lengths, contiguous and on pages of
    64 and 256 rows; pages under a tile (32, 1) keep the 16-row kernel; a rows body named for rows
    it cannot block is refused."""
    kw = dict(q_dtype=q_dtype) if q_dtype == "fp8" else {}
    seen = set()
    for batch, kv_len in ((1, 1024), (5, 8192), (16, 1024), (48, 8192), (60, 1024), (96, 4096), (3, 100)):
        got = _lib.select(Problem.make(batch, kv_len, num_heads=heads, q_len=q_len, **kw))
        spec, splits = catalog.generic_choice("sm90a", q_dtype, "fp8e4m3fn", batch, kv_len, heads, q_len)
        assert got["generic"] and (got["name"], got["splits"]) == (spec.name, splits), (batch, kv_len, got)
        assert got["role"] == ("generic_rows" if spec.block_m > 16 else "generic"), got
        seen.add(spec.block_m)
        for page in (64, 256, 32, 1):
            if kv_len % page:
                continue
            width = kv_len // page
            paged = Problem.make(batch, kv_len, num_heads=heads, q_len=q_len, page_size=page, page_table=0x8000,
                                 page_table_width=width, page_table_stride=width, page_table_len=batch * width,
                                 kv_lens=0x9000, kv_indptr=None, **kw)
            pspec, psplits = catalog.generic_choice("sm90a", q_dtype, "fp8e4m3fn", batch, kv_len, heads, q_len, page)
            assert (page >= 64 or pspec.block_m == 16) and _lib.select(paged)["name"] == pspec.name, (page, batch)
            assert _lib.select(paged)["splits"] == psplits
    if (heads * q_len) % 32:
        assert seen == {16}
    else:
        rows_name = next(k["name"] for k in _lib.kernels() if k["role"] == "generic_rows" and k["q_dtype"] == q_dtype
                         and k["kv_dtype"] == "fp8e4m3fn" and k["name"].endswith("_bm32"))
        with pytest.raises(_lib.MlagenError, match="num_heads x q_len a multiple of 32"):
            _lib.select(Problem.make(48, 8192, num_heads=8, q_len=1, kernel_name=rows_name.encode(), **kw))


@pytest.mark.parametrize("heads,batch,kv_len,q_dtype,want", [
    (64, 64, 1024, "fp8", "bn64_st5_bm32 s1"), (64, 64, 1024, "bf16", "bn64_bm32 s1"),
    (128, 4, 8192, "fp8", "bn64_st5_bm32 s8"), (128, 4, 8192, "bf16", "bn64_bm32 s8"),
    (128, 16, 1024, "fp8", "bn64_st5_bm32 s1"), (128, 64, 8192, "fp8", "bn64_bm64 s1"),
    (128, 16, 8192, "bf16", "bn64_st3_bm64 s4"), (64, 128, 1024, "fp8", "bn64_bm64 s1"),
    (16, 4, 1024, "fp8", "bn64_st2 s16"), (32, 4, 8192, "bf16", "bn64_st2 s32")])
def test_generic_fp8_picks_the_measured_fastest(heads, batch, kv_len, q_dtype, want):
    """The model's picks on cells of the serving matrix where the H200 sweep behind GENERIC_COSTS
    measured them fastest of every generic (kernel, power-of-two splits), paged 64, after another
    kernel and the flush (docs/perf.md, the serving matrix): e.g. 64 heads 64x1024 the 32-row body
    at 1 split (35.9 us; the 64-row body at 2 splits, the rule before it, 57.8)."""
    kw = dict(q_dtype=q_dtype) if q_dtype == "fp8" else {}
    width = kv_len // 64
    got = _lib.select(Problem.make(batch, kv_len, num_heads=heads, page_size=64, page_table=0x8000,
                                   page_table_width=width, page_table_stride=width, page_table_len=batch * width,
                                   kv_lens=0x9000, kv_indptr=None, **kw))
    assert f"{got['name'].split('kvfp8e4m3fn_')[1]} s{got['splits']}" == want, got


@pytest.mark.parametrize("heads,q_len,block_m", [(128, 1, 64), (64, 1, 64), (16, 4, 64), (32, 1, 32),
                                                 (16, 2, 32), (16, 1, 0)])
@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
def test_bf16_kv_rows_go_to_the_rows_body(heads, q_len, block_m, q_dtype):
    """bf16 KV: the 128 / 64 / 32-head shapes of 64x8192 (bf16 q) take their specialized rows-body
    kernels (64, 64, 32 rows a block); without one, rows in blocks of 64, else 32, take the generic
    bf16 rows-body kernels (either q), contiguous or on pages of 64 rows and more; 16 rows a
    sequence, or smaller pages, the 16-row generic kernel (the bf16 warpgroup kernel)."""
    kw = dict(kv_dtype="bf16", kv_scale=None, q_dtype=q_dtype)
    if q_len == 1 and q_dtype == "bf16" and heads >= 32:
        got = _lib.select(Problem.make(64, 8192, num_heads=heads, **kw))
        assert not got["generic"] and got["kv_dtype"] == "bf16", got
        assert got["name"] == f"mla_decode_sm90a_b64_kv8192_s{got['splits']}_qbf16_kvbf16_h{heads}_bn64_st2_bm{block_m}"
    got = _lib.select(Problem.make(48, 8192, num_heads=heads, q_len=q_len, **kw))
    assert got["generic"] and got["kv_dtype"] == "bf16", got
    if not block_m:
        assert got["role"] == "generic" and got["name"].endswith("_kvbf16_bn64_st2"), got
        return
    assert got["role"] == "generic_rows" and got["name"] == f"mla_decode_sm90a_bany_kvany_sany_q{q_dtype}_kvbf16_bn64_st2_bm{block_m}"
    blocks = 48 * heads * q_len // block_m
    assert got["splits"] == catalog.heuristic_splits(spec_mod.ROWS_BODY_TARGET_BLOCKS, blocks, 8192, "sm90a",
                                                     48 * heads * q_len)
    for page, role in ((64, "generic_rows"), (256, "generic_rows"), (32, "generic"), (1, "generic")):
        width = 8192 // page
        paged = Problem.make(48, 8192, num_heads=heads, q_len=q_len, page_size=page, page_table=0x8000,
                             page_table_width=width, page_table_stride=width, page_table_len=48 * width,
                             kv_lens=0x9000, kv_indptr=None, **kw)
        assert _lib.select(paged)["role"] == role, (page, _lib.select(paged))


@pytest.mark.parametrize("batch,kv_len,heads,rows_body", [(1, 1024, 128, False), (16, 1024, 128, False),
                                                         (4, 8192, 64, False), (64, 1024, 128, True),
                                                         (4, 8192, 128, True), (16, 8192, 32, True)])
def test_small_problems_keep_the_16_row_kernel(batch, kv_len, heads, rows_body):
    """Unmodelled pairs (bf16 KV: spec.py GENERIC_COSTS has no entry): below ROWS_BODY_MIN_WORK (batch
    x tokens x 16-row groups) the 16-row generic kernel serves rows-body head counts; from it on, the
    rows body; paged alike."""
    kw = dict(kv_dtype="bf16", kv_scale=None)
    work = batch * kv_len * heads // 16
    assert (work >= spec_mod.ROWS_BODY_MIN_WORK) == rows_body
    want = "generic_rows" if rows_body else "generic"
    assert _lib.select(Problem.make(batch, kv_len, num_heads=heads, **kw))["role"] == want
    width = kv_len // 64
    paged = Problem.make(batch, kv_len, num_heads=heads, page_size=64, page_table=0x8000, page_table_width=width,
                         page_table_stride=width, page_table_len=batch * width, kv_lens=0x9000, kv_indptr=None, **kw)
    assert _lib.select(paged)["role"] == want


def test_generic_splits_count_row_groups():
    """128 heads are 8 blocks a sequence and split: fewer splits than 16 heads."""
    s16 = _lib.select(Problem.make(8, 8192, force_generic=1))["splits"]
    s128 = _lib.select(Problem.make(8, 8192, num_heads=128, force_generic=1))["splits"]
    assert s128 < s16 and s128 >= 1, (s16, s128)


def test_split_merge_mode_is_set_checked_and_read_back(L):
    """mlagen_set_split_merge takes MLAGEN_MERGE_COMBINE (0, the default) or MLAGEN_MERGE_IN_LAUNCH (1)
    and refuses anything else naming the value; mlagen_get_split_merge reads it back."""
    assert L.mlagen_get_split_merge() == 0
    try:
        for bad in (-1, 2, 7):
            assert L.mlagen_set_split_merge(bad) == _lib.ERR_INVALID
            assert f"split merge mode={bad}: expected 0 (MLAGEN_MERGE_COMBINE) or 1" in L.mlagen_last_error().decode()
            assert L.mlagen_get_split_merge() == 0
        assert L.mlagen_set_split_merge(1) == _lib.OK and L.mlagen_get_split_merge() == 1
    finally:
        assert L.mlagen_set_split_merge(0) == _lib.OK
    assert L.mlagen_get_split_merge() == 0
