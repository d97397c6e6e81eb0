"""CPU tests of the binding's format handling (no GPU, no library calls): which KV entry a
kv_format takes, "fastest", and the messages for a wrong kv_data or q."""
import pytest

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402


def _kv_data():
    kv = torch.zeros((8, 1, 576), dtype=torch.bfloat16)
    return {"bf16": kv, "fp8": (kv.to(torch.float8_e4m3fn), torch.ones(1)),
            "mxfp4": (torch.zeros((8, 1, 288), dtype=torch.uint8), torch.zeros((8, 18), dtype=torch.uint8))}


@pytest.mark.parametrize("fmt", mlagen.KV_FORMATS)
def test_each_format_takes_its_entry(fmt):
    data = _kv_data()
    kv, scale = mlagen._unpack_kv(data, fmt)
    expect = data[fmt] if fmt != "bf16" else (data["bf16"], None)
    assert kv is expect[0] and scale is expect[1]


def test_bf16_entry_may_be_a_pair_or_the_tensor():
    data = _kv_data()
    assert mlagen._unpack_kv({"bf16": (data["bf16"], None)}, "bf16")[0] is data["bf16"]
    assert mlagen._unpack_kv(data["bf16"], "bf16") == (data["bf16"], None)


def test_fastest_takes_the_first_present_in_the_arch_order(monkeypatch):
    monkeypatch.setattr(mlagen, "_build_arch", lambda: "sm90a")
    order = mlagen.FASTEST_ORDER["sm90a"]
    data = _kv_data()
    assert mlagen.resolve_format(data, "fastest") == order[0]
    del data[order[0]]
    assert mlagen.resolve_format(data, "fastest") == order[1]
    assert mlagen.resolve_format(data, "bf16") == "bf16"  # explicit formats pass through
    with pytest.raises(mlagen.MlagenError, match="none of"):
        mlagen.resolve_format({"int4": None}, "fastest")
    with pytest.raises(mlagen.MlagenError, match="dict of formats"):
        mlagen.resolve_format(data["bf16"], "fastest")


def test_every_arch_orders_every_format():
    for arch, order in mlagen.FASTEST_ORDER.items():
        assert sorted(order) == sorted(mlagen.KV_FORMATS), arch


@pytest.mark.parametrize("data,fmt,msg", [
    ({"fp8": None}, "mxfp4", "no 'mxfp4' entry"),
    ({"fp8": (1, 2, 3)}, "fp8", "expected \\(kv tensor, scale tensor\\)"),
])
def test_bad_kv_data_names_the_entry(data, fmt, msg):
    with pytest.raises(mlagen.MlagenError, match=msg):
        mlagen._unpack_kv(data, fmt)


@pytest.mark.parametrize("fmt,kv,scale,msg", [
    ("fp8", torch.zeros((2, 1, 576), dtype=torch.bfloat16), torch.ones(1), "expected torch.float8_e4m3fn"),
    ("fp8", torch.zeros((2, 1, 576), dtype=torch.float8_e4m3fn), torch.ones(2), "expected one float32"),
    ("bf16", torch.zeros((2, 1, 576), dtype=torch.float16), None, "expected torch.bfloat16"),
    ("mxfp4", torch.zeros((2, 1, 288), dtype=torch.int8), torch.zeros((2, 18), dtype=torch.uint8), "torch.uint8"),
    ("mxfp4", torch.zeros((2, 1, 288), dtype=torch.uint8), torch.zeros(36, dtype=torch.uint8), "E8M0 scale rows"),
    ("int4", torch.zeros(1), None, "kv_format='int4'"),
])
def test_kv_tensors_must_match_the_named_format(fmt, kv, scale, msg):
    with pytest.raises(mlagen.MlagenError, match=msg):
        mlagen._kv_dtype_name(fmt, kv, scale)


def test_q_checks():
    q = torch.zeros((2, 16, 576), dtype=torch.bfloat16)
    mlagen._check_q(q, "bf16", None)
    mlagen._check_q(q, "fp8", None)  # quantized on the device
    with pytest.raises(mlagen.MlagenError, match="q_scale: given with a bf16 q"):
        mlagen._check_q(q, "fp8", torch.ones(1))
    with pytest.raises(mlagen.MlagenError, match="q_scale: expected one float32"):
        mlagen._check_q(q.to(torch.float8_e4m3fn), "fp8", None)
    with pytest.raises(mlagen.MlagenError, match="q_dtype='int8'"):
        mlagen._check_q(q, "int8", None)
    with pytest.raises(mlagen.MlagenError, match="expected torch.bfloat16 for q_dtype='bf16'"):
        mlagen._check_q(q.float(), "bf16", None)


def test_leaderboard_entry_fastest_picks_once_and_follows_the_data(monkeypatch):
    """custom_kernel with "fastest": the arch's first format the data holds, re-chosen when a
    later call's dict lacks it (the device call is stubbed: this checks the choice only)."""
    monkeypatch.setattr(mlagen, "_build_arch", lambda: "sm90a")
    seen = []
    monkeypatch.setattr(mlagen, "_decode_cached", lambda *a: seen.append(a[5]) or "out")
    entry = mlagen.leaderboard_entry()  # the default: fastest
    data = _kv_data()
    order = mlagen.FASTEST_ORDER["sm90a"]
    assert entry((None, data, None, None, {})) == "out" and seen[-1] == order[0]
    assert entry((None, data, None, None, {})) == "out" and seen[-1] == order[0]
    data.pop(order[0])
    entry((None, data, None, None, {}))
    assert seen[-1] == order[1]
    entry((None, _kv_data(), None, None, {}))  # the first choice is back
    assert seen[-1] == order[0]
    fixed = mlagen.leaderboard_entry("bf16")
    fixed((None, _kv_data(), None, None, {}))
    assert seen[-1] == "bf16"
