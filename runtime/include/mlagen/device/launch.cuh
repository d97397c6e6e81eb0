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
template <class Kernel, class... Args>
hipError_t launch_dependent(Kernel* kernel, dim3 grid, dim3 block, int smem, hipStream_t stream, const Args&... args) {
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
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// The rows body's KV tensor maps (mla_decode_sm90_rows.cuh KvMaps) for this call's KV: encoded on
// the host through the driver's cuTensorMapEncodeTiled (found once through the runtime, so the
// library links no driver library), and kept per thread for the next call on the same KV.
inline mlagen_status kv_maps(const Params& p, KvMaps& maps) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess || found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<Encode>(fn);
  }();
  struct Last { const void* kv; int64_t rows, stride; KvMaps maps; };
  thread_local Last last{nullptr, -1, -1, {}};
  if (last.kv == p.kv && last.rows == p.total_kv && last.stride == p.kv_stride_bytes) {
    maps = last.maps;
    return MLAGEN_OK;
  }
  maps = KvMaps{};
  if (p.total_kv <= 0) return MLAGEN_OK;  // no rows, no copies
  if (!encode) return fail(MLAGEN_ERR_DEVICE, "cuTensorMapEncodeTiled: not in this driver (the rows body's KV copies need it)");
  if (p.total_kv > 0x7fffffffll)
    return fail(MLAGEN_ERR_INVALID, "total_kv=%lld: expected at most 2^31 - 1 KV rows for the rows body",
                static_cast<long long>(p.total_kv));
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kQkDim), static_cast<cuuint64_t>(p.total_kv)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.kv_stride_bytes)};
  const cuuint32_t unit[2] = {1, 1};
  const cuuint32_t main_box[2] = {KvMaps::kMainBoxBytes, KvMaps::kMainBoxRows};
  const cuuint32_t rope_box[2] = {KvMaps::kRopeBoxBytes, KvMaps::kRopeBoxRows};
  void* base = const_cast<uint8_t*>(p.kv);
  CUresult r = encode(&maps.main, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, main_box, unit,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS)
    r = encode(&maps.rope, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base, dims, strides, rope_box, unit,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fail(MLAGEN_ERR_DEVICE, "cuTensorMapEncodeTiled (KV %p, %lld rows, stride %lld bytes): CUresult %d", p.kv,
                static_cast<long long>(p.total_kv), static_cast<long long>(p.kv_stride_bytes), static_cast<int>(r));
  last = Last{p.kv, p.total_kv, p.kv_stride_bytes, maps};
  return MLAGEN_OK;
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
#if defined(MLAGEN_NVIDIA)
// The rows body: the same sequence with the KV tensor maps as the decode kernel's second parameter.
template <class T, class Shape>
mlagen_status launch_rows(const mlagen_problem* pr, const Params& p, int32_t splits, dim3 grid, hipStream_t stream) {
  KvMaps maps;
  mlagen_status st = kv_maps(p, maps);
  if (st != MLAGEN_OK) return st;
  const dim3 block(T::kThreads);
  if constexpr (T::kQ == QFormat::kFp8) {
    if (p.q_amax_parts > 0) {
      using TQ = typename T::template WithQ<QFormat::kFp8FromBf16>;
      auto* kernel = &mla_decode_rows_kernel<TQ, Shape>;
      static uint64_t smem_configured = 0;  // one per kernel
      st = ensure_smem_limit(kernel, TQ::kSmemBytes, smem_configured);
      if (st != MLAGEN_OK) return st;
      auto* amax = &q_amax_kernel<256>;
      hipLaunchKernelGGL(amax, dim3(p.q_amax_parts), dim3(256), 0, stream, p);
      const hipError_t le = launch_dependent(kernel, grid, block, TQ::kSmemBytes, stream, p, maps);
      if (le != hipSuccess) return fail(MLAGEN_ERR_DEVICE, "decode launch failed: %s", hipGetErrorString(le));
      return launch_combine<T, Shape>(pr, p, splits, stream);
    }
  }
  auto* kernel = &mla_decode_rows_kernel<T, Shape>;
  static uint64_t smem_configured = 0;  // one per kernel
  st = ensure_smem_limit(kernel, T::kSmemBytes, smem_configured);
  if (st != MLAGEN_OK) return st;
  hipLaunchKernelGGL(kernel, grid, block, T::kSmemBytes, stream, p, maps);
  return launch_combine<T, Shape>(pr, p, splits, stream);
}
#endif

template <class T, class Shape>
mlagen_status launch_mla_decode(const mlagen_problem* pr, int32_t splits, void* raw_stream) {
  const Params p = make_params(pr, splits);
  const auto stream = static_cast<hipStream_t>(raw_stream);
  // shapes.cuh BlockCoord: a block owns RowsPerBlock / 16 row groups (the runtime checked the division)
  const dim3 grid(splits * p.row_groups / (RowsBody<T>::kRowsPerBlock / kHeads), pr->batch), block(T::kThreads);
#if defined(MLAGEN_NVIDIA)
  if constexpr (RowsBody<T>::value) return launch_rows<T, Shape>(pr, p, splits, grid, stream);
  else {
#endif
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
#if defined(MLAGEN_NVIDIA)
  }
#endif
}

}  // namespace mlagen::device
