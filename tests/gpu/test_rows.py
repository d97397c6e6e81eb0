"""Query rows on the GPU: 8..128 heads and 1..4 query tokens a sequence, causal among them.

A sequence's rows are its n query tokens x H heads (row r = token r // H, head r % H); token
i of n sees the sequence's first len - n + 1 + i KV rows (a row that sees none: zeros, LSE
-inf). Every head count x q_len x format is judged per (token, head) row against float32 on
the values the kernel reads and float64 on the bf16 KV; the causal mask is checked exactly on
small-integer inputs where a key past a row's end would change its output; the specialized
kernels (name tags _h128, _ql2, ...) are checked against the generic kernel; qo_indptr with
fewer tokens than q_len takes the generic kernel; bad q_len / heads are refused naming the
field.
"""
import math
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402

from reference import SM_SCALE, E2M1_GRID, quantize_fp8, rel_l2  # noqa: E402
from tolerances import TOLERANCES, lse_limit  # noqa: E402

pytestmark = pytest.mark.gpu
QK, DV = 576, 512
FORMATS = ("fp8", "bf16", "mxfp4")
HEADS = (8, 16, 32, 64, 128)


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def qo_of(q_lens):
    ip = [0]
    for n in q_lens:
        ip.append(ip[-1] + n)
    return torch.tensor(ip, dtype=torch.int32, device="cuda")


def causal_reference(q, kv, q_lens, kv_lens, dtype):
    """out (total_q, H, 512), lse (total_q, H) in `dtype`; kv (total_kv, 576) the values read."""
    total_q, heads = q.shape[0], q.shape[1]
    out = torch.zeros((total_q, heads, DV), dtype=dtype, device=q.device)
    lse = torch.full((total_q, heads), -math.inf, dtype=dtype, device=q.device)
    qs = ks = 0
    for n, L in zip(q_lens, kv_lens):
        k = kv[ks:ks + L].to(dtype)
        for i in range(n):
            end = max(0, min(L, L - n + 1 + i))
            if end:
                s = q[qs + i].to(dtype) @ k[:end].T * SM_SCALE  # (H, end)
                out[qs + i] = torch.softmax(s, -1) @ k[:end, :DV]
                lse[qs + i] = torch.logsumexp(s, -1)
        qs += n
        ks += L
    return out, lse


def rows_kernel(q_dtype: str, block_m: int, kv_dtype: str = "fp8e4m3fn") -> str:
    """The generic rows-body kernel (registry role 3) of this KV format (fp8 or bf16), q format and
    block_m, by name: the tests below name it, since the runtime gives small problems the 16-row
    kernel instead (codegen/spec.py ROWS_BODY_MIN_WORK) and these are small to stay quick."""
    return next(k["name"] for k in mlagen.kernels() if k["role"] == "generic_rows" and k["q_dtype"] == q_dtype
                and k["kv_dtype"] == kv_dtype and k["name"].endswith(f"_bm{block_m}"))


class Rows:
    """Random q (total_q, H, 576) and KV in every format from one bf16 KV."""

    def __init__(self, heads, q_lens, kv_lens, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.heads, self.q_lens, self.kv_lens, self.batch = heads, list(q_lens), list(kv_lens), len(q_lens)
        total_kv = sum(kv_lens)
        kv = torch.randn((max(1, total_kv), 1, QK), generator=g, device="cuda").to(torch.bfloat16)[:total_kv]
        self.q = torch.randn((sum(q_lens), heads, QK), generator=g, device="cuda").to(torch.bfloat16)
        fp8, scale = quantize_fp8(kv)
        mx, mxs = quant.quantize_mxfp4(kv)
        self.kv = {"bf16": kv, "fp8": (fp8, scale), "mxfp4": (mx, mxs)}
        self.qo_indptr = qo_of(q_lens)
        self.kv_indptr = qo_of(kv_lens)
        uniform = len(set(kv_lens)) == 1
        self.q_len = max(q_lens)
        self.config = dict(batch_size=self.batch, sm_scale=SM_SCALE, num_heads=heads,
                           kv_seq_len=kv_lens[0] if uniform else None)

    def seen(self, fmt):
        if fmt == "fp8":
            fp8, s = self.kv["fp8"]
            return (fp8.float() * s).reshape(-1, QK)
        if fmt == "bf16":
            return self.kv["bf16"].float().reshape(-1, QK)
        d, s = self.kv["mxfp4"]
        return quant.dequantize_mxfp4(d, s, QK).reshape(-1, QK)

    def run(self, fmt, lse=False, **kw):
        out = torch.full((self.q.shape[0], self.heads, DV), float("nan"), dtype=torch.bfloat16, device="cuda")
        res = mlagen.decode(self.q, self.kv, self.qo_indptr, self.kv_indptr, self.config, kv_format=fmt, out=out,
                            q_len=self.q_len, return_lse=lse, **kw)
        torch.cuda.synchronize()
        return res


def check(rows, out, fmt, seed, lse=None):
    path = "fp8e4m3fn" if fmt == "fp8" else fmt
    ref32, lse32 = causal_reference(rows.q, rows.seen(fmt), rows.q_lens, rows.kv_lens, torch.float32)
    ref64, _ = causal_reference(rows.q, rows.kv["bf16"].reshape(-1, QK), rows.q_lens, rows.kv_lens, torch.float64)
    tol32 = TOLERANCES[(path, "same_inputs")]["rel_l2"]
    tol64 = TOLERANCES[(path, "bf16_inputs")]["rel_l2"]
    assert not out.isnan().any(), f"seed {seed}: NaN in the output (a row left unwritten?)"
    empty = ref32.abs().amax(-1) == 0
    assert (out[empty] == 0).all(), f"seed {seed}: rows that see no key must be zeros"
    for r in range(out.shape[0]):
        for h in range(rows.heads):
            if empty[r, h]:
                continue
            e32, e64 = rel_l2(out[r, h], ref32[r, h]), rel_l2(out[r, h], ref64[r, h])
            assert e32 <= 4 * tol32, f"seed {seed} {fmt} row {r} head {h}: rel_l2 {e32:.2e} vs fp32"
            assert e64 <= 4 * tol64, f"seed {seed} {fmt} row {r} head {h}: rel_l2 {e64:.2e} vs fp64"
    if lse is not None:
        lse64 = causal_reference(rows.q.double(), rows.seen(fmt).double(), rows.q_lens, rows.kv_lens, torch.float64)[1]
        fin = torch.isfinite(lse64)
        assert (lse[~fin] == -math.inf).all(), f"seed {seed}: LSE of rows with no key must be -inf"
        assert (lse[fin].double() - lse64[fin]).abs().max().item() < 2e-2, f"seed {seed}: LSE off"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("q_len", [1, 2, 3, 4])
@pytest.mark.parametrize("heads", HEADS)
def test_rows_match_float64(heads, q_len, fmt):
    """Lengths around tile edges (64k + 1: a last tile some tokens cannot see), one shorter than
    q_len (tokens that see nothing), one long enough for several splits."""
    seed = fresh_seed()
    kv_lens = [1300, 65, 2, 129][: 4 if heads <= 32 else 3]
    rows = Rows(heads, [q_len] * len(kv_lens), kv_lens, seed)
    out, lse = rows.run(fmt, lse=True)
    check(rows, out, fmt, seed, lse)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("splits", [1, 5])
@pytest.mark.parametrize("heads,q_len", [(8, 1), (8, 3), (128, 2), (32, 4)])
def test_rows_splits(heads, q_len, splits, fmt):
    """Forced splits: a causal row can see no key in a whole split (the last one here)."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * 2, [577, 260], seed)
    out, lse = rows.run(fmt, lse=True, force_generic=True, splits=splits)
    check(rows, out, fmt, seed, lse)


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_uniform_query_lengths(fmt):
    seed = fresh_seed()
    rows = Rows(16, [1, 3, 2, 4], [700, 64, 3000, 5], seed)
    out, lse = rows.run(fmt, lse=True)
    assert mlagen.last_kernel()["generic"]
    check(rows, out, fmt, seed, lse)


def exact_causal_inputs(heads, q_len, kv_lens, seed, grid):
    """Row (token i, head h) scores 0 on exactly 8 keys it may see and on every key it may not,
    -64 * big / 24 elsewhere (exp underflows to 0): its output is the mean of those 8 V rows,
    exact in every format, and a key past its end would change it."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch, total = len(kv_lens), sum(kv_lens)
    if grid == "int":
        kv = torch.randint(-8, 9, (total, QK), generator=g, device="cuda").float()
        big = 448.0
    else:
        vals = torch.tensor(E2M1_GRID, device="cuda")
        kv = vals[torch.randint(0, len(E2M1_GRID), (total, QK), generator=g, device="cuda")]
        kv = kv * (torch.randint(0, 2, kv.shape, generator=g, device="cuda").float() * 2 - 1)
        big = 384.0
    kv[:, 512:] = -big  # every score -64 * big unless set to 0 below
    q = torch.zeros((batch * q_len, heads, QK), device="cuda")
    expect = torch.empty((batch * q_len, heads, DV), device="cuda")
    start, picks_of = 0, {}
    for b, L in enumerate(kv_lens):
        for i in range(q_len):
            end = L - q_len + 1 + i
            assert end >= 8
            for h in range(heads):
                d = 512 + 16 * i + h % 16  # the row's own rope dim (heads h, h + 16, ... share it)
                q[b * q_len + i, h, d] = 64.0
                if h < 16:
                    pick = torch.randperm(end, generator=g, device="cuda")[:8] + start
                    kv[pick, d] = 0.0
                    kv[start + end:start + L, d] = 0.0  # keys past the row's end: a wrong mask sees them
                    picks_of[(b, i, h)] = pick
                else:
                    picks_of[(b, i, h)] = picks_of[(b, i, h % 16)]
        start += L
    for (b, i, h), pick in picks_of.items():
        expect[b * q_len + i, h] = kv[pick, :DV].mean(0)
    return q.to(torch.bfloat16), kv.reshape(total, 1, QK), expect.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("heads,q_len", [(16, 4), (128, 2), (8, 3), (64, 4), (16, 2), (8, 4)])
def test_causal_mask_exact(heads, q_len, fmt):
    seed = fresh_seed()
    kv_lens = [129, 64, 1000, 13]
    q, kv, expect = exact_causal_inputs(heads, q_len, kv_lens, seed, "int" if fmt != "mxfp4" else "e2m1")
    if fmt == "bf16":
        kv_data = kv.to(torch.bfloat16)
    elif fmt == "fp8":
        kv_data = (kv.to(torch.float8_e4m3fn), torch.ones(1, device="cuda"))
    else:
        kv_data = quant.quantize_mxfp4(kv.to(torch.bfloat16))
        assert torch.equal(quant.dequantize_mxfp4(*kv_data, QK).reshape(kv.shape), kv), "e2m1 grid not exact"
    config = dict(batch_size=len(kv_lens), sm_scale=SM_SCALE, num_heads=heads)
    for splits in (0, 3):
        out = torch.full(expect.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        mlagen.decode(q, {fmt: kv_data}, qo_of([q_len] * len(kv_lens)), qo_of(kv_lens), config, kv_format=fmt,
                      out=out, q_len=q_len, splits=splits, force_generic=splits > 0)
        torch.cuda.synchronize()
        bad = (out.float() != expect.float()).any(-1).nonzero().tolist()
        assert not bad, f"seed {seed} {fmt} splits {splits}: (row, head) not exact: {bad[:8]}"


DTYPE_FMT = {"fp8e4m3fn": "fp8", "bf16": "bf16", "mxfp4": "mxfp4"}
DTYPE_KV = {v: k for k, v in DTYPE_FMT.items()}


@pytest.mark.parametrize("tag", ["h128", "h64", "h32", "ql2", "ql4"])
def test_specialized_row_kernels_match_generic(tag):
    """Every specialized kernel with the tag: selected for its key, and the same as the generic
    kernel on the same inputs (and float64 on two of its sequences)."""
    specs = [k for k in mlagen.kernels() if k["role"] == "specialized" and tag in k["name"].split("_")]
    assert specs, f"no specialized kernel tagged _{tag} in this build"
    heads = int(tag[1:]) if tag.startswith("h") else 16
    q_len = int(tag[2:]) if tag.startswith("ql") else 1
    for spec in specs:
        seed = fresh_seed()
        rows = Rows(heads, [q_len] * spec["batch"], [spec["kv_len"]] * spec["batch"], seed)
        fmt = DTYPE_FMT[spec["kv_dtype"]]
        kw = dict(q_dtype="fp8") if spec["q_dtype"] == "fp8" else {}
        out = rows.run(fmt, **kw)
        assert mlagen.last_kernel()["name"] == spec["name"], f"{mlagen.last_kernel()['name']} ran, not {spec['name']}"
        gen = rows.run(fmt, force_generic=True, **kw)
        assert mlagen.last_kernel()["generic"]
        err = rel_l2(out, gen)
        assert err < 5e-3, f"seed {seed} {spec['name']}: rel_l2 vs the generic kernel {err:.2e}"
        if not kw:  # float64 on two sequences of the same length through the generic kernel
            sub = Rows(heads, [q_len] * 2, [spec["kv_len"]] * 2, seed)
            check(sub, sub.run(fmt, force_generic=True), fmt, seed)


def test_rows_body_matches_float64():
    """Every kernel of the rows body (32 or 64 query rows a block, spec block_m; fp8 KV, and bf16 KV
    at 128 / 64 / 32 heads) on fresh inputs of its own shape: the whole output within its KV
    format's same-inputs tolerance of float32 on the
    values it reads, every (token, head) row within 4x that and within 4x the bf16-inputs one of
    float64, LSE against float64 (check()). An fp8 q is the task's per-tensor recipe, so its
    reference takes the same dequantized q."""
    specs = [k for k in mlagen.kernels() if k["role"] == "specialized" and {"bm64", "bm32"} & set(k["name"].split("_"))]
    assert len(specs) >= 12 and any("bm32" in k["name"] for k in specs), \
        f"rows-body kernels in this build: {[k['name'] for k in specs]}"
    bf16 = {k["num_heads"] for k in specs if k["kv_dtype"] == "bf16"}
    assert bf16 >= {32, 64, 128}, f"bf16-KV rows-body kernels of these head counts in this build: {sorted(bf16)}"
    for spec in specs:
        seed = fresh_seed()
        fmt = DTYPE_FMT[spec["kv_dtype"]]
        tol = TOLERANCES[(spec["kv_dtype"], "same_inputs")]["rel_l2"]
        heads, q_len = spec["num_heads"], spec["q_len"]
        rows = Rows(heads, [q_len] * spec["batch"], [spec["kv_len"]] * spec["batch"], seed)
        kw = dict(q_dtype="fp8") if spec["q_dtype"] == "fp8" else {}
        out, lse = rows.run(fmt, lse=True, **kw)
        assert mlagen.last_kernel()["name"] == spec["name"], f"{mlagen.last_kernel()['name']} ran, not {spec['name']}"
        if kw:  # the q the kernel multiplies: fp8 x scale
            q8, qs = quantize_fp8(rows.q)
            rows.q = (q8.float() * qs).to(torch.float32)
        ref32, _ = causal_reference(rows.q, rows.seen(fmt), rows.q_lens, rows.kv_lens, torch.float32)
        err = rel_l2(out, ref32)
        assert err <= tol, f"seed {seed} {spec['name']}: rel_l2 {err:.2e} vs float32 (tolerance {tol})"
        if not kw:
            check(rows, out, fmt, seed, lse)
        else:
            lse64 = causal_reference(rows.q.double(), rows.seen(fmt).double(), rows.q_lens, rows.kv_lens,
                                     torch.float64)[1]
            assert (lse.double() - lse64).abs().max().item() < 2e-2, f"seed {seed} {spec['name']}: LSE off"
        print(f"{spec['name']}: rel_l2 {err:.2e} vs float32 (seed {seed})")


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("heads,q_len,block_m", [(32, 1, 32), (16, 2, 32), (8, 4, 32), (32, 3, 32), (64, 1, 64),
                                                 (16, 4, 64)])
def test_generic_rows_bodies_match_float64(heads, q_len, block_m, q_dtype):
    """Shapes no kernel is specialized for: heads x q_len a multiple of 64 takes the generic 64-row
    body, of 32 the generic 32-row one (registry role 3), with lengths around tile edges (a last
    tile some tokens cannot see, a sequence shorter than q_len) and a length that splits; judged
    per (token, head) row (check()), the fp8 q against the q it multiplies."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * 5, [1300, 65, 2, 129, 777], seed)
    kw = dict(q_dtype="fp8") if q_dtype == "fp8" else {}
    out, lse = rows.run("fp8", lse=True, kernel=rows_kernel(q_dtype, block_m), **kw)
    k = mlagen.last_kernel()
    assert k["role"] == "generic_rows" and k["name"].endswith(f"_bm{block_m}"), k
    if kw:
        q8, qs = quantize_fp8(rows.q)
        rows.q = (q8.float() * qs).to(torch.float32)
        ref32, _ = causal_reference(rows.q, rows.seen("fp8"), rows.q_lens, rows.kv_lens, torch.float32)
        tol = TOLERANCES[("fp8e4m3fn", "same_inputs")]["rel_l2"]
        assert not out.isnan().any(), f"seed {seed}: NaN in the output"
        for r in range(out.shape[0]):
            for h in range(heads):
                if ref32[r, h].abs().amax() == 0:
                    assert (out[r, h] == 0).all(), f"seed {seed}: row {r} head {h} sees no key, not zeros"
                    continue
                e = rel_l2(out[r, h], ref32[r, h])
                assert e <= 4 * tol, f"seed {seed} {k['name']} row {r} head {h}: rel_l2 {e:.2e} vs float32"
        lse64 = causal_reference(rows.q.double(), rows.seen("fp8").double(), rows.q_lens, rows.kv_lens,
                                 torch.float64)[1]
        fin = torch.isfinite(lse64)
        assert (lse[~fin] == -math.inf).all(), f"seed {seed}: LSE of rows with no key must be -inf"
        assert (lse[fin].double() - lse64[fin]).abs().max().item() < 2e-2, f"seed {seed} {k['name']}: LSE off"
    else:
        check(rows, out, "fp8", seed, lse)


@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("q_len", [1, 2, 3, 4])
@pytest.mark.parametrize("heads", [32, 64, 128])
def test_bf16_rows_body_matches_float64(heads, q_len, q_dtype):
    """bf16 KV through the generic rows body (64 rows a block where 64 divide heads x q_len, else
    32): lengths around tile edges (a last tile some tokens cannot see, a sequence shorter than
    q_len, a short last tile by cp.async) and one that splits; every (token, head) row against
    float64 on the bf16 KV (check()), an fp8 q against the q it multiplies (float32, per row)."""
    seed = fresh_seed()
    block_m = 64 if heads * q_len % 64 == 0 else 32
    rows = Rows(heads, [q_len] * 4, [1300, 65, 2, 777], seed)
    kw = dict(q_dtype="fp8") if q_dtype == "fp8" else {}
    out, lse = rows.run("bf16", lse=True, kernel=rows_kernel(q_dtype, block_m, "bf16"), **kw)
    k = mlagen.last_kernel()
    assert k["role"] == "generic_rows" and k["kv_dtype"] == "bf16" and k["name"].endswith(f"_bm{block_m}"), k
    if not kw:
        check(rows, out, "bf16", seed, lse)
        return
    q8, qs = quantize_fp8(rows.q)
    rows.q = (q8.float() * qs).to(torch.float32)
    ref32, _ = causal_reference(rows.q, rows.seen("bf16"), rows.q_lens, rows.kv_lens, torch.float32)
    tol = TOLERANCES[("bf16", "same_inputs")]["rel_l2"]
    assert not out.isnan().any(), f"seed {seed}: NaN in the output"
    for r in range(out.shape[0]):
        for h in range(heads):
            if ref32[r, h].abs().amax() == 0:
                assert (out[r, h] == 0).all(), f"seed {seed}: row {r} head {h} sees no key, not zeros"
                continue
            e = rel_l2(out[r, h], ref32[r, h])
            assert e <= 4 * tol, f"seed {seed} {k['name']} row {r} head {h}: rel_l2 {e:.2e} vs float32"
    lse64 = causal_reference(rows.q.double(), rows.seen("bf16").double(), rows.q_lens, rows.kv_lens,
                             torch.float64)[1]
    fin = torch.isfinite(lse64)
    assert (lse[~fin] == -math.inf).all(), f"seed {seed}: LSE of rows with no key must be -inf"
    assert (lse[fin].double() - lse64[fin]).abs().max().item() < 2e-2, f"seed {seed} {k['name']}: LSE off"


@pytest.mark.parametrize("heads,block_m", [(128, 64), (64, 64), (32, 32)])
def test_bf16_kv_dispatches_to_the_rows_body(heads, block_m):
    """bf16 KV at 32..128 heads: 64x8192 goes to its specialized rows-body kernel, a shape without
    one (48x4096, enough work for the rows body) to the generic bf16 rows body; both within the
    per-row tolerances of float64 on two of their sequences."""
    seed = fresh_seed()
    for batch, kv_len, role in ((64, 8192, "specialized"), (48, 4096, "generic_rows")):
        rows = Rows(heads, [1] * batch, [kv_len] * batch, seed)
        out = rows.run("bf16")
        k = mlagen.last_kernel()
        assert k["role"] == role and k["kv_dtype"] == "bf16" and k["name"].endswith(f"_bm{block_m}"), k
        sub = Rows(heads, [1] * 2, [kv_len] * 2, seed)
        sub.q, sub.kv = rows.q[:2], {"bf16": rows.kv["bf16"][:2 * kv_len]}
        check(sub, out[:2], "bf16", seed)


@pytest.mark.parametrize("heads,q_len,batch,kv_len", [(128, 1, 2, 1000), (64, 1, 3, 2900), (16, 4, 3, 1000),
                                                      (16, 1, 4, 2100)])
def test_rows_rescale_when_scores_grow_along_the_sequence(heads, q_len, batch, kv_len):
    """Scores that rise by ~40 (log2 units) along each sequence: q and KV share one direction d,
    KV row t carries (t / len) x 28 of it, so the running maxima grow many times over the KV,
    in every split. Whatever a body does to rescale (every tile, or only when a score passes its
    base by a margin) must stay exact here, judged per (token, head) row like the rest."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * batch, [kv_len] * batch, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    d = torch.randn(QK, generator=g, device="cuda")
    d = d / d.norm()
    ramp = torch.cat([torch.arange(kv_len, device="cuda") / kv_len] * batch) * 28.0
    kv = rows.kv["bf16"].float().reshape(-1, QK) * 0.5 + ramp[:, None] * d
    rows.q = (rows.q.float() + 24.0 * d).to(torch.bfloat16)
    kv = kv.to(torch.bfloat16).reshape(-1, 1, QK)
    rows.kv["bf16"] = kv
    rows.kv["fp8"] = quantize_fp8(kv)
    rows.kv["mxfp4"] = quant.quantize_mxfp4(kv)
    for fmt in ("fp8", "bf16"):
        out, lse = rows.run(fmt, lse=True)
        name = mlagen.last_kernel()["name"]
        check(rows, out, fmt, seed)
        lse64 = causal_reference(rows.q.double(), rows.seen(fmt).double(), rows.q_lens, rows.kv_lens, torch.float64)[1]
        err = (lse.double() - lse64).abs()
        lim = lse_limit(fmt == "fp8", lse64)  # tests/tolerances.py: fp8 KV's e4m3 sums grow with |LSE|
        print(f"{name}: LSE max error {err.max().item():.3e} at |LSE| up to {lse64.abs().max().item():.1f} (seed {seed})")
        assert (err <= lim).all(), f"seed {seed} {name}: LSE off by {err.max().item():.3e}"


def paged_copy(rows, page, seed, spare=3, fmt="fp8"):
    """rows' fp8 (or bf16, or mxfp4) KV scattered into a cache of pages (random order, spare pages of other
    random rows): the block table (unused entries out of range), kv_lens, and FlashInfer's indices
    form."""
    rng = random.Random(seed)
    need = [math.ceil(L / page) for L in rows.kv_lens]
    num_pages = sum(need) + spare
    pool = list(range(num_pages))
    rng.shuffle(pool)
    lists = [[pool.pop() for _ in range(n)] for n in need]
    fp8, scale = rows.kv["fp8"] if fmt == "fp8" else (rows.kv["bf16"], None)
    g = torch.Generator(device="cuda").manual_seed(seed + 7)
    cache = torch.randn((num_pages * page, 1, QK), generator=g, device="cuda").to(torch.bfloat16)
    cache = quantize_fp8(cache)[0] if fmt == "fp8" else cache  # mxfp4: the bf16 cache, quantized below
    start = 0
    for b, L in enumerate(rows.kv_lens):
        for t0 in range(0, L, page):
            n = min(page, L - t0)
            pg = lists[b][t0 // page]
            cache[pg * page:pg * page + n] = fp8[start + t0:start + t0 + n]
        start += L
    table = torch.full((rows.batch, max(need) + 1), 1 << 30, dtype=torch.int32)
    for b, pl in enumerate(lists):
        table[b, :len(pl)] = torch.tensor(pl, dtype=torch.int32)
    indices = torch.tensor([p for pl in lists for p in pl], dtype=torch.int32, device="cuda")
    page_indptr = qo_of([len(pl) for pl in lists])
    last = torch.tensor([(L - 1) % page + 1 if L else 0 for L in rows.kv_lens], dtype=torch.int32, device="cuda")
    if fmt == "mxfp4":  # quantized a row at a time: the sequences' rows quantize as rows.kv["mxfp4"] does
        cache, scale = quant.quantize_mxfp4(cache)
    return (cache, scale) if fmt in ("fp8", "mxfp4") else cache, table.cuda(), \
        torch.tensor(rows.kv_lens, dtype=torch.int32, device="cuda"), (indices, page_indptr, last)


@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("page", [64, 256])
@pytest.mark.parametrize("heads,q_len,block_m", [(128, 1, 64), (64, 2, 64), (16, 4, 64), (32, 1, 32), (16, 2, 32),
                                                 (8, 4, 32), (128, 3, 64)])
def test_rows_body_on_pages_is_bit_identical_to_contiguous(heads, q_len, block_m, page, fmt):
    """Pages of a tile (64 rows) or more: the generic rows body reads the tiles through the block
    table (and through FlashInfer's indices) with the bulk tensor copy as on contiguous rows, so the
    output is bit-identical to the contiguous call with the same splits, and within the per-row
    tolerances of float64; unused table entries hold page ids past the cache. fp8 and bf16 KV."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * 4, [1300, 65, 2, 700], seed)
    kv, table, kv_lens, (indices, page_indptr, last) = paged_copy(rows, page, seed, fmt=fmt)
    rk = rows_kernel("bf16", block_m, DTYPE_KV[fmt])
    for splits in (1, 3):
        out_c, lse_c = rows.run(fmt, lse=True, kernel=rk, splits=splits)
        outs = []
        for form in ("table", "indices"):
            out = torch.full_like(out_c, float("nan"))
            if form == "table":
                res = mlagen.decode(rows.q, {fmt: kv}, rows.qo_indptr, None, rows.config, kv_format=fmt, out=out,
                                    q_len=q_len, page_table=table, page_size=page, kv_lens=kv_lens, return_lse=True,
                                    kernel=rk, splits=splits)
            else:
                res = mlagen.decode(rows.q, {fmt: kv}, rows.qo_indptr, page_indptr, rows.config, kv_format=fmt,
                                    out=out, q_len=q_len, kv_indices=indices, kv_last_page_len=last, page_size=page,
                                    return_lse=True, kernel=rk, splits=splits)
            torch.cuda.synchronize()
            k = mlagen.last_kernel()
            assert k["role"] == "generic_rows" and k["name"].endswith(f"_bm{block_m}") and k["splits"] == splits, k
            mlagen.check_device_errors()
            outs.append(res)
        for (out_p, lse_p), form in zip(outs, ("table", "indices")):
            assert torch.equal(out_p.view(torch.int16), out_c.view(torch.int16)), \
                f"seed {seed} page {page} splits {splits} {form}: paged differs from contiguous " \
                f"(max |d| {(out_p.float() - out_c.float()).abs().max().item():.3g})"
            assert torch.equal(lse_p, lse_c), f"seed {seed} page {page} splits {splits} {form}: LSE differs"
        check(rows, outs[0][0], fmt, seed, outs[0][1])


def _mxfp4_rows_pair(rows, q_dtype):
    """The mxfp4 rows kernel and the bf16 rows kernel (32 rows a block, the one block the mxfp4 rows
    body has), and rows whose bf16 KV is the mxfp4 rows' exact expansion."""
    d, sc = rows.kv["mxfp4"]
    rows.kv["bf16"] = quant.dequantize_mxfp4(d, sc, QK).to(torch.bfloat16).reshape(-1, 1, QK)
    return rows_kernel(q_dtype, 32, "mxfp4"), rows_kernel(q_dtype, 32, "bf16")


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("heads,q_len", [(32, 1), (32, 3), (64, 2), (128, 1), (128, 4), (16, 2), (8, 4)])
def test_mxfp4_rows_body_is_the_bf16_body_on_its_expansion(heads, q_len, q_dtype, splits):
    """mxfp4 KV through the rows body (the expanded policy: each O thread reads its blocks of the next
    tile into registers and expands them into the bf16 tile, exactly) computes what the bf16 rows body
    computes on the dequantized rows: bit-identical output and LSE, same block, splits and q; lengths
    around tile edges (a short last tile, a sequence shorter than q_len); and, with a bf16 q, every
    (token, head) row within the mxfp4 tolerances of float32 and float64 (check())."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * 4, [1300, 65, 2, 777], seed)
    mk, bk = _mxfp4_rows_pair(rows, q_dtype)
    kw = dict(q_dtype="fp8") if q_dtype == "fp8" else {}
    out_m, lse_m = rows.run("mxfp4", lse=True, kernel=mk, splits=splits, **kw)
    k = mlagen.last_kernel()
    assert k["role"] == "generic_rows" and k["kv_dtype"] == "mxfp4" and k["splits"] == splits, k
    mlagen.check_device_errors()
    out_b, lse_b = rows.run("bf16", lse=True, kernel=bk, splits=splits, **kw)
    assert not out_m.isnan().any(), f"seed {seed}: NaN in the output (a row left unwritten?)"
    assert torch.equal(out_m.view(torch.int16), out_b.view(torch.int16)), \
        f"seed {seed} {mk}: differs from the bf16 rows body on the expanded rows " \
        f"(max |d| {(out_m.float() - out_b.float()).abs().max().item():.3g})"
    assert torch.equal(lse_m, lse_b), f"seed {seed} {mk}: LSE differs from the bf16 rows body's"
    if not kw:
        check(rows, out_m, "mxfp4", seed, lse_m)


def test_mxfp4_rows_body_expands_every_scale_exactly():
    """Random packed bytes with E8M0 scales over 0..140 (tiny blocks in bf16's subnormals, 0.5 x
    2^-127 the least; values up to 6 x 2^13): the rows body's expansion equals torch's dequantization
    rounded to bf16 (exact), seen as the bf16 rows body's output on those rows, bit for bit."""
    seed = fresh_seed()
    rows = Rows(64, [1] * 3, [640, 129, 1000], seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 3)
    total = sum(rows.kv_lens)
    data = torch.randint(0, 256, (total, 1, QK // 2), generator=g, device="cuda", dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(0, 141, (total, QK // 32), generator=g, device="cuda", dtype=torch.int32).to(torch.uint8)
    scales[::7, :4] = torch.tensor([0, 1, 2, 3], dtype=torch.uint8, device="cuda")
    rows.kv["mxfp4"] = (data, scales)
    rows.q = (rows.q.float() * 1e-3).to(torch.bfloat16)
    for q_dtype in ("bf16", "fp8"):
        mk, bk = _mxfp4_rows_pair(rows, q_dtype)
        kw = dict(q_dtype="fp8") if q_dtype == "fp8" else {}
        out_m, lse_m = rows.run("mxfp4", lse=True, kernel=mk, splits=2, **kw)
        out_b, lse_b = rows.run("bf16", lse=True, kernel=bk, splits=2, **kw)
        assert torch.equal(out_m.view(torch.int16), out_b.view(torch.int16)), \
            f"seed {seed} {q_dtype} q: the expansion differs from torch's dequantization"
        assert torch.equal(lse_m, lse_b), f"seed {seed} {q_dtype} q: LSE differs"


@pytest.mark.parametrize("page", [16, 64, 256])
@pytest.mark.parametrize("heads,q_len", [(128, 1), (32, 2), (64, 3)])
def test_mxfp4_rows_body_on_pages_is_bit_identical_to_contiguous(heads, q_len, page):
    """Paged mxfp4 (a block table and FlashInfer's indices; pages of a tile or more, and of 16, which
    the expanded copies read row by row like any other) through the mxfp4 rows body: bit-identical to
    the contiguous call with the same splits; a page id outside the cache NaNs only its sequence and
    sets the error word."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * 4, [1300, 65, 2, 700], seed)
    kv, table, kv_lens, (indices, page_indptr, last) = paged_copy(rows, page, seed, fmt="mxfp4")
    mk = rows_kernel("bf16", 32, "mxfp4")
    for splits in (1, 3):
        out_c, lse_c = rows.run("mxfp4", lse=True, kernel=mk, splits=splits)
        for form in ("table", "indices"):
            out = torch.full_like(out_c, float("nan"))
            if form == "table":
                out_p, lse_p = mlagen.decode(rows.q, {"mxfp4": kv}, rows.qo_indptr, None, rows.config,
                                             kv_format="mxfp4", out=out, q_len=q_len, page_table=table,
                                             page_size=page, kv_lens=kv_lens, return_lse=True, kernel=mk,
                                             splits=splits)
            else:
                out_p, lse_p = mlagen.decode(rows.q, {"mxfp4": kv}, rows.qo_indptr, page_indptr, rows.config,
                                             kv_format="mxfp4", out=out, q_len=q_len, kv_indices=indices,
                                             kv_last_page_len=last, page_size=page, return_lse=True, kernel=mk,
                                             splits=splits)
            torch.cuda.synchronize()
            k = mlagen.last_kernel()
            assert k["name"] == mk and k["splits"] == splits, k
            mlagen.check_device_errors()
            assert torch.equal(out_p.view(torch.int16), out_c.view(torch.int16)), \
                f"seed {seed} page {page} splits {splits} {form}: paged differs from contiguous " \
                f"(max |d| {(out_p.float() - out_c.float()).abs().max().item():.3g})"
            assert torch.equal(lse_p, lse_c), f"seed {seed} page {page} splits {splits} {form}: LSE differs"
    check(rows, out_c, "mxfp4", seed, lse_c)
    table[3, 2] = kv[0].shape[0] // page + 3  # sequence 3's third page: outside the cache
    out = torch.full_like(out_c, float("nan"))
    out_p, lse_p = mlagen.decode(rows.q, {"mxfp4": kv}, rows.qo_indptr, None, rows.config, kv_format="mxfp4",
                                 out=out, q_len=q_len, page_table=table, page_size=page, kv_lens=kv_lens,
                                 return_lse=True, kernel=mk, splits=3)
    torch.cuda.synchronize()
    b3 = slice(3 * q_len, 4 * q_len)
    assert torch.isnan(out_p[b3].float()).all() and torch.isnan(lse_p[b3]).all(), f"seed {seed}: sequence 3 must be NaN"
    rest = slice(0, 3 * q_len)
    assert torch.equal(out_p[rest].view(torch.int16), out_c[rest].view(torch.int16)), \
        f"seed {seed}: sequences 0..2 changed with sequence 3's bad page id"
    with pytest.raises(mlagen.MlagenError, match="page_table holds a page id outside"):
        mlagen.check_device_errors()


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("heads,q_len", [(128, 2), (32, 1)])
def test_rows_body_bad_page_id_flags_only_its_sequence(heads, q_len, splits):
    """A page id outside the cache in one sequence's list: that sequence's rows NaN (LSE too), the
    error word set, every other sequence bit-identical to the call with a good table."""
    seed = fresh_seed()
    rows = Rows(heads, [q_len] * 3, [300, 700, 129], seed)
    kv, table, kv_lens, _ = paged_copy(rows, 64, seed)

    def run():
        out = torch.full((rows.q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        res = mlagen.decode(rows.q, {"fp8": kv}, rows.qo_indptr, None, rows.config, kv_format="fp8", out=out,
                            q_len=q_len, page_table=table, page_size=64, kv_lens=kv_lens, return_lse=True,
                            kernel=rows_kernel("bf16", 64 if heads * q_len % 64 == 0 else 32), splits=splits)
        torch.cuda.synchronize()
        assert mlagen.last_kernel()["role"] == "generic_rows", mlagen.last_kernel()
        return res
    good, good_lse = run()
    mlagen.check_device_errors()
    table[1, 5] = kv[0].shape[0] // 64 + 3
    out, lse = run()
    b1 = slice(q_len, 2 * q_len)
    assert torch.isnan(out[b1].float()).all() and torch.isnan(lse[b1]).all(), f"seed {seed}: sequence 1 must be NaN"
    for b in (0, 2):
        sl = slice(b * q_len, (b + 1) * q_len)
        assert torch.equal(out[sl].view(torch.int16), good[sl].view(torch.int16)), f"seed {seed}: sequence {b} changed"
    with pytest.raises(mlagen.MlagenError, match="page_table holds a page id outside"):
        mlagen.check_device_errors()


def test_bad_rows_are_refused_naming_the_field():
    rows = Rows(16, [2, 2], [100, 100], 1)
    with pytest.raises(mlagen.MlagenError, match="q_len"):
        mlagen.decode(rows.q, rows.kv, rows.qo_indptr, rows.kv_indptr, rows.config, kv_format="fp8", q_len=5)
    with pytest.raises(mlagen.MlagenError, match="q_len"):
        mlagen.decode(rows.q, rows.kv, rows.qo_indptr, rows.kv_indptr, rows.config, kv_format="fp8", q_len=1)
    q12 = torch.randn((4, 12, QK), device="cuda").to(torch.bfloat16)
    with pytest.raises(mlagen.MlagenError, match="heads"):
        mlagen.decode(q12, rows.kv, rows.qo_indptr, rows.kv_indptr, dict(rows.config, num_heads=12), kv_format="fp8")
    with pytest.raises(mlagen.MlagenError, match="num_heads"):
        mlagen.decode(rows.q, rows.kv, rows.qo_indptr, rows.kv_indptr, dict(rows.config, num_heads=32), kv_format="fp8")


def test_query_lengths_past_q_len_are_flagged():
    """qo_indptr giving a sequence more tokens than q_len: its rows NaN and the error word set."""
    rows = Rows(16, [2, 2], [300, 300], 3)
    qo = torch.tensor([0, 3, 4], dtype=torch.int32, device="cuda")  # 3 tokens > q_len 2
    out = mlagen.decode(rows.q, rows.kv, qo, rows.kv_indptr, dict(rows.config, kv_seq_len=None), kv_format="fp8",
                        q_len=2)
    torch.cuda.synchronize()
    assert out[0].isnan().all()
    with pytest.raises(mlagen.MlagenError, match="QO_INDPTR|qo_indptr"):
        mlagen.check_device_errors()


@pytest.mark.parametrize("splits", [0, 3])
def test_empty_query_range_is_flagged_without_touching_its_neighbours(splits):
    """A sequence given 0 tokens by qo_indptr (generic kernel, q_len 2) is flagged and writes no
    row: its range starts at the next sequence's first row, which must stay that sequence's
    (before the fix the flagged sequence wrote NaN there, racing the owner)."""
    seed = fresh_seed()
    rows = Rows(16, [2, 2, 2], [300, 300, 300], seed)
    qo = torch.tensor([0, 2, 2, 4], dtype=torch.int32, device="cuda")  # sequence 1: no tokens
    q = rows.q[:4].contiguous()
    config = dict(rows.config, kv_seq_len=None)
    for _ in range(5):  # block order varies: repeat
        out = torch.full((4, 16, DV), float("nan"), dtype=torch.bfloat16, device="cuda")
        mlagen.decode(q, rows.kv, qo, rows.kv_indptr, config, kv_format="fp8", q_len=2, out=out, splits=splits,
                      force_generic=True)
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all(), f"seed {seed}: a neighbour's row was overwritten or left unwritten"
        with pytest.raises(mlagen.MlagenError, match="QO_INDPTR|qo_indptr"):
            mlagen.check_device_errors()
    sub = Rows(16, [2, 2], [300, 300], seed)  # the two real sequences (0 and 2) against float64
    sub.q = q
    sub.kv = {"fp8": (rows.kv["fp8"][0][list(range(300)) + list(range(600, 900))], rows.kv["fp8"][1]),
              "bf16": rows.kv["bf16"][list(range(300)) + list(range(600, 900))]}
    check(sub, out, "fp8", seed)
