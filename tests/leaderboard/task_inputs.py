"""The leaderboard task's inputs and check (amd-mixed-mla), restated for NVIDIA: see
shared/leaderboard.md. Only torch is needed; every function runs on CPU or CUDA tensors.

  generate_input(batch, kv_len, seed)  the task's tuple (q, kv_data, qo_indptr, kv_indptr, config)
  quantize_fp8 / dequantize_fp8        per-tensor dynamic fp8 (e4m3fn), the task's exact recipe
  quantize_mxfp4 / dequantize_mxfp4    block-32 E2M1 + E8M0, the aiter dynamic_mxfp4_quant recipe
  reference_a8w8(data)                 the check's reference: fp8 q, fp8 KV, float32 attention
  check_output(data, output)           allclose(rtol=.1, atol=.1) with <= 5% of elements outside

MXFP4, worked by hand on one block of 32 values (the other 16 are zeros):

    x      =  0   .4   .5   1   1.5  2   2.5  3   3.5  4   5   6   7   -7   -1   -.4   0 ... 0
    amax = 7 = 1.75 * 2^2: float32 bits 0x40E00000. The quantizer adds 0x200000 (0.25 of the
    significand) and drops the 23 mantissa bits: 0x40E00000 + 0x200000 = 0x41000000 = 8.0, so
    amax rounds up to 8 (any significand >= 1.75 rounds up to the next power of two) and
    e = floor(log2 8) - 2 = 1: scale 2^1, E8M0 byte 127 + 1 = 128.
    (Without the round-up e would be 0 and 7 would saturate to 6.)
    x / 2  =  0   .2   .25  .5  .75  1   1.25 1.5 1.75 2   2.5 3   3.5 -3.5 -.5  -.2   0 ... 0
    nearest E2M1 magnitude {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to the even code:
    value  =  0   0    0    .5  1    1   1    1.5 2    2   2   3   4   -4   -.5  -0    0 ... 0
    code   =  0   0    0    1   2    2   2    3   4    4   4   5   6   14   9    8     0 ... 0
    (.25 -> 0, .75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4 are the ties; the sign is
    bit 3, kept even when the magnitude rounds to 0: -.2 -> code 8, "-0")
    bytes (low nibble = even index) = 00 10 22 32 44 54 e6 89 00 00 00 00 00 00 00 00
    dequantized = value * 2 = 0 0 0 1 2 2 2 3 4 4 4 6 8 -8 -1 -0 0 ... 0

tests/leaderboard/test_task_inputs.py checks exactly this block.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

NUM_HEADS = 16
NUM_KV_HEADS = 1
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
QK_HEAD_DIM = KV_LORA_RANK + QK_ROPE_HEAD_DIM  # 576
V_HEAD_DIM = KV_LORA_RANK  # 512
SM_SCALE = 1.0 / math.sqrt(QK_HEAD_DIM)
FP8_DTYPE = torch.float8_e4m3fn  # OCP e4m3 (NVIDIA, MI355X); max 448
MX_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

RTOL = ATOL = 0.1
MAX_MISMATCH = 0.05


# --------------------------------------------------------------------------- fp8

def quantize_fp8(tensor: torch.Tensor, dtype: torch.dtype = FP8_DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic fp8 (sglang scaled_fp8_quant), as the task does it: the arithmetic
    runs in the input's dtype (bf16), so the scale is amax/fp8_max rounded to bf16.
    Returns (fp8 tensor, scale (1,) float32); dequantize as fp8.float() * scale."""
    finfo = torch.finfo(dtype)
    amax = tensor.abs().amax().clamp(min=1e-12)
    scale = amax / finfo.max
    fp8 = (tensor / scale).clamp(min=finfo.min, max=finfo.max).to(dtype)
    return fp8, scale.to(torch.float32).reshape(1)


def dequantize_fp8(fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return fp8.to(torch.float32) * scale.to(torch.float32)


# --------------------------------------------------------------------------- mxfp4

def _e2m1_codes(qx: torch.Tensor) -> torch.Tensor:
    """float32 (already divided by the block scale) -> 4-bit E2M1 codes (uint8): the nearest
    of E2M1_VALUES, ties to the even code, saturating at 6; bit 3 = the sign bit of qx."""
    a = qx.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
            + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8) + (a >= 3.5).to(torch.uint8)
            + (a > 5.0).to(torch.uint8))
    return code | (torch.signbit(qx).to(torch.uint8) << 3)


def quantize_mxfp4(x: torch.Tensor, *, pad_scales: bool = False, pad_value: int = 255,
                   chunk_rows: int = 1 << 16) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (aiter dynamic_mxfp4_quant): blocks of 32 consecutive values along the last dim.

    Per block: amax = max|x| (float32); round it up when its mantissa is >= 1.75 (bits +
    0x200000, mantissa dropped); e = floor(log2(rounded amax)) - 2 clamped to [-127, 127];
    scale byte = e + 127 (E8M0: 2^(b-127)); each x / 2^e goes to the nearest E2M1 magnitude
    (ties to even, saturating at 6) with its sign. Two codes per byte, low nibble = even index.

    x (..., N) with N % 32 == 0 -> (data uint8 (..., N/2), scales uint8 (rows, N/32)), rows =
    the product of the leading dims. pad_scales: the scale tensor padded as some versions of the
    quantizer return it (rows to a multiple of 256, blocks to a multiple of 8), padding =
    pad_value (255 = NaN, so a reader of the padding shows up)."""
    *lead, n = x.shape
    if n % MX_BLOCK:
        raise ValueError(f"quantize_mxfp4: last dim {n} is not a multiple of {MX_BLOCK}")
    rows, nb = math.prod(lead), n // MX_BLOCK
    x2 = x.reshape(rows, n)
    data = torch.empty((rows, n // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((rows, nb), dtype=torch.uint8, device=x.device)
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        xb = x2[r0:r1].to(torch.float32).reshape(r1 - r0, nb, MX_BLOCK)
        bits = xb.abs().amax(dim=-1).contiguous().view(torch.int32)
        bits = (bits + 0x200000) & -0x800000  # & 0xFF800000: keep sign and exponent
        e = (((bits >> 23) & 0xFF) - 127 - 2).clamp(-127, 127)  # floor(log2(.)) of a power of 2
        scales[r0:r1] = (e + 127).to(torch.uint8)
        codes = _e2m1_codes(xb * torch.exp2(-e.to(torch.float32)).unsqueeze(-1)).reshape(r1 - r0, n)
        data[r0:r1] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    data = data.reshape(*lead, n // 2)
    if pad_scales:
        prow, pblk = -(-rows // 256) * 256, -(-nb // 8) * 8
        padded = torch.full((prow, pblk), pad_value, dtype=torch.uint8, device=x.device)
        padded[:rows, :nb] = scales
        scales = padded
    return data, scales


def dequantize_mxfp4(data: torch.Tensor, scales: torch.Tensor, *, chunk_rows: int = 1 << 16) -> torch.Tensor:
    """(data uint8 (..., N/2), scales uint8 (>= rows, >= N/32)) -> float32 (..., N).
    A scale tensor with padding (more rows, or a row stride above N/32) is accepted; the
    padding is ignored. E8M0 byte 255 is NaN."""
    *lead, half = data.shape
    n, rows = 2 * half, math.prod(lead)
    nb = n // MX_BLOCK
    if scales.dim() != 2 or scales.shape[0] < rows or scales.shape[1] < nb:
        raise ValueError(f"dequantize_mxfp4: scales {tuple(scales.shape)} for {rows} rows of {nb} blocks")
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=data.device)
    d2 = data.reshape(rows, half)
    out = torch.empty((rows, n), dtype=torch.float32, device=data.device)
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        b = d2[r0:r1]
        codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(r1 - r0, n).long()
        vals = table[codes & 7]
        vals = torch.where((codes & 8) != 0, -vals, vals)
        s = scales[r0:r1, :nb].to(torch.float32)
        s = torch.where(s == 255, torch.full_like(s, float("nan")), torch.exp2(s - 127))
        out[r0:r1] = (vals.reshape(r1 - r0, nb, MX_BLOCK) * s.unsqueeze(-1)).reshape(r1 - r0, n)
    return out.reshape(*lead, n)


# --------------------------------------------------------------------------- inputs

def generate_input(batchsize: int, kvseqlen: int, seed: int, qseqlen: int = 1, *, device="cuda",
                   num_heads: int = NUM_HEADS, mxfp4: bool = True):
    """The task's tuple (q, kv_data, qo_indptr, kv_indptr, config), drawn like the task does:
    one generator seeded with `seed` on `device`, q then the bf16 KV (standard normal), then
    fp8 and mxfp4 made from the bf16 KV. mxfp4=False leaves the "mxfp4" entry out (faster)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    total_q, total_kv = batchsize * qseqlen, batchsize * kvseqlen
    q = torch.randn((total_q, num_heads, QK_HEAD_DIM), dtype=torch.bfloat16, device=device, generator=gen)
    kv = torch.randn((total_kv, NUM_KV_HEADS, QK_HEAD_DIM), dtype=torch.bfloat16, device=device, generator=gen)
    kv_data = {"bf16": kv, "fp8": quantize_fp8(kv)}
    if mxfp4:
        kv_data["mxfp4"] = quantize_mxfp4(kv)
    qo_indptr = torch.arange(0, batchsize + 1, dtype=torch.int32, device=device) * qseqlen
    kv_indptr = torch.arange(0, batchsize + 1, dtype=torch.int32, device=device) * kvseqlen
    config = {"batch_size": batchsize, "num_heads": num_heads, "num_kv_heads": NUM_KV_HEADS,
              "qk_head_dim": QK_HEAD_DIM, "kv_lora_rank": KV_LORA_RANK, "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
              "v_head_dim": V_HEAD_DIM, "q_seq_len": qseqlen, "kv_seq_len": kvseqlen, "sm_scale": SM_SCALE}
    return q, kv_data, qo_indptr, kv_indptr, config


def clone_data(data):
    """Recursive clone of every tensor (the leaderboard hands the kernel a copy / checks a copy)."""
    if isinstance(data, tuple):
        return tuple(clone_data(x) for x in data)
    if isinstance(data, list):
        return [clone_data(x) for x in data]
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    if isinstance(data, torch.Tensor):
        return data.clone()
    return data


# --------------------------------------------------------------------------- reference

def attention_reference(q32: torch.Tensor, kv_rows, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                        sm_scale: float, *, v_dim: int = V_HEAD_DIM, chunk_bytes: int = 1 << 30) -> torch.Tensor:
    """float32 MLA decode: softmax(q K^T * sm_scale) V, K = the 576-dim rows, V their first
    v_dim. q32 (total_q, H, 576) float32; kv_rows(a, b) -> float32 (b - a, 576) dequantized rows.
    With q_len > 1 per sequence, query t of L_q sees the first L - L_q + t + 1 rows (causal
    decode). Sequences of equal lengths are batched, at most ~chunk_bytes of K at a time."""
    qo = [int(v) for v in qo_indptr.tolist()]
    kvp = [int(v) for v in kv_indptr.tolist()]
    total_q, heads, dim = q32.shape
    out = torch.empty((total_q, heads, v_dim), dtype=torch.float32, device=q32.device)
    batch = len(qo) - 1
    b = 0
    while b < batch:
        lq, lk = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        per_seq = max(1, lk * dim * 4)
        e = b + 1
        while (e < batch and qo[e + 1] - qo[e] == lq and kvp[e + 1] - kvp[e] == lk and kvp[e] == kvp[b] + (e - b) * lk
               and qo[e] == qo[b] + (e - b) * lq and (e - b + 1) * per_seq <= chunk_bytes):
            e += 1
        nb = e - b
        if lq > 0:
            qs = q32[qo[b]:qo[e]].reshape(nb, lq * heads, dim)
            if lk == 0:
                out[qo[b]:qo[e]] = float("nan")
            else:
                k = kv_rows(kvp[b], kvp[e]).reshape(nb, lk, dim)
                s = torch.bmm(qs, k.transpose(1, 2)) * sm_scale  # (nb, lq*H, lk)
                if lq > 1:
                    t = torch.arange(lq, device=q32.device).repeat_interleave(heads)  # row -> query index
                    j = torch.arange(lk, device=q32.device)
                    s = s.masked_fill(j[None, None, :] > (lk - lq + t)[None, :, None], float("-inf"))
                p = torch.softmax(s, dim=-1)
                out[qo[b]:qo[e]] = torch.bmm(p, k[:, :, :v_dim]).reshape(nb * lq, heads, v_dim)
        b = e
    return out


def reference_a8w8(data) -> torch.Tensor:
    """The check's reference ("a8w8", aiter's fp8 Q + fp8 KV): q quantized to fp8 per tensor
    with the KV's recipe, the task's fp8 KV, both dequantized, attention in float32.
    Returns (total_q, H, 512) float32."""
    q, kv_data, qo_indptr, kv_indptr, config = data
    q8, q_scale = quantize_fp8(q)
    kv8, kv_scale = kv_data["fp8"]
    kv8 = kv8.reshape(kv8.shape[0], -1)
    q32 = dequantize_fp8(q8, q_scale)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return attention_reference(q32, lambda a, b: dequantize_fp8(kv8[a:b], kv_scale), qo_indptr, kv_indptr,
                                   float(config.get("sm_scale", SM_SCALE)), v_dim=int(config.get("v_head_dim",
                                                                                               V_HEAD_DIM)))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


# --------------------------------------------------------------------------- check

@dataclass
class CheckResult:
    ok: bool               # the task's check: shape (and dtype) right, <= 5% outside allclose(.1, .1)
    mismatch: float        # fraction of elements outside rtol/atol (non-finite ones count)
    rel_l2: float          # ||out - ref|| / ||ref||
    max_abs: float         # max |out - ref| over finite elements
    message: str

    def as_dict(self) -> dict:
        return asdict(self)


def check_output(data, output, *, rtol: float = RTOL, atol: float = ATOL, max_mismatch: float = MAX_MISMATCH,
                 reference=None) -> CheckResult:
    """The task's check against the a8w8 reference: output passes when at most max_mismatch of
    its elements fall outside |out - ref| <= atol + rtol * |ref| (NaN/inf are outside). Also
    requires a bf16 (total_q, H, 512) tensor. Note the tolerance is loose against outputs of
    magnitude ~0.05: look at rel_l2 too."""
    q, _, _, _, config = data
    want = (q.shape[0], q.shape[1], int(config.get("v_head_dim", V_HEAD_DIM)))
    if not isinstance(output, torch.Tensor):
        return CheckResult(False, 1.0, float("inf"), float("inf"), f"output is {type(output).__name__}, not a tensor")
    if tuple(output.shape) != want:
        return CheckResult(False, 1.0, float("inf"), float("inf"),
                           f"output shape {tuple(output.shape)}, expected {want}")
    if output.dtype != torch.bfloat16:
        return CheckResult(False, 1.0, float("inf"), float("inf"), f"output dtype {output.dtype}, expected bf16")
    ref = (reference or reference_a8w8)(data).to(torch.float32)
    out = output.detach().to(torch.float32)
    if out.device != ref.device:
        out = out.to(ref.device)
    diff = (out - ref).abs()
    close = diff <= atol + rtol * ref.abs()  # False for NaN / inf
    mismatch = 1.0 - close.to(torch.float64).mean().item()
    finite = torch.isfinite(out)
    max_abs = diff[finite].max().item() if bool(finite.any()) else float("inf")
    ref64 = ref.to(torch.float64)
    rel_l2 = ((out.to(torch.float64) - ref64).norm() / ref64.norm().clamp(min=1e-30)).item()
    if not math.isfinite(rel_l2):
        rel_l2 = float("inf")
    ok = mismatch <= max_mismatch
    msg = (f"mismatch {mismatch:.4%} (limit {max_mismatch:.0%}, rtol {rtol}, atol {atol}), rel_l2 {rel_l2:.3e}, "
           f"max|diff| {max_abs:.3e}, non-finite {int((~finite).sum())}")
    return CheckResult(ok, mismatch, rel_l2, max_abs, msg)
