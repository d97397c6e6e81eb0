// MLA decode, bf16 KV on sm_90a: the warpgroup (wgmma) kernel for 16 query rows a block.
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

template <class T, class Shape>
MLAGEN_DEVICE void decode_wgmma_bf16(const Params& p, uint8_t* smem) {
  using namespace sm90;
  using L = WgBf16Layout<T::kStages>;
  constexpr int BN = L::kBlockN, ST = L::kStages, W = 4;
  static_assert(W == kWgWarps, "one warpgroup: wg_columns.cuh reduces over its 4 warps");
  static_assert(MLAGEN_WARP_SIZE == 32, "wgmma fragments are defined for 32-lane warps");
  const uint32_t s_raw = smem_addr(smem);
  const uint32_t s_base = (s_raw + L::kAlign - 1) & ~static_cast<uint32_t>(L::kAlign - 1);
  smem += s_base - s_raw;
  const uint32_t s_q = s_base + L::kQOffset, s_p = s_base + L::kPOffset;
  float* red_max = reinterpret_cast<float*>(smem + L::kRedOffset);  // [warp][row]
  float* red_sum = red_max + W * kGroupRows;

  const int tid = threadIdx.x, w = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const BlockSetup<Shape> blk = block_setup<T, Shape, BN>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits, ntiles = blk.range.ntiles,
            tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
  bool page_bad = false;

  // ---- tile copies: tile j into slot j % ST, one commit group a tile (empty past the end) ----
  // A warp instruction copies 4 rows x 128 bytes of one atom (lane l: row 16 k + 4 w + l / 8,
  // chunk l % 8): 36 copies a thread, each offset a per-thread constant plus a compile-time one.
  constexpr int kRowBlocks = BN / 16;  // the thread's rows 16 k + row_main
  const int r8 = 4 * (w % 2) + lane / 8, c8 = lane % 8;
  const uint32_t dst_row = (w / 2) * 1024 + r8 * 128 + ((c8 ^ r8) * 16);
  const int row_main = 4 * w + lane / 8;
  const int64_t stride = p.kv_stride_bytes;
  const uint32_t src_row = static_cast<uint32_t>(row_main * stride) + c8 * 16;  // rows < 64
  const uint32_t step16 = static_cast<uint32_t>(16 * stride);
  const bool paged_ids = blk.rows.paged();
  TileIds<BN> next_ids{};  // paged: the next tile's page ids, one row a lane, a tile ahead
  // Tile j's copies from `ids` (paged: its page ids).
  auto issue_tile_from = [&](int j, const TileIds<BN>& ids) {
    if (j < ntiles) {
      const int tok0 = tok_begin + j * BN, rows_left = tok_end - tok0;
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
            cp_async_16(dst + a * L::kAtomBytes + k * 2048, src[k] ? src[k] + a * 128 : p.kv, src[k] != nullptr);
      }
    }
    cp_async_commit();
  };
  // The loop's refill: tile j from the ids loaded a tile ago, the next tile's loaded now.
  auto issue_tile = [&](int j) {
    const TileIds<BN> ids = next_ids;
    if (paged_ids && j + 1 < ntiles) next_ids.load(blk.rows, tok_begin + (j + 1) * BN, tok_end, lane);
    issue_tile_from(j, ids);
  };
  // ---- Q as bf16, once: thread -> row h = tid / 8, dims 64 c + 8 part .. + 7 (c = 0..8) ------
  // (paged: the loads go out beside the first ST tiles' ids, one round trip before the copies;
  // contiguous: after the copies)
  const int qh = tid / 8, qpart = tid % 8;
  auto dim_of = [&](int i) { return 8 * (8 * (i / 2) + qpart) + 4 * (i % 2); };  // values 4 i .. 4 i + 3
  uint2 q_raw[18];
  auto load_q = [&] {
#pragma unroll
    for (int i = 0; i < 18; ++i) q_raw[i] = load_q4_raw<T::kQ>(p, blk.qr.token(qh), blk.qr.head(qh), dim_of(i));
  };
  // A slot is refilled as soon as the O wgmmas of its tile are done (the end of the loop body):
  // ST tiles fly while the block waits for one.
  if (paged_ids) {
    TileIds<BN> first[ST];
#pragma unroll
    for (int j = 0; j < ST; ++j) first[j].load(blk.rows, tok_begin + j * BN, tok_end, lane);
    load_q();
#pragma unroll
    for (int j = 0; j < ST; ++j) issue_tile_from(j, first[j]);
    if (ST < ntiles) next_ids.load(blk.rows, tok_begin + ST * BN, tok_end, lane);
  } else {
#pragma unroll
    for (int j = 0; j < ST; ++j) issue_tile_from(j, next_ids);
    load_q();
  }

  const QQuant qq = [&] {
    const QQuant quant = q_setup<T::kQ>(p, blk.q_given);  // (after the q loads: see decode_wgmma)
#pragma unroll
    for (int i = 0; i < 18; ++i) {
      const float4 v = q4_from_raw<T::kQ>(quant, q_raw[i]);  // exact in bf16 for every q format
      const uint32_t at = s_q + L::q_at(qh, 2 * dim_of(i));
      sts32(at, pack_bf16x2_rn(v.x, v.y));
      sts32(at + 4, pack_bf16x2_rn(v.z, v.w));
    }
    return quant;
  }();
  fence_proxy_async_smem();
  __syncthreads();
  const float s_scale = qq.scale * p.sm_scale * kLog2e;  // log2 domain (bf16 KV: no KV scale)

  // This thread's query rows (columns of S^T and O^T): slot k -> row wg_column(k, t).
  int head[4], key_end[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    head[k] = wg_column(k, t);
    key_end[k] = min(tok_end, blk.qr.key_end(head[k]));  // causal: the row's last key + 1
  }
  float o[L::kVAtoms][8];  // O^T m64 block mb: o[mb][4 jh + 2 r + e] = dim 64 mb + 16 w + g + 8 r, row 8 jh + 2 t + e
#pragma unroll
  for (int mb = 0; mb < L::kVAtoms; ++mb)
#pragma unroll
    for (int i = 0; i < 8; ++i) o[mb][i] = 0.f;
  float m[4], l[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) m[k] = -INFINITY, l[k] = 0.f;
  const uint64_t q_desc = wgmma_desc(s_q, L::kQLbo, L::kQSbo);
  const uint64_t p_desc = wgmma_desc(s_p, L::kPLbo, L::kPSbo);
  const int row0 = 16 * w + g;  // tile token of accumulator row g (row g + 8: +8)
  // P^T stores (stmatrix.trans): lane 8 i + q stores row q of matrix i = (jh, r) = (i / 2, i % 2):
  // P^T row 8 jh + q, tokens 16 w + 8 r .. + 7
  const uint32_t p_store = s_p + ((lane / 8) / 2) * L::kPSbo + (2 * w + (lane / 8) % 2) * L::kPLbo + (lane % 8) * 16;

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<ST - 1>();  // tile `it` landed (later ones may still fly)
    fence_proxy_async_smem();
    __syncthreads();  // ... for every thread; P and the maxima are free
    const uint32_t tile = s_base + (it % ST) * L::kStageBytes;

    // ---- S^T: 36 k-steps of 16 dims (4 into each atom) ---------------------------------------
    float s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = 0.f;
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    wgmma_fence_regs(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * L::kAtoms; ++ks)
      wgmma_m64n16k16_bf16_ss(s, wgmma_desc_advance(k_desc, (ks / 4) * L::kAtomBytes + (ks % 4) * 32),
                              wgmma_desc_advance(q_desc, 2 * ks * L::kQLbo), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_regs(s);

    // ---- softmax: the rows' tile maxima meet in shared memory --------------------------------
    const int tok0 = tok_begin + it * BN;
    float sv[2][4], tm[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int jh = k / 2, e = k % 2;
#pragma unroll
      for (int r = 0; r < 2; ++r)
        sv[r][k] = tok0 + row0 + 8 * r < key_end[k] ? s[4 * jh + 2 * r + e] * s_scale : -INFINITY;
    }
    wg_column_max(sv, head, red_max, w, g, tm);
    float alpha[4];
    bool rescale = false;
    uint32_t pw[2][2];  // P as bf16 pairs: [jh][r] = (row 8 jh + 2t, + 1) at token row0 + 8 r
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      alpha[k] = online_step<Shape::kRowsEndEarly>(m[k], tm[k]);
      rescale |= alpha[k] != 1.f;
      const float mb = step_base<Shape::kRowsEndEarly>(m[k]);  // (a row with no key yet: P = 0)
      sv[0][k] = fast_exp2(sv[0][k] - mb);
      sv[1][k] = fast_exp2(sv[1][k] - mb);
      l[k] = l[k] * alpha[k] + sv[0][k] + sv[1][k];
    }
#pragma unroll
    for (int jh = 0; jh < 2; ++jh)
#pragma unroll
      for (int r = 0; r < 2; ++r) pw[jh][r] = pack_bf16x2_rn(sv[r][2 * jh], sv[r][2 * jh + 1]);
    stmatrix_x4_trans(p_store, pw[0][0], pw[0][1], pw[1][0], pw[1][1]);
    if (__any_sync(0xffffffffu, rescale))  // the running max moved for some row of the warp
#pragma unroll
      for (int mb = 0; mb < L::kVAtoms; ++mb)
#pragma unroll
        for (int i = 0; i < 8; ++i) o[mb][i] *= alpha[2 * (i / 4) + (i % 2)];
    fence_proxy_async_smem();
    __syncthreads();  // P complete

    // ---- O^T += V^T P^T: 4 k-steps of 16 tokens x 8 m64 blocks ------------------------------
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
    __syncthreads();  // every warp's wgmmas are done with slot it % ST: refill it
    issue_tile(it + ST);
  }
  cp_async_wait<0>();
  const bool bad = blk.rows.block_any_bad(p, page_bad) || blk.seq.bad;

  // ---- epilogue: l over the 8 row lanes and the 4 warps, O through shared memory -------------
  // (the sum's barrier also puts every thread past the loop: the ring is free for the O staging)
  wg_column_sum(l, head, red_sum, w, g);
  float* ostage = reinterpret_cast<float*>(smem);  // [row][kOPitch]
  write_rows(p, blk.qr, splits, [&](const auto& out) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int jh = k / 2, e = k % 2;
      const float inv = out.scale(l[k], 1.f, bad);
#pragma unroll
      for (int mb = 0; mb < L::kVAtoms; ++mb)
#pragma unroll
        for (int r = 0; r < 2; ++r) ostage[head[k] * L::kOPitch + 64 * mb + 16 * w + g + 8 * r] = o[mb][4 * jh + 2 * r + e] * inv;
      if (w == 0 && g == 0) out.state(head[k], m[k], l[k], bad);
    }
    __syncthreads();
    // row h = tid / 8: runs of 8 dims, 8 lanes a row
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
  });
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
