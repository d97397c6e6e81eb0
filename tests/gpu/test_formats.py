"""GPU tests for every KV format (fp8, bf16, mxfp4) and query precision (bf16, fp8).

For each: against float32 attention on the same (dequantized) inputs the kernel sees, and
against float64 on the bf16 inputs (tolerances.py says why each number); the leaderboard
check (allclose 0.1/0.1, <= 5% outside) against the task's a8w8 reference, printing the
mismatch fraction and relative error; padded and unpadded mxfp4 scale rows; exact cases.
Fresh random inputs every test, output poisoned with NaN, the dispatched kernel asserted.
"""
import json
import os
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
from mlagen import quant  # noqa: E402

from bench.leaderboard import task_inputs  # noqa: E402
from reference import attention, exact_inputs, make_inputs, rel_l2  # noqa: E402
from tolerances import ROW_REL_L2_VS_A8W8, TOLERANCES  # noqa: E402
from codegen.spec import KernelSpec  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
pytestmark = pytest.mark.gpu
FORMATS = ("fp8", "bf16", "mxfp4")
KV_DTYPE = {"fp8": "fp8e4m3fn", "bf16": "bf16", "mxfp4": "mxfp4"}
TEST_SHAPES = [(4, 1024), (32, 1024), (64, 8192), (256, 8192)]


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def _manifest():
    with open(os.path.join(ROOT, "generated", "manifest.json")) as f:
        return [k for k in json.load(f)["kernels"] if k["arch"] == "sm90a"]


def with_formats(inp, pad_scales=False):
    """Adds the leaderboard's kv_data dict (bf16 / fp8 / mxfp4 of the same bf16 KV)."""
    data, scales = quant.quantize_mxfp4(inp["kv_bf16"], pad_scales=pad_scales)
    inp["kv_data"] = {"bf16": inp["kv_bf16"], "fp8": (inp["kv_fp8"], inp["kv_scale"]), "mxfp4": (data, scales)}
    return inp


def kv_as_seen(inp, fmt):
    """The KV values the kernel computes with, float32."""
    if fmt == "fp8":
        return inp["kv_fp8"].float() * inp["kv_scale"]
    if fmt == "bf16":
        return inp["kv_bf16"].float()
    data, scales = inp["kv_data"]["mxfp4"]
    return quant.dequantize_mxfp4(data, scales, 576).reshape(-1, 1, 576)


def run(inp, fmt, q_dtype="bf16", **kw):
    out = torch.full((inp["q"].shape[0], 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    res = mlagen.decode(inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"],
                        kv_format=fmt, q_dtype=q_dtype, out=out, **kw)
    assert res.data_ptr() == out.data_ptr()
    torch.cuda.synchronize()
    ran = mlagen.last_kernel()
    assert (ran["q_dtype"], ran["kv_dtype"]) == (q_dtype, KV_DTYPE[fmt]), ran
    return out, ran


def check(inp, out, fmt, q_dtype, seed):
    lens = inp["kv_lens"]
    assert torch.isfinite(out.float()).all(), f"seed {seed}: non-finite (unwritten?) output"
    mlagen.check_device_errors()
    q_seen = inp["q"]
    if q_dtype == "fp8":
        q8, qs = quant.quantize_q_fp8(inp["q"])
        q_seen = q8.float() * qs
    path = "fp8e4m3fn" if fmt == "fp8" else fmt
    e32 = rel_l2(out, attention(q_seen, kv_as_seen(inp, fmt), lens, torch.float32))
    tol32 = TOLERANCES[(path, "same_inputs")]["rel_l2"]
    assert e32 <= tol32, f"seed {seed} {fmt}/{q_dtype} lens[:4] {lens[:4]}: rel_l2 {e32:.2e} vs fp32 (tol {tol32})"
    e64 = rel_l2(out, attention(inp["q"], inp["kv_bf16"], lens, torch.float64))
    tol64 = max(TOLERANCES[(path, "bf16_inputs")]["rel_l2"],
                TOLERANCES[("fp8q", "bf16_inputs")]["rel_l2"] if q_dtype == "fp8" else 0.0)
    assert e64 <= tol64, f"seed {seed} {fmt}/{q_dtype}: rel_l2 {e64:.2e} vs fp64 on bf16 inputs (tol {tol64})"
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b] == 0).all(), f"seed {seed}: empty sequence {b} must give zeros"
    return e32, e64


def _specialized():
    return [k for k in _manifest() if k["batch"] and not k.get("page_size") and (k["num_heads"], k["q_len"]) == (16, 1)
            and (k["q_dtype"], k["kv_dtype"]) != ("bf16", "fp8e4m3fn")]  # other query rows: test_rows.py


@pytest.mark.parametrize("spec", _specialized(), ids=lambda k: k["name"])
def test_specialized_kernel(spec):
    fmt = next(f for f, d in KV_DTYPE.items() if d == spec["kv_dtype"])
    seed = fresh_seed()
    inp = with_formats(make_inputs([spec["kv_len"]] * spec["batch"], seed))
    out, ran = run(inp, fmt, spec["q_dtype"])
    assert ran["name"] == spec["name"] and ran["splits"] == spec["splits"]
    e32, e64 = check(inp, out, fmt, spec["q_dtype"], seed)
    print(f"{spec['name']}: rel_l2 vs fp32 {e32:.2e}, vs fp64 {e64:.2e}")


CASES = [([1024] * 4, 0), ([1, 64, 65, 1000, 4099, 0], 3), ([300] * 33, 1), ([17, 2049, 31], 0),
         ([2048] * 8, 5)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("q_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_generic_kernel_every_format(fmt, q_dtype, case):
    lens, splits = CASES[case]
    seed = fresh_seed()
    inp = with_formats(make_inputs(lens, seed))
    out, ran = run(inp, fmt, q_dtype, force_generic=True, splits=splits)
    assert ran["generic"]
    if splits:
        assert ran["splits"] == splits
    check(inp, out, fmt, q_dtype, seed)


def _format_candidates():
    """The generic tuning candidates of the bf16 and mxfp4 formats (role 2: the warpgroup
    kernel's other stage counts; the fp8 ones: tests/gpu/test_decode.py)."""
    return [k for k in _manifest() if not k["batch"] and KernelSpec.parse(k["name"]).role == 2
            and k["kv_dtype"] in ("bf16", "mxfp4")]


@pytest.mark.parametrize("spec", _format_candidates(), ids=lambda k: k["name"])
def test_format_tuning_candidates(spec):
    name, fmt = spec["name"], spec["kv_dtype"]
    seed = fresh_seed()
    inp = with_formats(make_inputs([1, 64, 65, 1000, 4099, 0], seed))
    out, ran = run(inp, fmt, kernel=name, splits=3)
    assert ran["name"] == name
    check(inp, out, fmt, "bf16", seed)


@pytest.mark.parametrize("lens", [[1024] * 4, [1, 100, 3000, 0, 257]], ids=["uniform", "nonuniform"])
def test_mxfp4_padded_and_unpadded_scales_agree(lens):
    seed = fresh_seed()
    inp = with_formats(make_inputs(lens, seed), pad_scales=False)
    data, scales = inp["kv_data"]["mxfp4"]
    _, padded = quant.quantize_mxfp4(inp["kv_bf16"], pad_scales=True)
    assert padded.shape[1] == 24 and padded.stride(0) == 24 and scales.stride(0) == 18
    assert torch.equal(padded[:scales.shape[0], :18], scales)
    out18, _ = run(inp, "mxfp4")
    check(inp, out18, "mxfp4", "bf16", seed)
    inp["kv_data"]["mxfp4"] = (data, padded)
    out24, _ = run(inp, "mxfp4")
    assert torch.equal(out18, out24), f"seed {seed}: padded scale rows changed the output"


@pytest.mark.parametrize("lens", [[1024] * 4, [1, 100, 3000, 0, 257]], ids=["uniform", "nonuniform"])
def test_mxfp4_padded_kv_rows_agree(lens):
    """KV rows with a row stride over 288 bytes (a cache with room per token): the same output
    as rows back to back (the warpgroup kernel copies whole tiles of back-to-back rows by a
    fast path, any other stride by the general one)."""
    seed = fresh_seed()
    inp = with_formats(make_inputs(lens, seed))
    data, scales = inp["kv_data"]["mxfp4"]
    out_dense, ran = run(inp, "mxfp4")
    check(inp, out_dense, "mxfp4", "bf16", seed)
    wide = torch.full((data.shape[0], 1, 320), 0x77, dtype=torch.uint8, device="cuda")  # padding: 6.0s
    wide[..., :288] = data
    inp["kv_data"]["mxfp4"] = (wide[..., :288], scales)
    assert inp["kv_data"]["mxfp4"][0].stride(0) == 320
    out_wide, ran2 = run(inp, "mxfp4")
    assert ran2["name"] == ran["name"]
    assert torch.equal(out_dense, out_wide), f"seed {seed}: a padded KV row stride changed the output"


@pytest.mark.parametrize("spread", [8, 20], ids=["spread8", "spread20"])
def test_mxfp4_block_scales_spread_over_many_binades(spread):
    """Random E2M1 codes with block scales spread over `spread` binades inside a token and
    token levels over 24 binades: the warpgroup kernel holds a token as e4m3 relative to its
    largest block (exact down to 14 binades below it, rounded to 19, zero beyond).
    It must match float32 attention on the dequantized values at the format's tolerance."""
    seed = fresh_seed()
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = [1, 64, 65, 700, 2000]
    inp = make_inputs(lens, seed)
    total = sum(lens)
    data = torch.randint(0, 256, (total, 1, 288), generator=g, device="cuda", dtype=torch.uint8)
    level = torch.randint(-20, 5, (total, 1), generator=g, device="cuda")
    scales = (127 + level - torch.randint(0, spread + 1, (total, 18), generator=g, device="cuda")).to(torch.uint8)
    inp["kv_data"] = {"mxfp4": (data, scales)}
    inp["kv_bf16"] = quant.dequantize_mxfp4(data, scales, 576).reshape(-1, 1, 576).to(torch.bfloat16)  # exact
    # q scaled so that the largest tokens' scores stay O(10): every level keeps some weight
    inp["q"] = (inp["q"].float() * 2.0 ** -6).to(torch.bfloat16)
    name = next(k["name"] for k in _manifest() if not k["batch"] and k["kv_dtype"] == "mxfp4" and k["q_dtype"] == "bf16"
                and KernelSpec.parse(k["name"]).role == 1)
    assert KernelSpec.parse(name).warpgroup, name
    out, ran = run(inp, "mxfp4", kernel=name, splits=2)
    assert ran["name"] == name
    e32, _ = check(inp, out, "mxfp4", "bf16", seed)
    print(f"{name} spread {spread}: rel_l2 vs fp32 {e32:.2e}")


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4"])
@pytest.mark.parametrize("lens", [[1024] * 4, [64, 200, 1000]], ids=["b4_kv1024", "nonuniform"])
def test_small_values_match_exactly(fmt, lens):
    seed = fresh_seed()
    inp, expect = exact_inputs(lens, seed, grid="int" if fmt == "bf16" else "e2m1")
    with_formats(inp)
    if fmt == "mxfp4":  # the quantizer must have represented every value exactly
        data, scales = inp["kv_data"]["mxfp4"]
        assert torch.equal(quant.dequantize_mxfp4(data, scales, 576).reshape(-1, 1, 576), inp["kv_bf16"].float())
    out, _ = run(inp, fmt)
    assert torch.equal(out, expect), f"seed {seed}: max diff {(out.float() - expect.float()).abs().max().item()}"


@pytest.mark.parametrize("spread", ["normal", "wide"])
def test_fp8_q_quantized_on_the_device_matches_the_recipe(spread):
    """The device pre-pass + in-kernel quantization of a bf16 q must give the recipe's fp8 q
    and scale bit for bit (mlagen.quant.quantize_q_fp8): same output as passing those in.
    "wide" spreads |q| over ~2^-20..2^10 so fp8 subnormals and saturation are exercised."""
    seed = fresh_seed()
    inp = with_formats(make_inputs([512] * 3, seed))
    if spread == "wide":
        g = torch.Generator(device="cuda").manual_seed(seed)
        mag = torch.exp2(torch.randint(-20, 11, inp["q"].shape, generator=g, device="cuda").float())
        inp["q"] = (inp["q"].float() * mag).to(torch.bfloat16)
    for fmt in FORMATS:
        out_a, ran = run(inp, fmt, "fp8")
        q8, qs = quant.quantize_q_fp8(inp["q"])
        out_b = mlagen.decode(q8, inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"], kv_format=fmt,
                              q_dtype="fp8", q_scale=qs)
        assert torch.equal(out_a, out_b), f"seed {seed} {fmt}: device quantization differs from the recipe"
        assert torch.isfinite(out_a.float()).all()
    with pytest.raises(mlagen.MlagenError, match="q_scale"):
        mlagen.decode(q8, inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"], q_dtype="fp8")
    # a q_scale unlike the one the cached plan validated is validated again, not passed on
    with pytest.raises(mlagen.MlagenError, match="q_scale"):
        mlagen.decode(q8, inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"], q_dtype="fp8",
                      q_scale=qs.double())


@pytest.mark.parametrize("lens,kw", [([1024] * 4, {}), ([64] * 600, dict(force_generic=True, splits=1)),
                                      ([700, 5, 1300], dict(force_generic=True, splits=3))],
                         ids=["4x1024 specialized", "600 sequences: more blocks than the GPU holds", "generic split"])
def test_fp8_q_quantized_on_the_device_call_after_call(lens, kw):
    """fp8 q quantized in the call, several calls in a row whose max|q| rises and falls by
    orders of magnitude: every call must use its own q's scale (a stale maximum in the
    workspace would keep the largest scale), on a specialized kernel, on a grid of more
    blocks than the GPU holds at once, and on a split generic one. Each output bit for bit
    equal to passing the recipe's fp8 q with its scale."""
    seed = fresh_seed()
    inp = with_formats(make_inputs(lens, seed))
    q0 = inp["q"]
    for amp in (1.0, 1000.0, 1e-3, 1.0, 50.0, 1e-3):
        q = (q0.float() * amp).to(torch.bfloat16)
        out = torch.full((q.shape[0], 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        mlagen.decode(q, inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"], kv_format="fp8",
                      q_dtype="fp8", out=out, **kw)
        q8, qs = quant.quantize_q_fp8(q)
        ref = mlagen.decode(q8, inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"], kv_format="fp8",
                            q_dtype="fp8", q_scale=qs, **kw)
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all(), f"seed {seed} amp {amp}: non-finite output"
        assert torch.equal(out, ref), f"seed {seed} amp {amp}: the call did not use its own q's scale"
    mlagen.check_device_errors()


@pytest.mark.parametrize("batch,kv_len", TEST_SHAPES, ids=lambda v: str(v))
def test_leaderboard_check_passes_for_every_format(batch, kv_len, capsys):
    """The task's inputs and check: a8w8 reference (fp8 q, fp8 KV), allclose(0.1, 0.1) with at
    most 5% of elements outside, and every (token, head) row within the KV format's per-row
    bound of the reference (ROW_REL_L2_VS_A8W8: fp8 the check's default; mxfp4 KV differs
    from the fp8 reference by up to ~26% in a row, so it is held per row to float32 attention
    on its own dequantized values instead). Prints each format's margin."""
    seed = fresh_seed()
    data = task_inputs.generate_input(batch, kv_len, seed)
    q, kv_data, qo_indptr, kv_indptr, config = data
    ref = task_inputs.reference_a8w8(data)
    lines = []
    for fmt in FORMATS + ("fastest",):
        for q_dtype in ("bf16", "fp8"):
            out = mlagen.decode(q, kv_data, qo_indptr, kv_indptr, config, kv_format=fmt, q_dtype=q_dtype)
            kv_dtype = mlagen.last_kernel()["kv_dtype"]
            bound = ROW_REL_L2_VS_A8W8[kv_dtype]
            res = task_inputs.check_output(data, out, reference=lambda _d: ref, row_bound=bound)
            lines.append(f"{batch}x{kv_len} kv={fmt:7s} q={q_dtype}: mismatch {res.mismatch:.4%} "
                         f"rel_l2 {res.rel_l2:.3e} max_abs {res.max_abs:.3e} max row {res.max_row_rel_l2:.3e} "
                         f"(bound {bound}) -> {'pass' if res.ok else 'FAIL'}")
            assert res.ok, lines[-1] + f" seed {seed} ({res.message})"
            assert res.mismatch < 0.05 / 2, lines[-1] + ": less than 2x margin to the 5% limit"
            if bound is None:  # per row against the values the kernel computes with
                q_seen = q if q_dtype == "bf16" else quant.dequantize_fp8(*quant.quantize_q_fp8(q))
                d4, s4 = kv_data["mxfp4"]
                d4, s4 = d4.view(torch.uint8).reshape(d4.shape[0], -1), s4.view(torch.uint8)
                same = task_inputs.attention_reference(q_seen, lambda a, b: quant.dequantize_mxfp4(d4[a:b], s4[a:b]),
                                                       qo_indptr, kv_indptr, task_inputs.SM_SCALE)
                worst = task_inputs.row_rel_l2(out, same).max().item()
                tol = TOLERANCES[(kv_dtype, "same_inputs")]["row_rel_l2"]
                assert worst <= tol, lines[-1] + f" seed {seed}: max row rel_l2 {worst:.3e} vs fp32 on its values " \
                                                 f"(tol {tol})"
    with capsys.disabled():
        print("\n" + "\n".join(lines))
