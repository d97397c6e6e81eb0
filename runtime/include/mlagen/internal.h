// Runtime internals shared by the dispatcher (runtime/src) and the generated launchers.
#pragma once
#include <cstddef>
#include <cstdint>
#include "mlagen/mlagen.h"

namespace mlagen {

// One row of the generated registry (generated/registry.inc).
struct KernelEntry {
  const char* arch;
  int32_t batch, kv_len, splits;  // 0 = any (the generic kernel)
  int32_t q_dtype, kv_dtype;      // mlagen_dtype
  int32_t num_heads, q_len;
  int32_t page_size;   // specialized: the page size its rows come in (0 contiguous); generic: 0 (any)
  int32_t row_bytes;   // bytes of one KV row's data (fp8 576, bf16 1152, mxfp4 288)
  int32_t stride_unit; // bytes of kv_stride_token's unit (bf16 2, else 1)
  int32_t scale_kind;  // 0 none (bf16), 1 one float32 (fp8), 2 E8M0 rows (mxfp4)
  int32_t block_n, stages;
  int32_t block_m;  // query rows a block: 16, or 32 / 64 (the sm90a rows body: heads x q_len a multiple of it)
  int32_t role;  // 0 specialized, 1 generic, 2 tuning candidate (reachable by name only), 3 generic rows body (one a block_m)
  int32_t target_blocks;  // resident blocks the split heuristic aims for (SMs x blocks an SM)
  // the generic choice's model (codegen/spec.py GENERIC_COSTS; all 0 where unmeasured): us a block
  // and a 64-token tile a wave, a split's fixed cost, a query row's split partial
  double block_us, tile_us, split_us, split_row_us;
  const char* name;       // also its code object's and its entry points' (runtime/src/gpu.h CodeObject)
};

// Device workspace: [0, 1024) the error word (at 0) and the fp8-q pre-pass maxima (at 64,
// up to 240 floats: kernel_abi.h kQAmaxOffset / kQAmaxParts). When split: one arrival counter a
// sequence at a FIXED place, [1024, 1024 + 4 * 65536) (the kernels that merge their own splits
// count arrivals there and reset each counter to 0: it stays zero between calls, and no other
// problem's layout puts partials there, so a workspace shared by problems of different sizes
// keeps its counters valid); then split maxima/sums; then split outputs.
constexpr size_t kSplitCountersOffset = 1024;
constexpr size_t kSplitCountersBytes = size_t{4} * 65536;  // batch <= 65535
struct WorkspaceLayout {
  size_t cnt_offset, ml_offset, o_offset, bytes;
};
// Blocks of 16 query rows a sequence (device/shapes.cuh QueryRows): q_len tokens x num_heads heads.
inline int32_t row_groups(int32_t num_heads, int32_t q_len) { return (num_heads * q_len + 15) / 16; }

// rows: query rows a split's partial holds a sequence (row_groups * 16)
inline WorkspaceLayout workspace_layout(int64_t batch, int64_t splits, int64_t rows, int64_t v_dim = 512) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  WorkspaceLayout w{};
  w.cnt_offset = kSplitCountersOffset;
  w.ml_offset = splits > 1 ? kSplitCountersOffset + kSplitCountersBytes : 1024;
  const size_t ml_bytes = splits > 1 ? static_cast<size_t>(batch * splits * rows) * 8 : 0;
  w.o_offset = align(w.ml_offset + ml_bytes);
  const size_t o_bytes = splits > 1 ? static_cast<size_t>(batch * splits * rows * v_dim) * 4 : 0;
  w.bytes = w.o_offset + o_bytes;
  return w;
}
// A problem's workspace at `splits`: its rows are row_groups x 16 a sequence (the planner, the
// size query and the launcher all take it from here).
inline WorkspaceLayout workspace_layout(const mlagen_problem* p, int64_t splits) {
  return workspace_layout(p->batch, splits, int64_t{row_groups(p->num_heads, p->q_len)} * 16, p->v_dim);
}

// Sets the calling thread's error message; returns `status` for `return fail(...)`.
mlagen_status fail(mlagen_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

}  // namespace mlagen
