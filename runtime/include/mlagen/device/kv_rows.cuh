// Where a sequence's KV rows live: the one policy every body's tile loader asks for the address
// of a token's row. Vendor-neutral.
//
//   kPage = 0             contiguous rows: token t of the sequence is row kv_begin + t.
//   kPage = P > 0         pages of P rows (a power of two, compile time): token t is row
//                         pages[t / P] * P + t % P.
//   kPage = kPageRuntime  the generic kernel: contiguous when Params::page_table is null, else
//                         pages of 2^page_shift rows read at run time.
//
// A page id outside [0, num_pages) is never dereferenced: the row becomes row 0 of the cache
// and the caller's `bad` is set (the sequence's output is then NaN and the error word says
// MLAGEN_DEVERR_PAGE_TABLE). Tiles start at multiples of their size within a sequence, so a
// tile of n rows (n a power of two) is one run of rows back to back when the page holds at
// least n rows: then a body keeps its contiguous fast path with the tile's first row as base.
// mxfp4 scale rows are indexed by the same physical row.
#pragma once
#include "mlagen/device/mla_common.cuh"

namespace mlagen::device {

constexpr int kPageRuntime = -1;

constexpr int log2_exact(int v) { return v <= 1 ? 0 : 1 + log2_exact(v / 2); }

template <int kPage>
struct KvRows {
  static_assert(kPage == 0 || kPage == kPageRuntime || (kPage > 0 && kPage <= 256 && (kPage & (kPage - 1)) == 0),
                "page size: a power of two 1..256, 0 (contiguous) or kPageRuntime");
  static constexpr int kShift = kPage > 0 ? log2_exact(kPage) : 0;
  const uint8_t* kv;
  int64_t stride;         // bytes between rows
  int64_t first;          // contiguous: the sequence's first row
  const int32_t* pages;   // paged: the sequence's page list; null = contiguous (kPageRuntime)
  uint32_t num_pages;
  int shift;              // log2 page size

  MLAGEN_DEVICE static KvRows of(const Params& p, const Sequence& s) {
    return KvRows{p.kv, p.kv_stride_bytes, s.kv_begin, kPage == 0 ? nullptr : s.pages,
                  static_cast<uint32_t>(p.num_pages > 0xffffffffll ? 0xffffffffll : p.num_pages),
                  kPage > 0 ? kShift : p.page_shift};
  }
  MLAGEN_DEVICE bool paged() const {
    if constexpr (kPage == 0) return false;
    if constexpr (kPage > 0) return true;
    return pages != nullptr;
  }
  // Whether a tile of n rows (n a power of two, starting at a multiple of n) is rows back to back.
  template <int n>
  MLAGEN_DEVICE bool tile_contiguous() const {
    if constexpr (kPage == 0 || kPage >= n) return true;
    if constexpr (kPage > 0) return false;
    return !paged() || (1 << shift) >= n;
  }
  // Physical row of token t held by page id pg (see above for a bad page id).
  MLAGEN_DEVICE int64_t page_row(int32_t pg, int t, bool& bad) const {
    const bool ok = static_cast<uint32_t>(pg) < num_pages;
    bad |= !ok;
    return (static_cast<int64_t>(ok ? pg : 0) << shift) + (t & ((1 << shift) - 1));
  }
  // Physical row of token t.
  MLAGEN_DEVICE int64_t row(int t, bool& bad) const { return paged() ? page_row(pages[t >> shift], t, bad) : first + t; }
  MLAGEN_DEVICE const uint8_t* ptr(int t, bool& bad) const { return kv + row(t, bad) * stride; }
  // After the tile loop, every thread of the block: whether any of them met a bad page id (and
  // the error word says so). Contiguous rows have no page ids: false at once, no barrier (the
  // choice is the same for the whole block).
  MLAGEN_DEVICE bool block_any_bad(const Params& p, bool bad) const {
    if (!paged()) return false;
    if (bad) flag_error(p, kDevErrPageTable);
    return __syncthreads_or(bad ? 1 : 0) != 0;
  }
};

// The page ids of a tile's rows held by each warp (the bf16 warpgroup body's paged tiles), row
// lane + W j in lane `lane` (W lanes a warp), loaded one tile ahead of the copies that need them
// and read by any lane with a shuffle. The copies' asm statements clobber memory, so a page-id
// load per copy would wait out its latency between two copies; this way a tile's ids are one load
// a lane, issued a tile early. Every lane of the warp must call row() together (a shuffle).
// (NVIDIA; the AMD bodies take rows.ptr per row for now.)
#if defined(MLAGEN_NVIDIA)
template <int kBlockN>
struct TileIds {
  static constexpr int W = MLAGEN_WARP_SIZE;
  static constexpr int kPer = (kBlockN + W - 1) / W;
  int32_t id[kPer];
  template <class Rows>
  MLAGEN_DEVICE void load(const Rows& rows, int tok0, int tok_end, int lane) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int t = tok0 + lane + W * j;
      id[j] = t < tok_end ? rows.pages[t >> rows.shift] : 0;
    }
  }
  // Physical row of tile row r (0 <= r < kBlockN) of the tile starting at token tok0.
  template <class Rows>
  MLAGEN_DEVICE int64_t row(const Rows& rows, int tok0, int r, bool& bad) const {
    int32_t pg = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int32_t v = __shfl(id[j], r % W);
      if (r / W == j) pg = v;
    }
    return rows.page_row(pg, tok0 + r, bad);
  }
};

// The page ids of a tile's rows staged in shared memory (the fp8 warpgroup body): slot
// tile % kSlots holds the tile's kBlockN ids, entry r that of row r (0 past the sequence's
// end). They go out by cp.async with the copies of an earlier tile, in its commit group, so the
// tile loop's own wait has seen them land before the copies that need them are issued: no
// register holds an id load in flight across the loop (a register ring two tiles deep compiled
// to a move that waited on the load right after the copies: +9.9% at page size 1, 256x8192,
// against +6.0% staged in shared memory), and a row's id
// is one shared load, no shuffle. Every thread calls stage(); threads tid < kBlockN copy.
template <int kBlockN, int kSlots>
struct StagedTileIds {
  static constexpr int kSlotBytes = kBlockN * 4;
  static constexpr int kBytes = kSlots * kSlotBytes;
  uint32_t base;  // shared address of slot 0
  MLAGEN_DEVICE uint32_t slot(int tile) const { return base + static_cast<uint32_t>(tile % kSlots) * kSlotBytes; }
  template <int kThreads, class Rows>
  MLAGEN_DEVICE void stage(const Rows& rows, int tile, int tok0, int tok_end, int tid) const {
#pragma unroll
    for (int i = 0; i < (kBlockN + kThreads - 1) / kThreads; ++i) {
      const int e = tid + i * kThreads, t = tok0 + e;
      if (kBlockN % kThreads != 0 && e >= kBlockN) break;
      const bool ok = t < tok_end;
      sm90::cp_async_4(slot(tile) + 4 * e, rows.pages + (ok ? t >> rows.shift : 0), ok);
    }
  }
  // What stage() and its wait do, for the block's first kTiles tiles (tile j at token tok0 + j
  // kBlockN), by plain loads and shared stores, with between() called after the loads and before
  // the stores: loads issued there share the ids' round trip (behind a cp.async wait they would
  // not: ptxas does not schedule loads above it). Visible after the caller's barrier.
  template <int kTiles, int kThreads, class Rows, class Between>
  MLAGEN_DEVICE void stage_first(const Rows& rows, int tok0, int tok_end, int tid, Between&& between) const {
    constexpr int kPer = (kBlockN + kThreads - 1) / kThreads;
    uint32_t v[kTiles][kPer];
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = tid + i * kThreads, t = tok0 + j * kBlockN + e;
        v[j][i] = (kBlockN % kThreads == 0 || e < kBlockN) && t < tok_end ? static_cast<uint32_t>(rows.pages[t >> rows.shift]) : 0u;
      }
    between();
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = tid + i * kThreads;
        if (kBlockN % kThreads == 0 || e < kBlockN) sm90::sts32(slot(j) + 4 * e, v[j][i]);
      }
  }
  // Physical row of row r of tile `tile` (starting at token tok0), once its stage() has landed.
  template <class Rows>
  MLAGEN_DEVICE int64_t row(const Rows& rows, int tile, int tok0, int r, bool& bad) const {
    const int32_t pg = static_cast<int32_t>(sm90::lds32(slot(tile) + 4 * r));
    return rows.page_row(pg, tok0 + r, bad);
  }
};
#endif

}  // namespace mlagen::device
