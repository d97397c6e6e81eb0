// NVIDIA sm_90 building blocks: async copies, ldmatrix, mma.sync, fp8 decode.
// Each wrapper is one PTX instruction (or a short fixed sequence) with its operand
// layout written down, so mla_decode.cuh reads as the algorithm.
#pragma once
#include "mlagen/platform.h"
#include <cuda_fp16.h>

#if !defined(MLAGEN_NVIDIA)
#error "sm90_ops.cuh is the NVIDIA path; AMD builds use their own ops header"
#endif

namespace mlagen::device::sm90 {

MLAGEN_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; when !pred nothing is read and the
// destination is zero-filled (src-size 0), so a short last tile holds zeros, not garbage.
MLAGEN_DEVICE void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
MLAGEN_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
MLAGEN_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Four 8x8 b16 matrices; lane L supplies the row address of matrix L/8, row L%8, and
// receives in r[i] row (L/4), b16 column (L%4) of matrix i. On fp8 rows of 16 bytes that
// is: 4 consecutive bytes (bytes 4*(L%4)..+3) of row L/4.
MLAGEN_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

MLAGEN_DEVICE uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// D(16x8,f32) += A(16x16,f16,row) * B(16x8,f16,col). With g = lane/4, t = lane%4:
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..+9]   a[3] = A[g+8][2t+8..+9]
//   b0 = B[2t..2t+1][g]     b1 = B[2t+8..2t+9][g]
//   d[0..1] = D[g][2t..2t+1]   d[2..3] = D[g+8][2t..2t+1]
MLAGEN_DEVICE void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fp8 e4m3 -> f16x2 decode, two ways (MLAGEN_FP8_DECODE picks; default 0):
//  0: cvt.rn.f16x2.e4m3x2 (F2FP), one instruction per two values, exact.
//  1: integer bit moves (SHF/LOP3) on the integer pipe, scaled by 2^-8: e4m3 s.eeee.mmm
//     becomes f16 s.0eeee.mmm0000000, i.e. the same value times 2^-8 (subnormals too).
//     kFp8DecodeScale undoes the factor on S and O in fp32.
// Both take a 32-bit word holding bytes [b3 b2 b1 b0] and return f16x2 pairs; "lo" is
// (b0, b1), "hi" is (b2, b3), first element in the low half.
#ifndef MLAGEN_FP8_DECODE
#define MLAGEN_FP8_DECODE 0
#endif
#if MLAGEN_FP8_DECODE == 0
constexpr float kFp8DecodeScale = 1.f;
MLAGEN_DEVICE uint32_t e4m3x2_to_f16x2(uint16_t v) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(v));
  return d;
}
MLAGEN_DEVICE uint32_t e4m3x2_lo_to_f16x2(uint32_t w) { return e4m3x2_to_f16x2(static_cast<uint16_t>(w)); }
MLAGEN_DEVICE uint32_t e4m3x2_hi_to_f16x2(uint32_t w) { return e4m3x2_to_f16x2(static_cast<uint16_t>(w >> 16)); }
#else
constexpr float kFp8DecodeScale = 256.f;
// y holds the two bytes at bits 15..8 and 31..24: keep the signs, move the rest down one.
MLAGEN_DEVICE uint32_t e4m3_hi_bytes_to_f16x2(uint32_t y) { return (y & 0x80008000u) | ((y >> 1) & 0x3f803f80u); }
MLAGEN_DEVICE uint32_t e4m3x2_lo_to_f16x2(uint32_t w) { return e4m3_hi_bytes_to_f16x2(__byte_perm(w, 0u, 0x1404)); }
MLAGEN_DEVICE uint32_t e4m3x2_hi_to_f16x2(uint32_t w) { return e4m3_hi_bytes_to_f16x2(__byte_perm(w, 0u, 0x3424)); }
#endif
#if defined(MLAGEN_EXP_NO_DECODE)  // cost experiment only: wrong results on purpose
#undef MLAGEN_FP8_DECODE
MLAGEN_DEVICE uint32_t exp_nodecode(uint32_t w) { return w; }
#define e4m3x2_lo_to_f16x2(w) exp_nodecode(w)
#define e4m3x2_hi_to_f16x2(w) exp_nodecode((w) >> 16)
#endif

// Byte select over {y,x}: result byte i = byte (sel >> 4i) & 7 of y:x.
MLAGEN_DEVICE uint32_t prmt(uint32_t x, uint32_t y, uint32_t sel) { return __byte_perm(x, y, sel); }

MLAGEN_DEVICE uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

MLAGEN_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90): a no-op when the launch did not opt in.
MLAGEN_DEVICE void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
MLAGEN_DEVICE void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace mlagen::device::sm90
