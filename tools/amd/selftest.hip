// Self-test kernel for tools/amd/check_amd.py --selftest: exercises what the generated AMD
// MLA decode sources will use (the mlagen platform header, shared memory, a cross-lane shuffle,
// one matrix-core op per arch, an fp8 MFMA, the hardware exp2, a host launch wrapper) so that the compile
// route and the assembly parser are checked before any real AMD kernel exists.
//
// Compiled device-only per arch (--offload-arch=gfx942 with clang-19, gfx950 with clang-21)
// and, by tests/cpu/test_amd_toolchain.py through tools/amd/hip-device-cc, into a gfx950 code object.
#include "mlagen/platform.h"

#if !defined(MLAGEN_AMD)
#error "selftest.hip is an AMD HIP source: mlagen/platform.h did not define MLAGEN_AMD"
#endif

#include <stdint.h>

namespace mlagen_selftest {

typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short i16x4 __attribute__((ext_vector_type(4)));
#if defined(__gfx950__)
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
#endif

constexpr int kThreads = 256;                        // 4 waves of 64 lanes
constexpr int kWaves = kThreads / MLAGEN_WARP_SIZE;

// One 16x16 fp32 tile += A(16xK, bf16) * B(Kx16, bf16) per wave with K = 32 (one gfx950 op or
// two gfx942 ops), then += fp8 A * fp8 B with K = 32 (one op on both arches).
MLAGEN_DEVICE f32x4 bf16_mma_k32(const uint16_t* a, const uint16_t* b, f32x4 acc) {
#if defined(__gfx950__)
  bf16x8 av, bv;
  for (int i = 0; i < 8; ++i) {
    av[i] = __builtin_bit_cast(__bf16, a[i]);
    bv[i] = __builtin_bit_cast(__bf16, b[i]);
  }
  acc = __builtin_amdgcn_mfma_f32_16x16x32_bf16(av, bv, acc, 0, 0, 0);
#elif defined(__gfx942__)
  i16x4 a0, a1, b0, b1;
  for (int i = 0; i < 4; ++i) {
    a0[i] = static_cast<short>(a[i]);
    a1[i] = static_cast<short>(a[4 + i]);
    b0[i] = static_cast<short>(b[i]);
    b1[i] = static_cast<short>(b[4 + i]);
  }
  acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a0, b0, acc, 0, 0, 0);
  acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a1, b1, acc, 0, 0, 0);
#elif defined(__HIP_DEVICE_COMPILE__)
  #error "selftest.hip: no MFMA path for this AMD arch (expected gfx942 or gfx950)"
#endif
  return acc;
}

MLAGEN_DEVICE f32x4 fp8_mma_k32(long a, long b, f32x4 acc) {
#if defined(__gfx950__) || defined(__gfx942__)
  acc = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, acc, 0, 0, 0);
#endif
  return acc;
}

MLAGEN_DEVICE float fast_exp2(float x) {
#if __has_builtin(__builtin_amdgcn_exp2f)
  return __builtin_amdgcn_exp2f(x);
#else
  return exp2f(x);
#endif
}

}  // namespace mlagen_selftest

using namespace mlagen_selftest;

// a, b: per wave 64 lanes x 8 bf16; a8, b8: per wave 64 lanes x 8 fp8 (one long); out: per wave
// 64 lanes x 4 fp32, plus one row-max per wave in rowmax.
extern "C" __global__ __launch_bounds__(kThreads) void mlagen_selftest_kernel(
    const uint16_t* __restrict__ a, const uint16_t* __restrict__ b, const long* __restrict__ a8,
    const long* __restrict__ b8, float* __restrict__ out, float* __restrict__ rowmax) {
  __shared__ uint16_t sa[kWaves][MLAGEN_WARP_SIZE * 8];
  __shared__ uint16_t sb[kWaves][MLAGEN_WARP_SIZE * 8];
  const int tid = threadIdx.x;
  const int wave = tid / MLAGEN_WARP_SIZE;
  const int lane = tid % MLAGEN_WARP_SIZE;
  const size_t base = (static_cast<size_t>(blockIdx.x) * kWaves + wave) * MLAGEN_WARP_SIZE;

  // Stage A and B through shared memory transposed by lane, so the compiler must keep the LDS.
  for (int i = 0; i < 8; ++i) {
    sa[wave][i * MLAGEN_WARP_SIZE + lane] = a[(base + lane) * 8 + i];
    sb[wave][i * MLAGEN_WARP_SIZE + lane] = b[(base + lane) * 8 + i];
  }
  __syncthreads();
  uint16_t af[8], bf[8];
  for (int i = 0; i < 8; ++i) {
    af[i] = sa[wave][i * MLAGEN_WARP_SIZE + (lane ^ 1)];
    bf[i] = sb[wave][i * MLAGEN_WARP_SIZE + (lane ^ 1)];
  }

  f32x4 acc = {0.f, 0.f, 0.f, 0.f};
  acc = bf16_mma_k32(af, bf, acc);
  acc = fp8_mma_k32(a8[base + lane], b8[base + lane], acc);

  // Softmax-style row max across the wave with xor shuffles (64 lanes: offsets 32..1).
  float m = fmaxf(fmaxf(acc[0], acc[1]), fmaxf(acc[2], acc[3]));
  for (int off = MLAGEN_WARP_SIZE / 2; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor(m, off));
  // exp(x - m) as exp2((x - m) * log2(e)) on the hardware exp (v_exp_f32), as a decode kernel
  // would do; a libm expf is an __ocml_* call that only the device libraries (-nogpulib: none)
  // resolve.
  for (int i = 0; i < 4; ++i) out[(base + lane) * 4 + i] = fast_exp2((acc[i] - m) * 1.4426950408889634f);
  if (lane == 0) rowmax[blockIdx.x * kWaves + wave] = m;
}

// Host launch wrapper in the style of the generated sources: parsed (not emitted) in the
// device-only pass, so the HIP host API spellings must be declared there too.
extern "C" hipError_t mlagen_selftest_launch(const uint16_t* a, const uint16_t* b, const long* a8,
                                             const long* b8, float* out, float* rowmax,
                                             int blocks, hipStream_t stream) {
  hipLaunchKernelGGL(mlagen_selftest_kernel, dim3(blocks), dim3(kThreads), 0, stream, a, b, a8, b8,
                     out, rowmax);
  return hipGetLastError();
}
