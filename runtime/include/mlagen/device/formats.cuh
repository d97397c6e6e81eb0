// KV and query formats: what a format's bytes look like, vendor-neutral. The vendor
// kernels pick their compute path from the KV format:
//   fp8 (e4m3fn / e4m3fnuz) : the 8-bit path; sm90a: e4m3 wgmmas on the tile as stored; AMD:
//                             fp8 bytes decoded to f16 in registers (gfx950: native fp8
//                             MFMAs); the per-tensor scale applied to S and O in fp32.
//   bf16                    : the wide path; KV rows land in shared memory as they are and
//                             feed bf16 MMAs directly.
//   mxfp4                   : sm90a: the warpgroup kernel, which expands the packed tile to
//                             e4m3 in shared memory relative to a power of two per token
//                             (mla_decode_sm90_wgmma.cuh). AMD: the wide path; packed E2M1
//                             rows + their E8M0 scales land in shared memory, one pass per
//                             tile dequantizes them into a bf16 tile there (exact: every E2M1
//                             value times a power of two is a bf16), and the bf16 MMAs read
//                             that tile. Never a dequantized copy in global memory.
// Query: bf16 (as given) or fp8 (the arch's flavour) with a per-tensor float32 scale.
#pragma once
#include "mlagen/device/mla_common.cuh"
#include "mlagen/device/kv_rows.cuh"

namespace mlagen::device {

enum class KvFormat { kFp8, kBf16, kMxfp4 };
// The query as a kernel reads it: bf16; fp8 given quantized (with q_scale); or a bf16 q
// that the kernel quantizes to fp8 (the pre-pass maxima). The generator and the registry
// know kBf16 / kFp8; an fp8-q launch picks the kFp8FromBf16 instantiation of the same
// kernel when the library quantizes (the `_q8` entry), so neither route carries the other's code.
enum class QFormat { kBf16, kFp8, kFp8FromBf16 };

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

// A format the sm90a rows body reads through registers and expands into its bf16 tile
// (mla_decode_sm90_rows.cuh, RowsKv's primary template): `Block` loads one block of a token's
// dims and expands it (below, beside the format's other steps). Defined for such formats only.
template <KvFormat F>
struct KvRowsExpand;

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

#if defined(MLAGEN_NVIDIA)
// Issues the copies of a tile's scale window (kThreads threads, thread `tid`): the scale
// rows of KV rows row0 .. row0 + valid_rows - 1 land at `dst` (shared address; `dst_ptr` is
// the same bytes as a pointer) with the window's first byte at the 16-byte boundary at or
// below row0's first scale byte. The scale rows end at the last token's 18th scale byte: a
// 16-byte read that would cross it (only in the tile holding the last KV row) goes byte by
// byte (memcheck caught a 16-byte read past a 173,772-byte scale tensor).
template <int kBlockN, int kThreads>
MLAGEN_DEVICE void mx_issue_scale_window(const uint8_t* scales, int64_t stride, int64_t total_kv, int64_t row0,
                                         int valid_rows, uint32_t dst, uint8_t* dst_ptr, int tid) {
  const MxScaleWindow win = mx_scale_window(row0, valid_rows, stride);
  const int64_t rows_end = (total_kv - 1) * stride + kMxBlocks;
  for (int c = tid; c < MxStage<kBlockN>::kScaleChunks; c += kThreads) {
    const int64_t at = win.start + 16 * c;
    const int64_t left = win.end - at;
    const int bytes = left <= 0 ? 0 : (left >= 16 ? 16 : static_cast<int>(left));
    if (bytes == 0 || at + 16 <= rows_end) {
      sm90::cp_async_16_partial(dst + 16 * c, scales + (bytes > 0 ? at : 0), bytes);
    } else {
      for (int k = 0; k < 16; ++k) dst_ptr[16 * c + k] = k < bytes ? scales[at + k] : uint8_t{0};
    }
  }
}
#endif

// Paged KV whose pages are shorter than a tile: the tile's scale rows are not one run, so each
// row's 18 scale bytes are copied on their own (plain loads and shared stores, thread `tid` of
// kThreads), to window offset row * stride as the window would hold them (offset 0).
template <int kBlockN, int kThreads, class Rows>
MLAGEN_DEVICE void mx_issue_scale_rows(const uint8_t* scales, int64_t stride, const Rows& rows, int tok0, int valid_rows,
                                       uint8_t* dst_ptr, int tid, bool& bad) {
  for (int c = tid; c < valid_rows * kMxBlocks; c += kThreads) {
    const int r = c / kMxBlocks, k = c % kMxBlocks;
    dst_ptr[r * stride + k] = scales[rows.row(tok0 + r, bad) * stride + k];
  }
}

// Where a tile's scale rows start in its stage's window: the tile's first scale byte modulo 16
// when the tile is one run of rows (mx_issue_scale_window), 0 otherwise (mx_issue_scale_rows).
template <int kBlockN, class Rows>
MLAGEN_DEVICE int mx_scale_offset(const Rows& rows, int tok0, int64_t stride, bool& bad) {
  if (!rows.template tile_contiguous<kBlockN>()) return 0;
  return static_cast<int>((rows.row(tok0, bad) * stride) & 15);
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
    const uint32_t b = row < valid ? scales[row * scale_stride + blk] : 0u;
    uint32_t o[16];
    const float sc = row < valid ? e8m0_to_float(b) : 0.f;
    mxfp4x8_to_bf16(w.x, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 0));
    mxfp4x8_to_bf16(w.y, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 4));
    mxfp4x8_to_bf16(w.z, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 8));
    mxfp4x8_to_bf16(w.w, sc, *reinterpret_cast<uint32_t(*)[4]>(o + 12));
    uint4* dst = reinterpret_cast<uint4*>(out + row * out_pitch + blk * 64);
#pragma unroll
    for (int k = 0; k < 4; ++k) dst[k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
  }
}

#if defined(MLAGEN_NVIDIA)
// One scale block of a token as the sm90a rows body reads mxfp4 (its expanded policy,
// mla_decode_sm90_rows.cuh): the block's 16 packed bytes and its E8M0 byte, loaded from global
// memory into registers a tile ahead, then expanded to 32 bf16 values straight into the bf16 tile
// through the block's tables (sm90::e2m1x8_to_bf16), exact: the tables hold what
// mxfp4x8_to_bf16 computes (every E2M1 value times a power of two is a bf16; 255 is NaN). A row
// past the end loads nothing and expands to zeros, so a masked token never feeds a NaN into P*V.
struct MxBf16Block {
  static constexpr int kDims = kMxBlock;     // dims a block (64 bytes of bf16)
  static constexpr int kBlocks = kMxBlocks;  // blocks a token
  static constexpr int kTableBytes = 256 * 16;  // the tables, one entry a scale byte (build_tables)
  static constexpr uint32_t kDead = 0x100u;  // `scale` of a row past the end (not a byte)
  uint4 packed;
  uint32_t scale;  // the E8M0 byte, or kDead
  // The tables of every scale byte s in shared memory at `base`, threads tid of n: entry s (16
  // bytes) = the high bytes of the bf16 of the 8 E2M1 magnitudes x 2^(s - 127), codes 0..3 then
  // 4..7, then their low bytes.
  MLAGEN_DEVICE static void build_tables(uint32_t base, int tid, int n) {
    for (int b = tid; b < 256; b += n) {
      const float sc = e8m0_to_float(static_cast<uint32_t>(b));
      uint32_t hi[2] = {0u, 0u}, lo[2] = {0u, 0u};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t e = __float_as_uint(e2m1_to_float(static_cast<uint32_t>(i)) * sc) >> 16;
        hi[i / 4] |= (e >> 8) << (8 * (i % 4));
        lo[i / 4] |= (e & 0xffu) << (8 * (i % 4));
      }
      sm90::sts128(base + 16 * b, make_uint4(hi[0], hi[1], lo[0], lo[1]));
    }
  }
  template <class Rows>
  MLAGEN_DEVICE void load(const Params& p, const Rows& rows, int t, bool live, int blk, bool& bad) {
    scale = kDead;
    packed = make_uint4(0u, 0u, 0u, 0u);
    if (!live) return;
    const int64_t row = rows.row(t, bad);
    packed = reinterpret_cast<const uint4*>(p.kv + row * p.kv_stride_bytes)[blk];
    scale = p.kv_scales[row * p.kv_scales_stride + blk];
  }
  // this block's tables (zeros for a row past the end)
  MLAGEN_DEVICE uint4 table(uint32_t tables) const {
    return scale == kDead ? make_uint4(0u, 0u, 0u, 0u) : sm90::lds128(tables + 16 * scale);
  }
  // dims 8 k .. 8 k + 7 of the block (k < 4) as 4 bf16x2 words
  MLAGEN_DEVICE void expand8(int k, uint4 tab, uint32_t (&o)[4]) const {
    const uint32_t w = k == 0 ? packed.x : k == 1 ? packed.y : k == 2 ? packed.z : packed.w;
    sm90::e2m1x8_to_bf16(w, tab, o);
  }
};
template <>
struct KvRowsExpand<KvFormat::kMxfp4> {
  using Block = MxBf16Block;
};
#endif

// ---- the query ----------------------------------------------------------------------------
// bf16 q is used as given. fp8 q is the arch's flavour with a per-tensor scale, either given
// (q_scale) or found here from the bf16 q, exactly as the leaderboard's reference quantizes
// (quant.quantize_fp8: arithmetic in bf16): amax = max|q| over the whole tensor (a tiny
// pre-pass, q_amax_kernel, writes per-block maxima; the decode grid reduces them),
// scale = bf16(amax / fp8_max), q8 = fp8(clamp(bf16(q / scale), +-fp8_max)). The decode then
// computes with q8 (exact in f16 / bf16) and folds the scale into S.
#if defined(__gfx942__)
constexpr float kFp8Max = 240.f;  // e4m3fnuz
constexpr int kFp8MinExp = -7;
#else
constexpr float kFp8Max = 448.f;  // e4m3fn (NVIDIA, gfx950)
constexpr int kFp8MinExp = -6;
#endif
// kQAmaxParts / kQAmaxOffset: the pre-pass maxima in the workspace (kernel_abi.h, the host sizes them)

// The largest of two magnitudes (>= 0) that keeps a NaN: on the bits of non-negative floats
// the integer order is the float order, and every NaN lies above +Inf. (fmaxf would drop it,
// and a NaN in q must make the per-tensor scale NaN, as the reference's amax does.)
MLAGEN_DEVICE float nan_max(float a, float b) { return __uint_as_float(max(__float_as_uint(a), __float_as_uint(b))); }

MLAGEN_DEVICE float round_bf16(float x) { return bf16_lo(pack_bf16x2(x, 0.f)); }
MLAGEN_DEVICE float pow2i(int k) { return __uint_as_float(static_cast<uint32_t>(k + 127) << 23); }  // k in [-126, 127]
// Round-to-nearest-even onto the arch's e4m3 grid (3 mantissa bits, subnormals below
// 2^kFp8MinExp); |x| <= kFp8Max.
MLAGEN_DEVICE float round_fp8(float x) {
  const uint32_t sign = __float_as_uint(x) & 0x80000000u;
  const float ax = __uint_as_float(__float_as_uint(x) ^ sign);
  int e = static_cast<int>((__float_as_uint(ax) >> 23) & 0xffu) - 127;
  e = e < kFp8MinExp ? kFp8MinExp : e;
  const float step = pow2i(e - 3), inv_step = pow2i(3 - e);  // powers of two: exact scaling
#if defined(MLAGEN_NVIDIA)
  const float r = rintf(ax * inv_step) * step;  // rintf: round half to even
#else
  const float r = __builtin_rintf(ax * inv_step) * step;
#endif
  return __uint_as_float(__float_as_uint(r) | sign);
}

struct QQuant {
  float scale;    // what S is multiplied by (1 for bf16 q)
  bool quantize;  // fp8 q found here from bf16 q
  float inv;      // 1 / scale (rounded), when quantizing
};

// bf16(x / scale) exactly as a correctly rounded division followed by bf16 rounding, at the
// cost of a multiply: x * inv is within ~1.5 fp32 ulp of the quotient, which moves its bf16
// rounding only when it lies within a few ulp of a bf16 midpoint; those few take the division.
MLAGEN_DEVICE float div_round_bf16(float x, float scale, float inv) {
  float y = x * inv;
  if (((__float_as_uint(y) & 0xffffu) - 0x7ffcu) <= 8u) y = x / scale;
  return round_bf16(y);
}

// The scale of an fp8 q given quantized, read by a kernel at its start next to the KV scale
// (its round trip then overlaps the q loads instead of following them: the SASS issues its load
// before the KV prologue); 1 for any other q.
template <QFormat QF>
MLAGEN_DEVICE float given_q_scale(const Params& p) {
  if constexpr (QF == QFormat::kFp8) return *p.q_scale;
  return 1.f;
}

// ---- A block's setup: every body's prologue, written once ---------------------------------
// Where the block sits (sequence, split, its kRows query rows), the split's range of whole
// kBlockN-token tiles, the sequence's KV rows (contiguous or pages: kv_rows.cuh), and a given fp8
// q's scale (read early: its round trip overlaps the q loads). On NVIDIA the block also lets a
// dependent grid (the split combine) start now: that grid waits on the device for our results.
template <class Shape, int kRows = kGroupRows>
struct BlockSetup {
  BlockCoord bc;
  int splits;
  Sequence seq;
  QueryRows qr;
  float q_given;
  SplitRange range;
  KvRows<Shape::kPage> rows;
};
template <class T, class Shape, int kBlockN, int kRows = kGroupRows>
MLAGEN_DEVICE BlockSetup<Shape, kRows> block_setup(const Params& p) {
  const BlockCoord bc = block_coord<Shape, kRows>(p);
  allow_dependent_launch();
  const int splits = Shape::splits(p);
  const Sequence seq = Shape::sequence(p, bc.b);
  const QueryRows qr = query_rows<Shape, kRows>(p, bc, seq);
  const float q_given = given_q_scale<T::kQ>(p);
  const SplitRange range = split_range(seq.len, bc.split, splits, kBlockN);
  return BlockSetup<Shape, kRows>{bc, splits, seq, qr, q_given, range, KvRows<Shape::kPage>::of(p, seq)};
}

// Once per block, before the first load_q4. When quantizing, waits for the pre-pass grid
// (programmatic dependent launch on NVIDIA: the KV prologue was issued before this).
template <QFormat QF>
MLAGEN_DEVICE QQuant q_setup(const Params& p, float q_given) {
  if constexpr (QF == QFormat::kBf16) {
    return QQuant{1.f, false, 1.f};
  } else if constexpr (QF == QFormat::kFp8) {
    return QQuant{q_given, false, 1.f};  // given_q_scale<QF>(p)
  } else {
    wait_for_prior_grid();
    // every warp reduces the pre-pass maxima itself (a few loads a lane, then shuffles)
    const int lane = threadIdx.x % MLAGEN_WARP_SIZE;
    float amax = 0.f;
    for (int i = lane; i < p.q_amax_parts; i += MLAGEN_WARP_SIZE) amax = nan_max(amax, p.q_amax[i]);
    for (int o = MLAGEN_WARP_SIZE / 2; o > 0; o /= 2) amax = nan_max(amax, __shfl_xor(amax, o));
    // a NaN in q makes the scale NaN and so every output NaN, as the reference's recipe does
    const float scale = round_bf16(round_bf16(nan_max(amax, 1e-12f)) / kFp8Max);
    return QQuant{scale, true, 1.f / scale};
  }
}

// The stored words of q values dim .. dim + 3 of a head: bf16 x4 (8 bytes), or fp8 x4 in .x
// when q arrives quantized. Apart from their conversion (q4_from_raw) so that a kernel can
// issue them before q_setup waits for the amax pre-pass: q is an input, not its result.
template <QFormat QF>
MLAGEN_DEVICE uint2 load_q4_raw(const Params& p, int64_t q_row, int head, int dim) {
  const int64_t at = q_row * p.q_stride_token + head * p.q_stride_head + dim;
  uint2 w;
  if constexpr (QF == QFormat::kFp8) {  // fp8 q as given
    w.x = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(p.q) + at);
    w.y = 0u;
  } else {
    w = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p.q) + at);
  }
  return w;
}

// Four q values quantized to fp8 in units of the scale (kFp8FromBf16): the reference's recipe,
// x / scale rounded to bf16, clamped, rounded to e4m3. Out of line on NVIDIA: a thread stages its
// q row as 18 such groups once a block; inlined they were 44 KB of code (the generic warpgroup
// kernel's `_q8` entry 144 KB against the given-q entry's 99 KB) and that entry paid a fixed
// ~19.5 us over the given-q one under the flush (docs/perf.md, fp8 q); out of line the call pays
// ~6 us over it at 4x1024 (the pre-pass and the wait for it). (AMD keeps it inline: out of line, the gfx950 generic `_q8` entry calls it with a
// dynamic stack, scratch not bounded, which make check-amd refuses; its code would drop 95 -> 66 KB.)
#if defined(MLAGEN_NVIDIA)
MLAGEN_DEVICE_OUTLINED
#else
MLAGEN_DEVICE
#endif
float4 quantize_q4(float4 f, float scale, float inv) {
  auto q8 = [&](float x) { return round_fp8(fminf(fmaxf(div_round_bf16(x, scale, inv), -kFp8Max), kFp8Max)); };
  return make_float4(q8(f.x), q8(f.y), q8(f.z), q8(f.w));
}

// Four consecutive query dims as fp32 from their stored words: bf16 exact; fp8 exact in
// units of the scale (quantized here for kFp8FromBf16).
template <QFormat QF>
MLAGEN_DEVICE float4 q4_from_raw(const QQuant& qq, uint2 v) {
  if constexpr (QF == QFormat::kFp8) return fp8x4_to_float4(v.x);
  const float4 f = make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
  if constexpr (QF == QFormat::kFp8FromBf16) return quantize_q4(f, qq.scale, qq.inv);
  return f;
}

template <QFormat QF>
MLAGEN_DEVICE float4 load_q4(const Params& p, const QQuant& qq, int64_t q_row, int head, int dim) {
  return q4_from_raw<QF>(qq, load_q4_raw<QF>(p, q_row, head, dim));
}

// ---- a bf16 q as f16 ------------------------------------------------------------------------
// The f16 matrix path (the AMD fp8 MFMA kernel, mla_decode_gfx9.cuh Gfx9Fp8Kv) takes a bf16 q
// as f16, which holds |x| <= 65504 where bf16 holds 3.4e38. So a warp's slice of q (its dims,
// all heads) is scaled by 2^-k, k the least that brings its largest |q| under 2^15, and the
// warp's partial S by 2^k before the warps' partials are summed: exact (a power of two only
// moves exponents), no barrier, and k = 0 (bit-identical, the rescale skipped by a
// warp-uniform branch) for every q an f16 holds. Every lane of the warp calls it with the
// largest |q| it holds. An fp8 q (|q8| <= 448 in units of its scale) needs none.
MLAGEN_DEVICE float absmax4(float4 v) { return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))); }
MLAGEN_DEVICE int f16_q_shift(float amax) {
  for (int o = MLAGEN_WARP_SIZE / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor(amax, o));
  const int e = static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu) - 127;  // Inf: 128
  return e >= 15 ? e - 14 : 0;
}

// The pre-pass of fp8 q quantized here: block i writes max|q| over rows i, i + grid, ...
// in 16-byte loads, all of them in flight at once. kThreads threads; grid = min(total_q,
// kQAmaxParts).
MLAGEN_DEVICE float absmax_bf16x8(uint4 v) {
  const float a = nan_max(nan_max(fabsf(bf16_lo(v.x)), fabsf(bf16_hi(v.x))), nan_max(fabsf(bf16_lo(v.y)), fabsf(bf16_hi(v.y))));
  const float b = nan_max(nan_max(fabsf(bf16_lo(v.z)), fabsf(bf16_hi(v.z))), nan_max(fabsf(bf16_lo(v.w)), fabsf(bf16_hi(v.w))));
  return nan_max(a, b);
}
template <int kThreads>
MLAGEN_DEVICE void q_amax_block(const Params& p) {  // entry.cuh: a code object's `<name>_amax`
  allow_dependent_launch();  // the decode grid may start its KV loads now
  const int kChunks = p.num_heads * (kQkDim / 8);  // 16-byte pieces of a q row (72 a head)
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  float m = 0.f;
  // the block's rows blockIdx.x, + grid, ... as one run of pieces, kInFlight loads a thread
  // at a time: one round trip for up to 3.5 rows a block (two rows at most for total_q <= 480)
  constexpr int kInFlight = 16;
  const int64_t rows = blockIdx.x < p.total_q ? (p.total_q - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int64_t pieces = rows * kChunks;
  auto piece = [&](int64_t j) {
    const int64_t r = blockIdx.x + (j / kChunks) * gridDim.x;
    const int i = static_cast<int>(j % kChunks);
    const int h = i / (kQkDim / 8), d = 8 * (i % (kQkDim / 8));
    return *reinterpret_cast<const uint4*>(q + r * p.q_stride_token + h * p.q_stride_head + d);
  };
  for (int64_t j0 = threadIdx.x; j0 < pieces; j0 += kInFlight * kThreads) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = j0 + u * kThreads < pieces ? piece(j0 + u * kThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) m = nan_max(m, absmax_bf16x8(v[u]));
  }
  __shared__ float red[kThreads / MLAGEN_WARP_SIZE];
  for (int o = MLAGEN_WARP_SIZE / 2; o > 0; o /= 2) m = nan_max(m, __shfl_xor(m, o));
  if (threadIdx.x % MLAGEN_WARP_SIZE == 0) red[threadIdx.x / MLAGEN_WARP_SIZE] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / MLAGEN_WARP_SIZE; ++w) m = nan_max(m, red[w]);
    p.q_amax[blockIdx.x] = m;
  }
}


}  // namespace mlagen::device
