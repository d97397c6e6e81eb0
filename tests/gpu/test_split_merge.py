"""The split merge on the GPU: inside the decode launch, or by the combine kernel after it.

With mlagen.set_split_merge("in_launch"), a split decode on the 16-row sm90a bodies merges its
partials in its own launch when the whole grid, a merger block beside each split block, is resident
at once (a cooperative launch: a row group's mergers wait for its splits, then each merges a slice
of it); a larger grid
leaves them to the `_combine` kernel, as the default mode ("combine") does every split decode.
Which one ran is read from the profiler's kernel list, and both are judged per (token, head) row,
output and LSE, against float64 on the values the kernel reads: every head count the 16-row
bodies serve (8: padding rows; 16 x 2 tokens: two row groups), fp8 and bf16 KV, empty splits and
empty sequences. Calls back to back on one plan (the counters are reused: each launch must leave
them at zero) give the same bits, as do interleaved plans of other split counts.
"""
import contextlib
import math
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402

from reference import SM_SCALE, attention, dequant_fp8, make_inputs, quantize_fp8, rel_l2  # noqa: E402

pytestmark = pytest.mark.gpu
QK, DV = 576, 512
ROW_TOL = {"fp8": 2e-2, "bf16": 1e-2}  # per-row rel L2 against float64 on the values read (bf16 output)
LSE_TOL = {"fp8": 2e-2, "bf16": 2e-3}  # test_paged.py's: the fp8 paths carry q in ~8 significant bits (hi + lo e4m3)


@contextlib.contextmanager
def split_merge(mode):
    before = mlagen.split_merge()
    mlagen.set_split_merge(mode)
    try:
        yield
    finally:
        mlagen.set_split_merge(before)


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def inputs(kv_lens, heads, q_len, fmt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch, total = len(kv_lens), sum(kv_lens)
    q = torch.randn((batch * q_len, heads, QK), generator=g, device="cuda").to(torch.bfloat16)
    kv = torch.randn((max(total, 1), 1, QK), generator=g, device="cuda").to(torch.bfloat16)[:total]
    if fmt == "fp8":
        kv8, scale = quantize_fp8(kv)
        data, values = {"fp8": (kv8, scale)}, kv8.double() * scale.double()
    else:
        data, values = {"bf16": kv}, kv.double()
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    kv_indptr[1:] = torch.tensor(kv_lens, device="cuda").cumsum(0)
    qo_indptr = torch.arange(0, batch * q_len + 1, q_len, dtype=torch.int32, device="cuda")
    config = dict(batch_size=batch, num_heads=heads, num_kv_heads=1, qk_head_dim=QK, kv_lora_rank=512,
                  qk_rope_head_dim=64, v_head_dim=DV, q_seq_len=q_len, sm_scale=SM_SCALE)
    return dict(q=q, data=data, values=values.reshape(-1, QK), qo=qo_indptr, kv=kv_indptr, config=config,
                lens=list(kv_lens), q_len=q_len, fmt=fmt)


def reference(inp):
    """float64 (out, lse) on the values the kernel reads; token i of n sees the first L - n + 1 + i keys."""
    q, vals, n = inp["q"].double(), inp["values"], inp["q_len"]
    out = torch.zeros((q.shape[0], q.shape[1], DV), dtype=torch.float64, device="cuda")
    lse = torch.full((q.shape[0], q.shape[1]), -math.inf, dtype=torch.float64, device="cuda")
    ks = 0
    for b, L in enumerate(inp["lens"]):
        for i in range(n):
            end = max(0, L - n + 1 + i)
            if end:
                s = q[b * n + i] @ vals[ks:ks + end].T * SM_SCALE
                out[b * n + i] = torch.softmax(s, -1) @ vals[ks:ks + end, :DV]
                lse[b * n + i] = torch.logsumexp(s, -1)
        ks += L
    return out, lse


def call(inp, splits):
    q = inp["q"]
    out = torch.full((q.shape[0], q.shape[1], DV), float("nan"), dtype=torch.bfloat16, device="cuda")
    res, lse = mlagen.decode(q, inp["data"], inp["qo"], inp["kv"], inp["config"], kv_format=inp["fmt"], out=out,
                             splits=splits, force_generic=True, return_lse=True, q_len=inp["q_len"])
    assert res.data_ptr() == out.data_ptr()
    return out, lse


def kernels_of(fn):
    """The names of the GPU kernels `fn` launched (the profiler's CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def check_rows(inp, out, lse, seed):
    ref, ref_lse = reference(inp)
    o = out.double()
    assert not torch.isnan(o).any(), f"seed {seed}: NaN (unwritten?) output rows"
    err = (o - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    empty = ref.norm(dim=-1) == 0
    assert (o[empty] == 0).all(), f"seed {seed}: a row that sees no key must be zeros"
    worst = err[~empty].max().item() if (~empty).any() else 0.0
    assert worst <= ROW_TOL[inp["fmt"]], f"seed {seed}: worst (token, head) row rel_l2 {worst:.2e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse.double()), ~finite), f"seed {seed}: LSE -inf where the reference is not"
    lerr = (lse.double()[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    assert lerr <= LSE_TOL[inp["fmt"]], f"seed {seed}: LSE off by {lerr:.2e}"


# (lens, heads, q_len, splits, in launch): split grids of <= 66 blocks (132 with their mergers) are
# resident on an H200 for every 16-row body; 400 sequences x 4 splits (1,600 blocks) are not.
CASES = {
    "b2_kv3000_s17_h16": ([3000, 3000], 16, 1, 17, True),
    "b1_kv8192_s64_h16": ([8192], 16, 1, 64, True),
    "ragged_empty_s8_h16": ([1, 700, 0, 2049, 63], 16, 1, 8, True),
    "b3_kv1500_s6_h8": ([1500, 1, 900], 8, 1, 6, True),
    "b4_kv1000_s5_h16_ql2": ([1000, 999, 17, 1000], 16, 2, 5, True),
    "b400_kv256_s4_h16": ([256] * 400, 16, 1, 4, False),
}


@pytest.mark.parametrize("mode", ["in_launch", "combine"])
@pytest.mark.parametrize("fmt", ["fp8", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_split_merge_matches_float64_per_row(case, fmt, mode):
    lens, heads, q_len, splits, in_launch = CASES[case]
    in_launch = in_launch and mode == "in_launch"
    seed = fresh_seed()
    inp = inputs(lens, heads, q_len, fmt, seed)
    res = {}
    with split_merge(mode):
        names = kernels_of(lambda: res.update(zip(("out", "lse"), call(inp, splits))))
    ran = mlagen.last_kernel()
    assert ran["generic"] and ran["splits"] == splits, ran
    decodes = [n for n in names if n.startswith(ran["name"]) and not n.endswith(("_combine", "_amax"))]
    combines = [n for n in names if n.endswith("_combine")]
    assert len(decodes) == 1, names
    assert (not combines) == in_launch, f"{case}: kernels {names} (expected the merge {'in' if in_launch else 'after'} the launch)"
    mlagen.check_device_errors()
    check_rows(inp, res["out"], res["lse"], seed)


def test_back_to_back_calls_leave_the_counters_ready():
    """The same call five times, with calls of other split counts (other plans, other workspaces)
    between them: the in-launch merge's counters return to zero each launch, so every call gives
    the first call's bits."""
    seed = fresh_seed()
    inp = inputs([2500, 2500, 1200], 16, 1, "fp8", seed)
    other = inputs([4000], 16, 1, "fp8", seed + 1)
    with split_merge("in_launch"):
        first, first_lse = call(inp, 11)
        check_rows(inp, first, first_lse, seed)
        for i in range(4):
            call(other, 3 + 7 * i)
            out, lse = call(inp, 11)
            assert torch.equal(out, first) and torch.equal(lse, first_lse), f"seed {seed}: call {i + 2} differs from the first"
        o2, l2 = call(other, 5)
        check_rows(other, o2, l2, seed + 1)


def test_every_path_takes_the_process_mode():
    """The mode is the library's, read at each launch: decode()'s common path (the C++ per-call
    entry where loaded) and torch.ops.mlagen.decode take it as the ctypes path does."""
    seed = fresh_seed()
    inp = make_inputs([1024] * 4, seed)
    data = {"fp8": (inp["kv_fp8"], inp["kv_scale"])}
    calls = {"decode": lambda: mlagen.decode(inp["q"], data, inp["qo_indptr"], inp["kv_indptr"], inp["config"]),
             "torch.ops": lambda: torch.ops.mlagen.decode(inp["q"], inp["kv_fp8"], inp["kv_scale"], inp["qo_indptr"],
                                                          inp["kv_indptr"], "fp8", "bf16", 1024, inp["config"]["sm_scale"])}
    outs = {}
    for mode in ("combine", "in_launch"):
        with split_merge(mode):
            for name, fn in calls.items():
                names = kernels_of(lambda: outs.update({(name, mode): fn()}))
                assert mlagen.last_kernel()["splits"] > 1
                assert any(n.endswith("_combine") for n in names) == (mode == "combine"), f"{name} {mode}: {names}"
    want = attention(inp["q"], dequant_fp8(inp["kv_fp8"], inp["kv_scale"]), inp["kv_lens"], torch.float32)
    for key, out in outs.items():
        assert rel_l2(out, want) <= 2e-2, f"seed {seed} {key}: rel_l2 {rel_l2(out, want):.2e}"


def test_a_bad_mode_is_refused_naming_it():
    with pytest.raises(mlagen.MlagenError, match="split merge mode='fused'"):
        mlagen.set_split_merge("fused")
    with pytest.raises(mlagen.MlagenError, match="split merge mode=7: expected 0"):
        mlagen._lib.raise_for(mlagen.lib().mlagen_set_split_merge(7))
    assert mlagen.split_merge() == "combine"
