// MLA decode, bf16 KV on sm_90a: the bf16 policy of the warpgroup (wgmma) body for 16 query rows a
// block (mla_decode_sm90_wgmma.cuh decode_wgmma), and its tile layout (the rows body's too).
//
// Both products read the KV tile where cp.async landed it; nothing is converted:
//
//   S^T = K Q^T      wgmma m64n16k16 bf16, A = the tile (64 tokens x 576 dims, K-major, 128B
//                    swizzle), B = the block's 16 query rows (bf16, K-major).
//   O^T += V^T P^T   wgmma m64n16k16 bf16, A = the same tile read M-major (dims are M, the
//                    descriptor's transpose bit: V^T needs no copy and no register), B = P^T
//                    (bf16, the 16 rows x 64 tokens the softmax stored).
//
// Block = one warpgroup, tiles of 64 tokens (72 KB: a 2-stage ring, ~165 KB of shared memory,
// one block an SM; the split heuristic aims at one block an SM: codegen/spec.py target_blocks).
// The decode is bound by the KV stream at 16 rows: the tensor cores run 68 small wgmmas a
// tile, and a slot is refilled the moment its tile's O wgmmas finish, so both tiles of the
// ring are in flight while the block waits.
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/wg_columns.cuh"
#include "mlagen/device/kv_rows.cuh"

#if defined(MLAGEN_NVIDIA)
namespace mlagen::device {

template <int kStages_>
struct WgBf16Layout {
  static constexpr int kBlockN = 64;  // tokens a tile = the M of the S wgmma
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 128;  // one warpgroup
  // The tile: 9 atoms of 64 dims (128 bytes of a row, 128B swizzle), atom a at a * 8192:
  // token r's 128 bytes at (r / 8) * 1024 + (r % 8) * 128, its 16-byte chunk c at (c ^ (r % 8)) * 16.
  // K-major for S (k-steps of 16 dims: 32 bytes into an atom), M-major for V^T (an m64 block
  // = one atom, k-steps of 16 tokens = 2048 bytes).
  static constexpr int kAtomBytes = kBlockN * 128;   // 8192
  static constexpr int kAtoms = 2 * kQkDim / 128;    // 9
  static constexpr int kVAtoms = 2 * kVDim / 128;    // 8: V = the first 512 dims
  static constexpr int kStageBytes = kAtoms * kAtomBytes;  // 73728
  static constexpr int kAlign = 1024;
  // Q: 16 rows x 1152 bytes and P^T: 16 rows x 128 bytes, no swizzle (core matrices of 8 rows
  // x 16 bytes, LBO 128 along K, SBO between the two 8-row groups)
  static constexpr int kQLbo = 128, kQSbo = (2 * kQkDim / 16) * 128, kQBytes = 2 * kQSbo;  // 9216, 18432
  static constexpr int kPLbo = 128, kPSbo = (2 * kBlockN / 16) * 128, kPBytes = 2 * kPSbo;  // 1024, 2048
  static constexpr int kQOffset = kStages * kStageBytes;
  static constexpr int kPOffset = kQOffset + kQBytes;
  static constexpr int kRedOffset = kPOffset + kPBytes;  // [4 warps][16 rows] x 2 floats
  static constexpr int kSmemBytes = kRedOffset + 2 * 4 * kGroupRows * 4 + kAlign;
  // The epilogue's O staging ([16 rows][kOPitch] floats) reuses the ring.
  static constexpr int kOPitch = kVDim + 4;
  static_assert(kGroupRows * kOPitch * 4 <= kStages * kStageBytes, "O staging fits the ring");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block: fewer stages");

  MLAGEN_DEVICE static uint32_t q_at(int row, int byte) {
    return (row / 8) * kQSbo + (byte / 16) * kQLbo + (row % 8) * 16 + byte % 16;
  }
};

// ---- the bf16 policy of decode_wgmma ----------------------------------------------------------
// The tile lands as stored and is both products' A operand (V^T through the descriptor's
// transpose bit); q and P go in as bf16 (N = 16). The policy holds the thread's O^T and its copy
// addressing.
template <class T, class Shape>
struct WgBf16Kv {
  using L = WgBf16Layout<T::kStages>;
  static constexpr int BN = L::kBlockN, ST = L::kStages;
  // ST tiles in flight beside the one computed: a slot is refilled as soon as the O wgmmas of its
  // tile are done (the end of the loop body), so the whole ring flies while the block waits
  static constexpr int kAhead = ST;
  static constexpr WgRefill kRefill = WgRefill::kAfterO;
  static constexpr int kSRegs = 8;  // S^T m64n16: 16 tokens' columns a thread
  static constexpr float kOUnit = 1.f;

  // (Params is an argument of the steps, not a member: read through a member reference, the zero
  // fills' source p.kv was not hoisted and each copy's select became a branch and a load)
  const BlockSetup<Shape>& blk;
  const uint32_t s_base;
  float* const ostage;  // the epilogue's O staging, [row][kOPitch] floats over the ring
  const int tid;
  float o[L::kVAtoms][8];  // O^T m64 block mb: o[mb][4 jh + 2 r + e] = dim 64 mb + 16 w + g + 8 r, row 8 jh + 2 t + e
  float s_scale = 0.f;

  // ---- tile copies: tile j into slot j % ST, one commit group a tile (empty past the end) ----
  // A warp instruction copies 4 rows x 128 bytes of one atom (lane l: row 16 k + 4 w + l / 8,
  // chunk l % 8): 36 copies a thread, each offset a per-thread constant plus a compile-time one.
  static constexpr int kRowBlocks = BN / 16;  // the thread's rows 16 k + row_main
  const int r8, c8;
  const uint32_t dst_row;
  const int row_main;
  const int64_t stride;
  const uint32_t src_row;  // rows < 64
  const uint32_t step16;
  const bool paged_ids;
  TileIds<BN> next_ids{};  // paged: the next tile's page ids, one row a lane, a tile ahead
  // P^T stores (stmatrix.trans): lane 8 i + q stores row q of matrix i = (jh, r) = (i / 2, i % 2):
  // P^T row 8 jh + q, tokens 16 w + 8 r .. + 7
  uint32_t p_store;

  MLAGEN_DEVICE WgBf16Kv(const Params& p_, const BlockSetup<Shape>& blk_, uint32_t s_base_, uint8_t* smem, int tid_)
      : blk(blk_), s_base(s_base_), ostage(reinterpret_cast<float*>(smem)), tid(tid_),
        r8(4 * ((tid_ / 32) % 2) + (tid_ % 32) / 8), c8(tid_ % 8),
        dst_row(((tid_ / 32) / 2) * 1024 + r8 * 128 + ((c8 ^ r8) * 16)),
        row_main(4 * (tid_ / 32) + (tid_ % 32) / 8),
        stride(p_.kv_stride_bytes),
        src_row(static_cast<uint32_t>(row_main * stride) + c8 * 16),
        step16(static_cast<uint32_t>(16 * stride)),
        paged_ids(blk_.rows.paged()) {}

  // Before the tile loop: O^T = 0, the lane's P^T store address.
  MLAGEN_DEVICE void begin_tiles(int w, int, int) {
#pragma unroll
    for (int mb = 0; mb < L::kVAtoms; ++mb)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
    const int lane = tid % 32;
    p_store = s_base + L::kPOffset + ((lane / 8) / 2) * L::kPSbo + (2 * w + (lane / 8) % 2) * L::kPLbo + (lane % 8) * 16;
  }

  // Tile j's copies from `ids` (paged: its page ids).
  MLAGEN_DEVICE void issue_from(const Params& p, int j, const TileIds<BN>& ids, bool& page_bad) const {
    using namespace sm90;
    if (j < blk.range.ntiles) {
      const int tok0 = blk.range.tok_begin + j * BN, rows_left = blk.range.tok_end - tok0;
      const uint32_t dst = s_base + (j % ST) * L::kStageBytes + dst_row;
      if (rows_left >= BN && blk.rows.template tile_contiguous<BN>()) {  // one run of rows: one base a tile
        const uint8_t* base = paged_ids ? p.kv + ids.row(blk.rows, tok0, 0, page_bad) * stride : blk.rows.ptr(tok0, page_bad);
#pragma unroll
        for (int k = 0; k < kRowBlocks; ++k) {
          const uint8_t* src = base + (src_row + k * step16);
#pragma unroll
          for (int a = 0; a < L::kAtoms; ++a) cp_async_16_full(dst + a * L::kAtomBytes + k * 2048, src + a * 128);
        }
      } else {  // pages shorter than a tile, or a split's short last tile: a row address each
        const uint8_t* const none = p.kv;  // (a zero fill's source; read once, so that each copy selects it)
        const uint8_t* src[kRowBlocks];  // (all addresses first: the copies' asm clobbers memory)
#pragma unroll
        for (int k = 0; k < kRowBlocks; ++k) {
          const int row = 16 * k + row_main;
          const uint8_t* r = paged_ids ? p.kv + ids.row(blk.rows, tok0, row, page_bad) * stride  // (every lane: a shuffle)
                                       : blk.rows.ptr(tok0 + row, page_bad);  // (contiguous: arithmetic only)
          src[k] = row < rows_left ? r + c8 * 16 : nullptr;
        }
#pragma unroll
        for (int k = 0; k < kRowBlocks; ++k)
#pragma unroll
          for (int a = 0; a < L::kAtoms; ++a)
            cp_async_16(dst + a * L::kAtomBytes + k * 2048, src[k] ? src[k] + a * 128 : none, src[k] != nullptr);
      }
    }
    cp_async_commit();
  }
  // The loop's refill: tile j from the ids loaded a tile ago, the next tile's loaded now.
  MLAGEN_DEVICE void issue(const Params& p, int j, bool& page_bad) {
    const TileIds<BN> ids = next_ids;
    if (paged_ids && j + 1 < blk.range.ntiles) next_ids.load(blk.rows, blk.range.tok_begin + (j + 1) * BN, blk.range.tok_end, tid % 32);
    issue_from(p, j, ids, page_bad);
  }
  // The ring's first ST tiles and the q loads (load_q): paged, the loads go out beside the first
  // tiles' ids, one round trip before the copies; contiguous, after the copies.
  template <class LoadQ>
  MLAGEN_DEVICE void start(const Params& p, LoadQ&& load_q, bool& page_bad) {
    const int lane = tid % 32, tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
    if (paged_ids) {
      TileIds<BN> first[ST];
#pragma unroll
      for (int j = 0; j < ST; ++j) first[j].load(blk.rows, tok_begin + j * BN, tok_end, lane);
      load_q();
#pragma unroll
      for (int j = 0; j < ST; ++j) issue_from(p, j, first[j], page_bad);
      if (ST < blk.range.ntiles) next_ids.load(blk.rows, tok_begin + ST * BN, tok_end, lane);
    } else {
#pragma unroll
      for (int j = 0; j < ST; ++j) issue_from(p, j, next_ids, page_bad);
      load_q();
    }
  }

  // Q as bf16 rows: thread -> row h, dims 64 c + 8 part .. + 7 (c = 0..8); exact in bf16 for
  // every q format.
  template <class DimOf>
  MLAGEN_DEVICE void stage_q(const QQuant& qq, const uint2 (&q_raw)[18], uint32_t s_q, int h, int, DimOf&& dim_of) const {
    using namespace sm90;
#pragma unroll
    for (int i = 0; i < 18; ++i) {
      const float4 v = q4_from_raw<T::kQ>(qq, q_raw[i]);
      const uint32_t at = s_q + L::q_at(h, 2 * dim_of(i));
      sts32(at, pack_bf16x2_rn(v.x, v.y));
      sts32(at + 4, pack_bf16x2_rn(v.z, v.w));
    }
  }
  MLAGEN_DEVICE void scale_columns(const Params& p, const QQuant& qq, const int (&)[4]) {
    s_scale = qq.scale * p.sm_scale * kLog2e;  // log2 domain (bf16 KV: no KV scale)
  }
  // The tile the products read once tile `it` landed: its slot.
  MLAGEN_DEVICE uint32_t operand_tile(const Params&, int it, int) const { return s_base + (it % ST) * L::kStageBytes; }

  // S^T: 36 k-steps of 16 dims (4 into each atom), issued and committed (the body waits).
  MLAGEN_DEVICE void scores(float (&s)[kSRegs], uint32_t tile, uint64_t q_desc) const {
    using namespace sm90;
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    wgmma_fence_regs(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * L::kAtoms; ++ks)
      wgmma_m64n16k16_bf16_ss(s, wgmma_desc_advance(k_desc, (ks / 4) * L::kAtomBytes + (ks % 4) * 32),
                              wgmma_desc_advance(q_desc, 2 * ks * L::kQLbo), ks > 0);
    wgmma_commit();
  }
  // Slot k's S (log2 domain) at the thread's tokens r = 0, 1 (row0 + 8 r).
  MLAGEN_DEVICE float score(const float (&s)[kSRegs], int k, int r) const { return s[4 * (k / 2) + 2 * r + k % 2] * s_scale; }
  MLAGEN_DEVICE float exponent(float sv, int) const { return sv; }
  MLAGEN_DEVICE static float sum_step(float l_alpha, float p0, float p1, const float (&)[2], float) { return l_alpha + p0 + p1; }
  // P as bf16 pairs: [jh][r] = (row 8 jh + 2t, + 1) at token row0 + 8 r, one stmatrix.trans.
  MLAGEN_DEVICE void store_p(uint32_t, const float (&pv)[2][4], const int (&)[4], int) const {
    using namespace sm90;
    uint32_t pw[2][2];
#pragma unroll
    for (int jh = 0; jh < 2; ++jh)
#pragma unroll
      for (int r = 0; r < 2; ++r) pw[jh][r] = pack_bf16x2_rn(pv[r][2 * jh], pv[r][2 * jh + 1]);
    stmatrix_x4_trans(p_store, pw[0][0], pw[0][1], pw[1][0], pw[1][1]);
  }
  MLAGEN_DEVICE void rescale(const float (&alpha)[4]) {
#pragma unroll
    for (int mb = 0; mb < L::kVAtoms; ++mb)
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mb][i] *= alpha[2 * (i / 4) + (i % 2)];
  }

  struct VFirst {};  // V^T is the tile itself, through the descriptor: nothing to load early
  MLAGEN_DEVICE VFirst v_first(uint32_t) const { return {}; }
  // O^T += V^T P^T: 4 k-steps of 16 tokens x 8 m64 blocks, V^T = the tile read M-major.
  MLAGEN_DEVICE void accumulate(uint32_t tile, VFirst&, uint64_t p_desc) {
    using namespace sm90;
    const uint64_t v_desc = wgmma_desc(tile, L::kAtomBytes, 1024, WgmmaSwizzle::k128B);
#pragma unroll
    for (int mb = 0; mb < L::kVAtoms; ++mb) wgmma_fence_regs(o[mb]);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
      for (int mb = 0; mb < L::kVAtoms; ++mb)
        wgmma_m64n16k16_bf16_ss_mn(o[mb], wgmma_desc_advance(v_desc, mb * L::kAtomBytes + ks * 2048),
                                   wgmma_desc_advance(p_desc, 2 * ks * L::kPLbo));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < L::kVAtoms; ++mb) wgmma_fence_regs(o[mb]);
  }

  // The epilogue: O through shared memory (the ring is free: the l sum's barrier put every thread
  // past the loop). Slot k's row into the staging, then (store_rows_staged) row h = tid / 8 in runs
  // of 8 dims, 8 lanes a row.
  MLAGEN_DEVICE float o_scale() const { return 1.f; }
  template <class Out>
  MLAGEN_DEVICE void store_row(const Out&, int k, int head, float inv, int w, int g) const {
    const int jh = k / 2, e = k % 2;
#pragma unroll
    for (int mb = 0; mb < L::kVAtoms; ++mb)
#pragma unroll
      for (int r = 0; r < 2; ++r) ostage[head * L::kOPitch + 64 * mb + 16 * w + g + 8 * r] = o[mb][4 * jh + 2 * r + e] * inv;
  }
  template <class Out>
  MLAGEN_DEVICE void store_rows_staged(const Out& out) const {
    __syncthreads();
    const int h = tid / 8, part = tid % 8;
    const float* src = ostage + h * L::kOPitch;
    const auto dst = out.row(h);
#pragma unroll
    for (int j = 0; j < kVDim / 64; ++j) {
      const int d = 8 * (part + 8 * j);
      const float4 a = *reinterpret_cast<const float4*>(src + d), b = *reinterpret_cast<const float4*>(src + d + 4);
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      dst.put(d, v);
    }
  }
};

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
