// A CPU stand-in for exactly the HIP/AMDGPU features the gfx9 kernel uses, so that the
// real kernel source (runtime/include/mlagen/device/mla_decode_gfx9.cuh) runs on the host:
// one std::thread per GPU thread, std::barrier for __syncthreads, and wave-wide exchanges
// for __shfl_xor and the MFMA builtins (each lane deposits its operands, the wave meets,
// each lane computes its own output lanes from the documented operand layouts).
// Included first (-include) with -D__HIP_PLATFORM_AMD__ -DMLAGEN_NO_HIP_RUNTIME_HEADERS
// -D__HIP_DEVICE_COMPILE__ [-D__gfx950__]. Not a HIP implementation: a test fixture.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __shared__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local emu_dim3 threadIdx, blockIdx, gridDim;

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
using std::min;
using std::max;
inline uint32_t atomicOr(uint32_t* p, uint32_t v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}

typedef _Float16 emu_f16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 emu_f16x8 __attribute__((ext_vector_type(8)));
typedef float emu_f32x4 __attribute__((ext_vector_type(4)));

// float -> __bf16 (what __builtin_convertvector / static_cast lower to on the host): round to
// nearest even, NaN stays a quiet NaN. The device does this in hardware (v_cvt_pk_bf16_f32,
// gfx950) or inline (gfx942); the host's libgcc may lack the helper, so it is defined here.
extern "C" __attribute__((weak)) __bf16 __truncsfbf2(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t h = (u & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((u >> 16) | 0x40u)
                                                     : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  __bf16 r;
  std::memcpy(&r, &h, 2);
  return r;
}

// ---- the block being emulated ------------------------------------------------------------
struct EmuWave {
  std::barrier<>* bar = nullptr;
  float f[64];
  float a[64][8], b[64][8];  // MFMA operands as exact fp32 (every f16 / bf16 is one)
};
struct EmuBlock {
  std::barrier<>* bar = nullptr;
  EmuWave wave[8];
};
inline EmuBlock* emu_block = nullptr;
inline thread_local int emu_lane = 0, emu_wave = 0;

inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }

template <class T>
T __shfl_xor(T v, int mask) {
  EmuWave& w = emu_block->wave[emu_wave];
  w.f[emu_lane] = v;
  w.bar->arrive_and_wait();
  const T r = w.f[emu_lane ^ mask];
  w.bar->arrive_and_wait();
  return r;
}

// One MFMA operand element as fp32: f16, bf16 given as its bit pattern (short: the
// "_1k" builtins' operand type) or __bf16.
inline float emu_elem(_Float16 h) { return static_cast<float>(h); }
inline float emu_elem(short bits) { return __uint_as_float(static_cast<uint32_t>(static_cast<uint16_t>(bits)) << 16); }
inline float emu_elem(__bf16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return __uint_as_float(static_cast<uint32_t>(u) << 16);
}

// D(16x16) += A(16xK) B(Kx16); lane l = i + 16 j holds A[i][E*j .. E*j+E-1],
// B[E*j .. E*j+E-1][i] and D[4j + r][i] (E = K / 4 elements a lane). The same map for the
// f16 and the bf16 forms; products and sums in fp32.
template <int E, class VA>
emu_f32x4 emu_mfma(VA a, VA b, emu_f32x4 c) {
  EmuWave& w = emu_block->wave[emu_wave];
  for (int e = 0; e < E; ++e) {
    w.a[emu_lane][e] = emu_elem(a[e]);
    w.b[emu_lane][e] = emu_elem(b[e]);
  }
  w.bar->arrive_and_wait();
  const int i = emu_lane & 15, j = emu_lane >> 4;
  emu_f32x4 d = c;
  for (int r = 0; r < 4; ++r) {
    const int row = 4 * j + r, col = i;
    float acc = 0.f;
    for (int k = 0; k < 4 * E; ++k)
      acc += w.a[row + 16 * (k / E)][k % E] * w.b[col + 16 * (k / E)][k % E];
    d[r] += acc;
  }
  w.bar->arrive_and_wait();
  return d;
}
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, x, y, z) emu_mfma<4>(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x32_f16(a, b, c, x, y, z) emu_mfma<8>(a, b, c)
// bf16: 16x16x16 "_1k" (short x4 bit patterns, gfx942 and gfx950), 16x16x32 (__bf16 x8, gfx950)
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, x, y, z) emu_mfma<4>(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, x, y, z) emu_mfma<8>(a, b, c)

// v_perm_b32: result byte k = byte sel_k of {s0 : s1} (0-3 from s1, 4-7 from s0).
inline uint32_t emu_perm(uint32_t s0, uint32_t s1, uint32_t sel) {
  const uint64_t v = (static_cast<uint64_t>(s0) << 32) | s1;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((v >> (8 * ((sel >> (8 * k)) & 7))) & 0xff) << (8 * k);
  return r;
}
#define __builtin_amdgcn_perm(s0, s1, sel) emu_perm(s0, s1, sel)

// fp8 decode of the emulated arch: OCP e4m3fn (gfx950) or e4m3fnuz (gfx942).
inline float emu_fp8_decode(uint32_t byte) {
#if defined(__gfx950__)
  const int bias = 7;
#else
  const int bias = 8;
#endif
  const int s = (byte >> 7) & 1, e = (byte >> 3) & 15, m = byte & 7;
  const float mag = e == 0 ? std::ldexp(m / 8.f, 1 - bias) : std::ldexp(1.f + m / 8.f, e - bias);
  return s ? -mag : mag;
}
#define __builtin_amdgcn_cvt_f32_fp8(v, sel) emu_fp8_decode((static_cast<uint32_t>(v) >> (8 * (sel))) & 0xff)
