"""CPU tests of the cost model's calibration (tools/amd/cost_model.py calibrate()) on aiter's
OPUS 16-head fp8 decode against AMD's measured 228 us at 256x8192.

CI has no network, so aiter's sources cannot be fetched there: the calibration then runs on
the committed instruction census (tools/amd/calibration/opus_16mx1_16nx8_census.json, with
its provenance). These tests need no network and no chroot; the last one compiles aiter's
kernel afresh and compares it with the committed census where the sid chroot and aiter's
sources ($MLAGEN_AITER_DIR or .toolchains/aiter) are both here, and skips otherwise."""
import json
import os

import pytest

from tool_module import load_tool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
cm = load_tool("amd/cost_model.py", "mlagen_cost_model")
CENSUS = cm.CENSUS_FILE


def test_committed_census_has_its_provenance():
    assert os.path.isfile(CENSUS), f"{CENSUS} missing: python3 tools/amd/cost_model.py --write-census"
    assert os.path.getsize(CENSUS) < 100_000
    rec = json.load(open(CENSUS))
    p = rec["provenance"]
    assert p["repo"] == "https://github.com/ROCm/aiter"
    assert p["commit"] == cm.AITER_COMMIT
    assert p["kernel_header"] == cm.AITER_KERNEL_HEADER and p["kernel_header"] in p["source_blobs"]
    assert all(len(b) == 40 for b in p["source_blobs"].values())
    assert p["compiler"].startswith("Debian clang version 21")
    assert "--offload-arch=gfx950" in p["flags"] and "-O3" in p["flags"]
    assert p["instantiation"] == cm.CALIB_SOURCE
    assert "opus_kernel" in p["kernel_symbol"]
    # the census is what census() makes of the committed mnemonics (the pricing tables unchanged)
    assert cm.census(cm.instrs_from_mnemonics(rec["hot_loop_mnemonics"])) == rec["census"]
    assert sum(rec["hot_loop_mnemonics"].values()) == rec["hot_loop_instructions"] == rec["census"]["instructions"]
    assert rec["census"]["mfma"] == {"v_mfma_f32_16x16x128_f8f6f4": 40}
    assert rec["occupancy_waves_per_simd"] >= 2


def _check_within_15pct(c):
    assert "skipped" not in c, c
    assert c["measured_us"] == cm.AITER_MEASURED_US == 228.0
    assert abs(c["modelled_us"] - 228.0) / 228.0 <= 0.15, c
    assert c["within_15pct"] is True and abs(c["error"]) <= 0.15
    assert c["provenance"]["commit"] == cm.AITER_COMMIT


def test_calibration_from_committed_census(tmp_path):
    c = cm.calibrate(ROOT, str(tmp_path / "no-chroot"), str(tmp_path / "out"), fresh=False)
    _check_within_15pct(c)
    assert c["source"] == "committed" and "opus_16mx1_16nx8_census.json" in c["source_detail"]
    assert c["committed_census"]["census_as_stored"] is True
    assert c["bound"] == "memory" and abs(c["error"]) < 0.05  # -1.9% when the census was committed


def test_calibration_without_network_or_chroot_is_not_skipped(tmp_path, monkeypatch):
    """CI's situation: no aiter sources, no fetch, no chroot: the committed census stands in,
    and the result says why a fresh compile did not happen."""
    monkeypatch.setenv("MLAGEN_AITER_FETCH", "0")
    monkeypatch.delenv("MLAGEN_AITER_DIR", raising=False)
    c = cm.calibrate(str(tmp_path), str(tmp_path / "no-chroot"), str(tmp_path / "out"))
    _check_within_15pct(c)
    assert c["source"] == "committed"
    assert "MLAGEN_AITER_FETCH=0" in c["fresh"]["skipped"]


def test_no_census_at_all_is_a_stated_skip(tmp_path):
    c = cm.calibrate(ROOT, str(tmp_path / "no-chroot"), str(tmp_path / "out"), fresh=False,
                     census_file=str(tmp_path / "none.json"))
    assert "skipped" in c and "no committed census" in c["skipped"]


def test_fresh_census_matches_committed(tmp_path, monkeypatch):
    chroot = os.environ.get("MLAGEN_AMD_CHROOT") or os.path.join(ROOT, ".toolchains", "sid")
    if not os.path.exists(chroot + "/usr/bin/clang++-21"):
        pytest.skip(f"no clang++-21 in {chroot} (tools/amd/setup_toolchains.sh)")
    monkeypatch.setenv("MLAGEN_AITER_FETCH", "0")  # local sources only: no network in tests
    src, why = cm.aiter_sources(ROOT)
    if not src:
        pytest.skip(f"aiter's sources not here ({why})")
    c = cm.calibrate(ROOT, chroot, str(tmp_path), fresh=True)
    _check_within_15pct(c)
    assert c["source"] == "fresh"
    assert c["committed_census"]["matches"], c["committed_census"]["differences"]
