"""Every numeric tolerance the tests use, with where the number comes from.

Errors are relative L2: ||out - ref|| / ||ref|| over the whole output ("rel_l2"), or the
largest over the (token, head) rows of the same ratio per row ("row_rel_l2").
"""

TOLERANCES = {
    # fp8 KV against float32 attention on the SAME inputs the kernel sees (its q: bf16, or the
    # fp8 q dequantized; the dequantized fp8 KV). On sm90a the 16-row fp8 kernels are the
    # warpgroup kernel (runtime/include/mlagen/device/mla_decode_sm90_wgmma.cuh, tiles of 64):
    # K and V go to fp8 wgmma as stored (e4m3, exact); q times a
    # power of two per head is split into e4m3 hi + lo/16 (exact for a bf16 q: hi holds 4 of
    # its 8 significant bits, lo the rest; exact for an fp8 q; only values ~2^13 below their
    # head's largest lose bits, in e4m3's subnormals); P x 256 split the same way (~8
    # significant bits, as a bf16 P); O accumulates in the wgmma's accumulators over all the
    # tiles of a block (a split).
    #  It ends with the bf16 output rounding, which alone is 1.66e-3 rel-L2 (the float32
    #  reference rounded to bf16: bench/row_errors.py (removed with the probes; in git history) fp8kv_fp8q_*, bench/results/row_errors_*.json).
    # Measured on the H200 (bench/row_errors.py (removed with the probes; in git history) --kernels, 3 seeds a leaderboard shape,
    # bench/results/row_errors_gpu_d36b2c6.json; an earlier bench run's figures agree:
    # 1.7-3.3e-3): warpgroup 1.71-1.93e-3
    # at up to 2048 tokens a block, 3.27-3.28e-3 at 256x8192 (one split: 8192 tokens a
    # block). The error grows with the tokens a block (mxfp4 in the same kernel: 3.12e-3 at
    # 256x8192, where a kernel of bf16 operands and fp32 accumulators measured 1.77e-3),
    # consistent with the reduced accumulation precision of Hopper's fp8 wgmma (the DeepSeek-V3 report, 3.3.2:
    # ~14 bits) while O sums 8192 tokens in its accumulators. Per (token, head) row the worst
    # is 4.3e-3 (256x8192). Seed to seed the error moves < 0.5% (3.271-3.282e-3 at 256x8192),
    # so 4e-3, 1.2x the worst shape and >= 2x every other, holds for fresh seeds, while a
    # wrong split, mask or scale gives ~1e-1. Not loosened (nothing measured asks for it); a
    # change that moves 256x8192 past 4e-3 is a change in the kernel's accuracy to look at.
    ("fp8e4m3fn", "same_inputs"): dict(rel_l2=4e-3),
    # Against float64 attention on the unquantized bf16 KV: dominated by the fp8 KV
    # quantization itself. ../shared/anchors.md measured a bf16-q / fp8-KV kernel at
    # 1.5-3% on the H200; 4e-2 is that upper end plus margin for short sequences.
    ("fp8e4m3fn", "bf16_inputs"): dict(rel_l2=4e-2),
    # The small-integer case: every product, sum and the softmax weights (0 or 1) are
    # exact in f16/fp32 and the means are exact in bf16, so the output must match exactly.
    ("fp8e4m3fn", "exact"): dict(rel_l2=0.0),
    # bf16 KV (sm90a: the bf16 warpgroup kernel, mla_decode_sm90_wgmma_bf16.cuh; AMD: the wide
    # path, which takes mxfp4 too; the same rounding: bf16 operands, fp32
    # accumulators): q bf16 (exact), KV bf16 as stored or mxfp4
    # dequantized to bf16 (exact: an E2M1 value times a power of two), fp32 accumulation,
    # but P rounded to bf16 (2^-9 relative, ~1.1e-3 rel-L2 on the output: the rounding
    # errors of independent tokens add like noise) plus the bf16 output rounding (~1.1e-3):
    # ~1.6e-3 expected; 6e-3 leaves ~3.5x headroom and still catches any index error.
    ("bf16", "same_inputs"): dict(rel_l2=6e-3),
    # mxfp4 on sm90a runs the fp8 warpgroup kernel instead: the tile is e4m3
    # (exact for blocks within 14 binades of the token's largest), q and P split into e4m3
    # hi + lo (~8 significant bits, as bf16), so the same budget as the wide path applies;
    # measured 2-3e-3 like the fp8 warpgroup kernel's.
    # Per (token, head) row (tests/gpu/test_formats.py, the leaderboard check for mxfp4 KV,
    # which the a8w8 reference cannot judge per row: ROW_REL_L2_VS_A8W8): measured worst
    # 4.4e-3 (256x8192, bench/results/row_errors_gpu_d36b2c6.json); 1e-2 is 2.3x that.
    ("mxfp4", "same_inputs"): dict(rel_l2=6e-3, row_rel_l2=1e-2),
    # bf16 KV against float64 on the same bf16 inputs: only the kernel's own rounding.
    ("bf16", "bf16_inputs"): dict(rel_l2=6e-3),
    # mxfp4 KV against float64 on the unquantized bf16 KV: the E2M1 quantization dominates.
    # Measured with torch on CPU (float64 attention, mlagen.quant): 6.4e-2 (2x8192) to
    # 1.25e-1 (4x1024) rel-L2. 0.2 bounds it; the same-inputs check above is the tight one.
    ("mxfp4", "bf16_inputs"): dict(rel_l2=0.2),
    # fp8 q (per-tensor, the leaderboard reference's recipe) adds its own quantization when
    # compared with float64 on the bf16 q: measured (CPU, float64) 2.6e-2 with bf16 KV and
    # up to 4.0e-2 with fp8 KV; the same-inputs check uses the dequantized fp8 q and keeps
    # the tolerance of the KV format's path (the fp8 q decodes exactly to f16 / bf16).
    ("fp8q", "bf16_inputs"): dict(rel_l2=6e-2),
    # Small integers (bf16 KV) / E2M1 values (mxfp4 KV): P is 0 or 1 and the output a mean
    # of 8 values with at most 7 significant bits: exact in bf16.
    ("bf16", "exact"): dict(rel_l2=0.0),
    ("mxfp4", "exact"): dict(rel_l2=0.0),
}


# ---------------------------------------------------------------------------------------------
# The per-(token, head)-row bound of the leaderboard check (bench/leaderboard/task_inputs.py
# check_output: `ok` = the task's check AND every row within ROW_REL_L2 of the a8w8 reference).
# Why: the task's check (allclose .1/.1, <= 5% outside) passes an all-zero output at kv_len
# 8192 (~1.5% of the elements outside); a row's relative error is 1.0 there, and 0.25 for a
# head 25% off. Measured by bench/row_errors.py (removed with the probes; in git history): the worst over (token, head) rows of
# ||out - ref|| / ||ref|| against reference_a8w8, worst of 3 seeds a shape (the harness's
# benchmark seeds and the next two). emu_*: torch emulation of what the kernels compute
# (attention in float32 and in float64, identical to 3 digits, on bf16 q or the fp8 q and the
# dequantized fp8 KV, rounded to bf16), on the CPU (bench/results/row_errors_cpu.json) and on
# the H200 (other random draws); the rest: the library's kernels on the H200
# (bench/results/row_errors_gpu_d36b2c6.json), by KV format and q.
ROW_REL_L2_MEASURED = {
    (4, 1024): dict(emu_fp8kv_bf16q=4.35e-2, emu_fp8kv_fp8q=1.83e-3, fp8kv_bf16q=3.70e-2, fp8kv_fp8q=1.82e-3,
                    bf16kv_bf16q=4.86e-2, bf16kv_fp8q=4.44e-2, mxfp4kv_bf16q=1.74e-1, mxfp4kv_fp8q=1.70e-1),
    (4, 8192): dict(emu_fp8kv_bf16q=3.08e-2, emu_fp8kv_fp8q=1.80e-3, fp8kv_bf16q=3.09e-2, fp8kv_fp8q=1.93e-3,
                    bf16kv_bf16q=3.49e-2, bf16kv_fp8q=1.77e-2, mxfp4kv_bf16q=7.84e-2, mxfp4kv_fp8q=7.50e-2),
    (32, 1024): dict(emu_fp8kv_bf16q=4.51e-2, emu_fp8kv_fp8q=1.91e-3, fp8kv_bf16q=4.03e-2, fp8kv_fp8q=2.71e-3,
                     bf16kv_bf16q=6.28e-2, bf16kv_fp8q=4.37e-2, mxfp4kv_bf16q=1.91e-1, mxfp4kv_fp8q=1.89e-1),
    (32, 8192): dict(emu_fp8kv_bf16q=3.19e-2, emu_fp8kv_fp8q=1.91e-3, fp8kv_bf16q=3.15e-2, fp8kv_fp8q=2.19e-3,
                     bf16kv_bf16q=4.20e-2, bf16kv_fp8q=2.54e-2, mxfp4kv_bf16q=9.20e-2, mxfp4kv_fp8q=8.49e-2),
    (64, 1024): dict(emu_fp8kv_bf16q=4.66e-2, emu_fp8kv_fp8q=1.89e-3, fp8kv_bf16q=4.76e-2, fp8kv_fp8q=3.51e-3,
                     bf16kv_bf16q=6.66e-2, bf16kv_fp8q=4.61e-2, mxfp4kv_bf16q=2.48e-1, mxfp4kv_fp8q=2.59e-1),
    (64, 8192): dict(emu_fp8kv_bf16q=3.35e-2, emu_fp8kv_fp8q=1.89e-3, fp8kv_bf16q=3.40e-2, fp8kv_fp8q=2.45e-3,
                     bf16kv_bf16q=3.67e-2, bf16kv_fp8q=2.35e-2, mxfp4kv_bf16q=9.33e-2, mxfp4kv_fp8q=8.49e-2),
    (256, 1024): dict(emu_fp8kv_bf16q=4.89e-2, emu_fp8kv_fp8q=1.95e-3, fp8kv_bf16q=4.91e-2, fp8kv_fp8q=3.41e-3,
                      bf16kv_bf16q=8.28e-2, bf16kv_fp8q=6.10e-2, mxfp4kv_bf16q=2.49e-1, mxfp4kv_fp8q=2.48e-1),
    (256, 8192): dict(emu_fp8kv_bf16q=3.47e-2, emu_fp8kv_fp8q=1.94e-3, fp8kv_bf16q=3.48e-2, fp8kv_fp8q=4.20e-3,
                      bf16kv_bf16q=4.38e-2, bf16kv_fp8q=2.63e-2, mxfp4kv_bf16q=9.94e-2, mxfp4kv_fp8q=9.61e-2),
}
# fp8 KV (the format the H200 submission runs: mlagen "fastest"), bf16 or fp8 q: the worst
# is 4.91e-2 (256x1024, bf16 q: the reference quantizes q to fp8, the kernel keeps it bf16);
# 0.1 is 2x that, and 2.5x under the 0.25 of a head 25% off. task_inputs.ROW_REL_L2 holds
# the same number (tests/cpu/test_task_inputs.py checks it).
ROW_REL_L2 = 0.1
# The per-row bound against the a8w8 reference by KV format (tests/gpu/test_formats.py):
# bf16 KV measured 8.28e-2 (256x1024): 0.17 is 2x. mxfp4 KV is up to 2.6e-1 from the fp8
# reference in a row (64x1024): E2M1 quantization, not a kernel error, and no bound there
# would reject a head 25% off; so mxfp4 is held per row to float32 attention on its own
# dequantized values instead (("mxfp4", "same_inputs") row_rel_l2 above).
ROW_REL_L2_VS_A8W8 = {"fp8e4m3fn": ROW_REL_L2, "bf16": 0.17, "mxfp4": None}

# The LSE (natural log) of a row against float64, |lse - ref| <= lse_limit(fp8, ref). bf16 KV and
# bf16 operands: 2e-2. fp8 (and mxfp4-through-e4m3) KV: S comes from e4m3 tensor-core products
# whose sums keep fewer bits than fp32 (the DeepSeek-V3 report's ~14 bits; docs/perf.md measures
# ~0.2% of |S| toward zero), so the error grows with |LSE|: 2e-2 + 3e-3 |ref|. A flat 2e-2 failed
# a fresh seed at 128 heads (2.19e-2 at |LSE| ~11, tests/gpu/test_serving.py, aa5e226); a wrong
# scale, mask or merge moves the LSE by whole units. (test_split_merge.py keeps its flat 2e-2: no
# failure there asked for the |LSE| term.)
def lse_limit(fp8: bool, ref):
    return 2e-2 + 3e-3 * ref.abs() if fp8 else 2e-2
