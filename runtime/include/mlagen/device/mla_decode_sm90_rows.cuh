// MLA decode, fp8 or bf16 KV (and mxfp4, expanded to bf16) on sm_90a, 32 or 64 query rows a
// block: the rows kernel (issue 18, docs/design-rows-as-m.md). For 32..128 rows a sequence
// (128, 64 or 32 heads, 16 heads x 4 or x 2 tokens), where the 16-row warpgroup kernel
// (mla_decode_sm90_wgmma.cuh) runs its whole per-tile chain once per 16 rows and stays
// latency-bound (128 heads at 64x8192: 471 us, 0.49x
// FlashMLA, the tensor cores ~30% busy; two row groups sharing tiles changed nothing).
//
// Block = three warpgroups, R = 64 (or 32) query rows, tiles of 64 tokens (the 16-row kernel's
// swizzled tile) in a ring of stages, warp-specialized:
//
//   group 0 (S)     S^T = K Qhl^T for all R rows as one wgmma e4m3 chain
//                   (A = the KV tile, 64 tokens x 576; B = the rows' q as e4m3 hi and lo parts,
//                   N = 2 R: m64n128k32 / m64n64k32; an fp8 q is exact in hi: N = R); the
//                   softmax; P^T (f16, by stmatrix) and the rows' rescale factors into a
//                   two-slot ring. One tile ahead.
//   groups 1, 2 (O) O^T += V^T P^T for dims 256 (c - 1) .. + 255 and all R rows, wgmma
//                   m64nRk16 f16, A = V^T in registers (each thread's 8 dims of two tokens: one
//                   8-byte load a token, prmt + cvt.f16x2.e4m3x2, exact), B = P^T: 4 m64 blocks x
//                   4 k-steps a tile, R * 2 accumulators a thread; one commit group a wgmma, so
//                   a block's next fragment is converted while three wgmmas fly. Also the tile
//                   copies: each group its V half and half the rope, refilled as soon as its O of
//                   that slot is done, by the bulk tensor copy (TMA, KvMaps: one thread issues
//                   three boxes) onto per-stage mbarriers (kv_full); a short tile by cp.async.
//
// That is the fp8 format. A KV format is a policy of the body (RowsKv below: its tile, its copies'
// boxes, q's staging, the S^T chain, P's type, the O^T step, the dims a thread's O values are);
// bf16 KV (RowsKv<kBf16>) keeps the tile as stored, 72 KB a stage: S^T in bf16 wgmma m64nRk16
// (A = the tile, B = q as bf16, N = R), P^T bf16, and V read where it landed, through the
// descriptor's transpose bit: at 64 rows O += P V (A = P in registers, B = V, N = 256 dims), at 32
// O^T += V^T P^T (A = V^T, B = P^T); no conversion. 2 stages, each
// tile's P^T in its own rope atom (free once S read it) instead of P slots of its own. A format
// with scales per block (mxfp4) is expanded into that bf16 tile on the way in (RowsKv's primary
// template), and from there is the bf16 policy.
//
// Handoff through mbarriers: full[slot] (group 0 wrote tile i's P and factors) and empty[slot]
// (the O groups are done with tile i and its P slot); tile i uses slot i % 2, phase i / 2.
// Group 0 waits for O(i - 2) before it writes tile i's P slot (P in the tile: no wait, see there). The O groups hold one ring slot,
// so the stages are as many as fit beside Q (spec.ROWS_BODY).
// Lazy rescale: a row keeps its base while no score passes it by 2^8; the test compares the
// scores themselves, so the rows' maxima (shuffles, and the exchange between the 4 warps) are
// met only on a tile that rescales, and only then do the O groups rescale.
// Group 0's instructions are each tile's critical path (ncu: the O groups' top stall is the wait
// on group 0's full barrier; group 0's samples were S wait, S issue, softmax, copies): it issues
// no copies, and the softmax avoids reductions it does not need.
// Registers: setmaxnreg 152 (group 0) / 176 (each O group): the whole of what the block was
// launched with (168 x 384, RowsLayout::kRegsS); a few 4-8 byte reloads at 64 rows, the rest off
// the loop (make check-sm90 holds the list).
// Measured at e34e110 (docs/perf.md, query rows): 252 us at 128 heads, 64x8192 (bf16 q; 223 with an
// fp8 q; FlashMLA 232), against 264-310 in earlier schedules and 471 with 16-row blocks; 98 us at
// 32 heads (32 rows).
// The generic kernels of this body (registry role 3, 64 and 32 rows, each KV format) serve problems
// whose heads x q_len is a multiple of 64, else of 32, contiguous or on pages of a tile or more.
#pragma once
#include "mlagen/device/mla_decode_sm90_wgmma.cuh"
#include "mlagen/device/mla_decode_sm90_wgmma_bf16.cuh"  // WgBf16Layout: the bf16 tile

#if defined(MLAGEN_NVIDIA)
#include <cuda.h>  // CUtensorMap (the type only: the runtime encodes the maps through the driver's entry point)

namespace mlagen::device {

// The KV rows as two 2D tensor maps (kernel_abi.h KvMapsAbi: the layout and the boxes the host
// encodes them with), read here as the driver's CUtensorMap.
using KvMaps = KvMapsAbi;  // tma_load_2d reads each map where the kernel argument holds it
static_assert(sizeof(CUtensorMap) == sizeof(TensorMapBytes) && alignof(CUtensorMap) <= alignof(TensorMapBytes),
              "kernel_abi.h TensorMapBytes: not a CUtensorMap");

// ---- The KV formats of the rows body, a policy each: the tile a stage holds and how the two O
// groups' copies split it, q's staging (the B operand of S^T), the S^T chain, P's 16-bit type, the
// O^T step and which dims a thread's O values are. decode_rows is the same body for every format.
template <KvFormat kKv, int kStages>
struct RowsKv;

// What a policy whose tile is copied as stored (bulk tensor copy, or cp.async) tells the body about
// the expanded policy's steps: nothing loaded ahead, no tables.
struct RowsStored {
  static constexpr bool kExpands = false;
  static constexpr int kTableBytes = 0;
  struct Pre {};
};

// A thread's row copies of a 64-row tile (cp.async, the path for rows that are not one run):
// rows rm + 16 i (i < 4), 16-byte chunk c8 of each row's 128 bytes in atoms [a0, a0 + kAtoms) of
// kAtomBytes (dst: the thread's place in the tile's first atom, 128B swizzle), zero-filled past
// rows_left. Both formats' V atoms.
template <int kAtoms, uint32_t kAtomBytes, class Rows>
MLAGEN_DEVICE void copy_atom_rows(uint32_t dst, const Params& p, const Rows& kv, int tok0, int rows_left, int rm, int c8,
                                  int a0, bool& page_bad) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rm + 16 * i;
    const uint8_t* src = r < rows_left ? kv.ptr(tok0 + r, page_bad) : nullptr;
#pragma unroll
    for (int a = a0; a < a0 + kAtoms; ++a)
      sm90::cp_async_16(dst + i * 2048 + a * kAtomBytes, src ? src + a * 128 + c8 * 16 : p.kv, src != nullptr);
  }
}

// ---- How an O group's accumulators hold its rows: what the body asks of them is the rescale of a
// tile that moved the rows' bases (alpha: a factor a row) and the epilogue's stores (write_rows).
// Rows as the wgmma's N (O^T = V^T P^T: the fp8 policy, bf16 at 32 rows): thread (w, g, t) holds
// rows 8 j + 2 t + e (j < R / 8), 8 values each, o[mb][4 j + 2 hh + e] being value mb + 4 hh of the
// row, at dim Dims::o_dim(oc, w, g, mb + 4 hh) (8 consecutive dims, or single ones).
template <int R, class Dims>
struct ORowsAsN {
  MLAGEN_DEVICE static void rescale(float (&o)[4][R / 2], const float* alpha, int, int, int t) {
#pragma unroll
    for (int j = 0; j < R / 8; ++j) {
      const float2 f = *reinterpret_cast<const float2*>(alpha + 8 * j + 2 * t);
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mb][4 * j + i] *= (i % 2) ? f.y : f.x;
    }
  }
  template <class Out>
  MLAGEN_DEVICE static void write(const float (&o)[4][R / 2], const Out& out, const float* l_final, float kv_scale,
                                  bool bad, int oc, int w, int g, int t) {
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int br = 8 * j + 2 * t + e;
        const float inv = out.scale(l_final[br], kv_scale, bad);
        const auto dst = out.row(br);
        float ov[8];
#pragma unroll
        for (int mb = 0; mb < 4; ++mb)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) ov[mb + 4 * hh] = o[mb][4 * j + 2 * hh + e] * inv;
        if constexpr (Dims::kODimsContiguous) {
          dst.put(Dims::o_dim(oc, w, g, 0), ov);
        } else {  // single values: the 8 lanes g of a row write 8 dims back to back
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float v[1] = {ov[i]};
            dst.put(Dims::o_dim(oc, w, g, i), v);
          }
        }
      }
  }
};
// Rows as the wgmma's M (O = P V: bf16 at 64 rows): thread (w, g, t) holds rows 16 w + g + 8 h
// (h < 2), 64 values each: o[nb][4 j + 2 h + e] at dim 256 oc + 64 nb + 8 j + 2 t + e (the
// accumulator fragment of m64n256, 64 dims a block nb), two consecutive dims a store.
template <int R>
struct ORowsAsM {
  static_assert(R == 64, "the query rows as the wgmma's M: 64 rows");
  MLAGEN_DEVICE static void rescale(float (&o)[4][R / 2], const float* alpha, int w, int g, int) {
    const float f[2] = {alpha[16 * w + g], alpha[16 * w + g + 8]};
#pragma unroll
    for (int nb = 0; nb < 4; ++nb)
#pragma unroll
      for (int i = 0; i < R / 2; ++i) o[nb][i] *= f[(i / 2) % 2];
  }
  template <class Out>
  MLAGEN_DEVICE static void write(const float (&o)[4][R / 2], const Out& out, const float* l_final, float kv_scale,
                                  bool bad, int oc, int w, int g, int t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int br = 16 * w + g + 8 * h;
      const float inv = out.scale(l_final[br], kv_scale, bad);
      const auto dst = out.row(br);
#pragma unroll
      for (int nb = 0; nb < 4; ++nb)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float v[2] = {o[nb][4 * j + 2 * h] * inv, o[nb][4 * j + 2 * h + 1] * inv};
          dst.put(256 * oc + 64 * nb + 8 * j + 2 * t, v);
        }
    }
  }
};

// fp8: the 16-row warpgroup kernel's tile (WgLayout: 4 atoms of 128 dims, 128B swizzle, and a
// 64B-swizzle rope atom; 36 KB a stage). S^T in e4m3 (a bf16 q split hi + lo: N = 2 R); P^T f16;
// V^T converted to f16 in registers (each thread's 8 dims of two tokens: one 8-byte load a token,
// prmt + cvt.f16x2.e4m3x2, exact). A thread's O values of a row are 8 consecutive dims.
template <int kStages>
struct RowsKv<KvFormat::kFp8, kStages> : RowsStored {
  using Tile = WgLayout<kStages, KvFormat::kFp8>;
  static constexpr int kQRowBytes = kQkDim;  // q staged as e4m3
  static constexpr bool q_split(QFormat q) { return q == QFormat::kBf16; }
  static constexpr bool kPInTile = false;  // P^T has two slots of its own
  // S's orientation at 64 rows: a bf16 q's hi and lo parts are S^T's N columns (s_chain); an fp8 q
  // is one part, so S = Q K^T with the rows as M (s_rows)
  static constexpr bool s_rows_as_m(QFormat q) { return !q_split(q); }
  static constexpr uint32_t kPTileOffset = 0, kPTileBytes = 0;
  // what one O group brings: two atoms (its V dims) and one rope box (half the rows)
  static constexpr uint32_t kGroupBytes = 2 * Tile::kAtom128Bytes + KvMapsAbi::kRopeBoxRows * KvMapsAbi::kRopeBoxBytes;
  MLAGEN_DEVICE static constexpr uint32_t group_bytes(int) { return kGroupBytes; }
  static_assert(2 * kGroupBytes == Tile::kStageBytes && KvMapsAbi::kMainBoxRows == Tile::kBlockN &&
                    2 * KvMapsAbi::kRopeBoxRows == Tile::kBlockN,
                "a tile's boxes");

  // O group oc's share of a tile's copies, thread wt of the group.
  struct Copy {
    int c8, rm, c4, rr;
    uint32_t dst_main, dst_rope;
    int a0, rope0;  // the group's first atom, rope row
    MLAGEN_DEVICE Copy(int oc, int wt)
        : c8(wt % 8), rm(wt / 8), c4(wt % 4), rr(wt / 4 + 32 * oc),
          dst_main((rm / 8) * 1024 + (rm % 8) * 128 + ((c8 ^ (rm % 8)) * 16)),
          dst_rope(Tile::kRopeOffset + (rr / 8) * 512 + (rr % 8) * 64 + ((c4 ^ ((rr % 8) / 2)) * 16)),
          a0(2 * oc), rope0(KvMapsAbi::kRopeBoxRows * oc) {}
    // a full tile of rows back to back from row y: the group's three boxes (one thread)
    MLAGEN_DEVICE void boxes(uint32_t dst, const KvMapsAbi& maps, int y, uint32_t bar) const {
#pragma unroll
      for (int a = a0; a < a0 + 2; ++a) sm90::tma_load_2d(dst + a * Tile::kAtom128Bytes, &maps.main, 128 * a, y, bar);
      sm90::tma_load_2d(dst + Tile::kRopeOffset + rope0 * KvMapsAbi::kRopeBoxBytes, &maps.rope, 512, y + rope0, bar);
    }
    // row by row (cp.async), zero-filled past rows_left: chunk wt % 8 of rows wt / 8 + 16 i, rope
    // chunk wt % 4 of row 32 oc + wt / 4 (the slot's P is not in the tile: no wait_p)
    template <class Rows, class WaitP>
    MLAGEN_DEVICE void rows(uint32_t dst, const Params& p, const Rows& kv, int tok0, int rows_left, bool& page_bad,
                            WaitP&&) const {
      copy_atom_rows<2, Tile::kAtom128Bytes>(dst + dst_main, p, kv, tok0, rows_left, rm, c8, a0, page_bad);
      const uint8_t* src = rr < rows_left ? kv.ptr(tok0 + rr, page_bad) : nullptr;
      sm90::cp_async_16(dst + dst_rope, src ? src + 512 + c4 * 16 : p.kv, src != nullptr);
    }
  };

  // One query row's 576 values (its 8 threads' raw[18], value group i at dim dim_of(i)) into the
  // q operand at rows r (hi) and R + r (lo); returns the row's S factor 1 / c.
  template <QFormat Q, bool kLo, class L, class DimOf>
  MLAGEN_DEVICE static float stage_q(const QQuant& qq, const uint2 (&raw)[18], uint32_t s_q, int r, DimOf&& dim_of) {
    return stage_q_row<Q, kLo>(qq, raw, [&](int i, uint32_t hi, uint32_t lo) {
      const int d = dim_of(i);
      sm90::sts32(s_q + L::q_at(r, d), hi);
      if constexpr (kLo) sm90::sts32(s_q + L::q_at(L::kRows + r, d), lo);
    });
  }

  // S^T = K Qhl^T over the tile's 576 dims, from the wgmma fence on (the caller commits)
  template <int kSN, int kQLbo>
  MLAGEN_DEVICE static void s_chain(float (&s)[kSN / 2], uint32_t tile, uint64_t q_desc) {
    using namespace sm90;
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    const uint64_t rope_desc = wgmma_desc(tile + Tile::kRopeOffset, 16, 512, WgmmaSwizzle::k64B);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tile::kChunksPerRow / 2; ++ks) {
      const uint64_t a = ks < 16 ? wgmma_desc_advance(k_desc, (ks / 4) * Tile::kAtom128Bytes + (ks % 4) * 32)
                                 : wgmma_desc_advance(rope_desc, (ks - 16) * 32);
      const uint64_t b = wgmma_desc_advance(q_desc, 2 * ks * kQLbo);
      if constexpr (kSN == 128) {
        if (ks == 0) wgmma_m64n128k32_e4m3_ss_first(s, a, b);
        else wgmma_m64n128k32_e4m3_ss(s, a, b);
      } else if constexpr (kSN == 64) {
        if (ks == 0) wgmma_m64n64k32_e4m3_ss_first(s, a, b);
        else wgmma_m64n64k32_e4m3_ss(s, a, b, 1);
      } else {
        if (ks == 0) wgmma_m64n32k32_e4m3_ss_first(s, a, b);
        else wgmma_m64n32k32_e4m3_ss(s, a, b, 1);
      }
    }
  }

  // S = Q K^T for one q part (an fp8 q), the query rows the wgmma's M (64): s_chain's 18 k-steps with
  // the operands swapped (A = q as staged, K-major core matrices; B = the tile), from the fence on
  template <int kQLbo>
  MLAGEN_DEVICE static void s_rows(float (&s)[Tile::kBlockN / 2], uint32_t tile, uint64_t q_desc) {
    using namespace sm90;
    static_assert(Tile::kBlockN == 64, "S = Q K^T: m64n64k32");
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    const uint64_t rope_desc = wgmma_desc(tile + Tile::kRopeOffset, 16, 512, WgmmaSwizzle::k64B);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Tile::kChunksPerRow / 2; ++ks) {
      const uint64_t a = wgmma_desc_advance(q_desc, 2 * ks * kQLbo);
      const uint64_t b = ks < 16 ? wgmma_desc_advance(k_desc, (ks / 4) * Tile::kAtom128Bytes + (ks % 4) * 32)
                                 : wgmma_desc_advance(rope_desc, (ks - 16) * 32);
      if (ks == 0) wgmma_m64n64k32_e4m3_ss_first(s, a, b);
      else wgmma_m64n64k32_e4m3_ss(s, a, b, 1);
    }
  }

  MLAGEN_DEVICE static uint32_t pack_p(float p0, float p1) { return sm90::pack_f16x2(p0, p1); }

  // Dim of a thread's O value i (ov[mb + 4 hh] = o[mb][4 j + 2 hh + e]) in O group oc
  MLAGEN_DEVICE static int o_dim(int oc, int w, int g, int i) { return 256 * oc + 8 * (8 * w + g) + i; }
  static constexpr bool kODimsContiguous = true;

  // O^T += V^T P^T for the group's 256 dims: 4 m64 blocks x 4 k-steps, A = V^T in registers.
  // One commit group a wgmma: block mb's fragment for k-step ks is rebuilt as soon as k-step
  // ks - 1's wgmma of block mb is done (wait<3>: the three issued after it may fly), so the
  // tensor cores always hold three of this group's wgmmas while it converts the next fragment.
  // The caller waits for them all.
  template <class L>
  struct OStep : ORowsAsN<L::kRows, RowsKv> {
    static constexpr int R = L::kRows;
    uint32_t voff[4];
    MLAGEN_DEVICE OStep(int oc, int w, int g, int t) {
      const int dv = o_dim(oc, w, g, 0);
#pragma unroll
      for (int i = 0; i < 4; ++i) voff[i] = Tile::kv_at(2 * t + (i % 2) + 8 * (i / 2), dv);
    }
    // V^T fragments: each thread's 8 dims of tokens 2 t + {0, 1, 8, 9} of k-step ks (one 8-byte
    // load a token), then, per m64 block mb, byte mb of each 4-dim word pairs the two tokens
    // (prmt) and widens to f16x2 (cvt.f16x2.e4m3x2, exact)
    MLAGEN_DEVICE void v_load(uint32_t tile, int ks, uint2 (&x)[4]) const {
#pragma unroll
      for (int i = 0; i < 4; ++i) x[i] = sm90::lds64(tile + voff[i] + ks * 2048);
    }
    MLAGEN_DEVICE static void v_convert(const uint2 (&x)[4], int mb, uint32_t (&am)[4]) {
      using namespace sm90;
      const uint32_t sel = ((4 + mb) << 4) | mb;
      am[0] = e4m3x2_f2fp(static_cast<uint16_t>(__byte_perm(x[0].x, x[1].x, sel)));
      am[1] = e4m3x2_f2fp(static_cast<uint16_t>(__byte_perm(x[0].y, x[1].y, sel)));
      am[2] = e4m3x2_f2fp(static_cast<uint16_t>(__byte_perm(x[2].x, x[3].x, sel)));
      am[3] = e4m3x2_f2fp(static_cast<uint16_t>(__byte_perm(x[2].y, x[3].y, sel)));
    }
    MLAGEN_DEVICE void run(float (&o)[4][R / 2], uint32_t tile, uint32_t p) const {
      using namespace sm90;
      constexpr int BN = Tile::kBlockN;
      const uint64_t p_desc = wgmma_desc(p, L::kPLbo, L::kPSbo);
      uint2 x[4];
      uint32_t a[4][4];
      v_load(tile, 0, x);
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          if (ks > 0) wgmma_wait<3>();
          v_convert(x, mb, a[mb]);
          if (mb == 3 && ks + 1 < BN / 16) v_load(tile, ks + 1, x);
          wgmma_fence_regs(o[mb]), wgmma_fence_regs(a[mb]);
          wgmma_fence();
          if constexpr (R == 64) wgmma_m64n64k16_f16_rs(o[mb], a[mb], wgmma_desc_advance(p_desc, 2 * ks * L::kPLbo));
          else wgmma_m64n32k16_f16_rs(o[mb], a[mb], wgmma_desc_advance(p_desc, 2 * ks * L::kPLbo));
          wgmma_commit();
        }
    }
  };
};

// bf16: the 16-row bf16 warpgroup kernel's tile (WgBf16Layout: 9 atoms of 64 dims, 128B swizzle;
// 72 KB a stage), read as stored by both products: S^T = K Q^T in bf16 (A = the tile K-major, B =
// q as bf16, N = R: a bf16 q is exact, an fp8 q too), P^T bf16, and V read N- (M-) major from the
// same tile through the descriptor's transpose bit (no copy, no conversion): O += P V at 64 rows
// (OStepM), O^T += V^T P^T at 32 (OStepT, where a thread's O values of a row are dims
// 256 oc + 64 mb + 16 w + g + 8 hh, the wgmma's M rows of block mb).
// Shared memory at 64 rows: 2 stages (144 KB) + q (72 KB) leave no room for P slots of their own
// beside the rest: tile i's P^T goes into tile i's rope atom, which only S(i) reads. Group 0 writes
// it once S(i) is done; the O groups read it in O(i); the rope rows of tile i + 2 go into that atom
// only once both O groups are done with O(i) (Copy's wait_p: the slot's empty barrier). 219 KB.
template <int kStages>
struct RowsKv<KvFormat::kBf16, kStages> : RowsStored {
  using Tile = WgBf16Layout<kStages>;
  static constexpr int kQRowBytes = 2 * kQkDim;  // q staged as bf16
  static constexpr bool q_split(QFormat) { return false; }
  static constexpr int kRopeAtom = Tile::kAtoms - 1;  // atoms 0..7: V; atom 8: the rope dims
  static constexpr bool kPInTile = true;  // a tile's P^T: in its rope atom, from S's end to O's
  static constexpr bool s_rows_as_m(QFormat) { return true; }  // at 64 rows S = Q K^T (s_rows), at 32 S^T
  static constexpr uint32_t kPTileOffset = kRopeAtom * Tile::kAtomBytes, kPTileBytes = Tile::kAtomBytes;
  // what one O group brings: its four V atoms; group 1 (oc 0) also the rope atom (two boxes of 32 rows)
  MLAGEN_DEVICE static constexpr uint32_t group_bytes(int oc) {
    return 4 * Tile::kAtomBytes + (oc == 0 ? 2 * KvMapsAbi::kRopeBoxRows * KvMapsAbi::kRopeBoxBytesBf16 : 0);
  }
  static_assert(group_bytes(0) + group_bytes(1) == Tile::kStageBytes && KvMapsAbi::kMainBoxRows == Tile::kBlockN &&
                    2 * KvMapsAbi::kRopeBoxRows == Tile::kBlockN && KvMapsAbi::kMainBoxBytes == 128,
                "a tile's boxes");

  struct Copy {
    int oc, c8, rm;
    uint32_t dst_main;
    MLAGEN_DEVICE Copy(int oc_, int wt)
        : oc(oc_), c8(wt % 8), rm(wt / 8), dst_main((rm / 8) * 1024 + (rm % 8) * 128 + ((c8 ^ (rm % 8)) * 16)) {}
    // the group's V atoms (one thread)
    MLAGEN_DEVICE void boxes(uint32_t dst, const KvMapsAbi& maps, int y, uint32_t bar) const {
      const int a0 = 4 * oc;
#pragma unroll
      for (int a = a0; a < a0 + 4; ++a) sm90::tma_load_2d(dst + a * Tile::kAtomBytes, &maps.main, 128 * a, y, bar);
    }
    // group 1's thread 0, once the slot's P is free: the rope atom (its bytes are in group 1's
    // group_bytes)
    MLAGEN_DEVICE static void p_boxes(uint32_t dst, const KvMapsAbi& maps, int y, uint32_t bar) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rope0 = KvMapsAbi::kRopeBoxRows * h;
        sm90::tma_load_2d(dst + kPTileOffset + rope0 * 128, &maps.rope, 128 * kRopeAtom, y + rope0, bar);
      }
    }
    // chunk wt % 8 of rows wt / 8 + 16 i of the group's V atoms, and (after wait_p) of rows
    // 32 oc + wt / 8 + 16 i of the rope atom
    template <class Rows, class WaitP>
    MLAGEN_DEVICE void rows(uint32_t dst, const Params& p, const Rows& kv, int tok0, int rows_left, bool& page_bad,
                            WaitP&& wait_p) const {
      copy_atom_rows<4, Tile::kAtomBytes>(dst + dst_main, p, kv, tok0, rows_left, rm, c8, 4 * oc, page_bad);
      wait_p();
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int rr = rm + 16 * i + 32 * oc;  // (rr % 8 == rm % 8: the same swizzled chunk)
        const uint8_t* rs = rr < rows_left ? kv.ptr(tok0 + rr, page_bad) : nullptr;
        sm90::cp_async_16(dst + dst_main + (i + 2 * oc) * 2048 + kPTileOffset, rs ? rs + 128 * kRopeAtom + c8 * 16 : p.kv,
                          rs != nullptr);
      }
    }
  };

  template <QFormat Q, bool kLo, class L, class DimOf>
  MLAGEN_DEVICE static float stage_q(const QQuant& qq, const uint2 (&raw)[18], uint32_t s_q, int r, DimOf&& dim_of) {
    static_assert(!kLo, "bf16 q: one part");
#pragma unroll
    for (int i = 0; i < 18; ++i) {
      const float4 v = q4_from_raw<Q>(qq, raw[i]);  // exact in bf16 for every q format
      const uint32_t at = s_q + L::q_at(r, 2 * dim_of(i));
      sm90::sts32(at, sm90::pack_bf16x2_rn(v.x, v.y));
      sm90::sts32(at + 4, sm90::pack_bf16x2_rn(v.z, v.w));
    }
    return 1.f;
  }

  // S^T = K Q^T: 36 k-steps of 16 dims (4 into each atom), from the wgmma fence on
  template <int kSN, int kQLbo>
  MLAGEN_DEVICE static void s_chain(float (&s)[kSN / 2], uint32_t tile, uint64_t q_desc) {
    using namespace sm90;
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * Tile::kAtoms; ++ks) {
      const uint64_t a = wgmma_desc_advance(k_desc, (ks / 4) * Tile::kAtomBytes + (ks % 4) * 32);
      const uint64_t b = wgmma_desc_advance(q_desc, 2 * ks * kQLbo);
      if constexpr (kSN == 64) {
        if (ks == 0) wgmma_m64n64k16_bf16_ss_first(s, a, b);
        else wgmma_m64n64k16_bf16_ss(s, a, b, 1);
      } else {
        static_assert(kSN == 32, "bf16 S^T: N = 64 or 32 rows");
        if (ks == 0) wgmma_m64n32k16_bf16_ss_first(s, a, b);
        else wgmma_m64n32k16_bf16_ss(s, a, b, 1);
      }
    }
  }

  // S = Q K^T, the query rows the wgmma's M (64): the same 36 k-steps with the operands swapped
  // (A = q as staged, K-major core matrices; B = the tile K-major), from the wgmma fence on
  template <int kQLbo>
  MLAGEN_DEVICE static void s_rows(float (&s)[Tile::kBlockN / 2], uint32_t tile, uint64_t q_desc) {
    using namespace sm90;
    static_assert(Tile::kBlockN == 64, "S = Q K^T: m64n64k16");
    const uint64_t k_desc = wgmma_desc(tile, 16, 1024, WgmmaSwizzle::k128B);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4 * Tile::kAtoms; ++ks) {
      const uint64_t a = wgmma_desc_advance(q_desc, 2 * ks * kQLbo);
      const uint64_t b = wgmma_desc_advance(k_desc, (ks / 4) * Tile::kAtomBytes + (ks % 4) * 32);
      if (ks == 0) wgmma_m64n64k16_bf16_ss_first(s, a, b);
      else wgmma_m64n64k16_bf16_ss(s, a, b, 1);
    }
  }

  MLAGEN_DEVICE static uint32_t pack_p(float p0, float p1) { return sm90::pack_bf16x2_rn(p0, p1); }

  MLAGEN_DEVICE static int o_dim(int oc, int w, int g, int i) { return 256 * oc + 64 * (i % 4) + 16 * w + g + 8 * (i / 4); }
  static constexpr bool kODimsContiguous = false;

  // The O step: at 64 rows O = P V (OStepM), else O^T += V^T P^T (OStepT). Both read V where it
  // landed; they differ in what else goes through shared memory a tile. O^T (M = dims, N = rows)
  // reads A = V^T and B = P^T from it for each of 16 wgmmas of m64n64k16: 64 KB a group, 128 bytes
  // a cycle at the tensor rate, all the SM has. O (M = rows, N = 256 dims) takes P into registers
  // once (ldmatrix, 8 KB) and reads B = V for each of 4 wgmmas of m64n256k16 (32 KB): 40 KB a group,
  // 64 bytes a cycle. A tile's shared-memory traffic (S 144 KB, O, the copies' 72 KB, P's 8 KB) goes
  // 352 -> 304 KB: 2,750 -> 2,375 cycles at 128 bytes, against 2,176 of tensor work.
  template <class L>
  struct OStepM;
  template <class L>
  struct OStepT;
  template <class L>
  using OStep = std::conditional_t<L::kRows == 64, OStepM<L>, OStepT<L>>;

  // O += P V for the group's 256 dims (atoms 4 oc .. 4 oc + 3, B = V N-major through the
  // descriptor's transpose bit, LBO = an atom between blocks of 64 dims): A = P (rows x 16 tokens
  // a k-step) into registers by ldmatrix from the slot's P (stored as P^T's K-major core matrices:
  // row r's 8 tokens are 16 contiguous bytes at L::p_at), 4 k-steps, one commit group; the caller
  // waits for it. The accumulators are ORowsAsM's.
  template <class L>
  struct OStepM : ORowsAsM<L::kRows> {
    static constexpr int R = L::kRows;
    int oc;
    MLAGEN_DEVICE OStepM(int oc_, int, int, int) : oc(oc_) {}
    // this lane's ldmatrix row of P at k-step 0 (lane 8 i + q: row q of A-fragment matrix i, rows
    // 16 w + 8 (i % 2) .., tokens 8 (i / 2) ..): from the thread index a tile, not held (a register
    // held across the loop spilled in the generic kernels)
    MLAGEN_DEVICE static uint32_t p_lane() {
      const int lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4;
      return L::p_at(16 * w + 8 * (lane / 8 % 2) + lane % 8, 8 * (lane / 16));
    }
    MLAGEN_DEVICE void run(float (&o)[4][R / 2], uint32_t tile, uint32_t p) const {
      using namespace sm90;
      constexpr int KS = Tile::kBlockN / 16;
      const uint32_t pl = p + p_lane();
      uint32_t a[KS][4];
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) ldmatrix_x4(pl + ks * 2 * L::kPLbo, a[ks]);
      const uint64_t v_desc = wgmma_desc(tile + 4 * oc * Tile::kAtomBytes, Tile::kAtomBytes, 1024, WgmmaSwizzle::k128B);
      float(&d)[4 * (R / 2)] = reinterpret_cast<float(&)[4 * (R / 2)]>(o);  // m64n256's fragment: o[nb] = d[32 nb ..]
      wgmma_fence_regs(d);
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) wgmma_fence_regs(a[ks]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) wgmma_m64n256k16_bf16_rs_nb(d, a[ks], wgmma_desc_advance(v_desc, ks * 2048));
      wgmma_commit();
    }
  };

  // O^T += V^T P^T for the group's 256 dims (atoms 4 oc .. 4 oc + 3): 4 k-steps x 4 m64 blocks,
  // one commit group; the caller waits for it. The accumulators are ORowsAsN's.
  template <class L>
  struct OStepT : ORowsAsN<L::kRows, RowsKv> {
    static constexpr int R = L::kRows;
    int oc;
    MLAGEN_DEVICE OStepT(int oc_, int, int, int) : oc(oc_) {}
    MLAGEN_DEVICE void run(float (&o)[4][R / 2], uint32_t tile, uint32_t p) const {
      using namespace sm90;
      constexpr int BN = Tile::kBlockN;
      const uint64_t p_desc = wgmma_desc(p, L::kPLbo, L::kPSbo);
      const uint64_t v_desc = wgmma_desc(tile + 4 * oc * Tile::kAtomBytes, Tile::kAtomBytes, 1024, WgmmaSwizzle::k128B);
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) wgmma_fence_regs(o[mb]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
        for (int mb = 0; mb < 4; ++mb) {
          const uint64_t a = wgmma_desc_advance(v_desc, mb * Tile::kAtomBytes + ks * 2048);
          static_assert(R == 32, "64 rows: OStepM");
          wgmma_m64n32k16_bf16_ss_mn(o[mb], a, wgmma_desc_advance(p_desc, 2 * ks * L::kPLbo));
        }
      wgmma_commit();
    }
  };
};

// Any other format (formats.cuh KvRowsExpand: mxfp4): expanded into the bf16 policy's tile, whose
// q staging, S^T chain, P and O^T step it takes as they are; only the copies differ. A packed row
// has no tensor-map layout and its values need their scales on the way in, so each O thread loads
// its blocks (16 packed bytes and a scale byte: 32 dims) of tile j into registers right after it
// stored tile j - 1, lets them fly through O(j - ST + 1), and once its group is done with the
// slot's tile j - ST expands them to bf16 (a table a scale byte, built once a block) in place of
// the bulk tensor copy: the same swizzled atoms, the same kv_full arrival, no staging memory.
// Group oc: the 8 blocks of its V dims for rows wt / 8 + 16 i (i < 4; 8 neighbouring threads read
// a row's 128 bytes); group 1 (oc 0) also the rope's 2 blocks of row wt / 2, after the slot's P is
// free (wait_p). Expansion is exact (every E2M1 value times a power of two is a bf16), so this body
// computes on exactly the bf16 tile of the dequantized rows. 32 rows a block: at 64 the registers
// held ahead beside 128 accumulators spilled (codegen/spec.py ROWS_TILES).
template <KvFormat kKv, int kStages>
struct RowsKv : RowsKv<KvFormat::kBf16, kStages> {
  using Bf16 = RowsKv<KvFormat::kBf16, kStages>;
  using Tile = typename Bf16::Tile;
  using Block = typename KvRowsExpand<kKv>::Block;
  static constexpr bool kExpands = true;
  static constexpr int kTableBytes = Block::kTableBytes;  // the expansion's tables (Block::build_tables)
  static constexpr int kBlockBytes = 2 * Block::kDims;                   // a block's bf16 bytes: 64
  static constexpr int kVBlocks = 2 * kVDim / kBlockBytes;               // 16
  static constexpr int kGroupBlocks = kVBlocks / 2;                      // an O group's V blocks a row: 8
  static constexpr int kRopeBlocks = Block::kBlocks - kVBlocks;          // 2
  static constexpr int kVChunks = Tile::kBlockN * kGroupBlocks / 128;    // a thread's V blocks a tile: 4
  static_assert(Block::kBlocks * Block::kDims == kQkDim && 2 * kBlockBytes == 128 && kVChunks == 4 &&
                    kRopeBlocks * Tile::kBlockN == 128 && Bf16::kRopeAtom == kVBlocks / 2,
                "the expanded blocks tile the bf16 atoms: two blocks a 128-byte atom row");

  // an O thread's blocks of a tile, loaded a tile ahead (rope: group 1 only)
  struct Pre {
    Block v[kVChunks], rope;
  };

  struct Copy {
    int oc, wt, rot;
    MLAGEN_DEVICE Copy(int oc_, int wt_) : oc(oc_), wt(wt_), rot((wt_ / 2) % 4) {}
    template <class Rows>
    MLAGEN_DEVICE void load(Pre& pre, const Params& p, const Rows& kv, int tok0, int rows_left, bool& page_bad) const {
#pragma unroll
      for (int i = 0; i < kVChunks; ++i) {
        const int r = wt / 8 + 16 * i;
        pre.v[i].load(p, kv, tok0 + r, r < rows_left, kGroupBlocks * oc + wt % 8, page_bad);
      }
      if (oc == 0) pre.rope.load(p, kv, tok0 + wt / 2, wt / 2 < rows_left, kVBlocks + wt % 2, page_bad);
    }
    // Block b of row r as 4 swizzled 16-byte chunks of atom b / 2 (chunks 4 (b % 2) ..), in the
    // order k + rot: the 8 threads of a quarter warp store 8 distinct chunk positions at once.
    MLAGEN_DEVICE void put(uint32_t dst, uint32_t tables, const Block& blk, int r, int b) const {
      const uint32_t row = dst + (b / 2) * Tile::kAtomBytes + (r / 8) * 1024 + (r % 8) * 128;
      const uint4 tab = blk.table(tables);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int kk = (k + rot) % 4;
        uint32_t o[4];
        blk.expand8(kk, tab, o);
        sm90::sts128(row + (((4 * (b % 2) + kk) ^ (r % 8)) * 16), make_uint4(o[0], o[1], o[2], o[3]));
      }
    }
    // The loaded tile into the slot at dst: the group's V atoms (its warps are done with them),
    // then, group 1, the rope atom once both groups are done with the slot's P (wait_p).
    template <class WaitP>
    MLAGEN_DEVICE void store(uint32_t dst, uint32_t tables, const Pre& pre, WaitP&& wait_p) const {
#pragma unroll
      for (int i = 0; i < kVChunks; ++i) put(dst, tables, pre.v[i], wt / 8 + 16 * i, kGroupBlocks * oc + wt % 8);
      if (oc == 0) {
        wait_p();
        put(dst, tables, pre.rope, wt / 2, kVBlocks + wt % 2);
      }
    }
  };
};

template <int kStages_, QFormat kQ_, int kRows_, KvFormat kKv_ = KvFormat::kFp8>
struct RowsLayout {
  static_assert(kRows_ == 32 || kRows_ == 64, "the rows body takes 32 or 64 query rows a block");
  using F = RowsKv<kKv_, kStages_>;
  using Tile = typename F::Tile;
  static constexpr int kBlockN = Tile::kBlockN, kStages = kStages_, kRows = kRows_, kThreads = 384;
  static constexpr int kSlots = kRows / 4;  // query rows a group-0 thread holds (S^T columns 8 j + 2 t + e)
  static constexpr bool kQLo = F::q_split(kQ_);
  // S's orientation: the query rows as the wgmma's M (the policy's s_rows, 64 rows) or its N (s_chain)
  static constexpr bool kSRowsAsM = F::s_rows_as_m(kQ_) && kRows == 64;
  static constexpr int kSN = kQLo ? 2 * kRows : kRows;  // N of the S^T chain
  static constexpr int kQLbo = 128, kQSbo = F::kQRowBytes / 16 * 128, kQBytes = kSN / 8 * kQSbo;
  static constexpr int kPLbo = 128, kPSbo = kBlockN / 8 * 128, kPBytes = kRows / 8 * kPSbo;  // one slot
  // Two P slots (group 0 writes tile i's P while the O groups read tile i - 1's): of their own, or
  // (F::kPInTile) each tile's own, in its stage (F::kPTileOffset)
  static constexpr int kPSlots = 2;
  static_assert(!F::kPInTile || (kStages == kPSlots && kPBytes <= F::kPTileBytes), "P in the tile: a slot a stage");
  static constexpr int kQOffset = kStages * Tile::kStageBytes;
  static constexpr int kPOffset = kQOffset + kQBytes;                 // [2] P^T slots (or none)
  static constexpr int kAlphaOffset = kPOffset + (F::kPInTile ? 0 : kPSlots * kPBytes);  // [2][64] rescale factors
  static constexpr int kRedOffset = kAlphaOffset + kPSlots * kRows * 4;  // [4 warps][64] maxima / sums
  static constexpr int kColOffset = kRedOffset + 4 * kRows * 4;       // [64] S factors (1 / c x s_scale)
  static constexpr int kEndOffset = kColOffset + kRows * 4;           // [64] causal ends
  static constexpr int kLOffset = kEndOffset + kRows * 4;             // [64] final sums
  static constexpr int kFlagOffset = kLOffset + kRows * 4;            // [2] whether a tile rescaled, [2] a bad page id
  static constexpr int kBarOffset = kFlagOffset + 4 * 4;              // full[2], empty[2], sums_ready, kv[stages]
  static constexpr int kTablesOffset = (kBarOffset + (5 + kStages) * 8 + 15) / 16 * 16;  // F::kTableBytes (or none)
  static constexpr int kSmemBytes = kTablesOffset + F::kTableBytes + Tile::kAlign;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block");
  // setmaxnreg moves registers within the block's launch allocation (ptxas: 65536 / 384 threads,
  // rounded down to 8: 168 a thread); the warpgroups' counts after it must fit in it, or an O
  // group's setmaxnreg.inc waits forever (144 / 184 / 184 = 512 > 504 hung the block)
  // (S with the rows as M: group 0 holds two rows' state a thread, not R / 4 rows', and its code
  // needs ~72 registers: the O groups take the rest, 104 / 200 / 200: no spill in any 64-row kernel that has S so)
  static constexpr int kRegsS = kSRowsAsM ? 104 : 152, kRegsO = kSRowsAsM ? 200 : 176,
                       kRegsAtLaunch = 65536 / kThreads / 8 * 8;
  static_assert(kRegsS + 2 * kRegsO <= 3 * kRegsAtLaunch, "setmaxnreg over the block's registers");
  MLAGEN_DEVICE static uint32_t q_at(int row, int byte) {
    return (row / 8) * kQSbo + (byte / 16) * kQLbo + (row % 8) * 16 + byte % 16;
  }
  MLAGEN_DEVICE static uint32_t p_at(int row, int token) {
    return (row / 8) * kPSbo + (token / 8) * kPLbo + (row % 8) * 16 + (token % 8) * 2;
  }
};

// The rows body's tiling (codegen/spec.py block_m 32 or 64, ROWS_BODY): fp8 or bf16 KV, or an
// expanded format.
template <int kStages_, QFormat kQ_, int kRows_, KvFormat kKv_ = KvFormat::kFp8>
struct RowsTiling {
  static_assert(kKv_ == KvFormat::kFp8 || kKv_ == KvFormat::kBf16 || RowsKv<kKv_, kStages_>::kExpands,
                "the rows body: fp8 or bf16 KV as stored, or a format it expands into the bf16 tile");
  using L = RowsLayout<kStages_, kQ_, kRows_, kKv_>;
  static constexpr KvFormat kKv = kKv_;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = RowsTiling<kStages_, Q, kRows_, kKv_>;
  static constexpr Body kBody = Body::kSm90Rows;  // the tiling is the body's (codegen/spec.py KernelSpec.body)
  static constexpr bool kRowsBody = true, kWide = false;
  static constexpr int kRowsPerBlock = L::kRows;
  static constexpr float kVUnit = 1.f;  // partial O is in KV units (the combine applies the KV scale)
  static constexpr int kBlockN = L::kBlockN, kStages = kStages_;
  static constexpr int kThreads = L::kThreads;
  static constexpr int kSmemBytes = L::kSmemBytes;
  static constexpr int kMinBlocksPerSm = 1;
};

// S's scores with the query rows as M (s[4 j + 2 h + e]: row 16 w + g + 8 h, token tok0 + 8 j + 2 t + e
// of the tile), in place: times the row's factor cs[h], -inf at and past the row's causal end end[h]
// where the tile is masked; fn(h, x) sees each.
template <int kN, class Fn>
MLAGEN_DEVICE void scale_rows_m(float (&s)[kN], const float (&cs)[2], const int (&end)[2], int tok0, bool masked, int t,
                                Fn&& fn) {
#pragma unroll
  for (int j = 0; j < kN / 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = s[4 * j + 2 * h + e] * cs[h];
        if (masked) x = tok0 + 8 * j + 2 * t + e < end[h] ? x : -INFINITY;
        s[4 * j + 2 * h + e] = x;
        fn(h, x);
      }
}

// P = 2^(x - the row's base) of the rows-as-M scores, in place (s[4 j + 2 h + e]); the row's partial sum
// into l[h]; packed (F::pack_p) as the O wgmma's A fragments, a[ks]: k-step ks (tokens 16 ks ..), the
// order stmatrix / ldmatrix take four 8 x 8 matrices in (rows + 8 (i % 2), tokens + 8 (i / 2))
template <class F, bool kEarly, int kN>
MLAGEN_DEVICE void exp_rows_m(float (&s)[kN], const float (&m)[2], float (&l)[2], uint32_t (&a)[kN / 8][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float base = step_base<kEarly>(m[h]);
#pragma unroll
    for (int j = 0; j < kN / 4; ++j) {
      const float p0 = fast_exp2(s[4 * j + 2 * h] - base), p1 = fast_exp2(s[4 * j + 2 * h + 1] - base);
      l[h] += p0 + p1;
      s[4 * j + 2 * h] = p0, s[4 * j + 2 * h + 1] = p1;
      a[j / 2][2 * (j % 2) + h] = F::pack_p(p0, p1);
    }
  }
}

template <class T, class Shape>
MLAGEN_DEVICE void decode_rows(const Params& p, const KvMaps& maps, uint8_t* smem) {
  using namespace sm90;
  using L = typename T::L;
  using F = typename L::F;  // the KV format's policy (RowsKv)
  using Tile = typename L::Tile;
  constexpr int BN = L::kBlockN, ST = L::kStages, R = L::kRows, NS = L::kSlots, PS = L::kPSlots;
  constexpr bool kLo = L::kQLo;
  const uint32_t s_raw = smem_addr(smem);
  const uint32_t s_base = (s_raw + Tile::kAlign - 1) & ~static_cast<uint32_t>(Tile::kAlign - 1);
  smem += s_base - s_raw;
  const int tid = threadIdx.x, grp = tid / 128, wt = tid % 128, w = wt / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t s_q = s_base + L::kQOffset, s_p = s_base + L::kPOffset, s_bar = s_base + L::kBarOffset;
  float* alpha_x = reinterpret_cast<float*>(smem + L::kAlphaOffset);
  float* red = reinterpret_cast<float*>(smem + L::kRedOffset);
  float* row_cs = reinterpret_cast<float*>(smem + L::kColOffset);
  int* row_end = reinterpret_cast<int*>(smem + L::kEndOffset);
  float* l_final = reinterpret_cast<float*>(smem + L::kLOffset);
  int* rescaled = reinterpret_cast<int*>(smem + L::kFlagOffset);
  int* any_bad_page = rescaled + 2;  // paged: an O thread met a page id outside the cache
  auto full = [&](int b) { return s_bar + 8 * b; };
  auto empty = [&](int b) { return s_bar + 16 + 8 * b; };
  const uint32_t sums_ready = s_bar + 32;  // group 0's final sums are in l_final
  auto kv_full = [&](int slot) { return s_bar + 40 + 8 * slot; };  // a stage's copies landed
  // The O groups copy the KV tiles (group 0's instructions are each tile's critical path: 64 rows
  // -4.2..-4.6%; with the bulk tensor copy the O groups' part is one thread's box issue).

  const BlockSetup<Shape, R> blk = block_setup<T, Shape, BN, R>(p);  // the prologue every body shares (formats.cuh)
  const int splits = blk.splits, ntiles = blk.range.ntiles,
            tok_begin = blk.range.tok_begin, tok_end = blk.range.tok_end;
  bool page_bad = false;
  const float kv_scale = kv_scale_of(p);
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) mbarrier_init(full(b), 128), mbarrier_init(empty(b), 256);
    mbarrier_init(sums_ready, 128);
    for (int b = 0; b < ST; ++b) mbarrier_init(kv_full(b), 256);  // every O thread a phase
    *any_bad_page = 0;
    fence_mbarrier_init();
  }
  if constexpr (F::kExpands) F::Block::build_tables(s_base + L::kTablesOffset, tid, L::kThreads);
  __syncthreads();  // the barriers' init (and the expansion's tables), before the first copies

  // ---- the copies. O group oc copies what it alone reads, V dims 256 oc .. + 255, and half the
  // rope rows (32 oc .. + 31), which S read (F::Copy: which atoms and boxes); as soon as its O(j)
  // is done it refills stage j's slot with tile j + ST. A full tile of rows back to back is the
  // bulk tensor copy: thread 0 of the group issues its boxes (KvMaps) with the bytes they bring on
  // kv_full[slot], the group's other threads arrive on it. A short last tile (or rows on pages
  // shorter than a tile) goes row by row by cp.async, zero-filled past the end, each thread
  // arriving when its copies land. Either way kv_full[slot] completes with 256 arrivals once the
  // tile is in.
  // A format the body expands (F::kExpands) is read into registers instead: each O thread loads
  // its share of tile j a tile ahead (load_into: `pre`, or `first` for the ring's first tiles) and
  // issue_tile writes it, expanded, into the slot, then arrives.
  const int oc = grp - 1;
  const typename F::Copy copy(oc, wt);
  using Pre = typename F::Pre;
  Pre pre;
  auto load_into = [&](Pre& into, int j) {
    if constexpr (F::kExpands)
      if (j < ntiles) copy.load(into, p, blk.rows, tok_begin + j * BN, tok_end - tok_begin - j * BN, page_bad);
  };
  auto issue_tile = [&](int j, const Pre& from) {
    if (j >= ntiles) return;
    const int tok0 = tok_begin + j * BN, rows_left = tok_end - tok0;
    const uint32_t dst = s_base + (j % ST) * Tile::kStageBytes, bar = kv_full(j % ST);
    // P in the tile (F::kPInTile): the slot's P is free once both O groups are done with tile j - ST
    auto wait_p = [&] {
      if (j >= ST) mbarrier_wait(empty(j % ST), ((j - ST) / ST) & 1);
    };
    if constexpr (F::kExpands) {
      copy.store(dst, s_base + L::kTablesOffset, from, wait_p);
      fence_proxy_async_smem();  // the expanded tile's generic-proxy stores, before the wgmmas read it
      mbarrier_arrive(bar);
    } else if (rows_left >= BN && blk.rows.template tile_contiguous<BN>()) {  // (uniform)
      if (wt == 0) {
        const int y = static_cast<int>(blk.rows.row(tok0, page_bad));
        mbarrier_arrive_expect_tx(bar, F::group_bytes(oc));
        copy.boxes(dst, maps, y, bar);
      } else {
        mbarrier_arrive(bar);
      }
      if constexpr (F::kPInTile)  // the rope atom: group 1's warp 0 waits (uniform), its thread 0 issues
        if (oc == 0 && wt < 32) {
          wait_p();
          if (wt == 0) {
            bool unused = false;  // (the row was checked above)
            F::Copy::p_boxes(dst, maps, static_cast<int>(blk.rows.row(tok0, unused)), bar);
          }
        }
    } else {
      copy.rows(dst, p, blk.rows, tok0, rows_left, page_bad, wait_p);
      cp_async_mbarrier_arrive_noinc(bar);
    }
  };
  if (grp > 0) {  // (expanded formats: the first tiles' loads all in flight before the first expansion waits)
    Pre first[ST];
#pragma unroll
    for (int j = 0; j < ST; ++j) load_into(first[j], j);
#pragma unroll
    for (int j = 0; j < ST; ++j) issue_tile(j, first[j]);
  }

  // ---- Q, once, by all three groups: rows 16 pass + tid / 8 (pass 0..1 covers 48 rows a pass)
  const QQuant qq = q_setup<T::kQ>(p, blk.q_given);
  {
    const int part = tid % 8;
    auto dim_of = [&](int i) { return 8 * (8 * (i / 2) + part) + 4 * (i % 2); };
    for (int r = tid / 8; r < R; r += L::kThreads / 8) {
      uint2 raw[18];
#pragma unroll
      for (int i = 0; i < 18; ++i) raw[i] = load_q4_raw<T::kQ>(p, blk.qr.token(r), blk.qr.head(r), dim_of(i));
      const float inv_c = F::template stage_q<T::kQ, kLo, L>(qq, raw, s_q, r, dim_of);
      if (part == 0) {
        row_cs[r] = inv_c * (kv_scale * qq.scale * p.sm_scale * kLog2e);
        row_end[r] = min(tok_end, blk.qr.key_end(r));
      }
    }
  }
  fence_proxy_async_smem();
  __syncthreads();  // Q, the row constants and the barriers' init

  if (grp == 0) {
    // ======== group 0: S and the softmax, one tile ahead of the O groups ====================
    setmaxnreg_dec<L::kRegsS>();
    const uint64_t q_desc = wgmma_desc(s_q, L::kQLbo, L::kQSbo);
    const int row0 = 16 * w + g;
    int min_end = tok_end;  // tiles ending before every row's causal end need no mask
    for (int r = 0; r < R; ++r) min_end = min(min_end, row_end[r]);
    // Once l_final holds the sums: the pages' verdict, then l_final to the O groups through an
    // mbarrier. Pages: only the O groups read page ids (their copies); each sets any_bad_page
    // before its arrivals on empty, so after the last tile's phase group 0 sees it, and so do the
    // O groups after sums_ready. (No block barrier: one reached from the two roles' code is
    // divergent to synccheck.)
    const auto hand_off = [&]() {
      if (blk.rows.paged() && ntiles > 0) mbarrier_wait(empty((ntiles - 1) % PS), ((ntiles - 1) / PS) & 1);
      const bool bad = (blk.rows.paged() && *any_bad_page != 0) || blk.seq.bad;
      mbarrier_arrive(sums_ready);
      return bad;
    };
    if constexpr (L::kSRowsAsM) {
      // ---- S = Q K^T with the query rows as the wgmma's M (F::s_rows): thread (w, g, t) holds rows
      // row0 + 8 h (h < 2), tokens 8 j + 2 t + e of the tile at s[4 j + 2 h + e]. A row's maximum
      // and sum are its quad's (two shuffles over t): no exchange between the warps, two rows'
      // state a thread. P goes to its slot as stored (stmatrix, not transposed): row r's 8 tokens
      // at L::p_at(r, 8 j), the layout the O groups read.
      float m[2], l[2], cs[2];
      int end[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        m[h] = -INFINITY, l[h] = 0.f, cs[h] = row_cs[row0 + 8 * h], end[h] = row_end[row0 + 8 * h];
      // stmatrix: lane -> row lane % 8 of matrix lane / 8 (h = lane / 8 % 2, j = 2 q4 + lane / 16)
      const uint32_t p_lane = L::p_at(16 * w + 8 * (lane / 8 % 2) + lane % 8, 8 * (lane / 16));
      for (int it = 0; it < ntiles; ++it) {
        mbarrier_wait(kv_full(it % ST), (it / ST) & 1);  // tile it landed
        fence_proxy_async_smem();  // (a short tile's cp.async writes, before the wgmmas read them)
        const uint32_t tile = s_base + (it % ST) * Tile::kStageBytes;
        float s[BN / 2];
        F::template s_rows<L::kQLbo>(s, tile, q_desc);  // (fenced)
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(s);
        if constexpr (!F::kPInTile)  // (as the S^T path: tile it - 2's O is done with slot it % 2)
          if (it >= 2) mbarrier_wait(empty(it % 2), ((it - 2) / 2) & 1);
        const int tok0 = tok_begin + it * BN;
        const bool masked = tok0 + BN > min_end;  // (uniform)
        constexpr float kLazyLog2 = 8.f;  // the lazy rescale, as the S^T path's
        bool grow = false;
        scale_rows_m(s, cs, end, tok0, masked, t, [&](int h, float x) { grow |= x > m[h] + kLazyLog2; });
        grow = named_barrier_or(1, 128, grow);
        const uint32_t s_pt = F::kPInTile ? tile + F::kPTileOffset : s_p + (it % PS) * L::kPBytes;
        if (grow) {
          float* alpha_t = alpha_x + (it % PS) * R;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor(mx, 1));
            mx = fmaxf(mx, __shfl_xor(mx, 2));
            const float alpha = online_step<Shape::kRowsEndEarly>(m[h], mx);
            l[h] *= alpha;
            if (t == 0) alpha_t[row0 + 8 * h] = alpha;
          }
        }
        if (wt == 0) rescaled[it % PS] = grow;
        uint32_t pa[BN / 16][4];
        exp_rows_m<F, Shape::kRowsEndEarly>(s, m, l, pa);
#pragma unroll
        for (int q4 = 0; q4 < BN / 16; ++q4)
          stmatrix_x4(s_pt + p_lane + q4 * 2 * L::kPLbo, pa[q4][0], pa[q4][1], pa[q4][2], pa[q4][3]);
        fence_proxy_async_smem();
        mbarrier_arrive(full(it % PS));
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor(l[h], 1);
        l[h] += __shfl_xor(l[h], 2);
        if (t == 0) l_final[row0 + 8 * h] = l[h];
      }
      const bool bad = hand_off();
      if (t == 0)
        write_rows(p, blk.qr, splits, [&](const auto& out) {
#pragma unroll
          for (int h = 0; h < 2; ++h) out.state(row0 + 8 * h, m[h], l[h], bad);
        });
    } else {
      float m[NS], l[NS], cs[NS];  // rows 8 j + 2 t + e, slot k = 2 j + e
#pragma unroll
      for (int k = 0; k < NS; ++k) m[k] = -INFINITY, l[k] = 0.f, cs[k] = row_cs[wg_column(k, t)];
      // stmatrix: lane -> row lane % 8 of fragment lane / 8 (j = lane / 16, r = lane / 8 % 2) of a group of four
      const uint32_t p_lane = L::p_at(8 * (lane / 16) + lane % 8, 16 * w + 8 * (lane / 8 % 2));
      for (int it = 0; it < ntiles; ++it) {
        mbarrier_wait(kv_full(it % ST), (it / ST) & 1);  // tile it landed
        fence_proxy_async_smem();  // (a short tile's cp.async writes, before the wgmmas read them)
        const uint32_t tile = s_base + (it % ST) * Tile::kStageBytes;
        float s[L::kSN / 2];
        F::template s_chain<L::kSN, L::kQLbo>(s, tile, q_desc);  // (fenced)
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_regs(s);
        // this tile's P, factors and flag go to slot it % 2: tile it - 2's O must be done with it
        // (long since, as a rule: O(it - 1) ran under this S). P in the tile: its slot is this tile's
        // own, and tile it landed after O(it - 2) was done (its copies go out then): no wait.
        if constexpr (!F::kPInTile)
          if (it >= 2) mbarrier_wait(empty(it % 2), ((it - 2) / 2) & 1);

        const int tok0 = tok_begin + it * BN;
        const bool masked = tok0 + BN > min_end;  // (uniform)
        // Lazy rescale: the rows keep their base m while no score exceeds it by more than
        // kLazyLog2 (P <= 2^kLazyLog2 in f16); only a tile where one does meets the rows' maxima
        // over the 8 lanes and the 4 warps and rescales (the first tile always, as m = -inf). The
        // test needs no maxima: a score over m + kLazyLog2 is one over the row's max.
        constexpr float kLazyLog2 = 8.f;
        bool grow = false;
#pragma unroll
        for (int k = 0; k < NS; ++k) {
          const int j = k / 2, e = k % 2;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float x = s[4 * j + 2 * r + e] * cs[k];
            if constexpr (kLo) x = fmaf(s[4 * (j + R / 8) + 2 * r + e], cs[k] * 0.0625f, x);
            if (masked) x = tok0 + row0 + 8 * r < row_end[8 * j + 2 * t + e] ? x : -INFINITY;
            s[4 * j + 2 * r + e] = x;  // (in place)
          }
          grow |= fmaxf(s[4 * j + e], s[4 * j + 2 + e]) > m[k] + kLazyLog2;
        }
        grow = named_barrier_or(1, 128, grow);
        const uint32_t s_pt = F::kPInTile ? tile + F::kPTileOffset : s_p + (it % PS) * L::kPBytes;
        if (grow) {
          float* alpha_t = alpha_x + (it % PS) * R;
          float mx[NS];  // this warp's max of each row over its 16 tokens
#pragma unroll
          for (int k = 0; k < NS; ++k) {
            const int j = k / 2, e = k % 2;
            mx[k] = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
#pragma unroll
            for (int o2 = 4; o2 < 32; o2 *= 2) mx[k] = fmaxf(mx[k], __shfl_xor(mx[k], o2));
          }
          if (g == 0)
#pragma unroll
            for (int k = 0; k < NS; ++k) red[w * R + wg_column(k, t)] = mx[k];
          named_barrier(1, 128);
#pragma unroll
          for (int k = 0; k < NS; ++k) {
            const int row = wg_column(k, t);
            float tm = red[row];
#pragma unroll
            for (int ww = 1; ww < 4; ++ww) tm = fmaxf(tm, red[ww * R + row]);
            const float alpha = online_step<Shape::kRowsEndEarly>(m[k], tm);
            l[k] *= alpha;
            if (w == 0 && g == 0) alpha_t[row] = alpha;
          }
        }
        if (wt == 0) rescaled[it % PS] = grow;
        // P, and P^T into its slot: the thread's scores of rows 8 j + 2 t + {0, 1} at token
        // row0 + 8 r are one 8 x 8 fragment (j, r) of S^T; stmatrix .trans stores each fragment
        // as 8 query rows of 8 tokens, the O wgmma's B layout (L::p_at), four fragments an instruction
        uint32_t ph[R / 4];  // fragment 2 j + r
#pragma unroll
        for (int k = 0; k < NS; k += 2) {
          const int j = k / 2;
          const float mb0 = step_base<Shape::kRowsEndEarly>(m[k]), mb1 = step_base<Shape::kRowsEndEarly>(m[k + 1]);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float p0 = fast_exp2(s[4 * j + 2 * r] - mb0), p1 = fast_exp2(s[4 * j + 2 * r + 1] - mb1);
            l[k] += p0, l[k + 1] += p1;
            ph[2 * j + r] = F::pack_p(p0, p1);
          }
        }
#pragma unroll
        for (int q4 = 0; q4 < R / 16; ++q4)
          stmatrix_x4_trans(s_pt + p_lane + q4 * 2 * L::kPSbo, ph[4 * q4], ph[4 * q4 + 1], ph[4 * q4 + 2],
                            ph[4 * q4 + 3]);
        fence_proxy_async_smem();
        mbarrier_arrive(full(it % PS));
      }
      // l over the 8 row lanes and the 4 warps, for the O groups' epilogue; the rows' states
#pragma unroll
      for (int k = 0; k < NS; ++k)
#pragma unroll
        for (int o2 = 4; o2 < 32; o2 *= 2) l[k] += __shfl_xor(l[k], o2);
      named_barrier(1, 128);  // (the maxima's last readers are done)
      if (g == 0)
#pragma unroll
        for (int k = 0; k < NS; ++k) red[w * R + wg_column(k, t)] = l[k];
      named_barrier(1, 128);
      if (w == 0 && g == 0)
#pragma unroll
        for (int k = 0; k < NS; ++k) {
          const int row = wg_column(k, t);
          l[k] = red[row] + red[R + row] + red[2 * R + row] + red[3 * R + row];
          l_final[row] = l[k];
        }
      const bool bad = hand_off();
      if (w == 0 && g == 0)
        write_rows(p, blk.qr, splits, [&](const auto& out) {
#pragma unroll
          for (int k = 0; k < NS; ++k) out.state(wg_column(k, t), m[k], l[k], bad);
        });
    }
  } else {
    // ======== groups 1, 2: O^T of their 256 dims for all 64 rows ============================
    setmaxnreg_inc<L::kRegsO>();
    float o[4][R / 2];
#pragma unroll
    for (int mb = 0; mb < 4; ++mb)
#pragma unroll
      for (int i = 0; i < R / 2; ++i) o[mb][i] = 0.f;
    const typename F::template OStep<L> o_step(oc, w, g, t);
    load_into(pre, ST);  // (expanded formats: tile ST's blocks fly while O(0) runs)
    for (int it = 0; it < ntiles; ++it) {
      mbarrier_wait(full(it % PS), (it / PS) & 1);
      const uint32_t tile = s_base + (it % ST) * Tile::kStageBytes;
      const float* alpha_t = alpha_x + (it % PS) * R;
      if (rescaled[it % PS]) o_step.rescale(o, alpha_t, w, g, t);  // (uniform)
      o_step.run(o, tile, F::kPInTile ? tile + F::kPTileOffset : s_p + (it % PS) * L::kPBytes);  // (F::OStep)
      wgmma_wait<0>();
#pragma unroll
      for (int mb = 0; mb < 4; ++mb) wgmma_fence_regs(o[mb]);
      if (page_bad) *any_bad_page = 1;  // (before the arrival: see group 0's epilogue)
      mbarrier_arrive(empty(it % PS));
      if (it + ST < ntiles) {  // (uniform)
        // this group's part of slot it % ST is read by all its warps (each reads every row of its
        // dims; each copies a quarter of the rows): the copies go out after all four warps' loads
        // (racecheck; the wgmmas the loads fed do not order them for the memory model)
        named_barrier(2 + oc, 128);
        issue_tile(it + ST, pre);
        load_into(pre, it + ST + 1);
      }
    }
    mbarrier_wait(sums_ready, 0);  // group 0's sums (and any_bad_page: see group 0's epilogue)
    if (page_bad) flag_error(p, kDevErrPageTable);
    const bool bad = (blk.rows.paged() && *any_bad_page != 0) || blk.seq.bad;
    write_rows(p, blk.qr, splits, [&](const auto& out) { o_step.write(o, out, l_final, kv_scale, bad, oc, w, g, t); });
  }
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
