"""GPU tests of the split merge inside the decode launch: the sm90a 16-row kernels (mma.sync and
warpgroup bodies) merge their own splits (runtime/include/mlagen/device/mla_common.cuh
merge_own_splits: the last split of a (sequence, row group) to finish, counted in the workspace,
combines the partials; codegen/spec.py merges_own_splits), so no `_combine` entry runs; the rows
body keeps its combine kernel (the same merge_row).

Every sm90a kernel that splits, specialized (contiguous and paged) and generic (each body, splits
forced; the rows body's through its combine), against float64 on the inputs the kernel sees, per
(token, head) row, and its LSE; the same plan called back to back without a synchronization (the
last split resets the counters for the next call); one plan on two streams at once (a workspace
each) and two plans interleaved on one stream. Fresh random inputs each test (the seed in every
message); outputs poisoned with NaN.
"""
import json
import math
import os
import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402

from reference import make_inputs  # noqa: E402
from tolerances import TOLERANCES  # noqa: E402
from codegen.spec import KernelSpec  # noqa: E402
from tests.gpu.test_paged import Paged  # noqa: E402
from tests.gpu.test_rows import Rows, causal_reference  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
pytestmark = pytest.mark.gpu
FMT = {"fp8e4m3fn": "fp8", "bf16": "bf16", "mxfp4": "mxfp4"}
LSE_TOL = {"bf16": 2e-3, "fp8": 2e-2, "mxfp4": 2e-2}  # as tests/gpu/test_paged.py (q in ~8 bits on the fp8 paths)


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def _sm90a():
    with open(os.path.join(ROOT, "generated", "manifest.json")) as f:
        return [KernelSpec.parse(k["name"]) for k in json.load(f)["kernels"] if k["arch"] == "sm90a"]


def _split_specialized(paged):
    return [s.name for s in _sm90a() if not s.generic and s.splits > 1 and bool(s.page_size) == paged]


def _generic():
    return [s.name for s in _sm90a() if s.generic]


def _q_seen(q, q_dtype):
    if q_dtype == "bf16":
        return q.double()
    q8, qs = quant.quantize_q_fp8(q)
    return q8.double() * qs.double()


def _check_rows(rows, out, lse, fmt, q_dtype, seed, name):
    """out and lse against float64 on the q and KV values the kernel multiplies, per (token, head)
    row: 4x the whole-output bound of the format (a wrong or unwritten row is ~1 off)."""
    ref, lse64 = causal_reference(_q_seen(rows.q, q_dtype), rows.seen(fmt).double(), rows.q_lens, rows.kv_lens,
                                  torch.float64)
    bound = 4 * TOLERANCES[("fp8e4m3fn" if fmt == "fp8" else fmt, "same_inputs")]["rel_l2"]
    assert not out.isnan().any(), f"seed {seed} {name}: NaN in the output (a row left unwritten?)"
    live = lse64.isfinite()
    assert (out[~live] == 0).all(), f"seed {seed} {name}: rows that see no key must be zeros"
    o, r = out.double()[live], ref[live]
    err = (o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= bound, f"seed {seed} {name}: worst row rel_l2 {worst:.2e} (bound {bound:.1e})"
    assert (lse[~live] == -math.inf).all(), f"seed {seed} {name}: LSE of rows with no key must be -inf"
    lerr = (lse[live].double() - lse64[live]).abs().max().item() if live.any() else 0.0
    assert lerr <= LSE_TOL[fmt], f"seed {seed} {name}: |lse - float64| {lerr:.2e}"


@pytest.mark.parametrize("name", _split_specialized(paged=False))
def test_specialized_split_kernel_rows_and_lse(name):
    spec = KernelSpec.parse(name)
    fmt, seed = FMT[spec.kv_dtype], fresh_seed()
    rows = Rows(spec.num_heads, [spec.q_len] * spec.batch, [spec.kv_len] * spec.batch, seed)
    out, lse = rows.run(fmt, lse=True, kernel=name, q_dtype=spec.q_dtype)
    ran = mlagen.last_kernel()
    assert ran["name"] == name and ran["splits"] == spec.splits, ran
    mlagen.check_device_errors()
    _check_rows(rows, out, lse, fmt, spec.q_dtype, seed, name)


@pytest.mark.parametrize("name", _split_specialized(paged=True))
def test_specialized_paged_split_kernel_rows_and_lse(name):
    spec = KernelSpec.parse(name)
    fmt, seed = FMT[spec.kv_dtype], fresh_seed()
    pg = Paged([spec.kv_len] * spec.batch, spec.page_size, seed, share=False)
    out, lse = pg.run_paged(fmt, lse=True, kernel=name, q_dtype=spec.q_dtype)
    ran = mlagen.last_kernel()
    assert ran["name"] == name and ran["splits"] == spec.splits, ran
    mlagen.check_device_errors()

    rows = SimpleNamespace(q=pg.q, q_lens=[1] * pg.batch, kv_lens=pg.lens,
                           seen=lambda f: pg.seen(f).reshape(-1, 576))  # the cache's logical rows, in Rows' terms
    _check_rows(rows, out, lse, fmt, spec.q_dtype, seed, name)


def _generic_case(name):
    """Heads x q_len the kernel takes: 16 x 1 for the 16-row bodies; 64 x 1 / 32 x 1 for the rows
    bodies (block_m 64 / 32)."""
    spec = KernelSpec.parse(name)
    return (spec.block_m, 1) if spec.rows_body else (16, 1)


@pytest.mark.parametrize("splits", [2, 7, 32])
@pytest.mark.parametrize("name", _generic())
def test_generic_kernel_forced_splits_rows_and_lse(name, splits):
    """Lengths around tile edges, an empty sequence, one shorter than the splits' tiles (empty
    splits), one long: every (sequence, row group)'s last split merges, every row right."""
    spec = KernelSpec.parse(name)
    fmt, seed = FMT[spec.kv_dtype], fresh_seed()
    heads, q_len = _generic_case(name)
    kv_lens = [1300, 65, 0, 2, 4099, 129]
    rows = Rows(heads, [q_len] * len(kv_lens), kv_lens, seed)
    out, lse = rows.run(fmt, lse=True, kernel=name, splits=splits, q_dtype=spec.q_dtype)
    ran = mlagen.last_kernel()
    assert ran["name"] == name and ran["splits"] == splits, ran
    mlagen.check_device_errors()
    _check_rows(rows, out, lse, fmt, spec.q_dtype, seed, name)


def _fp8(inp):
    return (inp["q"], {"fp8": (inp["kv_fp8"], inp["kv_scale"])}, inp["qo_indptr"], inp["kv_indptr"], inp["config"])


def _poisoned(inp):
    return torch.full((inp["q"].shape[0], 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")


def _check_fp8(inp, out, seed, what):
    """Every (token, head) row against float64 on the fp8 KV values (one token a sequence)."""
    kv = (inp["kv_fp8"].double() * inp["kv_scale"].double()).reshape(-1, 576)
    ref, lse64 = causal_reference(inp["q"].double(), kv, [1] * len(inp["kv_lens"]), inp["kv_lens"], torch.float64)
    bound = 4 * TOLERANCES[("fp8e4m3fn", "same_inputs")]["rel_l2"]
    assert not out.isnan().any(), f"seed {seed} {what}: NaN in the output (a row left unwritten?)"
    live = lse64.isfinite()
    o, r = out.double()[live], ref[live]
    worst = ((o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-30)).max().item()
    assert worst <= bound, f"seed {seed} {what}: worst row rel_l2 {worst:.2e}"


@pytest.mark.parametrize("shape", [(4, 1024), (4, 8192), (32, 1024), (64, 1024)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_same_plan_back_to_back_resets_the_counters(shape):
    """Five calls of one plan on one stream with no synchronization, each on other inputs: had the
    last split not set its counter back to 0, a later call's last split would not see itself last
    and its rows would stay NaN (the poison). Each call's output equals the same inputs' lone call."""
    batch, kv_len = shape
    seed = fresh_seed()
    inps = [make_inputs([kv_len] * batch, seed + i) for i in range(5)]
    want = []
    for inp in inps:
        want.append(mlagen.decode(*_fp8(inp)).clone())
        torch.cuda.synchronize()
    assert mlagen.last_kernel()["splits"] > 1, mlagen.last_kernel()
    outs = [_poisoned(inp) for inp in inps]
    for inp, out in zip(inps, outs):
        mlagen.decode(*_fp8(inp), out=out)
    torch.cuda.synchronize()
    mlagen.check_device_errors()
    for i, (inp, out) in enumerate(zip(inps, outs)):
        assert torch.equal(out, want[i]), f"seed {seed}: call {i} differs from its lone call"
        _check_fp8(inp, out, seed + i, f"{batch}x{kv_len} call {i}")


def test_one_plan_on_two_streams_at_once():
    """The same plan (4x1024, 16 splits) on two streams with no synchronization, other inputs on
    each: each stream has its own workspace, so its own counters and partials."""
    seed = fresh_seed()
    a, b = make_inputs([1024] * 4, seed), make_inputs([1024] * 4, seed + 1)
    want_a, want_b = mlagen.decode(*_fp8(a)).clone(), mlagen.decode(*_fp8(b)).clone()
    torch.cuda.synchronize()
    assert mlagen.last_kernel()["splits"] > 1
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    outs_a, outs_b = [], []
    for _ in range(20):
        with torch.cuda.stream(sa):
            outs_a.append(mlagen.decode(*_fp8(a)))
        with torch.cuda.stream(sb):
            outs_b.append(mlagen.decode(*_fp8(b)))
    torch.cuda.synchronize()
    bad = [i for i in range(20) if not torch.equal(outs_a[i], want_a) or not torch.equal(outs_b[i], want_b)]
    assert not bad, f"seed {seed}: calls differing from the serial result: {bad}"


def test_two_plans_interleaved_on_one_stream():
    """4x1024 (16 splits) and 64x1024 (2 splits) alternating on one stream, no synchronization:
    each plan's counters and partials are its own."""
    seed = fresh_seed()
    small, big = make_inputs([1024] * 4, seed), make_inputs([1024] * 64, seed + 1)
    want_s, want_b = mlagen.decode(*_fp8(small)).clone(), mlagen.decode(*_fp8(big)).clone()
    torch.cuda.synchronize()
    outs = []
    for _ in range(10):
        outs.append((mlagen.decode(*_fp8(small)), mlagen.decode(*_fp8(big))))
    torch.cuda.synchronize()
    bad = [i for i, (s, b) in enumerate(outs) if not torch.equal(s, want_s) or not torch.equal(b, want_b)]
    assert not bad, f"seed {seed}: calls differing from the serial result: {bad}"
    _check_fp8(small, outs[-1][0], seed, "4x1024 interleaved")
    _check_fp8(big, outs[-1][1], seed + 1, "64x1024 interleaved")
