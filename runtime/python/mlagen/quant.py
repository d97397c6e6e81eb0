"""The leaderboard task's KV (and q) quantizers, pure torch, on CPU or CUDA tensors.

    from mlagen import quant            # not imported by `import mlagen`: it needs torch
    kv_data = quant.make_kv_formats(kv_bf16)          # {"bf16": kv, "fp8": (fp8, scale), "mxfp4": (data, scales)}

  quantize_fp8 / dequantize_fp8      per-tensor dynamic fp8 (e4m3fn, max 448; e4m3fnuz, max 240),
                                     the task's exact recipe (arithmetic in the input's dtype)
  quantize_q_fp8                     the same recipe for q (the check's "a8w8" reference does this)
  quantize_mxfp4 / dequantize_mxfp4  block-32 E2M1 + E8M0, the aiter dynamic_mxfp4_quant recipe
  make_kv_formats                    the task's kv_data dict from the bf16 KV

Formats (shared/leaderboard.md): fp8 = (tensor like the input, scale (1,) float32), dequantized
as fp8 * scale. mxfp4 = (data uint8 (..., D/2), scales uint8 (rows, D/32)): blocks of 32
consecutive values along the last dim share one E8M0 scale byte b (2^(b-127), 255 = NaN); two
E2M1 codes per byte, low nibble = even index; E2M1 magnitudes by code 0..7 are 0, .5, 1, 1.5,
2, 3, 4, 6 and bit 3 is the sign. For the KV (total_kv, 1, 576): data (total_kv, 1, 288),
scales (total_kv, 18).

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

A negative block (its first 8 values, then 24 times -.25):

    x      =  -.875  -.125  -.3125  -.625  -.0625  -.375  -.75  -.5   -.25 ...
    amax = .875 = 1.75 * 2^-1 rounds up to 1 = 2^0: e = 0 - 2 = -2, scale 2^-2, byte 125.
    x * 4  =  -3.5   -.5    -1.25   -2.5   -.25    -1.5   -3    -2    -1   ...
    value  =  -4     -.5    -1      -2     -0      -1.5   -3    -2    -1   ...  (ties: 3.5 -> 4,
    code   =  14     9      10      12     8       11     13    12    10   ...   1.25 -> 1, 2.5 -> 2, .25 -> 0)
    bytes  =  9e ca b8 cd, then aa x 12
    dequantized = value / 4 = -1 -.125 -.25 -.5 -0 -.375 -.75 -.5 -.25 ...

A block of zeros: amax = 0 has float32 bits 0; + 0x200000 and the mantissa dropped it is still
0, whose exponent field is 0, so e = 0 - 127 - 2 = -129, clamped to -127 (aiter: log2(0) =
-inf, clamped the same way): scale byte 0 (2^-127). Every code is 0 (or 8, "-0", for a -0.0
input: the sign bit is kept), and the block dequantizes to zeros. The clamp gives the same byte 0
to any block whose amax is below 1.75 * 2^-125.

tests/cpu/test_quant.py and tests/cpu/test_task_inputs.py check these blocks exactly.
"""
from __future__ import annotations

import math

import torch

__all__ = ["FP8_DTYPE", "MX_BLOCK", "E2M1_VALUES", "SCALE_PAD_ROWS", "SCALE_PAD_BLOCKS", "SCALE_PAD_VALUE",
           "quantize_fp8", "dequantize_fp8", "quantize_q_fp8", "quantize_mxfp4", "dequantize_mxfp4",
           "make_kv_formats", "dequantize", "DEQUANTIZE"]

FP8_DTYPE = torch.float8_e4m3fn  # OCP e4m3 (NVIDIA, MI355X); max 448. MI300X: torch.float8_e4m3fnuz, max 240
MX_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SCALE_PAD_ROWS, SCALE_PAD_BLOCKS = 256, 8  # padded scale tensors: rows to a multiple of 256, blocks of 8
SCALE_PAD_VALUE = 127  # the padding byte (2^0; never read by a correct reader)


# --------------------------------------------------------------------------- fp8

def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = FP8_DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor dynamic fp8 (sglang scaled_fp8_quant), as the task does it: the arithmetic
    runs in the input's dtype (bf16), so the scale is amax / fp8_max rounded to bf16:
    scale = max|x| / fp8_max, fp8 = clamp(x / scale, -fp8_max, fp8_max) cast to `dtype`
    (torch.float8_e4m3fn: max 448; torch.float8_e4m3fnuz: max 240).
    Returns (fp8 tensor shaped like x, scale (1,) float32); dequantize as fp8.float() * scale."""
    finfo = torch.finfo(dtype)
    amax = x.abs().amax().clamp(min=1e-12)
    scale = amax / finfo.max
    fp8 = (x / scale).clamp(min=finfo.min, max=finfo.max).to(dtype)
    return fp8, scale.to(torch.float32).reshape(1)


def dequantize_fp8(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 tensor, scale (1,) -> float32 data * scale."""
    return data.to(torch.float32) * scale.to(torch.float32)


def quantize_q_fp8(q: torch.Tensor, dtype: torch.dtype = FP8_DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
    """q (total_q, 16, 576) bf16 -> (fp8, scale (1,) float32), per tensor with the KV's recipe:
    what the check's reference (aiter "a8w8") does to q."""
    return quantize_fp8(q, dtype)


# --------------------------------------------------------------------------- mxfp4

def _e2m1_codes(qx: torch.Tensor) -> torch.Tensor:
    """float32 (already divided by the block scale) -> 4-bit E2M1 codes (uint8): the nearest
    of E2M1_VALUES, ties to the even code, saturating at 6; bit 3 = the sign bit of qx."""
    a = qx.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
            + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8) + (a >= 3.5).to(torch.uint8)
            + (a > 5.0).to(torch.uint8))
    return code | (torch.signbit(qx).to(torch.uint8) << 3)


def quantize_mxfp4(x: torch.Tensor, pad_scales: bool = False, *, pad_value: int = SCALE_PAD_VALUE,
                   chunk_rows: int = 1 << 16) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (aiter dynamic_mxfp4_quant): blocks of 32 consecutive values along the last dim.

    Per block: amax = max|x| (float32); round it up when its mantissa is >= 1.75 (bits +
    0x200000, mantissa dropped); e = floor(log2(rounded amax)) - 2 clamped to [-127, 127];
    scale byte = e + 127 (E8M0: 2^(b-127)); each x / 2^e goes to the nearest E2M1 magnitude
    (ties to even, saturating at 6) with its sign. Two codes per byte, low nibble = even index.

    x (..., N) with N % 32 == 0 -> (data uint8 (..., N/2), scales uint8 (rows, N/32)), rows =
    the product of the leading dims; the KV (total_kv, 1, 576) gives (total_kv, 1, 288) and
    (total_kv, 18). pad_scales=True returns the scale tensor padded as some aiter versions do:
    rows to a multiple of 256 and blocks to a multiple of 8 (18 -> 24 columns), the padding
    bytes = pad_value (127 = 2^0, unused; 255 = NaN makes a reader of the padding show up).
    The padded tensor is returned whole: callers slice [:rows, :N/32] or pass its row stride."""
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
        prow = -(-rows // SCALE_PAD_ROWS) * SCALE_PAD_ROWS
        pblk = -(-nb // SCALE_PAD_BLOCKS) * SCALE_PAD_BLOCKS
        padded = torch.full((prow, pblk), pad_value, dtype=torch.uint8, device=x.device)
        padded[:rows, :nb] = scales
        scales = padded
    return data, scales


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def as_task_dtypes(data: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mxfp4 pair typed as the task's inputs arrive (aiter's dtypes): data as
    torch.float4_e2m1fn_x2 and scales as torch.float8_e8m0fnu, where this torch has them
    (the bytes are the same; uint8 otherwise)."""
    f4, e8 = getattr(torch, "float4_e2m1fn_x2", None), getattr(torch, "float8_e8m0fnu", None)
    return (data.view(f4) if f4 is not None else data), (scales.view(e8) if e8 is not None else scales)


def dequantize_mxfp4(data: torch.Tensor, scales: torch.Tensor, dim: int | None = None, *,
                     chunk_rows: int = 1 << 16) -> torch.Tensor:
    """(data uint8 (..., dim/2), scales uint8 (>= rows, >= dim/32)) -> float32 (..., dim).
    dim (576 for the KV) defaults to 2 * data.shape[-1]; given, it must agree with it. A scale
    tensor with padding (more rows, or more columns than dim/32) is accepted; the padding is
    ignored. E8M0 byte 255 is NaN."""
    data, scales = _as_bytes(data), _as_bytes(scales)  # float4_e2m1fn_x2 / float8_e8m0fnu as the task sends them
    *lead, half = data.shape
    n, rows = 2 * half, math.prod(lead)
    if dim is not None and dim != n:
        raise ValueError(f"dequantize_mxfp4: data {tuple(data.shape)} holds {n} values per row, not dim={dim}")
    if n % MX_BLOCK:
        raise ValueError(f"dequantize_mxfp4: {n} values per row is not a multiple of {MX_BLOCK}")
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


# --------------------------------------------------------------------------- every format

# The callers' format name (kv_format; codegen/facts.py KV_FORMATS' binding) -> its kv_data entry,
# its first `rows` rows (None: all), dequantized to float32 (rows, 576): one line a format.
DEQUANTIZE = {
    "fp8": lambda e, rows: dequantize_fp8(e[0][:rows], e[1]),
    "bf16": lambda e, rows: (e[0] if isinstance(e, (tuple, list)) else e)[:rows].to(torch.float32),
    "mxfp4": lambda e, rows: dequantize_mxfp4(e[0][:rows], e[1][:rows]),
}


def dequantize(kv_format: str, entry, rows: int | None = None) -> torch.Tensor:
    """kv_data[kv_format] (or its first `rows` KV rows) as float32 (rows, 576): the values a kernel
    of that format reads (the reference's input, the bundle's fallback)."""
    if kv_format not in DEQUANTIZE:
        raise ValueError(f"dequantize: kv_format {kv_format!r}: expected one of {tuple(DEQUANTIZE)}")
    out = DEQUANTIZE[kv_format](entry, rows)
    return out.reshape(out.shape[0], -1)


# --------------------------------------------------------------------------- the task's kv_data

def make_kv_formats(kv_bf16: torch.Tensor, fp8_dtype: torch.dtype = FP8_DTYPE,
                    pad_scales: bool = False) -> dict:
    """The task's kv_data dict from the bf16 KV (total_kv, 1, 576):
    {"bf16": kv_bf16, "fp8": (fp8, scale (1,) float32), "mxfp4": (data uint8 (total_kv, 1, 288),
    scales uint8 (total_kv, 18), or padded with pad_scales)}.
    Like the task, the "bf16" entry is the tensor itself, not a (tensor, scale) pair."""
    return {"bf16": kv_bf16, "fp8": quantize_fp8(kv_bf16, fp8_dtype),
            "mxfp4": quantize_mxfp4(kv_bf16, pad_scales=pad_scales)}
