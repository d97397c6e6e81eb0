// MLA decode on gfx950 (MI355X) with fp8 KV on the native fp8 datapath: nothing dequantized.
//
//   S^T = K Q^T    : v_mfma_f32_16x16x128_f8f6f4 over the 512 latent dims (4 a 16-token
//                    tile) + v_mfma_f32_16x16x32_fp8_fp8 over the 64 rope dims (2), tokens as
//                    M, heads as N. K comes from LDS as stored; q is fp8 (bf16 q quantized
//                    here per head, see below).
//   O^T += V^T P^T : v_mfma_f32_16x16x32_fp8_fp8, 32 tokens a step: P rounded to e4m3, V the
//                    first 512 bytes of the same K rows in LDS, byte-transposed in registers.
//
// Work split: a block (4 waves) owns a split of one sequence's row group (16 query rows,
// shapes.cuh QueryRows: tokens x heads, causal among the tokens); the split's 32-token tiles go
// to the waves round robin (tile k of the split to wave k % 4) and each wave runs the whole
// algorithm on its own tiles: its own LDS stages, its own online softmax (m, l), its own O
// (16 rows x 512 dims, 128 fp32 a lane). No cross-wave reduction per tile and no barrier
// in the loop; the 4 waves merge once at the end through LDS.
//
// Loads: each tile (32 rows x 576 B = 18 KB) goes global -> LDS by 18 global_load_lds_dwordx4
// (lane l of instruction n carries bytes [1024 n + 16 l, +16) of the tile, rows unpadded),
// two stages a wave, issued and computed in pairs (see the loop). Rows past the split's end
// are fetched as the last valid row again (finite data that P = 0 masks): no lane branches.
// Rows come through kv_rows.cuh (contiguous or paged; a tile within one page is one run of
// rows, shorter pages take issue_tile's per-row route).
//
// Softmax: log2 domain, lazy rescale: the running max m moves only when a tile's max exceeds
// it by more than kLazyLog2 (wave-uniform test), so O (128 registers) is rescaled a handful of
// times a sequence instead of every tile. P = 2^(s - m) <= 2^kLazyLog2 then fits e4m3 (448).
//
// Splits > 1: each split leaves (O, m, l) in the workspace and the last split of a (sequence,
// row group) to finish (an atomic counter per pair, reset by that block) merges them: one launch.
//
// Query recipe (bf16 q): per query row (token, head), q8 = RNE_e4m3(q * 448 / amax_h), amax_h =
// max |q| over the row's 576 dims, S multiplied back by amax_h / 448 (finer than the reference's
// per-tensor scale). fp8 q given with its per-tensor scale is used as it is; kFp8FromBf16 applies the
// per-tensor recipe of the reference (formats.cuh q_setup).
#pragma once
#include "mlagen/device/formats.cuh"

#if defined(MLAGEN_AMD)
namespace mlagen::device {

template <KvFormat kKv_, QFormat kQ_>
struct NativeFp8Tiling {
  static_assert(kKv_ == KvFormat::kFp8, "the native fp8 kernel reads fp8 KV");
  static constexpr KvFormat kKv = kKv_;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = NativeFp8Tiling<kKv_, Q>;
  static constexpr Body kBody = Body::kGfx950Fp8;  // the tiling is the body's (codegen/spec.py KernelSpec.body)
  static constexpr bool kWide = false;
  static constexpr bool kFusedCombine = true;  // no _combine entry (codegen/spec.py merges_own_splits)
  static constexpr float kVUnit = 1.f;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * MLAGEN_WARP_SIZE;
  static constexpr int kBlockN = 32;   // tokens a wave's tile
  static constexpr int kStages = 2;    // LDS stages a wave
  static constexpr int kTileBytes = kBlockN * kQkDim;     // 18432, rows unpadded
  static constexpr int kDmaPerTile = kTileBytes / 1024;   // 18 wave-wide 16-byte DMAs
  static constexpr int kStagesBytes = kWarps * kStages * kTileBytes;
  static constexpr int kMergeBytes = 2 * kGroupRows * kVDim * 4;  // two waves' O a stage array, after the loop
  static constexpr int kMlBytes = kWarps * kGroupRows * 8;
  // LDS is static (native_fp8::lds_stage0/1/ml below), not the launch's dynamic allocation:
  // two distinct LDS objects let the compiler's wait-count pass see that a DMA into one
  // stage does not alias reads of the other (one array: it waits for every DMA in flight).
  static constexpr int kSmemBytes = 0;
  static constexpr float kLazyLog2 = 8.f;
  static_assert(kTileBytes % 1024 == 0, "whole DMAs a tile");
  static_assert(kMergeBytes <= kStagesBytes / 2, "the merge reuses the stages");
  static_assert(kStagesBytes + kMlBytes + 16 <= 160 * 1024, "gfx950 LDS");
};

// Token of row m of a 16-token MFMA tile: lane i of the K operand reads token pi(i), so the
// S^T row 4j + r that lane (i, j) holds is token 4r + j, and the V^T reads of the 4 lane
// groups j fall on consecutive rows (576 B apart: different LDS banks).
MLAGEN_DEVICE constexpr int k_row_token(int m) { return (m % 4) * 4 + m / 4; }

#if defined(__gfx950__)
namespace native_fp8 {
using namespace gfx9;
using Tl = NativeFp8Tiling<KvFormat::kFp8, QFormat::kBf16>;  // the geometry (q-independent)
// stage s of wave w at lds_stage<s> + w * kTileBytes; after the loop waves 0, 1 put their O in
// lds_stage0 and waves 2, 3 in lds_stage1
static __shared__ __attribute__((aligned(128))) uint8_t lds_stage0[Tl::kWarps * Tl::kTileBytes];
static __shared__ __attribute__((aligned(128))) uint8_t lds_stage1[Tl::kWarps * Tl::kTileBytes];
static __shared__ __attribute__((aligned(16))) uint8_t lds_ml[Tl::kMlBytes + 16];

// Issues tile `tok0` (rows tok0 .. tok0 + 31, those >= tok_end fetched as row tok_end - 1)
// into `stage`, token t's row at kv + t * stride: kDmaPerTile instructions, lane l of
// instruction n carrying chunk 64 n + l.
template <class T>
MLAGEN_DEVICE void issue_rows(const uint8_t* kv, int64_t stride, int tok0, int tok_end, uint8_t* stage, int lane) {
  if (stride == kQkDim && tok_end - tok0 >= T::kBlockN) {  // contiguous full tile: one linear copy
    const uint8_t* src = kv + static_cast<int64_t>(tok0) * kQkDim + 16 * lane;
#pragma unroll
    for (int n = 0; n < T::kDmaPerTile; ++n) lds_dma16(src + 1024 * n, stage + 1024 * n);
  } else {
#pragma unroll
    for (int n = 0; n < T::kDmaPerTile; ++n) {
      const int c = 64 * n + lane, row = c / (kQkDim / 16), col = c - row * (kQkDim / 16);
      const int tok = min(tok0 + row, tok_end - 1);
      lds_dma16(kv + static_cast<int64_t>(tok) * stride + 16 * col, stage + 1024 * n);
    }
  }
}

// The tile through kv_rows.cuh, wave-uniform routes: contiguous KV is issue_rows from the
// sequence's first row `kv` (the route before paging: the contiguous kernels compile nothing
// else); a tile within one page (pages of >= 32 rows) is issue_rows from the tile's first row;
// pages shorter than the tile look each row up.
template <class T, class Rows>
MLAGEN_DEVICE void issue_tile(const Rows& rows, const uint8_t* kv, int64_t stride, int tok0, int tok_end,
                              uint8_t* stage, int lane, bool& bad) {
  if (!rows.paged()) return issue_rows<T>(kv, stride, tok0, tok_end, stage, lane);
  if (rows.template tile_contiguous<T::kBlockN>())
    return issue_rows<T>(rows.ptr(tok0, bad), stride, 0, tok_end - tok0, stage, lane);
#pragma unroll
  for (int n = 0; n < T::kDmaPerTile; ++n) {
    const int c = 64 * n + lane, row = c / (kQkDim / 16), col = c - row * (kQkDim / 16);
    lds_dma16(rows.ptr(min(tok0 + row, tok_end - 1), bad) + 16 * col, stage + 1024 * n);
  }
}

struct QOperands {
  i32x8 nope[4];     // query row i, dims 128c + 32j .. + 31
  uint64_t rope[2];  // query row i, dims 512 + 32c + 8j .. + 7
  float s_scale;     // what S of row i is multiplied by (log2 domain)
};

// Lane (i, j)'s part of query row i: q[tok][head] (QueryRows::token / head of row i).
template <class T>
MLAGEN_DEVICE QOperands load_q(const Params& p, const QQuant& qq, int64_t tok, int head, int j, float kv_scale) {
  float4 v[36];
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) v[8 * c + e] = load_q4<T::kQ>(p, qq, tok, head, 128 * c + 32 * j + 4 * e);
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int e = 0; e < 2; ++e) v[32 + 2 * c + e] = load_q4<T::kQ>(p, qq, tok, head, 512 + 32 * c + 8 * j + 4 * e);
  float head_scale = 1.f, inv = 1.f;  // fp8 routes: v is already on the e4m3 grid
  if constexpr (T::kQ == QFormat::kBf16) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < 36; ++k)
      a = nan_max(a, nan_max(nan_max(fabsf(v[k].x), fabsf(v[k].y)), nan_max(fabsf(v[k].z), fabsf(v[k].w))));
    a = nan_max(a, __shfl_xor(a, 16));
    a = nan_max(a, __shfl_xor(a, 32));
    // a NaN in q makes the head's scale NaN and its output NaN; an all-zero head keeps scale 1
    head_scale = a > 0.f || a != a ? a / kFp8Max : 1.f;
    inv = a > 0.f ? kFp8Max / a : 1.f;
  }
  auto q8 = [&](float4 x) {
    auto c = [&](float y) { return fminf(fmaxf(y * inv, -kFp8Max), kFp8Max); };
    return pack_fp8x4(c(x.x), c(x.y), c(x.z), c(x.w));
  };
  QOperands q;
#pragma unroll
  for (int c = 0; c < 4; ++c)
#pragma unroll
    for (int e = 0; e < 8; ++e) q.nope[c][e] = static_cast<int>(q8(v[8 * c + e]));
#pragma unroll
  for (int c = 0; c < 2; ++c)
    q.rope[c] = q8(v[32 + 2 * c]) | static_cast<uint64_t>(q8(v[33 + 2 * c])) << 32;
  q.s_scale = head_scale * qq.scale * kv_scale * p.sm_scale * kLog2e;
  return q;
}

// One wave's running state: O^T tiles o[blk][u] (lane (i, j): head i, dims
// 64 blk + 16 j + 4 r + u = o[blk][u][r]), the running max m and this lane's share of l.
struct WaveState {
  f32x4 o[8][4];
  float m, l;
};

// S^T of one 32-token tile in `stage`: s[mt] = rows 16 mt .. 16 mt + 15 (lane (i, j): head i,
// tokens 16 mt + 4 r + j).
MLAGEN_DEVICE void scores(const uint8_t* stage, const QOperands& q, int i, int j, f32x4 (&s)[2]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    s[mt] = f32x4{0.f, 0.f, 0.f, 0.f};
    const uint8_t* krow = stage + (16 * mt + k_row_token(i)) * kQkDim;
#pragma unroll
    for (int c = 0; c < 4; ++c) mfma_fp8_k128(s[mt], *reinterpret_cast<const i32x8*>(krow + 128 * c + 32 * j), q.nope[c]);
#pragma unroll
    for (int c = 0; c < 2; ++c) mfma_fp8_k32(s[mt], *reinterpret_cast<const uint64_t*>(krow + 512 + 32 * c + 8 * j), q.rope[c]);
  }
}

// Online softmax over the tile (tokens >= valid masked: this lane's row's keys in the tile),
// then P^T as the PV B operand: byte e < 4 = token 4e + j, byte e >= 4 = token 16 + 4(e - 4) + j,
// row i. kEarly (Shape::kRowsEndEarly): a row may have seen no key yet (m = -inf, every score -inf):
// its alpha is 1 and its P 0 (step_base), not NaN.
template <class T, bool kEarly>
MLAGEN_DEVICE uint64_t softmax_step(f32x4 (&s)[2], float s_scale, int valid, int j, WaveState& w) {
  const float mx = scaled_masked_max(s, s_scale, valid, [j](int mt, int r) { return 16 * mt + 4 * r + j; });
  if (wave_any(mx > w.m + T::kLazyLog2)) {  // rare after the first tile
    const float alpha = online_step<kEarly>(w.m, mx);
    w.l *= alpha;
#pragma unroll
    for (int blk = 0; blk < 8; ++blk)
#pragma unroll
      for (int u = 0; u < 4; ++u) w.o[blk][u] *= alpha;
  }
  const float base = step_base<kEarly>(w.m);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      s[mt][r] = fast_exp2(s[mt][r] - base);
      w.l += s[mt][r];
    }
  return pack_fp8x4(s[0][0], s[0][1], s[0][2], s[0][3]) |
         static_cast<uint64_t>(pack_fp8x4(s[1][0], s[1][1], s[1][2], s[1][3])) << 32;
}

// O^T += V^T P^T over the tile: for each 64-dim block, lane (i, j) reads dims 4i .. 4i+3 of
// its 8 tokens (ds_read_b32 each) and byte-transposes them into the A operands of 4 MFMAs.
MLAGEN_DEVICE void accumulate_pv(const uint8_t* stage, uint64_t pb, int i, int j, WaveState& w) {
#pragma unroll
  for (int blk = 0; blk < 8; ++blk) {
    const uint8_t* vcol = stage + j * kQkDim + 64 * blk + 4 * i;
    uint32_t wl[4], wh[4], tl[4], th[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      wl[e] = lds32(vcol + 4 * e * kQkDim);
      wh[e] = lds32(vcol + (16 + 4 * e) * kQkDim);
    }
    transpose4x4(wl, tl);
    transpose4x4(wh, th);
#pragma unroll
    for (int u = 0; u < 4; ++u) mfma_fp8_k32(w.o[blk][u], tl[u] | static_cast<uint64_t>(th[u]) << 32, pb);
  }
}

// Merges the splits' partials of one query row, dims d0 .. d0 + 31 (SplitMerge, as
// mla_combine_block does) and writes the bf16 row at (tok, head); the thread of dims 0 .. 31
// writes the LSE. Split s's partial row is part0 + s * stride (QueryRows::part of split 0, and
// the part rows a split holds: row_groups * 16).
MLAGEN_DEVICE void merge_splits(const Params& p, int splits, int64_t part0, int64_t stride, int64_t tok, int head,
                                int d0, float o_scale) {
  SplitMerge mg;
  float acc[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) acc[e] = 0.f;
  for (int s = 0; s < splits; ++s) {
    float a, wgt;
    const int64_t at = part0 + s * stride;
    if (!mg.add(p.part_ml[at], a, wgt)) continue;  // no tokens: weight 0
    const float4* po = reinterpret_cast<const float4*>(p.part_o + at * kVDim + d0);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float4 v = po[q];
      acc[4 * q + 0] = acc[4 * q + 0] * a + wgt * v.x;
      acc[4 * q + 1] = acc[4 * q + 1] * a + wgt * v.y;
      acc[4 * q + 2] = acc[4 * q + 2] * a + wgt * v.z;
      acc[4 * q + 3] = acc[4 * q + 3] * a + wgt * v.w;
    }
  }
  store_merged(p, mg, o_scale, tok, head, d0, acc, d0 == 0);
}
}  // namespace native_fp8
#endif  // __gfx950__

template <class T, class Shape>
MLAGEN_DEVICE void decode_fp8_native(const Params& p, uint8_t* /*smem: unused, static LDS*/) {
#if defined(__gfx950__)
  using namespace gfx9;
  using namespace native_fp8;
  constexpr int W = T::kWarps, BN = T::kBlockN;
  const int wave = threadIdx.x / MLAGEN_WARP_SIZE, lane = threadIdx.x % MLAGEN_WARP_SIZE;
  const int i = lane & 15, j = lane >> 4;  // MFMA lane coordinates: query row i of the block
  constexpr bool kEarly = Shape::kRowsEndEarly;  // causal rows that may see no key of a tile
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits;
  const int b = blk.bc.b, split = blk.bc.split;
  // row i's keys end here (causal; the split's end when no row ends early)
  const int row_end = kEarly ? min(blk.range.tok_end, blk.qr.key_end(i)) : blk.range.tok_end;
  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  const uint8_t* kv = p.kv + blk.seq.kv_begin * p.kv_stride_bytes;  // contiguous KV: the sequence's first row
  const int64_t stride = p.kv_stride_bytes;
  // this wave's tiles (wave-uniform: scalar branches)
  const int ntiles = __builtin_amdgcn_readfirstlane(blk.range.ntiles > wave ? (blk.range.ntiles - wave + W - 1) / W : 0);
  auto tok0_of = [&](int k) { return blk.range.tok_begin + (k * W + wave) * BN; };
  uint8_t* const stage0 = lds_stage0 + wave * T::kTileBytes;
  uint8_t* const stage1 = lds_stage1 + wave * T::kTileBytes;

  const float kv_scale = kv_scale_of(p);
  WaveState w;
#pragma unroll
  for (int blk = 0; blk < 8; ++blk)
#pragma unroll
    for (int u = 0; u < 4; ++u) w.o[blk][u] = f32x4{0.f, 0.f, 0.f, 0.f};
  w.m = -INFINITY;
  w.l = 0.f;

  // Pairs of tiles: both stages are issued, landed (vmcnt(0)) and computed, then the next
  // pair is issued. The finer schedule (wait only for the stage about to be read, vmcnt(18),
  // the next tile in flight during compute) is what the hardware allows, but clang 21's
  // wait-count pass puts vmcnt(0) before every LDS read while any LDS DMA is outstanding (it
  // has no alias scopes for these accesses), which would leave one tile a wave in flight. Two
  // a wave, 8 (147 KB) a CU, keep HBM busy while the pair is computed: docs/perf.md (AMD).
  auto issue_pair = [&](int k) {
    if (k < ntiles) issue_tile<T>(blk.rows, kv, stride, tok0_of(k), blk.range.tok_end, stage0, lane, page_bad);
    if (k + 1 < ntiles) issue_tile<T>(blk.rows, kv, stride, tok0_of(k + 1), blk.range.tok_end, stage1, lane, page_bad);
  };
  issue_pair(0);  // in flight while q is loaded and quantized
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  const QOperands q = load_q<T>(p, qq, blk.qr.token(i), blk.qr.head(i), j, kv_scale);
  auto step = [&](int k, const uint8_t* stage) {
    f32x4 s[2];
    scores(stage, q, i, j, s);
    const uint64_t pb = softmax_step<T, kEarly>(s, q.s_scale, row_end - tok0_of(k), j, w);
    accumulate_pv(stage, pb, i, j, w);
  };
  for (int k = 0; k < ntiles; k += 2) {
    wait_vmcnt<0>();  // the pair has landed
    step(k, stage0);
    if (k + 1 < ntiles) step(k + 1, stage1);
    issue_pair(k + 2);
  }
  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;  // every wave's tiles are issued

  // ---- merge the 4 waves (LDS: the stages are free once every wave is past its loop) ----
  auto o_slot = [](int v) {  // wave v's O, [row][512] fp32
    return reinterpret_cast<float*>(v < 2 ? lds_stage0 : lds_stage1) + (v % 2) * kGroupRows * kVDim;
  };
  w.l += __shfl_xor(w.l, 16);
  w.l += __shfl_xor(w.l, 32);
  float* ml = reinterpret_cast<float*>(lds_ml);  // [wave][row] (m, l)
  __syncthreads();
  if (j == 0) {
    ml[2 * (wave * kGroupRows + i)] = w.m;
    ml[2 * (wave * kGroupRows + i) + 1] = w.l;
  }
  __syncthreads();
  auto head_max = [&](int h) {
    float mm = -INFINITY;
#pragma unroll
    for (int v = 0; v < W; ++v) mm = fmaxf(mm, ml[2 * (v * kGroupRows + h)]);
    return mm;
  };
  {
    const float mm = head_max(i);
    const float f = w.m == -INFINITY ? 0.f : fast_exp2(w.m - mm);
    float* ob = o_slot(wave) + i * kVDim;
#pragma unroll
    for (int blk = 0; blk < 8; ++blk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        *reinterpret_cast<float4*>(ob + 64 * blk + 16 * j + 4 * r) =
            make_float4(w.o[blk][0][r] * f, w.o[blk][1][r] * f, w.o[blk][2][r] * f, w.o[blk][3][r] * f);
  }
  __syncthreads();
  // thread t: the block's query row h = t / 16, dims d0 .. d0 + 31
  const int h = threadIdx.x / 16, d0 = (threadIdx.x % 16) * 32;
  const bool owns = blk.qr.owns(h);  // else a padding row: computed, never written
  const int64_t tok = blk.qr.token(h);
  const int head = blk.qr.head(h);
  const float mh = head_max(h);
  float lh = 0.f;
#pragma unroll
  for (int v = 0; v < W; ++v) {
    const float mv = ml[2 * (v * kGroupRows + h)];
    if (mv != -INFINITY) lh += fast_exp2(mv - mh) * ml[2 * (v * kGroupRows + h) + 1];
  }
  float acc[32];
#pragma unroll
  for (int e = 0; e < 32; e += 4) {
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int v = 0; v < W; ++v) {
      const float4 x = *reinterpret_cast<const float4*>(o_slot(v) + h * kVDim + d0 + e);
      a.x += x.x, a.y += x.y, a.z += x.z, a.w += x.w;
    }
    acc[e] = a.x, acc[e + 1] = a.y, acc[e + 2] = a.z, acc[e + 3] = a.w;
  }

  // the row's bf16 output and LSE (one split), or its partial and (m, l) (mla_common.cuh write_rows)
  write_rows(p, blk.qr, splits, [&](const auto& out) {
    const float inv = out.scale(lh, kv_scale, bad);
    const auto dst = out.row(h);
#pragma unroll
    for (int e = 0; e < 32; e += 8) {
      const float v[8] = {acc[e] * inv,     acc[e + 1] * inv, acc[e + 2] * inv, acc[e + 3] * inv,
                          acc[e + 4] * inv, acc[e + 5] * inv, acc[e + 6] * inv, acc[e + 7] * inv};
      dst.put(d0 + e, v);
    }
    if (threadIdx.x % 16 == 0) out.state(h, mh, lh, bad);
  });
  if (splits == 1) return;
  // ---- the last split of the (sequence, row group) to finish merges the partials
  __threadfence();  // release: this block's partial before its arrival
  __syncthreads();
  int* last = reinterpret_cast<int*>(lds_ml + T::kMlBytes);
  uint32_t* const counter = p.split_counters + static_cast<int64_t>(b) * Shape::row_groups(p) + blk.bc.group;
  if (threadIdx.x == 0) *last = atomicAdd(counter, 1u) == static_cast<uint32_t>(splits - 1);
  __syncthreads();
  if (!*last) return;
  __threadfence();  // acquire: every split's partial
  // split s's row h: qr.part(h) + (s - split) * part_stride (shapes.cuh: [batch, splits, row_groups, 16])
  const int64_t part_stride = static_cast<int64_t>(Shape::row_groups(p)) * kGroupRows;
  if (owns) merge_splits(p, splits, blk.qr.part(h) - split * part_stride, part_stride, tok, head, d0, kv_scale);
  if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch (and graph replay)
#else
  (void)p;
  __builtin_trap();  // gfx950 only: the catalog never pairs this tiling with another arch
#endif
}

}  // namespace mlagen::device
#endif  // MLAGEN_AMD
