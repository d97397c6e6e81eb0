// NVIDIA sm_90 building blocks: async copies, shared-memory access, fp8 conversions, wgmma,
// mbarriers and bulk tensor copies. Each wrapper is one PTX instruction (or a short fixed
// sequence) with its operand layout written down, so the bodies read as the algorithm.
#pragma once
#include "mlagen/platform.h"
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#if !defined(MLAGEN_NVIDIA)
#error "sm90_ops.cuh is the NVIDIA path; AMD builds use their own ops header"
#endif

namespace mlagen::device::sm90 {

MLAGEN_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy that bypasses L1; when !pred nothing is read and the
// destination is zero-filled (src-size 0), so a short last tile holds zeros, not garbage.
// cp.async of `bytes` (0..16) source bytes into a 16-byte destination, the rest zero-filled.
MLAGEN_DEVICE void cp_async_16_partial(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
MLAGEN_DEVICE void cp_async_16(uint32_t dst, const void* src, bool pred) { cp_async_16_partial(dst, src, pred ? 16 : 0); }
// All 16 bytes (no source-size operand).
MLAGEN_DEVICE void cp_async_16_full(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// 4-byte global -> shared copy (through L1: .cg takes 16 bytes only); zero-filled when !pred.
MLAGEN_DEVICE void cp_async_4(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0) : "memory");
}
// An arrive on `bar` once every cp.async this thread issued before it has landed (.noinc: the
// arrival counts against the barrier's expected count, set at init).
MLAGEN_DEVICE void cp_async_mbarrier_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
MLAGEN_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
MLAGEN_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// fp8 e4m3 x2 -> f16x2 (cvt.rn.f16x2.e4m3x2: one instruction, exact), x in the low byte.
MLAGEN_DEVICE uint32_t e4m3x2_f2fp(uint16_t v) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(v));
  return d;
}

// Two e4m3 bytes (x in the low byte) -> fp32, exact.
MLAGEN_DEVICE float2 e4m3x2_to_float2(uint16_t v) {
  const uint32_t h = e4m3x2_f2fp(v);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}
// Four e4m3 bytes [b3 b2 b1 b0] -> fp32 (b0, b1, b2, b3), exact (the fp8 query).
MLAGEN_DEVICE float4 fp8x4_to_float4(uint32_t w) {
  const float2 a = e4m3x2_to_float2(static_cast<uint16_t>(w)), b = e4m3x2_to_float2(static_cast<uint16_t>(w >> 16));
  return make_float4(a.x, a.y, b.x, b.y);
}

MLAGEN_DEVICE uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

MLAGEN_DEVICE uint32_t pack_bf16x2_rn(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// The copy form of prmt under the name both vendors' ops headers give it.
MLAGEN_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) { return __byte_perm(x, y, sel); }

// prmt.b32 in its default mode: a selector nibble 0-7 copies that byte of {y:x}; 8-15 fills
// the result byte with the sign (bit 7) of byte (nibble & 7). (__byte_perm documents only the
// copy form, so the sign-replicating uses go through the instruction itself.)
MLAGEN_DEVICE uint32_t prmt(uint32_t x, uint32_t y, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(x), "r"(y), "r"(sel));
  return d;
}

MLAGEN_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90): a no-op when the launch did not opt in.
MLAGEN_DEVICE void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
MLAGEN_DEVICE void wait_for_prior_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// A word other blocks of the grid update (the in-launch split merge's counters). A waiter polls
// it relaxed and fences once it has seen the count: acquire, so its later reads see what was
// released before the arrivals it saw. An arrival is one release reduction (cumulative over the
// writes a block barrier ordered before it).
MLAGEN_DEVICE uint32_t load_relaxed_gpu(const uint32_t* at) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(at) : "memory");
  return v;
}
MLAGEN_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
MLAGEN_DEVICE void red_release_gpu_add(uint32_t* at, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(at), "r"(v) : "memory");
}


// ---- Warpgroup MMA (sm_90a only) ---------------------------------------------------------
// wgmma runs on a warpgroup (4 warps, 128 threads); every call below must be reached by
// all 128 threads together. Operands in shared memory are described by a 64-bit matrix
// descriptor; this code uses the no-swizzle ("interleaved") K-major layout only:
//   a core matrix is 8 rows x 16 bytes, stored as 128 contiguous bytes (row r at 16 r);
//   LBO = bytes between core matrices that are neighbours along K,
//   SBO = bytes between core matrices that are neighbours along M (A) / N (B).
// Accumulator fragment of m64nN (f32), warp w of the warpgroup, g = lane/4, t = lane%4:
//   d[4j + 2r + e] = D[16w + g + 8r][8j + 2t + e]      (j < N/8, r, e in {0, 1})
// Register A fragment of m64nNk32 (8-bit types): a[2v + r] holds the 4 bytes
//   A[16w + g + 8r][16v + 4t .. 16v + 4t + 3]           (v, r in {0, 1}; byte i = k + i)
// Swizzled K-major layouts (what cp.async fills efficiently, see mla_decode_sm90_wgmma.cuh):
// rows of 128 (or 64) bytes, 8-row atoms of 1024 (512) bytes, the 16-byte chunk index of a
// row XORed with bits 7-9 (7-8) of its shared address; SBO = bytes between 8-row groups,
// LBO unused. Atoms must start 1024-byte aligned (base offset field 0).
enum class WgmmaSwizzle : uint32_t { kNone = 0, k128B = 1, k64B = 2, k32B = 3 };
MLAGEN_DEVICE uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo,
                                  WgmmaSwizzle swizzle = WgmmaSwizzle::kNone) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (static_cast<uint64_t>(swizzle) << 62);
}
// The descriptor of the same matrix `bytes` further on (start address field; no carry:
// shared addresses are below 256 KB).
MLAGEN_DEVICE uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLAGEN_WGMMA_UNAVAILABLE 1  // wgmma needs sm_90a: the calls below trap elsewhere
#endif

MLAGEN_DEVICE void wgmma_fence() {
#if !defined(MLAGEN_WGMMA_UNAVAILABLE)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
MLAGEN_DEVICE void wgmma_commit() {
#if !defined(MLAGEN_WGMMA_UNAVAILABLE)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
MLAGEN_DEVICE void wgmma_wait() {
#if !defined(MLAGEN_WGMMA_UNAVAILABLE)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes generic-proxy writes to shared memory (st.shared, cp.async) visible to the async
// proxy that wgmma reads operands through; then a barrier orders them for the other threads.
MLAGEN_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator (or register A fragment) reads / writes across
// the wgmma calls.
template <int N>
MLAGEN_DEVICE void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
MLAGEN_DEVICE void wgmma_fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The wgmma wrappers (generated from the table in codegen/wgmma.py: name, shape, types, where A
// comes from, how D starts). Besides the layouts above:
// Register A fragment of m64nNk16 (16-bit types), warp w: a[0] = A[16w + g][2t..2t+1],
//   a[1] = A[16w + g + 8][2t..2t+1], a[2] = A[16w + g][2t+8..2t+9], a[3] = A[16w + g + 8][2t+8..2t+9]
//   (low half = lower k).
// M-major A ("_mn": the descriptor describes A^T, a matrix of 16 rows along K, each 64 M-contiguous
//   values; 128B swizzle): 8-row atoms of 1024 bytes along K (SBO between them), 64 values of M in
//   a 128-byte row, LBO between 64-value groups of M. N-major B ("_nb") is the same layout along N.
#include "wgmma_ops.inc"

// mbarriers in shared memory (sm_90): init by one thread (then a barrier), arrive, and wait for
// the completion of the phase with the given parity.
MLAGEN_DEVICE void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
MLAGEN_DEVICE void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
MLAGEN_DEVICE void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
MLAGEN_DEVICE void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// The bulk tensor copy (TMA): an arrive on `bar` that also expects `bytes` more bytes to land on it
// (the phase completes when the arrivals and the bytes are all in).
MLAGEN_DEVICE void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One box of a 2D tensor map (`map`: a CUtensorMap in parameter space, __grid_constant__) at
// element coordinates (x, y) into shared memory at `dst` (the map's swizzle applied), landing on `bar`.
MLAGEN_DEVICE void tma_load_2d(uint32_t dst, const void* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar) : "memory");
}
// Warpgroup register budgets (every thread of the warpgroup together; N a multiple of 8).
template <int N>
MLAGEN_DEVICE void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
MLAGEN_DEVICE void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// A barrier for `threads` threads of the block (a multiple of 32) on hardware barrier `id`
// (1..15; 0 is __syncthreads'): one warpgroup waits for its own warps only.
MLAGEN_DEVICE void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// A named barrier that also ORs a predicate over the threads that meet at it.
MLAGEN_DEVICE bool named_barrier_or(int id, int threads, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %3, 0;\nbar.red.or.pred q, %1, %2, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r) : "r"(id), "r"(threads), "r"(static_cast<uint32_t>(pred)) : "memory");
  return r != 0;
}

// fp32 -> e4m3 (round to nearest even, saturating to +-448): two values -> bytes [x y].
MLAGEN_DEVICE uint16_t pack_e4m3x2(float x, float y) {
  uint16_t v;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(v) : "f"(y), "f"(x));
  return v;
}
MLAGEN_DEVICE void sts8(uint32_t addr, uint32_t v) { asm volatile("st.shared.u8 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
// Four 8 x 8 b16 matrices from the mma fragment layout (thread 4 g + t: row g, columns 2 t, 2 t + 1),
// each stored transposed: lane 8 i + q gives the address of stored row q of matrix i, whose 8
// elements are the fragment's column q.
MLAGEN_DEVICE void stmatrix_x4_trans(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b),
               "r"(c), "r"(d) : "memory");
}
// The same, each stored as it is (lane 8 i + q: the address of stored row q of matrix i, the
// fragment's row q).
MLAGEN_DEVICE void stmatrix_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c),
               "r"(d) : "memory");
}
// Four 8 x 8 b16 matrices into the mma fragment layout (thread 4 g + t of matrix i: row g, columns
// 2 t, 2 t + 1 in register i): lane 8 i + q gives the address of row q of matrix i (16 bytes).
MLAGEN_DEVICE void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
MLAGEN_DEVICE void sts32(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }
MLAGEN_DEVICE void sts128(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
MLAGEN_DEVICE uint32_t lds8(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
MLAGEN_DEVICE uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
MLAGEN_DEVICE uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
MLAGEN_DEVICE uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// 8 E2M1 values (w, low nibble = even index) -> 8 e4m3 bytes (lo: values 0..3, hi: 4..7)
// through an 8-entry table of the magnitude codes' e4m3 bytes (t0: codes 0..3, t1: 4..7),
// which carries the block's power of two. The sign bits are spread by prmt's sign replication
// (bit 3 of a nibble is bit 7 of the byte of w << 4). ~1.1 instructions a value.
MLAGEN_DEVICE void e2m1x8_to_e4m3(uint32_t w, uint32_t t0, uint32_t t1, uint32_t& lo, uint32_t& hi) {
  const uint32_t w4 = w << 4, m = w & 0x77777777u;
  lo = prmt(t0, t1, m & 0xffffu) | (prmt(w, w4, 0x9D8Cu) & 0x80808080u);
  hi = prmt(t0, t1, m >> 16) | (prmt(w, w4, 0xBFAEu) & 0x80808080u);
}

// 8 E2M1 values (w, low nibble = even index) -> 4 bf16x2 words (values 2k, 2k + 1 in word k)
// through a block's 8-entry tables of the magnitude codes' bf16 bytes, which carry its power of
// two (tab.x / tab.y: the high bytes of codes 0..3 / 4..7; tab.z / tab.w: their low bytes): the two
// bytes of 4 values by two prmt each, the signs into the high bytes as e2m1x8_to_e4m3 spreads them,
// the bytes paired by two more. ~1.9 instructions a value (mxfp4x8_to_bf16's float path: ~5.5).
MLAGEN_DEVICE void e2m1x8_to_bf16(uint32_t w, uint4 tab, uint32_t (&o)[4]) {
  const uint32_t w4 = w << 4, m = w & 0x77777777u;
  const uint32_t h_lo = prmt(tab.x, tab.y, m & 0xffffu) | (prmt(w, w4, 0x9D8Cu) & 0x80808080u);
  const uint32_t h_hi = prmt(tab.x, tab.y, m >> 16) | (prmt(w, w4, 0xBFAEu) & 0x80808080u);
  const uint32_t l_lo = prmt(tab.z, tab.w, m & 0xffffu), l_hi = prmt(tab.z, tab.w, m >> 16);
  o[0] = prmt(l_lo, h_lo, 0x5140u);
  o[1] = prmt(l_lo, h_lo, 0x7362u);
  o[2] = prmt(l_hi, h_hi, 0x5140u);
  o[3] = prmt(l_hi, h_hi, 0x7362u);
}

}  // namespace mlagen::device::sm90
