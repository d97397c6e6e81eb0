"""GPU tests of torch.ops.mlagen.decode (runtime/python/mlagen/ops.py): torch.library.opcheck,
the op's output equal to mlagen.decode's, torch.compile(fullgraph=True), CUDA graph capture.
Fresh random inputs each test; outputs compared bit for bit with the eager binding."""
import contextlib
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


def _capture(op, args):
    """op(*args) captured into a CUDA graph on a side stream, after a call there outside the
    capture (its plan and that stream's scratch are made first): (graph, the captured outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = op(*args)
    return graph, outs


def test_op_in_a_cuda_graph():
    seed, args = _args("fp8", batch=4, kv_len=1024)
    q, kv, scale, qo, kvp = args[:5]
    torch.ops.mlagen.decode(*args)  # plan and first-use scratch outside capture
    graph, out = _capture(torch.ops.mlagen.decode, args)
    fresh = _args("fp8", batch=4, kv_len=1024)[1]
    q.copy_(fresh[0])
    kv.copy_(fresh[1])
    scale.copy_(fresh[2])
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _eager(args)), f"seed {seed}: replay differs from an eager call on the new inputs"


def _rows_args(heads, q_len, paged, seed):
    """heads x q_len query rows; paged: a random block table over pages of 64 ("indices":
    the same pages in FlashInfer's form)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch, kv_len = 3, 640
    kv = torch.randn((batch * kv_len, 1, 576), generator=g, device="cuda").to(torch.bfloat16)
    fp8, scale = quant.quantize_fp8(kv)
    q = torch.randn((batch * q_len, heads, 576), generator=g, device="cuda").to(torch.bfloat16)
    qo = torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device="cuda")
    kvp = torch.arange(0, (batch + 1) * kv_len, kv_len, dtype=torch.int32, device="cuda")
    if not paged:
        return (q, fp8, scale, qo, kvp, "fp8", "bf16", kv_len, SM, None, q_len)
    table = torch.randperm(batch * kv_len // 64, generator=g, device="cuda").to(torch.int32).view(batch, -1)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    if paged == "indices":
        page_ip = torch.arange(0, (batch + 1) * table.shape[1], table.shape[1], dtype=torch.int32, device="cuda")
        last = torch.full((batch,), 64, dtype=torch.int32, device="cuda")
        return (q, fp8.view(-1, 64, 1, 576), scale, qo, page_ip, "fp8", "bf16", kv_len, SM, None, q_len, None, None, 64,
                table.reshape(-1).contiguous(), last)
    return (q, fp8.view(-1, 64, 1, 576), scale, qo, None, "fp8", "bf16", kv_len, SM, None, q_len, table, lens, 64)


@pytest.mark.parametrize("heads,q_len,paged", [(128, 1, False), (8, 2, True), (32, 4, False), (16, 3, True),
                                               (64, 2, "indices")])
def test_lse_op_rows_and_pages_match_decode_and_pass_opcheck(heads, q_len, paged):
    seed = fresh_seed()
    args = _rows_args(heads, q_len, paged, seed)
    out, lse = torch.ops.mlagen.decode_lse(*args)
    only = torch.ops.mlagen.decode(*args)
    q, kv, scale, qo, kvp = args[:5]
    config = {"batch_size": qo.numel() - 1, "kv_seq_len": args[7], "sm_scale": SM}
    kw = dict(page_table=args[11], kv_lens=args[12], page_size=64) if paged else {}
    if paged == "indices":
        kw = dict(kv_indices=args[14], kv_last_page_len=args[15], page_size=64)
    want, want_lse = mlagen.decode(q, {"fp8": (kv, scale)}, qo, kvp, config, kv_format="fp8", q_len=q_len,
                                   return_lse=True, **kw)
    torch.cuda.synchronize()
    assert out.shape == (q.shape[0], heads, 512) and lse.shape == (q.shape[0], heads) and lse.dtype == torch.float32
    assert torch.equal(out, want) and torch.equal(only, want), f"seed {seed}: the op differs from mlagen.decode"
    assert torch.equal(lse, want_lse) and torch.isfinite(lse).all(), f"seed {seed}: LSE differs"
    checks = tuple(c for c in ALL_CHECKS if c != "test_schema")  # fp8 inputs (see ALL_CHECKS)
    torch.library.opcheck(torch.ops.mlagen.decode_lse.default, args, test_utils=checks)
    torch.library.opcheck(torch.ops.mlagen.decode.default, args, test_utils=checks)


def test_lse_op_rows_under_compile_and_in_a_graph():
    """128 heads x 2 tokens on a paged cache: torch.compile(fullgraph=True), then graph replay."""
    seed = fresh_seed()
    args = list(_rows_args(128, 2, True, seed))

    def model(*a):
        o, l = torch.ops.mlagen.decode_lse(*a)
        return o, l * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    got_o, got_l = compiled(*args)
    want_o, want_l = model(*args)
    torch.cuda.synchronize()
    assert torch.equal(got_o, want_o) and torch.equal(got_l, want_l), f"seed {seed}: compiled differs from eager"
    graph, (o, l) = _capture(torch.ops.mlagen.decode_lse, args)
    fresh = _rows_args(128, 2, True, fresh_seed())
    args[0].copy_(fresh[0])
    args[1].copy_(fresh[1])
    args[11].copy_(fresh[11])  # a new page order too
    o.fill_(float("nan"))
    l.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want_o, want_l = torch.ops.mlagen.decode_lse(*args)
    torch.cuda.synchronize()
    assert torch.equal(o, want_o) and torch.equal(l, want_l), f"seed {seed}: replay differs from an eager call"


# ---- the C++ operators (runtime/torch/ops.cpp) against the ctypes path ------------------------------

def test_the_registration_follows_the_build():
    """Where libmlagen_torch.so is built (CMake MLAGEN_TORCH_OP, on by default, against this torch)
    decode() and torch.ops.mlagen.* run through it; where it is not, the Python registration serves
    and decode() takes the ctypes path."""
    import os
    from mlagen import ops
    if os.path.exists(ops.native_path()):
        assert ops.REGISTRATION == "native", f"the Python registration serves: {ops.native_path()} (see the warning)"
        assert mlagen._native is not None
    else:
        assert ops.REGISTRATION == "python" and mlagen._native is None


def test_the_operator_object_shares_torchs_libstdcxx():
    """libmlagen_torch.so passes C++ objects to torch (streams, strings, exceptions), so it must run
    on the libstdc++ torch runs on: NEEDED libstdc++.so.6 and no std:: definition exported. On the
    H200's image g++ found only libstdc++.a; the object carried its own copy (4072 std:: symbols
    exported) and crashed in c10's stream insertion (CMakeLists.txt links torch's libstdc++ file)."""
    import os
    import re
    import subprocess
    from mlagen import ops
    path = ops.native_path()
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (-DMLAGEN_TORCH_OP=OFF or no torch at configure time)")
    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    assert "libstdc++.so.6" in needed, f"{path}: NEEDED {needed}: libstdc++ linked in, not torch's"
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True, check=True).stdout
    std = [f[7] for f in (line.split() for line in syms.splitlines())
           if len(f) >= 8 and f[6] != "UND" and f[7].startswith(("_ZNSt", "_ZNKSt", "_ZSt", "_ZNSs", "_ZNKSs"))
           and f[4] != "LOCAL"]
    # inline template instantiations of the headers may be exported weak; a linked-in copy exports thousands
    assert len(std) < 200, f"{path}: exports {len(std)} std:: definitions, e.g. {std[:5]}"


def _paths_case(case, seed):
    """(decode's positional args, its keyword args) for one kind of input."""
    inp = make_inputs([1024] * 4 if case != "nonuniform" else [300, 1024, 7, 2000], seed)
    kv_data = {"fp8": (inp["kv_fp8"], inp["kv_scale"]), "bf16": inp["kv_bf16"]}
    args = (inp["q"], kv_data, inp["qo_indptr"], inp["kv_indptr"], inp["config"])
    if case == "bf16":
        return args, dict(kv_format="bf16")
    if case == "mxfp4":
        kv_data["mxfp4"] = quant.quantize_mxfp4(inp["kv_bf16"], pad_scales=True)
        return args, dict(kv_format="mxfp4")
    if case == "q8":
        return args, dict(q_dtype="fp8")
    if case == "q8s":
        q8, qs = quant.quantize_q_fp8(inp["q"])
        return (q8,) + args[1:], dict(q_dtype="fp8", q_scale=qs)
    if case == "lse":
        return args, dict(return_lse=True)
    if case in ("table", "indices"):
        pages = 4 * 1024 // 64
        order = torch.randperm(pages, device="cuda")
        cache = torch.empty((pages, 64, 1, 576), dtype=torch.uint8, device="cuda")
        cache[order] = inp["kv_fp8"].view(torch.uint8).view(pages, 64, 1, 576)
        paged = {"fp8": (cache.view(torch.float8_e4m3fn), inp["kv_scale"])}
        table = order.view(4, -1).to(torch.int32)
        if case == "table":
            return (inp["q"], paged, inp["qo_indptr"], None, inp["config"]), dict(
                page_table=table, kv_lens=torch.full((4,), 1024, dtype=torch.int32, device="cuda"), page_size=64,
                return_lse=True)
        ip = torch.arange(0, 5 * table.shape[1], table.shape[1], dtype=torch.int32, device="cuda")
        return (inp["q"], paged, inp["qo_indptr"], ip, inp["config"]), dict(
            kv_indices=table.reshape(-1).contiguous(), page_size=64,
            kv_last_page_len=torch.full((4,), 64, dtype=torch.int32, device="cuda"))
    return args, {}


@pytest.mark.parametrize("case", ["fp8", "bf16", "mxfp4", "q8", "q8s", "nonuniform", "lse", "table", "indices"])
def test_cpp_and_ctypes_paths_give_the_same_output(case):
    """decode()'s common case goes through the C++ operator; out= takes the ctypes path (prepare,
    Plan.run): the two map the tensors onto the same problem, so the same kernel and bits."""
    seed = fresh_seed()
    args, kw = _paths_case(case, seed)
    got = mlagen.decode(*args, **kw)
    cpp_kernel = mlagen.last_kernel()
    q = args[0]
    buf = torch.full((q.shape[0], q.shape[1], 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    want = mlagen.decode(*args, out=buf, **kw)
    torch.cuda.synchronize()
    assert mlagen.last_kernel() == cpp_kernel, f"seed {seed}: the two paths chose different kernels"
    if kw.get("return_lse"):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"seed {seed}: {case} differs"
    else:
        assert torch.equal(got, want), f"seed {seed}: {case} differs"
    mlagen.check_device_errors()


def _field(e):
    """The field an error names: its text after an optional status prefix, up to ':' or '='."""
    text = str(e)
    if text.startswith("MLAGEN_ERR_"):
        text = text.split(": ", 1)[1]
    return text.replace("=", ":").split(":", 1)[0]


def test_cpp_and_ctypes_paths_name_the_same_field():
    """Each input the binding refuses, refused by both paths naming the same field."""
    inp = make_inputs([512] * 4, fresh_seed())
    q, kv8, scale, qo, kvp, cfg = (inp["q"], inp["kv_fp8"], inp["kv_scale"], inp["qo_indptr"], inp["kv_indptr"],
                                   inp["config"])
    cases = [
        ("q", dict(q=q.float())),
        ("q", dict(q=q.reshape(4, 16 * 576))),
        ("num_heads", dict(q=q[:, :12], cfg=dict(cfg, num_heads=12))),
        ("kv", dict(kv=kv8.view(torch.uint8))),
        ("kv", dict(kv=kv8[:, :, :512])),
        ("kv_scale", dict(scale=scale.double())),
        ("kv_scale", dict(scale=scale.cpu())),
        ("qo_indptr", dict(qo=qo.long())),
        ("qo_indptr", dict(qo=qo.cpu())),
        ("kv_indptr", dict(kvp=torch.stack([kvp, kvp], 1).reshape(-1)[::2])),
        ("q_len", dict(kw=dict(q_len=5))),
        ("q_scale", dict(kw=dict(q_dtype="fp8", q_scale=scale))),
        ("page_size", dict(kw=dict(page_size=12, page_table=torch.zeros((4, 40), dtype=torch.int32, device="cuda"),
                                   kv_lens=torch.full((4,), 512, dtype=torch.int32, device="cuda")))),
        ("page_table", dict(kw=dict(page_size=16, page_table=torch.zeros((4, 40), dtype=torch.int64, device="cuda"),
                                    kv_lens=torch.full((4,), 512, dtype=torch.int32, device="cuda")))),
        ("sm_scale", dict(cfg=dict(cfg, sm_scale=-1.0))),
    ]
    for field, ch in cases:
        a = dict(q=q, kv=kv8, scale=scale, qo=qo, kvp=kvp, cfg=cfg, kw={})
        a.update(ch)
        errors = []
        for out in (None, torch.empty((a["q"].shape[0], 16, 512), dtype=torch.bfloat16, device="cuda")):
            with pytest.raises(mlagen.MlagenError) as e:
                mlagen.decode(a["q"], {"fp8": (a["kv"], a["scale"])}, a["qo"], a["kvp"], a["cfg"], out=out, **a["kw"])
            errors.append(e.value)
        assert [_field(x) for x in errors] == [field, field], f"{field}: {errors}"
    # the operator's own error names the field too (C++: "MLAGEN_ERR_INVALID: kv_scale: ..."; the Python
    # registration: mlagen.MlagenError, a RuntimeError, "kv_scale: ...")
    with pytest.raises(RuntimeError, match="kv_scale: "):
        torch.ops.mlagen.decode(q, kv8, scale.double(), qo, kvp, "fp8", "bf16", 512, SM)


@contextlib.contextmanager
def _python_layers_refused(monkeypatch, what):
    """The binding's Python layers between a call and the C++ entry, patched to fail."""
    def refuse(*a, **k):
        raise AssertionError(f"{what} went through the Python layers")
    with monkeypatch.context() as m:
        m.setattr(mlagen, "_native_call", refuse)
        m.setattr(mlagen, "_decode_cached", refuse)
        yield


def test_the_plain_call_takes_the_cpp_entry_and_follows_the_config(monkeypatch):
    """decode()'s plain call and the leaderboard entry go to the C++ entry with the config (_Native.call)
    once the binding has read an equal config: the Python layers in between may fail and the calls
    still run. A config changed in place, a shape that disagrees with the config, an argument the
    entry does not take: the binding's own path, its result and its message."""
    if mlagen._call is None:
        pytest.skip("the C++ operators are not loaded (registration: python)")
    seed = fresh_seed()
    inp = make_inputs([1024] * 4, seed)
    cfg = dict(inp["config"])
    data = (inp["q"], {"fp8": (inp["kv_fp8"], inp["kv_scale"])}, inp["qo_indptr"], inp["kv_indptr"], cfg)
    entry = mlagen.leaderboard_entry("fp8")

    def ctypes_path(config):
        buf = torch.full((4, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        return mlagen.decode(*data[:4], config, out=buf)

    first = entry(data)  # reads the config (the binding's path)
    want = ctypes_path(cfg)
    assert torch.equal(first, want), f"seed {seed}"

    with _python_layers_refused(monkeypatch, "the plain call"):
        assert torch.equal(entry(data), want), f"seed {seed}: the entry"
        assert torch.equal(mlagen.decode(*data), want), f"seed {seed}: decode"
        assert mlagen.last_kernel()["name"].startswith("mla_decode_sm90a"), mlagen.last_kernel()
    cfg["sm_scale"] = SM * 0.5  # the same dict, changed in place
    halved = mlagen.decode(*data)
    assert torch.equal(halved, ctypes_path(cfg)) and not torch.equal(halved, want), f"seed {seed}: sm_scale"
    assert torch.equal(entry(data), halved), f"seed {seed}: the entry after the change"
    qo6 = torch.arange(6, dtype=torch.int32, device="cuda")
    with pytest.raises(mlagen.MlagenError, match=r"qo_indptr: shape \(6,\): expected \(5,\)"):
        mlagen.decode(data[0], data[1], qo6, data[3], cfg)
    with pytest.raises(mlagen.MlagenError, match="num_heads"):
        mlagen.decode(data[0][:, :8], data[1], data[2], data[3], cfg)
    with pytest.raises(mlagen.MlagenError, match="kv_data"):
        mlagen.decode(data[0], {"bf16": inp["kv_bf16"]}, data[2], data[3], cfg)



@pytest.mark.parametrize("form", ["table", "indices"])
def test_the_paged_call_takes_the_cpp_entry(monkeypatch, form):
    """decode() on a paged cache (a shuffled block table, or FlashInfer's indices; pages of 64) goes to
    the same C++ entry with the page arguments after the plain call's: with the Python layers patched
    to fail it still runs and gives the bits of the binding's own path (out= given); a bad page size
    still raises the binding's named error."""
    if mlagen._call is None:
        pytest.skip("the C++ operators are not loaded (registration: python)")
    seed = fresh_seed()
    inp = make_inputs([1024] * 4, seed)
    cfg = dict(inp["config"])
    page, batch, kv_len = 64, 4, 1024
    pages = batch * kv_len // page
    g = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(pages, generator=g).to("cuda")
    kv8 = inp["kv_fp8"]
    cache = torch.empty((pages, page, 1, 576), dtype=torch.uint8, device="cuda")
    cache[order] = kv8.view(torch.uint8).view(pages, page, 1, 576)
    cache = cache.view(kv8.dtype)
    kv_data = {"fp8": (cache, inp["kv_scale"])}
    per = kv_len // page
    if form == "table":
        pg = dict(page_table=order.view(batch, per).to(torch.int32),
                  kv_lens=torch.full((batch,), kv_len, dtype=torch.int32, device="cuda"), page_size=page)
        kvp = None
    else:
        pg = dict(kv_indices=order.to(torch.int32), page_size=page,
                  kv_last_page_len=torch.full((batch,), page, dtype=torch.int32, device="cuda"))
        kvp = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * per

    buf = torch.full((4, 16, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    want = mlagen.decode(inp["q"], kv_data, inp["qo_indptr"], kvp, cfg, out=buf, **pg).clone()  # the ctypes path
    first = mlagen.decode(inp["q"], kv_data, inp["qo_indptr"], kvp, cfg, **pg)  # reads the config
    assert torch.equal(first, want), f"seed {seed}"

    with _python_layers_refused(monkeypatch, "the paged call"):
        got = mlagen.decode(inp["q"], kv_data, inp["qo_indptr"], kvp, cfg, **pg)
        assert torch.equal(got, want), f"seed {seed} {form}: the C++ entry's paged call"
    plain = mlagen.decode(inp["q"], {"fp8": (kv8, inp["kv_scale"])}, inp["qo_indptr"], inp["kv_indptr"], cfg)
    assert torch.allclose(got.float(), plain.float(), atol=2e-2, rtol=2e-2), f"seed {seed}: paged vs contiguous"
    with pytest.raises(mlagen.MlagenError, match="page_size"):
        mlagen.decode(inp["q"], kv_data, inp["qo_indptr"], kvp, cfg, **dict(pg, page_size=48))

def test_op_scratch_first_made_inside_a_capture():
    """A queue's first call inside a CUDA graph capture gets scratch of its own (zeroed by the
    replays); an eager call on that queue afterwards gets its own too, and both give the eager
    answer (a split shape: the split partials and counters live in the scratch)."""
    seed, args = _args("fp8", batch=4, kv_len=8192)
    want = torch.ops.mlagen.decode(*args)  # the plan, on the current queue
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = torch.ops.mlagen.decode(*args)  # the side queue's first use: inside the capture
    assert mlagen.last_kernel()["splits"] > 1
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"seed {seed}: replay differs"
    with torch.cuda.stream(side):
        eager = [torch.ops.mlagen.decode(*args) for _ in range(3)]
    torch.cuda.synchronize()
    assert all(torch.equal(e, want) for e in eager), f"seed {seed}: an eager call on the captured queue differs"
    mlagen.check_device_errors()


def test_op_device_errors_and_last_kernel():
    """A kernel's input flags are read from the C++ plans' scratch too; last_kernel() names what
    torch.ops.mlagen.decode ran."""
    inp = make_inputs([1024] * 4, fresh_seed())
    bad = inp["kv_indptr"].clone()
    bad[2] += 5  # sums to 4 * 1024 but sequences 1 and 2 are not 1024 long
    out = torch.ops.mlagen.decode(inp["q"], inp["kv_fp8"], inp["kv_scale"], inp["qo_indptr"], bad, "fp8", "bf16",
                                  1024, SM)
    assert not mlagen.last_kernel()["generic"] and mlagen.last_kernel()["batch"] == 4
    torch.cuda.synchronize()
    assert torch.isnan(out[1].float()).all()
    with pytest.raises(mlagen.MlagenError, match="kv_indptr disagrees"):
        mlagen.check_device_errors()
    mlagen.check_device_errors()  # cleared
