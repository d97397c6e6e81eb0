"""bench/serving.py (issue 41's serving matrix) on the CPU: the cell set, the verdict rules, the
geomean / worst summary, the heat map from a synthetic JSON, the float32 reference through a
shuffled block table, and one cell's check-time-judge path with stand-ins for mlagen and both
FlashMLA peers (a wrong stand-in gets no time). No GPU is touched."""
import math
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCH = os.path.join(ROOT, "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import serving as S  # noqa: E402


# ------------------------------------------------------------------------------- the cells

def test_the_cell_list_has_the_issues_52_cells_and_counts_per_head_count():
    cells = S.cell_list()
    assert len(cells) == 52
    keys = [S.cell_key(c) for c in cells]
    assert len(set(keys)) == 52
    by = {}
    for c in cells:
        by[c["heads"]] = by.get(c["heads"], 0) + 1
    assert by == {8: 9, 16: 12, 32: 9, 64: 9, 128: 13}  # issue 41's table
    for h in S.HEADS:
        one = {(c["batch"], c["kv_len"]) for c in cells if c["heads"] == h and c["q_len"] == 1}
        assert one == {(b, kv) for b in S.BATCHES for kv in S.KV_LENS} - {(128, 8192)}
    multi = [c for c in cells if c["q_len"] > 1]
    assert {c["heads"] for c in multi} == {16, 128}
    assert all(c["kv_len"] == 8192 and c["q_len"] in (2, 4) for c in multi)
    # the cells the issue names as worst exist
    for k in ("h8 1x1024", "h128 4x8192", "h16 1x1024", "h16 4x1024", "h64 16x8192"):
        assert k in keys


def test_cell_selection_quick_spec_and_filters():
    quick = S.select_cells(quick=True)
    assert len(quick) == len(S.QUICK) and {c["heads"] for c in quick} == set(S.HEADS)
    got = S.select_cells(spec="16x64x8192, 128x16x8192x2,16x64x8192")
    assert [S.cell_key(c) for c in got] == ["h16 64x8192", "h128 16x8192 q2"]  # duplicate dropped
    assert len(S.select_cells(heads="128", q_lens="2,4")) == 4
    assert len(S.select_cells(heads="8,32", kv_lens="1024")) == 10
    assert all(c["batch"] == 1 for c in S.select_cells(batches="1"))
    for bad in ("16x64", "12x4x1024", "16x4x1000", "16x4x1024x5", "axbxc"):
        with pytest.raises(ValueError):
            S.parse_cells(bad)


def test_checked_sequences_and_the_repetition_plan():
    assert S.check_seqs(1) == [0]
    assert S.check_seqs(2) == [0, 1]
    assert S.check_seqs(64) == [0, 32, 63]
    assert S.plan_reps(10.0, 1.0, 0.1, 10, 30) == 30         # plenty of time: the most
    assert S.plan_reps(2.0, 0.5, 0.1, 10, 30) == 15          # the share left holds 15 rounds
    assert S.plan_reps(1.0, 5.0, 0.1, 10, 30) == 10          # over budget: the least
    assert S.plan_reps(1.0, 0.0, 0.0, 10, 30) == 30


# ------------------------------------------------------------------------------- the verdicts

def test_judge_applies_the_issues_rules():
    # fp8 q: at least 1.1x FlashMLA fp8
    j = S.judge(100.0, {S.FLASHMLA_FP8: 110.0}, 50.0, 1.1)
    assert j["verdict"] == "met" and math.isclose(j["ratio"], 1.1)
    j = S.judge(100.0, {S.FLASHMLA_FP8: 109.0}, 50.0, 1.1)
    assert j["verdict"] == "not_met" and math.isclose(j["floor_ratio"], 2.0)
    # within 1.2x of the floor: met whatever the peers do
    j = S.judge(12.0, {S.FLASHMLA_FP8: 6.0}, 10.0, 1.1)
    assert j["verdict"] == "met" and math.isclose(j["ratio"], 0.5) and "floor" in j["why"]
    assert S.judge(12.1, {S.FLASHMLA_FP8: 6.0}, 10.0, 1.1)["verdict"] == "not_met"
    # the faster of two peers
    j = S.judge(20.0, {S.FLASHMLA_BF16: 19.0, S.FLASHMLA_FP8: 30.0}, 5.0, 1.0)
    assert j["best_peer"] == S.FLASHMLA_BF16 and j["verdict"] == "not_met"
    assert math.isclose(j["peer_ratios"][S.FLASHMLA_FP8], 1.5)
    j = S.judge(20.0, {S.FLASHMLA_BF16: None, S.FLASHMLA_FP8: 30.0}, None, 1.0)
    assert j["verdict"] == "met" and j["partial"] and j["missing_peers"] == [S.FLASHMLA_BF16]
    # mlagen without a time (a failed check) is never met; no peer and no deciding floor: unjudged
    assert S.judge(None, {S.FLASHMLA_BF16: 10.0}, 9.0, 1.0)["verdict"] == "not_met"
    assert S.judge(50.0, {S.FLASHMLA_BF16: None}, None, 1.0)["verdict"] == "unjudged"
    assert S.judge(50.0, {S.FLASHMLA_BF16: None}, 10.0, 1.0)["verdict"] == "unjudged"
    assert S.judge(11.0, {S.FLASHMLA_BF16: None}, 10.0, 1.0)["verdict"] == "met"


def synthetic_cells():
    """Cells with known ratios: fp8q ratio r(h, i), bf16q 1.0 everywhere, bf16kv failing at 128 heads."""
    cells = []
    for c in S.cell_list():
        i = len([x for x in cells if x["heads"] == c["heads"]])
        r = 0.8 + 0.05 * i if c["heads"] == 8 else 1.2
        comps = {"fp8q": S.judge(100.0, {S.FLASHMLA_FP8: 100.0 * r}, 40.0, 1.1),
                 "bf16q_fp8kv": S.judge(100.0, {S.FLASHMLA_BF16: 100.0, S.FLASHMLA_FP8: 120.0}, 40.0, 1.0),
                 "bf16kv": S.judge(None if c["heads"] == 128 else 100.0, {S.FLASHMLA_BF16: 90.0}, 95.0, 1.0)}
        cells.append(dict(c, key=S.cell_key(c), comparisons=comps, contenders={}, errors=[]))
    return cells


def test_summary_geomean_worst_and_counts():
    cells = synthetic_cells()
    s = S.summarize(cells)
    h8 = s["fp8q"]["by_heads"]["8"]
    rs = [0.8 + 0.05 * i for i in range(9)]
    assert h8["cells"] == 9 and h8["rated"] == 9
    assert math.isclose(h8["geomean"], math.exp(sum(map(math.log, rs)) / 9))
    assert math.isclose(h8["worst"], 0.8) and h8["worst_cell"] == "h8 1x1024"
    assert h8["below_1"] == 4  # 0.80, 0.85, 0.90, 0.95
    assert h8["met"] == 3  # 1.10, 1.15, 1.20 (>= 1.1); none within the floor (40 us)
    assert s["fp8q"]["by_heads"]["16"]["cells"] == 12 and s["fp8q"]["by_heads"]["128"]["cells"] == 13
    assert s["bf16q_fp8kv"]["all"]["met"] == 52 and s["bf16q_fp8kv"]["all"]["below_1"] == 0
    # bf16 cache: 0.9x the peer but within 1.2x of the floor (100 / 95): met; 128 heads failed
    assert s["bf16kv"]["all"]["met"] == 39 and s["bf16kv"]["all"]["not_met"] == 13
    assert s["bf16kv"]["by_heads"]["128"]["rated"] == 0 and s["bf16kv"]["by_heads"]["128"]["geomean"] is None
    assert len(s["bf16kv"]["not_met_cells"]) == 13 and not s["all_met"]
    table = S.summary_table(s)
    lines = table.splitlines()
    assert lines[0].startswith("| heads | cells | fp8 q + fp8 cache vs FlashMLA fp8 |")
    assert lines[2].startswith(f"| 8 | 9 | {h8['geomean']:.2f} / 0.80 | 1.00 / 1.00 | 0.90 / 0.90 |")
    assert "| 128 | 13 |" in table and "n/a" in lines[6]
    assert lines[7].startswith("| all | 52 |") and "(4 below 1)" in lines[7] and "(39 below 1)" in lines[7]
    assert "39/52" in lines[8]


# ------------------------------------------------------------------------------- the heat map

def test_heat_map_png_from_a_synthetic_json(tmp_path):
    pytest.importorskip("matplotlib")
    import json
    cells = synthetic_cells()
    cells[3]["comparisons"]["fp8q"] = S.judge(100.0, {S.FLASHMLA_FP8: None}, None, 1.1)  # unjudged, grey
    result = dict(cells=cells, comparisons=[dict(c, peers=list(c["peers"])) for c in S.COMPARISONS],
                  stat="median", device=dict(name="synthetic"), git=dict(commit="0" * 40))
    result = json.loads(json.dumps(result))  # what the script writes and reads back
    path = tmp_path / "serving.png"
    S.draw_heatmap(result, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000
    # a subset of cells draws too (--quick)
    quick = [c for c in cells if S.cell_key(c) in {S.cell_key(S.make_cell(*q)) for q in S.QUICK}]
    S.draw_heatmap(dict(result, cells=quick), str(tmp_path / "quick.png"))
    assert (tmp_path / "quick.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------- reference and one cell

def test_reference_through_a_shuffled_table_matches_attention_on_the_rows_in_order():
    torch = pytest.importorskip("torch")
    import floor as F
    g = torch.Generator().manual_seed(3)
    batch, kv_len, heads, q_len = 3, 256, 8, 2
    kv = torch.randn(batch * kv_len, 576, generator=g)
    table = F.page_table(torch, batch, kv_len, S.PAGE, 11, "cpu")
    q = torch.randn(batch * q_len, heads, 576, generator=g)
    got = S.cell_reference(torch, q, lambda r: kv[r], table, [0, 2], heads, kv_len, q_len, batch)
    seq_rows = F.gathered_rows(torch, table, S.PAGE, batch, kv_len, "cpu").view(batch, kv_len)
    for n, b in enumerate([0, 2]):
        k = kv[seq_rows[b]]
        for t in range(q_len):
            seen = kv_len - q_len + 1 + t
            s = q.view(batch, q_len, heads, 576)[b, t] @ k[:seen].T * 576 ** -0.5
            want = torch.softmax(s, -1) @ k[:seen, :512]
            assert torch.allclose(got[n, t], want, atol=1e-5, rtol=1e-4)


def _fakes(torch, wrong_fp8_peer=False):
    """Stand-ins computing float32 attention through the table (the right answer, rounded to bf16)."""

    def attend(q, rows_fn, table, seqlens, batch, q_len, heads):
        kv_len = int(seqlens[0])
        out = S.cell_reference(torch, q.float(), rows_fn, table, list(range(batch)), heads, kv_len, q_len, batch)
        return out.to(torch.bfloat16)

    class FakeMlagen:
        def __init__(self):
            self.calls = 0

        def decode(self, q, kv_data, qo_indptr, kv_indptr, config, *, kv_format, q_dtype="bf16", q_scale=None,
                   page_table=None, page_size=0, kv_lens=None):
            assert kv_indptr is None and page_size == S.PAGE and page_table is not None
            self.calls += 1
            batch, q_len, heads = config["batch_size"], config["q_seq_len"], config["num_heads"]
            if kv_format == "fp8":
                kv, s = kv_data["fp8"]
                rows = lambda r: kv.view(-1, 576)[r].float() * s  # noqa: E731
            else:
                rows = lambda r: kv_data["bf16"].view(-1, 576)[r].float()  # noqa: E731
            qf = q.float() * q_scale if q_scale is not None else q.float()
            return attend(qf, rows, page_table, kv_lens, batch, q_len, heads).reshape(-1, heads, 512)

        def last_kernel(self):
            return {"name": "fake"}

        def check_device_errors(self):
            pass

    fm = types.ModuleType("flash_mla")

    class Sched:
        tile_scheduler_metadata = None
        num_splits = None

    fm.get_mla_metadata = lambda: (Sched(), None)

    def dense(qf, kc, dv, seqlens, table, scale, causal, tsm, ns):
        b, ql, h, _ = qf.shape
        return (attend(qf.reshape(b * ql, h, 576), lambda r: kc.view(-1, 576)[r].float(), table, seqlens, b, ql, h)
                .view(b, ql, h, 512), None, None, None)

    fm.flash_mla_with_kvcache = lambda qf, kc, table, seqlens, dv, sched, _n, softmax_scale, causal: dense(
        qf, kc, dv, seqlens, table, softmax_scale, causal, None, None)[:2]
    fm_cuda = types.ModuleType("flash_mla.cuda")
    fm_cuda.dense_decode_fwd = dense

    p8 = types.ModuleType("flashmla_fp8_peer")

    class Peer:
        def __init__(self, softmax_scale=None):
            pass

        def prepare(self, seqlens, heads, q_len=1):
            pass

        def __call__(self, q8, c8, table, seqlens, q_scale, kv_scale, causal=False):
            b, ql, h, _ = q8.shape
            out = attend(q8.reshape(b * ql, h, 576).float() * q_scale, lambda r: c8.view(-1, 576)[r].float() * kv_scale,
                         table, seqlens, b, ql, h).view(b, ql, h, 512)
            if wrong_fp8_peer:
                out = out.flip(0)  # the sequences swapped: a wrong kernel
            return out, None

    p8.FlashMLAFp8Peer = Peer
    return FakeMlagen(), fm, fm_cuda, p8


@pytest.mark.parametrize("wrong_fp8_peer", [False, True])
def test_one_cell_is_checked_timed_and_judged_with_stand_ins(monkeypatch, wrong_fp8_peer):
    torch = pytest.importorskip("torch")
    try:  # bench/bench.py: the package's module where the repository root comes first, else top-level
        import bench.bench as B
    except ImportError:
        import bench as B
    import _common as C
    C.ensure_mlagen_importable()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    mg, fm, fm_cuda, p8 = _fakes(torch, wrong_fp8_peer)
    monkeypatch.setitem(sys.modules, "flash_mla.cuda", fm_cuda)
    run = S.Run()
    run.torch, run.dev = torch, torch.device("cpu")
    run.args = S.parse_args(["--reps", "4", "--min-reps", "2", "--warmup", "1"])
    run.timer = B.Timer(torch, run.dev, 1 << 16)
    run.mlagen, run.mlagen_error = mg, None
    run.peers = {S.FLASHMLA_BF16: (fm, "fake", None), S.FLASHMLA_FP8: (p8, "fake", None)}
    cell = S.make_cell(8, 3, 128, 2)
    data = S.group_inputs(torch, run.dev, 3, 128, 5)
    floors = {"fp8": dict(median_us=1e-3, mean_us=1e-3), "bf16": dict(median_us=1e-3, mean_us=1e-3)}  # never within 1.2x
    row = S.run_cell(run, cell, data, floors, allowance_s=60.0)
    assert row["checked_seqs"] == [0, 1, 2] and row["reps"] == 4
    for c in S.MLAGEN_COLUMNS + (S.FLASHMLA_BF16,):
        e = row["contenders"][c]
        assert "error" not in e and e["rel_err"] < 1e-2 and e["n"] == 4 and e["median_us"] > 0, (c, e)
        # the host's side of the same repetitions: the call inside the span from the flush's launch
        assert 0 < e["host_call_us"] <= e["host_since_flush_us"] and e["device_allocs"] == 0, (c, e)
        assert e["host_bound_reps"] == 0, (c, e)  # nothing is host-bound against Run's default (no limit)
    assert row["contenders"][S.MLAGEN_FP8Q]["kernel"] == "fake"
    fp8 = row["contenders"][S.FLASHMLA_FP8]
    if wrong_fp8_peer:
        assert "median_us" not in fp8 and "rel_l2" in fp8["error"] and row["errors"]
        assert row["comparisons"]["fp8q"]["verdict"] == "unjudged"  # no peer time, the floor far away
        assert row["comparisons"]["bf16q_fp8kv"]["partial"]
    else:
        assert fp8["rel_err"] < 1e-2 and fp8["n"] == 4 and not row["errors"]
        assert row["comparisons"]["fp8q"]["ratio"] > 0
        assert row["comparisons"]["fp8q"]["verdict"] in ("met", "not_met")
    for k in ("fp8q", "bf16q_fp8kv", "bf16kv"):
        assert "ratio_mean" in row["comparisons"][k] and "verdict_mean" in row["comparisons"][k]
    assert S.cell_line(row).startswith("[h8 3x128 q2] reps 4") and " | host " in S.cell_line(row)


def test_call_order_interleaves_by_default_and_groups_on_request():
    assert S.parse_args([]).order == "interleaved"
    assert S.call_order(["a", "b", "c"], 2, "interleaved") == ["a", "b", "c", "a", "b", "c"]
    assert S.call_order(["a", "b", "c"], 2, "grouped") == ["a", "a", "b", "b", "c", "c"]
    assert S.parse_args(["--order", "grouped"]).order == "grouped"
    with pytest.raises(SystemExit):
        S.parse_args(["--order", "random"])


# ------------------------------------------------------------------------------- the command line

def test_help_and_list_run_without_a_gpu():
    r = subprocess.run([sys.executable, "bench/serving.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "--budget-s" in r.stdout and "--quick" in r.stdout
    r = subprocess.run([sys.executable, "bench/serving.py", "--list"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "52 cells; by heads: 8: 9, 16: 12, 32: 9, 64: 9, 128: 13" in r.stdout
    r = subprocess.run([sys.executable, "bench/serving.py", "--list", "--cells", "16x64"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "bad cell" in r.stdout


FLOOR_CODE = """
import sys
sys.path.insert(0, "bench")
import torch
import bench as B, floor as F, serving as S
F.graph_of = lambda torch, fn: fn  # no CUDA graphs on the CPU: launch directly
data = S.group_inputs(torch, torch.device("cpu"), 2, 256, 9)
timer = B.Timer(torch, torch.device("cpu"), 1 << 16)
for fmt in ("fp8", "bf16"):
    r = S.measure_floor(torch, timer, F.build_tile_read(), data, fmt, 2, 256, 1, S.floor_configs("all"))
    assert r["kv_bytes"] == 2 * 256 * (576 if fmt == "fp8" else 1152), r
    assert len(r["variants"]) == 12 and r["config"] in r["variants"] and r["median_us"] > 0, r
    print(fmt, "ok", len(r["variants"]))
# partials that disagree with torch's sums of the rows the table names: refused
try:
    F.partials_of_orig = F.partials_of
    F.partials_of = lambda torch, sums, rpp: F.partials_of_orig(torch, sums.roll(1), rpp)
    S.measure_floor(torch, timer, F.build_tile_read(), data, "fp8", 2, 256, 1, S.floor_configs("64x1x4"))
    print("NOT REFUSED")
except RuntimeError as e:
    print("refused:", e)
"""


def test_the_floor_reads_the_cells_cache_through_its_table_interpreted():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", FLOOR_CODE], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fp8 ok 12" in r.stdout and "bf16 ok 12" in r.stdout, r.stdout
    assert "refused: floor tile_read fp8 2x256" in r.stdout, r.stdout
