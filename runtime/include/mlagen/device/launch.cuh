// Host side of a generated kernel: builds the kernel parameters from the C ABI problem
// (already validated by the dispatcher) and launches decode (+ combine when split).
#pragma once
#include "mlagen/internal.h"
#include "mlagen/device/mla_decode.cuh"       // NVIDIA: mma.sync kernel
#include "mlagen/device/mla_decode_gfx9.cuh"  // AMD: MFMA kernels (+ mla_decode_gfx950_fp8.cuh)

namespace mlagen::device {

inline Params make_params(const mlagen_problem* pr, int32_t splits) {
  const int32_t groups = row_groups(pr->num_heads, pr->q_len);
  const WorkspaceLayout ws = workspace_layout(pr, splits);
  auto* base = static_cast<uint8_t*>(pr->workspace);
  Params p{};
  p.q = pr->q;
  p.q_stride_token = pr->q_stride_token;
  p.q_stride_head = pr->q_stride_head;
  const bool quantize_q = pr->q_dtype == MLAGEN_DTYPE_FP8 && pr->q_from_bf16;
  p.q_scale = pr->q_dtype == MLAGEN_DTYPE_FP8 && !quantize_q ? pr->q_scale : nullptr;
  p.q_amax = quantize_q ? reinterpret_cast<float*>(base + kQAmaxOffset) : nullptr;
  p.q_amax_parts = quantize_q ? static_cast<int32_t>(pr->total_q < kQAmaxParts ? pr->total_q : kQAmaxParts) : 0;
  p.kv = static_cast<const uint8_t*>(pr->kv);
  p.kv_stride_bytes = pr->kv_stride_token * (pr->kv_dtype == MLAGEN_DTYPE_BF16 ? 2 : 1);
  const bool fp8_kv = pr->kv_dtype == MLAGEN_DTYPE_FP8E4M3FN || pr->kv_dtype == MLAGEN_DTYPE_FP8E4M3FNUZ;
  p.kv_scale = fp8_kv ? static_cast<const float*>(pr->kv_scale) : nullptr;
  p.kv_scales = pr->kv_dtype == MLAGEN_DTYPE_MXFP4 ? static_cast<const uint8_t*>(pr->kv_scale) : nullptr;
  p.kv_scales_stride = pr->kv_scale_stride;
  p.qo_indptr = pr->qo_indptr;
  p.kv_indptr = pr->kv_indptr;
  p.out = static_cast<uint16_t*>(pr->out);
  p.out_stride_token = pr->out_stride_token;
  p.out_stride_head = pr->out_stride_head;
  p.part_ml = reinterpret_cast<float2*>(base + ws.ml_offset);
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

// The dynamic shared-memory limit is a per-device function attribute: set it once per
// kernel and device. `configured` must belong to one kernel (every kernel has the same
// function type, so a static inside a template on the type would be shared).
template <class Kernel>
mlagen_status ensure_smem_limit(Kernel* kernel, int bytes, uint64_t& configured) {
  // bit d: device d done (benign race: setting the attribute twice is harmless)
  int dev = 0;
  if (hipGetDevice(&dev) != hipSuccess) dev = 64;  // unknown device: set the attribute every time
  if (dev < 64 && (__atomic_load_n(&configured, __ATOMIC_RELAXED) >> dev & 1)) return MLAGEN_OK;
  const hipError_t e = hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != hipSuccess)
    return fail(MLAGEN_ERR_DEVICE, "FuncSetAttribute(MaxDynamicSharedMemorySize=%d): %s", bytes, hipGetErrorString(e));
  if (dev < 64) __atomic_fetch_or(&configured, uint64_t{1} << dev, __ATOMIC_RELAXED);
  return MLAGEN_OK;
}

#if defined(MLAGEN_NVIDIA)
// Programmatic dependent launch: the grid is launched while the previous one in the stream
// still runs and waits on the device (griddepcontrol.wait) for its results, which hides
// the launch gap between the two kernels.
template <class Kernel>
hipError_t launch_dependent(Kernel* kernel, dim3 grid, dim3 block, int smem, hipStream_t stream, const Params& p) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}
#endif

// The combine (when split and not merged by the decode) after a decode launch, and the launch
// error check.
template <class T, class Shape>
mlagen_status launch_combine(const mlagen_problem* pr, const Params& p, int32_t splits, hipStream_t stream) {
  if constexpr (!FusedCombine<T>::value) {
    if (splits > 1) {
      auto* combine = &mla_combine_kernel<T, Shape>;
#if defined(MLAGEN_NVIDIA)
      const hipError_t le = launch_dependent(combine, dim3(pr->batch * p.row_groups * kHeads), dim3(128), 0, stream, p);
      if (le != hipSuccess) return fail(MLAGEN_ERR_DEVICE, "combine launch failed: %s", hipGetErrorString(le));
#else
      hipLaunchKernelGGL(combine, dim3(pr->batch * p.row_groups * kHeads), dim3(128), 0, stream, p);
#endif
    }
  }
  const hipError_t e = hipGetLastError();
  if (e != hipSuccess) return fail(MLAGEN_ERR_DEVICE, "kernel launch failed: %s", hipGetErrorString(e));
  return MLAGEN_OK;
}

// [q_amax_kernel, when fp8 q is quantized here] -> decode -> [combine, when split and the
// decode does not merge its own splits].
// An fp8-q kernel (T::kQ == kFp8) runs as generated for an fp8 q given with its scale, and as
// its kFp8FromBf16 instantiation when the library quantizes a bf16 q.
template <class T, class Shape>
mlagen_status launch_mla_decode(const mlagen_problem* pr, int32_t splits, void* raw_stream) {
  const Params p = make_params(pr, splits);
  const auto stream = static_cast<hipStream_t>(raw_stream);
  // shapes.cuh BlockCoord: a block owns RowsPerBlock / 16 row groups (the runtime checked the division)
  const dim3 grid(splits * p.row_groups / (RowsBody<T>::kRowsPerBlock / kHeads), pr->batch), block(T::kThreads);
  if constexpr (T::kQ == QFormat::kFp8) {
    if (p.q_amax_parts > 0) {
      using TQ = typename T::template WithQ<QFormat::kFp8FromBf16>;
      auto* kernel = &mla_decode_kernel<TQ, Shape>;
      static uint64_t smem_configured = 0;  // one per kernel
      const mlagen_status st = ensure_smem_limit(kernel, TQ::kSmemBytes, smem_configured);
      if (st != MLAGEN_OK) return st;
      auto* amax = &q_amax_kernel<256>;
      hipLaunchKernelGGL(amax, dim3(p.q_amax_parts), dim3(256), 0, stream, p);
#if defined(MLAGEN_NVIDIA)
      const hipError_t le = launch_dependent(kernel, grid, block, TQ::kSmemBytes, stream, p);
      if (le != hipSuccess) return fail(MLAGEN_ERR_DEVICE, "decode launch failed: %s", hipGetErrorString(le));
#else
      hipLaunchKernelGGL(kernel, grid, block, TQ::kSmemBytes, stream, p);
#endif
      return launch_combine<T, Shape>(pr, p, splits, stream);
    }
  }
  auto* kernel = &mla_decode_kernel<T, Shape>;
  static uint64_t smem_configured = 0;  // one per (tiling, shape) instantiation = one per kernel
  const mlagen_status st = ensure_smem_limit(kernel, T::kSmemBytes, smem_configured);
  if (st != MLAGEN_OK) return st;
  hipLaunchKernelGGL(kernel, grid, block, T::kSmemBytes, stream, p);
  return launch_combine<T, Shape>(pr, p, splits, stream);
}

}  // namespace mlagen::device
