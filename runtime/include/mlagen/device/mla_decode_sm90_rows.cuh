// MLA decode, fp8 KV on sm_90a, 64 query rows a block: the rows kernel (issue 18,
// docs/design-rows-as-m.md). For 64..128 rows a sequence (128 or 64 heads, 16 heads x 4 tokens),
// where the 16-row warpgroup kernel (mla_decode_sm90_wgmma.cuh) runs its whole per-tile chain
// once per 16 rows and stays latency-bound (docs/perf.md v10).
//
// Block = two warpgroups, 64 query rows, tiles of 64 tokens (the same cp.async ring and
// swizzled tile as the 16-row kernel, both groups issuing half of every tile's copies):
//
//   S^T = K Qhl^T     group c: the S of rows 32c .. 32c + 31, wgmma m64n64k32 e4m3, A = the KV
//                     tile (64 tokens x 576), B = those rows' q as e4m3 hi and lo parts (N = 32
//                     hi + 32 lo; an fp8 q is exact in hi: N = 32). Softmax row maxima meet over
//                     the group's 4 warps only (a named barrier).
//   P^T               f16 (11 significant bits) in shared memory, 64 rows x 64 tokens, both
//                     groups' halves; one block barrier.
//   O^T += V^T P^T    group c: the O of dims 256c .. 256c + 255 for all 64 rows, wgmma
//                     m64n64k16 f16, A = V^T in registers (each thread's 8 dims of two tokens:
//                     one 8-byte load a token, prmt + cvt.f16x2.e4m3x2, exact), B = P^T: 4 m64
//                     blocks x 4 k-steps a tile, 128 accumulator registers a thread.
//
// Per tile and 64 rows that is 18 (S) + 16 (O) wgmmas a group instead of the 16-row kernel's
// 4 x (18 + 16) narrower ones, one V^T conversion per dim instead of one per 16 rows, and the
// softmax of 8 rows a thread. One block an SM (256 threads x 255 registers, no spills).
// Measured (docs/perf.md v11): 322 us at 128 heads, 64x8192, against 471 with 16-row blocks; the
// two groups run S, softmax and O in lockstep, S at the SM's shared-memory bandwidth, the tensor
// cores ~50% busy. The generic kernel of this body (registry role 3) serves contiguous problems
// whose heads x q_len is a multiple of 64.
#pragma once
#include "mlagen/device/mla_decode_sm90_wgmma.cuh"

#if defined(MLAGEN_NVIDIA)
namespace mlagen::device {

template <int kStages_, QFormat kQ_>
struct RowsLayout {
  using Tile = WgLayout<kStages_, KvFormat::kFp8>;  // one ring slot: the 16-row kernel's swizzled tile
  static constexpr int kBlockN = Tile::kBlockN;     // 64 tokens a tile
  static constexpr int kStages = kStages_;
  static constexpr int kRows = 64;                  // query rows a block
  static constexpr int kGroups = 2;                 // warpgroups: group c owns S rows 32c.., O dims 256c..
  static constexpr int kGroupRows = kRows / kGroups;
  static constexpr int kThreads = 128 * kGroups;
  // a bf16 q is split into e4m3 hi + lo / 16; an fp8 q (given, or quantized here) is exact in hi
  static constexpr bool kQLo = kQ_ == QFormat::kBf16;
  static constexpr int kSN = kQLo ? 2 * kGroupRows : kGroupRows;  // N of a group's S^T wgmma
  // Q: per group kSN rows x 576 e4m3, K-major core matrices (8 rows x 16 bytes); row n of the B
  // operand is hi of local row n (n < 32) or lo of local row n - 32.
  static constexpr int kQLbo = 128, kQSbo = Tile::kChunksPerRow * 128, kQGroupBytes = kSN / 8 * kQSbo;
  // P^T: f16, 64 rows x 64 tokens, K-major core matrices (8 rows x 8 tokens)
  static constexpr int kPLbo = 128, kPSbo = kBlockN / 8 * 128, kPBytes = kRows / 8 * kPSbo;
  // An fp8 q leaves a group's last O wgmma (which reads all 64 rows of P) running past the next
  // tile's barrier: the other group must not write that P then, so P alternates between two
  // buffers by tile. A bf16 q waits for its O before the barrier: one buffer.
  static constexpr int kPBuffers = kQLo ? 1 : 2;
  static constexpr int kQOffset = kStages * Tile::kStageBytes;  // from the 1024-aligned base
  static constexpr int kPOffset = kQOffset + kGroups * kQGroupBytes;
  static constexpr int kRedOffset = kPOffset + kPBuffers * kPBytes;          // [4 warps][64 rows] maxima, then sums
  static constexpr int kAlphaOffset = kRedOffset + 2 * 4 * kRows * 4;  // [64] this tile's O rescale factors
  static constexpr int kColOffset = kAlphaOffset + kRows * 4;          // [64] q column scales 1 / c
  static constexpr int kRowCsOffset = kColOffset + kRows * 4;       // [64] the generic kernel's S factors
  static constexpr int kRowEndOffset = kRowCsOffset + kRows * 4;     // [64] ... and causal ends
  static constexpr int kSmemBytes = kRowEndOffset + kRows * 4 + Tile::kAlign;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block: fewer stages");

  MLAGEN_DEVICE static uint32_t q_at(int row, int byte) {
    return (row / 8) * kQSbo + (byte / 16) * kQLbo + (row % 8) * 16 + byte % 16;
  }
  MLAGEN_DEVICE static uint32_t p_at(int row, int token) {
    return (row / 8) * kPSbo + (token / 8) * kPLbo + (row % 8) * 16 + (token % 8) * 2;
  }
};

// The rows body's tiling (codegen/spec.py block_m 64): fp8 KV only.
template <int kStages_, QFormat kQ_>
struct RowsTiling {
  using L = RowsLayout<kStages_, kQ_>;
  static constexpr KvFormat kKv = KvFormat::kFp8;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = RowsTiling<kStages_, Q>;
  static constexpr bool kRowsBody = true, kWide = false, kWarpgroup = false;
  static constexpr int kRowsPerBlock = L::kRows;
  static constexpr float kVUnit = 1.f;  // partial O is in KV units (the combine applies the KV scale)
  static constexpr int kBlockN = L::kBlockN, kStages = kStages_;
  static constexpr int kThreads = L::kThreads;
  static constexpr int kSmemBytes = L::kSmemBytes;
  static constexpr int kMinBlocksPerSm = 1;
};

template <class T, class Shape>
MLAGEN_DEVICE void decode_rows(const Params& p, uint8_t* smem) {
  using namespace sm90;
  using L = typename T::L;
  using Tile = typename L::Tile;
  constexpr int BN = L::kBlockN, ST = L::kStages, R = L::kRows, GR = L::kGroupRows;
  constexpr bool kLo = L::kQLo;
  constexpr int kSAcc = L::kSN / 2;  // S^T accumulators a thread
  static_assert(MLAGEN_WARP_SIZE == 32, "wgmma fragments are defined for 32-lane warps");
  const uint32_t s_raw = smem_addr(smem);
  const uint32_t s_base = (s_raw + Tile::kAlign - 1) & ~static_cast<uint32_t>(Tile::kAlign - 1);
  smem += s_base - s_raw;
  const int tid = threadIdx.x, grp = tid / 128, w = (tid / 32) % 4, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t s_q = s_base + L::kQOffset + grp * L::kQGroupBytes, s_p = s_base + L::kPOffset;
  float* red_max = reinterpret_cast<float*>(smem + L::kRedOffset);  // [warp][block row]
  float* red_sum = red_max + 4 * R;
  float* alpha_x = reinterpret_cast<float*>(smem + L::kAlphaOffset);  // [block row]
  float* col_scale = reinterpret_cast<float*>(smem + L::kColOffset);  // [block row]: 1 / c
  // The softmax's per-row constants (S factor, causal end): registers in a specialized kernel; in
  // shared memory for the generic one, whose run-time shape leaves no room for 16 more registers
  // (120 bytes of spills with them)
  constexpr bool kRowsInSmem = Shape::kGeneric;
  float* row_cs = reinterpret_cast<float*>(smem + L::kRowCsOffset);
  int* row_end = reinterpret_cast<int*>(smem + L::kRowEndOffset);

  const BlockCoord bc = block_coord<Shape, R>(p);
  allow_dependent_launch();
  const int splits = Shape::splits(p);
  const Sequence seq = Shape::sequence(p, bc.b);
  const QueryRows qr = query_rows<Shape, R>(p, bc, seq);
  const float q_given = given_q_scale<T::kQ>(p);
  const SplitRange range = split_range(seq.len, bc.split, splits, BN);
  const int ntiles = range.ntiles, tok_begin = range.tok_begin, tok_end = range.tok_end;
  const KvRows<Shape::kPage> rows = KvRows<Shape::kPage>::of(p, seq);
  bool page_bad = false;
  const float kv_scale = kv_scale_of(p);

  // ---- tile j of the split into ring slot j % ST, one commit group a tile ----------------
  // Thread -> dims 0..511: 16-byte chunk tid % 8 of the 4 atoms of rows tid / 8 and tid / 8 + 32
  // (a warp instruction: 4 rows x 128 contiguous bytes); rope dims: chunk tid % 4 of row tid / 4.
  const int c8 = tid % 8, rm = tid / 8, c4 = tid % 4, rr = tid / 4;
  const uint32_t dst_main = (rm / 8) * 1024 + (rm % 8) * 128 + ((c8 ^ (rm % 8)) * 16);
  const uint32_t dst_rope = Tile::kRopeOffset + (rr / 8) * 512 + (rr % 8) * 64 + ((c4 ^ ((rr % 8) / 2)) * 16);
  const int64_t stride = p.kv_stride_bytes;
  const uint32_t src_main = static_cast<uint32_t>(rm * stride) + c8 * 16;  // < 2^31: rows < 64
  const uint32_t src_rope = static_cast<uint32_t>(rr * stride) + 512 + c4 * 16;
  const uint32_t step32 = static_cast<uint32_t>(32 * stride);
  auto issue_tile = [&](int j) {
    if (j < ntiles) {
      const int tok0 = tok_begin + j * BN, rows_left = tok_end - tok0;
      const uint32_t dst = s_base + (j % ST) * Tile::kStageBytes;
      if (rows_left >= BN && rows.template tile_contiguous<BN>()) {  // one run of rows: one base
        const uint8_t* base = rows.ptr(tok0, page_bad);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int a = 0; a < 4; ++a)
            cp_async_16_full(dst + dst_main + i * 4096 + a * Tile::kAtom128Bytes, base + (src_main + i * step32) + a * 128);
        cp_async_16_full(dst + dst_rope, base + src_rope);
        rows.template prefetch_ids<BN>(tok0 + BN, tok_end, tid);
      } else {  // pages shorter than a tile, or a split's short last tile: a row address each
        const int row[3] = {rm, rm + 32, rr};
        const uint8_t* src[3];
#pragma unroll
        for (int k = 0; k < 3; ++k) src[k] = row[k] < rows_left ? rows.ptr(tok0 + row[k], page_bad) : nullptr;
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int a = 0; a < 4; ++a)
            cp_async_16(dst + dst_main + i * 4096 + a * Tile::kAtom128Bytes, src[i] ? src[i] + a * 128 + c8 * 16 : p.kv,
                        src[i] != nullptr);
        cp_async_16(dst + dst_rope, src[2] ? src[2] + 512 + c4 * 16 : p.kv, src[2] != nullptr);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int j = 0; j < ST - 1; ++j) issue_tile(j);

  // ---- Q, once: group grp's 32 rows; thread -> row 16 ps + tid % 128 / 8 (ps = 0, 1), the 16-byte
  // chunks 8 j + tid % 8 of the row as 4-value loads (the 16-row kernel's mapping, twice)
  const int qh = (tid % 128) / 8, part = tid % 8;
  auto dim_of = [&](int i) { return 8 * (8 * (i / 2) + part) + 4 * (i % 2); };  // value 4 i .. 4 i + 3
  uint2 q_raw[2][18];
#pragma unroll
  for (int ps = 0; ps < 2; ++ps) {
    const int br = GR * grp + 16 * ps + qh;
#pragma unroll
    for (int i = 0; i < 18; ++i) q_raw[ps][i] = load_q4_raw<T::kQ>(p, qr.token(br), qr.head(br), dim_of(i));
  }
  const QQuant qq = q_setup<T::kQ>(p, q_given);
#pragma unroll
  for (int ps = 0; ps < 2; ++ps) {
    const int lr = 16 * ps + qh;
    // an fp8 q goes to the tensor cores as it is (exact in e4m3: no lo part)
    const float inv_c = stage_q_row<T::kQ, kLo>(qq, q_raw[ps], [&](int i, uint32_t hi, uint32_t lo) {
      const int d = dim_of(i);
      sts32(s_q + L::q_at(lr, d), hi);
      if constexpr (kLo) sts32(s_q + L::q_at(GR + lr, d), lo);
    });
    if (part == 0) col_scale[GR * grp + lr] = inv_c;  // S = (hi column) / c + (lo column) / (16 c)
  }
  fence_proxy_async_smem();
  __syncthreads();

  // This thread's S rows (columns of its group's S^T): slot k -> block row GR grp + 8 (k / 2) + 2t + k % 2.
  const float s_scale = kv_scale * qq.scale * p.sm_scale * kLog2e;  // log2 domain
  int srow[8], key_end[8];
  float cs[8];  // the lo column's factor is cs / 16
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    srow[k] = GR * grp + 8 * (k / 2) + 2 * t + (k % 2);
    if constexpr (kRowsInSmem) continue;
    cs[k] = col_scale[srow[k]] * s_scale;
    // causal: the row's last key + 1 (one query token sees the whole split: no per-row bound to keep)
    key_end[k] = Shape::kRowsEndEarly ? min(tok_end, qr.key_end(srow[k])) : tok_end;
  }
  if (kRowsInSmem && tid < R) {  // read after the first tile's barrier
    row_cs[tid] = col_scale[tid] * s_scale;
    row_end[tid] = min(tok_end, qr.key_end(tid));
  }
  float m[8], l[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) m[k] = -INFINITY, l[k] = 0.f;
  // O^T of the group's 256 dims, m64 block mb: accumulator row 16 w + g + 8 h is dim dv + mb + 4 h,
  // column 8 j + 2 t + e block row 8 j + 2 t + e (the thread's 8 dims are consecutive: one 16-byte
  // output store a row)
  const int dv = 256 * grp + 8 * (8 * w + g);
  float o[4][32];
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[mb][i] = 0.f;

  const uint64_t q_desc = wgmma_desc(s_q, L::kQLbo, L::kQSbo);
  const uint64_t p_desc0 = wgmma_desc(s_p, L::kPLbo, L::kPSbo);
  const int row0 = 16 * w + g;  // tile token of S^T accumulator row g (row g + 8: +8)
  // V^T fragments of k-step ks (tokens 16 ks ..): the thread's 8 dims of tokens 16 ks + 2t + {0, 1, 8, 9},
  // one 8-byte load each (a half warp's 16 loads hit 16 distinct 8-byte bank pairs: the tile's swizzle)
  uint32_t voff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) voff[i] = Tile::kv_at(2 * t + (i % 2) + 8 * (i / 2), dv);
  auto v_frags = [&](uint32_t tile, int ks, uint32_t (&a)[4][4]) {
    uint2 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = lds64(tile + voff[i] + ks * 2048);
    uint32_t d[4][4];
    v_pairs_to_f16x2(x[0].x, x[1].x, d[0]);  // dims dv + mb, tokens (n, n + 1)
    v_pairs_to_f16x2(x[0].y, x[1].y, d[1]);  // dims dv + 4 + mb
    v_pairs_to_f16x2(x[2].x, x[3].x, d[2]);  // dims dv + mb, tokens (n + 8, n + 9)
    v_pairs_to_f16x2(x[2].y, x[3].y, d[3]);
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[mb][r] = d[r][mb];
  };

  for (int it = 0; it < ntiles; ++it) {
    cp_async_wait<ST - 2>();  // tile `it` landed (later ones may still fly)
    fence_proxy_async_smem();
    __syncthreads();  // ... for every thread; the maxima and tile it-1's slot are free
    const uint32_t tile = s_base + (it % ST) * Tile::kStageBytes;

    // ---- S^T for the tile's 64 tokens x the group's rows: 18 k-steps of 32 dims ------------
    float s[kSAcc];  // (written by the first k-step)
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    const uint64_t rope_desc = wgmma_desc(tile + Tile::kRopeOffset, 16, 512, WgmmaSwizzle::k64B);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tile::kChunksPerRow / 2; ++ks) {
      const uint64_t a = ks < 16 ? wgmma_desc_advance(k_desc, (ks / 4) * Tile::kAtom128Bytes + (ks % 4) * 32)
                                 : wgmma_desc_advance(rope_desc, (ks - 16) * 32);
      const uint64_t b = wgmma_desc_advance(q_desc, 2 * ks * L::kQLbo);
      if constexpr (kLo) {
        if (ks == 0) wgmma_m64n64k32_e4m3_ss_first(s, a, b);
        else wgmma_m64n64k32_e4m3_ss(s, a, b, 1);
      } else {
        if (ks == 0) wgmma_m64n32k32_e4m3_ss_first(s, a, b);
        else wgmma_m64n32k32_e4m3_ss(s, a, b, 1);
      }
    }
    wgmma_commit();
    issue_tile(it + ST - 1);  // slot (it - 1) % ST is free since the barrier
    wgmma_wait<0>();  // S, and the previous tile's O (P and the factors are free again)
    wgmma_fence_regs(s);
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) wgmma_fence_regs(o[mb]);

    // ---- softmax over the group's rows: the tile maxima meet over its 4 warps ---------------
    const int tok0 = tok_begin + it * BN;
    const uint32_t s_pt = s_p + (it % L::kPBuffers) * L::kPBytes;  // this tile's P^T
    const uint64_t p_desc = wgmma_desc_advance(p_desc0, (it % L::kPBuffers) * L::kPBytes);
    float sv[2][8], mx[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int j = k / 2, e = k % 2;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float csk = kRowsInSmem ? row_cs[srow[k]] : cs[k];
        const int endk = kRowsInSmem ? row_end[srow[k]] : key_end[k];
        float x = s[4 * j + 2 * r + e] * csk;
        if constexpr (kLo) x += s[4 * (j + 4) + 2 * r + e] * (csk * 0.0625f);
        sv[r][k] = tok0 + row0 + 8 * r < endk ? x : -INFINITY;
      }
      mx[k] = fmaxf(sv[0][k], sv[1][k]);
#pragma unroll
      for (int o2 = 4; o2 < 32; o2 *= 2) mx[k] = fmaxf(mx[k], __shfl_xor(mx[k], o2));
    }
    if (g == 0)
#pragma unroll
      for (int k = 0; k < 8; ++k) red_max[w * R + srow[k]] = mx[k];
    named_barrier(1 + grp, 128);
    float alpha[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float tm = red_max[srow[k]];
#pragma unroll
      for (int ww = 1; ww < 4; ++ww) tm = fmaxf(tm, red_max[ww * R + srow[k]]);
      alpha[k] = online_step<Shape::kRowsEndEarly>(m[k], tm);
    }
    // P = 2^(S - m) in f16 (p in [0, 1]: 2^-24 and up representable), P^T[row][token]
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float mb = step_base<Shape::kRowsEndEarly>(m[k]);  // (a row with no key yet: P = 0)
      const float p0 = fast_exp2(sv[0][k] - mb), p1 = fast_exp2(sv[1][k] - mb);
      l[k] = l[k] * alpha[k] + p0 + p1;
      const uint32_t h2 = pack_f16x2(p0, p1);
      sts16(s_pt + L::p_at(srow[k], row0), h2 & 0xffffu);
      sts16(s_pt + L::p_at(srow[k], row0 + 8), h2 >> 16);
    }
    if (w == 0 && g == 0)
#pragma unroll
      for (int k = 0; k < 8; ++k) alpha_x[srow[k]] = alpha[k];
    uint32_t a[2][4][4];  // V^T fragments, double-buffered over the k-steps
    v_frags(tile, 0, a[0]);
    fence_proxy_async_smem();
    __syncthreads();  // both groups' P and factors

    // ---- O^T rescale: the factors of the thread's 16 columns (block rows 8 j + 2 t + e) -------
    float al[16];
    bool rescale = false;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 f = *reinterpret_cast<const float2*>(alpha_x + 8 * j + 2 * t);
      al[2 * j] = f.x, al[2 * j + 1] = f.y;
      rescale |= f.x != 1.f || f.y != 1.f;
    }
    if (__any_sync(0xffffffffu, rescale))
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int i = 0; i < 32; ++i) o[mb][i] *= al[2 * (i / 4) + (i % 2)];

    // ---- O^T += V^T P^T: 4 k-steps of 16 tokens x 4 m64 blocks ----------------------------
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks) {
      if (ks >= 2) wgmma_wait<1>();  // k-step ks - 2 is done: its fragment buffer is free
      if (ks > 0) v_frags(tile, ks, a[ks % 2]);
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) wgmma_fence_regs(o[mb]), wgmma_fence_regs(a[ks % 2][mb]);
      wgmma_fence();
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) wgmma_m64n64k16_f16_rs(o[mb], a[ks % 2][mb], wgmma_desc_advance(p_desc, 2 * ks * L::kPLbo));
      wgmma_commit();
    }
    // An fp8 q (no lo columns: 16 S registers fewer) leaves the last k-step to drain while the
    // next tile's barrier passes and its S is issued (the wait after that S covers both; the next
    // tile's P goes to the other buffer, which this O does not read): 4% on 128 heads. A bf16 q waits here: holding those fragments that long spilled and lost 13%
    // (docs/perf.md v11).
    if constexpr (kLo) wgmma_wait<0>();
    else wgmma_wait<1>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int mb = 0; mb < 4; ++mb) wgmma_fence_regs(o[mb]);
  cp_async_wait<0>();
  const bool bad = rows.block_any_bad(p, page_bad) || seq.bad;

  // ---- epilogue: l over the 8 row lanes and the group's 4 warps, shared by both groups -------
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 *= 2) l[k] += __shfl_xor(l[k], o2);
  if (g == 0)
#pragma unroll
    for (int k = 0; k < 8; ++k) red_sum[w * R + srow[k]] = l[k];
  __syncthreads();
  auto row_sum = [&](int br) {
    float sum = 0.f;
#pragma unroll
    for (int ww = 0; ww < 4; ++ww) sum += red_sum[ww * R + br];
    return sum;
  };
  // the rows' states, from the group that ran their softmax (its warp 0 lanes t)
  if (w == 0 && g == 0)
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int br = srow[k];
      if (splits > 1) p.part_ml[qr.part(br)] = split_state(m[k], row_sum(br), bad);
      else if (qr.owns(br)) store_lse(p, qr.token(br), qr.head(br), m[k], row_sum(br), bad);
    }
  // O[row][dims dv .. dv + 7]
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int br = 8 * j + 2 * t + e;
      const float inv = splits == 1 ? out_scale(row_sum(br), kv_scale, bad) : 1.f;
      float ov[8];
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) ov[mb + 4 * hh] = o[mb][4 * j + 2 * hh + e] * inv;
      if (splits == 1) {
        if (qr.owns(br)) {
          uint16_t* out = p.out + qr.token(br) * p.out_stride_token + qr.head(br) * p.out_stride_head + dv;
          *reinterpret_cast<uint4*>(out) = make_uint4(pack_bf16x2(ov[0], ov[1]), pack_bf16x2(ov[2], ov[3]),
                                                      pack_bf16x2(ov[4], ov[5]), pack_bf16x2(ov[6], ov[7]));
        }
      } else {
        float4* po = reinterpret_cast<float4*>(p.part_o + qr.part(br) * kVDim + dv);
        po[0] = make_float4(ov[0], ov[1], ov[2], ov[3]);
        po[1] = make_float4(ov[4], ov[5], ov[6], ov[7]);
      }
    }
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
