// Problem sizes as the kernels see them: compile-time (a generated specialization) or
// read at run time from kv_indptr / qo_indptr (the generic kernel). Both validate what
// they read and flag disagreement in the workspace's error word instead of computing a
// silently wrong answer: a flagged sequence's output is NaN.
#pragma once
#include "mlagen/platform.h"
#if defined(MLAGEN_NVIDIA)
#include <cuda_bf16.h>
#endif

namespace mlagen::device {

constexpr int kHeads = 16;
constexpr int kQkDim = 576;
constexpr int kVDim = 512;

// Kernel parameters, passed by value. q / out strides are in elements, kv strides in bytes.
struct Params {
  const void* q;            // [total_q, 16, 576]: bf16, or fp8 (the arch's flavour) with q_scale
  int64_t q_stride_token, q_stride_head;
  const float* q_scale;     // fp8 q given quantized: one float32 on the device (dequant = q * scale)
  float* q_amax;            // fp8 q quantized here from bf16 q: per-block |q| maxima of q_amax_kernel
  int32_t q_amax_parts;     //   (that many; 0 = not quantizing here)
  const uint8_t* kv;        // [total_kv, row]: fp8 576 B, bf16 1152 B or mxfp4 288 B a row
  int64_t kv_stride_bytes;
  const float* kv_scale;    // fp8 KV: one float32 on the device; null for bf16 / mxfp4
  const uint8_t* kv_scales; // mxfp4 KV: E8M0 [total_kv, >= 18], 16-byte aligned base; else null
  int64_t kv_scales_stride; // bytes between the scale rows of two tokens (18..32)
  const int32_t* qo_indptr;
  const int32_t* kv_indptr;
  uint16_t* out;            // bf16 [total_q, 16, 512]
  int64_t out_stride_token, out_stride_head;
  float* part_o;            // [batch, splits, 16, 512] unnormalized split outputs
  float2* part_ml;          // [batch, splits, 16] (running max, running sum)
  uint32_t* errors;         // device error word (MLAGEN_DEVERR_*)
  uint32_t* split_counters; // [batch] split arrivals (kernels that merge their own splits); zero between calls
  int32_t batch, splits;
  int64_t total_q, total_kv;
  float sm_scale;
};

struct Sequence {
  int64_t kv_begin;  // first KV row
  int len;           // KV rows
  int64_t q_row;     // row of q / out
  bool bad;          // indptr disagreed: output NaN
};

MLAGEN_DEVICE float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
MLAGEN_DEVICE float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
MLAGEN_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
#if defined(MLAGEN_NVIDIA)
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
#else
  auto rne = [](float f) -> uint32_t {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // NaN stays NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  };
  return rne(lo) | (rne(hi) << 16);
#endif
}

MLAGEN_DEVICE void flag_error(const Params& p, uint32_t code) { atomicOr(p.errors, code); }

// The per-tensor KV scale the fp8 path folds into S and O (null for bf16 / mxfp4: mxfp4
// scales are applied while dequantizing, bf16 has none). The decode and combine kernels
// both read it here.
MLAGEN_DEVICE float kv_scale_of(const Params& p) { return p.kv_scale ? *p.kv_scale : 1.f; }

// A generated specialization: every sequence has kKvLen tokens, one query row each.
template <int kBatch, int kKvLen, int kSplits>
struct StaticShape {
  static constexpr bool kGeneric = false;
  MLAGEN_DEVICE static int splits(const Params&) { return kSplits; }
  MLAGEN_DEVICE static int64_t q_row(const Params&, int b) { return b; }
  MLAGEN_DEVICE static Sequence sequence(const Params& p, int b) {
    const int32_t kb = p.kv_indptr[b], ke = p.kv_indptr[b + 1];
    const int32_t qb = p.qo_indptr[b], qe = p.qo_indptr[b + 1];
    const bool bad_kv = kb != b * kKvLen || ke != (b + 1) * kKvLen;
    const bool bad_q = qb != b || qe != b + 1;
    if ((bad_kv || bad_q) && threadIdx.x == 0 && blockIdx.x == 0)
      flag_error(p, (bad_kv ? 1u : 0u) | (bad_q ? 2u : 0u));
    return Sequence{static_cast<int64_t>(b) * kKvLen, kKvLen, b, bad_kv || bad_q};
  }
};

// The generic kernel: lengths from kv_indptr, any batch, splits chosen by the runtime.
struct DynamicShape {
  static constexpr bool kGeneric = true;
  MLAGEN_DEVICE static int splits(const Params& p) { return p.splits; }
  MLAGEN_DEVICE static int64_t q_row(const Params& p, int b) {
    const int32_t qb = p.qo_indptr[b];
    return (qb >= 0 && qb < p.total_q) ? qb : 0;
  }
  MLAGEN_DEVICE static Sequence sequence(const Params& p, int b) {
    const int32_t kb = p.kv_indptr[b], ke = p.kv_indptr[b + 1];
    const int32_t qb = p.qo_indptr[b], qe = p.qo_indptr[b + 1];
    const bool bad_kv = kb < 0 || ke < kb || ke > p.total_kv;
    const bool bad_q = qe - qb != 1 || qb < 0 || qb >= p.total_q;
    if ((bad_kv || bad_q) && threadIdx.x == 0 && blockIdx.x == 0)
      flag_error(p, (bad_kv ? 1u : 0u) | (bad_q ? 2u : 0u));
    return Sequence{bad_kv ? 0 : kb, bad_kv ? 0 : ke - kb, bad_q ? (qb >= 0 && qb < p.total_q ? qb : 0) : qb,
                    bad_kv || bad_q};
  }
};

}  // namespace mlagen::device
