// Problem sizes as the kernels see them: compile-time (a generated specialization) or
// read at run time from kv_indptr / qo_indptr (the generic kernel). Both validate what
// they read and flag disagreement in the workspace's error word instead of computing a
// silently wrong answer: a flagged sequence's output is NaN.
#pragma once
#include "mlagen/platform.h"
#include "mlagen/kernel_abi.h"
#if defined(MLAGEN_NVIDIA)
#include <cuda_bf16.h>
#endif

namespace mlagen::device {

constexpr int kGroupRows = 16;  // query rows a row group holds (QueryRows::kRows): a block owns one or more row groups
constexpr int kQkDim = 576;
constexpr int kVDim = 512;

// Kernel parameters (Params): mlagen/kernel_abi.h, shared with the host's argument packer.

struct Sequence {
  int64_t kv_begin;      // contiguous: first KV row
  int len;               // KV rows
  int64_t q_row;         // first row (token) of q / out
  int q_len;             // query tokens (flagged: 1, or 0 = no row of its own to write)
  bool bad;              // indptr / page list disagreed: output NaN
  const int32_t* pages;  // paged: the sequence's page list (null: contiguous rows)
};

constexpr uint32_t kDevErrKvIndptr = 1u, kDevErrQoIndptr = 2u, kDevErrPageTable = 4u;  // = MLAGEN_DEVERR_*

MLAGEN_DEVICE float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
MLAGEN_DEVICE float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
MLAGEN_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
#if defined(MLAGEN_NVIDIA)
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
#else
  auto rne = [](float f) -> uint32_t {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN stays NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  };
  return rne(lo) | (rne(hi) << 16);
#endif
}

MLAGEN_DEVICE void flag_error(const Params& p, uint32_t code) { atomicOr(p.errors, code); }

// The per-tensor KV scale the fp8 path folds into S and O (null for bf16 / mxfp4: mxfp4
// scales are applied while dequantizing, bf16 has none). The decode and combine kernels
// both read it here.
MLAGEN_DEVICE float kv_scale_of(const Params& p) { return p.kv_scale ? *p.kv_scale : 1.f; }

// A paged sequence's page list and length, checked against the table's bounds (never a read
// outside page_table: a flagged sequence gets an empty list). Page ids are checked where
// they are used (kv_rows.cuh).
struct PageList {
  const int32_t* pages;
  int len;
  bool bad;
};
MLAGEN_DEVICE PageList page_list(const Params& p, int b) {
  if (p.page_indptr) {  // FlashInfer: kv_indices + page indptr + last page lengths
    const int64_t pb = p.page_indptr[b], pe = p.page_indptr[b + 1];
    const int64_t n = pe - pb, last = n > 0 ? p.last_page_len[b] : 0;
    const int64_t len = n > 0 ? ((n - 1) << p.page_shift) + last : 0;
    const bool bad = pb < 0 || n < 0 || pe > p.page_table_len || (n > 0 && (last < 1 || last > (int64_t{1} << p.page_shift))) ||
                     len > 0x7fffffff;
    return PageList{p.page_table + (bad ? 0 : pb), bad ? 0 : static_cast<int>(len), bad};
  }
  int64_t len;  // block table: lengths given, or from a token indptr
  bool bad;
  if (p.kv_lens) {
    len = p.kv_lens[b];
    bad = len < 0;
  } else {
    const int32_t kb = p.kv_indptr[b], ke = p.kv_indptr[b + 1];
    len = static_cast<int64_t>(ke) - kb;
    bad = kb < 0 || ke < kb;
  }
  bad |= len > (static_cast<int64_t>(p.page_table_width) << p.page_shift);
  return PageList{p.page_table + static_cast<int64_t>(b) * p.page_table_stride, bad ? 0 : static_cast<int>(len), bad};
}

// A sequence's query tokens from qo_indptr: q_len of them exactly (kUniform: a specialized
// kernel), or 1..q_len (the generic kernel). Flagged when they disagree. A specialized kernel
// reads rows b * q_len .. + q_len - 1 whatever qo_indptr says (the runtime checked total_q), so
// no address waits on the indptr load (a flagged sequence's own rows become NaN); the generic
// kernel reads qo_indptr's rows. Flagged, the generic kernel's sequence makes the first row of
// its range NaN when the range is not empty and starts inside total_q, and writes no row
// otherwise (n = 0: its blocks compute from row 0 and own none): the range of a sequence of 0
// tokens starts at the next sequence's first row (or at total_q), which is not its to write.
struct QueryTokens {
  int64_t row;
  int n;
  bool bad;
};
template <bool kUniform>
MLAGEN_DEVICE QueryTokens read_query(const Params& p, int b, int q_len) {
  const int32_t qb = p.qo_indptr[b], qe = p.qo_indptr[b + 1];
  const int n = qe - qb;
  if constexpr (kUniform) {
    const int64_t row = static_cast<int64_t>(b) * q_len;
    return QueryTokens{row, q_len, qb != row || n != q_len};
  }
  const bool bad = n < 1 || n > q_len || qb < 0 || qe > p.total_q;
  if (bad) {
    const bool own_row = n >= 1 && qb >= 0 && qb < p.total_q;
    return QueryTokens{own_row ? qb : 0, own_row ? 1 : 0, true};
  }
  return QueryTokens{qb, n, false};
}
// The tokens without the check (the combine: the decode grid flagged what was wrong): a
// specialized kernel's rows need no load at all.
template <bool kUniform>
MLAGEN_DEVICE QueryTokens query_tokens(const Params& p, int b, int q_len) {
  if constexpr (kUniform) return QueryTokens{static_cast<int64_t>(b) * q_len, q_len, false};
  return read_query<false>(p, b, q_len);
}

// What a sequence's q / kv indptr entries say; flagged (error word + NaN output) when they
// disagree with the sizes. kKvLen > 0: the uniform length of a specialized kernel; kPage:
// kv_rows.cuh's page policy (0 contiguous).
template <int kKvLen, int kPage>
MLAGEN_DEVICE Sequence read_sequence(const Params& p, int b, int q_len) {
  const QueryTokens qt = read_query<(kKvLen > 0)>(p, b, q_len);
  Sequence s{0, 0, qt.row, qt.n, qt.bad, nullptr};
  uint32_t err = qt.bad ? kDevErrQoIndptr : 0u;
  if (kPage > 0 || (kPage < 0 && p.page_table)) {
    const PageList pl = page_list(p, b);
    const bool bad_len = pl.bad || (kKvLen > 0 && pl.len != kKvLen);
    s.pages = pl.pages;
    s.len = bad_len ? 0 : pl.len;
    s.bad |= bad_len;
    err |= bad_len ? kDevErrPageTable : 0u;
  } else {
    const int32_t kb = p.kv_indptr[b], ke = p.kv_indptr[b + 1];
    const bool bad_kv = kKvLen > 0 ? (kb != b * kKvLen || ke != (b + 1) * kKvLen) : (kb < 0 || ke < kb || ke > p.total_kv);
    s.kv_begin = bad_kv ? 0 : kb;
    s.len = bad_kv ? 0 : ke - kb;
    s.bad |= bad_kv;
    err |= bad_kv ? kDevErrKvIndptr : 0u;
  }
  if constexpr (kKvLen > 0) {
    // a specialized kernel walks its compile-time length whatever the indptr says (a flagged
    // sequence's output is NaN): rows b * kKvLen.. (the runtime checked total_kv), or row b of
    // the block table (the runtime checked its width), page ids checked where used
    s.len = kKvLen;
    if (kPage == 0) s.kv_begin = static_cast<int64_t>(b) * kKvLen;
    else s.pages = p.page_table + static_cast<int64_t>(b) * p.page_table_stride;
  }
  if (err && threadIdx.x == 0 && blockIdx.x == 0) flag_error(p, err);
  return s;
}

// Which query rows a block owns. A sequence's rows are its n query tokens x H heads, row
// r = token r / H, head r % H (heads fastest: FlashMLA's q_seq_per_hk axis); the block of row
// group `group` owns rows 16 group .. + 15 (kRows: the N of the 16-row bodies' products, the
// warpgroup body's wgmmas and the gfx9 body's MFMAs). Rows past n * H (8 heads, one token) are
// padding: computed as a copy of the last row, never written; with n = 0 (a flagged sequence
// without a row of its own) every row is, as a copy of row 0. Causal among the tokens of a
// sequence: token i of n sees the first len - n + 1 + i keys (key_end).
struct QueryRows {
  static constexpr int kRows = kGroupRows;
  int64_t q_row0;  // the sequence's first token row
  int base, nrows, heads, key_base;
  int64_t part0;   // the block's first row of part_o / part_ml
  MLAGEN_DEVICE int row(int j) const { return max(min(base + j, nrows - 1), 0); }
  MLAGEN_DEVICE bool owns(int j) const { return base + j < nrows; }
  MLAGEN_DEVICE int64_t token(int j) const { return q_row0 + row(j) / heads; }
  MLAGEN_DEVICE int head(int j) const { return row(j) % heads; }
  MLAGEN_DEVICE int key_end(int j) const { return key_base + row(j) / heads; }
  MLAGEN_DEVICE int64_t part(int j) const { return part0 + j; }
};
// A block's place in the grid: x = split * row_groups + group (a sequence's row groups are
// neighbours, so they stream the same KV tiles at about the same time: L2 serves all but the
// first), y = sequence.
struct BlockCoord {
  int b, split, group;
};

// A generated specialization: every sequence has kKvLen KV rows and kQLen query tokens of
// kNumHeads heads; KV rows contiguous (kPage 0) or in pages of kPage rows.
template <int kBatch, int kKvLen, int kSplits, int kPage_ = 0, int kNumHeads = 16, int kQLen = 1>
struct StaticShape {
  static constexpr bool kGeneric = false;
  static constexpr int kPage = kPage_;
  static constexpr int kStaticSplits = kSplits;  // 0: chosen at run time (DynamicShape)
  static constexpr int kGroups = (kNumHeads * kQLen + kGroupRows - 1) / kGroupRows;
  // whether a row can have seen no key after a tile of its split (causal rows: q_len > 1); one
  // query token sees every key of every tile, so its running max is finite after the first
  static constexpr bool kRowsEndEarly = kQLen > 1;
  MLAGEN_DEVICE static int splits(const Params&) { return kSplits; }
  MLAGEN_DEVICE static int heads(const Params&) { return kNumHeads; }
  MLAGEN_DEVICE static int q_len(const Params&) { return kQLen; }
  MLAGEN_DEVICE static int row_groups(const Params&) { return kGroups; }
  MLAGEN_DEVICE static QueryTokens query(const Params& p, int b) { return query_tokens<true>(p, b, kQLen); }
  MLAGEN_DEVICE static Sequence sequence(const Params& p, int b) { return read_sequence<kKvLen, kPage>(p, b, kQLen); }
};

// The generic kernel: lengths from kv_indptr (or the page lists), any batch, splits chosen by
// the runtime, contiguous or paged rows with the page size read at run time.
struct DynamicShape {
  static constexpr bool kGeneric = true;
  static constexpr int kPage = -1;  // kv_rows.cuh kPageRuntime
  static constexpr int kStaticSplits = 0;
  static constexpr bool kRowsEndEarly = true;
  MLAGEN_DEVICE static int splits(const Params& p) { return p.splits; }
  MLAGEN_DEVICE static int heads(const Params& p) { return p.num_heads; }
  MLAGEN_DEVICE static int q_len(const Params& p) { return p.q_len; }
  MLAGEN_DEVICE static int row_groups(const Params& p) { return p.row_groups; }
  MLAGEN_DEVICE static QueryTokens query(const Params& p, int b) { return query_tokens<false>(p, b, p.q_len); }
  MLAGEN_DEVICE static Sequence sequence(const Params& p, int b) { return read_sequence<0, kPage>(p, b, p.q_len); }
};

// The block's coordinates, and its query rows (of sequence seq, whose tokens the caller read).
// kRows: the rows a block owns, 16 (one row group; every body but the rows one) or a multiple:
// then a block is kRows / 16 neighbouring row groups (group = its first / (kRows / 16)), and
// its rows' partials sit where the row groups' would (the combine is the same).
template <class Shape, int kRows = kGroupRows>
MLAGEN_DEVICE BlockCoord block_coord(const Params& p) {
  const int blocks = Shape::row_groups(p) / (kRows / kGroupRows);  // a split's blocks a sequence
  return BlockCoord{static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x) / blocks, static_cast<int>(blockIdx.x) % blocks};
}
template <class Shape, int kRows = kGroupRows>
MLAGEN_DEVICE QueryRows query_rows(const Params& p, const BlockCoord& c, int64_t q_row0, int q_n, int kv_len) {
  const int heads = Shape::heads(p), groups = Shape::row_groups(p);
  const int64_t slot = static_cast<int64_t>(c.b) * Shape::splits(p) + c.split;
  return QueryRows{q_row0, kRows * c.group, q_n * heads, heads, kv_len - q_n + 1,
                   (slot * groups + c.group * (kRows / kGroupRows)) * kGroupRows};
}
template <class Shape, int kRows = kGroupRows>
MLAGEN_DEVICE QueryRows query_rows(const Params& p, const BlockCoord& c, const Sequence& seq) {
  return query_rows<Shape, kRows>(p, c, seq.q_row, seq.q_len, seq.len);
}

}  // namespace mlagen::device
