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
inline thread_local emu_dim3 threadIdx, blockIdx, gridDim, blockDim;

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
inline uint32_t atomicAdd(uint32_t* p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

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
  float a[64][32], b[64][32];  // MFMA operands as exact fp32 (every f16 / bf16 / fp8 is one)
  uint64_t ballot;
};
struct EmuBlock {
  std::barrier<>* bar = nullptr;
  EmuWave wave[8];
  uint32_t any[3] = {0u, 0u, 0u};  // __syncthreads_or's words (see there)
};
inline EmuBlock* emu_block = nullptr;
inline thread_local int emu_lane = 0, emu_wave = 0;
inline thread_local unsigned emu_or_calls = 0;  // this thread's __syncthreads_or calls in its block (the launcher resets it a block)

inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }

// A block barrier that returns whether any thread's predicate was nonzero. One barrier a call,
// three words in rotation: call k ORs into word k % 3, and thread 0 clears word (k + 1) % 3
// (call k + 1's) before the barrier. That word was last read in call k - 2, by threads that
// all arrived at call k - 1's barrier since, which thread 0 has passed; and call k + 1's ORs
// come after this call's barrier, so after the clear. (Two words would let a fast thread OR
// into the next call's word before a slow thread 0 cleared it, or clear it under a reader.)
inline int __syncthreads_or(int predicate) {
  EmuBlock& b = *emu_block;
  const unsigned k = emu_or_calls++;
  if (predicate) __atomic_fetch_or(&b.any[k % 3], 1u, __ATOMIC_SEQ_CST);
  if (threadIdx.x == 0) __atomic_store_n(&b.any[(k + 1) % 3], 0u, __ATOMIC_SEQ_CST);
  b.bar->arrive_and_wait();
  return static_cast<int>(__atomic_load_n(&b.any[k % 3], __ATOMIC_SEQ_CST));
}

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

// D(16x16) += A(16xK) B(Kx16) once every lane of the wave has deposited its operands (as
// exact fp32) in w.a / w.b: lane l = i + 16 j holds A[i][E*j .. E*j+E-1], B[E*j .. E*j+E-1][i]
// and D[4j + r][i] (E = K / 4 elements a lane); products and sums in fp32.
template <int E>
emu_f32x4 emu_mfma_product(EmuWave& w, emu_f32x4 c) {
  w.bar->arrive_and_wait();
  const int i = emu_lane & 15, j = emu_lane >> 4;
  emu_f32x4 d = c;
  for (int r = 0; r < 4; ++r) {
    const int row = 4 * j + r, col = i;
    float acc = 0.f;
    for (int k = 0; k < 4 * E; ++k) acc += w.a[row + 16 * (k / E)][k % E] * w.b[col + 16 * (k / E)][k % E];
    d[r] += acc;
  }
  w.bar->arrive_and_wait();
  return d;
}

// The f16 and bf16 MFMAs: each lane's E elements as fp32, then emu_mfma_product's map.
template <int E, class VA>
emu_f32x4 emu_mfma(VA a, VA b, emu_f32x4 c) {
  EmuWave& w = emu_block->wave[emu_wave];
  for (int e = 0; e < E; ++e) {
    w.a[emu_lane][e] = emu_elem(a[e]);
    w.b[emu_lane][e] = emu_elem(b[e]);
  }
  return emu_mfma_product<E>(w, c);
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

// ---- gfx950's native fp8 datapath ----------------------------------------------------------
// Operand layouts from AMD's CDNA3/CDNA4 ISA guides ("dependent on the block size, K is split
// across the 4 lane groups"): for every 16x16 MFMA lane l = i + 16 j holds A[i][E j .. E j + E-1],
// B[E j .. E j + E-1][i] and D[4 j + r][i], E = K / 4 elements a lane: E = 32 bytes for
// 16x16x128 f8f6f4, 8 for 16x16x32 fp8. The order of the E elements within a lane is
// immaterial here: A and B share it, and D sums over all of them.
inline float emu_fp8_byte(uint8_t c) {  // an MFMA operand byte: the NaN codes are NaN
#if defined(__gfx950__)
  if ((c & 0x7f) == 0x7f) return NAN;
#else
  if (c == 0x80) return NAN;
#endif
  return emu_fp8_decode(c);
}
template <int E, class VA, class VB>
emu_f32x4 emu_mfma_fp8(VA a, VB b, emu_f32x4 c) {
  EmuWave& w = emu_block->wave[emu_wave];
  uint8_t ab[E], bb[E];
  std::memcpy(ab, &a, E);
  std::memcpy(bb, &b, E);
  for (int e = 0; e < E; ++e) {
    w.a[emu_lane][e] = emu_fp8_byte(ab[e]);
    w.b[emu_lane][e] = emu_fp8_byte(bb[e]);
  }
  return emu_mfma_product<E>(w, c);
}
// format 0/0 (e4m3 x e4m3), scales 0: the unscaled product the kernel asks for (other
// operands are not emulated and abort)
#define __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, c, fa, fb, oa, sa, ob, sb) \
  (((fa) | (fb) | (sa) | (sb)) ? (std::abort(), c) : emu_mfma_fp8<32>(a, b, c))
#define __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, x, y, z) emu_mfma_fp8<8>(a, b, c)

// v_cvt_pk_fp8_f32 (gfx950, OCP e4m3fn): two fp32 -> two bytes, round to nearest even, into
// the low (hi = false) or high half of `old`. Out of range (|x| > 448, where the kernel
// promises never to go) or NaN gives the NaN code, so a kernel that overflows shows it.
inline uint32_t emu_fp8_encode_rne(float x) {
  if (!(std::fabs(x) <= 448.f)) return 0x7f;
  int best = 0;
  float err = INFINITY;
  for (int c = 0; c < 128; ++c) {  // magnitudes; 0x7f is NaN
    if (c == 0x7f) continue;
    const float e = std::fabs(emu_fp8_decode(c) - std::fabs(x));
    if (e < err || (e == err && (c & 1) == 0)) err = e, best = c;
  }
  return static_cast<uint32_t>(best) | (std::signbit(x) ? 0x80u : 0u);
}
inline int emu_cvt_pk_fp8(float a, float b, int old, bool hi) {
  const uint32_t pk = emu_fp8_encode_rne(a) | (emu_fp8_encode_rne(b) << 8);
  const uint32_t o = static_cast<uint32_t>(old);
  return static_cast<int>(hi ? (o & 0xffffu) | (pk << 16) : (o & 0xffff0000u) | pk);
}
#define __builtin_amdgcn_cvt_pk_fp8_f32(a, b, old, hi) emu_cvt_pk_fp8(a, b, old, hi)

// global_load_lds_dwordx4: lane l's 16 bytes land at lds + offset + 16 l: the LDS-direct
// loads place data by lane id times the transfer size from an M0 base (AMD's CDNA3 ISA guide,
// LDS-direct global/buffer loads), not at a per-lane LDS address.
// Done at once here: the emulator checks where the bytes go, not when. A wave's lanes are
// threads here, so s_waitcnt (the point after which the wave may read what its DMAs wrote)
// is a wave barrier: every lane's copies are done before any lane reads.
inline void emu_lds_dma(const void* src, void* lds, unsigned size, int offset) {
  if (size != 16) std::abort();
  std::memcpy(static_cast<uint8_t*>(lds) + offset + 16 * emu_lane, static_cast<const uint8_t*>(src) + offset, 16);
}
#define __builtin_amdgcn_global_load_lds(src, lds, size, offset, aux) \
  emu_lds_dma((const void*)(src), (void*)(lds), size, offset)
inline void emu_waitcnt() { emu_block->wave[emu_wave].bar->arrive_and_wait(); }
#define __builtin_amdgcn_s_waitcnt(x) ((void)(x), emu_waitcnt())

inline uint64_t emu_ballot(bool pred) {
  EmuWave& w = emu_block->wave[emu_wave];
  if (emu_lane == 0) w.ballot = 0;
  w.bar->arrive_and_wait();
  if (pred) __atomic_fetch_or(&w.ballot, uint64_t{1} << emu_lane, __ATOMIC_SEQ_CST);
  w.bar->arrive_and_wait();
  const uint64_t r = w.ballot;
  w.bar->arrive_and_wait();
  return r;
}
#define __builtin_amdgcn_ballot_w64(pred) emu_ballot(pred)
#define __builtin_amdgcn_readfirstlane(x) (x)
