// mlagen runtime: input validation, kernel selection over the generated registry, the C ABI.
// Host-only C++ linked against no GPU runtime: the loader (gpu.cpp) is reached only on the
// launch / device paths, so mlagen_select() and the validation messages work without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "gpu.h"
#include "launch.h"
#include "mlagen/internal.h"

#include "facts.inc"     // generated: the problem facts (codegen/facts.py)
#include "registry.inc"  // generated: kKernelTable, MLAGEN_FINGERPRINT

#ifndef MLAGEN_BUILD_ARCH
#error "MLAGEN_BUILD_ARCH must name the arch this library is built for (CMake sets it)"
#endif

namespace mlagen {

namespace {
thread_local char g_error[1024] = "";

const char* dtype_name(int32_t d) {
  static const char* const kNames[] = MLAGEN_DTYPE_NAMES;
  return d >= 1 && d <= MLAGEN_NUM_DTYPES ? kNames[d] : kNames[0];
}

size_t num_entries() { return sizeof(kKernelTable) / sizeof(kKernelTable[0]) - 1; }  // minus sentinel

bool aligned(const void* ptr, size_t a) { return reinterpret_cast<uintptr_t>(ptr) % a == 0; }

mlagen_status validate(const mlagen_problem* p) {
  if (!p) return fail(MLAGEN_ERR_INVALID, "problem: NULL pointer");
  if (p->abi_version != MLAGEN_ABI_VERSION)
    return fail(MLAGEN_ERR_INVALID, "abi_version=%d: expected %d (header and library differ)", p->abi_version,
                MLAGEN_ABI_VERSION);
#define MLAGEN_EXPECT(cond, ...) \
  do {                           \
    if (!(cond)) return fail(MLAGEN_ERR_INVALID, __VA_ARGS__); \
  } while (0)
  MLAGEN_EXPECT(p->batch >= 1 && p->batch <= MLAGEN_MAX_BATCH, "batch=%d: expected 1..%d (a grid dimension)", p->batch,
                MLAGEN_MAX_BATCH);
  MLAGEN_EXPECT(p->device >= -1, "device=%d: expected a device index, or -1 for the current device", p->device);
  static constexpr int kNumHeads[] = {MLAGEN_NUM_HEADS_LIST};
  bool heads_taken = false;
  for (int h : kNumHeads) heads_taken |= p->num_heads == h;
  MLAGEN_EXPECT(heads_taken, "num_heads=%d: expected " MLAGEN_NUM_HEADS_TEXT " (DeepSeek MLA's 128 heads over TP 16..1)",
                p->num_heads);
  MLAGEN_EXPECT(p->num_kv_heads == MLAGEN_NUM_KV_HEADS, "num_kv_heads=%d: expected %d (MQA over the shared latent)",
                p->num_kv_heads, MLAGEN_NUM_KV_HEADS);
  MLAGEN_EXPECT(p->q_len >= 1 && p->q_len <= MLAGEN_MAX_Q_LEN,
                "q_len=%d: expected 1..%d (query tokens a sequence: decode, or MTP / speculative verification)", p->q_len,
                MLAGEN_MAX_Q_LEN);
  MLAGEN_EXPECT(p->qk_dim == MLAGEN_QK_DIM, "qk_dim=%d: expected %d (%d latent + %d rope)", p->qk_dim, MLAGEN_QK_DIM,
                MLAGEN_V_DIM, MLAGEN_QK_DIM - MLAGEN_V_DIM);
  MLAGEN_EXPECT(p->v_dim == MLAGEN_V_DIM, "v_dim=%d: expected %d", p->v_dim, MLAGEN_V_DIM);
  MLAGEN_EXPECT(p->total_q >= p->batch && p->total_q <= static_cast<int64_t>(p->batch) * p->q_len,
                "total_q=%lld: expected batch..batch*q_len = %d..%lld (q_len: the most query tokens a sequence; "
                "batch*q_len when every sequence has q_len)", (long long)p->total_q, p->batch,
                (long long)p->batch * p->q_len);
  MLAGEN_EXPECT(static_cast<int64_t>(p->batch) * row_groups(p->num_heads, p->q_len) <= 65536,
                "batch=%d: expected batch * ceil(num_heads*q_len/16) <= 65536 (blocks of 16 query rows; here %d a "
                "sequence)", p->batch, row_groups(p->num_heads, p->q_len));
  MLAGEN_EXPECT(p->total_kv >= 0 && p->total_kv < (int64_t{1} << 31),
                "total_kv=%lld: expected 0 <= total_kv < 2^31 (kv_indptr is int32)", (long long)p->total_kv);
  MLAGEN_EXPECT(p->kv_len >= 0, "kv_len=%d: expected >= 0 (0 = lengths differ, read from kv_indptr)", p->kv_len);
  const bool paged = p->page_size != 0;
  if (p->kv_len > 0 && !paged)
    MLAGEN_EXPECT(p->total_kv == static_cast<int64_t>(p->batch) * p->kv_len,
                  "total_kv=%lld: expected batch*kv_len = %lld for uniform kv_len=%d", (long long)p->total_kv,
                  (long long)p->batch * p->kv_len, p->kv_len);
  MLAGEN_EXPECT(std::isfinite(p->sm_scale) && p->sm_scale > 0.f, "sm_scale=%g: expected a finite value > 0",
                p->sm_scale);
  MLAGEN_EXPECT(p->splits >= 0 && p->splits <= MLAGEN_MAX_SPLITS, "splits=%d: expected 0 (auto) or 1..%d", p->splits,
                MLAGEN_MAX_SPLITS);
  MLAGEN_EXPECT(p->q_dtype == MLAGEN_DTYPE_BF16 || p->q_dtype == MLAGEN_DTYPE_FP8,
                "q_dtype=%d (%s): expected bf16 (%d) or fp8 (%d)", p->q_dtype, dtype_name(p->q_dtype),
                MLAGEN_DTYPE_BF16, MLAGEN_DTYPE_FP8);
  MLAGEN_EXPECT(mlagen_kv_format(p->kv_dtype), "kv_dtype=%d: expected " MLAGEN_KV_NAMES_TEXT, p->kv_dtype);
  MLAGEN_EXPECT(p->q, "q: NULL pointer");
  MLAGEN_EXPECT(p->kv || p->total_kv == 0, "kv: NULL pointer");
  MLAGEN_EXPECT(p->q_from_bf16 == 0 || p->q_from_bf16 == 1, "q_from_bf16=%d: expected 0 or 1", p->q_from_bf16);
  MLAGEN_EXPECT(!p->q_from_bf16 || p->q_dtype == MLAGEN_DTYPE_FP8,
                "q_from_bf16=1: expected q_dtype fp8 (%d), the precision the bf16 q is quantized to", MLAGEN_DTYPE_FP8);
  if (p->q_dtype == MLAGEN_DTYPE_FP8 && !p->q_from_bf16)
    MLAGEN_EXPECT(p->q_scale, "q_scale: NULL pointer (fp8 q: a device float32; or q_from_bf16=1 with a bf16 q)");
  if (p->q_from_bf16) MLAGEN_EXPECT(!p->q_scale, "q_scale: expected NULL with q_from_bf16=1 (the library finds it)");
  if (p->q_scale) MLAGEN_EXPECT(aligned(p->q_scale, 4), "q_scale: address %p not 4-byte aligned (a float32)", p->q_scale);
  MLAGEN_EXPECT(p->qo_indptr, "qo_indptr: NULL pointer");
  MLAGEN_EXPECT(p->out, "out: NULL pointer");
  MLAGEN_EXPECT(aligned(p->qo_indptr, 4), "qo_indptr: address %p not 4-byte aligned (int32)", p->qo_indptr);
  MLAGEN_EXPECT(aligned(p->kv_indptr, 4), "kv_indptr: address %p not 4-byte aligned (int32)", p->kv_indptr);
  if (!paged) {
    MLAGEN_EXPECT(p->kv_indptr, "kv_indptr: NULL pointer");
    MLAGEN_EXPECT(!p->page_table && !p->kv_lens && !p->page_indptr && !p->last_page_len,
                  "page_table / kv_lens / page_indptr / last_page_len: given with page_size=0 (contiguous rows); "
                  "expected NULL, or page_size = the cache's page size");
  } else {
    MLAGEN_EXPECT(p->page_size >= 1 && p->page_size <= MLAGEN_MAX_PAGE_SIZE && (p->page_size & (p->page_size - 1)) == 0,
                  "page_size=%d: expected a power of two 1..%d (or 0: contiguous rows)", p->page_size, MLAGEN_MAX_PAGE_SIZE);
    MLAGEN_EXPECT(p->page_table, "page_table: NULL pointer (page_size=%d: the block table or kv_indices)", p->page_size);
    MLAGEN_EXPECT(aligned(p->page_table, 4), "page_table: address %p not 4-byte aligned (int32)", p->page_table);
    MLAGEN_EXPECT(p->page_table_len >= 1 && p->page_table_len < (int64_t{1} << 31),
                  "page_table_len=%lld: expected 1 <= entries < 2^31", (long long)p->page_table_len);
    MLAGEN_EXPECT(p->total_kv % p->page_size == 0,
                  "total_kv=%lld: expected a multiple of page_size=%d (the cache's rows: num_pages * page_size)",
                  (long long)p->total_kv, p->page_size);
    if (p->page_indptr) {  // FlashInfer's form
      MLAGEN_EXPECT(aligned(p->page_indptr, 4), "page_indptr: address %p not 4-byte aligned (int32)", p->page_indptr);
      MLAGEN_EXPECT(p->last_page_len, "last_page_len: NULL pointer (the indices form: rows in each last page)");
      MLAGEN_EXPECT(aligned(p->last_page_len, 4), "last_page_len: address %p not 4-byte aligned (int32)", p->last_page_len);
      MLAGEN_EXPECT(!p->kv_lens, "kv_lens: given with page_indptr; expected NULL (the indices form's lengths are "
                                 "last_page_len and the page counts)");
    } else {  // block table
      MLAGEN_EXPECT(!p->last_page_len, "last_page_len: given without page_indptr; expected NULL for a block table");
      MLAGEN_EXPECT(p->kv_lens || p->kv_indptr, "kv_lens: NULL pointer (a block table needs kv_lens or kv_indptr)");
      MLAGEN_EXPECT(aligned(p->kv_lens, 4), "kv_lens: address %p not 4-byte aligned (int32)", p->kv_lens);
      MLAGEN_EXPECT(p->page_table_width >= 1, "page_table_width=%d: expected >= 1 (pages a sequence may use)",
                    p->page_table_width);
      MLAGEN_EXPECT(p->page_table_stride >= p->page_table_width,
                    "page_table_stride=%lld: expected >= page_table_width=%d", (long long)p->page_table_stride,
                    p->page_table_width);
      MLAGEN_EXPECT(p->page_table_len >= (p->batch - 1) * p->page_table_stride + p->page_table_width,
                    "page_table_len=%lld: expected >= (batch-1)*page_table_stride + page_table_width = %lld",
                    (long long)p->page_table_len,
                    (long long)((p->batch - 1) * p->page_table_stride + p->page_table_width));
      if (p->kv_len > 0)
        MLAGEN_EXPECT(static_cast<int64_t>(p->page_table_width) * p->page_size >= p->kv_len,
                      "page_table_width=%d: expected >= %d pages (kv_len=%d in pages of %d)", p->page_table_width,
                      (p->kv_len + p->page_size - 1) / p->page_size, p->kv_len, p->page_size);
    }
  }
  if (p->lse) {
    MLAGEN_EXPECT(aligned(p->lse, 4), "lse: address %p not 4-byte aligned (float32)", p->lse);
    MLAGEN_EXPECT(p->lse_stride_token >= p->num_heads, "lse_stride_token=%lld: expected >= num_heads=%d",
                  (long long)p->lse_stride_token, p->num_heads);
  }
  // Layout: the kernels read q in 4-byte (fp8) / 8-byte (bf16) pieces, kv rows and out in
  // 16-byte pieces.
  const int q_align = p->q_dtype == MLAGEN_DTYPE_FP8 && !p->q_from_bf16 ? 4 : 8;
  MLAGEN_EXPECT(aligned(p->q, q_align), "q: address %p not %d-byte aligned", p->q, q_align);
  if (p->q_from_bf16) {  // the fp8-q pre-pass reads the bf16 q in 16-byte pieces
    MLAGEN_EXPECT(aligned(p->q, 16), "q: address %p not 16-byte aligned (q_from_bf16=1)", p->q);
    MLAGEN_EXPECT(p->q_stride_head % 8 == 0 && p->q_stride_token % 8 == 0,
                  "q_stride_head=%lld q_stride_token=%lld: expected multiples of 8 elements (q_from_bf16=1)",
                  (long long)p->q_stride_head, (long long)p->q_stride_token);
  }
  MLAGEN_EXPECT(p->q_stride_head >= 1 && p->q_stride_head % 4 == 0,
                "q_stride_head=%lld: expected a positive multiple of 4 elements", (long long)p->q_stride_head);
  MLAGEN_EXPECT(p->q_stride_token >= 1 && p->q_stride_token % 4 == 0,
                "q_stride_token=%lld: expected a positive multiple of 4 elements", (long long)p->q_stride_token);
  MLAGEN_EXPECT(aligned(p->kv, 16), "kv: address %p not 16-byte aligned", p->kv);
  // kernels step 64 rows of a tile with 32-bit offsets (mla_decode_sm90_wgmma.cuh)
  MLAGEN_EXPECT(p->kv_stride_token >= 1 && p->kv_stride_token <= (int64_t{1} << 24), "kv_stride_token=%lld: expected at most %lld elements",
                (long long)p->kv_stride_token, (long long)(int64_t{1} << 24));
  MLAGEN_EXPECT(aligned(p->out, 16), "out: address %p not 16-byte aligned", p->out);
  MLAGEN_EXPECT(p->out_stride_head >= p->v_dim && p->out_stride_head % 8 == 0,
                "out_stride_head=%lld: expected a multiple of 8 that is >= %d", (long long)p->out_stride_head, MLAGEN_V_DIM);
  MLAGEN_EXPECT(p->out_stride_token % 8 == 0 &&
                    (p->out_stride_token >= p->out_stride_head * p->num_heads ||
                     (p->out_stride_token >= p->v_dim && p->out_stride_head >= p->out_stride_token * p->total_q)),
                "out_stride_token=%lld: expected a multiple of 8 that keeps rows apart (>= num_heads*out_stride_head = %lld)",
                (long long)p->out_stride_token, (long long)(p->out_stride_head * p->num_heads));
#undef MLAGEN_EXPECT
  return MLAGEN_OK;
}

// What the chosen kernel's registry row says the KV must look like: the row's bytes and the
// stride unit, and its scale (generated from the spec: codegen/spec.py row_bytes, scale_kind).
mlagen_status check_kv(const mlagen_problem* p, const KernelEntry& e) {
#define MLAGEN_EXPECT(cond, ...) \
  do {                           \
    if (!(cond)) return fail(MLAGEN_ERR_INVALID, __VA_ARGS__); \
  } while (0)
  const int64_t row = e.row_bytes / e.stride_unit, unit = 16 / e.stride_unit;  // in stride units; 16-byte pieces
  MLAGEN_EXPECT(p->kv_stride_token >= row && p->kv_stride_token % unit == 0,
                "kv_stride_token=%lld: expected a multiple of %lld that is >= %lld (%s: one row per token, dims "
                "contiguous)", (long long)p->kv_stride_token, (long long)unit, (long long)row, dtype_name(p->kv_dtype));
  const char* const name = dtype_name(p->kv_dtype);
  if (e.scale_kind == 1) {
    MLAGEN_EXPECT(p->kv_scale, "kv_scale: NULL pointer (%s KV: a device float32)", name);
    MLAGEN_EXPECT(aligned(p->kv_scale, 4), "kv_scale: address %p not 4-byte aligned (a float32)", p->kv_scale);
  }
  if (e.scale_kind == 2) {  // E8M0 rows: one byte a block of dims, every token
    const int block = mlagen_kv_format(p->kv_dtype)->scale_block, blocks = MLAGEN_QK_DIM / block;
    MLAGEN_EXPECT(p->kv_scale, "kv_scale: NULL pointer (%s KV: the E8M0 scale rows)", name);
    MLAGEN_EXPECT(aligned(p->kv_scale, MLAGEN_SCALE_ROWS_ALIGN), "kv_scale: address %p not %d-byte aligned (%s scale rows)",
                  p->kv_scale, MLAGEN_SCALE_ROWS_ALIGN, name);
    MLAGEN_EXPECT(p->kv_scale_stride >= blocks && p->kv_scale_stride <= MLAGEN_SCALE_ROWS_MAX_STRIDE,
                  "kv_scale_stride=%lld: expected %d..%d bytes between two tokens' %s scale rows (%d blocks of %d "
                  "dims; more when padded)", (long long)p->kv_scale_stride, blocks, MLAGEN_SCALE_ROWS_MAX_STRIDE, name,
                  blocks, block);
  }
#undef MLAGEN_EXPECT
  return MLAGEN_OK;
}

// A rows body (role 3) takes the problem when its query rows fill the body's blocks and its KV tiles
// are rows back to back (contiguous, or pages of at least a tile: 64 rows). (Smaller pages would take
// the rows body's row-by-row copy every tile, which nothing has measured: they keep the 16-row generic
// kernel, whose page ids are staged in shared memory a ring ahead and whose first ids load beside q:
// docs/perf.md, paged KV.)
bool rows_body_takes(const KernelEntry& e, int32_t rows, int32_t page_size) {
  return e.role == 3 && rows % e.block_m == 0 && (page_size == 0 || page_size >= e.block_n);
}

// The generic kernel of an unmodelled dtype pair (find_modelled serves the modelled ones): the rows
// body with the largest block that takes the problem, else role 1. Small problems (work = batch x
// tokens a sequence x 16-row groups under kRowsBodyMinWork, codegen/spec.py ROWS_BODY_MIN_WORK) keep
// the 16-row kernel: faster there.
const KernelEntry* find_generic(int32_t q_dtype, int32_t kv_dtype, int32_t rows, int32_t page_size, int64_t work) {
  const KernelEntry* rows_body = nullptr;
  const KernelEntry* found = nullptr;
  for (size_t i = 0; i < num_entries(); ++i) {
    const KernelEntry& e = kKernelTable[i];
    if (e.q_dtype != q_dtype || e.kv_dtype != kv_dtype || std::strcmp(e.arch, MLAGEN_BUILD_ARCH)) continue;
    if (rows_body_takes(e, rows, page_size) && work >= kRowsBodyMinWork && (!rows_body || e.block_m > rows_body->block_m))
      rows_body = &e;
    if (e.role == 1 && !found) found = &e;
  }
  return rows_body ? rows_body : found;
}

// The tokens a sequence, as the plan sees them: kv_len when uniform; else, for a block table, at most
// its width in pages (a cache is larger than its sequences), else the rows' average.
int64_t seq_tokens(const mlagen_problem* p) {
  int64_t avg = p->kv_len > 0 ? p->kv_len : p->total_kv / p->batch;
  if (p->kv_len <= 0 && p->page_size > 0 && p->page_table && !p->page_indptr)
    avg = std::min<int64_t>(avg, static_cast<int64_t>(p->page_table_width) * p->page_size);
  return avg;
}

// A generic kernel's blocks for one split of every sequence (a sequence's row groups are blocks too:
// 128 heads are 8 blocks of 16 rows, or 2 of the 64-row body, a split).
int64_t split_blocks(const mlagen_problem* p, const KernelEntry& e) {
  return static_cast<int64_t>(p->batch) * row_groups(p->num_heads, p->q_len) / (e.block_m / 16);
}

// Its walk at s splits of avg tokens a sequence: waves of its resident blocks (e.target_blocks,
// codegen/spec.py KernelSpec.target_blocks) and 64-token tiles a split.
struct SplitWalk {
  int64_t waves, tiles;
};
SplitWalk split_walk(const mlagen_problem* p, const KernelEntry& e, int64_t avg, int s) {
  const int64_t per_split = static_cast<int64_t>(s) * kSplitMinTokens;
  return {(split_blocks(p, e) * s + e.target_blocks - 1) / e.target_blocks, (avg + per_split - 1) / per_split};
}

// The split count of least cost(s) over 1, 2, 4 .. kSplitMax with at least kSplitMinTokens a split
// (the first of equal costs), or the problem's own; *least its cost.
template <class Cost>
int least_splits(const mlagen_problem* p, int64_t avg, Cost cost, double* least) {
  int best = p->splits > 0 ? p->splits : 1;
  double best_cost = cost(best);
  for (int s = 2; p->splits <= 0 && s <= kSplitMax && avg / s >= kSplitMinTokens; s *= 2) {
    const double c = cost(s);
    if (c < best_cost - 1e-9) best = s, best_cost = c;
  }
  if (least) *least = best_cost;
  return best;
}

// The modelled split count of the generic kernel e (codegen/spec.py GENERIC_COSTS; e.tile_us > 0):
// waves x (a block's fixed cost + tiles a split x a tile's) + a split's fixed cost and its partials,
// in us; *us the least.
int modelled_splits(const mlagen_problem* p, const KernelEntry& e, double* us) {
  const int64_t avg = seq_tokens(p);
  const double rows = static_cast<double>(p->batch) * p->num_heads * p->q_len;
  return least_splits(p, avg, [&](int s) {
    const SplitWalk w = split_walk(p, e, avg, s);
    return static_cast<double>(w.waves) * (e.block_us + static_cast<double>(w.tiles) * e.tile_us) +
           (s > 1 ? e.split_us + s * rows * e.split_row_us : 0.0);
  }, us);
}

// Where the dtypes' generic kernels are modelled: the one of least modelled time that takes the
// problem (the 16-row kernel, or a rows body that rows_body_takes), with its splits; else nullptr.
const KernelEntry* find_modelled(const mlagen_problem* p, int* splits) {
  const int32_t rows = p->num_heads * p->q_len;
  const KernelEntry* best = nullptr;
  double best_us = 0.0;
  for (size_t i = 0; i < num_entries(); ++i) {
    const KernelEntry& e = kKernelTable[i];
    if (e.tile_us <= 0.0 || e.q_dtype != p->q_dtype || e.kv_dtype != p->kv_dtype || std::strcmp(e.arch, MLAGEN_BUILD_ARCH))
      continue;
    if (e.role != 1 && !rows_body_takes(e, rows, p->page_size)) continue;
    double us = 0.0;
    const int s = modelled_splits(p, e, &us);
    if (!best || us < best_us - 1e-9) best = &e, best_us = us, *splits = s;
  }
  return best;
}

// Splits for a kernel that takes them at run time: a modelled one's (modelled_splits); else the
// generator's rule (catalog.heuristic_splits), from the registry's kSplitRules for this build's arch:
// with a partial cost, the least of waves x 64-token tiles a split + splits x query rows x cost;
// without, round half up (at least 256 tokens a split, 64 splits at most).
int generic_splits(const mlagen_problem* p, const KernelEntry& e) {
  if (p->splits > 0) return p->splits;
  if (e.tile_us > 0.0) return modelled_splits(p, e, nullptr);
  const int64_t avg = seq_tokens(p);
  double cost = 0.0;
  for (const SplitRule& r : kSplitRules)
    if (!std::strcmp(r.arch, MLAGEN_BUILD_ARCH)) cost = r.partial_cost;
  if (cost <= 0.0) {
    int s = static_cast<int>(static_cast<double>(e.target_blocks) / split_blocks(p, e) + 0.5);
    s = std::max(1, std::min<int>(s, static_cast<int>(std::max<int64_t>(1, avg / 256))));
    return std::min(s, 64);
  }
  const double rows = static_cast<double>(p->batch) * p->num_heads * p->q_len;
  return least_splits(p, avg, [&](int s) {
    const SplitWalk w = split_walk(p, e, avg, s);
    return static_cast<double>(w.waves * w.tiles) + (s > 1 ? s * rows * cost : 0.0);
  }, nullptr);
}

// Exact key, else the generic kernel of the dtypes; never a kernel of another key.
mlagen_status choose_entry(const mlagen_problem* p, const KernelEntry** entry, int* splits) {
  mlagen_status st = validate(p);
  if (st != MLAGEN_OK) return st;
  if (p->kernel_name) {  // an explicit kernel: it must be able to serve this problem
    for (size_t i = 0; i < num_entries(); ++i) {
      const KernelEntry& e = kKernelTable[i];
      if (std::strcmp(e.name, p->kernel_name)) continue;
      if (e.q_dtype != p->q_dtype || e.kv_dtype != p->kv_dtype)
        return fail(MLAGEN_ERR_INVALID, "kernel_name=%s: takes q_dtype=%s kv_dtype=%s, the problem has %s/%s", e.name,
                    dtype_name(e.q_dtype), dtype_name(e.kv_dtype), dtype_name(p->q_dtype), dtype_name(p->kv_dtype));
      if (e.role == 0 && (e.page_size != p->page_size || (p->page_indptr && e.page_size)))
        return fail(MLAGEN_ERR_INVALID, "kernel_name=%s: reads %s, the problem has page_size=%d%s", e.name,
                    e.page_size ? "pages from a block table" : "contiguous rows", p->page_size,
                    p->page_indptr ? " (indices form)" : "");
      if (e.role == 0 && (e.batch != p->batch || e.kv_len != p->kv_len))
        return fail(MLAGEN_ERR_INVALID, "kernel_name=%s: serves batch=%d kv_len=%d only, the problem has batch=%d kv_len=%d",
                    e.name, e.batch, e.kv_len, p->batch, p->kv_len);
      if (e.role == 3 && (p->num_heads * p->q_len) % e.block_m)
        return fail(MLAGEN_ERR_INVALID, "kernel_name=%s: takes num_heads x q_len a multiple of %d, the problem has %d x %d",
                    e.name, e.block_m, p->num_heads, p->q_len);
      if (e.role == 0 && p->splits != 0 && p->splits != e.splits)
        return fail(MLAGEN_ERR_INVALID, "splits=%d: kernel_name=%s runs %d splits (fixed at generation); expected 0 or %d",
                    p->splits, e.name, e.splits, e.splits);
      *entry = &e;
      *splits = e.role == 0 ? e.splits : generic_splits(p, e);
      return MLAGEN_OK;
    }
    return fail(MLAGEN_ERR_UNSUPPORTED, "kernel_name=%s: no such kernel in this build (%d kernels; mlagen_kernel_at lists them)",
                p->kernel_name, static_cast<int>(num_entries()));
  }
  if (!p->force_generic && p->kv_len > 0) {
    for (size_t i = 0; i < num_entries(); ++i) {
      const KernelEntry& e = kKernelTable[i];
      if (e.role == 0 && e.batch == p->batch && e.kv_len == p->kv_len && e.q_dtype == p->q_dtype && e.kv_dtype == p->kv_dtype &&
          e.num_heads == p->num_heads && e.q_len == p->q_len && p->total_q == static_cast<int64_t>(p->batch) * p->q_len &&
          e.page_size == p->page_size &&
          !(p->page_indptr && e.page_size) && !std::strcmp(e.arch, MLAGEN_BUILD_ARCH) &&
          (p->splits == 0 || p->splits == e.splits)) {
        *entry = &e;
        *splits = e.splits;
        return MLAGEN_OK;
      }
    }
  }
  if (const KernelEntry* m = find_modelled(p, splits)) {
    *entry = m;
    return MLAGEN_OK;
  }
  const KernelEntry* g = find_generic(p->q_dtype, p->kv_dtype, p->num_heads * p->q_len, p->page_size,
                                      static_cast<int64_t>(p->batch) * seq_tokens(p) * row_groups(p->num_heads, p->q_len));
  if (!g)
    return fail(MLAGEN_ERR_UNSUPPORTED,
                "no kernel for key {arch=%s, batch=%d, kv_len=%d, q_dtype=%s, kv_dtype=%s, num_heads=%d, q_len=%d} "
                "and no generic kernel for q_dtype=%s kv_dtype=%s in this build (mlagen_num_kernels() lists what is in)",
                MLAGEN_BUILD_ARCH, p->batch, p->kv_len, dtype_name(p->q_dtype), dtype_name(p->kv_dtype),
                p->num_heads, p->q_len, dtype_name(p->q_dtype), dtype_name(p->kv_dtype));
  *entry = g;
  *splits = generic_splits(p, *g);
  return MLAGEN_OK;
}

mlagen_status choose(const mlagen_problem* p, const KernelEntry** entry, int* splits) {
  const mlagen_status st = choose_entry(p, entry, splits);
  return st != MLAGEN_OK ? st : check_kv(p, **entry);
}

void fill_info(const KernelEntry& e, int splits, mlagen_kernel_info* info) {
  if (!info) return;
  info->name = e.name;
  info->generic = e.batch == 0;
  info->splits = splits;
  info->block_n = e.block_n;
  info->stages = e.stages;
  info->batch = e.batch;
  info->kv_len = e.kv_len;
  info->q_dtype = e.q_dtype;
  info->kv_dtype = e.kv_dtype;
  info->role = e.role;
  info->page_size = e.page_size;
  info->num_heads = e.num_heads;
  info->q_len = e.q_len;
}
}  // namespace

mlagen_status fail(mlagen_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_error, sizeof(g_error), fmt, ap);
  va_end(ap);
  return status;
}

}  // namespace mlagen

// A validated problem with its kernel (mlagen.h).
struct mlagen_plan_s {
  mlagen_problem problem;
  const mlagen::KernelEntry* entry;
  const mlagen::CodeObject* object;  // the entry's code object
  int splits;
  size_t workspace_bytes;
  size_t q_align, kv_scale_align;
};

namespace mlagen {
namespace {
mlagen_status make_plan(const mlagen_problem* p, mlagen_plan_s* plan) {
  const KernelEntry* e = nullptr;
  int splits = 0;
  const mlagen_status st = choose(p, &e, &splits);
  if (st != MLAGEN_OK) return st;
  plan->object = find_code_object(e->name);
  if (!plan->object)
    return fail(MLAGEN_ERR_UNSUPPORTED, "kernel %s: in the registry but no code object of it in this build", e->name);
  plan->problem = *p;
  plan->problem.kernel_name = nullptr;  // not kept: the caller's string may go
  plan->entry = e;
  plan->splits = splits;
  plan->workspace_bytes = workspace_layout(p, splits).bytes;
  plan->q_align = p->q_from_bf16 ? 16 : (p->q_dtype == MLAGEN_DTYPE_FP8 ? 4 : 8);
  plan->kv_scale_align = e->scale_kind == 2 ? MLAGEN_SCALE_ROWS_ALIGN : 4;
  return MLAGEN_OK;
}
}  // namespace
}  // namespace mlagen

using namespace mlagen;

extern "C" {

const char* mlagen_last_error(void) { return g_error; }

const char* mlagen_status_name(mlagen_status s) {
  switch (s) {
    case MLAGEN_OK: return "MLAGEN_OK";
    case MLAGEN_ERR_INVALID: return "MLAGEN_ERR_INVALID";
    case MLAGEN_ERR_UNSUPPORTED: return "MLAGEN_ERR_UNSUPPORTED";
    case MLAGEN_ERR_WORKSPACE: return "MLAGEN_ERR_WORKSPACE";
    case MLAGEN_ERR_DEVICE: return "MLAGEN_ERR_DEVICE";
    case MLAGEN_ERR_INPUT_DATA: return "MLAGEN_ERR_INPUT_DATA";
  }
  return "MLAGEN_ERR_UNKNOWN";
}

mlagen_status mlagen_select(const mlagen_problem* p, mlagen_kernel_info* chosen) {
  const KernelEntry* e = nullptr;
  int splits = 0;
  const mlagen_status st = choose(p, &e, &splits);
  if (st == MLAGEN_OK) fill_info(*e, splits, chosen);
  return st;
}

size_t mlagen_workspace_bytes(const mlagen_problem* p) {
  const KernelEntry* e = nullptr;
  int splits = 0;
  if (choose(p, &e, &splits) != MLAGEN_OK) return 0;
  return workspace_layout(p, splits).bytes;
}

mlagen_status mlagen_decode(const mlagen_problem* p, mlagen_kernel_info* ran, void* stream) {
  mlagen_plan_s plan;
  mlagen_status st = make_plan(p, &plan);
  if (st != MLAGEN_OK) return st;
  const mlagen_args a{p->q, p->q_scale, p->kv, p->kv_scale, p->qo_indptr, p->kv_indptr, p->page_table, p->kv_lens,
                      p->page_indptr, p->last_page_len, p->out, p->lse, p->workspace};
  if (!p->workspace || p->workspace_bytes < plan.workspace_bytes)
    return fail(MLAGEN_ERR_WORKSPACE, "workspace: %zu bytes at %p, expected >= %zu bytes (mlagen_workspace_bytes)",
                p->workspace_bytes, p->workspace, plan.workspace_bytes);
  st = mlagen_run(&plan, &a, stream);
  if (st == MLAGEN_OK) fill_info(*plan.entry, plan.splits, ran);
  return st;
}

mlagen_status mlagen_plan(const mlagen_problem* p, mlagen_plan_t** out) {
  if (!out) return fail(MLAGEN_ERR_INVALID, "plan: NULL pointer (where the plan goes)");
  *out = nullptr;
  auto* plan = new (std::nothrow) mlagen_plan_s;
  if (!plan) return fail(MLAGEN_ERR_INVALID, "plan: out of host memory");
  const mlagen_status st = make_plan(p, plan);
  if (st != MLAGEN_OK) {
    delete plan;
    return st;
  }
  *out = plan;
  return MLAGEN_OK;
}

void mlagen_plan_destroy(mlagen_plan_t* plan) { delete plan; }

mlagen_status mlagen_plan_info(const mlagen_plan_t* plan, mlagen_kernel_info* info, size_t* workspace_bytes) {
  if (!plan) return fail(MLAGEN_ERR_INVALID, "plan: NULL pointer");
  fill_info(*plan->entry, plan->splits, info);
  if (workspace_bytes) *workspace_bytes = plan->workspace_bytes;
  return MLAGEN_OK;
}

mlagen_status mlagen_run(const mlagen_plan_t* plan, const mlagen_args* a, void* stream) {
  if (!plan) return fail(MLAGEN_ERR_INVALID, "plan: NULL pointer");
  if (!a) return fail(MLAGEN_ERR_INVALID, "args: NULL pointer");
  mlagen_problem p = plan->problem;
  // what the plan was made with is what every call passes: the same pointers present, each
  // aligned as the plan's was checked
  struct Ptr {
    const char* name;
    const void* now;
    const void* planned;
    size_t align;
  };
  const Ptr ptrs[] = {{"q", a->q, p.q, plan->q_align},
                      {"q_scale", a->q_scale, p.q_scale, 4},
                      {"kv", a->kv, p.kv, 16},
                      {"kv_scale", a->kv_scale, p.kv_scale, plan->kv_scale_align},
                      {"qo_indptr", a->qo_indptr, p.qo_indptr, 4},
                      {"kv_indptr", a->kv_indptr, p.kv_indptr, 4},
                      {"page_table", a->page_table, p.page_table, 4},
                      {"kv_lens", a->kv_lens, p.kv_lens, 4},
                      {"page_indptr", a->page_indptr, p.page_indptr, 4},
                      {"last_page_len", a->last_page_len, p.last_page_len, 4},
                      {"out", a->out, p.out, 16},
                      {"lse", a->lse, p.lse, 4}};
  for (const Ptr& x : ptrs) {
    if (!x.now != !x.planned)
      return fail(MLAGEN_ERR_INVALID, "%s: %s, but the plan was made %s it", x.name, x.now ? "given" : "NULL pointer",
                  x.planned ? "with" : "without");
    if (!aligned(x.now, x.align)) return fail(MLAGEN_ERR_INVALID, "%s: address %p not %zu-byte aligned", x.name, x.now, x.align);
  }
  if (!a->workspace) return fail(MLAGEN_ERR_WORKSPACE, "workspace: NULL pointer (expected >= %zu bytes)", plan->workspace_bytes);
  if (!aligned(a->workspace, 256)) return fail(MLAGEN_ERR_WORKSPACE, "workspace: expected 256-byte alignment");
  p.q = a->q;
  p.q_scale = a->q_scale;
  p.kv = a->kv;
  p.kv_scale = a->kv_scale;
  p.qo_indptr = a->qo_indptr;
  p.kv_indptr = a->kv_indptr;
  p.page_table = a->page_table;
  p.kv_lens = a->kv_lens;
  p.page_indptr = a->page_indptr;
  p.last_page_len = a->last_page_len;
  p.out = a->out;
  p.lse = a->lse;
  p.workspace = a->workspace;
  p.workspace_bytes = plan->workspace_bytes;
  gpu::DeviceScope scope(p.device);  // launch on the pointers' device, then give the caller's back
  if (scope.status() != MLAGEN_OK) return scope.status();
  return launch_kernel(*plan->object, *plan->entry, &p, plan->splits, stream, scope.device());
}

mlagen_status mlagen_take_device_errors(void* workspace, void* stream, uint32_t* errors) {
  if (!workspace || !errors) return fail(MLAGEN_ERR_INVALID, "workspace/errors: NULL pointer");
  uint32_t host = 0;
  const mlagen_status st = gpu::take_word(workspace, stream, &host);
  if (st != MLAGEN_OK) return st;
  *errors = host;
  if (host)
    return fail(MLAGEN_ERR_INPUT_DATA, "device-side input check failed (0x%x):%s%s%s", host,
                (host & MLAGEN_DEVERR_KV_INDPTR) ? " kv_indptr disagrees with total_kv / kv_len;" : "",
                (host & MLAGEN_DEVERR_QO_INDPTR) ? " qo_indptr is not [0, 1, ..., batch] within total_q;" : "",
                (host & MLAGEN_DEVERR_PAGE_TABLE) ? " page_table holds a page id outside [0, num_pages) or a page "
                                                    "list / length that does not fit it;" : "");
  return MLAGEN_OK;
}

int32_t mlagen_num_kernels(void) { return static_cast<int32_t>(num_entries()); }

mlagen_status mlagen_kernel_at(int32_t i, mlagen_kernel_info* info) {
  if (i < 0 || static_cast<size_t>(i) >= num_entries())
    return fail(MLAGEN_ERR_INVALID, "kernel index %d: expected 0..%d", i, mlagen_num_kernels() - 1);
  fill_info(kKernelTable[i], kKernelTable[i].splits, info);
  return MLAGEN_OK;
}

const char* mlagen_fingerprint(void) { return MLAGEN_FINGERPRINT; }
const char* mlagen_build_archs(void) { return MLAGEN_BUILD_ARCH; }

mlagen_status mlagen_check_device(void) { return gpu::check_current_device(); }

int32_t mlagen_num_code_objects(void) {
  size_t n = 0;
  code_objects(&n);
  return static_cast<int32_t>(n);
}

mlagen_status mlagen_code_object_at(int32_t i, mlagen_code_object* out) {
  size_t n = 0;
  const CodeObject* all = code_objects(&n);
  if (i < 0 || static_cast<size_t>(i) >= n || !out)
    return fail(MLAGEN_ERR_INVALID, "code object index %d: expected 0..%d and a place to write it", i, static_cast<int>(n) - 1);
  out->name = all[i].name;
  out->data = all[i].begin;
  out->size = static_cast<size_t>(all[i].end - all[i].begin);
  return MLAGEN_OK;
}

namespace {
// Entry point i of all code objects in order (each object's entries in kEntrySuffix order).
bool entry_at(int32_t i, mlagen_entry_point* out) {
  thread_local char name[256];
  size_t n = 0;
  const CodeObject* all = code_objects(&n);
  for (size_t o = 0; o < n; ++o) {
    const device::LaunchInfo& info = all[o].info;
    for (int k = 0; k < kEntryKinds; ++k) {
      if (!(all[o].entries & (1 << k)) || i-- > 0) continue;
      std::snprintf(name, sizeof(name), "%s%s", all[o].name, kEntrySuffix[k]);
      const bool decode = k == kDecode || k == kDecodeQ8;  // the decodes take the maps too (rows body)
      *out = mlagen_entry_point{};
      out->name = name;
      out->code_object = static_cast<int32_t>(o);
      out->num_args = decode && info.rows_body ? 2 : 1;
      out->arg_bytes[0] = static_cast<int32_t>(sizeof(device::Params));
      out->arg_align[0] = static_cast<int32_t>(alignof(device::Params));
      if (out->num_args == 2) {
        out->arg_bytes[1] = static_cast<int32_t>(sizeof(device::KvMapsAbi));
        out->arg_align[1] = static_cast<int32_t>(alignof(device::KvMapsAbi));
      }
      const EntryShape shape = entry_shape(info, k);
      out->threads = static_cast<int32_t>(shape.threads);
      out->smem_bytes = static_cast<int32_t>(shape.smem);
      return true;
    }
  }
  return false;
}
}  // namespace

int32_t mlagen_num_entry_points(void) {
  int32_t n = 0;
  mlagen_entry_point e;
  while (entry_at(n, &e)) ++n;
  return n;
}

mlagen_status mlagen_entry_point_at(int32_t i, mlagen_entry_point* out) {
  if (!out || i < 0 || !entry_at(i, out))
    return fail(MLAGEN_ERR_INVALID, "entry point index %d: expected 0..%d and a place to write it", i,
                mlagen_num_entry_points() - 1);
  return MLAGEN_OK;
}

mlagen_status mlagen_load_kernels(int32_t device) {
  gpu::DeviceScope scope(device);
  if (scope.status() != MLAGEN_OK) return scope.status();
  size_t n = 0;
  const CodeObject* all = code_objects(&n);
  for (size_t o = 0; o < n; ++o) {
    const gpu::Functions* f = nullptr;
    const mlagen_status st = gpu::functions(all[o], scope.device(), &f);
    if (st != MLAGEN_OK) return st;
  }
  return MLAGEN_OK;
}

const char* mlagen_gpu_runtime(void) { return gpu::runtime_path(); }

mlagen_status mlagen_set_split_merge(int32_t mode) {
  if (mode != MLAGEN_MERGE_COMBINE && mode != MLAGEN_MERGE_IN_LAUNCH)
    return fail(MLAGEN_ERR_INVALID, "split merge mode=%d: expected %d (MLAGEN_MERGE_COMBINE) or %d (MLAGEN_MERGE_IN_LAUNCH)",
                mode, MLAGEN_MERGE_COMBINE, MLAGEN_MERGE_IN_LAUNCH);
  set_split_merge(mode);
  return MLAGEN_OK;
}

int32_t mlagen_get_split_merge(void) { return split_merge(); }

}  // extern "C"
