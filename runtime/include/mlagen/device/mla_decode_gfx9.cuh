// MLA decode attention on AMD CDNA (gfx942, gfx950): the same algorithm as the NVIDIA
// kernels (mla_decode_sm90.cuh), on MFMA with 64-lane wavefronts.
//
// Block (split x row group, sequence) = 4 waves, owning 16 query rows (shapes.cuh QueryRows:
// the sequence's query tokens x heads, causal among the tokens; at q_len 1 and 16 heads the
// 16 heads). Each KV tile of kBlockN tokens is read from global memory once into LDS and
// serves both products ("head i" below: the block's query row i):
//   S^T = K Q^T : tokens are the MFMA M dimension, the 16 rows N; wave w owns the 144
//                 dims [144w, 144w+144) of the inner product and the 4 partial tiles are
//                 summed through LDS (layout-agnostic: every wave has the same layout).
//   O^T += V^T P^T : wave w owns the 128 output dims [128w, 128w+128). The S^T
//                 accumulator layout (lane (i,j) holds tokens 4j..4j+3 of head i) is
//                 exactly the P^T B-operand layout, so P never leaves registers.
//
// One body (decode_gfx9) runs that algorithm for every KV format: the prologue (formats.cuh
// block_setup, the query, the scales), the tile pipeline, the softmax step and the epilogue
// (the bf16 row and its LSE, or the split's partial). What a format changes is its policy,
// T::Kv (formats.cuh KvTraits says which format takes which):
//   Gfx9Fp8Kv : MFMA on AMD has no fp8 x f16 form, so K and V bytes are decoded to f16 in
//               registers (exact), with the arch's fp8 flavour (gfx942 e4m3fnuz, gfx950
//               e4m3fn); the per-tensor KV scale is applied to S and O in fp32.
//   Gfx9WideKv: bf16 rows (bf16 KV as stored, or mxfp4 dequantized into a bf16 tile in LDS
//               once per tile) feed bf16 MFMA; P is rounded to bf16.
// A policy answers: its LDS plan (kLdsTiles stages of kStageBytes, kDecodedBytes of expanded
// tile), the query as the B operand of S^T (q_operands), a tile in flight through registers
// (InFlight: load, store), the tile the products read (expand), this wave's S^T (scores), the
// PV operands (p_operand; VRaw, transpose_v, a_operand: the loop is the body's
// accumulate_pv), when the tile may be overwritten (release) and the per-tensor factors of S
// and O (scales). The query is bf16, or fp8 with a per-tensor scale folded into S.
// Split-range, online-softmax, LSE and combine formulas come from mla_common.cuh; the tile
// loaders ask kv_rows.cuh where a token's row is (contiguous or paged KV).
//
// Pipeline: a tile is loaded into registers while the previous one is computed from LDS,
// then stored to LDS (kStages must be 2: one tile in registers, one in LDS). fp8 stores into
// the other of 2 LDS stages; the wide formats have one (see Gfx9WideKv).
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/mla_decode_gfx950_fp8.cuh"  // gfx950 fp8 KV: the native fp8 body

#if defined(MLAGEN_AMD)
namespace mlagen::device {

// Token t's KV row: contiguous KV as before paging, from the sequence's first row `kv` (kept
// out of the loop: the contiguous kernels' loads stay what they were), paged KV through
// kv_rows.cuh (a bad page id sets `bad`).
template <class Rows>
MLAGEN_DEVICE const uint8_t* kv_row(const Rows& rows, const uint8_t* kv, int64_t stride, int t, bool& bad) {
  return rows.paged() ? rows.ptr(t, bad) : kv + static_cast<int64_t>(t) * stride;
}

// Where a block's KV tiles come from: the sequence's rows (contiguous from `kv`, else through
// `rows`), up to the split's end; the scale tensor (mxfp4) is read from `p`.
template <class Rows>
struct KvSource {
  const Params& p;
  const Rows& rows;
  const uint8_t* kv;  // contiguous KV: the sequence's first row
  int tok_end;        // the split's end
};

// What a format's S and O are multiplied by in fp32 (its per-tensor scales).
struct KvScales {
  float s, o;
};

// O^T of one wave, every format alike: [64-dim block][tile u]; tile u maps its row m to dim
// 4m + u of the block, so lane (i, j) ends with dims 16j .. 16j+15 of each block for head i:
// dim wave*128 + 64*blk + 16j + (4r + u) = o[blk][u][r].
using OTile = gfx9::f32x4[2][4];

// A tile of kBlockN KV rows of kRowDataBytes in flight through registers: thread tid holds
// the tile's 16-byte chunks c = tid + kThreads k (row c / kChunksPerRow, chunk c %
// kChunksPerRow); rows past the split's end hold zeros.
template <class G, int kRowDataBytes>
struct RowChunks {
  static constexpr int kChunksPerRow = kRowDataBytes / 16;
  static constexpr int kChunksPerTile = G::kBlockN * kChunksPerRow;
  static constexpr int kPerThread = (kChunksPerTile + G::kThreads - 1) / G::kThreads;
  uint4 v[kPerThread];

  // chunk idx is one of the tile's (always, when the chunks are a whole number a thread)
  MLAGEN_DEVICE static bool in_tile(int idx) { return kChunksPerTile % G::kThreads == 0 || idx < kChunksPerTile; }
  template <class Rows>
  MLAGEN_DEVICE void load(const KvSource<Rows>& src, int tok0, bool& bad) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int idx = threadIdx.x + k * G::kThreads;
      const int row = idx / kChunksPerRow, col = idx % kChunksPerRow;
      const bool ok = in_tile(idx) && tok0 + row < src.tok_end;
      v[k] = ok ? *reinterpret_cast<const uint4*>(kv_row(src.rows, src.kv, src.p.kv_stride_bytes, tok0 + row, bad) +
                                                  col * 16)
                : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  MLAGEN_DEVICE void store(uint8_t* stage, int pitch) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int idx = threadIdx.x + k * G::kThreads;
      if (in_tile(idx)) {
        const int row = idx / kChunksPerRow, col = idx % kChunksPerRow;
        *reinterpret_cast<uint4*>(stage + row * pitch + col * 16) = v[k];
      }
    }
  }
};

// ---- fp8 KV ---------------------------------------------------------------------------------
// Two LDS stages of padded rows (G::kRowBytes): tile it is stored into stage it & 1, which
// every wave finished reading in tile it - 2, so the barrier after the store is the only one
// the pipeline needs.
//   S^T: A = K[token][dims]: lane (i, j) reads 4 bytes (dims 16c + 4j .. +3 of this wave's
//        chunk c) of token i of each m16 tile, decoded to f16.
//   O^T: A = V^T: lane (i, j) reads 4 bytes (dims 4i..4i+3 of a 64-dim block) of tokens
//        4j..4j+3 and 16+4j..16+4j+3 of the 32-token step and byte-transposes them: word u
//        holds dim 4i+u.
template <class G>
struct Gfx9Fp8Kv {
  static constexpr int kQC = G::kQkChunksPerWarp;  // 16-dim chunks of S^T a wave
  static constexpr int kMTiles = G::kBlockN / 16;
  static constexpr int kRowBytes = G::kRowBytes;
  static constexpr int kLdsTiles = 2;
  static constexpr int kStageBytes = G::kBlockN * kRowBytes;
  static constexpr int kDecodedBytes = 0;
  static constexpr float kVUnit = gfx9::kVDecodeScale;  // the combine's partial-O unit
  using InFlight = RowChunks<G, KvTraits<KvFormat::kFp8>::kRowDataBytes>;

  // Q^T as the B operand of S^T = K Q^T: lane (i, j) holds head i, dims 4j..4j+3 of each of
  // this wave's 16-dim chunks. A bf16 q beyond f16's range is scaled by 2^-shift
  // (f16_q_shift: this wave's slice) and the wave's S^T back by `unshift` = 2^shift.
  struct Q {
    gfx9::f16x4 b[kQC];
    int shift;
    float unshift;
  };
  template <QFormat QF>
  MLAGEN_DEVICE static Q q_operands(const Params& p, const QQuant& qq, int64_t tok, int head, int wave, int j) {
    Q q;
    q.shift = 0;
    if constexpr (QF == QFormat::kBf16) {
      float a = 0.f;
#pragma unroll
      for (int c = 0; c < kQC; ++c) a = fmaxf(a, absmax4(load_q4<QF>(p, qq, tok, head, (wave * kQC + c) * 16 + 4 * j)));
      q.shift = f16_q_shift(a);
    }
    const float q_mul = pow2i(-q.shift);
    q.unshift = pow2i(q.shift);
#pragma unroll
    for (int c = 0; c < kQC; ++c) {
      const float4 v = load_q4<QF>(p, qq, tok, head, (wave * kQC + c) * 16 + 4 * j);
      q.b[c] = gfx9::f32x4_to_f16x4(v.x * q_mul, v.y * q_mul, v.z * q_mul, v.w * q_mul);
    }
    return q;
  }
  MLAGEN_DEVICE static KvScales scales(const Params& p) {
    const float kv_scale = kv_scale_of(p);
    return KvScales{kv_scale * gfx9::kKDecodeScale, kv_scale * gfx9::kVDecodeScale};
  }

  template <class Rows>
  MLAGEN_DEVICE static void load(InFlight& t, const KvSource<Rows>& src, int tok0, bool& bad) {
    t.load(src, tok0, bad);
  }
  template <class Rows>
  MLAGEN_DEVICE static void store(const InFlight& t, uint8_t* stage, const KvSource<Rows>&) {
    t.store(stage, kRowBytes);
  }
  template <class Rows>
  MLAGEN_DEVICE static const uint8_t* expand(const uint8_t* stage, uint8_t*, const KvSource<Rows>&, int, bool&) {
    return stage;  // the products decode the bytes as they read them
  }
  MLAGEN_DEVICE static void release() {}  // the next store goes to the other stage

  // This wave's partial S^T over its dims: A = K[token][dims], B = Q^T.
  MLAGEN_DEVICE static void scores(const uint8_t* tile, const Q& q, int wave, int i, int j, gfx9::f32x4 (&s)[kMTiles]) {
    using namespace gfx9;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      s[mt] = f32x4{0.f, 0.f, 0.f, 0.f};
      const uint8_t* krow = tile + (16 * mt + i) * kRowBytes + wave * kQC * 16 + 4 * j;
#pragma unroll
      for (int c = 0; c + 1 < kQC; c += 2)
        mfma_k32(s[mt], fp8x4_to_f16x4(lds32(krow + 16 * c)), fp8x4_to_f16x4(lds32(krow + 16 * (c + 1))), q.b[c],
                 q.b[c + 1]);
      if constexpr (kQC % 2) mfma_k16(s[mt], fp8x4_to_f16x4(lds32(krow + 16 * (kQC - 1))), q.b[kQC - 1]);
    }
    if (q.shift) {  // wave-uniform, rare: this wave's q was scaled by 2^-shift
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) s[mt] *= q.unshift;
    }
  }

  // The PV operands: P^T (B) as f16; V^T (A) of dims 4i..4i+3: a token's 4 bytes of them
  // (VRaw) for 4 tokens, byte-transposed (transpose_v: word u holds dim 4i+u of the 4 tokens),
  // decoded to f16 as each MFMA takes it (a_operand).
  using Operand = gfx9::f16x4;
  using VRaw = uint32_t;
  using VWord = uint32_t;
  static constexpr int kElemBytes = 1;
  MLAGEN_DEVICE static Operand p_operand(const gfx9::f32x4& pt) { return gfx9::f32x4_to_f16x4(pt[0], pt[1], pt[2], pt[3]); }
  MLAGEN_DEVICE static void transpose_v(const VRaw (&w)[4], VWord (&t)[4]) { transpose4x4(w, t); }
  MLAGEN_DEVICE static Operand a_operand(VWord w) { return gfx9::fp8x4_to_f16x4(w); }
};

// ---- mxfp4 scale bytes on their way to LDS (Gfx9WideKv) ---------------------------------
// 16 bytes of the scale tensor from `at` (16-byte aligned), of which only the bytes below
// `end` are read; the rest come back zero. The last chunk of a window thus never reads
// past the tile's last scale byte (nor past the tensor).
MLAGEN_DEVICE uint4 load_scale_chunk(const uint8_t* scales, int64_t at, int64_t end) {
  const int64_t left = end - at;
  if (left >= 16) return *reinterpret_cast<const uint4*>(scales + at);
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (left > 0) {
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (k < left) w[k / 4] |= static_cast<uint32_t>(scales[at + k]) << (8 * (k % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// A tile that is not one run of rows (paged, pages shorter than the tile): its scale bytes
// one by one, in mx_issue_scale_rows' order and layout (byte c = tid + kThreads k of the tile
// is row c / 18's block c % 18, at window offset (c / 18) * stride + c % 18; window offset 0).
// Thread `tid` stages its (at most 4) bytes in the words of the uint4 that holds its window
// chunk on the run route, so the paged route costs the pipeline no registers; rows >= valid
// stage 0 (the dequantize ignores their scales).
template <int kBlockN, int kThreads>
struct MxScaleBytes {
  static constexpr int kPerThread = (kBlockN * kMxBlocks + kThreads - 1) / kThreads;
  static_assert(kPerThread <= 4, "a uint4 a thread holds the tile's scale bytes");
  template <class Rows>
  MLAGEN_DEVICE static uint4 load(const uint8_t* scales, int64_t stride, const Rows& rows, int tok0, int valid, int tid,
                                  bool& bad) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int c = tid + kThreads * k, r = c / kMxBlocks;
      if (r < valid) w[k] = scales[rows.row(tok0 + r, bad) * stride + c % kMxBlocks];
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
  MLAGEN_DEVICE static void store(uint4 v, uint8_t* window, int64_t stride, int tid) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int c = tid + kThreads * k;
      if (c < kBlockN * kMxBlocks) window[(c / kMxBlocks) * stride + c % kMxBlocks] = static_cast<uint8_t>(w[k]);
    }
  }
};

// ---- wide KV (bf16 and mxfp4) ---------------------------------------------------------------
// One bf16 tile in LDS that both products read:
//   S^T: A = K[token][dims], 16 bytes (8 dims) a lane in natural order: the k32 step c of
//        this wave's dims takes dims 32c + 8j .. +3 as its low half and +4 .. +7 as its
//        high half; Q^T (B) is packed to bf16 (round to nearest even) with the same map.
//   O^T: A = V^T: lane (i, j) reads 8 bytes (dims 4i..4i+3 of a 64-dim block) of tokens
//        4j..4j+3 and 16+4j..16+4j+3 of the 32-token step and transposes the 16-bit
//        elements: operand u holds dim 4i+u, as the fp8 format's byte transpose does.
// One LDS stage: storing a tile waits for every wave to be done with the previous one (bf16:
// a barrier after the products, release; mxfp4: the dequantize's barrier does it). Two bf16
// tiles are 73 KB: over gfx942's 64 KB.
// mxfp4: the registers hold the packed rows and the tile's scale window (its bytes one by one
// when paged rows are not one run: MxScaleBytes); they are stored into the MxStage, which the
// block dequantizes into the bf16 tile (rows past the valid tokens become zeros) before the
// products (expand).
template <class G, bool kMx>
struct Gfx9WideKv {
  static constexpr int kQC = G::kQkChunksPerWarp;  // 16-dim chunks of S^T a wave
  static constexpr int kQP = kQC / 2;              // k32 steps of S^T; a k16 step follows when kQC is odd
  static constexpr int kMTiles = G::kBlockN / 16;
  // bf16 rows of 1152 bytes + 16 pad (73 x 16 bytes; 1168 = 16 mod 128, with 32 banks of 4
  // bytes): the 8 rows that 8 lanes of an S^T ds_read_b128 touch start 16 bytes apart in the
  // banks, and the V^T ds_read_b64 of lanes j and j+1 (rows 4 apart, 64 bytes apart) cover
  // every bank twice.
  static constexpr int kRowBytes = 2 * kQkDim + 16;
  static constexpr int kLdsTiles = 1;
  // bf16: the tile itself; mxfp4: one MxStage (packed rows + scale window), then the bf16 tile
  static constexpr int kStageBytes = kMx ? MxStage<G::kBlockN>::kBytes : G::kBlockN * kRowBytes;
  static constexpr int kDecodedBytes = kMx ? G::kBlockN * kRowBytes : 0;
  static constexpr float kVUnit = 1.f;
  using Rows = RowChunks<G, KvTraits<kMx ? KvFormat::kMxfp4 : KvFormat::kBf16>::kRowDataBytes>;
  using MxBytes = MxScaleBytes<G::kBlockN, G::kThreads>;
  struct InFlight {
    Rows rows;
    uint4 sc = make_uint4(0u, 0u, 0u, 0u);  // mxfp4: 16 bytes of the tile's scale window (or MxBytes')
  };
  static_assert(!kMx || MxStage<G::kBlockN>::kScaleChunks <= G::kThreads, "one scale chunk a thread at most");

  // Q^T as the B operand: b[2c], b[2c+1] = head i, dims d0 + 32c + 8j + 0..3, + 4..7;
  // b[kQC-1] (kQC odd) = dims d0 + 32 kQP + 4j + 0..3 (d0: this wave's first QK dim).
  struct Q {
    gfx9::bf16x4 b[kQC];
  };
  template <QFormat QF>
  MLAGEN_DEVICE static Q q_operands(const Params& p, const QQuant& qq, int64_t tok, int head, int wave, int j) {
    const int d0 = wave * kQC * 16;
    Q q;
#pragma unroll
    for (int c = 0; c < kQP; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 v = load_q4<QF>(p, qq, tok, head, d0 + 32 * c + 8 * j + 4 * h);
        q.b[2 * c + h] = gfx9::f32x4_to_bf16x4(v.x, v.y, v.z, v.w);
      }
    if constexpr (kQC % 2) {
      const float4 v = load_q4<QF>(p, qq, tok, head, d0 + 32 * kQP + 4 * j);
      q.b[kQC - 1] = gfx9::f32x4_to_bf16x4(v.x, v.y, v.z, v.w);
    }
    return q;
  }
  // bf16 is as stored and mxfp4's scales are in its bf16 tile: no per-tensor factor
  MLAGEN_DEVICE static KvScales scales(const Params&) { return KvScales{1.f, 1.f}; }

  template <class R>
  MLAGEN_DEVICE static void load(InFlight& t, const KvSource<R>& src, int tok0, bool& bad) {
    t.rows.load(src, tok0, bad);
    if constexpr (kMx) {
      constexpr int BN = G::kBlockN;
      const int valid = min(BN, src.tok_end - tok0);
      if (!src.rows.template tile_contiguous<BN>()) {  // pages shorter than the tile: byte by byte
        t.sc = MxBytes::load(src.p.kv_scales, src.p.kv_scales_stride, src.rows, tok0, valid, threadIdx.x, bad);
      } else if (threadIdx.x < MxStage<BN>::kScaleChunks) {  // one run of rows: the aligned window
        const MxScaleWindow win = mx_scale_window(src.rows.row(tok0, bad), valid, src.p.kv_scales_stride);
        t.sc = load_scale_chunk(src.p.kv_scales, win.start + 16 * threadIdx.x, win.end);
      }
    }
  }
  // bf16: every wave was done with the previous tile at release's barrier; mxfp4: the stage
  // was last read by the previous tile's dequantize (barrier after it)
  template <class R>
  MLAGEN_DEVICE static void store(const InFlight& t, uint8_t* stage, const KvSource<R>& src) {
    constexpr int BN = G::kBlockN;
    t.rows.store(stage, kMx ? kMxRowBytes : kRowBytes);
    if constexpr (kMx) {
      if (!src.rows.template tile_contiguous<BN>())
        MxBytes::store(t.sc, stage + MxStage<BN>::kDataBytes, src.p.kv_scales_stride, threadIdx.x);
      else if (threadIdx.x < MxStage<BN>::kScaleChunks)
        *reinterpret_cast<uint4*>(stage + MxStage<BN>::kDataBytes + 16 * threadIdx.x) = t.sc;
    }
  }
  // The bf16 tile the products read: bf16, the stage; mxfp4, `decoded`, complete at the barrier.
  template <class R>
  MLAGEN_DEVICE static const uint8_t* expand(const uint8_t* stage, uint8_t* decoded, const KvSource<R>& src, int tok0,
                                             bool& bad) {
    if constexpr (kMx) {
      constexpr int BN = G::kBlockN;
      mxfp4_stage_to_bf16<BN, G::kThreads>(stage, mx_scale_offset<BN>(src.rows, tok0, src.p.kv_scales_stride, bad),
                                           src.p.kv_scales_stride, src.tok_end - tok0, decoded, kRowBytes, threadIdx.x);
      __syncthreads();  // the bf16 tile is complete
      return decoded;
    } else {
      return stage;
    }
  }
  MLAGEN_DEVICE static void release() {
    if constexpr (!kMx) __syncthreads();  // bf16: every wave is done reading the one stage
  }

  // This wave's partial S^T over its dims: A = K[token][dims], B = Q^T.
  MLAGEN_DEVICE static void scores(const uint8_t* tile, const Q& q, int wave, int i, int j, gfx9::f32x4 (&s)[kMTiles]) {
    using namespace gfx9;
    const int d0 = wave * kQC * 16;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      s[mt] = f32x4{0.f, 0.f, 0.f, 0.f};
      const uint8_t* krow = tile + (16 * mt + i) * kRowBytes + 2 * d0;
#pragma unroll
      for (int c = 0; c < kQP; ++c) {
        const uint4 k = *reinterpret_cast<const uint4*>(krow + 64 * c + 16 * j);
        mfma_k32(s[mt], bf16x4_of(k.x, k.y), bf16x4_of(k.z, k.w), q.b[2 * c], q.b[2 * c + 1]);
      }
      if constexpr (kQC % 2) {
        const uint2 k = *reinterpret_cast<const uint2*>(krow + 64 * kQP + 8 * j);
        mfma_k16(s[mt], bf16x4_of(k.x, k.y), q.b[kQC - 1]);
      }
    }
  }

  // The PV operands: P^T (B) rounded to bf16; V^T (A) of dims 4i..4i+3: a token's 8 bytes of
  // them (VRaw) for 4 tokens, 16-bit transposed (transpose_v: operand u holds dim 4i+u).
  using Operand = gfx9::bf16x4;
  using VRaw = uint2;
  using VWord = gfx9::bf16x4;
  static constexpr int kElemBytes = 2;
  MLAGEN_DEVICE static Operand p_operand(const gfx9::f32x4& pt) { return gfx9::f32x4_to_bf16x4(pt[0], pt[1], pt[2], pt[3]); }
  MLAGEN_DEVICE static void transpose_v(const VRaw (&w)[4], VWord (&t)[4]) { gfx9::transpose4x4_b16(w, t); }
  MLAGEN_DEVICE static Operand a_operand(VWord w) { return w; }
};

// ---- the body -------------------------------------------------------------------------------
// A gfx9 kernel (codegen's Tiling<block_n, stages, kv, q>): the geometry every format shares,
// the format's policy (Kv) and the block's LDS.
template <int kBlockN_, int kStages_, KvFormat kKv_, QFormat kQ_>
struct Tiling {
  using G = TileGeometry<kBlockN_, kStages_, /*waves=*/4>;  // tokens a tile; each wave's QK and V dims
  using Kv = std::conditional_t<KvTraits<kKv_>::kWide, Gfx9WideKv<G, kKv_ == KvFormat::kMxfp4>, Gfx9Fp8Kv<G>>;
  static constexpr Body kBody = Body::kGfx9;  // the tiling is the body's (codegen/spec.py KernelSpec.body)
  static constexpr KvFormat kKv = kKv_;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = Tiling<kBlockN_, kStages_, kKv_, Q>;  // the same kernel for another q route
  static constexpr int kBlockN = G::kBlockN, kStages = G::kStages, kWarps = G::kWarps, kThreads = G::kThreads;
  static constexpr int kVDimsPerWarp = G::kVDimsPerWarp;
  static constexpr bool kWide = KvTraits<kKv>::kWide;
  static constexpr float kVUnit = Kv::kVUnit;  // the combine's partial-O unit
  static constexpr int kMTiles = kBlockN / 16;  // m16 MFMA tiles per KV tile
  // LDS: the format's stages and expanded tile, then the S^T reduction buffer. The same on
  // both arches (the host pass sees no arch).
  static constexpr int kRedBytes = kWarps * kMTiles * MLAGEN_WARP_SIZE * 16;
  static constexpr int kSmemBytes = Kv::kLdsTiles * Kv::kStageBytes + Kv::kDecodedBytes + kRedBytes;
  static constexpr int kMinBlocksPerSm = 1;
  static_assert(MLAGEN_WARP_SIZE == 64, "gfx9 kernel: 64-lane wavefronts");
  static_assert(kStages == 2, "gfx9 kernel v1: register-staged double buffering (stages = 2)");
  static_assert(kBlockN % 32 == 0, "kBlockN: pairs of m16 tiles feed the k32 PV MFMA");
  static_assert(Kv::kLdsTiles == 1 || Kv::kLdsTiles == 2, "stage it & (kLdsTiles - 1)");
  static_assert(Kv::kStageBytes % 16 == 0 && Kv::kDecodedBytes % 16 == 0, "16-byte aligned LDS regions");
  static_assert(kSmemBytes <= gfx9::kLdsBytes, "LDS over the arch's limit: smaller block_n");
};

// Sums the 4 waves' partial S^T tiles through LDS, masks tokens past `valid` (this lane's row's
// keys in the tile) and takes the online-softmax step for row i (log2 domain). On return s holds
// the unnormalized P^T, m / l are updated (l: this lane's share) and O is rescaled to the new
// running max. kEarly (Shape::kRowsEndEarly): a row may have seen no key yet (all -inf): alpha 1
// and P 0 through step_base; else the unguarded step of one-token shapes (mla_common.cuh).
template <class T, bool kEarly>
MLAGEN_DEVICE void softmax_tile(gfx9::f32x4 (&s)[T::kMTiles], gfx9::f32x4* red, int wave, int lane, int valid,
                                float s_scale, float& m, float& l, OTile& o) {
  constexpr int MT = T::kMTiles, W = MLAGEN_WARP_SIZE;
  const int j = lane >> 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) red[(wave * MT + mt) * W + lane] = s[mt];
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    gfx9::f32x4 a = red[mt * W + lane];
#pragma unroll
    for (int w = 1; w < T::kWarps; ++w) a += red[(w * MT + mt) * W + lane];
    s[mt] = a;
  }
  const float mx = gfx9::scaled_masked_max(s, s_scale, valid, [j](int mt, int r) { return 16 * mt + 4 * j + r; });
  const float alpha = online_step<kEarly>(m, mx);
  const float base = step_base<kEarly>(m);
  float lsum = 0.f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      s[mt][r] = fast_exp2(s[mt][r] - base);
      lsum += s[mt][r];
    }
  l = l * alpha + lsum;
#pragma unroll
  for (int blk = 0; blk < 2; ++blk)
#pragma unroll
    for (int u = 0; u < 4; ++u) o[blk][u] *= alpha;
}

// O^T += V^T P^T over this wave's 128 dims, 32 tokens (two m16 tiles) a step: A = V^T, lane
// (i, j) reads dims 4i..4i+3 of a 64-dim block (Kv::VRaw) of tokens 4j..4j+3 (lo) and
// 16+4j..16+4j+3 (hi) of the step and transposes them (Kv::transpose_v, Kv::a_operand); B =
// P^T straight from the S^T accumulators (Kv::p_operand).
template <class T>
MLAGEN_DEVICE void accumulate_pv(const uint8_t* tile, const gfx9::f32x4 (&s)[T::kMTiles], int wave, int i, int j,
                                 OTile& o) {
  using Kv = typename T::Kv;
  using Raw = typename Kv::VRaw;
  constexpr int RB = Kv::kRowBytes;
#pragma unroll
  for (int kc = 0; kc < T::kMTiles / 2; ++kc) {
    const typename Kv::Operand b_lo = Kv::p_operand(s[2 * kc]), b_hi = Kv::p_operand(s[2 * kc + 1]);
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      const uint8_t* vcol = tile + (32 * kc + 4 * j) * RB + Kv::kElemBytes * (wave * T::kVDimsPerWarp + blk * 64 + 4 * i);
      Raw wl[4], wh[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        wl[r] = *reinterpret_cast<const Raw*>(vcol + r * RB);
        wh[r] = *reinterpret_cast<const Raw*>(vcol + (16 + r) * RB);
      }
      typename Kv::VWord a_lo[4], a_hi[4];
      Kv::transpose_v(wl, a_lo);
      Kv::transpose_v(wh, a_hi);
#pragma unroll
      for (int u = 0; u < 4; ++u) gfx9::mfma_k32(o[blk][u], Kv::a_operand(a_lo[u]), Kv::a_operand(a_hi[u]), b_lo, b_hi);
    }
  }
}

// Lane (i, j) holds query row i, dims wave*128 + 64*blk + 16j + (4r + u) = o[blk][u][r]: the
// bf16 output and its LSE (one split; at the row's (token, head), padding rows not at all) or
// the split's partial (O, m, l) at part row qr.part(i). l: this lane's share; m is the same in
// every lane of row i (every wave takes the same softmax step). bad: the block's verdict
// (block_any_bad), NaN output.
template <class T>
MLAGEN_DEVICE void write_result(const Params& p, const OTile& o, float m, float l, float o_scale, const QueryRows& qr,
                                bool bad, int splits, int wave, int lane) {
  const int i = lane & 15, j = lane >> 4;
  l += __shfl_xor(l, 16);
  l += __shfl_xor(l, 32);
  // lane (i, j): row i's dims wave * 128 + 16 j + 64 blk + e, e < 16, value o[blk][e % 4][e / 4]
  write_rows(p, qr, splits, [&](const auto& out) {
    const float inv = out.scale(l, o_scale, bad);
    const auto dst = out.row(i);
#pragma unroll
    for (int blk = 0; blk < 2; ++blk)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float v[8];
#pragma unroll
        for (int x = 0; x < 8; ++x) v[x] = o[blk][(8 * half + x) % 4][(8 * half + x) / 4] * inv;
        dst.put(wave * T::kVDimsPerWarp + 16 * j + 64 * blk + 8 * half, v);
      }
    if (wave == 0 && j == 0) out.state(i, m, l, bad);
  });
}

template <class T, class Shape>
MLAGEN_DEVICE void decode_gfx9(const Params& p, uint8_t* smem) {
  using namespace gfx9;
  using Kv = typename T::Kv;
  constexpr int BN = T::kBlockN, MT = T::kMTiles;
  uint8_t* const stages = smem;                                               // Kv::kLdsTiles stages
  uint8_t* const decoded = smem + Kv::kLdsTiles * Kv::kStageBytes;            // the expanded tile (mxfp4)
  f32x4* const red = reinterpret_cast<f32x4*>(decoded + Kv::kDecodedBytes);  // the waves' S^T partials

  // ---- prologue: the block's place and range, the query as the B operand, the scales ------
  const int wave = threadIdx.x / MLAGEN_WARP_SIZE, lane = threadIdx.x % MLAGEN_WARP_SIZE;
  const int i = lane & 15, j = lane >> 4;  // MFMA lane coordinates: query row i of the block
  constexpr bool kEarly = Shape::kRowsEndEarly;  // causal rows that may see no key of a tile
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int ntiles = blk.range.ntiles, tok_begin = blk.range.tok_begin;
  // row i's keys end here (causal; the split's end when no row ends early)
  const int row_end = kEarly ? min(blk.range.tok_end, blk.qr.key_end(i)) : blk.range.tok_end;
  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  const KvSource<decltype(blk.rows)> src{p, blk.rows, p.kv + blk.seq.kv_begin * p.kv_stride_bytes, blk.range.tok_end};
  const KvScales sc = Kv::scales(p);
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  const typename Kv::Q q = Kv::template q_operands<T::kQ>(p, qq, blk.qr.token(i), blk.qr.head(i), wave, j);
  const float s_scale = sc.s * qq.scale * p.sm_scale * kLog2e;  // log2 domain

  OTile o;
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int u = 0; u < 4; ++u) o[b][u] = f32x4{0.f, 0.f, 0.f, 0.f};
  float m = -INFINITY, l = 0.f;  // row i; l is this lane's share until the end

  // ---- the tiles: tile it + 1 in flight in registers while tile it is computed from LDS ----
  auto tok0_of = [&](int t) { return tok_begin + t * BN; };
  typename Kv::InFlight next;
  if (ntiles > 0) Kv::load(next, src, tok0_of(0), page_bad);
  for (int it = 0; it < ntiles; ++it) {
    uint8_t* const stage = stages + (it & (Kv::kLdsTiles - 1)) * Kv::kStageBytes;
    Kv::store(next, stage, src);
    __syncthreads();  // the tile is in LDS
    if (it + 1 < ntiles) Kv::load(next, src, tok0_of(it + 1), page_bad);
    const uint8_t* const tile = Kv::expand(stage, decoded, src, tok0_of(it), page_bad);
    f32x4 s[MT];
    Kv::scores(tile, q, wave, i, j, s);
    softmax_tile<T, kEarly>(s, red, wave, lane, row_end - tok0_of(it), s_scale, m, l, o);
    accumulate_pv<T>(tile, s, wave, i, j, o);
    Kv::release();
  }

  // ---- epilogue: the bf16 row and its LSE, or the split's partial ----------------------------
  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;
  write_result<T>(p, o, m, l, sc.o, blk.qr, bad, blk.splits, wave, lane);
}

template <class T, class Shape>
MLAGEN_DEVICE void mla_decode_block(const Params& p) {  // entry.cuh: a code object's `<name>` entry
  extern __shared__ __attribute__((aligned(16))) uint8_t smem[];
  if constexpr (T::kBody == Body::kGfx950Fp8)
    decode_fp8_native<T, Shape>(p, smem);
  else
    decode_gfx9<T, Shape>(p, smem);
}

}  // namespace mlagen::device
#endif  // MLAGEN_AMD
