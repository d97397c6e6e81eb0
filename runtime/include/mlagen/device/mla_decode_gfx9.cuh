// MLA decode attention on AMD CDNA (gfx942, gfx950): the same algorithm as the NVIDIA
// kernel (mla_decode.cuh), on MFMA with 64-lane wavefronts.
//
// Block (split, sequence) = 4 waves. Each KV tile of kBlockN tokens is read from global
// memory once into LDS and serves both products:
//   S^T = K Q^T : tokens are the MFMA M dimension, the 16 heads N; wave w owns the 144
//                 dims [144w, 144w+144) of the inner product and the 4 partial tiles are
//                 summed through LDS (layout-agnostic: every wave has the same layout).
//   O^T += V^T P^T : wave w owns the 128 output dims [128w, 128w+128). The S^T
//                 accumulator layout (lane (i,j) holds tokens 4j..4j+3 of head i) is
//                 exactly the P^T B-operand layout, so P never leaves registers.
// MFMA on AMD has no fp8 x f16 form, so K and V bytes are decoded to f16 in registers
// (exact), with the arch's fp8 flavour (gfx942 e4m3fnuz, gfx950 e4m3fn). Split-range,
// online-softmax and combine formulas come from mla_common.cuh.
//
// Pipeline (v1): a tile is loaded into registers while the previous one is computed
// from LDS, then stored to the other LDS buffer (2 buffers; kStages must be 2).
#pragma once
#include "mlagen/device/mla_common.cuh"

#if defined(MLAGEN_AMD)
namespace mlagen::device {

template <int kBlockN_, int kStages_>
struct Tiling : TileGeometry<kBlockN_, kStages_, /*waves=*/4> {
  using G = TileGeometry<kBlockN_, kStages_, 4>;
  static constexpr int kCopiesPerThread = (G::kChunksPerTile + G::kThreads - 1) / G::kThreads;
  static constexpr int kMTiles = G::kBlockN / 16;  // m16 MFMA tiles per KV tile
  static constexpr int kRedBytes = G::kWarps * kMTiles * MLAGEN_WARP_SIZE * 16;
  static constexpr int kSmemBytes = 2 * G::kStageBytes + kRedBytes;
  static constexpr int kMinBlocksPerSm = 1;
  static_assert(MLAGEN_WARP_SIZE == 64, "gfx9 kernel: 64-lane wavefronts");
  static_assert(G::kStages == 2, "gfx9 kernel v1: register-staged double buffering (stages = 2)");
  static_assert(G::kBlockN % 32 == 0, "kBlockN: pairs of m16 tiles feed the k32 PV MFMA");
  static_assert(kSmemBytes <= gfx9::kLdsBytes, "LDS over the arch's limit: smaller block_n");
};

template <class T, class Shape>
__global__ void __launch_bounds__(T::kThreads) mla_decode_kernel(const Params p) {
  using namespace gfx9;
  constexpr int BN = T::kBlockN, MT = T::kMTiles, QC = T::kQkChunksPerWarp;
  extern __shared__ __attribute__((aligned(16))) uint8_t smem[];
  f32x4* red = reinterpret_cast<f32x4*>(smem + 2 * T::kStageBytes);

  const int wave = threadIdx.x / MLAGEN_WARP_SIZE, lane = threadIdx.x % MLAGEN_WARP_SIZE;
  const int i = lane & 15, j = lane >> 4;  // MFMA lane coordinates
  const int b = blockIdx.y, split = blockIdx.x;
  const int splits = Shape::splits(p);
  const Sequence seq = Shape::sequence(p, b);
  const SplitRange range = split_range(seq.len, split, splits, BN);
  const int ntiles = range.ntiles, tok_begin = range.tok_begin, tok_end = range.tok_end;
  const uint8_t* kv = p.kv + seq.kv_begin * p.kv_stride_token;
  const float kv_scale = *p.kv_scale;
  const float s_scale = kv_scale * kKDecodeScale * p.sm_scale * kLog2e;  // log2 domain
  const float o_scale = kv_scale * kVDecodeScale;

  // Q^T as the B operand of S^T = K Q^T: lane (i, j) holds head i, dims 4j..4j+3 of each
  // of this wave's 16-dim chunks.
  f16x4 qf[QC];
  {
    const uint16_t* q = p.q + seq.q_row * p.q_stride_token + i * p.q_stride_head;
#pragma unroll
    for (int c = 0; c < QC; ++c) {
      const uint2 v = *reinterpret_cast<const uint2*>(q + (wave * QC + c) * 16 + 4 * j);
      qf[c] = f32x4_to_f16x4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
    }
  }

  uint4 staged[T::kCopiesPerThread];
  auto load_tile = [&](int tile) {
    const int tok0 = tok_begin + tile * BN;
#pragma unroll
    for (int k = 0; k < T::kCopiesPerThread; ++k) {
      const int idx = threadIdx.x + k * T::kThreads;
      const int row = idx / T::kChunksPerRow, col = idx % T::kChunksPerRow;
      const bool ok = idx < T::kChunksPerTile && tok0 + row < tok_end;
      staged[k] = ok ? *reinterpret_cast<const uint4*>(kv + static_cast<int64_t>(tok0 + row) * p.kv_stride_token +
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
  float m = -INFINITY, l = 0.f;  // head i; l is this lane's share until the end

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

    // ---- sum the 4 waves' partials --------------------------------------------------------
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) red[(wave * MT + mt) * MLAGEN_WARP_SIZE + lane] = s[mt];
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      f32x4 a = red[mt * MLAGEN_WARP_SIZE + lane];
#pragma unroll
      for (int w = 1; w < T::kWarps; ++w) a += red[(w * MT + mt) * MLAGEN_WARP_SIZE + lane];
      s[mt] = a;
    }

    // ---- online softmax over tokens for head i (lanes i, i+16, i+32, i+48 share it) -------
    const int valid = tok_end - (tok_begin + it * BN);
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
    const float alpha = online_max_update(m, mx);
    float lsum = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        s[mt][r] = fast_exp2(s[mt][r] - m);
        lsum += s[mt][r];
      }
    l = l * alpha + lsum;
#pragma unroll
    for (int blk = 0; blk < 2; ++blk)
#pragma unroll
      for (int u = 0; u < 4; ++u) o[blk][u] *= alpha;

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

  l += __shfl_xor(l, 16);
  l += __shfl_xor(l, 32);

  // Lane (i, j) holds head i, dims wave*128 + 64*blk + 16j + (4r + u) = o[blk][u][r].
  if (splits == 1) {
    const float inv = out_scale(l, o_scale, seq.bad);
    uint16_t* out = p.out + seq.q_row * p.out_stride_token + i * p.out_stride_head + wave * T::kVDimsPerWarp + 16 * j;
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
    const int64_t slot = static_cast<int64_t>(b) * splits + split;
    float* po = p.part_o + (slot * kHeads + i) * kVDim + wave * T::kVDimsPerWarp + 16 * j;
#pragma unroll
    for (int blk = 0; blk < 2; ++blk)
#pragma unroll
      for (int e = 0; e < 16; e += 4)
        *reinterpret_cast<float4*>(po + 64 * blk + e) =
            make_float4(o[blk][0][e / 4], o[blk][1][e / 4], o[blk][2][e / 4], o[blk][3][e / 4]);
    if (wave == 0 && j == 0) p.part_ml[slot * kHeads + i] = split_state(m, l, seq.bad);
  }
}

}  // namespace mlagen::device
#endif  // MLAGEN_AMD
