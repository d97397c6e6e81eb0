"""The KV formats' one table (codegen/facts.py KV_FORMATS) and the files a new format touches.

Issue 40: adding a KV format is a list of at most six files (docs/design-policies.md, "Adding a KV
format"). The table is what every other layer reads: the generator (spec.py IMPLEMENTED,
WARPGROUP_KV, KV_LAYOUT), the runtime's validation and the launcher (generated/facts.inc), the torch
operator, the binding and the bundle (runtime/python/mlagen/_facts.py). These tests pin each reader
to the table, and scan the product sources: a format's name may appear in code (comments and
docstrings aside) only in the six files, and in the few that record a choice or a measurement about
named kernels, never a requirement.
"""
import io
import os
import re
import tokenize

import pytest

from codegen import catalog, facts, generate, spec

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# The files a new format is written in (mxfp4 as the example), and why each.
FORMAT_FILES = {
    "codegen/facts.py": "its row of KV_FORMATS: code, the callers' name, torch dtypes, layout, scale, archs, stages",
    "runtime/include/mlagen/mlagen.h": "its public mlagen_dtype constant (facts.inc asserts the value)",
    "runtime/include/mlagen/device/formats.cuh": "KvFormat, KvTraits and the format's expansion",
    "runtime/include/mlagen/device/mla_decode_sm90_wgmma.cuh": "the sm90a 16-row body's policy for it",
    "runtime/include/mlagen/device/mla_decode_gfx9.cuh": "the gfx9 body's policy for it",
    "runtime/python/mlagen/quant.py": "its quantizer and its DEQUANTIZE line (tests, the bundle's fallback)",
}
# Files that name a format as a choice or a measurement about named kernels, not as something a new
# format must add: it works without an entry there.
CHOICES = {
    "codegen/catalog.py": "which (q, kv) pairs get specialized kernels and tuning tiles (else the generic kernels)",
    "runtime/python/mlagen/__init__.py": "FASTEST_ORDER, a measured ranking (an unranked format goes last)",
    "tools/check_sm90.py": "the measured spills of named kernels",
}
SCANNED = ("codegen", "runtime", "templates", "tools")
SKIPPED = ("tools/amd/emu",)  # the emulator's harness: test code (its inputs per format), like tests/
GENERATED = ("runtime/python/mlagen/_facts.py",)  # written from facts.py


def _python_code(src: str):
    """(line, token) of a Python source's code: no comments, no docstrings (string statements)."""
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    statement_start = True
    for i, t in enumerate(toks):
        if t.type in (tokenize.NL, tokenize.COMMENT):
            continue
        if t.type == tokenize.STRING and statement_start:
            nxt = next((u for u in toks[i + 1:] if u.type != tokenize.COMMENT), None)
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                continue  # a docstring
        statement_start = t.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        yield t.start[0], t.string


def _c_code(src: str):
    """(line, text) of a C / C++ / template source without its comments."""
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    for n, line in enumerate(src.split("\n"), 1):
        yield n, re.sub(r"//.*", "", line)


def files_naming(word: str) -> dict:
    """rel path -> lines whose code names `word` (any case), over the product sources."""
    pat = re.compile(re.escape(word), re.I)
    hits = {}
    for top in SCANNED:
        for root, _, names in os.walk(os.path.join(ROOT, top)):
            for fn in names:
                path = os.path.join(root, fn)
                rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
                if rel.startswith(SKIPPED) or rel in GENERATED:
                    continue
                if fn.endswith(".py"):
                    code = _python_code(open(path, encoding="utf-8").read())
                elif fn.endswith((".cpp", ".h", ".cuh", ".inc", ".j2", ".hip", ".S")):
                    code = _c_code(open(path, encoding="utf-8").read())
                else:
                    continue
                lines = sorted({n for n, text in code if pat.search(text)})
                if lines:
                    hits[rel] = lines
    return hits


def test_the_scanner_sees_code_and_skips_comments_and_docstrings():
    src = 'x = "mxfp4"  # mxfp4\n"""mxfp4 doc"""\ndef f():\n    """mxfp4"""\n    return ("mxfp4")\n'
    assert [n for n, t in _python_code(src) if "mxfp4" in t] == [1, 5]
    c = 'int a; // mxfp4\n/* mxfp4\n mxfp4 */ const char* s = "mxfp4";\n'
    assert [n for n, t in _c_code(c) if "mxfp4" in t] == [3]


def test_mxfp4_is_named_only_in_its_six_files_and_recorded_choices():
    hits = files_naming("mxfp4")
    assert len(FORMAT_FILES) <= 6
    outside = {f: lines for f, lines in hits.items() if f not in FORMAT_FILES and f not in CHOICES}
    assert not outside, f"mxfp4 named in code outside its files (read it from codegen/facts.py KV_FORMATS): {outside}"
    for f in FORMAT_FILES:  # each listed file is really where the format is written
        assert f in hits, f"{f}: listed as one of mxfp4's files but names it nowhere in code"


@pytest.mark.parametrize("name", list(facts.KV_FORMATS))
def test_every_reader_takes_the_format_from_the_table(name):
    f = facts.KV_FORMATS[name]
    assert facts.DTYPE_CODES[name] == f.code
    assert spec.KV_LAYOUT[name] == (f.row_bytes, f.stride_unit, f.scale)
    for arch in spec.ARCHS:
        assert (name in spec.IMPLEMENTED[arch]["kv_dtype"]) == (arch in f.archs), arch
        if arch in f.archs:
            assert catalog.kv_dtype_of(arch, f.binding) == name
    if "sm90a" in f.archs:
        assert spec.WARPGROUP_KV[name] == f.warpgroup_stages
    assert f.binding in facts.KV_BINDINGS
    assert f.scale in facts.SCALE_KINDS and (f.scale == 2) == (f.scale_block > 0)
    assert f.scale != 2 or facts.QK_DIM % f.scale_block == 0
    header = open(os.path.join(ROOT, "runtime/include/mlagen/mlagen.h"), encoding="utf-8").read()
    assert re.search(rf"MLAGEN_DTYPE_{name.upper()}\s*=\s*{f.code}\b", header), f"mlagen.h: MLAGEN_DTYPE_{name.upper()}"
    enums = open(os.path.join(ROOT, "runtime/include/mlagen/device/formats.cuh"), encoding="utf-8").read()
    assert re.search(r"enum class KvFormat\b[^;]*\b" + f.device.split("::")[1] + r"\b", enums), f.device


def test_the_generated_tables_are_the_table():
    """facts.inc's C table and _facts.py's dict carry every row as facts.py states it."""
    inc = generate.render(catalog.build_catalog())["facts.inc"]
    for name, f in facts.KV_FORMATS.items():
        dtypes = ", ".join(f'"{t}"' for t in f.torch_dtypes)
        row = rf'\{{{f.code}, "{name}", "{f.binding}", \{{{re.escape(dtypes)}(, nullptr)*\}}, {f.row_bytes}, ' \
              rf'{f.stride_unit}, {f.scale}, {f.scale_block}\}}'
        assert re.search(row, inc), f"facts.inc: no row {row}"
    from mlagen import _facts
    assert _facts.KV_BINDINGS == facts.KV_BINDINGS
    for name, f in facts.KV_FORMATS.items():
        assert _facts.KV_FORMATS[name] == dict(code=f.code, binding=f.binding, torch_dtypes=f.torch_dtypes,
                                               row_bytes=f.row_bytes, stride_unit=f.stride_unit, scale=f.scale,
                                               scale_block=f.scale_block)


def test_every_binding_dequantizes_and_the_binding_lists_them():
    pytest.importorskip("torch")
    import mlagen
    from mlagen import quant
    assert tuple(mlagen.KV_FORMATS) == facts.KV_BINDINGS
    assert set(quant.DEQUANTIZE) == set(facts.KV_BINDINGS)
