/* mlagen C ABI: MLA decode attention (DeepSeek absorbed form) over generated kernels.
 *
 * Plain C: raw pointers, element strides, a stream. No framework types cross this line.
 * A problem describes the math and the memory; where it runs (the stream) is an argument of
 * each launching call. Fill an mlagen_problem, call mlagen_decode(). Every function returns an
 * mlagen_status; on error mlagen_last_error() (thread-local) says what and why, naming the
 * field and the value it expected.
 */
#ifndef MLAGEN_H
#define MLAGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MLAGEN_API __attribute__((visibility("default")))
#else
#define MLAGEN_API
#endif

#define MLAGEN_ABI_VERSION 3  /* 3: the stream left mlagen_problem for the launch calls' arguments */

typedef enum {
  MLAGEN_OK = 0,
  MLAGEN_ERR_INVALID = 1,      /* a field is wrong: null pointer, size, stride, dtype */
  MLAGEN_ERR_UNSUPPORTED = 2,  /* valid request this build has no kernel for (prints the key) */
  MLAGEN_ERR_WORKSPACE = 3,    /* workspace missing or smaller than mlagen_workspace_bytes() */
  MLAGEN_ERR_DEVICE = 4,       /* the GPU runtime reported an error (launch, attribute, arch) */
  MLAGEN_ERR_INPUT_DATA = 5    /* found on the device: indptr contents disagree with the sizes */
} mlagen_status;

typedef enum {
  MLAGEN_DTYPE_BF16 = 1,
  MLAGEN_DTYPE_FP8E4M3FN = 2,   /* OCP e4m3 (NVIDIA, gfx950), max 448 */
  MLAGEN_DTYPE_FP8E4M3FNUZ = 3, /* gfx942 e4m3 fnuz, max 240 */
  MLAGEN_DTYPE_MXFP4 = 4,       /* fp4x2 E2M1 data + E8M0 scale per 32 values */
  MLAGEN_DTYPE_FP8 = 5          /* q only: the arch's fp8 flavour (e4m3fn; e4m3fnuz on gfx942) */
} mlagen_dtype;

/* Device-side input check results, OR-ed into the workspace's error word. */
#define MLAGEN_DEVERR_KV_INDPTR 1u  /* kv_indptr not monotonic / outside total_kv / not the uniform kv_len */
#define MLAGEN_DEVERR_QO_INDPTR 2u  /* qo_indptr[b+1]-qo_indptr[b] != q_len or outside total_q */

typedef struct {
  int32_t abi_version;       /* MLAGEN_ABI_VERSION */
  int32_t batch;             /* sequences */
  int32_t num_heads;         /* query heads: 16 */
  int32_t num_kv_heads;      /* 1 (MQA over the latent) */
  int32_t q_len;             /* queries per sequence: 1 */
  int32_t qk_dim;            /* 576 */
  int32_t v_dim;             /* 512 */
  int32_t kv_len;            /* every sequence's kv length when all are equal, else 0 */
  int64_t total_q;           /* rows of q and out */
  int64_t total_kv;          /* rows of kv */
  int32_t q_dtype;           /* mlagen_dtype */
  int32_t kv_dtype;          /* mlagen_dtype */
  float sm_scale;            /* softmax scale, 1/sqrt(576) */
  int32_t splits;            /* 0: the kernel's / runtime's choice; > 0: force (generic kernel) */
  int32_t force_generic;     /* nonzero: skip the specialized table */
  const void* q;             /* [total_q, num_heads, qk_dim], dims contiguous; bf16 or fp8 */
  int64_t q_stride_token;    /* elements */
  int64_t q_stride_head;     /* elements */
  const void* kv;            /* [total_kv, row] dims contiguous: fp8 576 bytes, bf16 576 elements,
                                mxfp4 288 bytes (two E2M1 a byte, low nibble = even dim) */
  int64_t kv_stride_token;   /* elements (bytes for fp8 and mxfp4, bf16 elements for bf16) */
  const void* kv_scale;      /* device pointer. fp8: one float32 (dequant = kv * scale).
                                mxfp4: E8M0 bytes [total_kv, kv_scale_stride], the first 18 of a
                                row used (2^(b-127) for dims 32k..32k+31), 16-byte aligned base.
                                bf16: unused (may be NULL). */
  const int32_t* qo_indptr;  /* device, batch+1 */
  const int32_t* kv_indptr;  /* device, batch+1 */
  void* out;                 /* [total_q, num_heads, v_dim] bf16 */
  int64_t out_stride_token;  /* elements */
  int64_t out_stride_head;   /* elements */
  void* workspace;           /* device, >= mlagen_workspace_bytes(); zeroed once when allocated */
  size_t workspace_bytes;
  const char* kernel_name;   /* NULL: dispatch; else run exactly this kernel (tests, tuning) */
  int64_t kv_scale_stride;   /* mxfp4: bytes between two tokens' scale rows, 18..32 (18 packed,
                                24 as padded quantizers return it); ignored otherwise */
  const float* q_scale;      /* fp8 q given quantized: device pointer, one float32 (dequant = q * scale) */
  int32_t q_from_bf16;       /* q_dtype fp8 only. 1: q holds bf16 and the library quantizes it per tensor
                                to fp8 on the device, the leaderboard reference's recipe (scale =
                                bf16(max|q| / fp8_max), q8 = fp8(clamp(bf16(q / scale)))); q_scale must be
                                NULL. 0: q holds fp8, q_scale its scale. */
  int32_t device;            /* the GPU the pointers live on; the launching calls make it current for
                                their duration (and restore the caller's). -1: the current device. */
} mlagen_problem;

typedef struct {
  const char* name;   /* the kernel's spec name, e.g. mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn */
  int32_t generic;    /* 1 when the runtime-shaped kernel serves the request */
  int32_t splits;     /* KV splits it runs with */
  int32_t block_n;    /* KV tokens per tile */
  int32_t stages;     /* pipeline depth */
  int32_t batch, kv_len, q_dtype, kv_dtype; /* the kernel's key (0 = any) */
  int32_t role;       /* 0 specialized, 1 the generic kernel, 2 a tuning candidate (by name only) */
} mlagen_kernel_info;

/* Validate and choose a kernel; no device work, usable without a GPU. */
MLAGEN_API mlagen_status mlagen_select(const mlagen_problem* p, mlagen_kernel_info* chosen);
/* Bytes of device workspace the chosen kernel needs (0 on invalid input). */
MLAGEN_API size_t mlagen_workspace_bytes(const mlagen_problem* p);
/* Validate, choose, launch on `stream` (cudaStream_t / hipStream_t; NULL = the device's default
 * stream). Asynchronous: no host-device synchronization. */
MLAGEN_API mlagen_status mlagen_decode(const mlagen_problem* p, mlagen_kernel_info* ran /* may be NULL */,
                                       void* stream);
/* Same with the per-call pointers passed apart from a prepared problem (cheap to call).
 * kv_scale is the format's scale pointer as in mlagen_problem; q_scale for fp8 q (else NULL). */
MLAGEN_API mlagen_status mlagen_decode_ptrs(const mlagen_problem* p, const void* q, const float* q_scale,
                                 const void* kv, const void* kv_scale, const int32_t* qo_indptr,
                                 const int32_t* kv_indptr, void* out, void* stream);
/* Read and clear the device-side error word in a workspace (synchronizes the stream). */
MLAGEN_API mlagen_status mlagen_take_device_errors(void* workspace, void* stream, uint32_t* errors);

MLAGEN_API const char* mlagen_last_error(void);
MLAGEN_API const char* mlagen_status_name(mlagen_status s);
MLAGEN_API int32_t mlagen_num_kernels(void);
MLAGEN_API mlagen_status mlagen_kernel_at(int32_t i, mlagen_kernel_info* info);
MLAGEN_API const char* mlagen_fingerprint(void);  /* hash of specs + templates + generator */
MLAGEN_API const char* mlagen_build_archs(void);  /* e.g. "sm90a" */
/* Checks that the current device is one this library has code for. */
MLAGEN_API mlagen_status mlagen_check_device(void);

#ifdef __cplusplus
}
#endif
#endif
