// MLA decode, fp8 KV on sm_90a: the warpgroup (wgmma) kernel.
//
// Why a second NVIDIA body (docs/perf.md): mma.sync has no native fp8 on Hopper, so the
// mma.sync kernel decodes every KV byte to f16. Here the fp8 bytes go to the tensor cores
// as stored:
//
//   S^T = K Qhl^T     wgmma m64n32k32 e4m3, both operands in shared memory: A = the KV tile
//                     (64 tokens x 576 dims, the rows as cp.async landed them), B = the query
//                     split into two e4m3 parts per head (q*c = hi + lo/16, c a per-head power
//                     of two), so N = 16 hi + 16 lo columns and S = hi + lo/16: ~8 significant
//                     bits of q, as many as bf16 has.
//   O^T += V^T Phl^T  wgmma m64n32k32 e4m3, A = V^T from registers (4 bytes of 4 tokens
//                     transposed with prmt; V is read from the same tile, no copy), B = P^T
//                     split into hi / lo e4m3 the same way (P*256 = hi + lo/16).
//
// Block = one warpgroup (128 threads) a 16-row group, tiles of 64 tokens, O^T = 8 m64 blocks
// (512 dims) in registers; a kStages-deep cp.async ring, ~95 KB of shared memory with 2
// stages, so two blocks share an SM and one computes while the other waits (the first design, two
// warpgroups a block splitting S by tokens and O by dims, ran 577 us at 256x8192, about half
// this kernel's speed, with unswizzled tiles whose scattered copies doubled the L2 requests).
// More query rows (32..128 heads, 2..4 tokens) are more blocks of 16 rows (shapes.cuh
// QueryRows), neighbours in the grid so that L2 serves a KV tile to all of them.
//
// mxfp4 KV takes the same kernel: a ring of packed stages (288 bytes + 18 scales a token)
// and one e4m3 tile that the block refills from the landed stage every tile (expand_tile:
// one table lookup per 4 values through prmt). E2M1 x 2^(block scale) fits e4m3 only
// relative to a per-token power of two, which moves into that token's S and P.
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/wg_columns.cuh"

#if defined(MLAGEN_NVIDIA)
#include <type_traits>
namespace mlagen::device {

template <int kStages_, KvFormat kKv_ = KvFormat::kFp8>
struct WgLayout {
  static constexpr bool kMx = kKv_ == KvFormat::kMxfp4;
  static constexpr int kBlockN = 64;   // tokens a tile = the M of the S wgmma
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 128;  // one warpgroup
  static constexpr int kChunksPerRow = kQkDim / 16;  // 36
  static constexpr int kCopiesPerThread = kBlockN * kChunksPerRow / kThreads;  // 18
  // The KV tile, K-major and swizzled so that cp.async lands whole 64..128-byte runs of a
  // row (16-byte pieces scattered over core matrices halved the copy rate: docs/perf.md):
  //   dims 0..511  : 4 atoms of 128 dims (128B swizzle), atom a at a * 8192: token r's row
  //                  at (r / 8) * 1024 + (r % 8) * 128, its 16-byte chunk c at (c ^ (r % 8)) * 16;
  //   dims 512..575: one 64B-swizzle atom at 32768: row at (r / 8) * 512 + (r % 8) * 64,
  //                  chunk c at (c ^ ((r % 8) / 2)) * 16.
  static constexpr int kAtom128Bytes = kBlockN * 128;  // 8192
  static constexpr int kRopeOffset = 4 * kAtom128Bytes;
  static constexpr int kStageBytes = kRopeOffset + kBlockN * 64;  // 36864 (36 x 1024)
  static constexpr int kAlign = 1024;  // swizzle atoms repeat every 1024 bytes of address
  // mxfp4: one e4m3 tile (the layout above, refilled from the packed stage every tile) and
  // a ring of packed stages: 64 rows of 288 bytes back to back (so that a tile of rows
  // stored back to back is one 18 KB run: 9 copies a thread off one base; a 304-byte pitch
  // spared the expansion's 16-byte reads a 2-way bank conflict but cost ~150 instructions a
  // warp and tile of copy addressing, ncu), then the tile's scale window (formats.cuh).
  static constexpr int kMxPitch = kMxRowBytes;
  static constexpr int kPackedBytes = kBlockN * kMxPitch;
  static constexpr int kPackedStageBytes = kPackedBytes + MxStage<kBlockN>::kScaleWindowBytes;
  static constexpr int kTilesBytes = kMx ? kStageBytes + kStages * kPackedStageBytes : kStages * kStageBytes;
  // Q hi / lo: 32 rows (16 hi, 16 lo) x 576 bytes; P^T hi / lo: 32 rows x 64 tokens.
  static constexpr int kQLbo = 128, kQSbo = kChunksPerRow * 128, kQBytes = 4 * kQSbo;
  static constexpr int kPLbo = 128, kPSbo = kBlockN / 16 * 128, kPBytes = 4 * kPSbo;
  static constexpr int kQOffset = kTilesBytes;  // from the 1024-aligned base
  static constexpr int kPOffset = kQOffset + kQBytes;
  static constexpr int kRedOffset = kPOffset + kPBytes;               // [4 warps][16 heads] x2 floats
  static constexpr int kColOffset = kRedOffset + 2 * 4 * kGroupRows * 4;  // [16] column scales
  // mxfp4: the tile's token powers of two, [64] as float exponents then [64] as factors;
  // [kMxLut] e4m3 tables of 8 bytes
  static constexpr int kTokOffset = kColOffset + kGroupRows * 4;
  static constexpr int kMxLut = 20;  // block exponents -13..6 relative to the token's (below: zeros)
  static constexpr int kLutOffset = kTokOffset + (kMx ? 2 * kBlockN * 4 : 0);
  // paged e4m3 rows: the page ids of the tiles in flight (kv_rows.cuh, StagedTileIds). Tile j's go
  // out with tile j - kIdsAhead's copies, a whole ring ahead; the ST - 1 issues of the prologue
  // run without a barrier between them, so slots for kIdsAhead + ST - 1 tiles. Last in the
  // layout, so that no other offset moves.
  static constexpr int kIdsAhead = kStages, kIdSlots = kIdsAhead + kStages - 1;
  using Ids = StagedTileIds<kBlockN, kIdSlots>;
  static constexpr int kIdsOffset = kLutOffset + (kMx ? kMxLut * 8 : 0);
  static constexpr int kSmemBytes = kIdsOffset + (kMx ? 0 : Ids::kBytes) + kAlign;  // + room to align the base
  static_assert(kPackedStageBytes % 16 == 0 && kQOffset % 16 == 0, "16-byte copies");
  static_assert(kCopiesPerThread * kThreads == kBlockN * kChunksPerRow, "whole copies a thread");

  MLAGEN_DEVICE static uint32_t kv_at(int token, int byte) {
    const int r8 = token % 8;
    if (byte < 512)
      return (byte / 128) * kAtom128Bytes + (token / 8) * 1024 + r8 * 128 + (((byte / 16) % 8) ^ r8) * 16 + byte % 16;
    const int b = byte - 512;
    return kRopeOffset + (token / 8) * 512 + r8 * 64 + ((b / 16) ^ (r8 / 2)) * 16 + b % 16;
  }
  MLAGEN_DEVICE static uint32_t q_at(int row, int byte) {
    return (row / 8) * kQSbo + (byte / 16) * kQLbo + (row % 8) * 16 + byte % 16;
  }
  MLAGEN_DEVICE static uint32_t p_at(int row, int token) {
    return (row / 8) * kPSbo + (token / 16) * kPLbo + (row % 8) * 16 + token % 16;
  }
};

// x (>= 0 or any sign) -> e4m3 hi and lo with x ~ hi + lo / 16 (two values at once: the
// bytes of each result are (x0, x1)).
MLAGEN_DEVICE void split_e4m3(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const uint16_t h = pack_e4m3x2(x0, x1);
  const float2 hf = e4m3x2_to_float2(h);
  hi = h;
  lo = pack_e4m3x2((x0 - hf.x) * 16.f, (x1 - hf.y) * 16.f);
}

// One query row into a warpgroup kernel's e4m3 q operand (both sm90a bodies). Its 8 threads
// (lanes 8 r .. 8 r + 7) hold the row's 576 values as raw[18] (load_q4_raw, 4 values each). The
// values are multiplied by c = 2^k, a per-row power of two that puts the largest |q| in
// [128, 256) (under 448), and split into e4m3 hi + lo / 16 (kLo: ~8 significant bits, as bf16
// has). Without kLo (an fp8 q, exact in e4m3) they go as they are, c = 1. Value group i is stored
// through store(i, hi word, lo word). Returns 1 / c, the row's S factor.
template <QFormat QF, bool kLo, class Store>
MLAGEN_DEVICE float stage_q_row(const QQuant& qq, const uint2 (&raw)[18], Store&& store) {
  float4 v[18];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 18; ++i) {
    v[i] = q4_from_raw<QF>(qq, raw[i]);
    amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
  }
  int k = 0;
  if constexpr (kLo) {
#pragma unroll
    for (int o = 4; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor(amax, o));
    // c = 2^(7 - floor(log2 amax)): the row's largest |q| * c lies in [128, 256), under 448
    const int e = amax > 0.f ? static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu) - 127 : 0;
    k = min(127, max(-126, 7 - e));
    const float c = pow2i(k);
#pragma unroll
    for (int i = 0; i < 18; ++i) {
      uint32_t hi01, lo01, hi23, lo23;
      split_e4m3(v[i].x * c, v[i].y * c, hi01, lo01);
      split_e4m3(v[i].z * c, v[i].w * c, hi23, lo23);
      store(i, hi01 | (hi23 << 16), lo01 | (lo23 << 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 18; ++i)
      store(i, pack_e4m3x2(v[i].x, v[i].y) | (static_cast<uint32_t>(pack_e4m3x2(v[i].z, v[i].w)) << 16), 0u);
  }
  return pow2i(-k);
}

template <class T, class Shape>
MLAGEN_DEVICE void decode_wgmma(const Params& p, uint8_t* smem) {
  using namespace sm90;
  using L = WgLayout<T::kStages, T::kKv>;
  constexpr int BN = L::kBlockN, ST = L::kStages, W = 4;
  static_assert(W == kWgWarps, "one warpgroup: wg_columns.cuh reduces over its 4 warps");
  constexpr bool kMx = L::kMx;
  static_assert(MLAGEN_WARP_SIZE == 32, "wgmma fragments are defined for 32-lane warps");
  static_assert(L::kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block: fewer stages");
  const uint32_t s_raw = smem_addr(smem);
  const uint32_t s_base = (s_raw + L::kAlign - 1) & ~static_cast<uint32_t>(L::kAlign - 1);
  smem += s_base - s_raw;
  const uint32_t s_q = s_base + L::kQOffset, s_p = s_base + L::kPOffset;
  float* red_max = reinterpret_cast<float*>(smem + L::kRedOffset);  // [warp][head]
  float* red_sum = red_max + W * kGroupRows;
  float* col_scale = reinterpret_cast<float*>(smem + L::kColOffset);  // [head]: 1 / c
  float* tok_pow = reinterpret_cast<float*>(smem + L::kTokOffset);    // mxfp4: [token] exponent g
  float* tok_mul = tok_pow + BN;                                        //        [token] 2^g

  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int split = blk.bc.split, splits = blk.splits,
            ntiles = blk.range.ntiles, tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  const float kv_scale = kv_scale_of(p);

  // Tile j of the split into ring slot j % ST, one commit group a tile (empty past the end,
  // so the group count stays uniform). A warp instruction copies whole runs of rows, in
  // global memory and in the swizzled tile alike: dims 0..511 as 4 rows x 128 bytes (lane l:
  // row 16 k + 4w + l / 8, 16-byte chunk l % 8 of atom i % 4), the rope dims as 8 rows x 64
  // bytes (row 32 i + 8w + l / 4, chunk l % 4). Every offset is a per-thread constant plus a
  // compile-time one, so nothing per copy stays live across the loop.
  constexpr int kMainK = 4, kRopeK = 2;  // the thread's 16-row main / 32-row rope blocks
  const int r8 = 4 * (w % 2) + lane / 8, c8 = lane % 8;  // 128B part: row % 8, chunk
  const uint32_t dst_main = (w / 2) * 1024 + r8 * 128 + ((c8 ^ r8) * 16);
  const int row_main = 4 * w + lane / 8;
  const int rr = lane / 4, c4 = lane % 4;  // rope part: row % 8, chunk
  const uint32_t dst_rope = L::kRopeOffset + w * 512 + rr * 64 + ((c4 ^ (rr / 2)) * 16);
  const int row_rope = 8 * w + rr;
  // A whole tile (every tile but a split's last, short one) takes the fast path: per thread
  // one 64-bit base a tile, a 32-bit row step, immediates for the rest, no predicates (the
  // general path spent ~200 of ~1,018 instructions a warp and tile on addresses; this one took
  // 256x8192 from 302 to 290 us).
  const int64_t stride = p.kv_stride_bytes;
  // paged fp8: the page ids of tile j in shared memory (L::Ids), staged with tile j - kIdsAhead's
  // copies; the first kIdsAhead tiles' before the ring starts, beside the q loads (below)
  const bool paged_ids = !kMx && blk.rows.paged();
  const typename L::Ids ids{s_base + L::kIdsOffset};
  const uint32_t src_main = static_cast<uint32_t>(row_main * stride) + c8 * 16;  // < 2^31: rows < 64
  const uint32_t src_rope = static_cast<uint32_t>(row_rope * stride) + 512 + c4 * 16;
  const uint32_t step16 = static_cast<uint32_t>(16 * stride);
  // The thread's rows of a tile from a row address each (null: past the end, zeros): main row
  // blocks k < kMainK as 4 x 128 bytes, then the rope blocks as 64 bytes.
  auto copy_rows = [&](uint32_t dst, const uint8_t* const (&src)[kMainK + kRopeK]) {
#pragma unroll
    for (int i = 0; i < 4 * kMainK; ++i)
      cp_async_16(dst + dst_main + (i % 4) * L::kAtom128Bytes + (i / 4) * 2048,
                  src[i / 4] ? src[i / 4] + (i % 4) * 128 + c8 * 16 : p.kv, src[i / 4] != nullptr);
#pragma unroll
    for (int i = 0; i < kRopeK; ++i)
      cp_async_16(dst + dst_rope + i * 2048, src[kMainK + i] ? src[kMainK + i] + 512 + c4 * 16 : p.kv,
                  src[kMainK + i] != nullptr);
  };
  auto issue_tile = [&](int j) {
    if (kMx && j < ntiles) {  // packed rows (9 copies a thread) + the tile's scale window
      const int tok0 = tok_begin + j * BN;
      const int rows_left = tok_end - tok0;
      const uint32_t off = L::kStageBytes + (j % ST) * L::kPackedStageBytes;
      const bool run = blk.rows.template tile_contiguous<BN>();
      const int64_t row0 = blk.rows.row(tok0, page_bad);
      constexpr int kChunks = kMxRowBytes / 16, kCopies = BN * kChunks / L::kThreads;  // 18 a row, 9 a thread
      if (rows_left >= BN && stride == kMxRowBytes && run) {  // whole tile, rows back to back (the usual layout)
        const uint8_t* base = p.kv + row0 * stride;
#pragma unroll
        for (int i = 0; i < kCopies; ++i)
          cp_async_16_full(s_base + off + 16 * tid + i * 16 * L::kThreads, base + (16 * tid + i * 16 * L::kThreads));
      } else {
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
          const int idx = tid + i * L::kThreads, row = idx / kChunks, col = idx % kChunks;
          const bool ok = row < rows_left;
          cp_async_16(s_base + off + row * L::kMxPitch + col * 16, ok ? blk.rows.ptr(tok0 + row, page_bad) + col * 16 : p.kv, ok);
        }
      }
      if (run)
        mx_issue_scale_window<BN, L::kThreads>(p.kv_scales, p.kv_scales_stride, p.total_kv, row0, min(BN, rows_left),
                                               s_base + off + L::kPackedBytes, smem + off + L::kPackedBytes, tid);
      else
        mx_issue_scale_rows<BN, L::kThreads>(p.kv_scales, p.kv_scales_stride, blk.rows, tok0, min(BN, rows_left),
                                             smem + off + L::kPackedBytes, tid, page_bad);
    } else if (!kMx && j < ntiles) {
      const int tok0 = tok_begin + j * BN;
      const int rows_left = tok_end - tok0;
      const uint32_t dst = s_base + (j % ST) * L::kStageBytes;
      // (tile j + kIdsAhead's ids: a slot no thread reads before the next barrier)
      if (paged_ids && j + L::kIdsAhead < ntiles)
        ids.template stage<L::kThreads>(blk.rows, j + L::kIdsAhead, tok0 + L::kIdsAhead * BN, tok_end, tid);
      if (paged_ids && !(rows_left >= BN && blk.rows.template tile_contiguous<BN>())) {
        // pages shorter than a tile (or a short last tile): the thread's row addresses from the ids
        const uint8_t* src[kMainK + kRopeK];
#pragma unroll
        for (int k = 0; k < kMainK + kRopeK; ++k) {
          const int row = k < kMainK ? 16 * k + row_main : 32 * (k - kMainK) + row_rope;
          const int64_t r = ids.row(blk.rows, j, tok0, row, page_bad);
          src[k] = row < rows_left ? p.kv + r * stride : nullptr;
        }
        copy_rows(dst, src);
      } else if (rows_left >= BN) {  // one run of rows: one base a tile
        const uint8_t* base = paged_ids ? p.kv + ids.row(blk.rows, j, tok0, 0, page_bad) * stride : blk.rows.ptr(tok0, page_bad);
#pragma unroll
        for (int k = 0; k < kMainK; ++k) {  // rows 16 k + row_main
          const uint8_t* src = base + (src_main + k * step16);
#pragma unroll
          for (int a = 0; a < 4; ++a) cp_async_16_full(dst + dst_main + a * L::kAtom128Bytes + k * 2048, src + a * 128);
        }
#pragma unroll
        for (int i = 0; i < kRopeK; ++i) cp_async_16_full(dst + dst_rope + i * 2048, base + (src_rope + 2 * i * step16));
      } else {  // a split's last, short tile: a row address each
        // The thread's rows first (rows 16 k + row_main, 32 i + row_rope), then the copies: any
        // page-id loads go out together instead of one after another between the copies' asm
        // statements (which clobber memory).
        const uint8_t* src[kMainK + kRopeK];
#pragma unroll
        for (int k = 0; k < kMainK + kRopeK; ++k) {
          const int row = k < kMainK ? 16 * k + row_main : 32 * (k - kMainK) + row_rope;
          src[k] = row < rows_left ? blk.rows.ptr(tok0 + row, page_bad) : nullptr;
        }
        copy_rows(dst, src);
      }
    }
    cp_async_commit();
  };
  // ---- Q hi / lo, once: thread -> query row h = tid / 8, 16-byte chunks 8 j + tid % 8 (j = 0..8) of
  // its row, as two 4-value loads: the 8 lanes of a head read 128 contiguous bytes (a
  // thread-contiguous 72-dim run put every lane of a load in its own line: geomean 43.2 -> 42.6 us)
  // (the loads go out before q_setup, which waits for the amax pre-pass of an fp8 q). The
  // first tiles' copies go out before them; paged, after them: the copies wait for the ids'
  // round trip, which the q loads then share.
  const int h = tid / 8, part = tid % 8;
  auto dim_of = [&](int i) { return 8 * (8 * (i / 2) + part) + 4 * (i % 2); };  // value 4 i .. 4 i + 3
  uint2 q_raw[18];
  auto load_q = [&] {
#pragma unroll
    for (int i = 0; i < 18; ++i) q_raw[i] = load_q4_raw<T::kQ>(p, blk.qr.token(h), blk.qr.head(h), dim_of(i));
  };
  if (paged_ids) {  // the first tiles' ids and q in one round trip; then the copies
    ids.template stage_first<L::kIdsAhead, L::kThreads>(blk.rows, tok_begin, tok_end, tid, load_q);
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < ST - 1; ++j) issue_tile(j);
  if (!paged_ids) load_q();
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  {
    const float inv_c = stage_q_row<T::kQ, true>(qq, q_raw, [&](int i, uint32_t hi, uint32_t lo) {
      const int d = dim_of(i);
      sts32(s_q + L::q_at(h, d), hi);
      sts32(s_q + L::q_at(kGroupRows + h, d), lo);
    });
    if (part == 0) col_scale[h] = inv_c;  // S = (hi column) / c + (lo column) / (16 c)
  }
  if (kMx && tid < L::kMxLut) {  // entry i: the e4m3 bytes of the E2M1 magnitudes x 2^(i - 13), rounded to nearest even
    const float f = pow2i(tid - 13);
    const uint32_t t0 = pack_e4m3x2(0.f, 0.5f * f) | (static_cast<uint32_t>(pack_e4m3x2(f, 1.5f * f)) << 16);
    const uint32_t t1 = pack_e4m3x2(2.f * f, 3.f * f) | (static_cast<uint32_t>(pack_e4m3x2(4.f * f, 6.f * f)) << 16);
    reinterpret_cast<uint2*>(smem + L::kLutOffset)[tid] = make_uint2(t0, t1);
  }
  fence_proxy_async_smem();
  __syncthreads();

  // This thread's query rows (columns of S^T and O^T): slot k -> row wg_column(k, t)
  // of the block's 16 (`head[k]`: the block's rows are 16 heads of one token at q_len 1).
  const float s_scale = kv_scale * qq.scale * p.sm_scale * kLog2e;  // log2 domain
  int head[4], key_end[4];
  float cs_hi[4];  // the lo column's factor is cs_hi / 16
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    head[k] = wg_column(k, t);
    cs_hi[k] = col_scale[head[k]] * s_scale;
    key_end[k] = min(tok_end, blk.qr.key_end(head[k]));  // causal: the row's last key + 1
  }

  float o[8][16];  // O^T of m64 block mb (see the epilogue for its dims); columns hi | lo
#pragma unroll
  for (int mb = 0; mb < 8; ++mb)
#pragma unroll
    for (int i = 0; i < 16; ++i) o[mb][i] = 0.f;
  float m[4], l[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) m[k] = -INFINITY, l[k] = 0.f;

  const uint64_t q_desc = wgmma_desc(s_q, L::kQLbo, L::kQSbo);
  const uint64_t p_desc = wgmma_desc(s_p, L::kPLbo, L::kPSbo);
  const int row0 = 16 * w + g;  // tile token of accumulator row g (row g + 8: +8)

  // V^T loads: lane (g, t) reads token 4t + i' with i' = (i + rot) % 4 at step i, so the 32
  // lanes of a load hit 32 distinct banks (bank = 4 ((2w + g / 4) ^ ((4t + i') % 8)) + g % 4,
  // checked exhaustively); the transpose's second stage puts the tokens back in order (for
  // rot = 2 load i holds token (i + 2) % 4: the word pairs swap there; checked in Python).
  const int rot = 2 * (t / 2);
  const uint32_t sel_even = rot ? 0x1054u : 0x5410u, sel_odd = rot ? 0x3276u : 0x7632u;
  uint32_t voff[4];  // the lane's part of load i's address (the rest is a compile-time offset)
#pragma unroll
  for (int i = 0; i < 4; ++i) voff[i] = L::kv_at(4 * t + ((i + rot) & 3), 32 * w + 4 * g);
  // V^T fragments of k-step ks (32 tokens), m64 blocks 2q, 2q+1: lane (g, t) of warp w holds
  // the dims 128 q + 32 w + 4 g + {0, 1 | 2, 3} (rows g, g+8 of each block) of tokens
  // 32 ks + 16 v + 4t .. +3: four 4-byte loads, one 4x4 byte transpose (8 prmt).
  auto v_frags = [&](uint32_t tile, int ks, uint32_t (&a)[8][4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        uint32_t wv[4], tr[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) wv[i] = lds32(tile + voff[i] + q * L::kAtom128Bytes + (4 * ks + 2 * v) * 1024);
        transpose4x4(wv, tr, sel_even, sel_odd);
        a[2 * q][2 * v] = tr[0];
        a[2 * q][2 * v + 1] = tr[1];
        a[2 * q + 1][2 * v] = tr[2];
        a[2 * q + 1][2 * v + 1] = tr[3];
      }
  };

  // mxfp4: packed stage -> the e4m3 tile. Token n's values are E2M1 x 2^(scale byte - 127)
  // per block of 32 dims; the tile holds them as e4m3 x 2^g_n with g_n = (the token's largest
  // block exponent) - 6, so its largest block lands under 6 x 2^6 = 384 <= 448: a block at
  // x = (its exponent) - g_n >= -8 is exact (down to 14 binades below the token's largest),
  // x in -13..-9 is rounded onto e4m3's subnormals, below that zero. g_n >= -64: only blocks
  // with scales below 2^-72 lose precision that way whatever their token. 2^g_n moves to the
  // token's S (x 2^g_n) and P (x 2^g_n, folded into the exponent of the softmax). Thread ->
  // token tid % 64, blocks 9 (tid / 64) .. + 8: a quarter warp stores 8 consecutive tokens'
  // 16-byte pieces, 8 distinct swizzle positions.
  auto expand_tile = [&](int it) {
    const int tok0 = tok_begin + it * BN, valid = tok_end - tok0, n = tid % BN;
    const uint32_t stage = s_base + L::kStageBytes + (it % ST) * L::kPackedStageBytes;
    bool unused = false;  // (the loads flagged it)
    const uint32_t sc = stage + L::kPackedBytes + mx_scale_offset<BN>(blk.rows, tok0, p.kv_scales_stride, unused) +
                        static_cast<uint32_t>(n * p.kv_scales_stride);
    const bool live = n < valid;  // rows past the end: zeros (cp.async filled them), any finite scale
    uint32_t sb[kMxBlocks], emax = 0u;
#pragma unroll
    for (int kb = 0; kb < kMxBlocks; ++kb) {
      sb[kb] = live ? lds8(sc + kb) : 127u;
      emax = max(emax, sb[kb]);
    }
    const int gpow = max(static_cast<int>(emax) - 127 - 6, -64);
    if (tid < BN) {  // E8M0 255 is NaN: the token's S and P become NaN, so does the output
      tok_pow[n] = emax == 255u ? quiet_nan() : static_cast<float>(gpow);
      tok_mul[n] = emax == 255u ? quiet_nan() : pow2i(gpow);
    }
    const uint32_t row = stage + n * L::kMxPitch, lut = s_base + L::kLutOffset;
    auto blocks = [&](auto first) {
      constexpr int kb0 = decltype(first)::value;
#pragma unroll
      for (int j = 0; j < kMxBlocks / 2; ++j) {
        const int kb = kb0 + j;
        const int x = min(max(static_cast<int>(sb[kb]) - 127 - gpow, -13), 6) + 13;
        const uint2 tab = lds64(lut + 8 * x);
        const uint4 w = lds128(row + 16 * kb);
        uint32_t o[8];
        e2m1x8_to_e4m3(w.x, tab.x, tab.y, o[0], o[1]);
        e2m1x8_to_e4m3(w.y, tab.x, tab.y, o[2], o[3]);
        e2m1x8_to_e4m3(w.z, tab.x, tab.y, o[4], o[5]);
        e2m1x8_to_e4m3(w.w, tab.x, tab.y, o[6], o[7]);
        sts128(s_base + L::kv_at(n, 32 * kb), make_uint4(o[0], o[1], o[2], o[3]));
        sts128(s_base + L::kv_at(n, 32 * kb + 16), make_uint4(o[4], o[5], o[6], o[7]));
      }
    };
    if (tid < BN)
      blocks(std::integral_constant<int, 0>{});
    else
      blocks(std::integral_constant<int, kMxBlocks / 2>{});
  };

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<ST - 2>();  // tile `it` landed (later ones may still fly)
    fence_proxy_async_smem();
    __syncthreads();  // ... for every thread; P, the maxima and tile it-1's slot are free
    const uint32_t tile = kMx ? s_base : s_base + (it % ST) * L::kStageBytes;
    float tpow[2] = {0.f, 0.f}, tmul[2] = {1.f, 1.f};  // mxfp4: the powers of two of rows row0, row0 + 8
    if constexpr (kMx) {
      issue_tile(it + ST - 1);  // packed slot (it - 1) % ST is free since the barrier
      expand_tile(it);
      fence_proxy_async_smem();  // the tile's generic-proxy stores, seen by the wgmmas
      __syncthreads();
#pragma unroll
      for (int r = 0; r < 2; ++r) tpow[r] = tok_pow[row0 + 8 * r], tmul[r] = tok_mul[row0 + 8 * r];
    }

    // ---- S^T for the tile's 64 tokens: 18 k-steps of 32 dims -------------------------------
    float s[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    // k-step ks = dims 32 ks ..: inside a swizzle atom the descriptor moves by the
    // unswizzled offset (the hardware applies the XOR to the address it forms)
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    const uint64_t rope_desc = wgmma_desc(tile + L::kRopeOffset, 16, 512, WgmmaSwizzle::k64B);
    wgmma_fence_regs(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < L::kChunksPerRow / 2; ++ks)
      wgmma_m64n32k32_e4m3_ss(s,
                              ks < 16 ? wgmma_desc_advance(k_desc, (ks / 4) * L::kAtom128Bytes + (ks % 4) * 32)
                                      : wgmma_desc_advance(rope_desc, (ks - 16) * 32),
                              wgmma_desc_advance(q_desc, 2 * ks * L::kQLbo), ks > 0);
    wgmma_commit();
    // the next tile's copies go out while the tensor cores run S (slot (it - 1) % ST, which
    // every thread is done with since the barrier above; S reads slot it % ST)
    if constexpr (!kMx) issue_tile(it + ST - 1);
    wgmma_wait<0>();
    wgmma_fence_regs(s);

    // ---- softmax: the per-head tile maxima meet in shared memory ---------------------------
    const int tok0 = tok_begin + it * BN;
    // sv: S (log2 domain); se: the exponent P is taken of, S + g for mxfp4 (P x 2^g meets
    // the tile's V / 2^g), S otherwise
    float sv[2][4], se[2][4], tm[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int jh = k / 2, e = k % 2;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float x = s[4 * jh + 2 * r + e] * cs_hi[k] + s[4 * (jh + 2) + 2 * r + e] * (cs_hi[k] * 0.0625f);
        if constexpr (kMx) x *= tmul[r];
        sv[r][k] = tok0 + row0 + 8 * r < key_end[k] ? x : -INFINITY;
        se[r][k] = kMx ? sv[r][k] + tpow[r] : sv[r][k];
      }
    }
    wg_column_max(se, head, red_max, w, g, tm);
    float alpha[4];
    bool rescale = false;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      alpha[k] = online_step<Shape::kRowsEndEarly>(m[k], tm[k]);
      rescale |= alpha[k] != 1.f;
    }
    // P = 2^(S - m), x256 (p in [2^-14, 1] stays a normal e4m3), as hi / lo columns of P^T
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float mb = step_base<Shape::kRowsEndEarly>(m[k]);  // (a row with no key yet: P = 0)
      const float p0 = fast_exp2(se[0][k] - mb), p1 = fast_exp2(se[1][k] - mb);
      // l sums 2^(S - m); for mxfp4 that is P / 2^g (up to 2^64: g >= -64)
      l[k] = l[k] * alpha[k] + (kMx ? fast_exp2(sv[0][k] - mb) + fast_exp2(sv[1][k] - mb) : p0 + p1);
      uint32_t hi, lo;
      split_e4m3(p0 * 256.f, p1 * 256.f, hi, lo);
      sts8(s_p + L::p_at(head[k], row0), hi & 0xffu);
      sts8(s_p + L::p_at(head[k], row0 + 8), hi >> 8);
      sts8(s_p + L::p_at(kGroupRows + head[k], row0), lo & 0xffu);
      sts8(s_p + L::p_at(kGroupRows + head[k], row0 + 8), lo >> 8);
    }
    if (__any_sync(0xffffffffu, rescale))  // the running max moved for some head of the warp
#pragma unroll
      for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int i = 0; i < 16; ++i) o[mb][i] *= alpha[2 * ((i / 4) % 2) + (i % 2)];
    uint32_t a0[8][4];  // V^T fragments of the first 32 tokens (S is dead: registers)
    v_frags(tile, 0, a0);
    fence_proxy_async_smem();
    __syncthreads();  // P complete

    // ---- O^T += V^T P^T: 2 k-steps of 32 tokens x 8 m64 blocks --------------------------
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) wgmma_fence_regs(o[mb]), wgmma_fence_regs(a0[mb]);
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) wgmma_m64n32k32_e4m3_rs(o[mb], a0[mb], p_desc);
    wgmma_commit();
    wgmma_wait<0>();  // (a0's registers are free again: 255 registers would not hold both)
    uint32_t a1[8][4];  // the second 32 tokens
    v_frags(tile, 1, a1);
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) wgmma_fence_regs(a1[mb]);
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) wgmma_m64n32k32_e4m3_rs(o[mb], a1[mb], wgmma_desc_advance(p_desc, 2 * L::kPLbo));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < 8; ++mb) wgmma_fence_regs(o[mb]);
  }
  cp_async_wait<0>();
  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;

  // ---- epilogue: l over the 8 row lanes and the 4 warps -------------------------------------
  wg_column_sum(l, head, red_sum, w, g);

  // O[head][dim]: head slot k, m64 block mb, row r -> dim 128 (mb / 2) + 32 w + 4 g + 2 (mb % 2)
  // + r: four consecutive dims per (k, mb / 2). Columns: hi + lo / 16, / 256.
  const float o_unit = 1.f / 256.f;
  write_rows(p, blk.qr, splits, [&](const auto& out) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int jh = k / 2, e = k % 2;
      const float inv = out.scale(l[k], kv_scale, bad) * o_unit;
      const auto dst = out.row(head[k]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float ov[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int mb = 2 * q + i / 2, r = i % 2;
          ov[i] = (o[mb][4 * jh + 2 * r + e] + o[mb][4 * (jh + 2) + 2 * r + e] * 0.0625f) * inv;
        }
        dst.put(128 * q + 32 * w + 4 * g, ov);
      }
      if (w == 0 && g == 0) out.state(head[k], m[k], l[k], bad);
    }
  });
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
