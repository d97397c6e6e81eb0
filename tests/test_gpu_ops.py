"""GPU tests of torch.ops.mlagen.decode (runtime/python/mlagen/ops.py): torch.library.opcheck,
the op's output equal to mlagen.decode's, torch.compile(fullgraph=True), CUDA graph capture.
Fresh random inputs each test; outputs compared bit for bit with the eager binding."""
import random

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
import mlagen.ops  # noqa: E402,F401  (registers torch.ops.mlagen.decode)
from mlagen import quant  # noqa: E402

from reference import make_inputs  # noqa: E402

pytestmark = pytest.mark.gpu
SM = 576 ** -0.5
# opcheck's test_schema compares every input before and after the call with torch.allclose,
# which torch does not implement for float8 tensors ("mul_cuda" not implemented for
# 'Float8_e4m3fn'); with an fp8 input it runs the other three checks (the schema check runs on
# the bf16 and mxfp4 cases, same op and schema).
ALL_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


def _args(fmt, batch=4, kv_len=1024, q_dtype="bf16", uniform=True):
    seed = fresh_seed()
    inp = make_inputs([kv_len] * batch if uniform else [kv_len + 7 * b for b in range(batch)], seed)
    if fmt == "fp8":
        kv, scale = inp["kv_fp8"], inp["kv_scale"]
    elif fmt == "bf16":
        kv, scale = inp["kv_bf16"], None
    else:
        kv, scale = quant.quantize_mxfp4(inp["kv_bf16"])
    q_scale = None
    q = inp["q"]
    if q_dtype == "fp8s":  # an fp8 q given with its scale
        q, q_scale = quant.quantize_q_fp8(q)
        q_dtype = "fp8"
    return seed, (q, kv, scale, inp["qo_indptr"], inp["kv_indptr"], fmt, q_dtype, kv_len if uniform else 0, SM,
                  q_scale)


def _eager(args):
    q, kv, scale, qo, kvp, fmt, q_dtype, kv_len, sm, q_scale = args
    config = {"batch_size": qo.numel() - 1, "kv_seq_len": kv_len or None, "sm_scale": sm}
    return mlagen.decode(q, {fmt: kv if fmt == "bf16" else (kv, scale)}, qo, kvp, config, kv_format=fmt,
                         q_dtype=q_dtype, q_scale=q_scale)


@pytest.mark.parametrize("fmt,q_dtype,uniform", [("fp8", "bf16", True), ("fp8", "fp8", True), ("fp8", "fp8s", True),
                                                 ("bf16", "bf16", True), ("mxfp4", "bf16", True),
                                                 ("fp8", "bf16", False)])
def test_op_matches_decode_and_passes_opcheck(fmt, q_dtype, uniform):
    seed, args = _args(fmt, q_dtype=q_dtype, uniform=uniform)
    out = torch.ops.mlagen.decode(*args)
    want = _eager(args)
    torch.cuda.synchronize()
    assert out.shape == (4, 16, 512) and out.dtype == torch.bfloat16
    assert torch.equal(out, want), f"seed {seed}: the op differs from mlagen.decode"
    assert torch.isfinite(out.float()).all()
    fp8_input = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    checks = tuple(c for c in ALL_CHECKS if not (fp8_input and c == "test_schema"))
    torch.library.opcheck(torch.ops.mlagen.decode.default, args, test_utils=checks)


def test_op_under_torch_compile_fullgraph():
    seed, args = _args("fp8", batch=8, kv_len=2048)

    def model(q, kv, scale, qo, kvp):
        o = torch.ops.mlagen.decode(q, kv, scale, qo, kvp, "fp8", "bf16", 2048, SM)
        return o, o.float().sum(-1) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    got_o, got_s = compiled(*args[:5])
    want_o, want_s = model(*args[:5])
    torch.cuda.synchronize()
    assert torch.equal(got_o, want_o), f"seed {seed}: the op's output under compile differs from eager"
    # the reduction around it is inductor's (its order may differ from eager's in the last bits)
    assert torch.allclose(got_s, want_s, rtol=1e-5, atol=1e-3), f"seed {seed}: (max diff {(got_s - want_s).abs().max()})"
    again_o, _ = compiled(*_args("fp8", batch=8, kv_len=2048)[1][:5])  # fresh inputs, same graph
    assert again_o.shape == (8, 16, 512) and torch.isfinite(again_o.float()).all()


def test_op_in_a_cuda_graph():
    seed, args = _args("fp8", batch=4, kv_len=1024)
    q, kv, scale, qo, kvp = args[:5]
    torch.ops.mlagen.decode(*args)  # plan and first-use scratch outside capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.mlagen.decode(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = torch.ops.mlagen.decode(*args)
    fresh = _args("fp8", batch=4, kv_len=1024)[1]
    q.copy_(fresh[0])
    kv.copy_(fresh[1])
    scale.copy_(fresh[2])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _eager(args)), f"seed {seed}: replay differs from an eager call on the new inputs"
