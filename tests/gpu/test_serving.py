"""The engine-facing decode (mlagen.serving.MLADecoder) on the GPU, with the tensors an engine
holds: a paged latent cache (num_blocks, block_size, 576) in bf16 or fp8 stored as uint8 with a
0-dim float32 scale (vLLM's layer._k_scale), a block table drawn in random order from the cache
(unused entries point outside it), seq_lens on the device, q concatenated or as (q_nope, q_pe).

Judged per (token, head) row against float64 attention on the values the kernels read (the
dequantized cache, the dequantized fp8 q), outputs poisoned with NaN first; the LSE against
float64's natural-log logsumexp. A CUDA graph captured once replays with new block-table
contents, lengths and q written into the same tensors and must match the reference of the new
inputs, also when its first call is the capture itself (vLLM's default: no eager warm-up). The
host time of a call is compared with mlagen.decode on the same inputs (<= 1 us more).
"""
import math
import random
import time

import pytest

torch = pytest.importorskip("torch", reason="GPU tests need torch")

import mlagen  # noqa: E402
from mlagen import serving  # noqa: E402

from reference import quantize_fp8  # noqa: E402
from tolerances import TOLERANCES, lse_limit  # noqa: E402

pytestmark = pytest.mark.gpu
QK, DV = 576, 512
SM_SCALE = 0.1352  # DeepSeek-V3's: 192 ** -0.5 times the YaRN mscale squared (0.1 ln 40 + 1) ** 2


def fresh_seed():
    return random.SystemRandom().randrange(1 << 31)


class Batch:
    """A paged cache, a random block table over it and q, for `lens` sequences of q_len tokens."""

    def __init__(self, heads, q_len, lens, block_size, cache_dtype, seed, spare=3, width_extra=2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.rng = random.Random(seed)
        self.heads, self.q_len, self.block_size, self.cache_dtype = heads, q_len, block_size, cache_dtype
        self.batch = len(lens)
        self.width = max(1, max(math.ceil(n / block_size) for n in lens)) + width_extra
        self.num_blocks = sum(math.ceil(n / block_size) for n in lens) + spare
        rows = torch.randn((self.num_blocks, block_size, QK), generator=g, device="cuda").to(torch.bfloat16)
        if cache_dtype == "fp8":
            fp8, scale = quantize_fp8(rows)
            self.cache = fp8.view(torch.uint8)            # vLLM stores fp8 as uint8
            self.k_scale = scale.reshape(())              # and its scale as a 0-dim float32
            self.seen_cache = fp8.double() * scale.double()
        else:
            self.cache, self.k_scale, self.seen_cache = rows, None, rows.double()
        self.table = torch.full((self.batch, self.width), self.num_blocks + 1000, dtype=torch.int32, device="cuda")
        self.lens = torch.zeros(self.batch, dtype=torch.int32, device="cuda")
        self.q = torch.empty((self.batch * q_len, heads, QK), dtype=torch.bfloat16, device="cuda")
        self.g = g
        self.set(lens)

    def set(self, lens):
        """New lengths, a new block table and a new q, written into the same tensors."""
        pool = list(range(self.num_blocks))
        self.rng.shuffle(pool)
        table = torch.full((self.batch, self.width), self.num_blocks + 1000, dtype=torch.int32)
        self.lists = []
        for b, n in enumerate(lens):
            blocks = [pool.pop() for _ in range(math.ceil(n / self.block_size))]
            table[b, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            self.lists.append(blocks)
        self.table.copy_(table)
        self.lens.copy_(torch.tensor(lens, dtype=torch.int32))
        self.lens_list = list(lens)
        self.q.copy_(torch.randn(self.q.shape, generator=self.g, device="cuda").to(torch.bfloat16))

    def q_fp8(self):
        """q quantized per tensor as vLLM's static fp8 query quant does (q / scale), scale 0-dim."""
        fp8, scale = quantize_fp8(self.q)
        return fp8, scale.reshape(())

    def reference(self, q64):
        """float64 (out (T, H, 512), lse (T, H)) on the values the kernels read; causal among a
        sequence's q_len tokens (token i sees the first len - q_len + 1 + i rows)."""
        T = self.q.shape[0]
        out = torch.zeros((T, self.heads, DV), dtype=torch.float64, device="cuda")
        lse = torch.full((T, self.heads), -math.inf, dtype=torch.float64, device="cuda")
        flat = self.seen_cache.reshape(-1, QK)
        for b, n in enumerate(self.lens_list):
            idx = [blk * self.block_size + t % self.block_size
                   for t, blk in ((t, self.lists[b][t // self.block_size]) for t in range(n))]
            k = flat[torch.tensor(idx, dtype=torch.long, device="cuda")] if idx else flat[:0]
            for i in range(self.q_len):
                end = max(0, n - self.q_len + 1 + i)
                if end:
                    s = q64[b * self.q_len + i] @ k[:end].T * SM_SCALE
                    out[b * self.q_len + i] = torch.softmax(s, -1) @ k[:end, :DV]
                    lse[b * self.q_len + i] = torch.logsumexp(s, -1)
        return out, lse


def tolerance(cache_dtype):
    # per (token, head) row: 4x the whole-output bound of the format's path on the same inputs,
    # as tests/gpu/test_paged.py and test_rows.py hold their rows
    return 4 * TOLERANCES[("fp8e4m3fn" if cache_dtype == "fp8" else "bf16", "same_inputs")]["rel_l2"]


def check(batch, out, lse, q64, seed, what):
    ref, ref_lse = batch.reference(q64)
    assert not out.isnan().any(), f"seed {seed} {what}: NaN left in the output (a row not written)"
    empty = ref.abs().amax(-1) == 0
    assert (out[empty] == 0).all(), f"seed {seed} {what}: rows that see no key must be zeros"
    err = (out.double() - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    worst = err[~empty].max().item() if (~empty).any() else 0.0
    tol = tolerance(batch.cache_dtype)
    assert worst <= tol, f"seed {seed} {what}: worst row rel-L2 {worst:.2e} > {tol:.1e}"
    if lse is not None:
        fin = torch.isfinite(ref_lse)
        assert (lse[~fin] == -math.inf).all(), f"seed {seed} {what}: LSE of rows with no key must be -inf"
        err = (lse[fin].double() - ref_lse[fin]).abs()
        d = err.max().item() if fin.any() else 0.0
        assert (err <= lse_limit(batch.cache_dtype == "fp8", ref_lse[fin])).all(), \
            f"seed {seed} {what}: LSE off by {d:.2e} (natural log expected)"
    return worst


LENS = {1: [777, 1, 64, 2049, 300, 0], 2: [777, 1, 64, 2049, 2, 0]}  # 1 < q_len: a token seeing nothing; 0: padding


@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("cache_dtype,q_form", [("bf16", "concat"), ("bf16", "split"), ("fp8", "fp8"),
                                                ("fp8", "split")])
def test_matches_float64(heads, q_len, cache_dtype, q_form):
    """bf16 cache: a bf16 q whole or as (q_nope, q_pe); fp8 cache: an fp8 q with its scale (vLLM's
    path) or a bf16 (q_nope, q_pe)."""
    seed = fresh_seed()
    bt = Batch(heads, q_len, LENS[q_len], 64, cache_dtype, seed)
    fp8_q = q_form == "fp8"
    dec = serving.MLADecoder(heads, kv_cache_dtype=cache_dtype, block_size=64, sm_scale=SM_SCALE,
                             q_dtype="fp8" if fp8_q else "bf16", return_lse=True)
    if fp8_q:
        q, q_scale = bt.q_fp8()
        q64 = q.double() * q_scale.double()
    else:
        q, q_scale, q64 = bt.q, None, bt.q.double()
    if q_form == "split":
        nope = q[..., :512].clone()                                    # its own buffer, as vLLM's ql_nope
        pe = torch.cat([torch.zeros_like(q[..., :128]), q[..., 512:]], -1)[..., 128:]  # a strided view, as q_pe
        q = (nope, pe)
    out = torch.full((bt.q.shape[0], heads, DV), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((bt.q.shape[0], heads), float("nan"), dtype=torch.float32, device="cuda")
    o, l2 = dec.forward(q, bt.cache, bt.table, bt.lens, k_scale=bt.k_scale, q_scale=q_scale, out=out, lse=lse)
    dec.check_device_errors()
    assert o is out and l2 is lse
    worst = check(bt, out, lse, q64, seed, f"{cache_dtype} cache, q {q_form}, {heads} heads, q_len {q_len}")
    print(f"{cache_dtype} cache, q {q_form}, {heads} heads, q_len {q_len}: worst row rel-L2 {worst:.2e}")


@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_block_sizes(block_size):
    seed = fresh_seed()
    bt = Batch(16, 1, [513, 1000, 3], block_size, "fp8", seed)
    dec = serving.MLADecoder(16, kv_cache_dtype="fp8", block_size=block_size, sm_scale=SM_SCALE)
    out = torch.full((3, 16, DV), float("nan"), dtype=torch.bfloat16, device="cuda")
    o, lse = dec.forward(bt.q, bt.cache, bt.table, bt.lens, k_scale=bt.k_scale, out=out)
    torch.cuda.synchronize()
    assert lse is None
    check(bt, o, None, bt.q.double(), seed, f"block size {block_size}")


def _capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        res = fn()
    torch.cuda.current_stream().wait_stream(s)
    return g, res


@pytest.mark.parametrize("first_call", ["eager", "in_capture"])
@pytest.mark.parametrize("cache_dtype,heads,q_len", [("fp8", 128, 1), ("fp8", 16, 2), ("bf16", 16, 2)])
def test_cuda_graph_replays_new_tables_and_lengths(first_call, cache_dtype, heads, q_len):
    """Captured once; each replay sees a new block table, new lengths and a new q written into the
    captured tensors, and must match the reference of those inputs. in_capture: the decode's first
    call is the capture (vLLM captures without warm-up; its metadata build, outside the capture,
    makes the query offsets: serving.qo_indptr)."""
    seed = fresh_seed()
    bt = Batch(heads, q_len, [900, 5, 4096, 64], 64, cache_dtype, seed, spare=220, width_extra=12)
    fp8 = cache_dtype == "fp8"
    dec = serving.MLADecoder(heads, kv_cache_dtype=cache_dtype, block_size=64, sm_scale=SM_SCALE,
                             q_dtype="fp8" if fp8 else "bf16", return_lse=True)
    qbuf = torch.empty(bt.q.shape, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device="cuda")
    q_scale = torch.ones((), dtype=torch.float32, device="cuda") if fp8 else None
    cache = bt.cache.view(torch.float8_e4m3fn) if fp8 else bt.cache  # what vLLM's layer hands forward_mqa

    def load():
        if fp8:
            q8, s = bt.q_fp8()
            qbuf.copy_(q8)
            q_scale.copy_(s)
            return q8.double() * s.double()
        qbuf.copy_(bt.q)
        return bt.q.double()

    q64 = load()
    if first_call == "eager":
        dec.forward(qbuf, cache, bt.table, bt.lens, k_scale=bt.k_scale, q_scale=q_scale)
    else:  # as vLLM: eager runs of other batch sizes before (profiling), this one's offsets made by its build
        dec.forward(qbuf[:q_len], cache, bt.table[:1], bt.lens[:1], k_scale=bt.k_scale, q_scale=q_scale)
        serving.qo_indptr(bt.batch, q_len, qbuf.device)
    g, (out, lse) = _capture(lambda: dec.forward(qbuf, cache, bt.table, bt.lens, k_scale=bt.k_scale,
                                                 q_scale=q_scale))
    rng = random.Random(seed)
    for step in range(4):
        if step:
            bt.set([rng.randrange(q_len, 4000) for _ in range(bt.batch - 1)] + [0])  # the last: padding
            q64 = load()
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check(bt, out, lse, q64, seed, f"replay {step} ({first_call}, lens {bt.lens_list})")
    dec.check_device_errors()


def _per_call_us(fn, calls=200, rounds=15):
    """Median over rounds of the host time a call takes, back to back (synchronized between rounds)."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def _gpu_us(fn, calls=200):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


@pytest.mark.parametrize("cache_dtype,return_lse", [("fp8", False), ("fp8", True), ("bf16", False)])
def test_host_time_within_a_microsecond_of_decode(cache_dtype, return_lse):
    """The same inputs through mlagen.decode (block table, lengths, paged cache) and through the
    engine-facing call; a small problem so the GPU keeps up and the figure is host time. A/B
    interleaved, medians of rounds."""
    bt = Batch(16, 1, [64], 64, cache_dtype, 1234)
    fp8 = cache_dtype == "fp8"
    q, q_scale = bt.q_fp8() if fp8 else (bt.q, None)
    q_scale1 = q_scale.reshape(1) if fp8 else None
    dec = serving.MLADecoder(16, kv_cache_dtype=cache_dtype, block_size=64, sm_scale=SM_SCALE,
                             q_dtype="fp8" if fp8 else "bf16", return_lse=return_lse)
    kv = bt.cache.view(torch.float8_e4m3fn) if fp8 else bt.cache
    kv_data = {"fp8": (kv, bt.k_scale.reshape(1))} if fp8 else {"bf16": kv}
    qo = serving.qo_indptr(1, 1, q.device)
    config = {"batch_size": 1, "num_heads": 16, "sm_scale": SM_SCALE, "kv_seq_len": None}

    def via_decode():
        return mlagen.decode(q, kv_data, qo, None, config, kv_format=cache_dtype, q_dtype="fp8" if fp8 else "bf16",
                             q_scale=q_scale1, page_table=bt.table, page_size=64, kv_lens=bt.lens,
                             return_lse=return_lse, q_len=1)

    def via_serving():
        return dec.forward(q, kv, bt.table, bt.lens, k_scale=bt.k_scale, q_scale=q_scale)

    a, b = via_decode(), via_serving()
    torch.cuda.synchronize()
    a_out = a[0] if return_lse else a
    assert torch.equal(a_out.view(torch.int16), b[0].view(torch.int16)), "the two paths must run the same kernel"
    dec_us, srv_us = [], []
    for _ in range(5):
        dec_us.append(_per_call_us(via_decode))
        srv_us.append(_per_call_us(via_serving))
    d, s = sorted(dec_us)[2], sorted(srv_us)[2]
    gpu = _gpu_us(via_serving)
    nope, pe = bt.q[..., :512].clone(), bt.q[..., 512:]
    split = None
    if not fp8:
        dec_split = serving.MLADecoder(16, kv_cache_dtype="bf16", block_size=64, sm_scale=SM_SCALE,
                                       return_lse=return_lse)
        split = _per_call_us(lambda: dec_split.forward((nope, pe), kv, bt.table, bt.lens))
    print(f"{cache_dtype} cache, lse {return_lse}: host us/call mlagen.decode {d:.2f}, MLADecoder.forward {s:.2f} "
          f"(+{s - d:.2f}); GPU us/call {gpu:.2f}" + (f"; split q (one concat kernel more) {split:.2f}" if split else ""))
    assert s - d <= 1.0, f"the engine-facing call adds {s - d:.2f} us over mlagen.decode (limit 1 us)"
