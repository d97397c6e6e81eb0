// MLA decode attention, absorbed form, split-K with an online softmax.
//
// Per sequence b: 16 query heads q[b] (16 x 576) attend over the sequence's KV rows
// (one shared 576-dim latent row per token; K = all 576 dims, V = the first 512):
//     out[b] = softmax(q[b] K^T * sm_scale) V          (16 x 512)
//
// Work split: grid (splits, batch). Block (s, b) streams its share of the sequence's
// tokens in tiles of kBlockN rows through a kStages-deep cp.async ring in shared memory.
// Each tile is read from global memory once and serves both products:
//   S = Q K^T : the 16 heads are the MMA M dimension; warp w owns the 144 dims
//               [144w, 144w+144) of the inner product, the 4 partial S tiles are summed
//               through shared memory, and every warp then holds the whole S tile.
//   O += P V  : warp w owns the 128 output dims [128w, 128w+128).
// KV bytes go to the tensor cores as f16 converted in registers (exact for e4m3); the
// per-tensor KV scale and sm_scale are applied to S and O in fp32, never to the KV.
// With one split the block writes the bf16 output; otherwise it writes an unnormalized
// partial (O, running max m, running sum l) and combine_kernel merges the splits.
#pragma once
#include "mlagen/device/mla_common.cuh"

#if defined(MLAGEN_NVIDIA)
namespace mlagen::device {

template <int kBlockN_, int kStages_>
struct Tiling : TileGeometry<kBlockN_, kStages_, /*warps=*/4> {
  using G = TileGeometry<kBlockN_, kStages_, 4>;
  static constexpr int kCopiesPerThread = G::kChunksPerTile / G::kThreads;
  static constexpr int kNTiles = G::kBlockN / 8;  // n8 MMA tiles per KV tile
  static constexpr int kRedBytes = G::kWarps * kNTiles * MLAGEN_WARP_SIZE * 16;
  static constexpr int kSmemBytes = G::kStages * G::kStageBytes + kRedBytes;
  static constexpr int kMinBlocksPerSm = kSmemBytes <= 110 * 1024 ? 2 : 1;
  static_assert(G::kBlockN % 32 == 0, "kBlockN: multiple of 32 (ldmatrix.x4 takes 4 n8 tiles)");
  static_assert(G::kChunksPerTile % G::kThreads == 0, "tile copy must divide over the block");
};

template <class T, class Shape>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocksPerSm)
mla_decode_kernel(const Params p) {
  using namespace sm90;
  constexpr int BN = T::kBlockN, ST = T::kStages, NT = T::kNTiles;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_kv = smem_addr(smem);
  float4* red = reinterpret_cast<float4*>(smem + ST * T::kStageBytes);

  constexpr int W = MLAGEN_WARP_SIZE;  // 32 on NVIDIA; the fragment maps below assume it
  static_assert(W == 32, "mma.sync fragments are defined for 32-lane warps");
  const int warp = threadIdx.x / W, lane = threadIdx.x % W;
  const int g = lane >> 2, t = lane & 3;
  const int b = blockIdx.y, split = blockIdx.x;
  allow_dependent_launch();  // the combine grid may start now; it waits for our results
  const int splits = Shape::splits(p);

  const Sequence seq = Shape::sequence(p, b);
  const SplitRange range = split_range(seq.len, split, splits, BN);
  const int ntiles = range.ntiles, tok_begin = range.tok_begin, tok_end = range.tok_end;
  const uint8_t* kv = p.kv + seq.kv_begin * p.kv_stride_token;
  const float kv_scale = *p.kv_scale;
  const float s_scale = kv_scale * kKDecodeScale * p.sm_scale * kLog2e;  // log2 domain
  const float o_scale = kv_scale * kVDecodeScale;  // per decoded V unit

  // Q as f16 A fragments for this warp's 144 dims. The k order inside each 16-dim chunk
  // is permuted to match how K arrives (4 consecutive fp8 per lane, see below):
  // logical k 2t,2t+1 <- dims 4t,4t+1 and logical k 2t+8,2t+9 <- dims 4t+2,4t+3.
  uint32_t qf[T::kQkChunksPerWarp][4];
  {
    const uint16_t* q = p.q + seq.q_row * p.q_stride_token;
#pragma unroll
    for (int c = 0; c < T::kQkChunksPerWarp; ++c) {
      const int d = (warp * T::kQkChunksPerWarp + c) * 16 + 4 * t;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint2 v = *reinterpret_cast<const uint2*>(q + (g + 8 * r) * p.q_stride_head + d);
        qf[c][r] = pack_f16x2(bf16_lo(v.x), bf16_hi(v.x));
        qf[c][r + 2] = pack_f16x2(bf16_lo(v.y), bf16_hi(v.y));
      }
    }
  }

  auto issue_tile = [&](int tile, int stage) {
    const int tok0 = tok_begin + tile * BN;
    const uint32_t dst = smem_kv + stage * T::kStageBytes;
#pragma unroll
    for (int i = 0; i < T::kCopiesPerThread; ++i) {
      const int idx = threadIdx.x + i * T::kThreads;
      const int row = idx / T::kChunksPerRow, col = idx % T::kChunksPerRow;
      const bool ok = tok0 + row < tok_end;
      const uint8_t* src = kv + static_cast<int64_t>(ok ? tok0 + row : tok_begin) * p.kv_stride_token + col * 16;
      cp_async_16(dst + row * T::kRowBytes + col * 16, src, ok);
    }
  };

  float o[4][4][4];  // [32-dim group][n8 tile j][fragment]; see write_out for the dim map
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][j][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g+8

#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < ntiles) issue_tile(s, s);
    cp_async_commit();
  }

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // tile `it` landed for all; every warp is done with tile it-1
    if (it + ST - 1 < ntiles) issue_tile(it + ST - 1, (it + ST - 1) % ST);
    cp_async_commit();
    const uint32_t stage = smem_kv + (it % ST) * T::kStageBytes;

    // ---- S partial over this warp's dims: B[k][n] = K[token n][dim k] -------------------
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int c = 0; c < T::kQkChunksPerWarp; ++c) {
      const int kbyte = (warp * T::kQkChunksPerWarp + c) * 16;
#pragma unroll
      for (int jj = 0; jj < NT / 4; ++jj) {
        uint32_t r[4];  // r[i] = K[token 8(4jj+i)+g][kbyte + 4t .. +3]
        ldmatrix_x4(r, stage + (jj * W + lane) * T::kRowBytes + kbyte);  // rows 8(4jj+i)+g
#pragma unroll
        for (int i = 0; i < 4; ++i)
          mma_f16_16816(s[jj * 4 + i], qf[c], k_lo_to_f16x2(r[i]), k_hi_to_f16x2(r[i]));
      }
    }

    // ---- sum the 4 warps' partials: same fragment layout in every warp ------------------
#pragma unroll
    for (int j = 0; j < NT; ++j)
      red[(warp * NT + j) * W + lane] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float4 a = red[j * W + lane];
#pragma unroll
      for (int w = 1; w < T::kWarps; ++w) {
        const float4 v = red[(w * NT + j) * W + lane];
        a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
      }
      s[j][0] = a.x; s[j][1] = a.y; s[j][2] = a.z; s[j][3] = a.w;
    }

    // ---- online softmax (log2 domain); columns past the sequence end are masked ---------
    const int valid = tok_end - (tok_begin + it * BN);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * j + 2 * t + (e & 1);
        const float v = col < valid ? s[j][e] * s_scale : -INFINITY;
        s[j][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2], lsum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor(mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor(mx[r], 2));
      alpha[r] = online_max_update(m[r], mx[r]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = fast_exp2(s[j][e] - m[e >> 1]);
        lsum[e >> 1] += s[j][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + lsum[r];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[i][j][0] *= alpha[0]; o[i][j][1] *= alpha[0];
        o[i][j][2] *= alpha[1]; o[i][j][3] *= alpha[1];
      }

    // ---- O += P V over this warp's 128 dims -----------------------------------------------
    // P: the S accumulators of n8 tiles 2kc, 2kc+1 are the A fragment of k-chunk kc.
    // V: B[k = token][n = dim]. Lane (g,t) loads 4 bytes (dims 4g..4g+3 of a 32-dim group)
    // of tokens 2t, 2t+1, 2t+8, 2t+9 and byte-transposes them; n8 tile j then maps its
    // column g to dim 4g+j of the group.
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      const uint32_t a[4] = {pack_f16x2(s[2 * kc][0], s[2 * kc][1]), pack_f16x2(s[2 * kc][2], s[2 * kc][3]),
                             pack_f16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                             pack_f16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
      const uint32_t row0 = stage + (16 * kc + 2 * t) * T::kRowBytes + warp * T::kVDimsPerWarp + 4 * g;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w0 = lds32(row0 + i * 32), w1 = lds32(row0 + T::kRowBytes + i * 32);
        const uint32_t w2 = lds32(row0 + 8 * T::kRowBytes + i * 32), w3 = lds32(row0 + 9 * T::kRowBytes + i * 32);
        uint32_t v01[4], v23[4];  // [j]: dim 4g+j of tokens (2t, 2t+1) / (2t+8, 2t+9)
        v_pairs_to_f16x2(w0, w1, v01);
        v_pairs_to_f16x2(w2, w3, v23);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_f16_16816(o[i][j], a, v01[j], v23[j]);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor(l[r], 1);
    l[r] += __shfl_xor(l[r], 2);
  }

  // Lane (g,t) holds, for rows g and g+8 and 32-dim group i, the 8 consecutive dims
  // warp*128 + 32i + 8t .. +7:  o[i][0..3][0], o[i][0..3][1]  (row g; [2],[3] for g+8).
  if (splits == 1) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float inv = out_scale(l[r], o_scale, seq.bad);
      uint16_t* out = p.out + seq.q_row * p.out_stride_token + (g + 8 * r) * p.out_stride_head;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = warp * T::kVDimsPerWarp + 32 * i + 8 * t;
        uint4 v;
        v.x = pack_bf16x2(o[i][0][2 * r] * inv, o[i][1][2 * r] * inv);
        v.y = pack_bf16x2(o[i][2][2 * r] * inv, o[i][3][2 * r] * inv);
        v.z = pack_bf16x2(o[i][0][2 * r + 1] * inv, o[i][1][2 * r + 1] * inv);
        v.w = pack_bf16x2(o[i][2][2 * r + 1] * inv, o[i][3][2 * r + 1] * inv);
        *reinterpret_cast<uint4*>(out + d) = v;
      }
    }
  } else {
    const int64_t slot = static_cast<int64_t>(b) * splits + split;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* po = p.part_o + (slot * kHeads + g + 8 * r) * kVDim;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int d = warp * T::kVDimsPerWarp + 32 * i + 8 * t;
        *reinterpret_cast<float4*>(po + d) = make_float4(o[i][0][2 * r], o[i][1][2 * r], o[i][2][2 * r], o[i][3][2 * r]);
        *reinterpret_cast<float4*>(po + d + 4) =
            make_float4(o[i][0][2 * r + 1], o[i][1][2 * r + 1], o[i][2][2 * r + 1], o[i][3][2 * r + 1]);
      }
      if (warp == 0 && t == 0)
        p.part_ml[slot * kHeads + g + 8 * r] = split_state(m[r], l[r], seq.bad);
    }
  }
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
