// MLA decode on sm_90a: the warpgroup (wgmma) body for 16 query rows a block, the KV format a
// policy of it.
//
// Why wgmma: on Hopper fp8 reaches the tensor cores only through wgmma (an mma.sync kernel
// decodes every KV byte to f16 first). Here the KV bytes go to the tensor cores as stored,
// S^T = K Q^T and O^T += V^T P^T with the tile's 64 tokens as M (the query rows are the N
// columns: wg_columns.cuh reduces over them).
//
// Block = one warpgroup (128 threads) a 16-row group, tiles of 64 tokens, O^T = 8 m64 blocks
// (512 dims) in registers, a kStages-deep cp.async ring (the first design, two warpgroups a
// block splitting S by tokens and O by dims, ran 577 us at 256x8192, about half this kernel's
// speed, with unswizzled tiles whose scattered copies doubled the L2 requests). More query rows
// (32..128 heads, 2..4 tokens) are more blocks of 16 rows (shapes.cuh QueryRows), neighbours in
// the grid so that L2 serves a KV tile to all of them.
//
// decode_wgmma runs the phases every format shares (the block setup, the ring and q's loads, per
// tile the scores, the columns' max and the online softmax, P^T, O^T, the refill; the epilogue);
// the format policy (WgKv) holds the thread's O^T and supplies the format's steps: the tile's
// layout and copies, the q operand, the S and O wgmma chains, the scales, the P^T store, the
// rows' store.
//
// WgE4m3Kv, fp8 and mxfp4 KV (this file):
//   S^T = K Qhl^T     wgmma m64n32k32 e4m3, both operands in shared memory: A = the KV tile
//                     (64 tokens x 576 dims, the rows as cp.async landed them), B = the query
//                     split into two e4m3 parts per head (q*c = hi + lo/16, c a per-head power
//                     of two), so N = 16 hi + 16 lo columns and S = hi + lo/16: ~8 significant
//                     bits of q, as many as bf16 has.
//   O^T += V^T Phl^T  wgmma m64n32k32 e4m3, A = V^T from registers (4 bytes of 4 tokens
//                     transposed with prmt; V is read from the same tile, no copy), B = P^T
//                     split into hi / lo e4m3 the same way (P*256 = hi + lo/16).
//   ~95 KB of shared memory with 2 stages, so two blocks share an SM and one computes while the
//   other waits. mxfp4 KV: a ring of packed stages (288 bytes + 18 scales a token) and one e4m3
//   tile that the block refills from the landed stage every tile (expand_tile: one table lookup
//   per 4 values through prmt). E2M1 x 2^(block scale) fits e4m3 only relative to a per-token
//   power of two, which moves into that token's S and P.
// WgBf16Kv, bf16 KV (mla_decode_sm90_wgmma_bf16.cuh): bf16 wgmmas on the tile as stored, V^T
//   through the descriptor's transpose bit.
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/mla_decode_sm90_wgmma_bf16.cuh"
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

// ---- the fp8 / mxfp4 policy of decode_wgmma ---------------------------------------------------
// fp8 KV: the tile lands as stored and is the A operand of S as it is; mxfp4 KV: a ring of packed
// stages, expanded into the one e4m3 tile every tile. q and P go in as e4m3 hi + lo / 16 columns
// (N = 32), V^T from registers. The policy holds the thread's O^T and its copy addressing.
template <class T, class Shape>
struct WgE4m3Kv {
  using L = WgLayout<T::kStages, T::kKv>;
  static constexpr bool kMx = L::kMx;
  static constexpr int BN = L::kBlockN, ST = L::kStages;
  // ST - 1 tiles in flight beside the one computed: the refill takes tile it - 1's slot, which
  // every thread is done with at the loop's first barrier
  static constexpr int kAhead = ST - 1;
  // fp8: the next tile's copies go out while the tensor cores run S; mxfp4: first thing after the
  // barrier (the packed slot (it - 1) % ST is free then), before the expansion
  static constexpr WgRefill kRefill = kMx ? WgRefill::kOnLanded : WgRefill::kDuringScores;
  static constexpr int kSRegs = 16;  // S^T m64n32: 16 tokens' hi | lo columns a thread
  static constexpr float kOUnit = 1.f / 256.f;  // P went in x256

  // (Params is an argument of the steps, not a member: read through a member reference, the zero
  // fills' source p.kv was not hoisted and each copy's select became a branch and a load)
  const BlockSetup<Shape>& blk;
  const uint32_t s_base;
  uint8_t* const smem;  // (s_base's generic address)
  const int tid;
  float* const col_scale;  // [head]: 1 / c
  float* const tok_pow;    // mxfp4: [token] exponent g
  float* const tok_mul;    //        [token] 2^g
  const float kv_scale;
  float o[8][16];  // O^T of m64 block mb (see store_row for its dims); columns hi | lo
  float cs_hi[4];  // S factor of slot k's hi column (the lo column's: cs_hi / 16)
  float tpow[2] = {0.f, 0.f}, tmul[2] = {1.f, 1.f};  // mxfp4: the powers of two of rows row0, row0 + 8

  // Tile j of the split into ring slot j % ST, one commit group a tile (empty past the end,
  // so the group count stays uniform). A warp instruction copies whole runs of rows, in
  // global memory and in the swizzled tile alike: dims 0..511 as 4 rows x 128 bytes (lane l:
  // row 16 k + 4w + l / 8, 16-byte chunk l % 8 of atom i % 4), the rope dims as 8 rows x 64
  // bytes (row 32 i + 8w + l / 4, chunk l % 4). Every offset is a per-thread constant plus a
  // compile-time one, so nothing per copy stays live across the loop.
  static constexpr int kMainK = 4, kRopeK = 2;  // the thread's 16-row main / 32-row rope blocks
  const int r8, c8;     // 128B part: row % 8, chunk
  const uint32_t dst_main;
  const int row_main;
  const int rr, c4;     // rope part: row % 8, chunk
  const uint32_t dst_rope;
  const int row_rope;
  // A whole tile (every tile but a split's last, short one) takes the fast path: per thread
  // one 64-bit base a tile, a 32-bit row step, immediates for the rest, no predicates (the
  // general path spent ~200 of ~1,018 instructions a warp and tile on addresses; this one took
  // 256x8192 from 302 to 290 us).
  const int64_t stride;
  // paged fp8: the page ids of tile j in shared memory (L::Ids), staged with tile j - kIdsAhead's
  // copies; the first kIdsAhead tiles' before the ring starts, beside the q loads (start)
  const bool paged_ids;
  const typename L::Ids ids;
  const uint32_t src_main, src_rope, step16;
  // V^T loads: lane (g, t) reads token 4t + i' with i' = (i + rot) % 4 at step i, so the 32
  // lanes of a load hit 32 distinct banks (bank = 4 ((2w + g / 4) ^ ((4t + i') % 8)) + g % 4,
  // checked exhaustively); the transpose's second stage puts the tokens back in order (for
  // rot = 2 load i holds token (i + 2) % 4: the word pairs swap there; checked in Python).
  uint32_t sel_even, sel_odd;
  uint32_t voff[4];  // the lane's part of load i's address (the rest is a compile-time offset)

  MLAGEN_DEVICE WgE4m3Kv(const Params& p_, const BlockSetup<Shape>& blk_, uint32_t s_base_, uint8_t* smem_, int tid_)
      : blk(blk_), s_base(s_base_), smem(smem_), tid(tid_),
        col_scale(reinterpret_cast<float*>(smem_ + L::kColOffset)),
        tok_pow(reinterpret_cast<float*>(smem_ + L::kTokOffset)), tok_mul(tok_pow + BN),
        kv_scale(kv_scale_of(p_)),
        r8(4 * ((tid_ / 32) % 2) + (tid_ % 32) / 8), c8(tid_ % 8),
        dst_main(((tid_ / 32) / 2) * 1024 + r8 * 128 + ((c8 ^ r8) * 16)),
        row_main(4 * (tid_ / 32) + (tid_ % 32) / 8),
        rr((tid_ % 32) / 4), c4(tid_ % 4),
        dst_rope(L::kRopeOffset + (tid_ / 32) * 512 + rr * 64 + ((c4 ^ (rr / 2)) * 16)),
        row_rope(8 * (tid_ / 32) + rr),
        stride(p_.kv_stride_bytes),
        paged_ids(!kMx && blk_.rows.paged()),
        ids{s_base_ + L::kIdsOffset},
        src_main(static_cast<uint32_t>(row_main * stride) + c8 * 16),  // < 2^31: rows < 64
        src_rope(static_cast<uint32_t>(row_rope * stride) + 512 + c4 * 16),
        step16(static_cast<uint32_t>(16 * stride)) {}

  // Before the tile loop: O^T = 0, the lane's V^T load addresses (computed here, not with the copy
  // addressing: live across the prologue they cost registers there).
  MLAGEN_DEVICE void begin_tiles(int w, int g, int t) {
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < 16; ++i) o[mb][i] = 0.f;
    const int rot = 2 * (t / 2);
    sel_even = rot ? 0x1054u : 0x5410u, sel_odd = rot ? 0x3276u : 0x7632u;
#pragma unroll
    for (int i = 0; i < 4; ++i) voff[i] = L::kv_at(4 * t + ((i + rot) & 3), 32 * w + 4 * g);
  }

  // The thread's rows of a tile from a row address each (null: past the end, zeros): main row
  // blocks k < kMainK as 4 x 128 bytes, then the rope blocks as 64 bytes.
  MLAGEN_DEVICE void copy_rows(const Params& p, uint32_t dst, const uint8_t* const (&src)[kMainK + kRopeK]) const {
    const uint8_t* const none = p.kv;  // (a zero fill's source; read once, so that each copy selects it)
#pragma unroll
    for (int i = 0; i < 4 * kMainK; ++i)
      sm90::cp_async_16(dst + dst_main + (i % 4) * L::kAtom128Bytes + (i / 4) * 2048,
                        src[i / 4] ? src[i / 4] + (i % 4) * 128 + c8 * 16 : none, src[i / 4] != nullptr);
#pragma unroll
    for (int i = 0; i < kRopeK; ++i)
      sm90::cp_async_16(dst + dst_rope + i * 2048, src[kMainK + i] ? src[kMainK + i] + 512 + c4 * 16 : none,
                        src[kMainK + i] != nullptr);
  }
  MLAGEN_DEVICE void issue(const Params& p, int j, bool& page_bad) const {
    using namespace sm90;
    const int ntiles = blk.range.ntiles, tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
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
        copy_rows(p, dst, src);
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
        copy_rows(p, dst, src);
      }
    }
    cp_async_commit();
  }
  // The ring's first kAhead tiles and the q loads (load_q): the copies first; paged, after the
  // first tiles' ids, which the q loads share one round trip with.
  template <class LoadQ>
  MLAGEN_DEVICE void start(const Params& p, LoadQ&& load_q, bool& page_bad) const {
    if (paged_ids) {  // the first tiles' ids and q in one round trip; then the copies
      ids.template stage_first<L::kIdsAhead, L::kThreads>(blk.rows, blk.range.tok_begin, blk.range.tok_end, tid, load_q);
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) issue(p, j, page_bad);
    if (!paged_ids) load_q();
  }

  // Q as e4m3 hi / lo rows (stage_q_row) and the row's 1 / c; mxfp4: the expansion's tables.
  template <class DimOf>
  MLAGEN_DEVICE void stage_q(const QQuant& qq, const uint2 (&q_raw)[18], uint32_t s_q, int h, int part, DimOf&& dim_of) const {
    using namespace sm90;
    const float inv_c = stage_q_row<T::kQ, true>(qq, q_raw, [&](int i, uint32_t hi, uint32_t lo) {
      const int d = dim_of(i);
      sts32(s_q + L::q_at(h, d), hi);
      sts32(s_q + L::q_at(kGroupRows + h, d), lo);
    });
    if (part == 0) col_scale[h] = inv_c;  // S = (hi column) / c + (lo column) / (16 c)
    if (kMx && tid < L::kMxLut) {  // entry i: the e4m3 bytes of the E2M1 magnitudes x 2^(i - 13), rounded to nearest even
      const float f = pow2i(tid - 13);
      const uint32_t t0 = pack_e4m3x2(0.f, 0.5f * f) | (static_cast<uint32_t>(pack_e4m3x2(f, 1.5f * f)) << 16);
      const uint32_t t1 = pack_e4m3x2(2.f * f, 3.f * f) | (static_cast<uint32_t>(pack_e4m3x2(4.f * f, 6.f * f)) << 16);
      reinterpret_cast<uint2*>(smem + L::kLutOffset)[tid] = make_uint2(t0, t1);
    }
  }
  // The S factors of the thread's columns (after the q barrier): 1 / c of the row, the scales.
  MLAGEN_DEVICE void scale_columns(const Params& p, const QQuant& qq, const int (&head)[4]) {
    const float s_scale = kv_scale * qq.scale * p.sm_scale * kLog2e;  // log2 domain
#pragma unroll
    for (int k = 0; k < 4; ++k) cs_hi[k] = col_scale[head[k]] * s_scale;
  }

  // mxfp4: packed stage -> the e4m3 tile. Token n's values are E2M1 x 2^(scale byte - 127)
  // per block of 32 dims; the tile holds them as e4m3 x 2^g_n with g_n = (the token's largest
  // block exponent) - 6, so its largest block lands under 6 x 2^6 = 384 <= 448: a block at
  // x = (its exponent) - g_n >= -8 is exact (down to 14 binades below the token's largest),
  // x in -13..-9 is rounded onto e4m3's subnormals, below that zero. g_n >= -64: only blocks
  // with scales below 2^-72 lose precision that way whatever their token. 2^g_n moves to the
  // token's S (x 2^g_n) and P (x 2^g_n, folded into the exponent of the softmax). Thread ->
  // token tid % 64, blocks 9 (tid / 64) .. + 8: a quarter warp stores 8 consecutive tokens'
  // 16-byte pieces, 8 distinct swizzle positions.
  MLAGEN_DEVICE void expand_tile(const Params& p, int it) const {
    using namespace sm90;
    const int tok0 = blk.range.tok_begin + it * BN, valid = blk.range.tok_end - tok0, n = tid % BN;
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
        uint32_t o8[8];
        e2m1x8_to_e4m3(w.x, tab.x, tab.y, o8[0], o8[1]);
        e2m1x8_to_e4m3(w.y, tab.x, tab.y, o8[2], o8[3]);
        e2m1x8_to_e4m3(w.z, tab.x, tab.y, o8[4], o8[5]);
        e2m1x8_to_e4m3(w.w, tab.x, tab.y, o8[6], o8[7]);
        sts128(s_base + L::kv_at(n, 32 * kb), make_uint4(o8[0], o8[1], o8[2], o8[3]));
        sts128(s_base + L::kv_at(n, 32 * kb + 16), make_uint4(o8[4], o8[5], o8[6], o8[7]));
      }
    };
    if (tid < BN)
      blocks(std::integral_constant<int, 0>{});
    else
      blocks(std::integral_constant<int, kMxBlocks / 2>{});
  }
  // The tile the products read once tile `it` landed: fp8, its slot; mxfp4, the e4m3 tile,
  // expanded here from the packed slot (and the powers of two of the thread's rows row0, row0 + 8).
  MLAGEN_DEVICE uint32_t operand_tile(const Params& p, int it, int row0) {
    using namespace sm90;
    if constexpr (kMx) {
      expand_tile(p, it);
      fence_proxy_async_smem();  // the tile's generic-proxy stores, seen by the wgmmas
      __syncthreads();
#pragma unroll
      for (int r = 0; r < 2; ++r) tpow[r] = tok_pow[row0 + 8 * r], tmul[r] = tok_mul[row0 + 8 * r];
      return s_base;
    } else {
      return s_base + (it % ST) * L::kStageBytes;
    }
  }

  // S^T for the tile's 64 tokens: 18 k-steps of 32 dims (issued and committed; the body waits).
  MLAGEN_DEVICE void scores(float (&s)[kSRegs], uint32_t tile, uint64_t q_desc) const {
    using namespace sm90;
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
  }
  // Slot k's S (log2 domain) at the thread's tokens r = 0, 1 (row0 + 8 r): hi + lo / 16 columns;
  // mxfp4: x 2^g of the token (V / 2^g is what the tile holds).
  MLAGEN_DEVICE float score(const float (&s)[kSRegs], int k, int r) const {
    const int jh = k / 2, e = k % 2;
    float x = s[4 * jh + 2 * r + e] * cs_hi[k] + s[4 * (jh + 2) + 2 * r + e] * (cs_hi[k] * 0.0625f);
    if constexpr (kMx) x *= tmul[r];
    return x;
  }
  // The exponent P is taken of: S + g for mxfp4 (P x 2^g meets the tile's V / 2^g), S otherwise.
  MLAGEN_DEVICE float exponent(float sv, int r) const { return kMx ? sv + tpow[r] : sv; }
  // The running sum's step from l alpha: 2^(S - m) of the thread's two tokens; for mxfp4 that is
  // P / 2^g (up to 2^64: g >= -64).
  MLAGEN_DEVICE static float sum_step(float l_alpha, float p0, float p1, const float (&sv)[2], float mb) {
    return l_alpha + (kMx ? fast_exp2(sv[0] - mb) + fast_exp2(sv[1] - mb) : p0 + p1);
  }
  // P x256 (p in [2^-14, 1] stays a normal e4m3) as hi / lo columns of P^T, a byte a store.
  MLAGEN_DEVICE void store_p(uint32_t s_p, const float (&pv)[2][4], const int (&head)[4], int row0) const {
    using namespace sm90;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t hi, lo;
      split_e4m3(pv[0][k] * 256.f, pv[1][k] * 256.f, hi, lo);
      sts8(s_p + L::p_at(head[k], row0), hi & 0xffu);
      sts8(s_p + L::p_at(head[k], row0 + 8), hi >> 8);
      sts8(s_p + L::p_at(kGroupRows + head[k], row0), lo & 0xffu);
      sts8(s_p + L::p_at(kGroupRows + head[k], row0 + 8), lo >> 8);
    }
  }
  MLAGEN_DEVICE void rescale(const float (&alpha)[4]) {
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
      for (int i = 0; i < 16; ++i) o[mb][i] *= alpha[2 * ((i / 4) % 2) + (i % 2)];
  }

  // V^T fragments of k-step ks (32 tokens), m64 blocks 2q, 2q+1: lane (g, t) of warp w holds
  // the dims 128 q + 32 w + 4 g + {0, 1 | 2, 3} (rows g, g+8 of each block) of tokens
  // 32 ks + 16 v + 4t .. +3: four 4-byte loads, one 4x4 byte transpose (8 prmt).
  MLAGEN_DEVICE void v_frags(uint32_t tile, int ks, uint32_t (&a)[8][4]) const {
    using namespace sm90;
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
  }
  // V^T of the first 32 tokens, loaded before P's barrier (S is dead: registers)
  struct VFirst {
    uint32_t a[8][4];
  };
  MLAGEN_DEVICE VFirst v_first(uint32_t tile) const {
    VFirst v;
    v_frags(tile, 0, v.a);
    return v;
  }
  // O^T += V^T P^T: 2 k-steps of 32 tokens x 8 m64 blocks, V^T from registers.
  MLAGEN_DEVICE void accumulate(uint32_t tile, VFirst& v0, uint64_t p_desc) {
    using namespace sm90;
    uint32_t (&a0)[8][4] = v0.a;
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

  // The epilogue's factor beside 1 / l (the KV scale), and slot k's row: O[head][dim]: m64 block
  // mb, row r -> dim 128 (mb / 2) + 32 w + 4 g + 2 (mb % 2) + r: four consecutive dims per
  // (k, mb / 2). Columns: hi + lo / 16 (inv carries P's / 256).
  MLAGEN_DEVICE float o_scale() const { return kv_scale; }
  template <class Out>
  MLAGEN_DEVICE void store_row(const Out& out, int k, int head, float inv, int w, int g) {
    const int jh = k / 2, e = k % 2;
    const auto dst = out.row(head);
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
  }
  template <class Out>
  MLAGEN_DEVICE void store_rows_staged(const Out&) const {}  // (the rows went out from registers)
};

// The format policy of decode_wgmma, and its tile layout (Tiling::Wg).
template <class T, class Shape>
using WgKv = std::conditional_t<T::kKv == KvFormat::kBf16, WgBf16Kv<T, Shape>, WgE4m3Kv<T, Shape>>;
template <int kStages, KvFormat kKv>
using WgTileLayout = std::conditional_t<kKv == KvFormat::kBf16, WgBf16Layout<kStages>, WgLayout<kStages, kKv>>;

// Block (split, row group, sequence): its 16 query rows over its share of the sequence's tokens in
// tiles of 64 through the policy's cp.async ring. Per tile: S^T (the format's wgmma chain), the
// columns' tile max (wg_column_max) and the online-softmax step, P^T into shared memory, O^T +=
// V^T P^T (the format's wgmma chain); then l over the warpgroup and the rows written (write_rows).
template <class T, class Shape>
MLAGEN_DEVICE void decode_wgmma(const Params& p, uint8_t* smem) {
  using namespace sm90;
  using Kv = WgKv<T, Shape>;
  using L = typename Kv::L;
  constexpr int BN = L::kBlockN, W = 4;
  static_assert(W == kWgWarps, "one warpgroup: wg_columns.cuh reduces over its 4 warps");
  static_assert(MLAGEN_WARP_SIZE == 32, "wgmma fragments are defined for 32-lane warps");
  static_assert(L::kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block: fewer stages");
  const uint32_t s_raw = smem_addr(smem);
  const uint32_t s_base = (s_raw + L::kAlign - 1) & ~static_cast<uint32_t>(L::kAlign - 1);
  smem += s_base - s_raw;
  const uint32_t s_q = s_base + L::kQOffset, s_p = s_base + L::kPOffset;
  float* red_max = reinterpret_cast<float*>(smem + L::kRedOffset);  // [warp][row]
  float* red_sum = red_max + W * kGroupRows;

  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits, ntiles = blk.range.ntiles, tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
  bool page_bad = false;  // a page id outside the cache (kv_rows.cuh)
  Kv kv(p, blk, s_base, smem, tid);

  // ---- the ring's first tiles and Q, once: thread -> query row h = tid / 8, 16-byte chunks
  // 8 j + tid % 8 (j = 0..8) of its row, as two 4-value loads: the 8 lanes of a head read 128
  // contiguous bytes (a thread-contiguous 72-dim run put every lane of a load in its own line:
  // geomean 43.2 -> 42.6 us). The loads go out before q_setup, which waits for the amax pre-pass
  // of an fp8 q; the first tiles' copies before them (paged: after them, the copies wait for the
  // ids' round trip, which the q loads then share: Kv::start).
  const int h = tid / 8, part = tid % 8;
  auto dim_of = [&](int i) { return 8 * (8 * (i / 2) + part) + 4 * (i % 2); };  // value 4 i .. 4 i + 3
  uint2 q_raw[18];
  auto load_q = [&] {
#pragma unroll
    for (int i = 0; i < 18; ++i) q_raw[i] = load_q4_raw<T::kQ>(p, blk.qr.token(h), blk.qr.head(h), dim_of(i));
  };
  kv.start(p, load_q, page_bad);
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  kv.stage_q(qq, q_raw, s_q, h, part, dim_of);
  fence_proxy_async_smem();
  __syncthreads();

  // This thread's query rows (columns of S^T and O^T): slot k -> row wg_column(k, t)
  // of the block's 16 (`head[k]`: the block's rows are 16 heads of one token at q_len 1).
  int head[4], key_end[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    head[k] = wg_column(k, t);
    key_end[k] = min(tok_end, blk.qr.key_end(head[k]));  // causal: the row's last key + 1
  }
  kv.scale_columns(p, qq, head);
  float m[4], l[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) m[k] = -INFINITY, l[k] = 0.f;
  const uint64_t q_desc = wgmma_desc(s_q, L::kQLbo, L::kQSbo);
  const uint64_t p_desc = wgmma_desc(s_p, L::kPLbo, L::kPSbo);
  const int row0 = 16 * w + g;  // tile token of accumulator row g (row g + 8: +8)
  kv.begin_tiles(w, g, t);

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<Kv::kAhead - 1>();  // tile `it` landed (later ones may still fly)
    fence_proxy_async_smem();
    __syncthreads();  // ... for every thread; P, the maxima and tile it-1's slot are free
    if constexpr (Kv::kRefill == WgRefill::kOnLanded) kv.issue(p, it + Kv::kAhead, page_bad);
    const uint32_t tile = kv.operand_tile(p, it, row0);

    // ---- S^T for the tile's 64 tokens -------------------------------------------------------
    float s[Kv::kSRegs];
#pragma unroll
    for (int i = 0; i < Kv::kSRegs; ++i) s[i] = 0.f;
    kv.scores(s, tile, q_desc);
    // the next tile's copies go out while the tensor cores run S (slot (it - 1) % ST, which
    // every thread is done with since the barrier above; S reads slot it % ST)
    if constexpr (Kv::kRefill == WgRefill::kDuringScores) kv.issue(p, it + Kv::kAhead, page_bad);
    wgmma_wait<0>();
    wgmma_fence_regs(s);

    // ---- softmax: the rows' tile maxima meet in shared memory --------------------------------
    const int tok0 = tok_begin + it * BN;
    // sv: S (log2 domain), -inf past the row's last key; se: the exponent P is taken of
    float sv[2][4], se[2][4], tm[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sv[r][k] = tok0 + row0 + 8 * r < key_end[k] ? kv.score(s, k, r) : -INFINITY;
        se[r][k] = kv.exponent(sv[r][k], r);
      }
    wg_column_max(se, head, red_max, w, g, tm);
    float alpha[4], pv[2][4];  // pv: P of the thread's tokens
    bool rescale = false;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      alpha[k] = online_step<Shape::kRowsEndEarly>(m[k], tm[k]);
      rescale |= alpha[k] != 1.f;
    }
    // P = 2^(se - m) (a row with no key yet: P = 0), l += its sum, P^T to shared memory
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float mb = step_base<Shape::kRowsEndEarly>(m[k]);
      pv[0][k] = fast_exp2(se[0][k] - mb);
      pv[1][k] = fast_exp2(se[1][k] - mb);
      l[k] = Kv::sum_step(l[k] * alpha[k], pv[0][k], pv[1][k], {sv[0][k], sv[1][k]}, mb);
    }
    kv.store_p(s_p, pv, head, row0);
    if (__any_sync(0xffffffffu, rescale)) kv.rescale(alpha);  // the running max moved for some row of the warp
    typename Kv::VFirst v0 = kv.v_first(tile);
    fence_proxy_async_smem();
    __syncthreads();  // P complete

    // ---- O^T += V^T P^T ---------------------------------------------------------------------
    kv.accumulate(tile, v0, p_desc);
    if constexpr (Kv::kRefill == WgRefill::kAfterO) {
      __syncthreads();  // every warp's wgmmas are done with slot it % ST: refill it
      kv.issue(p, it + Kv::kAhead, page_bad);
    }
  }
  cp_async_wait<0>();
  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;

  // ---- epilogue: l over the 8 row lanes and the 4 warps -------------------------------------
  // (the sum's barrier also puts every thread past the loop: the ring is free for a staging)
  wg_column_sum(l, head, red_sum, w, g);
  write_rows(p, blk.qr, splits, [&](const auto& out) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float inv = out.scale(l[k], kv.o_scale(), bad) * Kv::kOUnit;
      kv.store_row(out, k, head[k], inv, w, g);
      if (w == 0 && g == 0) out.state(head[k], m[k], l[k], bad);
    }
    kv.store_rows_staged(out);
  });
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
