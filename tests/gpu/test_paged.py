"""Paged KV (block tables and FlashInfer's page indices) and the LSE output, on the GPU.

The cache is built first (random rows, every format quantized from the same bf16 cache, unused
pages random too), then page lists drawn from it in random order, some shared between
sequences; each sequence's logical KV is the gather of its rows, so the paged call and the
contiguous call see identical bytes and must give bit-identical outputs with the same kernel
tiling and splits. Both are judged against float64 per (token, head) row as well. Bad page
tables must flag the sequence (NaN row, MLAGEN_DEVERR_PAGE_TABLE), never read outside the
cache, and leave the other sequences right.
"""
import math
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402

from reference import SM_SCALE, attention, quantize_fp8, rel_l2  # noqa: E402
from tolerances import TOLERANCES  # noqa: E402
from codegen.spec import KernelSpec  # noqa: E402

ANY_ARCH = "sm90a"
pytestmark = pytest.mark.gpu
FORMATS = ("fp8", "bf16", "mxfp4")
QK = 576
BAD = 1 << 30  # what unused block-table entries hold: reading one would flag the sequence


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


class Paged:
    """A paged cache in every format and the same KV as contiguous rows."""

    def __init__(self, lens, page, seed, spare_pages=3, share=True, pad_scales=False):
        g = torch.Generator(device="cuda").manual_seed(seed)
        rng = random.Random(seed)
        self.lens, self.page, self.batch = list(lens), page, len(lens)
        need = [math.ceil(n / page) for n in lens]
        shared = share and self.batch >= 2 and need[0] >= 2 and need[1] >= 2
        n_sh = min(need[0], need[1]) // 2 if shared else 0  # sequence 1 starts with sequence 0's first pages
        self.num_pages = sum(need) - n_sh + spare_pages
        rows = self.num_pages * page
        cache = torch.randn((rows, 1, QK), generator=g, device="cuda").to(torch.bfloat16)
        self.q = torch.randn((self.batch, 16, QK), generator=g, device="cuda").to(torch.bfloat16)
        pool = list(range(self.num_pages))
        rng.shuffle(pool)
        lists = []
        for b, n in enumerate(need):
            if b == 1 and n_sh:
                lists.append(lists[0][:n_sh] + [pool.pop() for _ in range(n - n_sh)])
            else:
                lists.append([pool.pop() for _ in range(n)])
        self.lists = lists
        width = max(1, max(need)) + 1
        table = torch.full((self.batch, width), BAD, dtype=torch.int32)
        for b, pl in enumerate(lists):
            table[b, :len(pl)] = torch.tensor(pl, dtype=torch.int32)
        self.table = table.cuda()
        self.kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        self.indices = torch.tensor([p for pl in lists for p in pl] or [0], dtype=torch.int32, device="cuda")
        ip = [0]
        for pl in lists:
            ip.append(ip[-1] + len(pl))
        self.page_indptr = torch.tensor(ip, dtype=torch.int32, device="cuda")
        self.last_page_len = torch.tensor([(n - 1) % page + 1 if n else 0 for n in lens], dtype=torch.int32, device="cuda")
        # every format from the one bf16 cache; logical rows = the gather of each sequence's rows
        fp8, scale = quantize_fp8(cache)
        mx, mxs = quant.quantize_mxfp4(cache, pad_scales=pad_scales)
        self.cache = {"bf16": cache, "fp8": (fp8, scale), "mxfp4": (mx, mxs)}
        idx = []
        for b, n in enumerate(lens):
            for t in range(n):
                idx.append(lists[b][t // page] * page + t % page)
        self.rows = torch.tensor(idx or [0], dtype=torch.long, device="cuda")[:len(idx)]
        total = len(idx)
        self.contig = {"bf16": cache[self.rows], "fp8": (fp8[self.rows], scale),
                       "mxfp4": (mx[self.rows], mxs[self.rows].contiguous())}
        self.qo_indptr = torch.arange(self.batch + 1, dtype=torch.int32, device="cuda")
        self.kv_indptr = torch.zeros(self.batch + 1, dtype=torch.int32, device="cuda")
        self.kv_indptr[1:] = torch.tensor(lens, device="cuda").cumsum(0)
        uniform = len(set(lens)) == 1
        self.config = dict(batch_size=self.batch, sm_scale=SM_SCALE, kv_seq_len=lens[0] if uniform else None)
        self.contig_config = dict(self.config, kv_seq_len=lens[0] if uniform and total == self.batch * lens[0] else None)
        assert total == sum(lens)

    def seen(self, fmt):
        """The logical KV values the kernels compute with (float32)."""
        if fmt == "fp8":
            fp8, s = self.contig["fp8"]
            return fp8.float() * s
        if fmt == "bf16":
            return self.contig["bf16"].float()
        d, s = self.contig["mxfp4"]
        return quant.dequantize_mxfp4(d, s, QK).reshape(-1, 1, QK)

    def run_paged(self, fmt, form="table", lse=False, **kw):
        out = torch.full((self.batch, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        if form == "table":
            res = mlagen.decode(self.q, self.cache, self.qo_indptr, None, self.config, kv_format=fmt, out=out,
                                page_table=self.table, page_size=self.page, kv_lens=self.kv_lens, return_lse=lse, **kw)
        else:
            res = mlagen.decode(self.q, self.cache, self.qo_indptr, self.page_indptr, self.config, kv_format=fmt,
                                out=out, kv_indices=self.indices, kv_last_page_len=self.last_page_len,
                                page_size=self.page, return_lse=lse, **kw)
        torch.cuda.synchronize()
        return res

    def run_contig(self, fmt, lse=False, **kw):
        out = torch.full((self.batch, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        res = mlagen.decode(self.q, self.contig, self.qo_indptr, self.kv_indptr, self.contig_config, kv_format=fmt,
                            out=out, return_lse=lse, **kw)
        torch.cuda.synchronize()
        return res


def _check_ref(pg, out, fmt, seed):
    """float32 on the inputs the kernel sees and float64 on the bf16 cache, per (token, head) row."""
    path = "fp8e4m3fn" if fmt == "fp8" else fmt
    ref32 = attention(pg.q, pg.seen(fmt), pg.lens, torch.float32)
    ref64 = attention(pg.q, pg.contig["bf16"], pg.lens, torch.float64)
    tol32 = TOLERANCES[(path, "same_inputs")]["rel_l2"]
    tol64 = TOLERANCES[(path, "bf16_inputs")]["rel_l2"]
    for b, n in enumerate(pg.lens):
        if n == 0:
            assert (out[b] == 0).all(), f"seed {seed}: empty sequence {b} must give zeros"
            continue
        for h in range(16):
            e32 = rel_l2(out[b, h], ref32[b, h])
            e64 = rel_l2(out[b, h], ref64[b, h])
            assert e32 <= 4 * tol32, f"seed {seed} {fmt} seq {b} head {h}: row rel_l2 {e32:.2e} vs fp32"
            assert e64 <= 4 * tol64, f"seed {seed} {fmt} seq {b} head {h}: row rel_l2 {e64:.2e} vs fp64"
    assert rel_l2(out, ref32) <= tol32 and rel_l2(out, ref64) <= tol64


def _lse_reference(pg, fmt):
    kv = pg.seen(fmt).double().reshape(-1, QK)
    out = torch.full((pg.batch, 16), -math.inf, dtype=torch.float64, device="cuda")
    start = 0
    for b, n in enumerate(pg.lens):
        if n:
            s = pg.q[b].double() @ kv[start:start + n].T * SM_SCALE
            out[b] = torch.logsumexp(s, dim=-1)
        start += n
    return out


PAGED_CASES = [  # (lengths, page size): lengths not a multiple of the page, an empty sequence, shared pages
    ([1000, 777, 0, 64, 1], 16),
    ([513, 1024, 300], 1),
    ([4099, 64, 2000, 1], 64),
    ([3000, 2999, 17], 256),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", range(len(PAGED_CASES)))
def test_paged_is_bit_identical_to_contiguous(fmt, case):
    lens, page = PAGED_CASES[case]
    seed = fresh_seed()
    pg = Paged(lens, page, seed)
    for splits in (1, 3):
        paged = pg.run_paged(fmt, force_generic=True, splits=splits)
        assert mlagen.last_kernel()["generic"]
        contig = pg.run_contig(fmt, force_generic=True, splits=splits)
        mlagen.check_device_errors()
        assert torch.equal(paged.view(torch.int16), contig.view(torch.int16)), \
            f"seed {seed} {fmt} page {page} splits {splits}: paged differs from contiguous " \
            f"(max |d| {(paged.float() - contig.float()).abs().max().item():.3g})"
        _check_ref(pg, paged, fmt, seed)
    flashinfer = pg.run_paged(fmt, form="indices", force_generic=True, splits=3)
    mlagen.check_device_errors()
    assert torch.equal(flashinfer.view(torch.int16), paged.view(torch.int16)), f"seed {seed}: indices form differs"


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("page", [1, 64])
@pytest.mark.parametrize("batch,kv_len", [(32, 8192), (64, 8192), (256, 8192)])
def test_specialized_paged_kernel(fmt, page, batch, kv_len):
    """The _pg1 / _pg64 kernels: bit-identical to a contiguous kernel of the same tiling and splits
    (the shape's own, or the generic one when the paged kernel was tuned apart), pages in random order."""
    seed = fresh_seed()
    pg = Paged([kv_len] * batch, page, seed, share=False)
    paged = pg.run_paged(fmt)
    ran = mlagen.last_kernel()
    assert not ran["generic"] and ran["page_size"] == page and ran["name"].endswith(f"_pg{page}"), ran
    contig = pg.run_contig(fmt)
    base = mlagen.last_kernel()
    assert not base["generic"] and base["page_size"] == 0, base
    if (base["block_n"], base["stages"], base["splits"]) != (ran["block_n"], ran["stages"], ran["splits"]):
        spec = KernelSpec(ANY_ARCH, 0, 0, 0, ran["q_dtype"], ran["kv_dtype"], block_n=ran["block_n"], stages=ran["stages"])
        contig = pg.run_contig(fmt, kernel=spec.name, splits=ran["splits"])
        assert mlagen.last_kernel()["name"] == spec.name
    mlagen.check_device_errors()
    assert torch.equal(paged.view(torch.int16), contig.view(torch.int16)), f"seed {seed}: {ran['name']} differs"
    ref = attention(pg.q, pg.seen(fmt), pg.lens, torch.float32)
    assert rel_l2(paged, ref) <= TOLERANCES[("fp8e4m3fn" if fmt == "fp8" else fmt, "same_inputs")]["rel_l2"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("splits", [1, 4])
def test_lse_matches_float64(fmt, splits):
    seed = fresh_seed()
    pg = Paged([2000, 1, 0, 700, 4096], 16, seed)
    ref = _lse_reference(pg, fmt)
    tol = 2e-3 if fmt == "bf16" else 2e-2  # the fp8 paths carry q in ~8 significant bits (hi + lo e4m3)
    for run in (lambda: pg.run_paged(fmt, lse=True, force_generic=True, splits=splits),
                lambda: pg.run_contig(fmt, lse=True, force_generic=True, splits=splits)):
        out, lse = run()
        mlagen.check_device_errors()
        assert lse.shape == (pg.batch, 16) and lse.dtype == torch.float32
        assert torch.isneginf(lse[2]).all(), f"seed {seed}: an empty sequence's lse must be -inf"
        live = [b for b, n in enumerate(pg.lens) if n]
        err = (lse[live].double() - ref[live]).abs().max().item()
        assert err <= tol, f"seed {seed} {fmt} splits {splits}: |lse - float64| {err:.2e} (tol {tol})"
        _check_ref(pg, out, fmt, seed)


def test_lse_from_specialized_kernels():
    seed = fresh_seed()
    pg = Paged([8192] * 32, 64, seed, share=False)
    ref = _lse_reference(pg, "fp8")
    for run in (lambda: pg.run_paged("fp8", lse=True), lambda: pg.run_contig("fp8", lse=True)):
        out, lse = run()
        assert not mlagen.last_kernel()["generic"]
        err = (lse.double() - ref).abs().max().item()
        assert err <= 2e-2, f"seed {seed}: |lse - float64| {err:.2e} ({mlagen.last_kernel()['name']})"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [-1, "num_pages", BAD])
def test_bad_page_id_flags_only_its_sequence(fmt, bad):
    seed = fresh_seed()
    pg = Paged([300, 700, 129], 64, seed, share=False)
    good = pg.run_paged(fmt, force_generic=True, splits=2)
    mlagen.check_device_errors()
    pg.table[1, 3] = pg.num_pages if bad == "num_pages" else bad
    out = pg.run_paged(fmt, force_generic=True, splits=2)
    assert torch.isnan(out[1].float()).all(), f"seed {seed}: the flagged sequence must be NaN"
    assert torch.equal(out[0].view(torch.int16), good[0].view(torch.int16))
    assert torch.equal(out[2].view(torch.int16), good[2].view(torch.int16))
    with pytest.raises(mlagen.MlagenError, match="page_table holds a page id outside"):
        mlagen.check_device_errors()


def test_bad_lengths_and_lists_are_flagged():
    seed = fresh_seed()
    pg = Paged([300, 700, 129], 64, seed, share=False)
    pg.kv_lens[2] = pg.table.shape[1] * 64 + 1  # longer than the table's row
    out = pg.run_paged("fp8")
    assert torch.isnan(out[2].float()).all() and torch.isfinite(out[:2].float()).all()
    with pytest.raises(mlagen.MlagenError, match="page_table"):
        mlagen.check_device_errors()
    pg.kv_lens[2] = 129
    pg.last_page_len[0] = 0  # the indices form: a last page of no rows
    out = pg.run_paged("fp8", form="indices")
    assert torch.isnan(out[0].float()).all() and torch.isfinite(out[1:].float()).all()
    with pytest.raises(mlagen.MlagenError, match="page_table"):
        mlagen.check_device_errors()
    pg.last_page_len[0] = 300 - 256
    pg.page_indptr[2] = 10 ** 6  # past kv_indices
    out = pg.run_paged("fp8", form="indices")
    assert torch.isnan(out[1:].float()).all() and torch.isfinite(out[0].float()).all()
    with pytest.raises(mlagen.MlagenError, match="page_table"):
        mlagen.check_device_errors()


def test_bad_page_arguments_are_refused_naming_the_field():
    pg = Paged([300, 200], 16, fresh_seed())
    cases = [
        (dict(page_table=pg.table[:1], page_size=16, kv_lens=pg.kv_lens), "page_table: shape"),
        (dict(page_table=pg.table.to(torch.int64), page_size=16, kv_lens=pg.kv_lens), "page_table: torch.int64"),
        (dict(page_table=pg.table, page_size=12, kv_lens=pg.kv_lens), "page_size=12: expected a power of two"),
        (dict(page_table=pg.table, page_size=512, kv_lens=pg.kv_lens), "page_size=512"),
        (dict(page_table=pg.table, kv_lens=pg.kv_lens), "given without page_size"),
        (dict(page_table=pg.table, page_size=16, kv_lens=pg.kv_lens[:1]), "kv_lens"),
        (dict(page_table=pg.table, page_size=16), "kv_indptr: None"),
        (dict(page_table=pg.table, kv_indices=pg.indices, page_size=16, kv_lens=pg.kv_lens), "exactly one"),
    ]
    for kw, msg in cases:
        with pytest.raises(mlagen.MlagenError, match=msg):
            mlagen.decode(pg.q, pg.cache, pg.qo_indptr, None, pg.config, kv_format="fp8", **kw)
    with pytest.raises(mlagen.MlagenError, match="kv: shape"):  # pages of 32 rows given as pages of 16
        rows = pg.cache["bf16"].shape[0] // 32 * 32
        mlagen.decode(pg.q, {"bf16": pg.cache["bf16"][:rows].reshape(-1, 32, QK)}, pg.qo_indptr, None, pg.config,
                      kv_format="bf16", page_table=pg.table, page_size=16, kv_lens=pg.kv_lens)


def test_paged_cache_as_pages_shape():
    """(num_pages, page_size, 1, 576) and (num_pages, page_size, 576) views of the cache."""
    seed = fresh_seed()
    pg = Paged([500, 64, 333], 32, seed)
    ref = pg.run_paged("bf16", force_generic=True, splits=2)
    for view in (pg.cache["bf16"].reshape(-1, 32, 1, QK), pg.cache["bf16"].reshape(-1, 32, QK)):
        out = mlagen.decode(pg.q, {"bf16": view}, pg.qo_indptr, None, pg.config, kv_format="bf16", page_table=pg.table,
                            page_size=32, kv_lens=pg.kv_lens, force_generic=True, splits=2)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


def test_mxfp4_padded_scales_paged():
    seed = fresh_seed()
    pg = Paged([700, 65, 1], 16, seed, pad_scales=True)
    assert pg.cache["mxfp4"][1].stride(0) == 24
    paged = pg.run_paged("mxfp4", force_generic=True, splits=2)
    contig = pg.run_contig("mxfp4", force_generic=True, splits=2)
    mlagen.check_device_errors()
    assert torch.equal(paged.view(torch.int16), contig.view(torch.int16)), f"seed {seed}"
