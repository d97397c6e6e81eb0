// The vendor-neutral half of the MLA decode math: how a sequence is split, the online
// softmax step, the split-state encoding and the combine kernel. The vendor kernels
// (mla_decode_sm90.cuh for NVIDIA wgmma, mla_decode_gfx9.cuh for AMD MFMA) move data and
// drive the matrix units; every formula they share lives here, once.
#pragma once
#include "mlagen/platform.h"
#include "mlagen/device/shapes.cuh"
#include <type_traits>

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

// The decode bodies. The generator names the one a kernel runs (codegen/spec.py KernelSpec.body,
// BODIES) in the kernel's tiling type; the device code dispatches on that name and never infers a
// body from the tiles. A tiling states the formats and tiles its body takes (static_asserts).
enum class Body : int {
  kSm90Wgmma,      // mla_decode_sm90_wgmma.cuh decode_wgmma: 16 rows, one warpgroup, tiles of 64, the KV format a
                   // policy (WgE4m3Kv: fp8, mxfp4 through e4m3 wgmmas; WgBf16Kv: bf16)
  kSm90Rows,       // mla_decode_sm90_rows.cuh: 32 or 64 rows, three warpgroups, the KV format a policy (RowsKv)
  kGfx9,           // mla_decode_gfx9.cuh decode_gfx9: 16 rows, four waves of MFMA, the KV format a policy
                   // (Gfx9Fp8Kv; Gfx9WideKv: bf16, mxfp4 expanded in LDS)
  kGfx950Fp8,      // mla_decode_gfx950_fp8.cuh: the native fp8 datapath, merges its own splits
};

// The geometry of a body whose warps (wavefronts) split the dims (the gfx9 body): a KV tile of
// kBlockN token rows in shared memory, the 576 QK dims split over kWarps warps, the 512 V dims likewise.
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

// Whether a tiling's decode can merge its splits inside its own launch when the host launches it
// cooperatively (NVIDIA, the 16-row body: mla_decode_sm90.cuh merge_block); else its combine runs.
template <class T>
struct MergesInLaunch {
#if defined(MLAGEN_NVIDIA)
  static constexpr bool value = !RowsBody<T>::value && !FusedCombine<T>::value;
#else
  static constexpr bool value = false;
#endif
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

// ---- the epilogue every body ends with ----------------------------------------------------
// A block that holds its sequence whole (one split) writes each query row's output, normalized,
// in bf16, and its LSE; a split block writes the row's unnormalized partial O and its (m, l) for
// the merge (a padding row's partial too: harmless, the merge skips the row). A body hands its
// epilogue to write_rows, which runs it with the RowWriter of the block's case, chosen once (the
// body's store loop is compiled for each case, no branch inside it): the body multiplies what it
// accumulated by scale(), takes a row's destination once (row()), hands it each run of N
// consecutive dims (put(): one store of N values), and one lane a row hands the row's state to
// state().
template <bool kWhole>
struct RowDst {
  using Elem = std::conditional_t<kWhole, uint16_t, float>;  // bf16 output / float partial
  Elem* at;   // the row's dim 0
  bool live;  // a row the block owns (a padding row's output is not written)
  template <int N>
  MLAGEN_DEVICE void put(int dim, const float (&v)[N]) const {
    static_assert(N == 1 || N == 2 || N == 4 || N == 8, "a run of 1, 2, 4 or 8 dims: one store");
    if constexpr (kWhole) {
      if (!live) return;
      if constexpr (N == 1) {
        at[dim] = static_cast<uint16_t>(pack_bf16x2(v[0], 0.f));
      } else if constexpr (N == 2) {
        *reinterpret_cast<uint32_t*>(at + dim) = pack_bf16x2(v[0], v[1]);
      } else if constexpr (N == 4) {
        uint2 w;
        w.x = pack_bf16x2(v[0], v[1]);
        w.y = pack_bf16x2(v[2], v[3]);
        *reinterpret_cast<uint2*>(at + dim) = w;
      } else {
        uint4 w;
        w.x = pack_bf16x2(v[0], v[1]);
        w.y = pack_bf16x2(v[2], v[3]);
        w.z = pack_bf16x2(v[4], v[5]);
        w.w = pack_bf16x2(v[6], v[7]);
        *reinterpret_cast<uint4*>(at + dim) = w;
      }
    } else if constexpr (N == 1) {
      at[dim] = v[0];
    } else if constexpr (N == 2) {
      *reinterpret_cast<float2*>(at + dim) = make_float2(v[0], v[1]);
    } else {
#pragma unroll
      for (int i = 0; i < N; i += 4) *reinterpret_cast<float4*>(at + dim + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    }
  }
};
template <bool kWhole>
struct RowWriter {
  const Params& p;
  const QueryRows& qr;
  MLAGEN_DEVICE float scale(float l, float o_scale, bool bad) const { return kWhole ? out_scale(l, o_scale, bad) : 1.f; }
  MLAGEN_DEVICE RowDst<kWhole> row(int j) const {
    if constexpr (kWhole)
      return {p.out + qr.token(j) * p.out_stride_token + qr.head(j) * p.out_stride_head, qr.owns(j)};
    else
      return {p.part_o + qr.part(j) * kVDim, true};
  }
  MLAGEN_DEVICE void state(int j, float m, float l, bool bad) const {
    if constexpr (kWhole) {
      if (qr.owns(j)) store_lse(p, qr.token(j), qr.head(j), m, l, bad);
    } else {
      p.part_ml[qr.part(j)] = split_state(m, l, bad);
    }
  }
};
template <class F>
MLAGEN_DEVICE void write_rows(const Params& p, const QueryRows& qr, int splits, F&& epilogue) {
  if (splits == 1)
    epilogue(RowWriter<true>{p, qr});
  else
    epilogue(RowWriter<false>{p, qr});
}

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
  // The same, and the split's 4 dims v into acc: acc = a acc + w v (nothing for a split without tokens).
  MLAGEN_DEVICE void add(float2 ml, const float4& v, float4& acc) {
    float a, w;
    if (!add(ml, a, w)) return;
    acc.x = acc.x * a + w * v.x;
    acc.y = acc.y * a + w * v.y;
    acc.z = acc.z * a + w * v.z;
    acc.w = acc.w * a + w * v.w;
  }
  MLAGEN_DEVICE float scale(float o_scale) const {
    return bad || lsum != lsum ? quiet_nan() : (lsum > 0.f ? o_scale / lsum : 0.f);
  }
};

// A load of a value another block of this grid (or the decode grid before it) wrote: the split
// partials. On NVIDIA past L1, whose lines are not kept coherent across SMs.
template <class V>
MLAGEN_DEVICE V load_partial(const V* at) {
#if defined(MLAGEN_NVIDIA)
  return __ldcg(at);
#else
  return *at;
#endif
}

// Merges the splits' partials of one query row over 4 of its dims: acc = sum_s w_s O_s[dim .. dim + 3]
// with w_s = 2^(m_s - max m); the returned state's scale() and lse() finish the row. Split s's
// partial row is part0 + s * stride (part0: split 0's, QueryRows::part; stride: the rows a split's
// partials take, row_groups * 16). kGroup splits' loads are in flight at once (one L2 round trip
// each kGroup splits). A split flagged bad (NaN sum) makes the row NaN, as one split does.
template <int kGroup>
MLAGEN_DEVICE SplitMerge merge_row(const Params& p, int splits, int64_t part0, int64_t stride, int dim, float4& acc) {
  SplitMerge mg;
  acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < splits; s0 += kGroup) {
    float2 ml[kGroup];
    float4 v[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int64_t at = part0 + min(s0 + i, splits - 1) * stride;  // past the end: read again, skipped below
      ml[i] = load_partial(&p.part_ml[at]);
      v[i] = load_partial(reinterpret_cast<const float4*>(p.part_o + at * kVDim + dim));
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      if (s0 + i >= splits) break;
      mg.add(ml[i], v[i], acc);  // a split without tokens weighs 0
    }
  }
  return mg;
}

// Writes N dims of a merged row at (tok, head), from `dim`: bf16 times mg.scale(o_scale), in runs of
// up to 8 (the epilogue's RowDst); and the row's LSE where `lse_writer` (one thread a row). The
// merges' epilogue: the combine kernel's and the in-launch merge's 4 dims a thread, the gfx950
// body's 32.
template <int N>
MLAGEN_DEVICE void store_merged(const Params& p, const SplitMerge& mg, float o_scale, int64_t tok, int head, int dim,
                                const float (&acc)[N], bool lse_writer) {
  constexpr int K = N < 8 ? N : 8;
  static_assert(N % K == 0, "runs of 8 dims");
  const float inv = mg.scale(o_scale);
  const RowDst<true> dst{p.out + tok * p.out_stride_token + head * p.out_stride_head, true};
#pragma unroll
  for (int c = 0; c < N / K; ++c) {
    float v[K];
#pragma unroll
    for (int i = 0; i < K; ++i) v[i] = acc[K * c + i] * inv;
    dst.put(dim + K * c, v);
  }
  if (lse_writer) store_lse(p, tok, head, mg.mmax, mg.lsum, mg.bad);
}

// What a merged partial O is multiplied by besides 1 / l: the per-tensor KV scale where the body
// leaves it to the end (fp8), times its partial-O unit (T::kVUnit).
template <class T>
MLAGEN_DEVICE float merge_o_scale(const Params& p) {
  return T::kWide ? 1.f : kv_scale_of(p) * T::kVUnit;
}

// The combine's split groups meet: each group g > 0 leaves its state (as a split's) and its 4 dims a
// thread in shared memory, and group 0 merges them into its own (the order of the merge changes no
// weight: w = 2^(m - max m) over the groups' maxima as over the splits').
MLAGEN_DEVICE void combine_groups_merge(SplitMerge& mg, float4& acc, int groups, int g, int t) {
  __shared__ float4 s_acc[kCombineMaxGroups - 1][kCombineGroupThreads];
  __shared__ float2 s_ml[kCombineMaxGroups - 1];
  if (g > 0) {
    s_acc[g - 1][t] = acc;
    if (t == 0) s_ml[g - 1] = split_state(mg.mmax, mg.lsum, mg.bad);
  }
  __syncthreads();
  if (g > 0) return;
  for (int h = 1; h < groups; ++h) mg.add(s_ml[h - 1], s_acc[h - 1][t], acc);  // a group without tokens weighs 0
}

// Merges the splits of one (sequence, query row): out = sum_s w_s O_s / sum_s w_s l_s with
// w_s = 2^(m_s - max m), times the per-tensor KV scale where the kernel's path leaves it to
// the end (fp8). G groups of 128 threads x 4 dims (blockDim = 128 G, G <= combine_groups(splits):
// the host's choice, launch.cpp): group g merges splits g, g + G, .. online with the loads of 8
// splits in flight at once (one L2 round trip per 8 of its splits after the wait), then group 0
// merges the G groups' states from shared memory and writes the row. A specialization of at most
// 8 splits is one group at compile time (its split count known: no shared memory, only the loads
// it needs). grid = batch * row_groups * 16 (padding rows return). Launched as a dependent grid
// (NVIDIA), it reads the call's own inputs while the decode grid still runs. (entry.cuh: the body
// of a code object's `<name>_combine`, at most kCombineThreads.)
template <class T, class Shape>
MLAGEN_DEVICE void mla_combine_block(const Params& p) {
  const int per_seq = Shape::row_groups(p) * kGroupRows;
  const int b = blockIdx.x / per_seq, r = blockIdx.x % per_seq;
  const int splits = Shape::splits(p);
  const QueryTokens qt = Shape::query(p, b);
  const QueryRows rows = query_rows<Shape>(p, BlockCoord{b, 0, r / kGroupRows}, qt.row, qt.n, 0);
  const int j = r % kGroupRows;
  if (!rows.owns(j)) return;  // (the whole block)
  const int64_t stride = static_cast<int64_t>(Shape::row_groups(p)) * kGroupRows;  // part rows a split
  const float o_scale = merge_o_scale<T>(p);
  constexpr bool kOneGroup = Shape::kStaticSplits > 0 && Shape::kStaticSplits <= kCombineSplitsInFlight;
  const int groups = kOneGroup ? 1 : static_cast<int>(blockDim.x) / kCombineGroupThreads;
  const int g = kOneGroup ? 0 : static_cast<int>(threadIdx.x) / kCombineGroupThreads;
  const int t = kOneGroup ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % kCombineGroupThreads;
  wait_for_prior_grid();  // the decode grid's partials are complete and visible
  const int dim = 4 * t;
  float4 acc;
  // group g's splits: g, g + G, ... (none when g >= splits: an empty state, weight 0)
  SplitMerge mg = merge_row<kCombineSplitsInFlight>(p, (splits - g + groups - 1) / groups, rows.part(j) + g * stride,
                                                    stride * groups, dim, acc);
  if constexpr (!kOneGroup) {
    if (groups > 1) combine_groups_merge(mg, acc, groups, g, t);
    if (g > 0) return;
  }
  const float a4[4] = {acc.x, acc.y, acc.z, acc.w};
  store_merged(p, mg, o_scale, rows.token(j), rows.head(j), dim, a4, threadIdx.x == 0);
}

}  // namespace mlagen::device
