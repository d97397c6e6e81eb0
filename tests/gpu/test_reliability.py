"""GPU tests of the binding's reliability: scratch never shared between concurrent
callers, a cached call validated like a first one, defined output for bad data, CUDA graphs
that outlive later calls, the device a launch goes to.

Fresh random inputs each test (the seed in every message); outputs poisoned before each call.
"""
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402

from reference import attention, dequant_fp8, make_inputs, rel_l2  # noqa: E402
from tolerances import TOLERANCES  # noqa: E402

pytestmark = pytest.mark.gpu
# The worst (token, head) row against float64 on the same inputs: 4x the whole-output bound
# (one row is 512 values, its rounding noise ~sqrt(16 x batch) times the average's), far
# below the ~1 a wrong or unwritten row gives.
ROW_BOUND = 4 * TOLERANCES[("fp8e4m3fn", "same_inputs")]["rel_l2"]


def row_rel_l2(out, ref) -> float:
    """max over (token, head) rows of ||out - ref|| / ||ref|| (float64; non-finite: inf)."""
    o, r = out.double().reshape(-1, out.shape[-1]), ref.double().reshape(-1, ref.shape[-1])
    e = (o - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)
    return float("inf") if not torch.isfinite(e).all() else e.max().item()


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def _data(inp):
    return (inp["q"], {"fp8": (inp["kv_fp8"], inp["kv_scale"])}, inp["qo_indptr"], inp["kv_indptr"], inp["config"])


def _decode(inp, **kw):
    q, kv_data, qo, kvp, config = _data(inp)
    return mlagen.decode(q, kv_data, qo, kvp, config, **kw)


def _close_to_reference(inp, out, seed, what):
    ref = attention(inp["q"], dequant_fp8(inp["kv_fp8"], inp["kv_scale"]), inp["kv_lens"], torch.float64,
                    sm_scale=inp["config"]["sm_scale"])
    e, rows = rel_l2(out, ref), row_rel_l2(out, ref)
    assert e <= TOLERANCES[("fp8e4m3fn", "same_inputs")]["rel_l2"], f"seed {seed} {what}: rel_l2 {e:.2e}"
    assert rows <= ROW_BOUND, f"seed {seed} {what}: worst row {rows:.2e} (whole {e:.2e})"


def test_two_streams_never_share_scratch():
    """64x8192 (4 splits: partials in the scratch) on one stream and 4x1024 (16 splits) on
    another, 20 calls each with no synchronization in between: every output equals the serial
    one. One workspace per device gave wrong answers here."""
    seed = fresh_seed()
    big, small = make_inputs([8192] * 64, seed), make_inputs([1024] * 4, seed + 1)
    want_big, want_small = _decode(big).clone(), _decode(small).clone()
    assert mlagen.last_kernel()["splits"] > 1
    torch.cuda.synchronize()
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    outs_a, outs_b = [], []
    for _ in range(20):
        with torch.cuda.stream(sa):
            outs_a.append(_decode(big))
        with torch.cuda.stream(sb):
            outs_b.append(_decode(small))
    torch.cuda.synchronize()
    bad_a = [i for i, o in enumerate(outs_a) if not torch.equal(o, want_big)]
    bad_b = [i for i, o in enumerate(outs_b) if not torch.equal(o, want_small)]
    assert not bad_a and not bad_b, f"seed {seed}: calls differing from the serial result: {bad_a} / {bad_b}"
    _close_to_reference(big, outs_a[-1], seed, "64x8192 on a side stream")


def test_cached_path_validates_like_a_first_call():
    """After one good call (a plan is cached for these inputs), every input a fresh process
    rejects is still rejected, naming the field."""
    seed = fresh_seed()
    inp = make_inputs([512] * 4, seed)
    q, kv_data, qo, kvp, config = _data(inp)
    good = mlagen.decode(q, kv_data, qo, kvp, config)
    torch.cuda.synchronize()
    entry = mlagen.leaderboard_entry("fp8")
    assert torch.equal(entry((q, kv_data, qo, kvp, config)), good)  # the cached path, same answer
    bad_configs = [(dict(config, batch_size=5), "batch_size"), (dict(config, q_seq_len=5), "q_seq_len"),
                   (dict(config, qk_head_dim=512), "qk_head_dim"), (dict(config, num_heads=8), "num_heads"),
                   (dict(config, v_head_dim=576), "v_head_dim"), (dict(config, kv_lora_rank=448), "kv_lora_rank")]
    for cfg, field in bad_configs:
        for call in (lambda c=cfg: mlagen.decode(q, kv_data, qo, kvp, c), lambda c=cfg: entry((q, kv_data, qo, kvp, c))):
            with pytest.raises(mlagen.MlagenError, match=field):
                call()
    kv8, scale = kv_data["fp8"]
    cases = [
        ("qo_indptr", dict(qo=qo.cpu())), ("kv_indptr", dict(kvp=kvp.cpu())),
        ("kv_scale", dict(kv_data={"fp8": (kv8, scale.cpu())})),
        ("kv_indptr", dict(kvp=torch.stack([kvp, kvp], 1).reshape(-1)[::2])),  # stride 2
        ("qo_indptr", dict(qo=torch.stack([qo, qo], 1).reshape(-1)[::2])),
    ]
    for field, kw in cases:
        args = dict(q=q, kv_data=kv_data, qo=qo, kvp=kvp)
        args.update(kw)
        with pytest.raises(mlagen.MlagenError, match=field):
            mlagen.decode(args["q"], args["kv_data"], args["qo"], args["kvp"], config)
        with pytest.raises(mlagen.MlagenError, match=field):
            entry((args["q"], args["kv_data"], args["qo"], args["kvp"], config))
    with pytest.raises(mlagen.MlagenError, match="out"):
        mlagen.decode(q, kv_data, qo, kvp, config, out=torch.empty(4, 16, 512, dtype=torch.bfloat16))  # host memory
    assert torch.equal(mlagen.decode(q, kv_data, qo, kvp, config), good)  # and the good call still works
    mutated = dict(config)
    assert torch.equal(entry((q, kv_data, qo, kvp, mutated)), good)
    mutated["q_seq_len"] = 5  # the same dict object, changed in place after a cached call (q_len > 4)
    with pytest.raises(mlagen.MlagenError, match="q_seq_len"):
        entry((q, kv_data, qo, kvp, mutated))
    import numpy as np
    same = dict(config, batch_size=np.int64(4), kv_seq_len=np.int32(512), sm_scale=np.float32(config["sm_scale"]))
    assert torch.allclose(mlagen.decode(q, kv_data, qo, kvp, same).float(), good.float(), atol=1e-2)  # numpy scalars
    with pytest.raises(mlagen.MlagenError, match="sm_scale"):
        mlagen.decode(q, kv_data, qo, kvp, dict(config, sm_scale="x"))


@pytest.mark.parametrize("shape", [(4, 1024), (32, 8192)])
def test_nan_in_q_quantized_on_the_device_gives_nan(shape):
    """q_dtype="fp8" with a bf16 q: the per-tensor amax of a q holding one NaN is NaN, so is its
    scale and every output (mlagen.quant's recipe and the bf16-q path both give NaN); the
    device's max used to drop the NaN and the clamp made it -448: finite garbage."""
    seed = fresh_seed()
    batch, kv_len = shape
    inp = make_inputs([kv_len] * batch, seed)
    inp["q"][batch // 2, 3, 100] = float("nan")
    q8, qs = quant.quantize_q_fp8(inp["q"])
    assert torch.isnan(qs).all()  # the recipe: NaN scale
    out = _decode(inp, q_dtype="fp8")
    torch.cuda.synchronize()
    assert torch.isnan(out.float()).all(), f"seed {seed}: {int((~torch.isnan(out.float())).sum())} non-NaN outputs"
    ref_bf16q = _decode(inp)
    torch.cuda.synchronize()
    assert torch.isnan(ref_bf16q[batch // 2, 3].float()).all()  # the bf16-q path: that row NaN


@pytest.mark.parametrize("shape,generic", [((4, 1024), False), ((4, 1024), True), ((32, 1024), False)])
def test_q_beyond_f16_range_stays_finite_and_right(shape, generic):
    """|q| > 65504 (bf16 holds it, f16 does not): a kernel that takes q through a narrower
    format (the warpgroup kernel's e4m3 hi + lo, relative to a power of two a head) must scale
    it, not saturate it to Inf/NaN. q is 3e5 times larger and sm_scale as much smaller, so the
    softmax is as well conditioned as usual (with the scores themselves in the tens of
    thousands, any bf16-precision kernel may pick another of two near-tied tokens). Only the
    even heads' first 144 dims are large (heads that scale next to heads that do not). Checked
    against float64."""
    seed = fresh_seed()
    batch, kv_len = shape
    inp = make_inputs([kv_len] * batch, seed)
    mul = torch.ones(16, 576, device="cuda")
    mul[::2, :144] = 3e5
    inp["q"] = (inp["q"].float() * mul).to(torch.bfloat16)
    inp["config"] = dict(inp["config"], sm_scale=inp["config"]["sm_scale"] / 3e5)
    assert inp["q"].float().abs().max() > 65504
    out = torch.full((batch, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    _decode(inp, out=out, force_generic=generic)
    torch.cuda.synchronize()
    name = mlagen.last_kernel()["name"]
    assert torch.isfinite(out.float()).all(), f"seed {seed} {name}: non-finite output"
    _close_to_reference(inp, out, seed, name)


def test_graph_replay_survives_later_calls():
    """A decode captured in a CUDA graph keeps its buffers for as long as the graph can be
    replayed: calls of larger problems afterwards (which used to replace the shared workspace)
    leave the replay right."""
    seed = fresh_seed()
    small = make_inputs([1024] * 4, seed)
    q, kv_data, qo, kvp, config = _data(small)
    mlagen.decode(q, kv_data, qo, kvp, config)  # the plan exists before capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        mlagen.decode(q, kv_data, qo, kvp, config)  # warm the capture stream's scratch
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=side):
            out = mlagen.decode(q, kv_data, qo, kvp, config)
    for n in (8192, 16384):  # bigger problems, more splits: more scratch than the small one's
        _decode(make_inputs([n] * 64, seed + n))
    torch.cuda.synchronize()
    for rep in range(3):
        fresh = make_inputs([1024] * 4, seed + 100 + rep)
        q.copy_(fresh["q"])
        kv_data["fp8"][0].copy_(fresh["kv_fp8"])
        kv_data["fp8"][1].copy_(fresh["kv_scale"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _close_to_reference(fresh, out, seed, f"graph replay {rep}")


def test_launch_makes_the_plans_device_current():
    """The problem names its device; the launch makes it current and gives the caller's back.
    (One GPU here: a device that does not exist must fail naming it, and device 0 works from a
    caller whose current device is 0. Tensors on cuda:1 with current device 0 need two GPUs.)"""
    seed = fresh_seed()
    inp = make_inputs([1024] * 4, seed)
    q, kv_data, qo, kvp, config = _data(inp)
    plan = mlagen.prepare(q, kv_data["fp8"][0], kv_data["fp8"][1], qo, kvp, config)
    assert plan.problem.device == 0
    out = torch.empty(4, 16, 512, dtype=torch.bfloat16, device="cuda")
    plan.problem.device = torch.cuda.device_count() + 3
    plan.rebuild()  # the library plan keeps its own copy of the problem
    with pytest.raises(mlagen.MlagenError, match=f"device={torch.cuda.device_count() + 3}: cannot make it current"):
        plan.run(q, None, kv_data["fp8"][0], kv_data["fp8"][1], qo, kvp, out, None)
    assert torch.cuda.current_device() == 0
    plan.problem.device = 0
    plan.rebuild()
    out.fill_(float("nan"))
    plan.run(q, None, kv_data["fp8"][0], kv_data["fp8"][1], qo, kvp, out, None)
    torch.cuda.synchronize()
    _close_to_reference(inp, out, seed, "device 0")


def test_batch_beyond_a_grid_dimension_is_refused_before_any_launch():
    inp = make_inputs([1] * 65536, fresh_seed())
    with pytest.raises(mlagen.MlagenError, match="batch=65536: expected 1..65535"):
        _decode(inp)
