"""Decode context parallelism (DCP): one batch's paged KV split over N GPUs, each GPU decoding
its share with return_lse=True, the partial outputs merged by their LSE into the output of the
whole cache.

    from mlagen import dcp
    sh = dcp.shard(block_table, kv_lens, page_size, world_size, rank)          # round-robin pages
    out_r, lse_r = mlagen.decode(q, kv_data, sh.qo_indptr, None, sh.config(config), kv_format="fp8",
                                 page_size=page_size, return_lse=True, **sh.decode_kwargs())
    out, lse = dcp.gather_merge(out_r, lse_r)     # one NCCL all_gather, then merge_partials
    # or, with the partials gathered any other way: out, lse = dcp.merge_partials(outs, lses)

Sharding (shard): page j of a sequence goes to rank j % N ("round_robin", vLLM's DCP with
cp_kv_cache_interleave_size = page_size; vLLM's default interleave of 1 token is the same
layout over pages of 1 token), or each sequence's pages in N contiguous chunks
("contiguous"). A rank's block table holds the global page ids of its pages in order, so it
decodes from a cache holding every page or, after compact() / take_pages(), from a cache of its
own pages only. Sharding is index arithmetic on the host (a setup step, it syncs a device
block table); the merge is a handful of elementwise torch ops on the partials' device.

Pure torch, no library call of its own: not part of the leaderboard bundle (tools/bundle.py
NOT_BUNDLED). Tests: tests/cpu/test_dcp_merge.py (merge and sharding, against float64
attention), tests/gpu/test_dcp.py and bench/dcp.py (N GPUs, NCCL, against one GPU's decode).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ._facts import MAX_Q_LEN  # decode()'s query tokens a sequence

LAYOUTS = ("round_robin", "contiguous")


def _torch():
    import torch
    return torch


# --------------------------------------------------------------------------------- merge

def merge_partials(outs, lses):
    """Merge N partial attention results over disjoint parts of each row's KV.

    outs: a list of N tensors [T, H, D] or one tensor [N, T, H, D] (any float dtype; decode()
    gives bf16), the partial outputs, each normalized over its own part (softmax-weighted mean);
    lses: N tensors [T, H] or one [N, T, H], each part's natural-log LSE in mlagen's convention
    (lse = ln sum_j exp(sm_scale q.k_j) over the part's tokens; -inf for an empty part). Any
    leading shape in place of [T, H] works, the same for both.

    Returns (out, lse): out = sum_i exp(lse_i - lse) out_i in the dtype of outs, computed in
    float32 (float64 inputs stay float64); lse = ln sum_i exp(lse_i), in the dtype of lses.
      * an empty part (lse -inf) weighs exactly 0 and its output is not read (it may hold
        anything); a row whose parts are all empty gives out 0 and lse -inf, as decode() does
        for an empty sequence;
      * a NaN lse (decode() flags a sequence's bad inputs so) makes the row NaN in out and lse,
        and so does +inf (no finite scores give it); a NaN in the output of a non-empty part
        reaches the merged row too.
    """
    torch = _torch()
    if isinstance(outs, (list, tuple)):
        outs = torch.stack(list(outs))
    if isinstance(lses, (list, tuple)):
        lses = torch.stack(list(lses))
    if outs.dim() < 2 or outs.shape[0] < 1 or tuple(lses.shape) != tuple(outs.shape[:-1]):
        raise ValueError(f"merge_partials: outs {tuple(outs.shape)} and lses {tuple(lses.shape)}: expected "
                         f"[N, ..., D] and [N, ...] with the same N and leading shape")
    if not (outs.is_floating_point() and lses.is_floating_point()) or outs.device != lses.device:
        raise ValueError(f"merge_partials: outs {outs.dtype} on {outs.device}, lses {lses.dtype} on {lses.device}: "
                         f"expected float tensors on one device")
    cdt = torch.promote_types(outs.dtype, torch.float32)
    lse = lses.to(torch.promote_types(lses.dtype, torch.float32))
    m = lse.amax(dim=0)  # NaN if a part is NaN; -inf when every part is empty
    m = m.nan_to_num(nan=math.nan, posinf=math.inf, neginf=0.0)  # all empty: exponents relative to 0
    w = torch.exp(lse - m)  # [N, ...]: 0 for an empty part, NaN for a flagged row
    s = w.sum(dim=0)
    merged_lse = m + torch.log(s)  # -inf where s == 0 (every part empty)
    empty = torch.isneginf(lse).unsqueeze(-1)
    parts = torch.where(empty, 0.0, outs.to(cdt))  # an empty part's output is never read
    num = (w.to(cdt).unsqueeze(-1) * parts).sum(dim=0)
    s = s.to(cdt).unsqueeze(-1)
    out = torch.where(s == 0, 0.0, num / s)  # s NaN stays NaN
    return out.to(outs.dtype), merged_lse.to(lses.dtype)


def gather_partials(out, lse, group=None):
    """All-gather every rank's partial (out [T, H, D], lse [T, H] float32, as decode(...,
    return_lse=True) gives them) over the torch.distributed group (NCCL for CUDA tensors):
    (outs [N, T, H, D], lses [N, T, H]), rank i's at index i, for merge_partials. One
    collective: the lse rides along as extra elements of out's dtype at the end of each row
    (its four bytes), split off again after the gather (outs and lses are views of one buffer)."""
    torch = _torch()
    import torch.distributed as dist
    n = dist.get_world_size(group)
    if out.dim() < 1 or tuple(lse.shape) != tuple(out.shape[:-1]) or lse.dtype != torch.float32:
        raise ValueError(f"gather_partials: out {tuple(out.shape)} and lse {lse.dtype} {tuple(lse.shape)}: expected "
                         f"[..., D] and float32 [...]")
    size = out.element_size()
    if size not in (2, 4) or not out.is_floating_point() or out.shape[-1] % 2:
        raise ValueError(f"gather_partials: out {out.dtype} [..., {out.shape[-1]}]: expected a 2- or 4-byte float "
                         f"and an even D")
    per, d = 4 // size, out.shape[-1]  # out elements one float32 takes
    buf = torch.empty(tuple(out.shape[:-1]) + (d + per,), dtype=out.dtype, device=out.device)
    buf[..., :d] = out
    buf[..., d:] = lse.unsqueeze(-1).view(out.dtype)
    every = torch.empty((n * buf.shape[0],) + tuple(buf.shape[1:]), dtype=buf.dtype, device=buf.device)
    dist.all_gather_into_tensor(every, buf, group=group)  # the ranks' buffers one after the other
    every = every.view((n,) + tuple(buf.shape))
    return every[..., :d], every[..., d:].view(torch.float32).squeeze(-1)


def gather_merge(out, lse, group=None):
    """gather_partials then merge_partials: every rank of the group gets the merged (out, lse)
    of the whole KV from its own partial."""
    return merge_partials(*gather_partials(out, lse, group))


# --------------------------------------------------------------------------------- sharding

@dataclass
class Shard:
    """One rank's share of a batch, in the form decode() takes (a block table with kv_lens).

    page_table int32 [batch, width]: row b the global page ids of the rank's pages of that
      sequence, in order (entries past them hold `fill`); kv_lens int32 [batch]: its tokens;
    qo_indptr int32 [batch + 1]; q_len decode()'s q_len for the share (always 1, see below);
    batch its sequences; kv_seq_len the one local length when all are equal and not 0 (a
    uniform shape, which decode() may have a specialized kernel for), else None.
    With the batch's q_len > 1 each query token is its own sequence here (batch = sequences x
    q_len, the q rows in their usual order, so the same q tensor serves): decode()'s causal mask
    counts from the end of the KV it is given, which on a rank is not the end of the sequence,
    so each token gets the number of the rank's rows among the global rows it may see instead
    (exact, at the price of reading the rank's KV once a token).
    """
    page_table: object
    kv_lens: object
    qo_indptr: object
    q_len: int
    batch: int
    kv_seq_len: int | None
    rank: int
    world_size: int
    layout: str

    def decode_kwargs(self) -> dict:
        """decode()'s keyword arguments for this share (add page_size, kv_format, return_lse=True)."""
        return dict(page_table=self.page_table, kv_lens=self.kv_lens, q_len=self.q_len)

    def config(self, base: dict) -> dict:
        """The leaderboard-style config for this share: base's sm_scale and heads, this batch."""
        cfg = dict(base)
        cfg.update(batch_size=self.batch, kv_seq_len=self.kv_seq_len, q_seq_len=self.q_len)
        return cfg


def _host_int64(t, name):
    torch = _torch()
    t = torch.as_tensor(t)
    if t.is_floating_point() or t.is_complex():
        raise ValueError(f"{name}: {t.dtype}: expected integers")
    return t.to(device="cpu", dtype=torch.int64)


def local_token_count(prefix, page_size: int, world_size: int, rank: int, layout: str = "round_robin",
                      start_page=None, num_pages=None):
    """How many of a sequence's first `prefix` tokens are on `rank` (prefix an int64 tensor).

    round_robin: token t is on rank (t // page_size) % world_size, vLLM's DCP ownership with
      cp_kv_cache_interleave_size = page_size; the count is vLLM's get_dcp_local_seq_lens
      (vllm-project/vllm, vllm/v1/attention/backends/utils.py, checked at commit 00bd149):
      base = prefix // (I * N) * I, remainder = prefix - base * N, count = base +
      clip(remainder - rank * I, 0, I).
    contiguous: the rank holds the sequence's pages start_page .. start_page + num_pages
      (tensors broadcasting with prefix), so clip(prefix - start_page * page_size, 0,
      num_pages * page_size)."""
    if layout == "round_robin":
        base = prefix // (page_size * world_size) * page_size
        rem = prefix - base * world_size
        return base + (rem - rank * page_size).clamp(0, page_size)
    if layout == "contiguous":
        return (prefix - start_page * page_size).clamp(min=0).minimum(num_pages * page_size)
    raise ValueError(f"layout={layout!r}: expected one of {LAYOUTS}")


def shard(block_table, kv_lens, page_size: int, world_size: int, rank: int, layout: str = "round_robin",
          q_len: int = 1, fill: int = 0) -> Shard:
    """Rank `rank`'s share of a paged batch split over `world_size` ranks.

    block_table int32 [batch, max_pages] (row b the pages of sequence b in order, as decode()
    takes it), kv_lens [batch] the sequences' tokens (a tensor or a list), page_size the
    cache's. layout:
      "round_robin": page j of every sequence goes to rank j % world_size (vLLM's DCP layout
        with cp_kv_cache_interleave_size = page_size: see local_token_count);
      "contiguous": sequence b's pages are cut into world_size contiguous chunks as even as
        can be (the first pages % world_size chunks one page longer): the halves for 2 ranks.
    A rank with no page of a sequence gets an empty sequence there (decode() gives lse -inf,
    which merge_partials weighs 0). q_len: the query tokens of every sequence (1..4); over 1,
    each token becomes its own sequence (see Shard). The tensors come back on block_table's
    device; every rank's table has the same width, ceil(max_pages / world_size) (at least 1).
    """
    torch = _torch()
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {LAYOUTS}")
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"world_size={world_size!r}, rank={rank!r}: expected 0 <= rank < world_size")
    if not (isinstance(page_size, int) and page_size >= 1):
        raise ValueError(f"page_size={page_size!r}: expected a positive int")
    if not (isinstance(q_len, int) and 1 <= q_len <= MAX_Q_LEN):
        raise ValueError(f"q_len={q_len!r}: expected 1..{MAX_Q_LEN}")
    device = block_table.device if hasattr(block_table, "device") else torch.device("cpu")
    table = _host_int64(block_table, "block_table")
    lens = _host_int64(kv_lens, "kv_lens").reshape(-1)
    if table.dim() != 2 or table.shape[0] != lens.numel():
        raise ValueError(f"block_table {tuple(table.shape)}, kv_lens {tuple(lens.shape)}: expected [batch, max_pages] "
                         f"and [batch]")
    batch, max_pages = table.shape
    need = (lens + page_size - 1) // page_size  # each sequence's pages
    if batch and ((lens < 0).any() or (need > max_pages).any()):
        bad = int(torch.nonzero((lens < 0) | (need > max_pages))[0, 0])
        raise ValueError(f"kv_lens[{bad}] = {int(lens[bad])}: expected 0 .. max_pages * page_size = "
                         f"{max_pages * page_size}")
    width = max(1, -(-max_pages // world_size))
    k = torch.arange(width, dtype=torch.int64)
    if layout == "round_robin":
        count = ((need - rank + world_size - 1) // world_size).clamp(min=0)  # pages j < need, j % N == rank
        cols = (rank + k * world_size).expand(batch, width)
        start = None
    else:
        per, extra = need // world_size, need % world_size
        count = per + (rank < extra).to(torch.int64)
        start = rank * per + extra.clamp(max=rank)
        cols = start.unsqueeze(1) + k
    has = k.unsqueeze(0) < count.unsqueeze(1)
    local_table = torch.where(has, table.gather(1, cols.clamp(max=max(max_pages - 1, 0))) if max_pages else
                              torch.zeros_like(cols), torch.full_like(cols, fill))

    def visible(prefix):
        return local_token_count(prefix, page_size, world_size, rank, layout,
                                 None if start is None else start.reshape(start.shape + (1,) * (prefix.dim() - 1)),
                                 None if start is None else count.reshape(count.shape + (1,) * (prefix.dim() - 1)))

    if q_len == 1:
        local_lens = visible(lens)
    else:
        # token i of q_len sees the sequence's first len - q_len + 1 + i rows (decode()'s mask)
        prefixes = (lens.unsqueeze(1) - q_len + 1 + torch.arange(q_len, dtype=torch.int64)).clamp(min=0)
        local_lens = visible(prefixes).reshape(-1)
        local_table = local_table.repeat_interleave(q_len, dim=0)
    rows = local_lens.numel()
    uniform = rows > 0 and bool((local_lens == local_lens[0]).all()) and int(local_lens[0]) > 0
    i32 = torch.int32
    return Shard(page_table=local_table.to(device=device, dtype=i32).contiguous(),
                 kv_lens=local_lens.to(device=device, dtype=i32).contiguous(),
                 qo_indptr=torch.arange(rows + 1, dtype=i32).to(device),
                 q_len=1, batch=rows, kv_seq_len=int(local_lens[0]) if uniform else None,
                 rank=rank, world_size=world_size, layout=layout)


def compact(page_table, kv_lens, page_size: int, fill: int = 0):
    """(pages, table) for a cache of only the pages a block table uses: pages int64 [P], the
    distinct page ids the rows use within their lengths (sorted), and table int32 like
    page_table, renumbered to index `pages` (entries past a row's pages hold fill). Build the
    rank's cache with take_pages(kv_data, pages, page_size). Both on page_table's device."""
    torch = _torch()
    device = page_table.device if hasattr(page_table, "device") else torch.device("cpu")
    table = _host_int64(page_table, "page_table")
    lens = _host_int64(kv_lens, "kv_lens").reshape(-1)
    need = (lens + page_size - 1) // page_size
    used = torch.arange(table.shape[1]).unsqueeze(0) < need.unsqueeze(1)
    pages = torch.unique(table[used])
    new = torch.searchsorted(pages, table.clamp(min=0)) if pages.numel() else torch.zeros_like(table)
    new = torch.where(used, new, torch.full_like(new, fill))
    return pages.to(device), new.to(device=device, dtype=torch.int32).contiguous()


def take_pages(kv_data, pages, page_size: int):
    """The cache restricted to `pages` (in that order), any of decode()'s kv forms: a tensor,
    a (data, scale) pair or the leaderboard's dict of them. A tensor of rows ((rows, [1,] C),
    mxfp4's (rows, C) scales included) is cut in pages of page_size rows; (num_pages,
    page_size, [1,] C) is indexed by page; a one-element tensor (the per-tensor fp8 scale) is
    kept as it is."""
    if isinstance(kv_data, dict):
        return {k: take_pages(v, pages, page_size) for k, v in kv_data.items()}
    if isinstance(kv_data, (tuple, list)):
        return type(kv_data)(take_pages(v, pages, page_size) for v in kv_data)
    torch = _torch()
    t = kv_data
    if t.numel() == 1:
        return t
    idx = pages.to(device=t.device, dtype=torch.int64)
    raw = t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t  # fp8 / fp4: as bytes
    if t.dim() >= 3 and t.shape[1] == page_size:
        got = raw.index_select(0, idx)
    else:
        if t.shape[0] % page_size:
            raise ValueError(f"take_pages: a tensor of {t.shape[0]} rows: expected a multiple of page_size={page_size}")
        paged = raw.reshape((t.shape[0] // page_size, page_size) + tuple(t.shape[1:]))
        got = paged.index_select(0, idx).reshape((idx.numel() * page_size,) + tuple(t.shape[1:]))
    return got.contiguous().view(t.dtype)
