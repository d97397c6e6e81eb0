"""mlagen.dcp on the CPU: the LSE merge of partial attention results against float64 attention
over the whole KV, its edge cases (empty parts, all-empty rows, NaN / +inf flags), the page
sharding (round-robin as vLLM's DCP, contiguous chunks) and the whole path (shard, a float64
paged decode of each share with decode()'s causal mask, merge) against one decode of the cache.
The GPU side (decode() on N GPUs through NCCL) is tests/gpu/test_dcp.py and bench/dcp.py.
"""
import itertools
import math
import os
import random
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="mlagen.dcp needs torch")

from mlagen import dcp  # noqa: E402

QK, DV = 576, 512
SM_SCALE = QK ** -0.5


def attend(q, k, scale=SM_SCALE):
    """Exact attention of q [T, H, QK] over k [L, QK] (V = k[:, :DV]) in float64: (out, lse);
    an empty k gives out 0 and lse -inf, as decode() does."""
    q, k = q.double(), k.double()
    if k.shape[0] == 0:
        return (torch.zeros(q.shape[:-1] + (DV,), dtype=torch.float64),
                torch.full(q.shape[:-1], -math.inf, dtype=torch.float64))
    s = torch.einsum("thd,ld->thl", q, k) * scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("thl,ld->thd", torch.exp(s - lse.unsqueeze(-1)), k[:, :DV]), lse


def rand_split(total, parts, rng, with_empty):
    """`parts` sizes adding up to total, random, one of them 0 when with_empty."""
    cuts = sorted(rng.randrange(total + 1) for _ in range(parts - 1))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    if with_empty and parts > 1 and 0 not in sizes:
        i = rng.randrange(parts)
        j = (i + 1) % parts
        sizes[j] += sizes[i]
        sizes[i] = 0
    return sizes


def rows_rel(a, b):
    """The worst (row) relative L2 of a against b over the last dim."""
    a, b = a.double(), b.double()
    return ((a - b).norm(dim=-1) / b.norm(dim=-1).clamp(min=1e-300)).max().item()


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_merge_equals_whole_attention_float64(parts, seed):
    rng = random.Random(seed * 31 + parts)
    g = torch.Generator().manual_seed(seed * 31 + parts)
    L, T, H = rng.randrange(parts * 8, 400), rng.choice([1, 2, 4]), rng.choice([2, 16])
    q = torch.randn((T, H, QK), generator=g, dtype=torch.float64)
    k = torch.randn((L, QK), generator=g, dtype=torch.float64)
    k[rng.randrange(L)] *= 4.0  # one dominant key: some parts' weights far below the others'
    sizes = rand_split(L, parts, rng, with_empty=True)
    partial, start = [], 0
    order = list(range(L))
    rng.shuffle(order)  # a part is any subset of the keys, not only a run of them
    for n in sizes:
        partial.append(attend(q, k[order[start:start + n]]))
        start += n
    want_out, want_lse = attend(q, k)
    out, lse = dcp.merge_partials([o for o, _ in partial], [s for _, s in partial])
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert rows_rel(out, want_out) < 1e-12, sizes
    assert (lse - want_lse).abs().max().item() < 1e-12, sizes
    # the stacked form and any order of the parts give the same
    perm = list(range(parts))
    rng.shuffle(perm)
    out2, lse2 = dcp.merge_partials(torch.stack([partial[i][0] for i in perm]),
                                    torch.stack([partial[i][1] for i in perm]))
    assert rows_rel(out2, out) < 1e-13 and (lse2 - lse).abs().max().item() < 1e-13


@pytest.mark.parametrize("parts", [2, 4, 8])
def test_merge_in_float32_and_of_bf16_partials(parts):
    """The kernel's forms: bf16 partial outputs, float32 LSE; the merge runs in float32 and
    returns bf16 and float32."""
    rng = random.Random(parts)
    g = torch.Generator().manual_seed(parts)
    q = torch.randn((2, 16, QK), generator=g, dtype=torch.float64)
    k = torch.randn((1000, QK), generator=g, dtype=torch.float64)
    sizes = rand_split(1000, parts, rng, with_empty=True)
    bounds = [sum(sizes[:i]) for i in range(parts + 1)]
    partial = [attend(q, k[a:b]) for a, b in zip(bounds, bounds[1:])]
    want_out, want_lse = attend(q, k)
    outs32 = torch.stack([o.float() for o, _ in partial])
    lses32 = torch.stack([s.float() for _, s in partial])
    out, lse = dcp.merge_partials(outs32, lses32)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert rows_rel(out, want_out) < 2e-6 and (lse.double() - want_lse).abs().max().item() < 1e-5
    out, lse = dcp.merge_partials(outs32.to(torch.bfloat16), lses32)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    # the partials' bf16 rounding (2^-9 relative an element) and the output's own
    assert rows_rel(out, want_out) < 8e-3 and (lse.double() - want_lse).abs().max().item() < 1e-5
    ref_bf16 = want_out.to(torch.bfloat16)  # the float64 result rounded once: the floor
    assert rows_rel(out, want_out) < 3 * max(rows_rel(ref_bf16, want_out), 1e-3)


def test_all_empty_row_gives_zero_and_minus_inf():
    g = torch.Generator().manual_seed(5)
    outs = torch.randn((3, 4, 2, DV), generator=g)
    lses = torch.randn((3, 4, 2), generator=g)
    lses[:, 1, 0] = -math.inf  # row (1, 0): every part empty
    outs[:, 1, 0] = math.nan  # ... and its outputs garbage: never read
    out, lse = dcp.merge_partials(outs, lses)
    assert torch.equal(out[1, 0], torch.zeros(DV)) and lse[1, 0].item() == -math.inf
    mask = torch.ones((4, 2), dtype=torch.bool)
    mask[1, 0] = False
    assert torch.isfinite(out[mask]).all() and torch.isfinite(lse[mask]).all()
    # every row of every part empty
    out, lse = dcp.merge_partials(outs, torch.full_like(lses, -math.inf))
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_empty_part_is_not_read():
    g = torch.Generator().manual_seed(6)
    outs = torch.randn((3, 5, 4, DV), generator=g)
    lses = torch.randn((3, 5, 4), generator=g) * 10
    lses[1] = -math.inf
    ref = dcp.merge_partials(outs[[0, 2]], lses[[0, 2]])
    for junk in (math.nan, math.inf, 1e30):
        outs[1] = junk
        out, lse = dcp.merge_partials(outs, lses)
        assert torch.allclose(out, ref[0], rtol=1e-6, atol=0) and torch.allclose(lse, ref[1], rtol=1e-7, atol=0)


def test_flagged_rows_propagate_nan():
    g = torch.Generator().manual_seed(7)
    outs = torch.randn((4, 3, 2, DV), generator=g)
    lses = torch.randn((4, 3, 2), generator=g)
    clean = dcp.merge_partials(outs, lses)
    lses[2, 0, 1] = math.nan  # decode() flags a sequence's bad inputs with a NaN lse and output
    lses[3, 2, 0] = math.inf  # no finite scores give +inf: a flag too
    lses[0, 1, 1] = -math.inf  # an empty part beside them: ordinary
    out, lse = dcp.merge_partials(outs, lses)
    for t, h in ((0, 1), (2, 0)):
        assert torch.isnan(out[t, h]).all() and math.isnan(lse[t, h].item())
    ok = torch.ones((3, 2), dtype=torch.bool)
    ok[0, 1] = ok[2, 0] = False
    assert torch.isfinite(out[ok]).all() and torch.isfinite(lse[ok]).all()
    assert torch.equal(out[1, 0], clean[0][1, 0])  # rows without a flag: unchanged
    # a NaN in a non-empty part's output reaches the merged row, even where its weight is tiny
    outs2, lses2 = outs.clone(), torch.randn((4, 3, 2), generator=g)
    lses2[1, 2, 1] = lses2[:, 2, 1].max() - 200.0
    outs2[1, 2, 1, 7] = math.nan
    out, _ = dcp.merge_partials(outs2, lses2)
    assert math.isnan(out[2, 1, 7].item())


def test_one_part_is_the_identity():
    g = torch.Generator().manual_seed(8)
    o = torch.randn((3, 16, DV), generator=g).to(torch.bfloat16)
    s = torch.randn((3, 16), generator=g)
    s[0, 0] = -math.inf
    o[0, 0] = 0  # what decode() writes for an empty sequence
    out, lse = dcp.merge_partials([o], [s])
    assert torch.equal(out, o) and torch.equal(lse, s)


def test_merge_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="leading shape"):
        dcp.merge_partials(torch.zeros(2, 3, 4, DV), torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="leading shape"):
        dcp.merge_partials(torch.zeros(2, 3, 4, DV), torch.zeros(3, 3, 4))
    with pytest.raises(ValueError, match="float"):
        dcp.merge_partials(torch.zeros(2, 3, 4, DV), torch.zeros(2, 3, 4, dtype=torch.int32))


# ------------------------------------------------------------------------------- sharding

def random_batch(rng, batch, page_size, max_extra=2, fill=-1):
    """A block table with each sequence's pages in random order from one pool, rows padded with
    `fill`, and lengths including 0, 1, exact multiples of the page and others."""
    picks = [0, 1, page_size, page_size + 1, 3 * page_size, rng.randrange(1, 40 * page_size)]
    lens = [rng.choice(picks) if rng.random() < 0.5 else rng.randrange(0, 25 * page_size) for _ in range(batch)]
    need = [-(-n // page_size) for n in lens]
    width = max(1, max(need)) + rng.randrange(max_extra + 1)
    pool = list(range(sum(need) + 5))
    rng.shuffle(pool)
    table = torch.full((batch, width), fill, dtype=torch.int32)
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    return table, lens


def owner_of_page(j, n_pages, world, layout):
    """The rank holding page j of a sequence of n_pages (the documented rule, by brute force)."""
    if layout == "round_robin":
        return j % world
    per, extra = divmod(n_pages, world)
    start = 0
    for r in range(world):
        size = per + (r < extra)
        if start <= j < start + size:
            return r
        start += size
    raise AssertionError


@pytest.mark.parametrize("layout", dcp.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_shard_pages_union_in_order(layout, world, page_size):
    rng = random.Random(world * 1000 + page_size + (7 if layout == "contiguous" else 0))
    table, lens = random_batch(rng, rng.randrange(1, 9), page_size)
    shards = [dcp.shard(table, lens, page_size, world, r, layout) for r in range(world)]
    width = max(1, -(-table.shape[1] // world))
    for r, sh in enumerate(shards):
        assert sh.page_table.dtype == torch.int32 and sh.kv_lens.dtype == torch.int32
        assert sh.page_table.shape == (len(lens), width) and sh.page_table.is_contiguous()
        assert sh.qo_indptr.tolist() == list(range(len(lens) + 1)) and sh.q_len == 1 and sh.batch == len(lens)
        assert sh.rank == r and sh.world_size == world and sh.layout == layout
    for b, n in enumerate(lens):
        need = -(-n // page_size)
        pages = table[b, :need].tolist()
        got = []  # each rank's pages of this sequence, as its share says (tokens -> pages)
        for r, sh in enumerate(shards):
            ln = int(sh.kv_lens[b])
            cnt = -(-ln // page_size)
            row = sh.page_table[b].tolist()
            assert all(p == 0 for p in row[cnt:]), f"rank {r} seq {b}: entries past its pages hold the fill"
            got.append(row[:cnt])
            # brute force: the rank's tokens are those of the pages it owns
            owned = [j for j in range(need) if owner_of_page(j, need, world, layout) == r]
            assert row[:cnt] == [pages[j] for j in owned], f"rank {r} seq {b}: pages"
            assert ln == sum(min(page_size, n - j * page_size) for j in owned), f"rank {r} seq {b}: length"
            assert ln == sum(1 for t in range(n) if owner_of_page(t // page_size, need, world, layout) == r)
        assert sum(int(sh.kv_lens[b]) for sh in shards) == n
        if layout == "round_robin":  # rank j % N's (j // N)-th page is page j
            assert [got[j % world][j // world] for j in range(need)] == pages
        else:  # the ranks' chunks one after the other, as even as can be
            assert [p for chunk in got for p in chunk] == pages
            sizes = [len(c) for c in got]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_round_robin_counts_are_vllms(world):
    """local_token_count is vLLM's get_dcp_local_seq_lens with the interleave = the page size
    (token t on rank (t // I) % N): checked against that rule token by token."""
    for page_size in (1, 4, 64):
        prefix = torch.arange(0, 6 * world * page_size + 3)
        for r in range(world):
            got = dcp.local_token_count(prefix, page_size, world, r)
            mine = [int((t // page_size) % world == r) for t in range(int(prefix[-1]))]  # token t's owner is r
            want = [0] + list(itertools.accumulate(mine))  # rank r's tokens among the first p
            assert got.tolist() == want


@pytest.mark.parametrize("layout", dcp.LAYOUTS)
@pytest.mark.parametrize("q_len", [2, 3, 4])
def test_shard_with_several_query_tokens(layout, q_len):
    """Each query token becomes its own sequence whose length is the rank's rows among the
    global rows the token sees (decode()'s mask: token i of n sees the first len - n + 1 + i)."""
    rng = random.Random(q_len)
    page_size, world = 16, 3
    table, lens = random_batch(rng, 6, page_size)
    for r in range(world):
        sh = dcp.shard(table, lens, page_size, world, r, layout, q_len=q_len)
        base = dcp.shard(table, lens, page_size, world, r, layout)
        assert sh.q_len == 1 and sh.batch == len(lens) * q_len
        assert torch.equal(sh.page_table, base.page_table.repeat_interleave(q_len, 0))
        assert sh.qo_indptr.tolist() == list(range(sh.batch + 1))
        for b, n in enumerate(lens):
            need = -(-n // page_size)
            for i in range(q_len):
                sees = max(0, n - q_len + 1 + i)
                want = sum(1 for t in range(sees) if owner_of_page(t // page_size, need, world, layout) == r)
                assert int(sh.kv_lens[b * q_len + i]) == want, (r, b, i)


def test_shard_uniform_length_and_config():
    table = torch.arange(4 * 8, dtype=torch.int32).reshape(4, 8)
    sh = dcp.shard(table, [512] * 4, 64, 4, 1)
    assert sh.kv_seq_len == 128 and sh.kv_lens.tolist() == [128] * 4
    cfg = sh.config(dict(batch_size=99, sm_scale=0.1, num_heads=16, kv_seq_len=512, q_seq_len=1))
    assert cfg == dict(batch_size=4, sm_scale=0.1, num_heads=16, kv_seq_len=128, q_seq_len=1)
    assert set(sh.decode_kwargs()) == {"page_table", "kv_lens", "q_len"}
    sh = dcp.shard(table, [512, 500, 512, 512], 64, 4, 3)
    assert sh.kv_seq_len is None and sh.kv_lens.tolist() == [128, 116, 128, 128]
    assert dcp.shard(table, [64] * 4, 64, 4, 2).kv_seq_len is None  # empty everywhere: no shape


def test_shard_refuses_bad_arguments():
    table = torch.zeros((2, 3), dtype=torch.int32)
    for kw, msg in ((dict(world_size=2, rank=2), "rank"), (dict(world_size=0, rank=0), "rank"),
                    (dict(layout="striped"), "layout"), (dict(q_len=5), "q_len"), (dict(page_size=0), "page_size")):
        args = dict(block_table=table, kv_lens=[1, 2], page_size=16, world_size=2, rank=0)
        args.update(kw)
        with pytest.raises(ValueError, match=msg):
            dcp.shard(**args)
    with pytest.raises(ValueError, match="kv_lens"):
        dcp.shard(table, [1, 49], 16, 2, 0)  # 4 pages in a row of 3
    with pytest.raises(ValueError, match="batch"):
        dcp.shard(table, [1, 2, 3], 16, 2, 0)


def test_compact_and_take_pages():
    rng = random.Random(3)
    page_size = 8
    table, lens = random_batch(rng, 5, page_size, fill=-1)
    num_pages = int(table.max()) + 3
    cache = torch.randn((num_pages * page_size, 1, QK))
    sh = dcp.shard(table, lens, page_size, 3, 1)
    pages, local = dcp.compact(sh.page_table, sh.kv_lens, page_size)
    assert pages.dtype == torch.int64 and local.dtype == torch.int32
    scales = torch.randint(0, 255, (num_pages * page_size, 18), dtype=torch.uint8)
    fp8 = cache.to(torch.float8_e4m3fn)
    kv = {"bf16": cache, "fp8": (fp8, torch.tensor([0.5])), "mxfp4": (cache, scales)}
    small = dcp.take_pages(kv, pages, page_size)
    assert small["fp8"][1].tolist() == [0.5] and small["fp8"][0].dtype == torch.float8_e4m3fn
    assert torch.equal(small["fp8"][0].view(torch.uint8), fp8.view(torch.uint8).reshape(
        num_pages, page_size, 1, QK)[pages].reshape(-1, 1, QK))
    as_pages = dcp.take_pages(cache.reshape(num_pages, page_size, 1, QK), pages, page_size)
    assert torch.equal(as_pages.reshape(-1, 1, QK), small["bf16"])
    for b, n in enumerate(sh.kv_lens.tolist()):
        for t in range(n):
            g_row = int(sh.page_table[b, t // page_size]) * page_size + t % page_size
            l_row = int(local[b, t // page_size]) * page_size + t % page_size
            assert torch.equal(small["bf16"][l_row], cache[g_row])
            assert torch.equal(small["mxfp4"][1][l_row], scales[g_row])


# ------------------------------------------------------------- the whole path, in float64

def paged_decode(q, cache, table, lens, page_size, q_len):
    """decode()'s semantics in float64: q [batch * q_len, H, QK], cache [rows, QK], a block
    table and lengths; token i of q_len sees the sequence's first len - q_len + 1 + i rows."""
    outs, lses = [], []
    for b, n in enumerate(lens):
        rows = [int(table[b, t // page_size]) * page_size + t % page_size for t in range(n)]
        k = cache[rows]
        for i in range(q_len):
            o, s = attend(q[b * q_len + i:b * q_len + i + 1], k[:max(0, n - q_len + 1 + i)])
            outs.append(o[0])
            lses.append(s[0])
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("layout", dcp.LAYOUTS)
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("world", [2, 3, 8])
def test_sharded_decode_merges_to_the_whole(layout, q_len, world):
    rng = random.Random(world * 10 + q_len)
    g = torch.Generator().manual_seed(world * 10 + q_len)
    page_size = 4
    table, lens = random_batch(rng, 4, page_size, fill=-1)
    lens[0] = 1  # fewer pages than ranks: empty shares, and with q_len 2 a token that sees nothing
    cache = torch.randn((int(table.max()) + 1) * page_size, QK, generator=g, dtype=torch.float64)
    H = 2
    q = torch.randn((len(lens) * q_len, H, QK), generator=g, dtype=torch.float64)
    want_out, want_lse = paged_decode(q, cache, table, lens, page_size, q_len)
    outs, lses = [], []
    for r in range(world):
        sh = dcp.shard(table, lens, page_size, world, r, layout, q_len=q_len)
        pages, local = dcp.compact(sh.page_table, sh.kv_lens, page_size)
        o, s = paged_decode(q, dcp.take_pages(cache, pages, page_size), local, sh.kv_lens.tolist(), page_size,
                            sh.q_len)
        outs.append(o)
        lses.append(s)
    out, lse = dcp.merge_partials(outs, lses)
    live = torch.isfinite(want_lse)
    assert torch.equal(torch.isneginf(lse), ~live)
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))
    assert rows_rel(out[live], want_out[live]) < 1e-12
    assert (lse[live] - want_lse[live]).abs().max().item() < 1e-12


# ------------------------------------------------------------ gather_merge, gloo on the CPU

GLOO_SCRIPT = textwrap.dedent("""
    import math, os, socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    sys.path.insert(0, {binding!r})
    from mlagen import dcp

    def part(i):
        g = torch.Generator().manual_seed(i)
        out = torch.randn((3, 4, 512), generator=g).to(torch.bfloat16)
        lse = torch.randn((3, 4), generator=g)
        if i == 1:
            lse[0, 0] = -math.inf
        return out, lse

    def run(rank, world, port):
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        out, lse = dcp.gather_merge(*part(rank))
        want = dcp.merge_partials(*zip(*[part(i) for i in range(world)]))
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1]), rank
        dist.destroy_process_group()

    if __name__ == "__main__":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.start_processes(run, args=(2, port), nprocs=2, start_method="fork")  # torch imported once
        print("gather_merge ok")
""")


def test_gather_merge_over_gloo(tmp_path):
    """gather_merge's one all_gather (lse packed beside out) gives every rank merge_partials
    of all the parts: two CPU processes over gloo (NCCL is the same call on the GPUs)."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    script = tmp_path / "gather.py"
    binding = os.path.dirname(os.path.dirname(os.path.abspath(dcp.__file__)))  # the mlagen under test
    script.write_text(GLOO_SCRIPT.format(binding=binding))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "gather_merge ok" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
