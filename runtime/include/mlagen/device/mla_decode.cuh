// MLA decode attention, absorbed form, split-K with an online softmax.
//
// Per sequence b: its query rows (q_len tokens x num_heads heads, shapes.cuh QueryRows)
// attend over the sequence's KV rows (one shared 576-dim latent row per token; K = all 576
// dims, V = the first 512), causal among the query tokens:
//     out[row] = softmax(q[row] K^T * sm_scale) V      (512 a row)
//
// Work split: grid (splits x row groups, batch); a block owns 16 query rows. Block (s, b) streams its share of the sequence's
// tokens in tiles of kBlockN rows through a kStages-deep cp.async ring in shared memory.
// Each tile is read from global memory once and serves both products:
//   S = Q K^T : the block's 16 query rows are the MMA M dimension; warp w owns the 144 dims
//               [144w, 144w+144) of the inner product, the 4 partial S tiles are summed
//               through shared memory, and every warp then holds the whole S tile.
//   O += P V  : warp w owns the 128 output dims [128w, 128w+128).
// One body (decode_mma), the KV format a policy of it (formats.cuh says which format takes which):
//   MmaFp8Kv : KV bytes go to the tensor cores as f16 converted in registers (exact for
//              e4m3); the per-tensor KV scale and sm_scale are applied to S and O in fp32.
//   MmaWideKv: bf16 rows (bf16 KV as stored, or mxfp4 dequantized into a bf16 tile in
//              shared memory once per tile) feed bf16 MMAs through ldmatrix / ldmatrix.trans.
// The query is bf16, or fp8 with a per-tensor scale folded into S.
// With one split the block writes the bf16 output; otherwise it writes an unnormalized
// partial (O, running max m, running sum l) and combine_kernel merges the splits.
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/mla_decode_sm90_wgmma.cuh"
#include "mlagen/device/mla_decode_sm90_rows.cuh"

#if defined(MLAGEN_NVIDIA)
#include "facts.inc"  // generated (codegen/facts.py): MLAGEN_MAX_SPLITS, the in-launch merge's staging bound
namespace mlagen::device {

template <Body kBody_, int kBlockN_, int kStages_, KvFormat kKv_, QFormat kQ_>
struct Tiling : TileGeometry<kBlockN_, kStages_, /*warps=*/4> {
  using G = TileGeometry<kBlockN_, kStages_, 4>;
  static constexpr Body kBody = kBody_;  // named by the generator (codegen/spec.py KernelSpec.body)
  static constexpr KvFormat kKv = kKv_;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = Tiling<kBody_, kBlockN_, kStages_, kKv_, Q>;  // the same kernel for another q route
  // The warpgroup (wgmma) body walks KV in tiles of 64 tokens (mla_decode_sm90_wgmma.cuh, every
  // format a policy: WgKv); the mma.sync body in tiles of 32 (codegen/spec.py WARPGROUP_BLOCK_N /
  // WARPGROUP_KV, which choose the body, say the same).
  static constexpr bool kWarpgroup = kBody == Body::kSm90Wgmma;
  static constexpr bool kWide = kBody == Body::kMma && KvTraits<kKv>::kWide;  // MmaWideKv: bf16, or mxfp4 in tiles of 32
  static_assert(kBody == Body::kMma || kWarpgroup, "not an NVIDIA 16-row body");
  static_assert(kWarpgroup == (kBlockN_ == WgLayout<kStages_>::kBlockN), "the warpgroup bodies take tiles of 64, the mma.sync ones not");
  // the warpgroup body's tile layout (its format policy's); the mma body's tiles are its own (below)
  using Wg = std::conditional_t<kWarpgroup, WgTileLayout<kStages_, kKv_>, WgLayout<kStages_, kKv_>>;
  // What the combine multiplies a partial O by, besides the KV scale and 1 / l.
  static constexpr float kVUnit = kWide || kWarpgroup ? 1.f : kVDecodeScale;
  static constexpr int kNTiles = G::kBlockN / 8;  // n8 MMA tiles per KV tile
  // fp8 path: rows of 576 bytes (+16 pad, G::kRowBytes). Wide path: bf16 rows of 1152
  // bytes + 16 pad (73 x 16 bytes: the 8 rows an ldmatrix reads hit distinct banks).
  static constexpr int kWideRowBytes = 2 * kQkDim + 16;
  static constexpr int kRowBytes = kWide ? kWideRowBytes : G::kRowBytes;
  static constexpr int kChunksPerRow = KvTraits<kKv>::kRowDataBytes / 16;  // 16-byte copies a row
  static constexpr int kChunksPerTile = G::kBlockN * kChunksPerRow;
  static constexpr int kCopiesPerThread = (kChunksPerTile + G::kThreads - 1) / G::kThreads;
  static constexpr int kStageBytes = kKv == KvFormat::kMxfp4 ? MxStage<G::kBlockN>::kBytes : G::kBlockN * kRowBytes;
  static constexpr int kDecodedBytes = kKv == KvFormat::kMxfp4 ? G::kBlockN * kWideRowBytes : 0;
  static constexpr int kRedBytes = G::kWarps * kNTiles * MLAGEN_WARP_SIZE * 16;
  static constexpr int kThreads = kWarpgroup ? Wg::kThreads : G::kThreads;
  static constexpr int kSmemBytes =
      kWarpgroup ? Wg::kSmemBytes : G::kStages * kStageBytes + kDecodedBytes + kRedBytes;
  static constexpr int kMinBlocksPerSm = kSmemBytes <= 110 * 1024 ? 2 : 1;
  static_assert(G::kBlockN % 32 == 0, "kBlockN: multiple of 32 (ldmatrix.x4 takes 4 n8 tiles)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block: fewer stages");
};

// The 4 lanes of a quad (same g) hold parts of rows g and g+8: after this each has the sum.
MLAGEN_DEVICE void quad_sum(float (&v)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    v[r] += __shfl_xor(v[r], 1);
    v[r] += __shfl_xor(v[r], 2);
  }
}

// Sums the 4 warps' partial S tiles (same fragment layout in every warp), masks the columns
// past each row's last key (valid[r]: row g + 8r's keys in this tile) and takes the online-softmax step (log2 domain). On return s holds
// the unnormalized P, m / l are updated and alpha[r] rescales what row g + 8r accumulated.
template <class T, bool kRowsEndEarly>
MLAGEN_DEVICE void softmax_tile(float (&s)[T::kNTiles][4], float4* red, int warp, int lane, const int (&valid)[2],
                                float s_scale, float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  constexpr int NT = T::kNTiles, W = MLAGEN_WARP_SIZE;
  const int t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j) red[(warp * NT + j) * W + lane] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
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
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e & 1);
      const float v = col < valid[e >> 1] ? s[j][e] * s_scale : -INFINITY;
      s[j][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
  float lsum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor(mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor(mx[r], 2));
    alpha[r] = online_step<kRowsEndEarly>(m[r], mx[r]);
  }
  const float base[2] = {step_base<kRowsEndEarly>(m[0]), step_base<kRowsEndEarly>(m[1])};
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = fast_exp2(s[j][e] - base[e >> 1]);
      lsum[e >> 1] += s[j][e];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + lsum[r];
}

// ---- the mma.sync body: one skeleton, the KV format a policy --------------------------------
// A format policy (MmaFp8Kv, MmaWideKv) holds the block's query fragments and O accumulators and
// supplies the format's steps; decode_mma runs the phases every format shares: the block setup,
// the cp.async ring, the query, per tile the scores, the softmax step, the rescale and P V, and the
// epilogue. Both policies keep a lane's dims of rows g and g + 8 (g = lane / 4) and 144 QK dims /
// 128 V dims a warp.

// fp8 KV: the tile lands as stored (rows of 576 bytes + 16 pad). S takes K from the tile through
// ldmatrix, converted to f16 in registers (exact for e4m3), against q as f16 fragments whose k
// order inside each 16-dim chunk matches how K arrives (4 consecutive fp8 a lane): logical k 2t,
// 2t+1 <- dims 4t, 4t+1 and 2t+8, 2t+9 <- dims 4t+2, 4t+3. O += P V with V^T built in registers:
// lane (g,t) loads 4 bytes (dims 4g..4g+3 of a 32-dim group) of tokens 2t, 2t+1, 2t+8, 2t+9 and
// byte-transposes them; n8 tile j then maps its column g to dim 4g+j of the group. The KV scale and
// sm_scale are applied to S and O in fp32.
template <class T>
struct MmaFp8Kv {
  static constexpr int NT = T::kNTiles, C = T::kQkChunksPerWarp, W = MLAGEN_WARP_SIZE;
  static constexpr int kRowPitch = T::kRowBytes;
  float o[4][4][4];  // [32-dim group i][n8 tile j][fragment]: dims warp*128 + 32i + 8t .. +7 (see store)
  static constexpr int kQWords = 1;  // 4-dim q loads a row and chunk
  uint2 q_raw[C][2][kQWords];
  uint32_t qf[C][4];
  int q_shift = 0;  // a bf16 q beyond f16's range: f16_q_shift (this warp's slice)
  float s_unshift = 1.f, s_scale = 0.f, o_scale = 0.f;

  MLAGEN_DEVICE void clear() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[i][j][e] = 0.f;
  }
  static constexpr int kCopyUnroll = T::kCopiesPerThread;  // the tile's copies unrolled (decode_mma copy_tile)
  static constexpr bool kClampRows = false;
  // a lane's q words: dims 4t .. 4t+3 of each 16-dim chunk (the k order above)
  MLAGEN_DEVICE static int q_dim(int c16, int, int t) { return c16 + 4 * t; }
  template <class Shape>
  MLAGEN_DEVICE void setup_q(const Params& p, const BlockSetup<Shape>& blk) {
    const float kv_scale = kv_scale_of(p);
    o_scale = kv_scale * kVDecodeScale;  // per decoded V unit
    const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
    if constexpr (T::kQ == QFormat::kBf16) {
      float a = 0.f;
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int r = 0; r < 2; ++r) a = fmaxf(a, absmax4(q4_from_raw<T::kQ>(qq, q_raw[c][r][0])));
      q_shift = f16_q_shift(a);
    }
    const float q_mul = pow2i(-q_shift);
    s_unshift = pow2i(q_shift);
    s_scale = kv_scale * qq.scale * kKDecodeScale * p.sm_scale * kLog2e;  // log2 domain
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float4 v = q4_from_raw<T::kQ>(qq, q_raw[c][r][0]);
        qf[c][r] = pack_f16x2(v.x * q_mul, v.y * q_mul);
        qf[c][r + 2] = pack_f16x2(v.z * q_mul, v.w * q_mul);
      }
    }
  }
  // The tile the products read: the landed stage itself.
  template <class Rows>
  MLAGEN_DEVICE uint32_t operand_tile(uint32_t stage, uint8_t*, uint8_t*, const Params&, const Rows&, int, int, bool&) const {
    return stage;
  }
  // S partial over this warp's dims: B[k][n] = K[token n][dim k].
  MLAGEN_DEVICE void scores(float (&s)[NT][4], uint32_t tile, int warp, int lane) const {
    using namespace sm90;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int kbyte = (warp * C + c) * 16;
#pragma unroll
      for (int jj = 0; jj < NT / 4; ++jj) {
        uint32_t r[4];  // r[i] = K[token 8(4jj+i)+g][kbyte + 4t .. +3]
        ldmatrix_x4(r, tile + (jj * W + lane) * kRowPitch + kbyte);  // rows 8(4jj+i)+g
#pragma unroll
        for (int i = 0; i < 4; ++i) mma_f16_16816(s[jj * 4 + i], qf[c], k_lo_to_f16x2(r[i]), k_hi_to_f16x2(r[i]));
      }
    }
    if (q_shift) {  // warp-uniform, rare: this warp's q was scaled by 2^-q_shift
#pragma unroll
      for (int j = 0; j < NT; ++j) s[j][0] *= s_unshift, s[j][1] *= s_unshift, s[j][2] *= s_unshift, s[j][3] *= s_unshift;
    }
  }
  MLAGEN_DEVICE void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[i][j][0] *= alpha[0]; o[i][j][1] *= alpha[0];
        o[i][j][2] *= alpha[1]; o[i][j][3] *= alpha[1];
      }
  }
  // O += P V over this warp's 128 dims. P: the S accumulators of n8 tiles 2kc, 2kc+1 are the A
  // fragment of k-chunk kc.
  MLAGEN_DEVICE void accumulate(const float (&s)[NT][4], uint32_t tile, int warp, int g, int t) {
    using namespace sm90;
#pragma unroll
    for (int kc = 0; kc < T::kBlockN / 16; ++kc) {
      const uint32_t a[4] = {pack_f16x2(s[2 * kc][0], s[2 * kc][1]), pack_f16x2(s[2 * kc][2], s[2 * kc][3]),
                             pack_f16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                             pack_f16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
      const uint32_t row0 = tile + (16 * kc + 2 * t) * kRowPitch + warp * T::kVDimsPerWarp + 4 * g;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t w0 = lds32(row0 + i * 32), w1 = lds32(row0 + kRowPitch + i * 32);
        const uint32_t w2 = lds32(row0 + 8 * kRowPitch + i * 32), w3 = lds32(row0 + 9 * kRowPitch + i * 32);
        uint32_t v01[4], v23[4];  // [j]: dim 4g+j of tokens (2t, 2t+1) / (2t+8, 2t+9)
        v_pairs_to_f16x2(w0, w1, v01);
        v_pairs_to_f16x2(w2, w3, v23);
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_f16_16816(o[i][j], a, v01[j], v23[j]);
      }
    }
  }
  // Row g + 8r's results: lane (g,t) holds, for 32-dim group i, the 8 consecutive dims
  // warp*128 + 32i + 8t .. +7:  o[i][0..3][2r], o[i][0..3][2r + 1].
  template <class Dst>
  MLAGEN_DEVICE void store(const Dst& dst, int r, float inv, int warp, int t) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float v[8] = {o[i][0][2 * r] * inv,     o[i][1][2 * r] * inv,     o[i][2][2 * r] * inv,     o[i][3][2 * r] * inv,
                          o[i][0][2 * r + 1] * inv, o[i][1][2 * r + 1] * inv, o[i][2][2 * r + 1] * inv, o[i][3][2 * r + 1] * inv};
      dst.put(warp * T::kVDimsPerWarp + 32 * i + 8 * t, v);
    }
  }
};

// bf16 KV, and mxfp4 dequantized into a bf16 tile in shared memory once a tile (the stage holds the
// packed rows and a window of scale rows; `dec` the bf16 tile both products read): bf16 MMAs, S with
// B[k][n] = K[token n][dim k] straight from the bf16 rows by ldmatrix (q fragments in natural k
// order), O with B[k = token][n = dim] by ldmatrix.trans.
template <class T>
struct MmaWideKv {
  static constexpr int NT = T::kNTiles, C = T::kQkChunksPerWarp, BN = T::kBlockN;
  static constexpr bool kMx = T::kKv == KvFormat::kMxfp4;
  static constexpr int kRowPitch = kMx ? kMxRowBytes : T::kRowBytes;  // a stage's rows
  float o[16][4];  // n8 tile n: dims warp*128 + 8n + 2t, +1 of rows g ([0], [1]) and g+8 ([2], [3])
  static constexpr int kQWords = 2;
  uint2 q_raw[C][2][kQWords];
  uint32_t qf[C][4];
  float s_scale = 0.f, o_scale = 1.f;

  MLAGEN_DEVICE void clear() {
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  }
  // bf16 tiles are 18 copies a thread: a loop unrolled by 2 keeps 18 source pointers out of the
  // registers (unrolled, the kernel spilled at 255 registers)
  static constexpr int kCopyUnroll = 2;
  static constexpr bool kClampRows = true;
  // two 4-dim loads a row and chunk cover dims 2t..2t+1 and 2t+8..2t+9 (and their neighbours) of
  // each 16-dim chunk
  MLAGEN_DEVICE static int q_dim(int c16, int hl, int t) { return c16 + 8 * hl + 4 * (t >> 1); }
  // Q as bf16 A fragments, natural k order: a[0] = Q[g][2t, 2t+1], a[1] = Q[g+8][2t, 2t+1],
  // a[2] = Q[g][2t+8, 2t+9], a[3] = Q[g+8][2t+8, 2t+9] of each 16-dim chunk.
  template <class Shape>
  MLAGEN_DEVICE void setup_q(const Params& p, const BlockSetup<Shape>& blk) {
    const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
    s_scale = qq.scale * p.sm_scale * kLog2e;  // log2 domain
    const int t = threadIdx.x % MLAGEN_WARP_SIZE & 3;
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float4 lo = q4_from_raw<T::kQ>(qq, q_raw[c][r][0]);
        const float4 hi = q4_from_raw<T::kQ>(qq, q_raw[c][r][1]);
        const bool odd = t & 1;
        qf[c][r] = pack_bf16x2_rn(odd ? lo.z : lo.x, odd ? lo.w : lo.y);
        qf[c][r + 2] = pack_bf16x2_rn(odd ? hi.z : hi.x, odd ? hi.w : hi.y);
      }
    }
  }
  // The tile the products read: bf16 as landed; mxfp4 dequantized into `dec` by the block.
  template <class Rows>
  MLAGEN_DEVICE uint32_t operand_tile(uint32_t stage, uint8_t* stage_ptr, uint8_t* dec, const Params& p, const Rows& rows,
                                      int tok0, int valid_rows, bool& page_bad) const {
    if constexpr (kMx) {
      mxfp4_stage_to_bf16<BN, T::kThreads>(stage_ptr, mx_scale_offset<BN>(rows, tok0, p.kv_scales_stride, page_bad),
                                           p.kv_scales_stride, valid_rows, dec, T::kRowBytes, threadIdx.x);
      __syncthreads();  // the bf16 tile is complete
      return smem_addr(dec);
    } else {
      return stage;
    }
  }
  // ldmatrix.x4 matrices: (tokens 16jj+0..7 | 16jj+8..15) x (dims k..k+7 | k+8..k+15):
  // r[0], r[1] = b0, b1 of n8 tile 2jj; r[2], r[3] = b0, b1 of n8 tile 2jj+1.
  MLAGEN_DEVICE void scores(float (&s)[NT][4], uint32_t tile, int warp, int lane) const {
    using namespace sm90;
    const int mrow = lane & 7, msel = lane >> 3;  // ldmatrix: this lane's row of matrix msel
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int kdim = (warp * C + c) * 16;
#pragma unroll
      for (int jj = 0; jj < NT / 2; ++jj) {
        uint32_t r[4];
        ldmatrix_x4(r, tile + (16 * jj + 8 * (msel >> 1) + mrow) * T::kRowBytes + (kdim + 8 * (msel & 1)) * 2);
        mma_bf16_16816(s[2 * jj], qf[c], r[0], r[1]);
        mma_bf16_16816(s[2 * jj + 1], qf[c], r[2], r[3]);
      }
    }
  }
  MLAGEN_DEVICE void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
      o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
    }
  }
  // ldmatrix.x4.trans matrices: (tokens 16kc+0..7 | 16kc+8..15) x (dims d..d+7 | d+8..d+15):
  // r[0], r[1] = b0, b1 of the n8 tile at dim d; r[2], r[3] = those of dim d+8.
  MLAGEN_DEVICE void accumulate(const float (&s)[NT][4], uint32_t tile, int warp, int g, int t) {
    using namespace sm90;
    const int lane = 4 * g + t, mrow = lane & 7, msel = lane >> 3;
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      const uint32_t a[4] = {pack_bf16x2_rn(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2_rn(s[2 * kc][2], s[2 * kc][3]),
                             pack_bf16x2_rn(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                             pack_bf16x2_rn(s[2 * kc + 1][2], s[2 * kc + 1][3])};
      const uint32_t row = tile + (16 * kc + 8 * (msel & 1) + mrow) * T::kRowBytes;
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, row + (warp * T::kVDimsPerWarp + 16 * np + 8 * (msel >> 1)) * 2);
        mma_bf16_16816(o[2 * np], a, r[0], r[1]);
        mma_bf16_16816(o[2 * np + 1], a, r[2], r[3]);
      }
    }
  }
  template <class Dst>
  MLAGEN_DEVICE void store(const Dst& dst, int r, float inv, int warp, int t) const {
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      const float v[2] = {o[n][2 * r] * inv, o[n][2 * r + 1] * inv};
      dst.put(warp * T::kVDimsPerWarp + 8 * n + 2 * t, v);
    }
  }
};

template <class T>
using MmaKv = std::conditional_t<T::kKv == KvFormat::kFp8, MmaFp8Kv<T>, MmaWideKv<T>>;

// The copies of one tile into `dst` (the policy's row pitch), 16 bytes a copy, rows past tok_end
// zero-filled; the thread's copies unrolled by Kv::kCopyUnroll. A policy whose chunks do not divide
// over the threads guards the last copies; one that clamps reads a valid row's address for them.
template <class T, class Kv, class RowPtr>
MLAGEN_DEVICE void copy_tile(const Params& p, uint32_t dst, int tok0, int tok_end, RowPtr&& row_ptr) {
#pragma unroll Kv::kCopyUnroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int idx = threadIdx.x + i * T::kThreads;
    const int row = Kv::kClampRows ? min(idx / T::kChunksPerRow, T::kBlockN - 1) : idx / T::kChunksPerRow;
    const int col = idx % T::kChunksPerRow;
    const uint8_t* src = row_ptr(row);  // (every lane, before the guard: the paged form shuffles)
    if (T::kChunksPerTile % T::kThreads == 0 || idx < T::kChunksPerTile) {
      const bool ok = tok0 + row < tok_end;
      cp_async_16(dst + row * Kv::kRowPitch + col * 16, ok ? src + col * 16 : p.kv, ok);
    }
  }
}

// Block (split, row group, sequence): its 16 query rows over its share of the sequence's tokens in
// tiles of kBlockN through a kStages-deep cp.async ring; the 4 warps' S partials are summed through
// shared memory (softmax_tile), every warp then holds the whole S tile and accumulates its 128 V dims.
template <class T, class Shape>
MLAGEN_DEVICE void decode_mma(const Params& p, uint8_t* smem) {
  using namespace sm90;
  using Kv = MmaKv<T>;
  constexpr int BN = T::kBlockN, ST = T::kStages, NT = T::kNTiles, W = MLAGEN_WARP_SIZE;
  static_assert(W == 32, "mma.sync fragments are defined for 32-lane warps");
  const uint32_t smem_kv = smem_addr(smem);
  uint8_t* dec = smem + ST * T::kStageBytes;  // mxfp4: the dequantized bf16 tile (else empty)
  float4* red = reinterpret_cast<float4*>(dec + T::kDecodedBytes);

  const int warp = threadIdx.x / W, lane = threadIdx.x % W;
  const int g = lane >> 2, t = lane & 3;
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits, ntiles = blk.range.ntiles, tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;

  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  const bool per_row = !blk.rows.template tile_contiguous<BN>();  // pages shorter than a tile
  TileIds<BN> next_ids;  // then the next tile's page ids, one row a lane
  if (per_row) next_ids.load(blk.rows, tok_begin, tok_end, lane);

  // One run of rows (contiguous, or pages of a tile or more): one base a tile; else a row address
  // each (kv_rows.cuh issue_tile_rows; compile-time for all but the generic kernel).
  auto issue_tile = [&](int tile, int stage) {
    const int tok0 = tok_begin + tile * BN;
    const uint32_t dst = smem_kv + stage * T::kStageBytes;
    issue_tile_rows<BN>(p, blk.rows, per_row, next_ids, tok0, tok_end, tile + 1 < ntiles, lane, page_bad,
                        [&](auto row_ptr) { copy_tile<T, Kv>(p, dst, tok0, tok_end, row_ptr); });
    if constexpr (T::kKv == KvFormat::kMxfp4) {  // the scale rows of the tile's tokens, through an aligned window
      uint8_t* win = smem + stage * T::kStageBytes + MxStage<BN>::kDataBytes;
      if (blk.rows.template tile_contiguous<BN>())
        mx_issue_scale_window<BN, T::kThreads>(p.kv_scales, p.kv_scales_stride, p.total_kv, blk.rows.row(tok0, page_bad),
                                               min(BN, tok_end - tok0), dst + MxStage<BN>::kDataBytes, win, threadIdx.x);
      else
        mx_issue_scale_rows<BN, T::kThreads>(p.kv_scales, p.kv_scales_stride, blk.rows, tok0, min(BN, tok_end - tok0), win,
                                             threadIdx.x, page_bad);
    }
  };

  Kv kv;
  kv.clear();
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g+8

#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < ntiles) issue_tile(s, s);
    cp_async_commit();
  }
  // The query after the KV prologue; its words are loaded before an fp8 q quantized here waits
  // for its pre-pass (q is an input of the call, not a result of the pre-pass).
#pragma unroll
  for (int c = 0; c < T::kQkChunksPerWarp; ++c)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int hl = 0; hl < Kv::kQWords; ++hl)
        kv.q_raw[c][r][hl] = load_q4_raw<T::kQ>(p, blk.qr.token(g + 8 * r), blk.qr.head(g + 8 * r),
                                                Kv::q_dim((warp * T::kQkChunksPerWarp + c) * 16, hl, t));
  kv.setup_q(p, blk);

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<ST - 2>();
    __syncthreads();  // tile `it` landed for all; every warp is done with tile it-1
    if (it + ST - 1 < ntiles) issue_tile(it + ST - 1, (it + ST - 1) % ST);
    cp_async_commit();
    const int tok0 = tok_begin + it * BN;
    const uint32_t tile = kv.operand_tile(smem_kv + (it % ST) * T::kStageBytes, smem + (it % ST) * T::kStageBytes, dec, p,
                                          blk.rows, tok0, tok_end - tok0, page_bad);

    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    kv.scores(s, tile, warp, lane);

    float alpha[2];
    const int valid[2] = {min(tok_end, blk.qr.key_end(g)) - tok0, min(tok_end, blk.qr.key_end(g + 8)) - tok0};  // rows g, g + 8's keys
    softmax_tile<T, Shape::kRowsEndEarly>(s, red, warp, lane, valid, kv.s_scale, m, l, alpha);
    kv.rescale(alpha);
    kv.accumulate(s, tile, warp, g, t);
  }
  cp_async_wait<0>();
  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;

  quad_sum(l);

  write_rows(p, blk.qr, splits, [&](const auto& out) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      kv.store(out.row(g + 8 * r), r, out.scale(l[r], kv.o_scale, bad), warp, t);
      if (warp == 0 && t == 0) out.state(g + 8 * r, m[r], l[r], bad);
    }
  });
}

// The split merge inside the decode launch (Params::merge_in_launch; LaunchInfo merge_in_launch).
// The host sets it only for a grid it launches cooperatively, so every block is resident at once
// and a block may wait for its siblings: the S splits of a (sequence, row group) each arrive on
// the group's counter once their partials are written, wait for the S arrivals, merge a 1/S slice
// of the group's 16 rows x 512 dims (every split's partial of those dims, as the combine kernel
// does a row), and depart. The count reaches 2S only after every block has seen S, and that last
// departure sets it back to 0 for the next launch on the workspace (one stream at a time).
// The slice's partials (S x 2048 / S float4, whatever S: 32 KB) and the row group's S x 16 (m, l)
// are staged in the block's shared memory, free once the body is done, by cp.async in one go:
// one L2 round trip, not one a split group and piece (a loop of loads merged as they come was
// latency-bound: 4 us more than the decode at S = 2 and 32 alike).
// Ordering (as a cooperative grid barrier does it): the block's partial writes, the barrier, thread
// 0's fence (release, cumulative) and arrival; its acquire load of the count, the barrier, the
// block's copies (.cg: past L1). Inlined: a call took Params by value onto a 288-byte stack, whose
// every field the merge then read back through L1 (3-5 us more at the end of the kernel); ptxas
// keeps the bodies' loops without spills either way (tools/check_sm90.py).
constexpr int kMergeCols = kVDim / 4;                   // float4 pieces a row
constexpr int kMergePieces = kGroupRows * kMergeCols;   // a row group's
constexpr int kMergeSmemBytes = (kMergePieces + MLAGEN_MAX_SPLITS) * 16 + MLAGEN_MAX_SPLITS * kGroupRows * 8;
template <class T, class Shape>
MLAGEN_DEVICE void merge_in_launch(const Params& p) {
  static_assert(T::kSmemBytes >= kMergeSmemBytes + 128, "the in-launch merge stages a slice in the body's shared memory");
  extern __shared__ __align__(128) uint8_t smem[];
  const BlockCoord bc = block_coord<Shape>(p);
  const int splits = Shape::splits(p);
  uint32_t* const counter = p.split_counters + static_cast<int64_t>(bc.b) * Shape::row_groups(p) + bc.group;
  __syncthreads();  // every thread's partial writes issued (and the body done with shared memory)
  if (threadIdx.x == 0) {
    __threadfence();  // release at the GPU scope, cumulative over the block's writes the barrier ordered
    atomicAdd(counter, 1u);
    while (load_acquire_gpu(counter) < static_cast<uint32_t>(splits)) __nanosleep(32);
  }
  __syncthreads();
  const QueryTokens qt = Shape::query(p, bc.b);
  const QueryRows qr = query_rows<Shape>(p, BlockCoord{bc.b, 0, bc.group}, qt.row, qt.n, 0);  // split 0's rows
  const int64_t stride = static_cast<int64_t>(Shape::row_groups(p)) * kGroupRows;           // part rows a split
  const int begin = bc.split * kMergePieces / splits, n = (bc.split + 1) * kMergePieces / splits - begin;
  float4* const o_s = reinterpret_cast<float4*>(smem);                      // [split][n] this slice's pieces
  float2* const ml_s = reinterpret_cast<float2*>(smem + (kMergePieces + MLAGEN_MAX_SPLITS) * 16);  // [split][16 rows]
  for (int i = threadIdx.x; i < splits * n; i += T::kThreads) {
    const int sp = i / n, piece = begin + i % n;
    const int64_t row = qr.part(piece / kMergeCols) + sp * stride;
    cp_async_16_full(smem_addr(o_s + i), p.part_o + row * kVDim + 4 * (piece % kMergeCols));
  }
  for (int i = threadIdx.x; i < splits * (kGroupRows / 2); i += T::kThreads) {  // 16 bytes: two rows' (m, l)
    const int sp = i / (kGroupRows / 2), r = 2 * (i % (kGroupRows / 2));
    cp_async_16_full(smem_addr(ml_s + sp * kGroupRows + r), p.part_ml + qr.part(r) + sp * stride);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const float o_scale = merge_o_scale<T>(p);
  for (int k = threadIdx.x; k < n; k += T::kThreads) {
    const int j = (begin + k) / kMergeCols, dim = 4 * ((begin + k) % kMergeCols);
    if (!qr.owns(j)) continue;  // a padding row
    SplitMerge mg;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp = 0; sp < splits; ++sp) {
      float a, w;
      if (!mg.add(ml_s[sp * kGroupRows + j], a, w)) continue;  // no tokens: weight 0
      const float4 v = o_s[sp * n + k];
      acc.x = acc.x * a + w * v.x;
      acc.y = acc.y * a + w * v.y;
      acc.z = acc.z * a + w * v.z;
      acc.w = acc.w * a + w * v.w;
    }
    const float a4[4] = {acc.x, acc.y, acc.z, acc.w};
    store_merged(p, mg, o_scale, qr.token(j), qr.head(j), dim, a4, dim == 0);
  }
  __syncthreads();  // every thread's copies landed before the departure
  if (threadIdx.x == 0 && atomicAdd(counter, 1u) == 2u * splits - 1u) atomicExch(counter, 0u);
}

// A decode block (entry.cuh: a code object's `<name>` entry, __launch_bounds__(kThreads,
// kMinBlocksPerSm)). Split, it leaves its partials to the combine kernel or merges them with its
// siblings here (merge_in_launch).
template <class T, class Shape>
MLAGEN_DEVICE void mla_decode_block(const Params& p) {
  extern __shared__ __align__(128) uint8_t smem[];
  static_assert(!RowsBody<T>::value, "the rows body is mla_decode_rows_block (it takes the KV tensor maps too)");
  if constexpr (T::kBody == Body::kSm90Wgmma)
    decode_wgmma<T, Shape>(p, smem);
  else
    decode_mma<T, Shape>(p, smem);
  if (Shape::splits(p) > 1 && p.merge_in_launch) merge_in_launch<T, Shape>(p);
}

// The rows body's block: the KV tensor maps stay in parameter space (the entry's
// __grid_constant__ argument), where the bulk tensor copy reads them.
template <class T, class Shape>
MLAGEN_DEVICE void mla_decode_rows_block(const Params& p, const KvMaps& maps) {
  extern __shared__ __align__(128) uint8_t smem[];
  decode_rows<T, Shape>(p, maps, smem);
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
