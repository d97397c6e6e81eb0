"""CPU tests of the sm_90a compile check (tools/check_sm90.py): the ptxas report parser on a fixed
report (the C75xx messages that say ptxas serialized a kernel's wgmmas, and spills), and, where
nvcc is installed, two rows-body kernels compiled as CMake compiles them: they must come out
with no C75xx message and no spill. A missing nvcc is a skip with that reason."""
import os

import pytest

from tool_module import load_tool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/<kind>/ -> the checkout
cs = load_tool("check_sm90.py", "mlagen_check_sm90")

# what ptxas -v printed for the build whose S chain ran ahead of the softmax (branch exp/rows-s-ahead;
# names shortened, spill line from a later variant): the C75xx messages come first, naming their function
REPORT = """ptxas info    : (C7517) warpgroup.wait is injected in around line 6870 by compiler to allow use of registers defined by GMMA in function '_ZN6mlagen6device17mla_decode_kernelE'
ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage in the function '_ZN6mlagen6device17mla_decode_kernelE'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN6mlagen6device18mla_combine_kernelE' for 'sm_90a'
ptxas info    : Function properties for _ZN6mlagen6device18mla_combine_kernelE
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers, used 0 barriers
ptxas info    : Compile time = 25.805 ms
ptxas info    : Compiling entry function '_ZN6mlagen6device17mla_decode_kernelE' for 'sm_90a'
ptxas info    : Function properties for _ZN6mlagen6device17mla_decode_kernelE
    40 bytes stack frame, 36 bytes spill stores, 88 bytes spill loads
ptxas info    : Used 168 registers, used 2 barriers
"""


def test_parser_reads_each_entry_its_registers_spills_and_messages():
    funcs = {f["name"]: f for f in cs.parse_ptxas(REPORT)}
    assert set(funcs) == {"_ZN6mlagen6device18mla_combine_kernelE", "_ZN6mlagen6device17mla_decode_kernelE"}
    comb, dec = funcs["_ZN6mlagen6device18mla_combine_kernelE"], funcs["_ZN6mlagen6device17mla_decode_kernelE"]
    assert (comb["registers"], comb["spill_stores"], comb["spill_loads"], comb["perf"]) == (64, 0, 0, [])
    # the messages name the decode kernel, though ptxas prints them before any entry's lines
    assert [p["code"] for p in dec["perf"]] == ["C7517", "C7514"]
    assert (dec["registers"], dec["stack"], dec["spill_stores"], dec["spill_loads"]) == (168, 40, 36, 88)


def test_judge_refuses_serialized_wgmmas_and_spills_beyond_the_known_bound():
    funcs = cs.parse_ptxas(REPORT)
    bad = cs.judge("mla_decode_sm90a_b64_kv8192_s2_qbf16_kvfp8e4m3fn_ql2_bn64_bm32.hip", funcs)
    assert any("C7514" in b for b in bad) and any("C7517" in b for b in bad)
    assert any("spills 36 B stored / 88 B loaded (allowed: 0)" in b for b in bad)
    clean = [dict(f, perf=[], spill_stores=0, spill_loads=0) for f in funcs]
    assert cs.judge("any.hip", clean) == []
    # a known spill is allowed up to its bound, and not a byte more
    name, (bound, _) = next(iter(cs.KNOWN_SPILLS.items()))
    at = [dict(clean[1], spill_stores=bound, spill_loads=bound)]
    over = [dict(clean[1], spill_loads=bound + 1)]
    assert cs.judge(name, at) == [] and len(cs.judge(name, over)) == 1
    assert cs.judge("any.hip", []) == ["ptxas reported no entry function"]


@pytest.mark.parametrize("source", ["mla_decode_sm90a_b3_kv1000_s8_qbf16_kvfp8e4m3fn_ql2_bn64_bm32.hip",
                                    "mla_decode_sm90a_b2_kv1000_s8_qfp8_kvfp8e4m3fn_h128_bn64_bm64.hip",
                                    "mla_decode_sm90a_b2_kv1000_s8_qbf16_kvbf16_h128_bn64_st2_bm64.hip",
                                    "mla_decode_sm90a_bany_kvany_sany_qfp8_kvbf16_bn64_st2_bm32.hip"])
def test_rows_body_kernels_compile_without_serialized_wgmmas_or_spills(source):
    nvcc = cs.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin): the sm_90a compile check needs it")
    gen = os.path.join(ROOT, "generated")
    rc, text = cs.compile_one(nvcc, os.path.join(gen, source), [os.path.join(ROOT, "runtime", "include"), gen])
    assert rc == 0, text[-2000:]
    funcs = cs.parse_ptxas(text)
    stem = source[:-len(".hip")]
    decode = [f for f in funcs if f["name"] in (stem, stem + "_q8")]  # the entry points (templates/kernel.hip.j2)
    assert decode and all(f["registers"] == 168 for f in decode)  # 384 threads: 168 at launch
    assert cs.judge(source, funcs) == []
