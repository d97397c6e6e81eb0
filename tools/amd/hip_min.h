// Minimal HIP spellings for a device-only compile WITHOUT any ROCm/HIP headers:
//   clang++ -x hip --offload-arch=gfx942 --offload-device-only -nogpulib -nogpuinc \
//           -DMLAGEN_NO_HIP_RUNTIME_HEADERS -include tools/amd/hip_min.h ...
// (tools/amd/check_amd.py --gfx942-headers min). With -nogpuinc clang adds neither its HIP
// wrapper header nor a HIP include path, so nothing below exists unless declared here: this file
// is the list of what mlagen/platform.h must declare itself for that route (its AMD branch
// includes <hip/hip_runtime.h> otherwise). Only what the generated sources and the self-test use
// is here; extend it when the AMD templates use more. Semantics follow HIP 6.4's amd_detail
// headers; nothing here is linked or run (host functions are declared, never defined).
#pragma once
#if defined(__HIP__) && !defined(MLAGEN_HIP_MIN_H)
#define MLAGEN_HIP_MIN_H 1

#include <stddef.h>
#include <stdint.h>
#include <math.h>     // INFINITY, NAN, the host declarations the device overloads below sit beside
#include <limits.h>

// ---- attributes (clang's __clang_hip_runtime_wrapper.h has these; -nogpuinc drops it)
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __managed__ __attribute__((managed))
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
// HIP: __launch_bounds__(MAX_THREADS[, MIN_WARPS_PER_EU]); only the thread bound is kept here.
#define __mlagen_first_arg(a, ...) a
#define __launch_bounds__(...) \
  __attribute__((amdgpu_flat_work_group_size(1, __mlagen_first_arg(__VA_ARGS__, 0))))

// ---- dim3 and the builtin index variables (threadIdx.x, blockIdx.x, blockDim.x, gridDim.x)
struct dim3 {
  uint32_t x, y, z;
  constexpr __host__ __device__ dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
#define __MLAGEN_HIP_BUILTIN_VAR(NAME, FX, FY, FZ)                                           \
  struct __mlagen_builtin_##NAME##_t {                                                        \
    __declspec(property(get = __get_x)) unsigned int x;                                       \
    __declspec(property(get = __get_y)) unsigned int y;                                       \
    __declspec(property(get = __get_z)) unsigned int z;                                       \
    static __device__ __forceinline__ unsigned int __get_x() { return FX; }                  \
    static __device__ __forceinline__ unsigned int __get_y() { return FY; }                  \
    static __device__ __forceinline__ unsigned int __get_z() { return FZ; }                  \
  };                                                                                           \
  extern const __device__ __attribute__((weak)) __mlagen_builtin_##NAME##_t NAME;
__MLAGEN_HIP_BUILTIN_VAR(threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
                         __builtin_amdgcn_workitem_id_z())
__MLAGEN_HIP_BUILTIN_VAR(blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                         __builtin_amdgcn_workgroup_id_z())
__MLAGEN_HIP_BUILTIN_VAR(blockDim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
                         __builtin_amdgcn_workgroup_size_z())
__MLAGEN_HIP_BUILTIN_VAR(gridDim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
                         __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
                         __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
#undef __MLAGEN_HIP_BUILTIN_VAR
#define warpSize 64

// ---- synchronisation and cross-lane operations (HIP 6.4 amd_device_functions.h / amd_warp_functions.h)
static __device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// HIP's is __ockl_wgred_or_i32 (a device library's work-group reduction through LDS); the same
// here: each wave's ballot into its own LDS word, a barrier, every thread ORs the block's words,
// and a second barrier so that a following call cannot overwrite a word before all have read it.
static __device__ __forceinline__ int __syncthreads_or(int predicate) {
  __shared__ int wave_any[1024 / 64];
  const unsigned int tid = __builtin_amdgcn_workitem_id_x() +
                           __builtin_amdgcn_workgroup_size_x() * (__builtin_amdgcn_workitem_id_y() +
                                                                  __builtin_amdgcn_workgroup_size_y() *
                                                                      __builtin_amdgcn_workitem_id_z());
  const unsigned int waves = (__builtin_amdgcn_workgroup_size_x() * __builtin_amdgcn_workgroup_size_y() *
                                  __builtin_amdgcn_workgroup_size_z() + 63) / 64;
  const int any = __builtin_amdgcn_ballot_w64(predicate != 0) != 0;
  if (tid % 64 == 0) wave_any[tid / 64] = any;
  __syncthreads();
  int r = 0;
  for (unsigned int w = 0; w < waves; ++w) r |= wave_any[w];
  __syncthreads();
  return r;
}
static __device__ __forceinline__ void __threadfence_block() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "workgroup"); }
static __device__ __forceinline__ void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
static __device__ __forceinline__ unsigned int __lane_id() {
  return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}
static __device__ __forceinline__ int __mlagen_bpermute(int var, int src_lane) {
  return __builtin_amdgcn_ds_bpermute(src_lane << 2, var);
}
static __device__ __forceinline__ int __shfl_xor(int var, int lane_mask, int width = 64) {
  const int self = (int)__lane_id();
  int index = self ^ lane_mask;
  index = index >= ((self + width) & ~(width - 1)) ? self : index;
  return __mlagen_bpermute(var, index);
}
static __device__ __forceinline__ unsigned int __shfl_xor(unsigned int var, int lane_mask, int width = 64) {
  return (unsigned int)__shfl_xor((int)var, lane_mask, width);
}
static __device__ __forceinline__ float __shfl_xor(float var, int lane_mask, int width = 64) {
  return __builtin_bit_cast(float, __shfl_xor(__builtin_bit_cast(int, var), lane_mask, width));
}
static __device__ __forceinline__ int __shfl(int var, int src_lane, int width = 64) {
  const int self = (int)__lane_id();
  const int index = src_lane + (self & ~(width - 1));
  return __mlagen_bpermute(var, index);
}
static __device__ __forceinline__ float __shfl(float var, int src_lane, int width = 64) {
  return __builtin_bit_cast(float, __shfl(__builtin_bit_cast(int, var), src_lane, width));
}

// ---- device math: inline builtins (LLVM lowers llvm.exp/exp2/log/sqrt for AMDGPU itself, so
// no device library is needed; with the HIP headers these are __ocml_* calls instead)
#define __MLAGEN_DM static __device__ __forceinline__
__MLAGEN_DM float expf(float x) { return __builtin_expf(x); }
__MLAGEN_DM float exp2f(float x) { return __builtin_exp2f(x); }
__MLAGEN_DM float __expf(float x) { return __builtin_expf(x); }
__MLAGEN_DM float logf(float x) { return __builtin_logf(x); }
__MLAGEN_DM float log2f(float x) { return __builtin_log2f(x); }
__MLAGEN_DM float __logf(float x) { return __builtin_logf(x); }
__MLAGEN_DM float sqrtf(float x) { return __builtin_sqrtf(x); }
__MLAGEN_DM float rsqrtf(float x) { return __builtin_amdgcn_rsqf(x); }
__MLAGEN_DM float fabsf(float x) { return __builtin_fabsf(x); }
__MLAGEN_DM float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
__MLAGEN_DM float fminf(float a, float b) { return __builtin_fminf(a, b); }
__MLAGEN_DM float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
__MLAGEN_DM float __fdividef(float a, float b) { return a / b; }
__MLAGEN_DM float __frcp_rn(float x) { return 1.0f / x; }
__MLAGEN_DM float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
__MLAGEN_DM int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
__MLAGEN_DM int min(int a, int b) { return a < b ? a : b; }
__MLAGEN_DM int max(int a, int b) { return a > b ? a : b; }
__MLAGEN_DM unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
__MLAGEN_DM unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
__MLAGEN_DM long long min(long long a, long long b) { return a < b ? a : b; }
__MLAGEN_DM long long max(long long a, long long b) { return a > b ? a : b; }
__MLAGEN_DM float min(float a, float b) { return __builtin_fminf(a, b); }
__MLAGEN_DM float max(float a, float b) { return __builtin_fmaxf(a, b); }
__MLAGEN_DM float __uint_as_float(unsigned int x) { return __builtin_bit_cast(float, x); }
__MLAGEN_DM unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }

// ---- atomics (HIP 6.4 amd_hip_atomic.h: relaxed, agent scope)
#define __MLAGEN_ATOMIC(NAME, BUILTIN, T)                                                       \
  __MLAGEN_DM T NAME(T* address, T val) {                                                       \
    return BUILTIN(address, val, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);                   \
  }
__MLAGEN_ATOMIC(atomicAdd, __hip_atomic_fetch_add, int)
__MLAGEN_ATOMIC(atomicAdd, __hip_atomic_fetch_add, unsigned int)
__MLAGEN_ATOMIC(atomicAdd, __hip_atomic_fetch_add, float)
__MLAGEN_ATOMIC(atomicOr, __hip_atomic_fetch_or, int)
__MLAGEN_ATOMIC(atomicOr, __hip_atomic_fetch_or, unsigned int)
__MLAGEN_ATOMIC(atomicAnd, __hip_atomic_fetch_and, unsigned int)
__MLAGEN_ATOMIC(atomicMax, __hip_atomic_fetch_max, int)
__MLAGEN_ATOMIC(atomicMax, __hip_atomic_fetch_max, unsigned int)
__MLAGEN_ATOMIC(atomicMin, __hip_atomic_fetch_min, int)
__MLAGEN_ATOMIC(atomicExch, __hip_atomic_exchange, unsigned int)
#undef __MLAGEN_ATOMIC
__MLAGEN_DM unsigned int atomicCAS(unsigned int* address, unsigned int compare, unsigned int val) {
  __hip_atomic_compare_exchange_strong(address, &compare, val, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                       __HIP_MEMORY_SCOPE_AGENT);
  return compare;
}
#undef __MLAGEN_DM

// ---- vector types: HIP's are structs (HIP_vector_type) with .x/.y/.z/.w; clang ext vectors have
// the same size, alignment and members for 2 and 4 elements (3-element types differ: not here)
#define __MLAGEN_VEC(T, N, NAME) typedef T NAME __attribute__((ext_vector_type(N)));
__MLAGEN_VEC(float, 2, float2) __MLAGEN_VEC(float, 4, float4)
__MLAGEN_VEC(int, 2, int2) __MLAGEN_VEC(int, 4, int4)
__MLAGEN_VEC(unsigned int, 2, uint2) __MLAGEN_VEC(unsigned int, 4, uint4)
__MLAGEN_VEC(unsigned short, 2, ushort2) __MLAGEN_VEC(unsigned short, 4, ushort4)
__MLAGEN_VEC(short, 2, short2) __MLAGEN_VEC(short, 4, short4)
__MLAGEN_VEC(unsigned char, 2, uchar2) __MLAGEN_VEC(unsigned char, 4, uchar4)
#undef __MLAGEN_VEC
static __host__ __device__ __forceinline__ float2 make_float2(float x, float y) { return float2{x, y}; }
static __host__ __device__ __forceinline__ float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static __host__ __device__ __forceinline__ uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
static __host__ __device__ __forceinline__ uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
  return uint4{x, y, z, w};
}
static __host__ __device__ __forceinline__ int2 make_int2(int x, int y) { return int2{x, y}; }
static __host__ __device__ __forceinline__ int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

// ---- host API: parsed in the device pass (host functions are type-checked, never emitted)
typedef struct ihipStream_t* hipStream_t;
typedef enum hipError_t { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorLaunchFailure = 719 } hipError_t;
typedef enum hipFuncAttribute {
  hipFuncAttributeMaxDynamicSharedMemorySize = 8,
  hipFuncAttributePreferredSharedMemoryCarveout = 9,
} hipFuncAttribute;
typedef enum hipDeviceAttribute_t {
  hipDeviceAttributeComputeCapabilityMajor = 23,
  hipDeviceAttributeComputeCapabilityMinor = 61,
  hipDeviceAttributeMultiprocessorCount = 63,
} hipDeviceAttribute_t;
extern "C" {
hipError_t hipGetLastError(void);
hipError_t hipPeekAtLastError(void);
const char* hipGetErrorString(hipError_t);
hipError_t hipGetDevice(int*);
hipError_t hipSetDevice(int);
hipError_t hipGetDeviceCount(int*);
hipError_t hipDeviceGetAttribute(int*, hipDeviceAttribute_t, int);
hipError_t hipFuncSetAttribute(const void*, hipFuncAttribute, int);
// the triple-chevron launch needs these two declared (clang lowers <<<>>> onto them)
hipError_t __hipPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem = 0, hipStream_t stream = 0);
hipError_t __hipPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem, hipStream_t* stream);
}
#define hipLaunchKernelGGL(kernel, grid, block, smem, stream, ...) \
  do { (kernel)<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__); } while (0)

#endif  // __HIP__
