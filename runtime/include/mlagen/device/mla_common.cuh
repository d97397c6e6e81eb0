// The vendor-neutral half of the MLA decode math: how a sequence is split, the online
// softmax step, the split-state encoding and the combine kernel. The vendor kernels
// (mla_decode.cuh for NVIDIA mma.sync, mla_decode_gfx9.cuh for AMD MFMA) move data and
// drive the matrix units; every formula they share lives here, once.
#pragma once
#include "mlagen/platform.h"
#include "mlagen/device/shapes.cuh"

#if defined(MLAGEN_NVIDIA)
#include "mlagen/device/sm90_ops.cuh"
#else
#include "mlagen/device/gfx9_ops.cuh"
#endif

namespace mlagen::device {

#if defined(MLAGEN_NVIDIA)
using namespace sm90;
#else
using namespace gfx9;
#endif

constexpr float kLog2e = 1.4426950408889634f;

// Geometry every vendor kernel shares: a KV tile of kBlockN token rows in shared memory,
// the 576 QK dims split over kWarps warps (wavefronts on AMD), the 512 V dims likewise.
template <int kBlockN_, int kStages_, int kWarps_>
struct TileGeometry {
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * MLAGEN_WARP_SIZE;
  static constexpr int kRowBytes = kQkDim + 16;  // padded rows: conflict-free row access
  static constexpr int kStageBytes = kBlockN * kRowBytes;
  static constexpr int kChunksPerRow = kQkDim / 16;                // 16-byte chunks a row
  static constexpr int kChunksPerTile = kBlockN * kChunksPerRow;
  static constexpr int kQkChunksPerWarp = kChunksPerRow / kWarps;  // 9 chunks of 16 dims
  static constexpr int kVDimsPerWarp = kVDim / kWarps;             // 128
  static_assert(kChunksPerRow % kWarps == 0, "QK dims must divide over the warps");
};

// 4x4 byte transpose: out[u] = byte u of w[0..3], w[0]'s in the low byte (V^T fragments of
// the fp8 kernels, both vendors). The second stage's selectors may swap the word pairs
// (sel_even = 0x1054, sel_odd = 0x3276): out[u] then holds byte u of w[2], w[3], w[0], w[1]
// in that order, at no extra instruction (the sm90 warpgroup kernel's rotated loads).
MLAGEN_DEVICE void transpose4x4(const uint32_t (&w)[4], uint32_t (&out)[4], uint32_t sel_even = 0x5410,
                                uint32_t sel_odd = 0x7632) {
  const uint32_t lo01 = byte_perm(w[0], w[1], 0x5140), hi01 = byte_perm(w[0], w[1], 0x7362);
  const uint32_t lo23 = byte_perm(w[2], w[3], 0x5140), hi23 = byte_perm(w[2], w[3], 0x7362);
  out[0] = byte_perm(lo01, lo23, sel_even);
  out[1] = byte_perm(lo01, lo23, sel_odd);
  out[2] = byte_perm(hi01, hi23, sel_even);
  out[3] = byte_perm(hi01, hi23, sel_odd);
}

// Whether a tiling's decode merges its own splits (T::kFusedCombine; absent = no): then the
// launcher runs no combine kernel.
template <class T, class = void>
struct FusedCombine {
  static constexpr bool value = false;
};
template <class T>
struct FusedCombine<T, decltype(void(T::kFusedCombine))> {
  static constexpr bool value = T::kFusedCombine;
};

// Whether a tiling is the sm90a rows body (T::kRowsBody; absent = no), and the query rows its
// block owns (T::kRowsPerBlock; absent = 16, one row group: shapes.cuh block_coord).
template <class T, class = void>
struct RowsBody {
  static constexpr bool value = false;
  static constexpr int kRowsPerBlock = 16;
};
template <class T>
struct RowsBody<T, decltype(void(T::kRowsBody))> {
  static constexpr bool value = T::kRowsBody;
  static constexpr int kRowsPerBlock = T::kRowsPerBlock;
};

// Split `split` of `splits` over a sequence of seq_len tokens, in whole tiles of block_n.
struct SplitRange {
  int ntiles;     // tiles this split streams (0 for an empty split)
  int tok_begin;  // first token, relative to the sequence
  int tok_end;    // one past the last token
};
MLAGEN_DEVICE SplitRange split_range(int seq_len, int split, int splits, int block_n) {
  const int tiles_total = (seq_len + block_n - 1) / block_n;
  const int tiles_per_split = (tiles_total + splits - 1) / splits;
  const int tile_begin = min(tiles_total, split * tiles_per_split);
  const int ntiles = min(tiles_total, tile_begin + tiles_per_split) - tile_begin;
  const int tok_begin = tile_begin * block_n;
  return SplitRange{ntiles, tok_begin, min(seq_len, tok_begin + ntiles * block_n)};
}

// One row's online-softmax step in the log2 domain: m is the running max, mx this tile's
// row max. Returns the factor exp2(m_old - m_new) that rescales what was accumulated so far
// (0 on the row's first tile with a key, where m_old = -inf). kRowsEndEarly
// (Shape::kRowsEndEarly: causal query tokens): a row that has seen no key yet (every score of
// a split's last tiles -inf) keeps m = -inf and gets 1, and step_base(m) gives 0 to take its
// exponents relative to, so its P is 0, not NaN. One query token a sequence sees a key in every
// tile: no guard.
template <bool kRowsEndEarly>
MLAGEN_DEVICE float online_step(float& m, float mx) {
  const float m_new = fmaxf(m, mx);
  const float alpha = kRowsEndEarly && m_new == -INFINITY ? 1.f : fast_exp2(m - m_new);
  m = m_new;
  return alpha;
}
// What a row's scores are taken relative to: its running max (0 while a causal row's is -inf).
template <bool kRowsEndEarly>
MLAGEN_DEVICE float step_base(float m) {
  return kRowsEndEarly && m == -INFINITY ? 0.f : m;
}

MLAGEN_DEVICE float quiet_nan() { return __int_as_float(0x7fc00000); }

// Final scale of an unnormalized output row: o_scale / l; an empty sequence gives 0 and a
// sequence whose indptr was flagged gives NaN.
MLAGEN_DEVICE float out_scale(float l, float o_scale, bool bad) {
  return bad ? quiet_nan() : (l > 0.f ? o_scale / l : 0.f);
}

// The convention: lse = ln sum_j exp(sm_scale * q.k_j) over the sequence's tokens, natural log
// of the scaled scores (FlashAttention's / FlashMLA's softmax_lse and vLLM's merge_attn_states
// take it so); -inf for an empty sequence, NaN for a flagged one. m is the running max of the
// log2-domain scores the kernel subtracted, l the sum of 2^(s - m).
constexpr float kLn2 = 0.6931471805599453f;
MLAGEN_DEVICE float lse_of(float m, float l, bool bad) {
  return bad || l != l ? quiet_nan() : (l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY);
}
MLAGEN_DEVICE void store_lse(const Params& p, int64_t q_row, int head, float m, float l, bool bad) {
  if (p.lse) p.lse[q_row * p.lse_stride_token + head] = lse_of(m, l, bad);
}

// What a split leaves for the combine: (running max, running sum); NaN sum when flagged.
MLAGEN_DEVICE float2 split_state(float m, float l, bool bad) { return make_float2(m, bad ? quiet_nan() : l); }

// The online merge of split states (m_s, l_s): weights w_s = 2^(m_s - max m); a split flagged
// bad (NaN sum) makes the row NaN. add() returns false for an empty split (weight 0), else the
// factor `a` for what was merged so far and the split's weight `w`; scale() the final factor
// of the merged row (o_scale / sum w_s l_s; 0 for no tokens).
struct SplitMerge {
  float mmax = -INFINITY, lsum = 0.f;
  bool bad = false;
  MLAGEN_DEVICE bool add(float2 ml, float& a, float& w) {
    bad |= ml.y != ml.y;
    if (ml.x == -INFINITY) return false;
    const float mn = fmaxf(mmax, ml.x);
    a = fast_exp2(mmax - mn);  // 0 while mmax = -inf
    w = fast_exp2(ml.x - mn);
    lsum = lsum * a + w * ml.y;
    mmax = mn;
    return true;
  }
  MLAGEN_DEVICE float scale(float o_scale) const {
    return bad || lsum != lsum ? quiet_nan() : (lsum > 0.f ? o_scale / lsum : 0.f);
  }
  MLAGEN_DEVICE float lse() const { return lse_of(mmax, lsum, bad); }
};

// A load of a value another block of this grid (or the decode grid before it) wrote: the split
// partials. On NVIDIA past L1, whose lines are not kept coherent across SMs (read once anyway).
template <class V>
MLAGEN_DEVICE V load_partial(const V* at) {
#if defined(MLAGEN_NVIDIA)
  return __ldcg(at);
#else
  return *at;
#endif
}

// Merges the splits' partials of one query row: acc[q] = sum_s w_s O_s[dim(q) .. dim(q) + 3] with
// w_s = 2^(m_s - max m), the returned state's scale() and lse() finishing the row. Split s's partial
// row is part0 + s * stride (rows of part_ml / part_o: QueryRows::part of split 0, and the rows
// a split's partials take, row_groups * 16). kGroup splits' loads are in flight at once (one L2
// round trip each kGroup splits). A split flagged bad (NaN sum) makes the row NaN.
template <int kVec, int kGroup, class Dim>
MLAGEN_DEVICE SplitMerge merge_row(const Params& p, int splits, int64_t part0, int64_t stride, Dim dim,
                                   float4 (&acc)[kVec]) {
  SplitMerge mg;
#pragma unroll
  for (int q = 0; q < kVec; ++q) acc[q] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1  // one group's loads in flight at a time: kGroup x kVec float4 of registers
  for (int s0 = 0; s0 < splits; s0 += kGroup) {
    float2 ml[kGroup];
    float4 v[kGroup][kVec];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int64_t at = part0 + min(s0 + i, splits - 1) * stride;  // past the end: read again, skipped below
      ml[i] = load_partial(&p.part_ml[at]);
#pragma unroll
      for (int q = 0; q < kVec; ++q) v[i][q] = load_partial(reinterpret_cast<const float4*>(p.part_o + at * kVDim + dim(q)));
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      if (s0 + i >= splits) break;
      float a, w;
      if (!mg.add(ml[i], a, w)) continue;  // no tokens: weight 0
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        acc[q].x = acc[q].x * a + w * v[i][q].x;
        acc[q].y = acc[q].y * a + w * v[i][q].y;
        acc[q].z = acc[q].z * a + w * v[i][q].z;
        acc[q].w = acc[q].w * a + w * v[i][q].w;
      }
    }
  }
  return mg;
}

// Writes a merged row (merge_row) at (tok, head): its dims as bf16 times mg.scale(o_scale), and its
// LSE where `lse_writer` (one thread a row).
template <int kVec, class Dim>
MLAGEN_DEVICE void store_merged_row(const Params& p, const SplitMerge& mg, float o_scale, int64_t tok, int head, Dim dim,
                                    const float4 (&acc)[kVec], bool lse_writer) {
  const float inv = mg.scale(o_scale);
  uint16_t* out = p.out + tok * p.out_stride_token + head * p.out_stride_head;
#pragma unroll
  for (int q = 0; q < kVec; ++q)
    *reinterpret_cast<uint2*>(out + dim(q)) =
        make_uint2(pack_bf16x2(acc[q].x * inv, acc[q].y * inv), pack_bf16x2(acc[q].z * inv, acc[q].w * inv));
  if (lse_writer && p.lse) p.lse[tok * p.lse_stride_token + head] = mg.lse();
}

// What a merged partial O is multiplied by besides 1 / l: the per-tensor KV scale where the body
// leaves it to the end (fp8), times its partial-O unit (T::kVUnit).
template <class T>
MLAGEN_DEVICE float merge_o_scale(const Params& p) {
  return T::kWide ? 1.f : kv_scale_of(p) * T::kVUnit;
}

// Merges the splits of one (sequence, query row): out = sum_s w_s O_s / sum_s w_s l_s with
// w_s = 2^(m_s - max m), times the per-tensor KV scale where the kernel's path leaves it to
// the end (fp8). 128 threads x 4 dims; grid = batch * row_groups * 16 (padding rows return).
// Launched as a dependent grid (NVIDIA), it reads the call's own inputs while the decode
// grid still runs, then merges online with the loads of 8 splits in flight at once: one L2
// round trip per 8 splits after the wait.
// (entry.cuh: the body of a code object's `<name>_combine`, kCombineThreads a block.)
template <class T, class Shape>
MLAGEN_DEVICE void mla_combine_block(const Params& p) {
  const int per_seq = Shape::row_groups(p) * kGroupRows;
  const int b = blockIdx.x / per_seq, r = blockIdx.x % per_seq;
  const int splits = Shape::splits(p);
  const QueryTokens qt = Shape::query(p, b);
  const QueryRows rows = query_rows<Shape>(p, BlockCoord{b, 0, r / kGroupRows}, qt.row, qt.n, 0);
  const int j = r % kGroupRows;
  if (!rows.owns(j)) return;
  const int64_t stride = static_cast<int64_t>(Shape::row_groups(p)) * kGroupRows;  // part rows a split
  const float o_scale = merge_o_scale<T>(p);
  wait_for_prior_grid();  // the decode grid's partials are complete and visible
  auto dim = [](int) { return 4 * static_cast<int>(threadIdx.x); };
  float4 acc[1];
  const SplitMerge mg = merge_row<1, 8>(p, splits, rows.part(j), stride, dim, acc);  // from split 0's row (slot b * splits)
  store_merged_row<1>(p, mg, o_scale, rows.token(j), rows.head(j), dim, acc, threadIdx.x == 0);
}

// The merge of the block's rows by the last split to finish (merge_own_splits, below). On NVIDIA a
// function of its own (not inlined): ptxas allocates the body's main loop without it, so adding the
// merge moves no register of the loop (inlined, the 255-register bodies' spills moved by a few bytes
// either way, whatever the merge's size). Nothing is live across the call at the end of a body.
// Params by value there: a reference would put the kernel's Params in local memory for the whole
// kernel, to take its address. On AMD inlined (no call), by reference as everywhere else.
#if defined(MLAGEN_NVIDIA)
#define MLAGEN_MERGE_FN __device__ __noinline__
#define MLAGEN_MERGE_PARAMS const Params
#else
#define MLAGEN_MERGE_FN MLAGEN_DEVICE
#define MLAGEN_MERGE_PARAMS const Params&
#endif
template <class T, class Shape, int kRows, int kVec, int kGroup>
MLAGEN_MERGE_FN void merge_block_rows(MLAGEN_MERGE_PARAMS p) {
  constexpr int kPieces = kVDim / (4 * kVec);
  const BlockCoord bc = block_coord<Shape, kRows>(p);
  const int b = bc.b, group = bc.group, splits = Shape::splits(p);
  const QueryTokens qt = Shape::query(p, b);
  const QueryRows qr = query_rows<Shape, kRows>(p, BlockCoord{b, 0, group}, qt.row, qt.n, 0);  // split 0's rows
  const int64_t stride = static_cast<int64_t>(Shape::row_groups(p)) * kGroupRows;  // part rows a split
  const float o_scale = merge_o_scale<T>(p);
#pragma unroll 1
  for (int item = threadIdx.x; item < kRows * kPieces; item += T::kThreads) {
    const int j = item / kPieces, c = item % kPieces;
    if (!qr.owns(j)) continue;  // a padding row
    auto dim = [c](int q) { return 4 * c + 4 * kPieces * q; };
    float4 acc[kVec];
    const SplitMerge mg = merge_row<kVec, kGroup>(p, splits, qr.part(j), stride, dim, acc);
    store_merged_row<kVec>(p, mg, o_scale, qr.token(j), qr.head(j), dim, acc, c == 0);
  }
}

// The sm90 bodies' merge: pieces of 4 float4, 8 splits' loads in flight (32 float4 a thread):
// 64 KB a 128-thread block in flight.
constexpr int kMergeVec = 4, kMergeGroup = 8;

// A decode that merges its own splits (T::kFusedCombine): with splits > 1 every thread of the
// block calls this once its writes of the block's partials (part_o, part_ml of its kRows rows)
// are issued. The block arrives on its (sequence, row group) counter in the workspace
// (p.split_counters[b * row_groups + first row group]); the last of the splits to arrive merges
// every split's partials into the output (and the LSE) and sets the counter back to 0, so that
// the next call on the same workspace starts from 0 (the workspace is zeroed once when it is
// allocated; a workspace serves one stream at a time). The others return.
// Ordering: each thread's partial writes, then its fence (release), the block barrier, thread 0's
// atomic; the last block's fence (acquire), then its reads of the partials (load_partial).
// The merge: kThreads threads over kRows rows x kVDim / (4 kVec) pieces a row, piece c holding dims
// 4 c + 4 (kVDim / (4 kVec)) q, q < kVec (a warp's loads of one q are contiguous), kGroup splits'
// loads in flight a thread. The block's place and rows come from blockIdx and the sizes again (as
// the combine kernel takes them): the body holds nothing in registers for the merge.
template <class T, class Shape, int kRows, int kVec, int kGroup>
MLAGEN_DEVICE void merge_own_splits(const Params& p) {
  __threadfence();  // release: this thread's partial writes before the block's arrival
  __syncthreads();  // every thread's
  const BlockCoord bc = block_coord<Shape, kRows>(p);
  const int splits = Shape::splits(p);
  uint32_t* const counter =
      p.split_counters + static_cast<int64_t>(bc.b) * Shape::row_groups(p) + bc.group * (kRows / kGroupRows);
  bool last = false;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == static_cast<uint32_t>(splits - 1);
  if (!__syncthreads_or(last)) return;
  __threadfence();  // acquire: every split's partial
  merge_block_rows<T, Shape, kRows, kVec, kGroup>(p);
  if (threadIdx.x == 0) *counter = 0u;  // ready for the next call (and a graph's replay)
}

}  // namespace mlagen::device
