"""CPU tests of the engine-facing decode (mlagen.serving): what it hands the library per call.

mlagen.prepare needs a GPU, so it is replaced by a recorder whose Plan.run records its arguments;
everything else is the real MLADecoder. Checked: the cache, block table, seq_lens and scales a
call passes are the very tensors Plan.run gets (same objects: nothing copied), a uint8 fp8 cache
is planned as a float8 view of the same storage, a split q is joined into one kept buffer, a
plan is made once per batch shape and never for new block-table contents or lengths, and bad
configurations are refused naming the field. tests/gpu/test_serving.py runs the same calls on
the GPU against float64.
"""
import pytest

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import serving  # noqa: E402

H, BS, NB = 16, 64, 40


class Recorder:
    def __init__(self):
        self.prepared, self.runs = [], []

    def prepare(self, q, kv, kv_scale, qo_indptr, kv_indptr, config, **kw):
        rec = self

        class Plan:
            device, device_index = q.device, 0
            out_shape = (q.shape[0], q.shape[1], 512)

            def run(self, *args):
                rec.runs.append(args)

        self.prepared.append(dict(q=q, kv=kv, kv_scale=kv_scale, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                                  config=config, **kw))
        return Plan()


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(serving, "prepare", r.prepare)
    monkeypatch.setattr(mlagen._launch, "handle", lambda index: 1234)
    serving._qo_cache.clear()
    return r


def inputs(batch=3, q_len=1, fp8=True, max_blocks=5):
    cache = torch.zeros((NB, BS, 576), dtype=torch.uint8 if fp8 else torch.bfloat16)
    table = torch.randint(0, NB, (batch, max_blocks), dtype=torch.int32)
    lens = torch.randint(1, max_blocks * BS, (batch,), dtype=torch.int32)
    q = torch.zeros((batch * q_len, H, 576), dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)
    return q, cache, table, lens


def decoder(fp8=True, lse=True):
    return serving.MLADecoder(H, kv_cache_dtype="fp8" if fp8 else "bf16", block_size=BS, sm_scale=0.1,
                              q_dtype="fp8" if fp8 else "bf16", return_lse=lse)


def test_forward_passes_the_callers_tensors_uncopied(rec):
    dec = decoder()
    q, cache, table, lens = inputs(q_len=2)
    k_scale, q_scale = torch.tensor(0.5), torch.tensor(0.25)  # vLLM's layer._k_scale / _q_scale: 0-dim float32
    o, lse = dec.forward(q, cache, table, lens, k_scale=k_scale, q_scale=q_scale)
    (p,) = rec.prepared
    assert p["kv"].dtype == torch.float8_e4m3fn and p["kv"].data_ptr() == cache.data_ptr()  # a view, not a copy
    assert p["page_size"] == BS and p["page_table"] is table and p["kv_lens"] is lens and p["kv_indptr"] is None
    assert p["q_len"] == 2 and p["return_lse"] and p["kv_format"] == "fp8" and p["q_dtype"] == "fp8"
    assert p["config"] == {"batch_size": 3, "num_heads": H, "sm_scale": 0.1, "kv_seq_len": None}
    assert p["qo_indptr"].tolist() == [0, 2, 4, 6]
    (args,) = rec.runs
    rq, rqs, rkv, rks, rqo, rkvi, rout, where, rlse, pages = args
    assert rq is q and rqs is q_scale and rkv is cache and rks is k_scale and rkvi is None and where == 1234
    assert rqo is p["qo_indptr"] and pages[0] is table and pages[1] is lens and pages[2:] == (None, None)
    assert rout is o and o.shape == (6, H, 512) and o.dtype == torch.bfloat16
    assert rlse is lse and lse.shape == (6, H) and lse.dtype == torch.float32


def test_one_plan_per_batch_shape_never_per_contents(rec):
    dec = decoder(lse=False)
    q, cache, table, lens = inputs()
    s = torch.ones(())
    for _ in range(3):
        table.random_(0, NB)
        lens.random_(1, 100)
        o, lse = dec.forward(q, cache, table, lens, k_scale=s, q_scale=s)
        assert lse is None
    assert len(rec.prepared) == 1 and len(rec.runs) == 3
    q2, _, table2, lens2 = inputs(batch=5)  # another batch size: its own plan, once
    dec.forward(q2, cache, table2, lens2, k_scale=s, q_scale=s)
    dec.forward(q2, cache, table2, lens2, k_scale=s, q_scale=s)
    assert len(rec.prepared) == 2
    dec.forward(q, cache, table, lens, k_scale=s, q_scale=s)  # the first shape's plan is kept
    assert len(rec.prepared) == 2 and len(rec.runs) == 6


def test_plan_ahead_is_what_forward_finds(rec):
    dec = decoder(fp8=False, lse=False)
    dec.plan(3, 5, NB, q_len=2, device="cpu")
    q, cache, table, lens = inputs(q_len=2, fp8=False)
    dec.forward(q, cache, table, lens)
    assert len(rec.prepared) == 1 and len(rec.runs) == 1


def test_split_q_is_joined_into_one_kept_buffer(rec):
    dec = decoder(fp8=False, lse=False)
    _, cache, table, lens = inputs(fp8=False)
    full = torch.randn((3, H, 576)).to(torch.bfloat16)
    nope, pe = full[..., :512].clone(), full[..., 512:]  # vLLM: ql_nope its own buffer, q_pe a view of q
    dec.forward((nope, pe), cache, table, lens)
    q1 = rec.runs[0][0]
    assert torch.equal(q1, full) and q1.is_contiguous()
    dec.forward((nope * 2, pe), cache, table, lens)
    q2 = rec.runs[1][0]
    assert q2.data_ptr() == q1.data_ptr() and torch.equal(q2[..., :512], nope * 2)
    assert len(rec.prepared) == 1


def test_out_and_lse_given_are_written_in_place(rec):
    dec = decoder()
    q, cache, table, lens = inputs()
    s = torch.ones(())
    out, lse = torch.empty((3, H, 512), dtype=torch.bfloat16), torch.empty((3, H))
    o, l2 = dec.forward(q, cache, table, lens, k_scale=s, q_scale=s, out=out, lse=lse)
    assert o is out and l2 is lse and rec.runs[0][6] is out and rec.runs[0][8] is lse
    with pytest.raises(mlagen.MlagenError, match="out:"):
        dec.forward(q, cache, table, lens, k_scale=s, q_scale=s, out=out[:2])


@pytest.mark.parametrize("kw,msg", [
    (dict(num_heads=12), "num_heads=12"),
    (dict(block_size=48), "block_size=48"),
    (dict(block_size=512), "block_size=512"),
    (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype"),
    (dict(q_dtype="fp16"), "q_dtype"),
    (dict(sm_scale=0.0), "sm_scale"),
    (dict(max_q_len=5), "max_q_len"),
])
def test_bad_configurations_are_refused(kw, msg):
    args = dict(num_heads=H, block_size=BS, sm_scale=0.1)
    args.update(kw)
    with pytest.raises(mlagen.MlagenError, match=msg):
        serving.MLADecoder(args.pop("num_heads"), **args)


def test_bad_calls_name_the_field(rec):
    dec = decoder()
    q, cache, table, lens = inputs(batch=3)
    s = torch.ones(())
    with pytest.raises(mlagen.MlagenError, match="token rows"):
        dec.forward(q[:2], cache, table, lens, k_scale=s, q_scale=s)   # not batch * q_len
    with pytest.raises(mlagen.MlagenError, match="seq_lens"):
        dec.forward(q, cache, table, lens[:2], k_scale=s, q_scale=s)
    with pytest.raises(mlagen.MlagenError, match="k_scale"):
        dec.forward(q, cache, table, lens, q_scale=s)
    with pytest.raises(mlagen.MlagenError, match="block_size=64"):
        dec.forward(q, cache.view(NB * 2, BS // 2, 576), table, lens, k_scale=s, q_scale=s)
    with pytest.raises(mlagen.MlagenError, match="heads"):
        dec.forward(q[:, :8], cache, table, lens, k_scale=s, q_scale=s)
    assert not rec.runs


def test_every_power_of_two_block_size_is_offered():
    assert serving.BLOCK_SIZES == (1, 2, 4, 8, 16, 32, 64, 128, 256)
