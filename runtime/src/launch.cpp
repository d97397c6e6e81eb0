// The one argument packer and launch sequence for every generated kernel, both vendors:
// Params (kernel_abi.h) from a validated problem, then
//   [<name>_amax, when the library quantizes a bf16 q to fp8] -> <name> or <name>_q8
//   -> [<name>_combine, when split and the decode does not merge its own splits, in its launch
//       (cooperative, where the grid is resident at once: LaunchInfo merge_in_launch) or by design]
// with each entry's block and shared memory from its code object's LaunchInfo.
#include <atomic>
#include <cstring>

#include "gpu.h"
#include "launch.h"

#include "code_objects.inc"  // built: kCodeObjects (tools/embed.py)

namespace mlagen {

const CodeObject* code_objects(size_t* count) {
  *count = sizeof(kCodeObjects) / sizeof(kCodeObjects[0]);
  return kCodeObjects;
}

const CodeObject* find_code_object(const char* name) {
  for (const CodeObject& o : kCodeObjects)
    if (!std::strcmp(o.name, name)) return &o;
  return nullptr;
}

namespace {

using device::Params;

std::atomic<int32_t> g_split_merge{MLAGEN_MERGE_COMBINE};

// The kernel's entry (the plan's choice) states the KV format's layout: its stride unit, scale kind and
// row bytes (codegen/facts.py KV_FORMATS through the generated registry).
Params make_params(const mlagen_problem* pr, const KernelEntry& e, int32_t splits) {
  const int32_t groups = row_groups(pr->num_heads, pr->q_len);
  const WorkspaceLayout ws = workspace_layout(pr, splits);
  auto* base = static_cast<uint8_t*>(pr->workspace);
  Params p{};
  p.q = pr->q;
  p.q_stride_token = pr->q_stride_token;
  p.q_stride_head = pr->q_stride_head;
  const bool quantize_q = pr->q_dtype == MLAGEN_DTYPE_FP8 && pr->q_from_bf16;
  p.q_scale = pr->q_dtype == MLAGEN_DTYPE_FP8 && !quantize_q ? pr->q_scale : nullptr;
  p.q_amax = quantize_q ? reinterpret_cast<float*>(base + device::kQAmaxOffset) : nullptr;
  p.q_amax_parts = quantize_q ? static_cast<int32_t>(pr->total_q < device::kQAmaxParts ? pr->total_q : device::kQAmaxParts) : 0;
  p.kv = static_cast<const uint8_t*>(pr->kv);
  p.kv_stride_bytes = pr->kv_stride_token * e.stride_unit;
  p.kv_scale = e.scale_kind == 1 ? static_cast<const float*>(pr->kv_scale) : nullptr;
  p.kv_scales = e.scale_kind == 2 ? static_cast<const uint8_t*>(pr->kv_scale) : nullptr;
  p.kv_scales_stride = pr->kv_scale_stride;
  p.qo_indptr = pr->qo_indptr;
  p.kv_indptr = pr->kv_indptr;
  p.out = static_cast<uint16_t*>(pr->out);
  p.out_stride_token = pr->out_stride_token;
  p.out_stride_head = pr->out_stride_head;
  p.part_ml = reinterpret_cast<device::MlPair*>(base + ws.ml_offset);
  p.part_o = reinterpret_cast<float*>(base + ws.o_offset);
  p.errors = reinterpret_cast<uint32_t*>(base);
  p.split_counters = reinterpret_cast<uint32_t*>(base + ws.cnt_offset);
  p.lse = pr->lse;
  p.lse_stride_token = pr->lse_stride_token;
  if (pr->page_size > 0) {
    p.page_table = pr->page_table;
    p.page_table_stride = pr->page_table_stride;
    p.page_table_len = pr->page_table_len;
    p.page_table_width = pr->page_table_width;
    int shift = 0;
    while ((1 << shift) < pr->page_size) ++shift;
    p.page_shift = shift;
    p.num_pages = pr->total_kv >> shift;
    p.kv_lens = pr->kv_lens;
    p.page_indptr = pr->page_indptr;
    p.last_page_len = pr->last_page_len;
  }
  p.batch = pr->batch;
  p.splits = splits;
  p.num_heads = pr->num_heads;
  p.q_len = pr->q_len;
  p.row_groups = groups;
  p.total_q = pr->total_q;
  p.total_kv = pr->total_kv;
  p.sm_scale = pr->sm_scale;
  return p;
}

// The rows body's KV tensor maps for this call's KV, kept per thread for the next call on the
// same KV (encoding them is a driver call of a few microseconds).
mlagen_status kv_maps(const Params& p, int32_t row_bytes, device::KvMapsAbi* maps) {
  struct Last {
    const void* kv;
    int64_t rows, stride;
    int32_t row_bytes;
    device::KvMapsAbi maps;
  };
  thread_local Last last{nullptr, -1, -1, 0, {}};
  if (last.kv == p.kv && last.rows == p.total_kv && last.stride == p.kv_stride_bytes && last.row_bytes == row_bytes) {
    *maps = last.maps;
    return MLAGEN_OK;
  }
  *maps = device::KvMapsAbi{};
  if (p.total_kv <= 0 || !device::KvMapsAbi::mapped(row_bytes)) return MLAGEN_OK;  // no rows, or no tensor copies
  if (p.total_kv > 0x7fffffffll)
    return fail(MLAGEN_ERR_INVALID, "total_kv=%lld: expected at most 2^31 - 1 KV rows for the rows body",
                static_cast<long long>(p.total_kv));
  const mlagen_status st = gpu::encode_kv_maps(p.kv, p.total_kv, p.kv_stride_bytes, row_bytes, maps);
  if (st != MLAGEN_OK) return st;
  last = Last{p.kv, p.total_kv, p.kv_stride_bytes, row_bytes, *maps};
  return MLAGEN_OK;
}

// The combine's block: a split group (128 threads) for every 8 splits begun, up to 4 (kernel_abi.h),
// but no more groups than keep the grid resident at once (units: the 128-thread blocks the device
// holds; 0: one group). H200 (docs/perf.md): 4 groups took a 128-row, 32-split combine's tail from
// 6.4 to ~2 us; 2 groups at 512 rows (over the device's ~660 units) cost a second wave, +1.3 us.
unsigned combine_threads(int32_t splits, unsigned rows, int64_t units) {
  int groups = device::combine_groups(splits);
  while (groups > 1 && static_cast<int64_t>(rows) * groups > units) --groups;
  return static_cast<unsigned>(device::kCombineGroupThreads * groups);
}

}  // namespace

void set_split_merge(int32_t mode) { g_split_merge.store(mode, std::memory_order_relaxed); }
int32_t split_merge() { return g_split_merge.load(std::memory_order_relaxed); }

mlagen_status launch_kernel(const CodeObject& obj, const KernelEntry& e, const mlagen_problem* pr, int32_t splits,
                            void* stream, int device) {
  const gpu::Functions* f = nullptr;
  mlagen_status st = gpu::functions(obj, device, &f);
  if (st != MLAGEN_OK) return st;
  const device::LaunchInfo& info = obj.info;
  Params p = make_params(pr, e, splits);
  device::KvMapsAbi maps;
  void* args[2] = {&p, &maps};
  if (info.rows_body) {
    st = kv_maps(p, e.row_bytes, &maps);
    if (st != MLAGEN_OK) return st;
  }
  const unsigned grid_x = static_cast<unsigned>(splits * p.row_groups / (info.rows_per_block / 16));
  const unsigned grid_y = static_cast<unsigned>(pr->batch);
  const bool quantize_q = p.q_amax_parts > 0;
  if (quantize_q) {
    if (!f->amax || !f->q8)
      return fail(MLAGEN_ERR_UNSUPPORTED, "%s: no _amax / _q8 entry (q_from_bf16=1 needs an fp8-q kernel)", obj.name);
    st = gpu::launch({f->amax, static_cast<unsigned>(p.q_amax_parts), 1, entry_shape(info, kAmax).threads, 0, stream,
                      args, false, false},
                     "q amax launch");
    if (st != MLAGEN_OK) return st;
  }
  const EntryShape decode = entry_shape(info, quantize_q ? kDecodeQ8 : kDecode);
  // A split decode merges its partials in its own launch when the process asks for it
  // (MLAGEN_MERGE_IN_LAUNCH), the kernel can, and the whole grid, a merger block for each split
  // block, in rows of blocks after theirs (mla_decode_sm90.cuh merge_block), takes one SM a block,
  // all resident at once (the mergers wait for the splits: a cooperative launch guarantees it).
  // Not after the amax pre-pass, whose decode is a dependent launch.
  p.merge_in_launch = splits > 1 && info.merge_in_launch && !quantize_q && split_merge() == MLAGEN_MERGE_IN_LAUNCH &&
                      2 * static_cast<int64_t>(grid_x) * grid_y <= f->in_launch_blocks;
  const unsigned decode_y = p.merge_in_launch ? 2 * grid_y : grid_y;
  // after the amax pre-pass the decode starts early and waits for it on the device (NVIDIA)
  st = gpu::launch({quantize_q ? f->q8 : f->decode, grid_x, decode_y, decode.threads, decode.smem, stream, args, quantize_q,
                    p.merge_in_launch != 0},
                   "decode launch");
  if (st != MLAGEN_OK) return st;
  if (splits > 1 && !info.fused_combine && !p.merge_in_launch) {
    if (!f->combine) return fail(MLAGEN_ERR_UNSUPPORTED, "%s: no _combine entry, and %d splits to merge", obj.name, splits);
    const unsigned rows = static_cast<unsigned>(pr->batch * p.row_groups * 16);  // one block a query row
    st = gpu::launch({f->combine, rows, 1, combine_threads(splits, rows, f->combine_units), 0, stream, args, true, false},
                     "combine launch");
  }
  return st;
}

}  // namespace mlagen
