"""Inputs made the task's way and torch references (float32 / float64) for MLA decode."""
import math

import torch

from bench.leaderboard import task_inputs as _ti  # the one fp8 recipe and the one attention reference

QK, DV, HEADS = 576, 512, 16
SM_SCALE = 1.0 / math.sqrt(QK)
FP8_MAX = 448.0


# The task's fp8 recipe (mlagen.quant.quantize_fp8, re-exported by task_inputs): scale = amax /
# 448 in the input's dtype (bf16), returned as (1,) float32; fp8 shaped like the input.
quantize_fp8 = _ti.quantize_fp8


def make_inputs(kv_lens, seed, device="cuda", uniform_config=True):
    """q (B,16,576) bf16, kv (sum kv_lens,1,576) bf16 + fp8, indptrs, the leaderboard config."""
    g = torch.Generator(device=device).manual_seed(seed)
    batch = len(kv_lens)
    q = torch.randn((batch, HEADS, QK), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    total = int(sum(kv_lens))
    kv = torch.randn((max(total, 1), 1, QK), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    kv = kv[:total]
    fp8, scale = quantize_fp8(kv) if total else (kv.to(torch.float8_e4m3fn), torch.ones(1, device=device))
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = torch.tensor(kv_lens, device=device).cumsum(0)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device)
    uniform = len(set(kv_lens)) == 1
    config = dict(batch_size=batch, num_heads=HEADS, num_kv_heads=1, qk_head_dim=QK, kv_lora_rank=512,
                  qk_rope_head_dim=64, v_head_dim=DV, q_seq_len=1, sm_scale=SM_SCALE)
    if uniform and uniform_config:  # non-uniform lengths: no kv_seq_len (the binding takes 0 = per-sequence)
        config["kv_seq_len"] = kv_lens[0]
    return dict(q=q, kv_bf16=kv, kv_fp8=fp8, kv_scale=scale, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
                config=config, kv_lens=list(kv_lens))


def attention(q, kv, kv_lens, dtype, sm_scale=SM_SCALE):
    """softmax(q K^T * sm_scale) V per sequence in `dtype`; q (B,16,576), kv (total,1,576) any
    float dtype. A zero-length sequence gives zeros (the kernels' convention).
    A wrapper of task_inputs.attention_reference (the one implementation)."""
    lens = [int(n) for n in kv_lens]
    kv_indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    qo_indptr = torch.arange(len(lens) + 1, dtype=torch.int64)
    kv2 = kv.reshape(-1, QK)
    return _ti.attention_reference(q, lambda a, b: kv2[a:b], qo_indptr, kv_indptr, sm_scale, v_dim=DV,
                                   dtype=dtype, empty=0.0)


def dequant_fp8(fp8, scale):
    return fp8.float() * scale.float()


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def exact_inputs(kv_lens, seed, grid="int"):
    """Small exact values: head h attends to exactly 8 tokens of each sequence (its score 0),
    every other token scores -64*big/24 (exp2 underflows to exactly 0), so the output is the
    mean of 8 V rows: exact in f16, bf16 and fp32 arithmetic.
    grid "int": V in -8..8, big 448 (fp8 / bf16 exact); grid "e2m1": V on the E2M1 values,
    big 384 = 6 * 2^6, so the mxfp4 quantizer represents every value exactly."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    inp = make_inputs(kv_lens, seed)
    batch, total = len(kv_lens), sum(kv_lens)
    if grid == "int":
        kv = torch.randint(-8, 9, (total, 1, QK), generator=g, device="cuda").float()
        big = 448.0
    else:
        vals = torch.tensor(E2M1_GRID, device="cuda")
        kv = vals[torch.randint(0, len(E2M1_GRID), (total, 1, QK), generator=g, device="cuda")]
        kv = kv * (torch.randint(0, 2, kv.shape, generator=g, device="cuda").float() * 2 - 1)
        big = 384.0
    kv[:, 0, 512:] = 0.0
    q = torch.zeros((batch, HEADS, QK), device="cuda")  # scores come from the rope dims only
    start = 0
    selected = []
    for b, n in enumerate(kv_lens):
        for h in range(HEADS):
            q[b, h, 512 + h] = 64.0
            kv[start:start + n, 0, 512 + h] = -big
            pick = torch.randperm(n, generator=g, device="cuda")[:8] + start
            kv[pick, 0, 512 + h] = 0.0
            selected.append((b, h, pick))
        start += n
    inp["q"] = q.to(torch.bfloat16)
    inp["kv_bf16"] = kv.to(torch.bfloat16)
    inp["kv_fp8"] = kv.to(torch.float8_e4m3fn)
    inp["kv_scale"] = torch.ones(1, device="cuda")
    expect = torch.empty((batch, HEADS, DV), device="cuda")
    for b, h, pick in selected:
        expect[b, h] = kv[pick, 0, :DV].mean(0)
    return inp, expect.to(torch.bfloat16)
