"""CPU tests of the generator: names, catalog, determinism, staleness check."""
import os
import shutil
import subprocess
import sys

import pytest

from codegen import catalog, generate
from codegen.spec import IMPLEMENTED, ANY, KernelSpec, SpecError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout


def test_name_round_trip_catalog():
    for s in catalog.build_catalog():
        assert KernelSpec.parse(s.name) == s
        assert s.filename == s.name + ".hip"


@pytest.mark.parametrize("spec", [
    KernelSpec("sm90a", 32, 8192, 8, block_n=64),
    KernelSpec("sm90a", ANY, ANY, ANY, block_n=64, stages=2),
    KernelSpec("sm90a", 48, 2048, 3, block_n=64, stages=3),
    KernelSpec("gfx950", 4, 1024, 4, q_dtype="fp8", kv_dtype="mxfp4", stages=2),
    KernelSpec("gfx942", 4, 1024, 4, kv_dtype="fp8e4m3fnuz", stages=2),
], ids=lambda s: s.name)
def test_name_round_trip_fields(spec):
    assert KernelSpec.parse(spec.name) == spec


def test_a_kernel_name_parses_into_its_fields():
    s = KernelSpec.parse("mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn_bn64_st3")
    assert (s.arch, s.batch, s.kv_len, s.splits, s.q_dtype, s.kv_dtype) == ("sm90a", 32, 8192, 8, "bf16", "fp8e4m3fn")
    assert (s.block_n, s.stages, s.body) == (64, 3, "sm90_wgmma")


@pytest.mark.parametrize("name, msg", [
    ("mla_decode_sm90a_b32_kv8192_qbf16_kvfp8e4m3fn", "not a kernel name"),
    ("mla_decode_sm80_b32_kv8192_s8_qbf16_kvfp8e4m3fn", "KernelSpec.arch"),
    ("mla_decode_gfx950_b32_kv8192_s8_qbf16_kvfp8e4m3fn_bn32_st2", "not canonical"),
    ("mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn", r"KernelSpec.block_n=32: expected 64 on sm90a"),
    ("mla_decode_sm90a_b4_kv1024_s16_qbf16_kvfp8e4m3fn_st3", r"KernelSpec.block_n=32: expected 64 on sm90a"),
    ("mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn_st3_bn64", "out of order"),
    ("mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn_zz3", "unknown tag"),
    ("mla_decode_sm90a_b32_kvany_s8_qbf16_kvfp8e4m3fn", "all 'any'"),
    ("mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fnuz", "KernelSpec.kv_dtype"),
    ("mla_decode_sm90a_b4_kv64_s8_qbf16_kvfp8e4m3fn_bn64_st2", "KernelSpec.splits"),
])
def test_bad_names_are_rejected_with_the_field(name, msg):
    with pytest.raises(SpecError, match=msg):
        KernelSpec.parse(name)


def test_default_catalog_is_the_leaderboard():
    specs = catalog.build_catalog(include_shapes_file=False)
    for arch in catalog.DEFAULT_ARCHS:
        mine = [s for s in specs if s.arch == arch]
        for q_dtype, kv_dtype in catalog.DEFAULT_DTYPES[arch]:  # every leaderboard shape, specialized
            shapes = sorted((s.batch, s.kv_len) for s in mine
                            if not s.generic and not s.page_size and (s.num_heads, s.q_len) == (16, 1)
                            and (s.q_dtype, s.kv_dtype) == (q_dtype, kv_dtype))
            assert shapes == sorted(catalog.LEADERBOARD_SHAPES), (arch, q_dtype, kv_dtype)
        # other query rows: exactly ROWS_SPECIALIZED's (heads, q_len, dtypes, shapes)
        rows = catalog.ROWS_SPECIALIZED.get(arch, {})
        got = sorted((s.num_heads, s.q_len, s.q_dtype, s.kv_dtype, s.batch, s.kv_len) for s in mine
                     if (s.num_heads, s.q_len) != (16, 1))
        want = sorted((h, n, q, kv, b, L) for (h, n), (pairs, shapes_) in rows.items() for q, kv in pairs
                      for b, L in shapes_)
        assert got == want, arch
        paged = catalog.PAGED_SPECIALIZED.get(arch)  # page sizes 1 and 64 on the long shapes
        got = sorted((s.q_dtype, s.kv_dtype, s.batch, s.kv_len, s.page_size) for s in mine if s.page_size)
        want = sorted((q, kv, b, n, pg) for q, kv in paged["dtypes"] for b, n in paged["shapes"]
                      for pg in paged["page_sizes"]) if paged else []
        assert got == want, arch
        if paged:
            assert {1, 64} <= set(paged["page_sizes"])
        # one generic kernel for every implemented (q, kv) pair, tile candidates for bf16 q
        generic = sorted((s.q_dtype, s.kv_dtype) for s in mine if s.role == 1)
        assert generic == sorted(catalog.GENERIC_DTYPES[arch]), arch
        assert len(generic) == len(IMPLEMENTED[arch]["q_dtype"]) * len(IMPLEMENTED[arch]["kv_dtype"])
        assert sum(s.role == 2 for s in mine) == sum(len(v) for (a, _), v in catalog.TUNING_TILES.items() if a == arch)
        assert all(s.implemented for s in mine)
    # every arch decodes its own fp8 flavour
    assert {s.kv_dtype for s in specs if s.arch == "gfx942"} - {"bf16", "mxfp4"} == {"fp8e4m3fnuz"}
    assert {s.kv_dtype for s in specs if s.arch != "gfx942"} - {"bf16", "mxfp4"} == {"fp8e4m3fn"}
    assert {s.kv_dtype for s in specs if s.arch == "sm90a"} == {"fp8e4m3fn", "bf16", "mxfp4"}
    assert [s.name for s in specs] == sorted(s.name for s in specs)


def test_user_shapes_and_shapes_file(tmp_path):
    base = catalog.build_catalog(include_shapes_file=False)
    specs = catalog.build_catalog(catalog.parse_shapes("48x2048, 4x1024"), include_shapes_file=False)
    assert any(s.batch == 48 and s.kv_len == 2048 for s in specs)
    # 48x2048 adds one kernel per specialized (arch, q, kv); 4x1024 is a leaderboard shape: no duplicate
    assert len(specs) == len(base) + sum(len(v) for v in catalog.DEFAULT_DTYPES.values())
    with pytest.raises(SpecError, match="BATCHxKV_LEN"):
        catalog.parse_shapes("48by2048")
    assert catalog.parse_shapes("# c\n8x512\n16x300 # tail\n") == [(8, 512), (16, 300)]


def test_duplicate_keys_are_an_error():
    a = KernelSpec("sm90a", 4, 1024, 4, block_n=64)
    with pytest.raises(SpecError, match="duplicate"):
        catalog.check_unique([a, a])
    with pytest.raises(SpecError, match="same registry key"):
        catalog.check_unique([a, a.replace(splits=8)])


def test_tuning_table_is_read():
    tuning = {"sm90a": {"qbf16_kvfp8e4m3fn": {"4x1024": {"splits": 2, "block_n": 64, "stages": 3}}}}
    specs = catalog.build_catalog(tuning=tuning, include_shapes_file=False)
    s = next(s for s in specs if (s.arch, s.batch, s.kv_len, s.q_dtype, s.kv_dtype, s.num_heads, s.page_size)
             == ("sm90a", 4, 1024, "bf16", "fp8e4m3fn", 16, 0))
    assert (s.splits, s.block_n, s.stages) == (2, 64, 3)


def test_generated_tree_is_fresh():
    assert generate.check(catalog.build_catalog()) == []


def test_generation_is_deterministic(tmp_path):
    specs = catalog.build_catalog()
    a, b = tmp_path / "a", tmp_path / "b"
    generate.write(specs, str(a))
    generate.write(list(reversed(specs)), str(b))
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
        assert (a / n).read_bytes() == (open(os.path.join(ROOT, "generated", n), "rb").read()), n
    assert generate.write(specs, str(a)) == []  # write-if-different: nothing to touch


def test_generated_files_carry_banner_and_fingerprint():
    specs = catalog.build_catalog()
    fp = generate.fingerprint(specs)
    for n, content in generate.render(specs).items():
        if n.endswith((".hip", ".inc", ".cmake")):
            assert "do not edit" in content.splitlines()[0] and fp in content.splitlines()[0], n


def test_check_mode_fails_on_a_stale_tree(tmp_path):
    stale = tmp_path / "generated"
    shutil.copytree(os.path.join(ROOT, "generated"), stale)
    victim = sorted(p for p in os.listdir(stale) if p.endswith(".hip"))[-1]
    (stale / victim).write_text((stale / victim).read_text() + "// hand edit\n")
    (stale / "mla_decode_sm90a_b1_kv1_s1_qbf16_kvfp8e4m3fn.hip").write_text("// left over\n")
    os.remove(stale / "registry.inc")
    r = subprocess.run([sys.executable, "-m", "codegen", "check", "--out", str(stale)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert f"differs: {victim}" in r.stderr
    assert "missing: registry.inc" in r.stderr
    assert "not generated (stale): mla_decode_sm90a_b1_kv1_s1" in r.stderr
    ok = subprocess.run([sys.executable, "-m", "codegen", "check"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_fingerprint_changes_with_templates(tmp_path, monkeypatch):
    specs = catalog.build_catalog()
    before = generate.fingerprint(specs)
    tdir = tmp_path / "templates"
    shutil.copytree(generate.TEMPLATES, tdir)
    (tdir / "kernel.hip.j2").write_text((tdir / "kernel.hip.j2").read_text() + "// x\n")
    monkeypatch.setattr(generate, "TEMPLATES", str(tdir))
    assert generate.fingerprint(specs) != before
    assert generate.fingerprint(specs[:-1]) != generate.fingerprint(specs)


def test_strict_undefined(tmp_path, monkeypatch):
    tdir = tmp_path / "templates"
    shutil.copytree(generate.TEMPLATES, tdir)
    (tdir / "kernel.hip.j2").write_text("{{ not_a_variable }}\n")
    monkeypatch.setattr(generate, "TEMPLATES", str(tdir))
    import jinja2
    with pytest.raises(jinja2.UndefinedError):
        generate.render(catalog.build_catalog())


def test_cli_list_prints_the_catalog():
    r = subprocess.run([sys.executable, "-m", "codegen", "list", "--shapes", "48x2048"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0
    assert "mla_decode_sm90a_b48_kv2048_" in r.stdout
    r = subprocess.run([sys.executable, "-m", "codegen", "list", "--shapes", "48x"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "BATCHxKV_LEN" in r.stderr


def test_row_specs_round_trip_and_validate():
    s = KernelSpec("sm90a", 64, 8192, 1, "bf16", "fp8e4m3fn", num_heads=128, block_n=64, stages=2)
    assert "_h128_" in s.name and KernelSpec.parse(s.name) == s
    s2 = KernelSpec("sm90a", 32, 8192, 2, "bf16", "fp8e4m3fn", q_len=4, block_n=64, stages=2)
    assert "_ql4_" in s2.name and KernelSpec.parse(s2.name) == s2
    for kw, field in [(dict(num_heads=12), "num_heads"), (dict(q_len=5), "q_len")]:
        with pytest.raises(SpecError, match=field):
            KernelSpec("sm90a", 4, 1024, 1, **kw)
    with pytest.raises(SpecError, match="generic"):
        KernelSpec("sm90a", 0, 0, 0, num_heads=128)


def test_rows_body_specs_round_trip_and_validate():
    """block_m 64 (the sm90a rows body): named _bm64, parsed back, its body and tiling; refused,
    naming the field, where the body does not apply."""
    from codegen.generate import tiling_expr
    s = KernelSpec("sm90a", 64, 8192, 1, "bf16", "fp8e4m3fn", num_heads=128, block_n=64, stages=3, block_m=64)
    assert s.name.endswith("_h128_bn64_st3_bm64") and KernelSpec.parse(s.name) == s
    assert s.body == "sm90_rows" and s.target_blocks == 132 and "RowsTiling</*stages=*/3" in tiling_expr(s)
    ok = dict(arch="sm90a", batch=4, kv_len=1024, splits=1, kv_dtype="fp8e4m3fn", num_heads=128, block_n=64,
              stages=3, block_m=64)
    for kw in (dict(block_m=48), dict(num_heads=32), dict(num_heads=16, q_len=2), dict(stages=4), dict(page_size=64)):
        with pytest.raises(SpecError, match="block_m|stages|page_size"):
            KernelSpec(**{**ok, **kw})
    for kw in (dict(kv_dtype="bf16", block_n=32), dict(block_n=32)):
        with pytest.raises(SpecError, match="block_n=32: expected 64 on sm90a"):
            KernelSpec(**{**ok, **kw})
    # an fp8 q's Q is half a bf16 q's hi + lo: one stage more fits
    s8 = KernelSpec(**{**ok, "q_dtype": "fp8", "stages": 4})
    assert s8.name.endswith("_h128_bn64_bm64") and KernelSpec.parse(s8.name) == s8  # (4 stages: the default)
    with pytest.raises(SpecError, match="stages"):
        KernelSpec(**{**ok, "q_dtype": "fp8", "stages": 5})
    with pytest.raises(SpecError, match="block_m"):
        KernelSpec("gfx950", 4, 1024, 1, num_heads=128, block_m=64, stages=2)
    # the catalog's rows kernels of 64 rows and more take it, the others keep 16
    from codegen.catalog import build_catalog
    rows = [k for k in build_catalog(archs=["sm90a"]) if (k.num_heads, k.q_len) != (16, 1)]
    def expected(k):
        r = k.num_heads * k.q_len
        return 16 if k.kv_dtype not in ("fp8e4m3fn", "bf16") else 64 if r % 64 == 0 else 32 if r % 32 == 0 else 16
    assert rows and all(k.block_m == expected(k) for k in rows), [(k.name, k.block_m) for k in rows]
    assert any(k.block_m == 32 for k in rows)
    # block_m 32: heads x q_len a multiple of 32, its own stage limits; a generic kernel of its own
    s32 = KernelSpec("sm90a", 64, 8192, 2, "bf16", "fp8e4m3fn", num_heads=32, block_n=64, stages=4, block_m=32)
    assert s32.name.endswith("_h32_bn64_bm32") and KernelSpec.parse(s32.name) == s32
    assert "/*rows=*/32" in tiling_expr(s32)
    g32 = KernelSpec("sm90a", 0, 0, 0, "bf16", "fp8e4m3fn", block_n=64, stages=4, block_m=32)
    assert g32.name.endswith("_bany_kvany_sany_qbf16_kvfp8e4m3fn_bn64_bm32") and KernelSpec.parse(g32.name) == g32
    assert g32.role == 3 and g32.key != KernelSpec("sm90a", 0, 0, 0, "bf16", "fp8e4m3fn", block_n=64, stages=3,
                                                     block_m=64).key
    generic_rows = sorted((k.q_dtype, k.block_m) for k in build_catalog(archs=["sm90a"])
                          if k.role == 3 and k.kv_dtype == "fp8e4m3fn")
    assert generic_rows == [("bf16", 32), ("bf16", 64), ("fp8", 32), ("fp8", 64)], generic_rows
    for kw in (dict(num_heads=16), dict(stages=5)):
        with pytest.raises(SpecError, match="block_m|stages"):
            KernelSpec(**{**dict(arch="sm90a", batch=64, kv_len=8192, splits=2, kv_dtype="fp8e4m3fn", num_heads=32,
                                 block_n=64, stages=4, block_m=32), **kw})


def test_bf16_kv_takes_the_rows_body_as_a_format_policy():
    """bf16 KV runs the same rows body as fp8 with the bf16 format policy (RowsKv<kBf16>): body
    sm90_rows (one body, the format a policy of it), tiling RowsTiling<..., KvFormat::kBf16> (fp8's tiling keeps its three
    arguments); 72 KB stages leave room for 2 only (both block_m, either q); the catalog builds the
    128 / 64 / 32-head kernels of 64x8192 with it (64, 64, 32 rows a block) and four generic ones."""
    from codegen import spec as spec_mod
    from codegen.catalog import build_catalog
    from codegen.generate import tiling_expr
    s = KernelSpec("sm90a", 64, 8192, 1, "bf16", "bf16", num_heads=128, block_n=64, stages=2, block_m=64)
    assert s.name == "mla_decode_sm90a_b64_kv8192_s1_qbf16_kvbf16_h128_bn64_st2_bm64" and KernelSpec.parse(s.name) == s
    assert s.body == "sm90_rows" and s.rows_body and s.target_blocks == 132
    assert tiling_expr(s) == "mlagen::device::RowsTiling</*stages=*/2, QFormat::kBf16, /*rows=*/64, KvFormat::kBf16>"
    f8 = KernelSpec("sm90a", 64, 8192, 1, "bf16", "fp8e4m3fn", num_heads=128, block_n=64, stages=3, block_m=64)
    assert f8.body == "sm90_rows" and tiling_expr(f8).endswith("/*rows=*/64>")
    for q in ("bf16", "fp8"):
        for block_m, heads in ((64, 128), (32, 32)):
            assert spec_mod.rows_body_tiles("sm90a", q, "bf16", block_m=block_m) == dict(block_n=64, stages=2,
                                                                                            block_m=block_m)
            with pytest.raises(SpecError, match="stages=3: expected 2 "):
                KernelSpec("sm90a", 64, 8192, 1, q, "bf16", num_heads=heads, block_n=64, stages=3, block_m=block_m)
    cat = build_catalog(archs=["sm90a"])
    got = {(k.num_heads, k.batch, k.kv_len): k for k in cat if k.kv_dtype == "bf16" and k.rows_body and not k.generic}
    for (heads, batch, kv_len), block_m in (((128, 64, 8192), 64), ((64, 64, 8192), 64), ((32, 64, 8192), 32),
                                            ((128, 128, 4096), 64), ((128, 2, 1000), 64)):
        k = got[(heads, batch, kv_len)]
        assert (k.block_m, k.stages, k.q_dtype, k.body) == (block_m, 2, "bf16", "sm90_rows"), k.name
    generic = sorted((k.q_dtype, k.block_m) for k in cat if k.role == 3 and k.kv_dtype == "bf16")
    assert generic == [("bf16", 32), ("bf16", 64), ("fp8", 32), ("fp8", 64)], generic


def test_mxfp4_takes_the_rows_body_expanded_into_the_bf16_tile():
    """mxfp4 KV reaches the rows body through the expanded policy (RowsKv's primary template: the bf16
    tile, its O threads reading the packed rows and scales into registers a tile ahead): the facts
    table names its tile "bf16_expanded" and spec.ROWS_BODY follows the table; 32 rows a block only
    (at 64 the registers held ahead spilled), so 64..128 rows take blocks of 32 and block_m 64 is
    refused naming the field; the catalog builds its two generic rows kernels (role 3) and they
    carry the format in their tiling."""
    from codegen import spec as spec_mod
    from codegen.catalog import build_catalog
    from codegen.facts import KV_FORMATS
    from codegen.generate import tiling_expr
    assert {k: f.rows_tile for k, f in KV_FORMATS.items()} == {
        "bf16": "bf16", "fp8e4m3fn": "e4m3", "fp8e4m3fnuz": None, "mxfp4": "bf16_expanded"}
    assert set(spec_mod.ROWS_BODY) == {("sm90a", "bf16"), ("sm90a", "fp8e4m3fn"), ("sm90a", "mxfp4")}
    for q in ("bf16", "fp8"):
        for rows in (32, 64, 128, 96):
            assert spec_mod.rows_body_tiles("sm90a", q, "mxfp4", rows=rows) == dict(block_n=64, stages=2, block_m=32)
        assert spec_mod.rows_body_tiles("sm90a", q, "mxfp4", rows=16) is None
        assert spec_mod.rows_body_tiles("sm90a", q, "mxfp4", block_m=64) is None
        with pytest.raises(SpecError, match="block_m=64: expected one of \\[32\\] with mxfp4 KV"):
            KernelSpec("sm90a", 0, 0, 0, q, "mxfp4", block_n=64, stages=2, block_m=64)
        with pytest.raises(SpecError, match="stages=3: expected 2 "):
            KernelSpec("sm90a", 0, 0, 0, q, "mxfp4", block_n=64, stages=3, block_m=32)
    s = KernelSpec("sm90a", 0, 0, 0, "bf16", "mxfp4", block_n=64, stages=2, block_m=32)
    assert s.body == "sm90_rows" and s.rows_body and KernelSpec.parse(s.name) == s
    assert tiling_expr(s) == "mlagen::device::RowsTiling</*stages=*/2, QFormat::kBf16, /*rows=*/32, KvFormat::kMxfp4>"
    cat = build_catalog(archs=["sm90a"])
    generic = sorted((k.q_dtype, k.block_m) for k in cat if k.role == 3 and k.kv_dtype == "mxfp4")
    assert generic == [("bf16", 32), ("fp8", 32)], generic


def test_every_generated_kernel_names_its_body():
    """The generator names each kernel's body (KernelSpec.body, BODIES) in its tiling type, and the
    generated file asserts the tiling's kBody against it: the device code never infers a body from
    the tiles. Every kernel of every arch; the 16-row NVIDIA tilings take the body as their first
    argument; every body of BODIES has a kernel."""
    from codegen.catalog import build_catalog
    from codegen.generate import render, tiling_expr
    from codegen.spec import BODIES
    cat = build_catalog()
    files = render(cat)
    seen = set()
    for k in cat:
        text = files[k.filename]
        assert f"static_assert(KernelTiling::kBody == {BODIES[k.body]}," in text, k.name
        if k.vendor == "nvidia" and not k.rows_body:
            assert tiling_expr(k).startswith(f"mlagen::device::Tiling<{BODIES[k.body]}, "), k.name
        seen.add(k.body)
    assert seen == set(BODIES), (seen, set(BODIES))
    assert set(BODIES) == {"sm90_wgmma", "sm90_rows", "gfx9", "gfx950_fp8"}, BODIES


def test_sm90a_kernels_walk_tiles_of_64():
    """sm90a has two bodies, both in tiles of 64 tokens (the mma.sync body of tiles of 32 is
    retired): every catalog kernel, the defaults and the tuning candidates; a block_n of 32 is
    refused naming the field and the value expected, for any format and for the generic kernel."""
    from codegen.spec import ARCH_TILES, WARPGROUP_BLOCK_N, default_tiles
    cat = [k for k in catalog.build_catalog() if k.arch == "sm90a"]
    assert cat and {k.block_n for k in cat} == {WARPGROUP_BLOCK_N} == {64}
    assert {k.body for k in cat} == {"sm90_wgmma", "sm90_rows"}
    assert all(k.body == ("sm90_rows" if k.rows_body else "sm90_wgmma") and k.warpgroup != k.rows_body for k in cat)
    assert default_tiles("sm90a") == ARCH_TILES["sm90a"] == dict(block_n=64, stages=2)
    assert all(bn == 64 for (arch, _), tiles in catalog.TUNING_TILES.items() if arch == "sm90a" for bn, _ in tiles)
    for kv in ("fp8e4m3fn", "bf16", "mxfp4"):
        for shape in ((4, 1024, 4), (ANY, ANY, ANY)):
            with pytest.raises(SpecError, match=r"KernelSpec.block_n=32: expected 64 on sm90a"):
                KernelSpec("sm90a", *shape, "bf16", kv, block_n=32, stages=2)
    assert KernelSpec("gfx942", 4, 1024, 4, kv_dtype="fp8e4m3fnuz", block_n=32, stages=2).body == "gfx9"  # AMD: tiles of 32


def test_wgmma_table_holds_every_wrapper_the_device_code_calls():
    """codegen/wgmma.py renders generated/wgmma_ops.inc: every wgmma_m64n* the device headers call is
    a row of the table and every row is called (no dead wrapper); a row that is no wgmma shape is
    refused; a row's text numbers its operands after its N / 2 accumulators."""
    import re
    from codegen import wgmma
    wgmma.check_table()
    device = os.path.join(ROOT, "runtime", "include", "mlagen", "device")
    called = set()
    for name in os.listdir(device):
        with open(os.path.join(device, name)) as f:
            called |= set(re.findall(r"\b(wgmma_m64n\w+)\s*\(", f.read()))
    assert called == {w.name for w in wgmma.WGMMA}
    with pytest.raises(ValueError, match="not a wgmma shape"):
        wgmma.check_table((wgmma.Wgmma(24, 32, "e4m3", "ss", "acc", "", "N = 24 is not a multiple of 16"),))
    with pytest.raises(ValueError, match="twice"):
        wgmma.check_table(wgmma.WGMMA[:1] * 2)
    text, outputs, inputs = wgmma.Wgmma(64, 16, "bf16", "ss", "pred", "", "").asm()
    assert "setp.ne.b32 p, %34, 0" in text and "%32, %33, p, 1, 1, 0, 0;" in text
    assert outputs.count('"+f"') == 32 and inputs == '"l"(desc_a), "l"(desc_b), "r"(accumulate)'
    text, outputs, inputs = wgmma.Wgmma(32, 32, "e4m3", "rs", "acc", "", "").asm()
    assert "{%16,%17,%18,%19}, %20, 1, 1, 1;" in text and inputs.endswith('"l"(desc_b)')
    assert '"=f"' in wgmma.Wgmma(128, 32, "e4m3", "ss", "zero", "_first", "").asm()[1]
    text, outputs, inputs = wgmma.Wgmma(256, 16, "bf16", "rs", "acc", "_nb", "", tnsp_b=1).asm()
    assert "{%128,%129,%130,%131}, %132, 1, 1, 1, 1;" in text and outputs.count('"+f"') == 128  # tnspB last
    with pytest.raises(ValueError, match="tnsp_b"):
        wgmma.check_table((wgmma.Wgmma(64, 32, "e4m3", "rs", "acc", "", "e4m3 has no transpose", tnsp_b=1),))
