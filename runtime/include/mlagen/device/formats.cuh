// KV and query formats: what a format's bytes look like, vendor-neutral. The vendor
// kernels pick their compute path from the KV format:
//   fp8 (e4m3fn / e4m3fnuz) : the 8-bit path; fp8 bytes decoded to f16 in registers,
//                             per-tensor scale applied to S and O in fp32.
//   bf16                    : the wide path; KV rows land in shared memory as they are and
//                             feed bf16 MMAs directly.
//   mxfp4                   : the wide path; packed E2M1 rows + their E8M0 scales land in
//                             shared memory, one pass per tile dequantizes them into a
//                             bf16 tile there (exact: every E2M1 value times a power of two
//                             is a bf16), and the bf16 MMAs read that tile. Never a
//                             dequantized copy in global memory.
// Query: bf16 (as given) or fp8 (the arch's flavour) with a per-tensor float32 scale.
#pragma once
#include "mlagen/device/mla_common.cuh"

namespace mlagen::device {

enum class KvFormat { kFp8, kBf16, kMxfp4 };
enum class QFormat { kBf16, kFp8 };

constexpr int kMxBlock = 32;                      // values per E8M0 scale
constexpr int kMxBlocks = kQkDim / kMxBlock;      // 18 scales a token
constexpr int kMxRowBytes = kQkDim / 2;           // 288 packed bytes a token
constexpr int kMxMaxScaleStride = 32;             // scale row stride the kernels accept (18..32)

template <KvFormat F>
struct KvTraits;
template <>
struct KvTraits<KvFormat::kFp8> {
  static constexpr bool kWide = false;
  static constexpr int kElemBytes = 1;
  static constexpr int kRowDataBytes = kQkDim;  // 576
};
template <>
struct KvTraits<KvFormat::kBf16> {
  static constexpr bool kWide = true;
  static constexpr int kElemBytes = 2;
  static constexpr int kRowDataBytes = 2 * kQkDim;  // 1152
};
template <>
struct KvTraits<KvFormat::kMxfp4> {
  static constexpr bool kWide = true;
  static constexpr int kElemBytes = 1;  // one packed byte holds two values
  static constexpr int kRowDataBytes = kMxRowBytes;  // 288
};

// E8M0 byte b -> 2^(b-127); b = 255 is NaN, b = 0 is 2^-127 (an fp32 subnormal).
MLAGEN_DEVICE float e8m0_to_float(uint32_t b) {
  return b == 255u ? __int_as_float(0x7fc00000) : (b == 0u ? __uint_as_float(0x00400000u) : __uint_as_float(b << 23));
}

// E2M1 nibble s.EE.M -> fp32, exact. Placed as fp32 bits s<<31 | EEM<<22 the nibble reads
// as its value times 2^-126 (EE = 0 lands in the subnormals, 0.5 -> 2^-127, which is the
// same factor), so one multiply by 2^126 gives the value.
MLAGEN_DEVICE float e2m1_to_float(uint32_t nib) {
  return __uint_as_float(((nib & 7u) << 22) | ((nib & 8u) << 28)) * 0x1p126f;
}

// Two exactly-representable fp32 values -> bf16x2 (lo in the low half). Truncation is exact
// here: every dequantized mxfp4 value has at most two significant bits.
MLAGEN_DEVICE uint32_t pack_bf16x2_exact(float lo, float hi) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

// 8 packed E2M1 values (4 bytes, low nibble = even index) times `scale` -> 4 bf16x2 words.
MLAGEN_DEVICE void mxfp4x8_to_bf16(uint32_t w, float scale, uint32_t (&out)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t byte = w >> (8 * k);
    out[k] = pack_bf16x2_exact(e2m1_to_float(byte) * scale, e2m1_to_float(byte >> 4) * scale);
  }
}

// Shared-memory layout of one mxfp4 stage: kBlockN packed rows of 288 bytes, then a window
// of the scale tensor holding the tile's scale rows. The window starts at the 16-byte
// boundary at or below the tile's first scale byte (the scale tensor's base is 16-byte
// aligned), so it is filled with aligned 16-byte copies whatever the row stride.
template <int kBlockN>
struct MxStage {
  static constexpr int kDataBytes = kBlockN * kMxRowBytes;
  static constexpr int kScaleWindowBytes = kBlockN * kMxMaxScaleStride + 16;
  static constexpr int kScaleChunks = kScaleWindowBytes / 16;
  static constexpr int kBytes = kDataBytes + kScaleWindowBytes;
  static_assert(kDataBytes % 16 == 0, "scale window must start 16-byte aligned");
};

// Byte offset (from the scale tensor's base) of the tile's first scale byte, and of the
// 16-byte window start below it.
struct MxScaleWindow {
  int64_t first;  // (first KV row of the tile) * stride
  int64_t start;  // first & ~15
  int64_t end;    // one past the last valid scale byte of the tile
};
MLAGEN_DEVICE MxScaleWindow mx_scale_window(int64_t row0, int valid_rows, int64_t stride) {
  const int64_t first = row0 * stride;
  return MxScaleWindow{first, first & ~int64_t{15}, first + (valid_rows > 0 ? (valid_rows - 1) * stride + kMxBlocks : 0)};
}

// Dequantizes one mxfp4 stage (rows [0, kBlockN)) into a bf16 tile of row pitch
// `out_pitch` bytes. Rows at or past `valid` become zeros (whatever their scale bytes),
// so masked tokens never feed a NaN into P*V. Block-cooperative: thread `tid` of
// kThreads converts 16-byte chunks (one 32-value scale block each).
template <int kBlockN, int kThreads>
MLAGEN_DEVICE void mxfp4_stage_to_bf16(const uint8_t* stage, int scale_off, int64_t scale_stride, int valid,
                                       uint8_t* out, int out_pitch, int tid) {
  const uint8_t* scales = stage + MxStage<kBlockN>::kDataBytes + scale_off;
  for (int c = tid; c < kBlockN * kMxBlocks; c += kThreads) {
    const int row = c / kMxBlocks, blk = c % kMxBlocks;
    const uint4 w = *reinterpret_cast<const uint4*>(stage + row * kMxRowBytes + blk * 16);
    const float sc = row < valid ? e8m0_to_float(scales[row * scale_stride + blk]) : 0.f;
    uint32_t o[16];
    mxfp4x8_to_bf16(w.x, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 0));
    mxfp4x8_to_bf16(w.y, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 4));
    mxfp4x8_to_bf16(w.z, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 8));
    mxfp4x8_to_bf16(w.w, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 12));
    uint4* dst = reinterpret_cast<uint4*>(out + row * out_pitch + blk * 64);
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
  }
}

// Four consecutive query dims as fp32. bf16: exact. fp8: the arch's flavour, exact (the
// per-tensor scale is folded into S, see q_scale_of).
template <QFormat QF>
MLAGEN_DEVICE float4 load_q4(const Params& p, int64_t q_row, int head, int dim) {
  const int64_t at = q_row * p.q_stride_token + head * p.q_stride_head + dim;
  if constexpr (QF == QFormat::kFp8) {
    return fp8x4_to_float4(*reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.q) + at));
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.q) + at);
    return make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
  }
}

// The query scale the kernels fold into S: 1 for bf16 q, the per-tensor scale for fp8 q.
template <QFormat QF>
MLAGEN_DEVICE float q_scale_of(const Params& p) {
  return QF == QFormat::kFp8 ? *p.q_scale : 1.f;
}
// The per-tensor KV scale folded into S and O: fp8 only (mxfp4 scales are applied while
// dequantizing, bf16 has none: null pointer). mla_combine_kernel reads it the same way.
MLAGEN_DEVICE float kv_scale_of(const Params& p) { return p.kv_scale ? *p.kv_scale : 1.f; }

}  // namespace mlagen::device
