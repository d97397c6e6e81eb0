"""GPU tests: every generated kernel and the generic kernel against torch references.

Fresh random inputs each test (the seed is in every failure message); the output buffer
is poisoned with NaN before each call; the dispatched kernel is asserted.
"""
import json
import os
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402

from reference import attention, dequant_fp8, exact_inputs, make_inputs, rel_l2  # noqa: E402
from tolerances import TOLERANCES  # noqa: E402
from codegen import catalog  # noqa: E402
from codegen.spec import KernelSpec  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
pytestmark = pytest.mark.gpu
GENERIC = catalog.generic_spec("sm90a", "bf16", "fp8e4m3fn").name
LEADERBOARD = [(4, 1024), (4, 8192), (32, 1024), (32, 8192), (64, 1024), (64, 8192), (256, 1024), (256, 8192)]


def _specs():
    with open(os.path.join(ROOT, "generated", "manifest.json")) as f:
        return [k for k in json.load(f)["kernels"] if k["arch"] == "sm90a" and k["batch"] and not k.get("page_size")
                and (k["q_dtype"], k["kv_dtype"]) == ("bf16", "fp8e4m3fn")
                and (k["num_heads"], k["q_len"]) == (16, 1)]  # other query rows: test_rows.py; other formats: test_formats.py


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def run(inp, **kw):
    out = torch.full((inp["q"].shape[0], 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    res = mlagen.decode(inp["q"], {"fp8": (inp["kv_fp8"], inp["kv_scale"])}, inp["qo_indptr"], inp["kv_indptr"],
                        inp["config"], out=out, **kw)
    assert res.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    return out, mlagen.last_kernel()


def check_against_references(inp, out, seed):
    lens = inp["kv_lens"]
    assert torch.isfinite(out.float()).all(), f"seed {seed}: non-finite (unwritten?) output"
    mlagen.check_device_errors()
    ref32 = attention(inp["q"], dequant_fp8(inp["kv_fp8"], inp["kv_scale"]), lens, torch.float32)
    e32 = rel_l2(out, ref32)
    assert e32 <= TOLERANCES[("fp8e4m3fn", "same_inputs")]["rel_l2"], f"seed {seed} lens[:4] {lens[:4]}: rel_l2 {e32:.2e} vs fp32 ref"
    ref64 = attention(inp["q"], inp["kv_bf16"], lens, torch.float64)
    e64 = rel_l2(out, ref64)
    assert e64 <= TOLERANCES[("fp8e4m3fn", "bf16_inputs")]["rel_l2"], f"seed {seed}: rel_l2 {e64:.2e} vs fp64 bf16 ref"
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all(), f"seed {seed}: empty sequence {b} must give zeros"
    return e32, e64


@pytest.mark.parametrize("spec", _specs(), ids=lambda k: k["name"])
def test_generated_kernel(spec):
    seed = fresh_seed()
    inp = make_inputs([spec["kv_len"]] * spec["batch"], seed)
    out, ran = run(inp)
    assert ran["name"] == spec["name"] and ran["splits"] == spec["splits"]
    e32, e64 = check_against_references(inp, out, seed)
    print(f"{spec['name']}: rel_l2 vs fp32 {e32:.2e}, vs fp64(bf16 KV) {e64:.2e}")


@pytest.mark.parametrize("batch,kv_len", LEADERBOARD, ids=lambda v: str(v))
def test_generic_kernel_on_leaderboard_shapes(batch, kv_len):
    seed = fresh_seed()
    inp = make_inputs([kv_len] * batch, seed)
    out, ran = run(inp, force_generic=True)
    assert ran["name"] == GENERIC and ran["generic"]
    check_against_references(inp, out, seed)


def _candidates():
    """The generic fp8 tuning candidates (role 2: every tiling but the generic default, which
    the tests above run): the warpgroup kernel's other stage counts."""
    with open(os.path.join(ROOT, "generated", "manifest.json")) as f:
        return [k["name"] for k in json.load(f)["kernels"]
                if k["arch"] == "sm90a" and not k["batch"] and KernelSpec.parse(k["name"]).role == 2
                and (k["q_dtype"], k["kv_dtype"]) == ("bf16", "fp8e4m3fn")]


@pytest.mark.parametrize("name", _candidates())
@pytest.mark.parametrize("lens,splits", [([2048] * 8, 4), ([1, 64, 65, 1000, 4099, 0], 3), ([300] * 33, 1)],
                         ids=["uniform", "nonuniform", "single"])
def test_tuning_candidates(name, lens, splits):
    seed = fresh_seed()
    inp = make_inputs(lens, seed)
    out, ran = run(inp, kernel=name, splits=splits)
    assert ran["name"] == name and ran["splits"] == splits
    check_against_references(inp, out, seed)


def _random_case(i):
    rng = random.Random(1000 + i)  # the shape list is fixed; the data seed is fresh each run
    batch = rng.choice([1, 2, 3, 5, 7, 16, 33, 70])
    if i % 2 == 0:
        lens = [rng.choice([1, 17, 31, 32, 33, 100, 333, 777, 1023, 2049, 3000])] * batch
    else:
        lens = [rng.randrange(0 if i % 4 == 1 else 1, 2500) for _ in range(batch)]
        if i % 4 == 1:
            lens[rng.randrange(batch)] = 0
    splits = 0 if i % 3 else rng.choice([1, 2, 5, 17])
    return lens, splits


@pytest.mark.parametrize("i", range(24))
def test_random_shapes(i):
    lens, splits = _random_case(i)
    seed = fresh_seed()
    inp = make_inputs(lens, seed)
    out, ran = run(inp, splits=splits)
    assert ran["generic"], ran
    if splits:
        assert ran["splits"] == splits
    check_against_references(inp, out, seed)


@pytest.mark.parametrize("splits", [8, 9, 16, 17, 24, 25, 32, 64])
def test_combine_split_groups(splits):
    """The combine's split groups (kernel_abi.h combine_groups: 128 threads a group, a group for
    every 8 splits begun, at most 4; 5 sequences x 16 rows keep them all, launch.cpp): each group count, groups of unequal split counts, sequences
    shorter than their splits' tiles (groups with no token), an empty one. Every (token, head) row
    against float32 attention on the same inputs: 1e-2, 2.3x the worst row measured (4.3e-3,
    tests/tolerances.py); a group merged with a wrong weight or left out moves a row by ~1e-1."""
    seed = fresh_seed()
    lens = [8192, 4099, 700, 0, 1]
    inp = make_inputs(lens, seed)
    out, ran = run(inp, splits=splits)
    assert ran["generic"] and ran["splits"] == splits, ran
    check_against_references(inp, out, seed)
    ref32 = attention(inp["q"], dequant_fp8(inp["kv_fp8"], inp["kv_scale"]), lens, torch.float32)
    live = [b for b, n in enumerate(lens) if n]
    o, r = out[live].double(), ref32[live].double()
    row = (o - r).norm(dim=-1) / r.norm(dim=-1)
    worst = row.max().item()
    assert worst <= 1e-2, f"seed {seed} splits {splits}: worst row rel_l2 {worst:.3e} at {divmod(row.argmax().item(), 16)}"


@pytest.mark.parametrize("lens,generic", [([1024] * 4, False), ([8192] * 4, False), ([64, 200, 1000], True)],
                         ids=["b4_kv1024", "b4_kv8192", "nonuniform"])
def test_small_integers_match_exactly(lens, generic):
    seed = fresh_seed()
    inp, expect = exact_inputs(lens, seed)
    out, ran = run(inp)
    assert ran["generic"] == generic
    assert torch.equal(out, expect), f"seed {seed}: max diff {(out.float() - expect.float()).abs().max().item()}"


def test_indptr_disagreeing_with_uniform_config_is_flagged():
    inp = make_inputs([1024] * 4, fresh_seed())
    bad = inp["kv_indptr"].clone()
    bad[2] += 5  # still sums to 4*1024, but sequence 1 and 2 are not 1024 long
    inp["kv_indptr"] = bad
    out, ran = run(inp)
    assert not ran["generic"]
    assert torch.isnan(out[1].float()).all() and torch.isnan(out[2].float()).all()
    with pytest.raises(mlagen.MlagenError, match="kv_indptr disagrees"):
        mlagen.check_device_errors()
    mlagen.check_device_errors()  # cleared


@pytest.mark.parametrize("splits", [1, 3])  # 3: the flagged row goes through the combine
def test_indptr_past_total_kv_is_flagged_by_the_generic_kernel(splits):
    inp = make_inputs([100, 200, 300], fresh_seed())
    good = inp["kv_indptr"].clone()
    bad = good.clone()
    bad[3] = 10_000
    inp["kv_indptr"] = bad
    out, ran = run(inp, splits=splits)
    assert ran["splits"] == splits
    assert torch.isnan(out[2].float()).all() and torch.isfinite(out[:2].float()).all()
    with pytest.raises(mlagen.MlagenError, match="kv_indptr"):
        mlagen.check_device_errors()
    inp["kv_indptr"] = good  # the unflagged rows are the right ones
    ref, _ = run(inp, splits=splits)
    assert torch.equal(out[:2], ref[:2])


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.update(q=d["q"].float()), "q: dtype torch.float32: expected torch.bfloat16"),
    (lambda d: d.update(q=d["q"][:, :12]), "num_heads=12: expected 8, 16, 32, 64 or 128"),  # the library's check
    (lambda d: d.update(q=d["q"].repeat(1, 2, 1)), "config\\['num_heads'\\]=16: expected 32"),
    (lambda d: d.update(kv_fp8=d["kv_fp8"][:, :, :512]), "kv: shape"),
    (lambda d: d.update(kv_indptr=d["kv_indptr"].long()), "kv_indptr: torch.int64"),
    (lambda d: d.update(kv_scale=d["kv_scale"].double()), "kv_scale"),
])
def test_binding_rejects_bad_tensors(mutate, msg):
    inp = make_inputs([256] * 2, fresh_seed())
    mutate(inp)
    with pytest.raises(mlagen.MlagenError, match=msg):
        run(inp)
