// MLA decode attention on AMD CDNA (gfx942, gfx950): the same algorithm as the NVIDIA
// kernel (mla_decode.cuh), on MFMA with 64-lane wavefronts.
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
// Two bodies share that structure (formats.cuh says which KV format takes which):
//   fp8 path : MFMA on AMD has no fp8 x f16 form, so K and V bytes are decoded to f16 in
//              registers (exact), with the arch's fp8 flavour (gfx942 e4m3fnuz, gfx950
//              e4m3fn); the per-tensor KV scale is applied to S and O in fp32.
//   wide path: bf16 rows (bf16 KV as stored, or mxfp4 dequantized into a bf16 tile in LDS
//              once per tile) feed bf16 MFMA; P is rounded to bf16.
// The query is bf16, or fp8 with a per-tensor scale folded into S. Split-range,
// online-softmax, LSE and combine formulas come from mla_common.cuh; the tile loaders ask
// kv_rows.cuh where a token's row is (contiguous or paged KV).
//
// Pipeline (v1): a tile is loaded into registers while the previous one is computed
// from LDS, then stored to LDS (kStages must be 2: one tile in registers, one in LDS).
// fp8 uses 2 LDS buffers; the wide path one (see decode_wide).
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/mla_decode_gfx950_fp8.cuh"  // gfx950 fp8 KV: the native fp8 body

#if defined(MLAGEN_AMD)
namespace mlagen::device {

template <int kBlockN_, int kStages_, KvFormat kKv_, QFormat kQ_>
struct Tiling : TileGeometry<kBlockN_, kStages_, /*waves=*/4> {
  using G = TileGeometry<kBlockN_, kStages_, 4>;
  static constexpr KvFormat kKv = kKv_;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = Tiling<kBlockN_, kStages_, kKv_, Q>;  // the same kernel for another q route
  static constexpr bool kWide = KvTraits<kKv>::kWide;
  static constexpr float kVUnit = kWide ? 1.f : kVDecodeScale;  // the combine's partial-O unit
  static constexpr bool kMx = kKv == KvFormat::kMxfp4;
  static constexpr bool kNative = false;  // true only for NativeFp8Tiling (mla_decode_gfx950_fp8.cuh)
  // fp8 path: rows of 576 bytes (+16 pad, G::kRowBytes). Wide path: bf16 rows of 1152 bytes
  // + 16 pad (73 x 16 bytes; 1168 = 16 mod 128, with 32 banks of 4 bytes): the 8 rows that
  // 8 lanes of an S^T ds_read_b128 touch start 16 bytes apart in the banks, and the V^T
  // ds_read_b64 of lanes j and j+1 (rows 4 apart, 64 bytes apart) cover every bank twice.
  static constexpr int kWideRowBytes = 2 * kQkDim + 16;
  static constexpr int kRowBytes = kWide ? kWideRowBytes : G::kRowBytes;
  static constexpr int kChunksPerRow = KvTraits<kKv>::kRowDataBytes / 16;  // 16-byte loads a row
  static constexpr int kChunksPerTile = G::kBlockN * kChunksPerRow;
  static constexpr int kCopiesPerThread = (kChunksPerTile + G::kThreads - 1) / G::kThreads;
  // LDS: fp8 = 2 tiles; bf16 = 1 tile (two are 73 KB: over gfx942's 64 KB); mxfp4 = 1
  // MxStage (packed rows + scale window) + the dequantized bf16 tile. Then the S^T
  // reduction buffer. The same on both arches (the host pass sees no arch).
  static constexpr int kLdsTiles = kWide ? 1 : 2;
  static constexpr int kStageBytes = kMx ? MxStage<G::kBlockN>::kBytes : G::kBlockN * kRowBytes;
  static constexpr int kDecodedBytes = kMx ? G::kBlockN * kWideRowBytes : 0;
  static constexpr int kMTiles = G::kBlockN / 16;  // m16 MFMA tiles per KV tile
  static constexpr int kRedBytes = G::kWarps * kMTiles * MLAGEN_WARP_SIZE * 16;
  static constexpr int kSmemBytes = kLdsTiles * kStageBytes + kDecodedBytes + kRedBytes;
  static constexpr int kMinBlocksPerSm = 1;
  static_assert(MLAGEN_WARP_SIZE == 64, "gfx9 kernel: 64-lane wavefronts");
  static_assert(G::kStages == 2, "gfx9 kernel v1: register-staged double buffering (stages = 2)");
  static_assert(G::kBlockN % 32 == 0, "kBlockN: pairs of m16 tiles feed the k32 PV MFMA");
  static_assert(!kMx || MxStage<G::kBlockN>::kScaleChunks <= G::kThreads, "one scale chunk a thread at most");
  static_assert(kStageBytes % 16 == 0 && kDecodedBytes % 16 == 0, "16-byte aligned LDS regions");
  static_assert(kSmemBytes <= gfx9::kLdsBytes, "LDS over the arch's limit: smaller block_n");
};

// Token t's KV row: contiguous KV as before paging, from the sequence's first row `kv` (kept
// out of the loop: the contiguous kernels' loads stay what they were), paged KV through
// kv_rows.cuh (a bad page id sets `bad`).
template <class Rows>
MLAGEN_DEVICE const uint8_t* kv_row(const Rows& rows, const uint8_t* kv, int64_t stride, int t, bool& bad) {
  return rows.paged() ? rows.ptr(t, bad) : kv + static_cast<int64_t>(t) * stride;
}

// ---- fp8 path ---------------------------------------------------------------------------
// Sums the 4 waves' partial S^T tiles through LDS, masks tokens past `valid` (this lane's row's
// keys in the tile) and takes the online-softmax step for row i (log2 domain). On return s holds
// the unnormalized P^T, m / l are updated (l: this lane's share) and O is rescaled to the new
// running max. kEarly (Shape::kRowsEndEarly): a row may have seen no key yet (all -inf): alpha 1
// and P 0 through step_base; else the unguarded step of one-token shapes (mla_common.cuh).
template <class T, bool kEarly>
MLAGEN_DEVICE void softmax_tile(gfx9::f32x4 (&s)[T::kMTiles], gfx9::f32x4* red, int wave, int lane, int valid,
                                float s_scale, float& m, float& l, gfx9::f32x4 (&o)[2][4]) {
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
  float mx = -INFINITY;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float v = 16 * mt + 4 * j + r < valid ? s[mt][r] * s_scale : -INFINITY;
      s[mt][r] = v;
      mx = fmaxf(mx, v);
    }
  mx = fmaxf(mx, __shfl_xor(mx, 16));
  mx = fmaxf(mx, __shfl_xor(mx, 32));
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

// Lane (i, j) holds query row i, dims wave*128 + 64*blk + 16j + (4r + u) = o[blk][u][r]: the
// bf16 output and its LSE (one split; at the row's (token, head), padding rows not at all) or
// the split's partial (O, m, l) at part row qr.part(i). l: this lane's share; m is the same in
// every lane of row i (every wave takes the same softmax step). bad: the block's verdict
// (block_any_bad), NaN output.
template <class T>
MLAGEN_DEVICE void write_result(const Params& p, const gfx9::f32x4 (&o)[2][4], float m, float l, float o_scale,
                                const QueryRows& qr, bool bad, int splits, int wave, int lane) {
  const int i = lane & 15, j = lane >> 4;
  l += __shfl_xor(l, 16);
  l += __shfl_xor(l, 32);
  if (splits == 1) {
    if (!qr.owns(i)) return;  // a padding row
    const float inv = out_scale(l, o_scale, bad);
    const int64_t tok = qr.token(i);
    const int head = qr.head(i);
    if (wave == 0 && j == 0) store_lse(p, tok, head, m, l, bad);
    uint16_t* out = p.out + tok * p.out_stride_token + head * p.out_stride_head + wave * T::kVDimsPerWarp + 16 * j;
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      uint32_t w[8];
#pragma unroll
      for (int e = 0; e < 16; e += 2)
        w[e / 2] = pack_bf16x2(o[blk][e % 4][e / 4] * inv, o[blk][(e + 1) % 4][(e + 1) / 4] * inv);
      reinterpret_cast<uint4*>(out + 64 * blk)[0] = make_uint4(w[0], w[1], w[2], w[3]);
      reinterpret_cast<uint4*>(out + 64 * blk)[1] = make_uint4(w[4], w[5], w[6], w[7]);
    }
  } else {
    float* po = p.part_o + qr.part(i) * kVDim + wave * T::kVDimsPerWarp + 16 * j;
#pragma unroll
    for (int blk = 0; blk < 2; ++blk)
#pragma unroll
      for (int e = 0; e < 16; e += 4)
        *reinterpret_cast<float4*>(po + 64 * blk + e) =
            make_float4(o[blk][0][e / 4], o[blk][1][e / 4], o[blk][2][e / 4], o[blk][3][e / 4]);
    if (wave == 0 && j == 0) p.part_ml[qr.part(i)] = split_state(m, l, bad);
  }
}

template <class T, class Shape>
MLAGEN_DEVICE void decode_fp8(const Params& p, uint8_t* smem) {
  using namespace gfx9;
  constexpr int BN = T::kBlockN, MT = T::kMTiles, QC = T::kQkChunksPerWarp;
  f32x4* red = reinterpret_cast<f32x4*>(smem + 2 * T::kStageBytes);

  const int wave = threadIdx.x / MLAGEN_WARP_SIZE, lane = threadIdx.x % MLAGEN_WARP_SIZE;
  const int i = lane & 15, j = lane >> 4;  // MFMA lane coordinates: query row i of the block
  constexpr bool kEarly = Shape::kRowsEndEarly;  // causal rows that may see no key of a tile
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits, ntiles = blk.range.ntiles,
            tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
  const int64_t q_tok = blk.qr.token(i);  // row i's q
  const int q_head = blk.qr.head(i);
  // row i's keys end here (causal; the split's end when no row ends early)
  const int row_end = kEarly ? min(tok_end, blk.qr.key_end(i)) : tok_end;
  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  const uint8_t* kv = p.kv + blk.seq.kv_begin * p.kv_stride_bytes;  // contiguous KV: the sequence's first row
  const float kv_scale = kv_scale_of(p);
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  int q_shift = 0;  // a bf16 q beyond f16's range: f16_q_shift (this wave's slice)
  if constexpr (T::kQ == QFormat::kBf16) {
    float a = 0.f;
#pragma unroll
    for (int c = 0; c < QC; ++c) a = fmaxf(a, absmax4(load_q4<T::kQ>(p, qq, q_tok, q_head, (wave * QC + c) * 16 + 4 * j)));
    q_shift = f16_q_shift(a);
  }
  const float q_mul = pow2i(-q_shift), s_unshift = pow2i(q_shift);
  const float s_scale = kv_scale * qq.scale * kKDecodeScale * p.sm_scale * kLog2e;  // log2 domain
  const float o_scale = kv_scale * kVDecodeScale;

  // Q^T as the B operand of S^T = K Q^T: lane (i, j) holds head i, dims 4j..4j+3 of each
  // of this wave's 16-dim chunks.
  f16x4 qf[QC];
#pragma unroll
  for (int c = 0; c < QC; ++c) {
    const float4 v = load_q4<T::kQ>(p, qq, q_tok, q_head, (wave * QC + c) * 16 + 4 * j);
    qf[c] = f32x4_to_f16x4(v.x * q_mul, v.y * q_mul, v.z * q_mul, v.w * q_mul);
  }

  uint4 staged[T::kCopiesPerThread];
  auto load_tile = [&](int tile) {
    const int tok0 = tok_begin + tile * BN;
#pragma unroll
    for (int k = 0; k < T::kCopiesPerThread; ++k) {
      const int idx = threadIdx.x + k * T::kThreads;
      const int row = idx / T::kChunksPerRow, col = idx % T::kChunksPerRow;
      const bool ok = idx < T::kChunksPerTile && tok0 + row < tok_end;
      staged[k] = ok ? *reinterpret_cast<const uint4*>(kv_row(blk.rows, kv, p.kv_stride_bytes, tok0 + row, page_bad) +
                                                       col * 16)
                     : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  auto store_tile = [&](int buf) {
#pragma unroll
    for (int k = 0; k < T::kCopiesPerThread; ++k) {
      const int idx = threadIdx.x + k * T::kThreads;
      if (idx < T::kChunksPerTile) {
        const int row = idx / T::kChunksPerRow, col = idx % T::kChunksPerRow;
        *reinterpret_cast<uint4*>(smem + buf * T::kStageBytes + row * T::kRowBytes + col * 16) = staged[k];
      }
    }
  };

  // O^T accumulators: [64-dim block][tile u]; tile u maps its row m to dim 4m + u of the
  // block, so lane (i, j) ends with dims 16j .. 16j+15 of each block for head i.
  f32x4 o[2][4];
#pragma unroll
  for (int blk = 0; blk < 2; ++blk)
#pragma unroll
    for (int u = 0; u < 4; ++u) o[blk][u] = f32x4{0.f, 0.f, 0.f, 0.f};
  float m = -INFINITY, l = 0.f;  // row i; l is this lane's share until the end

  if (ntiles > 0) load_tile(0);
  for (int it = 0; it < ntiles; ++it) {
    store_tile(it & 1);  // buffer it&1 was last read in tile it-2: every wave is past that
    __syncthreads();
    if (it + 1 < ntiles) load_tile(it + 1);  // in flight while this tile is computed
    const uint8_t* st = smem + (it & 1) * T::kStageBytes;

    // ---- S^T partial over this wave's dims: A = K[token][dims], B = Q^T ------------------
    f32x4 s[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      s[mt] = f32x4{0.f, 0.f, 0.f, 0.f};
      const uint8_t* krow = st + (16 * mt + i) * T::kRowBytes + wave * QC * 16 + 4 * j;
#pragma unroll
      for (int c = 0; c + 1 < QC; c += 2)
        mfma_k32(s[mt], fp8x4_to_f16x4(lds32(krow + 16 * c)), fp8x4_to_f16x4(lds32(krow + 16 * (c + 1))), qf[c],
                 qf[c + 1]);
      if constexpr (QC % 2) mfma_k16(s[mt], fp8x4_to_f16x4(lds32(krow + 16 * (QC - 1))), qf[QC - 1]);
    }

    if (q_shift) {  // wave-uniform, rare: this wave's q was scaled by 2^-q_shift
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) s[mt] *= s_unshift;
    }
    // ---- sum the 4 waves' partials, online softmax over tokens for row i -------------------
    softmax_tile<T, kEarly>(s, red, wave, lane, row_end - (tok_begin + it * BN), s_scale, m, l, o);

    // ---- O^T += V^T P^T over this wave's 128 dims, 32 tokens (two m16 tiles) a step ------
    // A = V^T: lane (i, j) reads 4 bytes (dims 4i..4i+3 of a 64-dim block) of tokens
    // 4j..4j+3 of each m16 tile and byte-transposes them: word u holds dim 4i+u.
#pragma unroll
    for (int kc = 0; kc < MT / 2; ++kc) {
      const f16x4 b_lo = f32x4_to_f16x4(s[2 * kc][0], s[2 * kc][1], s[2 * kc][2], s[2 * kc][3]);
      const f16x4 b_hi = f32x4_to_f16x4(s[2 * kc + 1][0], s[2 * kc + 1][1], s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
      for (int blk = 0; blk < 2; ++blk) {
        const uint8_t* vcol = st + (32 * kc + 4 * j) * T::kRowBytes + wave * T::kVDimsPerWarp + blk * 64 + 4 * i;
        uint32_t wl[4], wh[4], tl[4], th[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          wl[r] = lds32(vcol + r * T::kRowBytes);
          wh[r] = lds32(vcol + (16 + r) * T::kRowBytes);
        }
        transpose4x4(wl, tl);
        transpose4x4(wh, th);
#pragma unroll
        for (int u = 0; u < 4; ++u)
          mfma_k32(o[blk][u], fp8x4_to_f16x4(tl[u]), fp8x4_to_f16x4(th[u]), b_lo, b_hi);
      }
    }
  }

  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;
  write_result<T>(p, o, m, l, o_scale, blk.qr, bad, splits, wave, lane);
}

// ---- wide path (bf16 and mxfp4 KV) ------------------------------------------------------
// The fp8 path's structure on bf16 MFMA, reading one bf16 tile in LDS:
//   S^T: A = K[token][dims], 16 bytes (8 dims) a lane in natural order: the k32 step c of
//        this wave's dims takes dims 32c + 8j .. +3 as its low half and +4 .. +7 as its
//        high half; Q^T (B) is packed to bf16 (round to nearest even) with the same map.
//   O^T: A = V^T: lane (i, j) reads 8 bytes (dims 4i..4i+3 of a 64-dim block) of tokens
//        4j..4j+3 and 16+4j..16+4j+3 of the 32-token step and transposes the 16-bit
//        elements: operand u holds dim 4i+u, as the fp8 path's byte transpose does.
// Pipeline: the next tile is loaded into registers while this one is computed, as in the
// fp8 path, but into ONE LDS tile: storing waits for every wave to be done with the
// previous tile (bf16: one barrier more a tile; mxfp4: the dequantize barrier does it).
// mxfp4: the registers hold the packed rows and the tile's scale window (its bytes one by one
// when paged rows are not one run: MxScaleBytes); they are stored into the MxStage,
// which the block dequantizes into the bf16 tile (rows past the valid tokens become zeros)
// before the products.

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

template <class T, class Shape>
MLAGEN_DEVICE void decode_wide(const Params& p, uint8_t* smem) {
  using namespace gfx9;
  constexpr int BN = T::kBlockN, MT = T::kMTiles, QC = T::kQkChunksPerWarp, RB = T::kRowBytes;
  constexpr int QP = QC / 2;  // k32 steps of S^T; a k16 step follows when QC is odd
  constexpr bool kMx = T::kMx;
  uint8_t* const stage = smem;                              // bf16: the tile; mxfp4: the MxStage
  const uint8_t* const tile = smem + (kMx ? T::kStageBytes : 0);  // the bf16 tile both products read
  f32x4* red = reinterpret_cast<f32x4*>(smem + T::kStageBytes + T::kDecodedBytes);

  const int wave = threadIdx.x / MLAGEN_WARP_SIZE, lane = threadIdx.x % MLAGEN_WARP_SIZE;
  const int i = lane & 15, j = lane >> 4;  // MFMA lane coordinates: query row i of the block
  constexpr bool kEarly = Shape::kRowsEndEarly;  // causal rows that may see no key of a tile
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits, ntiles = blk.range.ntiles,
            tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
  const int64_t q_tok = blk.qr.token(i);  // row i's q
  const int q_head = blk.qr.head(i);
  // row i's keys end here (causal; the split's end when no row ends early)
  const int row_end = kEarly ? min(tok_end, blk.qr.key_end(i)) : tok_end;
  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  const uint8_t* kv = p.kv + blk.seq.kv_begin * p.kv_stride_bytes;  // contiguous KV: the sequence's first row
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  const float s_scale = qq.scale * p.sm_scale * kLog2e;  // log2 domain; no KV scale
  const int d0 = wave * QC * 16;  // this wave's first QK dim

  // Q^T as the B operand: qf[2c], qf[2c+1] = head i, dims d0 + 32c + 8j + 0..3, + 4..7;
  // qf[QC-1] (QC odd) = dims d0 + 32 QP + 4j + 0..3.
  bf16x4 qf[QC];
#pragma unroll
  for (int c = 0; c < QP; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 v = load_q4<T::kQ>(p, qq, q_tok, q_head, d0 + 32 * c + 8 * j + 4 * h);
      qf[2 * c + h] = f32x4_to_bf16x4(v.x, v.y, v.z, v.w);
    }
  if constexpr (QC % 2) {
    const float4 v = load_q4<T::kQ>(p, qq, q_tok, q_head, d0 + 32 * QP + 4 * j);
    qf[QC - 1] = f32x4_to_bf16x4(v.x, v.y, v.z, v.w);
  }

  uint4 staged[T::kCopiesPerThread];
  uint4 staged_sc = make_uint4(0u, 0u, 0u, 0u);  // mxfp4: 16 bytes of the tile's scale window (or MxBytes')
  using MxBytes = MxScaleBytes<BN, T::kThreads>;
  auto load_tile = [&](int t) {
    const int tok0 = tok_begin + t * BN;
#pragma unroll
    for (int k = 0; k < T::kCopiesPerThread; ++k) {
      const int idx = threadIdx.x + k * T::kThreads;
      const int row = idx / T::kChunksPerRow, col = idx % T::kChunksPerRow;
      const bool ok = (T::kChunksPerTile % T::kThreads == 0 || idx < T::kChunksPerTile) && tok0 + row < tok_end;
      staged[k] = ok ? *reinterpret_cast<const uint4*>(kv_row(blk.rows, kv, p.kv_stride_bytes, tok0 + row, page_bad) +
                                                       col * 16)
                     : make_uint4(0u, 0u, 0u, 0u);
    }
    if constexpr (kMx) {
      const int valid = min(BN, tok_end - tok0);
      if (!blk.rows.template tile_contiguous<BN>()) {  // pages shorter than the tile: byte by byte
        staged_sc = MxBytes::load(p.kv_scales, p.kv_scales_stride, blk.rows, tok0, valid, threadIdx.x, page_bad);
      } else if (threadIdx.x < MxStage<BN>::kScaleChunks) {  // one run of rows: the aligned window
        const MxScaleWindow win = mx_scale_window(blk.rows.row(tok0, page_bad), valid, p.kv_scales_stride);
        staged_sc = load_scale_chunk(p.kv_scales, win.start + 16 * threadIdx.x, win.end);
      }
    }
  };
  auto store_tile = [&]() {
    constexpr int kPitch = kMx ? kMxRowBytes : RB;
#pragma unroll
    for (int k = 0; k < T::kCopiesPerThread; ++k) {
      const int idx = threadIdx.x + k * T::kThreads;
      if (T::kChunksPerTile % T::kThreads == 0 || idx < T::kChunksPerTile) {
        const int row = idx / T::kChunksPerRow, col = idx % T::kChunksPerRow;
        *reinterpret_cast<uint4*>(stage + row * kPitch + col * 16) = staged[k];
      }
    }
    if constexpr (kMx) {
      if (!blk.rows.template tile_contiguous<BN>())
        MxBytes::store(staged_sc, stage + MxStage<BN>::kDataBytes, p.kv_scales_stride, threadIdx.x);
      else if (threadIdx.x < MxStage<BN>::kScaleChunks)
        *reinterpret_cast<uint4*>(stage + MxStage<BN>::kDataBytes + 16 * threadIdx.x) = staged_sc;
    }
  };

  // O^T accumulators: [64-dim block][tile u]; tile u maps its row m to dim 4m + u of the
  // block, so lane (i, j) ends with dims 16j .. 16j+15 of each block for head i.
  f32x4 o[2][4];
#pragma unroll
  for (int blk = 0; blk < 2; ++blk)
#pragma unroll
    for (int u = 0; u < 4; ++u) o[blk][u] = f32x4{0.f, 0.f, 0.f, 0.f};
  float m = -INFINITY, l = 0.f;  // row i; l is this lane's share until the end

  if (ntiles > 0) load_tile(0);
  for (int it = 0; it < ntiles; ++it) {
    // bf16: every wave was done with tile it-1 at the barrier closing the last iteration;
    // mxfp4: the stage was last read by the dequantize of tile it-1 (barrier after it)
    store_tile();
    __syncthreads();
    if (it + 1 < ntiles) load_tile(it + 1);  // in flight while this tile is computed
    const int tok0 = tok_begin + it * BN, valid = tok_end - tok0;
    if constexpr (kMx) {
      mxfp4_stage_to_bf16<BN, T::kThreads>(stage, mx_scale_offset<BN>(blk.rows, tok0, p.kv_scales_stride, page_bad),
                                           p.kv_scales_stride, valid, smem + T::kStageBytes, RB, threadIdx.x);
      __syncthreads();  // the bf16 tile is complete
    }

    // ---- S^T partial over this wave's dims: A = K[token][dims], B = Q^T ------------------
    f32x4 s[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      s[mt] = f32x4{0.f, 0.f, 0.f, 0.f};
      const uint8_t* krow = tile + (16 * mt + i) * RB + 2 * d0;
#pragma unroll
      for (int c = 0; c < QP; ++c) {
        const uint4 k = *reinterpret_cast<const uint4*>(krow + 64 * c + 16 * j);
        mfma_k32(s[mt], bf16x4_of(k.x, k.y), bf16x4_of(k.z, k.w), qf[2 * c], qf[2 * c + 1]);
      }
      if constexpr (QC % 2) {
        const uint2 k = *reinterpret_cast<const uint2*>(krow + 64 * QP + 8 * j);
        mfma_k16(s[mt], bf16x4_of(k.x, k.y), qf[QC - 1]);
      }
    }

    softmax_tile<T, kEarly>(s, red, wave, lane, row_end - tok0, s_scale, m, l, o);

    // ---- O^T += V^T P^T over this wave's 128 dims, 32 tokens (two m16 tiles) a step ------
#pragma unroll
    for (int kc = 0; kc < MT / 2; ++kc) {
      const bf16x4 b_lo = f32x4_to_bf16x4(s[2 * kc][0], s[2 * kc][1], s[2 * kc][2], s[2 * kc][3]);
      const bf16x4 b_hi = f32x4_to_bf16x4(s[2 * kc + 1][0], s[2 * kc + 1][1], s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
      for (int blk = 0; blk < 2; ++blk) {
        const uint8_t* vcol = tile + (32 * kc + 4 * j) * RB + 2 * (wave * T::kVDimsPerWarp + blk * 64 + 4 * i);
        uint2 wl[4], wh[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          wl[r] = *reinterpret_cast<const uint2*>(vcol + r * RB);
          wh[r] = *reinterpret_cast<const uint2*>(vcol + (16 + r) * RB);
        }
        bf16x4 al[4], ah[4];
        transpose4x4_b16(wl, al);
        transpose4x4_b16(wh, ah);
#pragma unroll
        for (int u = 0; u < 4; ++u) mfma_k32(o[blk][u], al[u], ah[u], b_lo, b_hi);
      }
    }
    if constexpr (!kMx) __syncthreads();  // bf16: every wave is done reading the tile
  }

  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;
  write_result<T>(p, o, m, l, /*o_scale=*/1.f, blk.qr, bad, splits, wave, lane);
}

template <class T, class Shape>
MLAGEN_DEVICE void mla_decode_block(const Params& p) {  // entry.cuh: a code object's `<name>` entry
  extern __shared__ __attribute__((aligned(16))) uint8_t smem[];
  if constexpr (T::kNative)
    decode_fp8_native<T, Shape>(p, smem);
  else if constexpr (T::kWide)
    decode_wide<T, Shape>(p, smem);
  else
    decode_fp8<T, Shape>(p, smem);
}

}  // namespace mlagen::device
#endif  // MLAGEN_AMD
