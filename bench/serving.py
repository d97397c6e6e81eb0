#!/usr/bin/env python3
"""The serving matrix of issue 41: mlagen against FlashMLA bf16 and FlashMLA's dense FP8 decode on
paged caches, per cell the speed-up over the best peer, the bare-read floor, and the verdict.

    python bench/serving.py --out DIR [--quick | --cells 16x64x8192,128x16x8192x2 | --heads 16,128 ...]
                            [--budget-s 270] [--reps 30] [--min-reps 10] [--host-json FILE] [--list]

The cells (`cell_list()`, 52): heads 8 / 16 / 32 / 64 / 128 x batch 1 / 4 / 16 / 64 / 128 x kv_len
1024 / 8192 with one query token, less 128 x 8192 (9 cells a head count), plus query-token cells
at 16 heads (16x8192 q_len 4, 64x8192 q_len 2 and 4) and 128 heads (16x8192 and 64x8192, q_len 2
and 4): 9 / 12 / 9 / 9 / 13 cells, the counts of issue 41's table (which does not list its
cells; this is the set those counts imply with the matrix's largest cell, 128 x 8192, left out).

Per (batch, kv_len) one cache: bf16 standard normal rows, the fp8 cache quantized from it per tensor
(mlagen.quant's recipe), both in pages of 64 rows whose order is a random permutation (the block
table int32 (batch, kv_len / 64)); every contender and the floor read the same pages through the
same table. Per cell a bf16 q (batch * q_len, heads, 576), standard normal, and its fp8 (per tensor).

Contenders (each called once and checked before it is timed):
  mlagen fp8 q, fp8 cache     mlagen.decode(q8, {"fp8": ...}, q_dtype="fp8", q_scale=...) on the table
                              (--fp8-q in-call: the bf16 q, quantized by mlagen in the call)
  mlagen bf16 q, fp8 cache    mlagen.decode(q, {"fp8": ...}) on the table
  mlagen bf16 q, bf16 cache   mlagen.decode(q, {"bf16": ...}) on the table
  FlashMLA fp8                .peers/flashmla_fp8 (FlashMLAFp8Peer: q8 and the fp8 cache, their scales)
  FlashMLA bf16               .peers/flashmla: flash_mla.cuda.dense_decode_fwd with the scheduling
                              metadata of a first flash_mla_with_kvcache call (untimed), as the
                              peer's wrapper times it
The floor (bench/floor.py's paged gather read): per (batch, kv_len) and cache format (fp8 576 bytes
a row, bf16 1152), Triton's tile read of the cell's own cache bytes through the cell's own table,
from a captured CUDA graph, its partials checked against torch; the fastest config by median.
The floor depends on the KV bytes only, so the cells of one (batch, kv_len) share it.

Check: per cell, a few sequences (first, middle, last) of each contender's output against float32
attention on the values it reads (its q: bf16, or the fp8 q dequantized; the dequantized cache),
causal among the query tokens; relative L2 over --tol (per contender, TOLERANCES), or a non-finite
value anywhere in the output, and the contender gets no time ("a wrong kernel gets no speed").

Timing: bench/bench.py's Timer, the leaderboard's method: per repetition synchronize, write the
flush buffer (--flush-mb, 256 MiB), event, ONE Python call, event, synchronize; the contenders of a
cell interleaved repetition by repetition after --warmup untimed rounds (--order grouped: each
contender's repetitions back to back instead, as a loop of one call times it; the two orders
disagree by 6-7 us on mlagen's small cells, docs/perf.md); mean and median. The repetitions of a
cell: --reps, fewer when the --budget-s left over the cells left would not hold them (never under
--min-reps). After each flush the stream sleeps --hold-us (300) on the device, touching no memory:
the H200 machine's host path of a call (from the flush's launch to the call's return) measured
38-257 us in one run where the flush alone takes ~70 us on the device, and a call launched after
its start event fired was timed with the host's gap in it (FlashMLA fp8 read 49-204 us for its
13-32 us kernels, mlagen 46-56 us for 14). The serving matrix compares kernels; the host's time a
call is bench/host.py's. Each contender's row keeps the host side of its timed repetitions
(host_call_us, host_since_flush_us, host_bound_reps: those still over the flush and hold's device
time, flush_device_us) and the caching allocator's cudaMalloc / cudaFree calls among them.

Verdicts (issue 41's "Done when"): fp8 q at least 1.1x FlashMLA fp8; bf16 q on an fp8 cache at
least 1.0x the faster of FlashMLA bf16 and FlashMLA fp8; bf16 cache at least 1.0x FlashMLA bf16;
a cell where mlagen is within 1.2x of that cell's floor (the comparison's cache format) is met
whatever the peers do. Ratios are peer / mlagen (above 1: mlagen faster), by --stat (median).

Writes DIR/serving.json (rewritten after every cell), DIR/serving.png (one heat-map panel a
comparison) and prints the issue's summary table (geomean / worst ratio per head count). The host
time a call is bench/host.py's: --host-json FILE copies its JSON into the "host" field.
Exit status 0; 1 when an mlagen contender failed its check or raised somewhere; 2 without a GPU.
"""
from __future__ import annotations

import argparse
import gc
import datetime
import functools
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _common as C  # noqa: E402

PAGE = 64
HEADS = (8, 16, 32, 64, 128)
BATCHES = (1, 4, 16, 64, 128)
KV_LENS = (1024, 8192)
Q1_LEFT_OUT = {(128, 8192)}  # (batch, kv_len) not in the one-token matrix (see the docstring)
MULTI_TOKEN = {16: [(16, 8192, 4), (64, 8192, 2), (64, 8192, 4)],
               128: [(16, 8192, 2), (64, 8192, 2), (16, 8192, 4), (64, 8192, 4)]}
QUICK = [(8, 1, 1024, 1), (16, 4, 1024, 1), (32, 16, 8192, 1), (64, 64, 8192, 1), (128, 4, 8192, 1),
         (128, 64, 8192, 1), (16, 64, 8192, 4), (128, 16, 8192, 2)]

MLAGEN_FP8Q = "mlagen fp8 q, fp8 cache"
MLAGEN_BF16Q = "mlagen bf16 q, fp8 cache"
MLAGEN_BF16 = "mlagen bf16 q, bf16 cache"
FLASHMLA_FP8 = "FlashMLA fp8"
FLASHMLA_BF16 = "FlashMLA bf16"
CONTENDERS = (MLAGEN_FP8Q, MLAGEN_BF16Q, MLAGEN_BF16, FLASHMLA_FP8, FLASHMLA_BF16)
MLAGEN_COLUMNS = (MLAGEN_FP8Q, MLAGEN_BF16Q, MLAGEN_BF16)
# what each contender computes with: (q, cache)
SEES = {MLAGEN_FP8Q: ("fp8", "fp8"), MLAGEN_BF16Q: ("bf16", "fp8"), MLAGEN_BF16: ("bf16", "bf16"),
        FLASHMLA_FP8: ("fp8", "fp8"), FLASHMLA_BF16: ("bf16", "bf16")}
# relative L2 against float32 on the values the contender reads, a few sequences. A guard
# against a wrong kernel (a wrong page, head, mask or scale gives 1e-1 and more), ~2.5x the
# tests' bounds (tests/tolerances.py: fp8 KV same inputs 4e-3, bf16 6e-3) and 2x FlashMLA fp8's
# measured worst (1.9%, ../shared/peers/flashmla_fp8/README.md: it rounds P to e4m3).
TOLERANCES = {MLAGEN_FP8Q: 1e-2, MLAGEN_BF16Q: 1e-2, MLAGEN_BF16: 1.5e-2, FLASHMLA_FP8: 4e-2,
              FLASHMLA_BF16: 1.5e-2}

COMPARISONS = (
    dict(key="fp8q", title="fp8 q + fp8 cache vs FlashMLA fp8", mlagen=MLAGEN_FP8Q, peers=(FLASHMLA_FP8,),
         target=1.1, floor="fp8"),
    dict(key="bf16q_fp8kv", title="bf16 q + fp8 cache vs the faster FlashMLA", mlagen=MLAGEN_BF16Q,
         peers=(FLASHMLA_BF16, FLASHMLA_FP8), target=1.0, floor="fp8"),
    dict(key="bf16kv", title="bf16 cache vs FlashMLA bf16", mlagen=MLAGEN_BF16, peers=(FLASHMLA_BF16,),
         target=1.0, floor="bf16"),
)
FLOOR_RULE = 1.2  # mlagen within 1.2x of the cell's floor: met whatever the peers do
FLOOR_FORMATS = ("fp8", "bf16")
MASK32 = 0xffffffff


# --------------------------------------------------------------------------------------
# the cells (pure)
# --------------------------------------------------------------------------------------

def cell_key(c: dict) -> str:
    return f"h{c['heads']} {c['batch']}x{c['kv_len']}" + (f" q{c['q_len']}" if c["q_len"] > 1 else "")


def make_cell(heads: int, batch: int, kv_len: int, q_len: int = 1) -> dict:
    return dict(heads=heads, batch=batch, kv_len=kv_len, q_len=q_len)


def cell_list() -> list[dict]:
    """Issue 41's 52 cells, head count by head count: the one-token cells (batch, kv_len) in
    matrix order, then that head count's query-token cells."""
    cells = []
    for h in HEADS:
        for kv in KV_LENS:
            for b in BATCHES:
                if (b, kv) not in Q1_LEFT_OUT:
                    cells.append(make_cell(h, b, kv))
        cells += [make_cell(h, b, kv, q) for (b, kv, q) in MULTI_TOKEN.get(h, [])]
    return cells


def parse_cells(text: str) -> list[dict]:
    """'16x64x8192,128x16x8192x2' (HEADSxBATCHxKV_LEN[xQ_LEN]) -> cells."""
    cells = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        parts = item.lower().split("x")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            nums = []
        if len(nums) not in (3, 4):
            raise ValueError(f"bad cell {item!r}: expected HEADSxBATCHxKV_LEN[xQ_LEN], e.g. 16x64x8192 or 128x16x8192x2")
        h, b, kv = nums[:3]
        q = nums[3] if len(nums) == 4 else 1
        if h not in HEADS or b < 1 or kv < PAGE or kv % PAGE or not 1 <= q <= 4:
            raise ValueError(f"bad cell {item!r}: heads one of {HEADS}, batch >= 1, kv_len a multiple of {PAGE}, "
                             "q_len 1..4")
        cells.append(make_cell(h, b, kv, q))
    return cells


def _ints(text):
    return None if not text else {int(x) for x in text.split(",") if x.strip()}


def select_cells(cells=None, *, spec: str | None = None, quick: bool = False, heads=None, batches=None,
                 kv_lens=None, q_lens=None) -> list[dict]:
    """The cells to run: --cells (any cells), else --quick (QUICK), else the matrix; then the
    --heads / --batches / --kv / --q-lens filters (comma lists, None = all). Duplicates dropped."""
    if spec:
        cells = parse_cells(spec)
    elif quick:
        cells = [make_cell(*c) for c in QUICK]
    elif cells is None:
        cells = cell_list()
    filt = dict(heads=_ints(heads) if isinstance(heads, str) else heads,
                batch=_ints(batches) if isinstance(batches, str) else batches,
                kv_len=_ints(kv_lens) if isinstance(kv_lens, str) else kv_lens,
                q_len=_ints(q_lens) if isinstance(q_lens, str) else q_lens)
    out, seen = [], set()
    for c in cells:
        if any(v is not None and c[k] not in v for k, v in filt.items()):
            continue
        k = cell_key(c)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def check_seqs(batch: int, n: int = 3) -> list[int]:
    """The sequences a cell's outputs are checked on: first, middle, last (at most n)."""
    return sorted({0, batch // 2, batch - 1})[:max(1, n)]


def plan_reps(allowance_s: float, spent_s: float, round_s: float, min_reps: int, max_reps: int) -> int:
    """Timed repetitions of a cell: as many rounds (one flushed call of every contender) as the
    cell's share of the budget still holds after its set-up, within [min_reps, max_reps]."""
    if round_s <= 0:
        return max_reps
    n = int(max(0.0, allowance_s - spent_s) / round_s)
    return max(min_reps, min(max_reps, n))


# --------------------------------------------------------------------------------------
# verdicts and the summary (pure)
# --------------------------------------------------------------------------------------

def judge(mlagen_us, peer_us: dict, floor_us, target: float, floor_rule: float = FLOOR_RULE) -> dict:
    """One cell of one comparison. peer_us: peer -> time (None: missing, failed or wrong).
    met: ratio = best peer / mlagen >= target, or mlagen <= floor_rule x floor; not_met: mlagen has
    no time (failed its check, raised) or both rules fail; unjudged: mlagen has a time but there is
    neither a peer time nor a floor that decides."""
    live = {p: t for p, t in peer_us.items() if t}
    best = min(live, key=live.get) if live else None
    r = dict(mlagen_us=mlagen_us, best_peer=best, best_peer_us=live.get(best) if best else None,
             ratio=None, peer_ratios={}, floor_us=floor_us, floor_ratio=None, target=target,
             missing_peers=sorted(p for p in peer_us if not peer_us[p]))
    if mlagen_us:
        r["peer_ratios"] = {p: t / mlagen_us for p, t in live.items()}
        if best:
            r["ratio"] = live[best] / mlagen_us
        if floor_us:
            r["floor_ratio"] = mlagen_us / floor_us
    if not mlagen_us:
        r["verdict"], r["why"] = "not_met", "mlagen has no time (failed its check or raised)"
    elif r["ratio"] is not None and r["ratio"] >= target:
        r["verdict"], r["why"] = "met", f"{r['ratio']:.3f}x the best peer >= {target}"
    elif r["floor_ratio"] is not None and r["floor_ratio"] <= floor_rule:
        r["verdict"], r["why"] = "met", f"{r['floor_ratio']:.3f}x its floor <= {floor_rule}"
    elif r["ratio"] is None:
        r["verdict"], r["why"] = "unjudged", "no peer time" + ("" if floor_us else " and no floor")
    else:
        r["verdict"], r["why"] = "not_met", (f"{r['ratio']:.3f}x the best peer < {target}"
                                             + (f", {r['floor_ratio']:.3f}x its floor" if r["floor_ratio"] else ""))
    if r["missing_peers"] and live:
        r["partial"] = True  # the best of the peers that ran
    return r


def geomean(vals):
    vals = [v for v in vals if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _group_stats(cells: list[dict], key: str) -> dict:
    js = [(c, c["comparisons"][key]) for c in cells if key in c.get("comparisons", {})]
    rated = [(c, j) for c, j in js if j.get("ratio") is not None]
    worst = min(rated, key=lambda cj: cj[1]["ratio"]) if rated else None
    return dict(cells=len(cells), rated=len(rated), geomean=geomean([j["ratio"] for _, j in rated]),
                worst=worst[1]["ratio"] if worst else None, worst_cell=cell_key(worst[0]) if worst else None,
                below_1=sum(1 for _, j in rated if j["ratio"] < 1.0),
                met=sum(1 for _, j in js if j.get("verdict") == "met"),
                not_met=sum(1 for _, j in js if j.get("verdict") == "not_met"),
                unjudged=sum(1 for _, j in js if j.get("verdict") == "unjudged"))


def summarize(cells: list[dict], comparisons=COMPARISONS) -> dict:
    """Per comparison: per head count and over all cells, the geomean and the worst ratio, cells
    below 1, and the verdict counts; plus the cells not met."""
    heads = sorted({c["heads"] for c in cells})
    out = {}
    for comp in comparisons:
        k = comp["key"]
        s = dict(title=comp["title"], target=comp["target"],
                 by_heads={str(h): _group_stats([c for c in cells if c["heads"] == h], k) for h in heads},
                 all=_group_stats(cells, k))
        s["not_met_cells"] = [cell_key(c) for c in cells
                              if c.get("comparisons", {}).get(k, {}).get("verdict") == "not_met"]
        s["unjudged_cells"] = [cell_key(c) for c in cells
                               if c.get("comparisons", {}).get(k, {}).get("verdict") == "unjudged"]
        out[k] = s
    out["all_met"] = all(out[c["key"]]["all"]["met"] == len(cells) for c in comparisons) and bool(cells)
    return out


def _pair(st: dict) -> str:
    if st["geomean"] is None:
        return "n/a"
    return f"{st['geomean']:.2f} / {st['worst']:.2f}"


def summary_table(summary: dict, comparisons=COMPARISONS) -> str:
    """The issue's table: heads | cells | per comparison 'geomean / worst' (peer / mlagen), then
    the 'all' row with the cells below 1, and the verdict counts."""
    keys = [c["key"] for c in comparisons]
    lines = ["| heads | cells | " + " | ".join(summary[k]["title"] for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    heads = list(summary[keys[0]]["by_heads"]) if keys else []
    for h in heads:
        st = [summary[k]["by_heads"][h] for k in keys]
        lines.append(f"| {h} | {st[0]['cells']} | " + " | ".join(_pair(s) for s in st) + " |")
    st = [summary[k]["all"] for k in keys]
    lines.append(f"| all | {st[0]['cells']} | " +
                 " | ".join(_pair(s) + (f" ({s['below_1']} below 1)" if s["geomean"] is not None else "") for s in st)
                 + " |")
    lines.append("| met (target; or within 1.2x floor) | | " +
                 " | ".join(f"{summary[k]['all']['met']}/{summary[k]['all']['cells']} (>= {summary[k]['target']}x)"
                            + (f", {summary[k]['all']['unjudged']} unjudged" if summary[k]["all"]["unjudged"] else "")
                            for k in keys) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# the heat map (from the JSON alone)
# --------------------------------------------------------------------------------------

def _column_order(cells):
    cols = sorted({(c["q_len"], c["kv_len"], c["batch"]) for c in cells})
    return cols, [f"{b}x{kv}" + (f"\nq_len {q}" if q > 1 else "") for (q, kv, b) in cols]


def draw_heatmap(result: dict, path: str, stat: str | None = None) -> None:
    """One panel a comparison: heads (rows) x (batch x kv_len, q_len) (columns), coloured by the
    speed-up over the best peer (log scale, 0.25x..4x), annotated with the ratio; met cells marked
    with a check mark (a check and 'f': met by the floor rule), the others' ratios in bold; cells
    without a ratio grey ('fail': mlagen has no time; 'n/a': no peer time)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm
    import numpy as np

    cells = result["cells"]
    comps = result.get("comparisons") or [dict(c) for c in COMPARISONS]
    heads = sorted({c["heads"] for c in cells})
    cols, labels = _column_order(cells)
    fig, axes = plt.subplots(len(comps), 1, figsize=(max(8.0, 1.0 * len(cols) + 3), 2.0 + 2.2 * len(comps) * max(1, len(heads)) / 5),
                             squeeze=False)
    norm = TwoSlopeNorm(vmin=-2.0, vcenter=0.0, vmax=2.0)
    for ax, comp in zip(axes[:, 0], comps):
        key = comp["key"]
        grid = np.full((len(heads), len(cols)), np.nan)
        for c in cells:
            j = c.get("comparisons", {}).get(key)
            if not j:
                continue
            i, k = heads.index(c["heads"]), cols.index((c["q_len"], c["kv_len"], c["batch"]))
            if j.get("ratio"):
                grid[i, k] = math.log2(max(0.25, min(4.0, j["ratio"])))
        masked = np.ma.masked_invalid(grid)
        cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#d9d9d9")
        im = ax.imshow(masked, cmap=cmap, norm=norm, aspect="auto")
        n_met = 0
        n_cells = 0
        for c in cells:
            j = c.get("comparisons", {}).get(key)
            if not j:
                continue
            n_cells += 1
            i, k = heads.index(c["heads"]), cols.index((c["q_len"], c["kv_len"], c["batch"]))
            if j.get("ratio"):
                txt = f"{j['ratio']:.2f}"
            elif j.get("verdict") == "not_met":
                txt = "fail"
            else:
                txt = "n/a"
            met = j.get("verdict") == "met"
            if met:
                n_met += 1
                txt += " \u2713" + ("f" if j.get("ratio") is None or j["ratio"] < j.get("target", 1.0) else "")
            ax.text(k, i, txt, ha="center", va="center", fontsize=8, fontweight="normal" if met else "bold")
        ax.set_xticks(range(len(cols)), labels, fontsize=7)
        ax.set_yticks(range(len(heads)), [str(h) for h in heads], fontsize=8)
        ax.set_ylabel("heads")
        ax.set_title(f"{comp['title']}: peer / mlagen ({stat or result.get('stat', 'median')}); "
                     f"met \u2713 {n_met}/{n_cells} (>= {comp['target']}x; \u2713f: within {FLOOR_RULE}x its floor)",
                     fontsize=9)
        cb = fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01, ticks=[-2, -1, 0, 1, 2])
        cb.ax.set_yticklabels(["0.25x", "0.5x", "1x", "2x", "4x"], fontsize=7)
    dev = (result.get("device") or {}).get("name", "")
    commit = ((result.get("git") or {}).get("commit") or "")[:10]
    fig.suptitle(f"mlagen serving matrix, paged 64 shuffled, speed-up over the best peer ({dev} {commit})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# GPU part
# --------------------------------------------------------------------------------------

def log(*a) -> None:
    print(*a, flush=True)


def err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


def import_peers(peers_dir: str) -> dict:
    """{'FlashMLA bf16': (flash_mla module or None, where, error), 'FlashMLA fp8': (module, where,
    error)} from peers_dir (default <repo>/.peers), else ../shared/peers beside the checkout."""
    dirs = [peers_dir, os.path.join(os.path.dirname(C.REPO), "shared", "peers")]
    out = {}
    for name, sub, mod in ((FLASHMLA_BF16, "flashmla", "flash_mla"), (FLASHMLA_FP8, "flashmla_fp8", "flashmla_fp8_peer")):
        why = []
        for d in dirs:
            path = os.path.join(d, sub)
            if not os.path.isdir(path):
                why.append(f"no {path}")
                continue
            sys.path.insert(0, path)
            try:
                m = __import__(mod)
                if mod == "flash_mla":
                    import flash_mla.cuda  # noqa: F401  (the C++ op the timed call takes)
                out[name] = (m, path, None)
            except Exception as e:  # noqa: BLE001
                out[name] = (None, path, err_text(e))
            break
        else:
            out[name] = (None, None, "; ".join(why))
    return out


def group_inputs(torch, dev, batch: int, kv_len: int, seed: int) -> dict:
    """One cache for every cell of (batch, kv_len): bf16 rows, the fp8 cache quantized from them,
    pages of 64 in a random order (floor.py's page_table: a permutation of all pages)."""
    import floor as F
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    kv = torch.randn((batch * kv_len, 1, C.QK_DIM), generator=g, device=dev, dtype=torch.bfloat16)
    fp8, scale = C.quantize_fp8(kv)
    table = F.page_table(torch, batch, kv_len, PAGE, seed + 1, dev)
    seqlens = torch.full((batch,), kv_len, dtype=torch.int32, device=dev)
    return dict(bf16=kv, fp8=fp8, scale=scale, table=table, seqlens=seqlens)


def measure_floor(torch, timer, kernel, data: dict, fmt: str, batch: int, kv_len: int, reps: int,
                  configs) -> dict:
    """bench/floor.py's paged gather read (time_tile_read) over this cache's bytes through this
    table: every config from a captured graph, its partials checked against torch, the fastest
    config by median. configs: [((rows, tiles, warps), cache_op)]."""
    import floor as F
    dev = data["table"].device
    src = data["fp8"] if fmt == "fp8" else data["bf16"]
    cache = src.view(torch.uint8).reshape(batch * kv_len, -1)
    row_sums = cache.view(torch.int32).sum(-1, dtype=torch.int64)
    seq_sums = row_sums[F.gathered_rows(torch, data["table"], PAGE, batch, kv_len, dev)]
    best, variants = None, {}
    for cfg, op in configs:
        if kv_len % (cfg[0] * cfg[1]):
            continue
        rpp = cfg[0] * cfg[1]
        part = torch.empty(batch * kv_len // rpp, dtype=torch.int32, device=dev)
        replay = F.graph_of(torch, F.tile_launch(torch, kernel, cache, data["table"], part, PAGE, batch, kv_len, fmt,
                                                 cfg, op))
        part.fill_(0x5a5a5a5a)  # poison: the partials below must come from this replay
        replay()
        if not torch.equal(part.long() & MASK32, F.partials_of(torch, seq_sums, rpp)):
            raise RuntimeError(f"floor tile_read {fmt} {batch}x{kv_len} config {cfg} {op!r}: partials differ from torch")
        med, mean = F.latency(timer, replay, reps, warmup=3)
        name = f"r{cfg[0]}_t{cfg[1]}_w{cfg[2]}" + (f"_{op.strip('.')}" if op else "")
        variants[name] = round(med, 2)
        if best is None or med < best["median_us"]:
            best = dict(median_us=med, mean_us=mean, config=name)
        del replay, part
    if best is None:
        raise RuntimeError(f"no floor config divides kv_len {kv_len}")
    best["variants"] = variants
    best["kv_bytes"] = cache.numel()
    return best


def cell_reference(torch, q_seen, kv_rows_fn, table, seqs, heads: int, kv_len: int, q_len: int, batch: int):
    """float32 attention of sequences `seqs`: q_seen (batch * q_len, heads, 576) float, kv_rows_fn(row
    ids) -> float rows (..., 576) of the cache; causal among the query tokens (token i of n sees
    the first kv_len - n + 1 + i rows). -> (len(seqs), q_len, heads, 512)."""
    dev = table.device
    idx = torch.tensor(seqs, dtype=torch.long, device=dev)
    rows = (table[idx].long().unsqueeze(-1) * PAGE + torch.arange(PAGE, device=dev)).reshape(len(seqs), kv_len)
    kvs = kv_rows_fn(rows)
    q = q_seen.view(batch, q_len, heads, C.QK_DIM)[idx]
    s = torch.einsum("bthd,bnd->bthn", q, kvs) * C.SM_SCALE
    if q_len > 1:
        key = torch.arange(kv_len, device=dev).view(1, 1, 1, -1)
        end = (kv_len - q_len + 1 + torch.arange(q_len, device=dev)).view(1, -1, 1, 1)
        s = s.masked_fill(key >= end, float("-inf"))
    p = torch.softmax(s, -1)
    return torch.einsum("bthn,bnd->bthd", p, kvs[..., :C.V_DIM])


def call_order(contenders: list, reps: int, order: str) -> list:
    """The timed calls of a cell, in order: 'interleaved' (one call of each contender a round, reps
    rounds: the default) or 'grouped' (each contender's reps calls back to back)."""
    if order == "grouped":
        return [c for c in contenders for _ in range(reps)]
    return [c for _ in range(reps) for c in contenders]


def device_allocs(torch) -> int:
    """The caching allocator's cudaMalloc + cudaFree calls so far (0 where torch does not count them)."""
    if not torch.cuda.is_available():
        return 0
    st = torch.cuda.memory_stats()
    return int(st.get("num_device_alloc", 0)) + int(st.get("num_device_free", 0))


def stats_of(times: list[float]) -> dict:
    s = sorted(times)
    return dict(median_us=statistics.median(s), mean_us=statistics.fmean(s), min_us=s[0], max_us=s[-1], n=len(s))


class Run:
    hidden_us = math.inf  # the host time a timed call can hide (main: the flush and hold's device time)


def contender_calls(run, cell: dict, data: dict, inp: dict) -> tuple[dict, dict]:
    """{contender: callable} and {contender: why it has none} for one cell."""
    torch, mg, args = run.torch, run.mlagen, run.args
    h, b, kv, ql = cell["heads"], cell["batch"], cell["kv_len"], cell["q_len"]
    calls, why = {}, {}
    if mg is None:
        for c in MLAGEN_COLUMNS:
            why[c] = f"mlagen: {run.mlagen_error}"
    else:
        paged = dict(page_table=data["table"], page_size=PAGE, kv_lens=data["seqlens"])
        kv8 = {"fp8": (data["fp8"], data["scale"])}
        if args.fp8_q == "given":
            calls[MLAGEN_FP8Q] = functools.partial(mg.decode, inp["q8"], kv8, inp["qo_indptr"], None, inp["config"],
                                                   kv_format="fp8", q_dtype="fp8", q_scale=inp["q_scale"], **paged)
        else:
            calls[MLAGEN_FP8Q] = functools.partial(mg.decode, inp["q"], kv8, inp["qo_indptr"], None, inp["config"],
                                                   kv_format="fp8", q_dtype="fp8", **paged)
        calls[MLAGEN_BF16Q] = functools.partial(mg.decode, inp["q"], kv8, inp["qo_indptr"], None, inp["config"],
                                                kv_format="fp8", **paged)
        calls[MLAGEN_BF16] = functools.partial(mg.decode, inp["q"], {"bf16": data["bf16"]}, inp["qo_indptr"], None,
                                               inp["config"], kv_format="bf16", **paged)
    causal = ql > 1
    fm, _, fm_err = run.peers[FLASHMLA_BF16]
    if fm is None:
        why[FLASHMLA_BF16] = fm_err
    else:
        try:
            qf = inp["q"].view(b, ql, h, C.QK_DIM)
            kc = data["bf16"].view(-1, PAGE, 1, C.QK_DIM)
            sched, _ = fm.get_mla_metadata()
            # the first call computes the scheduling metadata (an engine's per-step work): untimed
            fm.flash_mla_with_kvcache(qf, kc, data["table"], data["seqlens"], C.V_DIM, sched, None,
                                      softmax_scale=C.SM_SCALE, causal=causal)
            torch.cuda.synchronize()
            op = sys.modules["flash_mla.cuda"].dense_decode_fwd

            def flashmla_bf16(qf=qf, kc=kc, sched=sched, op=op):
                return op(qf, kc, C.V_DIM, data["seqlens"], data["table"], C.SM_SCALE, causal,
                          sched.tile_scheduler_metadata, sched.num_splits)[0]
            calls[FLASHMLA_BF16] = flashmla_bf16
        except Exception as e:  # noqa: BLE001
            why[FLASHMLA_BF16] = f"set-up: {err_text(e)}"
    p8, _, p8_err = run.peers[FLASHMLA_FP8]
    if p8 is None:
        why[FLASHMLA_FP8] = p8_err
    else:
        try:
            peer = p8.FlashMLAFp8Peer(softmax_scale=C.SM_SCALE)
            peer.prepare(data["seqlens"], h, ql)
            q8v = inp["q8"].view(b, ql, h, C.QK_DIM)
            c8 = data["fp8"].view(-1, PAGE, 1, C.QK_DIM)

            def flashmla_fp8(peer=peer, q8v=q8v, c8=c8):
                return peer(q8v, c8, data["table"], data["seqlens"], inp["q_scale"], data["scale"], causal=causal)[0]
            calls[FLASHMLA_FP8] = flashmla_fp8
        except Exception as e:  # noqa: BLE001
            why[FLASHMLA_FP8] = f"set-up: {err_text(e)}"
    return calls, why


def cuda_alive(torch) -> str | None:
    try:
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001
        return err_text(e)


def run_cell(run, cell: dict, data: dict, floors: dict, allowance_s: float) -> dict:
    torch, dev, args, timer = run.torch, run.dev, run.args, run.timer
    from mlagen import quant
    t_cell = time.perf_counter()
    h, b, kv, ql = cell["heads"], cell["batch"], cell["kv_len"], cell["q_len"]
    row = dict(cell, key=cell_key(cell), contenders={}, floors=floors, comparisons={}, errors=[])
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed * 1000003 + h * 7919 + b * 131 + kv + ql)
    q = torch.randn((b * ql, h, C.QK_DIM), generator=g, device=dev, dtype=torch.bfloat16)
    q8, q_scale = quant.quantize_q_fp8(q)
    config = dict(C.make_config(b, kv), num_heads=h, q_seq_len=ql)
    inp = dict(q=q, q8=q8, q_scale=q_scale, config=config,
               qo_indptr=torch.arange(0, (b + 1) * ql, ql, dtype=torch.int32, device=dev))
    calls, why = contender_calls(run, cell, data, inp)
    for c, w in why.items():
        row["contenders"][c] = dict(error=w)

    # the check: a few sequences against float32 on the values each contender reads
    seqs = check_seqs(b, args.check_seqs)
    row["checked_seqs"] = seqs
    refs = {}
    q_seen = {"bf16": q.float(), "fp8": q8.float() * q_scale}
    kv_seen = {"bf16": lambda r: data["bf16"].view(-1, C.QK_DIM)[r].float(),
               "fp8": lambda r: data["fp8"].view(-1, C.QK_DIM)[r].float() * data["scale"]}
    live = {}
    for c, fn in calls.items():
        ent = row["contenders"].setdefault(c, {})
        ent["tol"] = TOLERANCES[c] * args.tol_scale
        try:
            out = fn()
            torch.cuda.synchronize()
            if c in MLAGEN_COLUMNS:
                k = run.mlagen.last_kernel() or {}
                ent["kernel"], ent["splits"] = k.get("name"), k.get("splits")
            o = out.reshape(b, ql, h, C.V_DIM)
            sees = SEES[c]
            if sees not in refs:
                refs[sees] = cell_reference(torch, q_seen[sees[0]], kv_seen[sees[1]], data["table"], seqs, h, kv, ql, b)
            finite = bool(torch.isfinite(o).all())
            err = C.rel_l2(o[torch.tensor(seqs, device=dev)].float(), refs[sees]) if finite else float("inf")
            ent["rel_err"] = err
            if not finite:
                ent["error"] = "non-finite values in the output"
            elif not err <= ent["tol"]:
                ent["error"] = f"rel_l2 {err:.3e} > {ent['tol']:.1e} on sequences {seqs}: no time"
            else:
                live[c] = fn
            del out, o
        except Exception as e:  # noqa: BLE001
            ent["error"] = err_text(e)
            dead = cuda_alive(torch)
            if dead:
                raise RuntimeError(f"{cell_key(cell)} {c}: {ent['error']}; the CUDA context is lost: {dead}")
    if run.mlagen is not None:
        try:
            run.mlagen.check_device_errors()
        except Exception as e:  # noqa: BLE001
            for c in MLAGEN_COLUMNS:
                if c in live:
                    row["contenders"][c]["error"] = f"check_device_errors: {err_text(e)}"
                    live.pop(c)
    refs.clear()
    for c in row["contenders"]:
        if row["contenders"][c].get("error"):
            row["errors"].append(f"{c}: {row['contenders'][c]['error']}")

    # timing: warm-up rounds (flushed, as timed), the rounds the budget holds, interleaved
    round_s = 0.0
    for _ in range(max(1, args.warmup)):
        t0 = time.perf_counter()
        for fn in live.values():
            timer.once(fn)
        round_s = time.perf_counter() - t0
    reps = plan_reps(allowance_s, time.perf_counter() - t_cell, round_s, args.min_reps, args.reps)
    row["reps"] = reps
    times = {c: [] for c in live}
    host = {c: ([], []) for c in live}
    allocs = {c: 0 for c in live}
    gc.collect()
    gc.disable()  # a collection inside a timed call would be timed (outliers of hundreds of us)
    try:
        for c in call_order(list(live), reps, args.order):
            n0 = device_allocs(torch)
            us, call_us, since_flush_us = timer.once_detail(live[c])
            allocs[c] += device_allocs(torch) - n0
            times[c].append(us)
            host[c][0].append(call_us)
            host[c][1].append(since_flush_us)
    finally:
        gc.enable()
    for c, t in times.items():
        row["contenders"][c].update(stats_of(t))
        # the host's side of the same repetitions: a call whose launch comes after the flush has
        # ended on the device is timed with that gap (run.hidden_us); cudaMalloc / cudaFree
        # inside the timed calls (the caching allocator's device calls: they synchronize)
        row["contenders"][c].update(host_call_us=round(statistics.median(host[c][0]), 2),
                                    host_since_flush_us=round(statistics.median(host[c][1]), 2),
                                    host_bound_reps=sum(h > run.hidden_us for h in host[c][1]),
                                    device_allocs=allocs[c])

    stat = "median_us" if args.stat == "median" else "mean_us"
    for comp in COMPARISONS:
        m = row["contenders"].get(comp["mlagen"], {})
        peers = {p: row["contenders"].get(p, {}).get(stat) for p in comp["peers"]}
        fl = (floors.get(comp["floor"]) or {}).get(stat)
        j = judge(m.get(stat), peers, fl, comp["target"])
        other = "mean_us" if stat == "median_us" else "median_us"
        jo = judge(m.get(other), {p: row["contenders"].get(p, {}).get(other) for p in comp["peers"]},
                   (floors.get(comp["floor"]) or {}).get(other), comp["target"])
        j["ratio_" + other[:-3]] = jo["ratio"]
        j["verdict_" + other[:-3]] = jo["verdict"]
        row["comparisons"][comp["key"]] = j
    row["seconds"] = round(time.perf_counter() - t_cell, 2)
    del inp, calls, live, q, q8
    return row


def cell_line(row: dict) -> str:
    def t(c):
        e = row["contenders"].get(c, {})
        return f"{e['median_us']:.1f}" if "median_us" in e else "-"
    parts = [f"[{row['key']}] reps {row.get('reps')}"]
    parts.append("mlagen fp8q/bf16q/bf16kv " + "/".join(t(c) for c in MLAGEN_COLUMNS))
    parts.append(f"FlashMLA fp8 {t(FLASHMLA_FP8)} bf16 {t(FLASHMLA_BF16)}")
    fl = row.get("floors", {})
    parts.append("floor fp8/bf16 " + "/".join(f"{fl[f]['median_us']:.1f}" if fl.get(f) and "median_us" in fl[f] else "-"
                                              for f in FLOOR_FORMATS))
    parts.append(" ".join(f"{k} " + (f"{j['ratio']:.2f}" if j.get("ratio") else "n/a") + ("" if j["verdict"] == "met" else
                                                                                         " (NOT MET)" if j["verdict"] == "not_met" else " (?)")
                          for k, j in row["comparisons"].items()))
    host = [(c, row["contenders"][c]) for c in row["contenders"] if "host_since_flush_us" in row["contenders"][c]]
    if host:  # the host's side: from the flush's launch to the call's return, and the allocator's device calls
        parts.append("host " + "/".join(f"{e['host_since_flush_us']:.0f}" + (f"+{e['device_allocs']}m" if e["device_allocs"] else "")
                                        + (f"!{e['host_bound_reps']}" if e["host_bound_reps"] else "") for _, e in host))
    s = " | ".join(parts)
    if row["errors"]:
        s += "\n    errors: " + "; ".join(row["errors"])
    return s


def write_json(result: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, "serving.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(C.json_clean(result), f, indent=1)
    os.replace(tmp, path)
    return path


FLOOR_CONFIGS_ALL = "all"


def floor_configs(spec: str):
    """'all' = bench/floor.py's paged configs x cache operators; else 'ROWSxTILESxWARPS[:cg],...'."""
    import floor as F
    if spec == FLOOR_CONFIGS_ALL:
        return [(c, op) for c in F.PAGED_CONFIGS for op in F.PAGED_CACHE]
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        cfg, _, op = item.partition(":")
        r, t, w = (int(x) for x in cfg.split("x"))
        out.append(((r, t, w), ".cg" if op == "cg" else ""))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(C.REPO, "bench", "results"),
                   help="output folder: serving.json, serving.png (default bench/results)")
    p.add_argument("--cells", default=None, help="run these cells instead: HEADSxBATCHxKV_LEN[xQ_LEN] list")
    p.add_argument("--quick", action="store_true", help=f"a subset of {len(QUICK)} cells across the matrix")
    p.add_argument("--heads", default=None, help="only these head counts, e.g. 16,128")
    p.add_argument("--batches", default=None, help="only these batches")
    p.add_argument("--kv", default=None, help="only these kv_lens")
    p.add_argument("--q-lens", default=None, help="only these q_lens")
    p.add_argument("--list", action="store_true", help="print the cells and exit (no GPU needed)")
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="wall-clock budget of the whole run, seconds: a cell's repetitions shrink (to --min-reps) "
                        "when its share would not hold them (default 270)")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions a cell, at most (default 30)")
    p.add_argument("--min-reps", type=int, default=10, help="timed repetitions a cell, at least (default 10)")
    p.add_argument("--warmup", type=int, default=10, help="untimed flushed rounds a cell (default 10)")
    p.add_argument("--floor-reps", type=int, default=15, help="timed reads a floor config (default 15)")
    p.add_argument("--floor-configs", default=FLOOR_CONFIGS_ALL,
                   help="floor tile-read configs: 'all' (bench/floor.py's 6 x 2 cache operators) or "
                        "'64x1x8,64x2x8:cg,...' (ROWSxTILESxWARPS[:cg])")
    p.add_argument("--no-floor", action="store_true", help="skip the floor (then only the peers decide)")
    p.add_argument("--flush-mb", type=int, default=256, help="buffer written before every timed call, MiB (256)")
    p.add_argument("--hold-us", type=float, default=300.0,
                   help="device sleep after each flush, us (300; 0: the leaderboard's method), so that a contender's "
                        "host path is hidden: the host time a call is bench/host.py's")
    p.add_argument("--order", choices=("interleaved", "grouped"), default="interleaved",
                   help="the timed calls of a cell: a round of every contender, reps rounds (default), or each "
                        "contender's reps back to back")
    p.add_argument("--stat", choices=("median", "mean"), default="median",
                   help="the statistic the ratios and verdicts use (both are recorded; default median)")
    p.add_argument("--fp8-q", choices=("given", "in-call"), default="given",
                   help="mlagen's fp8-q column: 'given' = the caller's fp8 q with its scale, the bytes FlashMLA "
                        "fp8 is given (default); 'in-call' = the bf16 q quantized by mlagen inside the call")
    p.add_argument("--check-seqs", type=int, default=3, help="sequences a cell's outputs are checked on (<= 3)")
    p.add_argument("--tol-scale", type=float, default=1.0, help="multiply every check tolerance (TOLERANCES)")
    p.add_argument("--peers", default=os.path.join(C.REPO, ".peers"),
                   help="folder holding flashmla/ and flashmla_fp8/ (default <repo>/.peers)")
    p.add_argument("--host-json", default=None, help="bench/host.py's JSON, copied into the 'host' field")
    p.add_argument("--seed", type=int, default=0, help="base random seed")
    p.add_argument("--no-png", action="store_true", help="JSON only")
    p.add_argument("--label", default="", help="free text stored in the JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cells = select_cells(spec=args.cells, quick=args.quick, heads=args.heads, batches=args.batches,
                             kv_lens=args.kv, q_lens=args.q_lens)
    except ValueError as e:
        log(str(e))
        return 2
    if args.list:
        for c in cells:
            print(cell_key(c))
        by = {}
        for c in cells:
            by[c["heads"]] = by.get(c["heads"], 0) + 1
        print(f"{len(cells)} cells; by heads: " + ", ".join(f"{h}: {n}" for h, n in sorted(by.items())))
        return 0
    if not cells:
        log("no cells selected")
        return 2
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    # Triton's compiled floor kernels kept in the checkout's build/ (git-ignored) between runs
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(C.REPO, "build", "triton-cache"))
    import torch
    if not torch.cuda.is_available():
        log("serving.py times on an NVIDIA GPU (no CUDA device here); --list works without one")
        return 2
    try:  # bench/bench.py: the package's module where the repository root comes first, else top-level
        import bench.bench as B
    except ImportError:
        import bench as B
    import floor as F

    run = Run()
    run.torch, run.args = torch, args
    run.dev = torch.device("cuda", torch.cuda.current_device())
    run.timer = B.Timer(torch, run.dev, args.flush_mb << 20, hold_us=args.hold_us)
    run.timer.flush_l2()
    ts = datetime.datetime.now(datetime.timezone.utc)
    result = dict(schema="mlagen-serving/1", timestamp_utc=ts.strftime("%Y-%m-%dT%H:%M:%SZ"), argv=sys.argv,
                  label=args.label, git=C.git_commit(), device=B.device_info(torch, run.dev), args=vars(args),
                  stat=args.stat, page_size=PAGE, flush_bytes=args.flush_mb << 20, floor_rule=FLOOR_RULE,
                  comparisons=[dict(c, peers=list(c["peers"])) for c in COMPARISONS], tolerances=TOLERANCES,
                  method=("paged KV, pages of 64 in a random order (one block table a batch x kv_len, shared by every "
                          "contender and the floor); per repetition: synchronize, write the flush buffer, event, one "
                          "Python call, event, synchronize; contenders interleaved; mean and median. Floor: "
                          "bench/floor.py's tile read of the cache bytes through the same table from a CUDA graph, "
                          "fastest config. Checked first: a few sequences against float32 on the values each reads."),
                  cells=[])
    log(f"device: {result['device'].get('name')}  torch {result['device'].get('torch')}  commit "
        f"{result['git'].get('commit')}  cells {len(cells)}  budget {args.budget_s:.0f} s")

    run.mlagen, run.mlagen_error = None, None
    try:
        C.ensure_mlagen_importable()
        import mlagen
        result["mlagen"] = dict(fingerprint=mlagen.fingerprint(), library=mlagen.library_path())
        run.mlagen = mlagen
    except Exception as e:  # noqa: BLE001
        run.mlagen_error = err_text(e)
        result["mlagen"] = dict(import_error=run.mlagen_error)
    log(f"mlagen: {result['mlagen']}")
    run.peers = import_peers(args.peers)
    result["peers"] = {n: dict(path=p, error=e, available=m is not None) for n, (m, p, e) in run.peers.items()}
    for n, v in result["peers"].items():
        log(f"{n}: {v['path'] if v['available'] else 'MISSING: ' + str(v['error'])}")
    result["empty_call_us"] = stats_of([run.timer.once(lambda: None) for _ in range(30)])["median_us"]
    run.hidden_us = run.timer.flush_device_us()
    result["flush_device_us"] = round(run.hidden_us, 2)  # with the hold: the host time a call can hide
    result["hold_us"] = args.hold_us
    result["host"] = None
    if args.host_json:
        try:
            with open(args.host_json) as f:
                result["host"] = json.load(f)
        except Exception as e:  # noqa: BLE001
            result["host"] = dict(error=err_text(e), path=args.host_json)
    else:
        result["host_note"] = "host time a call: bench/host.py (pass its JSON with --host-json)"

    kernel = None if args.no_floor else F.build_tile_read()
    fcfg = [] if args.no_floor else floor_configs(args.floor_configs)
    groups = {}
    for c in cells:
        groups.setdefault((c["batch"], c["kv_len"]), []).append(c)
    done, fatal = 0, None
    rc = 0
    for (b, kv), gcells in groups.items():
        if fatal:
            break
        t_group = time.perf_counter()
        try:
            data = group_inputs(torch, run.dev, b, kv, args.seed * 7 + b * 100003 + kv)
        except Exception as e:  # noqa: BLE001
            fatal = f"inputs {b}x{kv}: {err_text(e)}"
            break
        floors = {}
        for fmt in FLOOR_FORMATS:
            if args.no_floor:
                floors[fmt] = dict(error="--no-floor")
                continue
            try:
                floors[fmt] = measure_floor(torch, run.timer, kernel, data, fmt, b, kv, args.floor_reps, fcfg)
            except Exception as e:  # noqa: BLE001
                floors[fmt] = dict(error=err_text(e))
                dead = cuda_alive(torch)
                if dead:
                    fatal = f"floor {fmt} {b}x{kv}: {err_text(e)}; CUDA context lost: {dead}"
                    break
        log(f"[floor {b}x{kv}] " + "  ".join(f"{f} {floors[f]['median_us']:.1f} us ({floors[f]['config']})"
                                             if "median_us" in floors.get(f, {}) else f"{f} n/a ({floors.get(f, {}).get('error')})"
                                             for f in FLOOR_FORMATS) + f"  [{time.perf_counter() - t_group:.1f} s]")
        for c in gcells:
            if fatal:
                break
            left = len(cells) - done
            allowance = max(0.0, args.budget_s - (time.perf_counter() - t_start)) / max(1, left)
            try:
                row = run_cell(run, c, data, floors, allowance)
            except Exception as e:  # noqa: BLE001
                fatal = err_text(e)
                row = dict(c, key=cell_key(c), contenders={}, floors=floors, comparisons={}, errors=[fatal])
            result["cells"].append(row)
            done += 1
            if any(row["contenders"].get(m, {}).get("error") for m in MLAGEN_COLUMNS if run.mlagen is not None):
                rc = 1
            log(cell_line(row))
            result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
            write_json(result, args.out)
        del data
        torch.cuda.empty_cache()
    if fatal:
        result["fatal"] = fatal
        log(f"STOPPED: {fatal}")
        rc = 1
    if run.mlagen is None:
        rc = 1
    order = {cell_key(c): i for i, c in enumerate(cell_list())}
    result["cells"].sort(key=lambda r: (order.get(r["key"], len(order)), r["heads"], r["q_len"], r["kv_len"], r["batch"]))
    judged = [r for r in result["cells"] if r.get("comparisons")]
    result["summary"] = summarize(judged)
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    path = write_json(result, args.out)
    log("")
    log(summary_table(result["summary"]))
    for comp in COMPARISONS:
        s = result["summary"][comp["key"]]
        if s["not_met_cells"]:
            log(f"not met, {comp['key']}: " + ", ".join(s["not_met_cells"]))
    log(f"all met: {result['summary']['all_met']}  ({len(judged)} cells, {result['elapsed_s']} s)  -> {path}")
    if not args.no_png and judged:
        try:
            draw_heatmap(result, os.path.join(args.out, "serving.png"), args.stat)
            log(f"-> {os.path.join(args.out, 'serving.png')}")
        except Exception as e:  # noqa: BLE001
            log(f"heat map failed: {err_text(e)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
