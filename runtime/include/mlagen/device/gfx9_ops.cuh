// AMD CDNA3/CDNA4 (gfx942 = MI300X, gfx950 = MI355X) building blocks: MFMA, fp8 decode,
// byte permutes. Wavefronts are 64 lanes (MLAGEN_WARP_SIZE). MFMA 16x16 operand layouts,
// lane l = i + 16*j (i = l%16, j = l/16):
//   16x16x16 f16:  A[i][4j..4j+3]   B[4j..4j+3][i]   C/D[4j+r][i], r = 0..3
//   16x16x32 f16:  A[i][8j..8j+7]   B[8j..8j+7][i]   C/D[4j+r][i]            (gfx950)
//   16x16x16 bf16: A[i][4j..4j+3]   B[4j..4j+3][i]   C/D[4j+r][i]   (v_mfma_f32_16x16x16_bf16,
//                  the "_1k" builtin: 4 bf16 a lane, passed as a short x4 of bf16 bit patterns)
//   16x16x32 bf16: A[i][8j..8j+7]   B[8j..8j+7][i]   C/D[4j+r][i]   (gfx950; __bf16 x8 operands)
#pragma once
#include "mlagen/platform.h"

#if !defined(MLAGEN_AMD)
#error "gfx9_ops.cuh is the AMD path"
#endif

namespace mlagen::device::gfx9 {

typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 f16x8 __attribute__((ext_vector_type(8)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short bf16x4 __attribute__((ext_vector_type(4)));  // 4 bf16 bit patterns (element 0 lowest)
typedef short bf16x8_bits __attribute__((ext_vector_type(8)));
typedef __bf16 bf16x8 __attribute__((ext_vector_type(8)));
typedef __bf16 bf16x2 __attribute__((ext_vector_type(2)));
typedef float f32x2 __attribute__((ext_vector_type(2)));

// LDS a workgroup may use. The host pass (no arch macro) takes the smaller limit.
#if defined(__gfx950__)
constexpr int kLdsBytes = 160 * 1024;
#else
constexpr int kLdsBytes = 64 * 1024;
#endif

// The fp8 decode below is exact (every e4m3 value is an f16): no correction factor.
constexpr float kKDecodeScale = 1.f;
constexpr float kVDecodeScale = 1.f;

MLAGEN_DEVICE float fast_exp2(float x) { return __builtin_exp2f(x); }
// No programmatic dependent launch on AMD: the combine kernel is stream-ordered.
MLAGEN_DEVICE void allow_dependent_launch() {}
MLAGEN_DEVICE void wait_for_prior_grid() {}

// PTX prmt semantics (result byte k = byte sel_k of {y:x}, 0-3 from x, 4-7 from y, one
// selector NIBBLE a byte) on v_perm_b32, whose operands come the other way round and whose
// selector has one BYTE a result byte: 0x5140 (prmt) is 0x05010400 (v_perm).
constexpr uint32_t vperm_selector(uint32_t prmt_sel) {
  return ((prmt_sel & 0x7u) << 0) | (((prmt_sel >> 4) & 0x7u) << 8) | (((prmt_sel >> 8) & 0x7u) << 16) |
         (((prmt_sel >> 12) & 0x7u) << 24);
}
static_assert(vperm_selector(0x5140) == 0x05010400u, "selector conversion");
MLAGEN_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_perm(y, x, vperm_selector(sel));
#else
  return 0;
#endif
}

// Four fp8 bytes [b3 b2 b1 b0] -> f16 (b0, b1, b2, b3). __builtin_amdgcn_cvt_f32_fp8
// decodes the arch's fp8 flavour: e4m3fnuz on gfx942, OCP e4m3fn on gfx950; the catalog
// pairs each arch with its flavour. f32 -> f16 is exact for every fp8 value.
MLAGEN_DEVICE f16x4 fp8x4_to_f16x4(uint32_t w) {
#if defined(__HIP_DEVICE_COMPILE__)
  const int v = static_cast<int>(w);
  f16x4 r = {static_cast<_Float16>(__builtin_amdgcn_cvt_f32_fp8(v, 0)),
             static_cast<_Float16>(__builtin_amdgcn_cvt_f32_fp8(v, 1)),
             static_cast<_Float16>(__builtin_amdgcn_cvt_f32_fp8(v, 2)),
             static_cast<_Float16>(__builtin_amdgcn_cvt_f32_fp8(v, 3))};
  return r;
#else
  (void)w;
  return f16x4{};
#endif
}

// Four fp8 bytes -> fp32, exact (the fp8 query).
MLAGEN_DEVICE float4 fp8x4_to_float4(uint32_t w) {
#if defined(__HIP_DEVICE_COMPILE__)
  const int v = static_cast<int>(w);
  return make_float4(__builtin_amdgcn_cvt_f32_fp8(v, 0), __builtin_amdgcn_cvt_f32_fp8(v, 1),
                     __builtin_amdgcn_cvt_f32_fp8(v, 2), __builtin_amdgcn_cvt_f32_fp8(v, 3));
#else
  (void)w;
  return make_float4(0.f, 0.f, 0.f, 0.f);
#endif
}

MLAGEN_DEVICE f16x4 f32x4_to_f16x4(float a, float b, float c, float d) {
  f16x4 r = {static_cast<_Float16>(a), static_cast<_Float16>(b), static_cast<_Float16>(c),
             static_cast<_Float16>(d)};
  return r;
}

// Two fp32 -> bf16x2 (lo in the low half), round to nearest even, NaN stays NaN: one
// v_cvt_pk_bf16_f32 on gfx950, a few integer ops on gfx942 (the compiler's fptrunc).
MLAGEN_DEVICE uint32_t pack_bf16x2_rn(float lo, float hi) {
  return __builtin_bit_cast(uint32_t, __builtin_convertvector((f32x2{lo, hi}), bf16x2));
}

// Two words of bf16 pairs (lo = elements 0, 1) as one bf16 MFMA operand of 4.
MLAGEN_DEVICE bf16x4 bf16x4_of(uint32_t lo, uint32_t hi) {
  return __builtin_bit_cast(bf16x4, (static_cast<uint64_t>(hi) << 32) | lo);
}

MLAGEN_DEVICE bf16x4 f32x4_to_bf16x4(float a, float b, float c, float d) {
  return bf16x4_of(pack_bf16x2_rn(a, b), pack_bf16x2_rn(c, d));
}

// D += A B over k = 16, one MFMA per operand type (f16x4 and bf16x4 are distinct types):
//   v_mfma_f32_16x16x16_f16 / v_mfma_f32_16x16x16_bf16.
MLAGEN_DEVICE void mfma_k16(f32x4& d, f16x4 a, f16x4 b) {
#if defined(__HIP_DEVICE_COMPILE__)
  d = __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, d, 0, 0, 0);
#endif
}
MLAGEN_DEVICE void mfma_k16(f32x4& d, bf16x4 a, bf16x4 b) {
#if defined(__HIP_DEVICE_COMPILE__)
  d = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, d, 0, 0, 0);
#endif
}

#if defined(__gfx950__)
// gfx950's k = 32 MFMAs, operands given as two k = 16 halves.
MLAGEN_DEVICE void mfma_k32_native(f32x4& d, f16x4 a_lo, f16x4 a_hi, f16x4 b_lo, f16x4 b_hi) {
  const f16x8 a = __builtin_shufflevector(a_lo, a_hi, 0, 1, 2, 3, 4, 5, 6, 7);
  const f16x8 b = __builtin_shufflevector(b_lo, b_hi, 0, 1, 2, 3, 4, 5, 6, 7);
  d = __builtin_amdgcn_mfma_f32_16x16x32_f16(a, b, d, 0, 0, 0);
}
MLAGEN_DEVICE void mfma_k32_native(f32x4& d, bf16x4 a_lo, bf16x4 a_hi, bf16x4 b_lo, bf16x4 b_hi) {
  const bf16x8_bits a = __builtin_shufflevector(a_lo, a_hi, 0, 1, 2, 3, 4, 5, 6, 7);
  const bf16x8_bits b = __builtin_shufflevector(b_lo, b_hi, 0, 1, 2, 3, 4, 5, 6, 7);
  d = __builtin_amdgcn_mfma_f32_16x16x32_bf16(__builtin_bit_cast(bf16x8, a), __builtin_bit_cast(bf16x8, b), d, 0, 0,
                                              0);
}
#endif

// D += A B over k = 32 given as two k = 16 halves (slot 8j+e, e < 4, is the low half's
// slot 4j+e; e >= 4 the high half's 4j+e-4), f16 or bf16 operands: one
// v_mfma_f32_16x16x32_{f16,bf16} on gfx950, two 16x16x16 on gfx942. Both sum the same 32
// products.
template <class V>
MLAGEN_DEVICE void mfma_k32(f32x4& d, V a_lo, V a_hi, V b_lo, V b_hi) {
#if defined(__gfx950__)
  mfma_k32_native(d, a_lo, a_hi, b_lo, b_hi);
#else
  mfma_k16(d, a_lo, b_lo);
  mfma_k16(d, a_hi, b_hi);
#endif
}

// ---- gfx950's native fp8 datapath (mla_decode_gfx950_fp8.cuh) ----------------------------
// Operand layouts (lane l = i + 16 j), the same M/N/D map as the 16x16 forms above:
//   v_mfma_f32_16x16x128_f8f6f4 (fp8 x fp8, no block scale): A[i][32j..32j+31] (8 dwords,
//       byte e = k 32j + e), B[32j..32j+31][i], C/D[4j+r][i]. 32 cycles (8 passes).
//   v_mfma_f32_16x16x32_fp8_fp8: A[i][8j..8j+7] (2 dwords), B[8j..8j+7][i], C/D[4j+r][i].
//       16 cycles: half the fp8 rate of the x128 form.
// Which k a lane's byte e stands for matters to neither kernel nor emulator: A and B use the
// same slot -> k map, so D = sum over slots of A_slot * B_slot whatever the map is.
typedef int i32x8 __attribute__((ext_vector_type(8)));
typedef __attribute__((address_space(3))) void lds_void;

#if defined(__gfx950__)
MLAGEN_DEVICE void mfma_fp8_k128(f32x4& d, i32x8 a, i32x8 b) {
  // format 0 (e4m3) for A and B; scale operands 0 select the unscaled encoding
  d = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(a, b, d, 0, 0, 0, 0, 0, 0);
}
MLAGEN_DEVICE void mfma_fp8_k32(f32x4& d, uint64_t a, uint64_t b) {
  d = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(static_cast<long>(a), static_cast<long>(b), d, 0, 0, 0);
}
// Four fp32 -> four OCP e4m3 bytes (element 0 lowest), round to nearest even: two
// v_cvt_pk_fp8_f32. The callers keep |x| <= 448.
MLAGEN_DEVICE uint32_t pack_fp8x4(float a, float b, float c, float d) {
  int w = __builtin_amdgcn_cvt_pk_fp8_f32(a, b, 0, false);
  w = __builtin_amdgcn_cvt_pk_fp8_f32(c, d, w, true);
  return static_cast<uint32_t>(w);
}
// 16 bytes from global memory straight into LDS (global_load_lds_dwordx4): lane l's bytes
// land at lds + 16 l; `lds` must be wave-uniform. Counted by vmcnt like a load.
MLAGEN_DEVICE void lds_dma16(const void* src, uint8_t* lds) {
  __builtin_amdgcn_global_load_lds(src, (lds_void*)lds, 16, /*offset=*/0, /*aux=*/0);
}
// Wait until at most n of this wave's vector memory operations are outstanding (gfx9
// s_waitcnt encoding: vmcnt in [3:0] and [15:14]; expcnt and lgkmcnt left at their maxima).
template <int n>
MLAGEN_DEVICE void wait_vmcnt() {
  static_assert(n >= 0 && n < 64, "vmcnt is 6 bits");
  __builtin_amdgcn_s_waitcnt((n & 15) | ((n >> 4) << 14) | (7 << 4) | (15 << 8));
}
MLAGEN_DEVICE bool wave_any(bool pred) { return __builtin_amdgcn_ballot_w64(pred) != 0; }
#endif

MLAGEN_DEVICE uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The online softmax's first step on S^T fragments in the 16x16 accumulator layout (s[mt]:
// 4 tokens of query row i in lane (i, j)): scales them (into the log2 domain), sets the tokens
// at or past `valid` to -inf, and returns row i's max over the tile in every lane of the row
// (the 4 lane groups j). token(mt, r): the tile token s[mt][r] holds in this lane (the bodies
// order their K rows differently).
template <int MT, class Token>
MLAGEN_DEVICE float scaled_masked_max(f32x4 (&s)[MT], float scale, int valid, Token token) {
  float mx = -INFINITY;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float v = token(mt, r) < valid ? s[mt][r] * scale : -INFINITY;
      s[mt][r] = v;
      mx = fmaxf(mx, v);
    }
  mx = fmaxf(mx, __shfl_xor(mx, 16));
  mx = fmaxf(mx, __shfl_xor(mx, 32));
  return mx;
}

// 4x4 transpose of 16-bit elements: w[r] holds elements 0..3 of row r (element 0 in the low
// half of w[r].x); out[u] = element u of rows 0..3, row 0 lowest.
MLAGEN_DEVICE void transpose4x4_b16(const uint2 (&w)[4], bf16x4 (&out)[4]) {
  out[0] = bf16x4_of(byte_perm(w[0].x, w[1].x, 0x5410), byte_perm(w[2].x, w[3].x, 0x5410));
  out[1] = bf16x4_of(byte_perm(w[0].x, w[1].x, 0x7632), byte_perm(w[2].x, w[3].x, 0x7632));
  out[2] = bf16x4_of(byte_perm(w[0].y, w[1].y, 0x5410), byte_perm(w[2].y, w[3].y, 0x5410));
  out[3] = bf16x4_of(byte_perm(w[0].y, w[1].y, 0x7632), byte_perm(w[2].y, w[3].y, 0x7632));
}

}  // namespace mlagen::device::gfx9
