// mlagen platform header: the HIP spellings the device code uses, mapped onto CUDA when
// the NVIDIA compiler builds it. On a ROCm/clang HIP build they are HIP's own. Device code
// only: the host library (runtime/src) calls no GPU runtime API by name (gpu.cpp resolves them).
#pragma once

#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)
  #define MLAGEN_AMD 1
  #if !defined(MLAGEN_NO_HIP_RUNTIME_HEADERS)
    #include <hip/hip_runtime.h>
  #endif
  #define MLAGEN_WARP_SIZE 64
#elif defined(__CUDACC__)
  #define MLAGEN_NVIDIA 1
  #include <cuda_runtime.h>
  #include <cstdint>
  #define MLAGEN_WARP_SIZE 32
  template <class T>
  __device__ __forceinline__ T __shfl_xor(T v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
  template <class T>
  __device__ __forceinline__ T __shfl(T v, int src) { return __shfl_sync(0xffffffffu, v, src); }
#else
  #error "mlagen device code needs nvcc (CUDA) or clang/hipcc (HIP)"
#endif

#define MLAGEN_DEVICE __device__ __forceinline__
// A device function kept out of line: one copy of its code, called. Only where a measurement
// asked for it (formats.cuh quantize_q4); not a rule: docs/perf.md has an out-of-line move that
// made kernels slower.
#define MLAGEN_DEVICE_OUTLINED __device__ __noinline__
