/* mlagen C ABI: MLA decode attention (DeepSeek absorbed form) over generated kernels.
 *
 * Plain C: raw pointers, element strides, a stream. No framework types cross this line.
 * A problem describes the math and the memory; where it runs (the stream) is an argument of
 * each launching call. Fill an mlagen_problem, make a plan once (mlagen_plan: validation, kernel
 * choice and workspace size happen there), then mlagen_run() per call with that call's pointers
 * (it only checks them and launches). mlagen_decode() does both in one call. Every function returns an
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

#define MLAGEN_ABI_VERSION 5  /* 4: paged KV, LSE output, mlagen_plan / mlagen_run; 5: query rows (8..128
                                 heads, q_len 1..4, causal), mlagen_kernel_info.num_heads / q_len */

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
#define MLAGEN_DEVERR_QO_INDPTR 2u  /* qo_indptr[b+1]-qo_indptr[b] not q_len (a specialized kernel) / not 1..q_len
                                       (the generic kernel), or outside total_q */
#define MLAGEN_DEVERR_PAGE_TABLE 4u /* paged: a page id outside [0, num_pages), or a page list / length that
                                       does not fit the table (negative, past its width, last page 0 or > size) */

typedef struct {
  int32_t abi_version;       /* MLAGEN_ABI_VERSION */
  int32_t batch;             /* sequences */
  int32_t num_heads;         /* query heads: 8, 16, 32, 64 or 128 */
  int32_t num_kv_heads;      /* 1 (MQA over the latent) */
  int32_t q_len;             /* query tokens a sequence, 1..4 (the most; fewer per qo_indptr: the generic
                                kernel); causal: token i of n sees the first kv_len - n + 1 + i rows */
  int32_t qk_dim;            /* 576 */
  int32_t v_dim;             /* 512 */
  int32_t kv_len;            /* every sequence's kv length when all are equal, else 0 */
  int64_t total_q;           /* token rows of q and out: batch..batch*q_len */
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
  /* ---- paged KV (page_size > 0). kv then holds the cache: total_kv = num_pages * page_size rows at
     kv_stride_token, page g = rows g*page_size ... A sequence's page list is one of two forms:
       block table (vLLM, FlashMLA): page_table [batch, page_table_stride] int32, row b holding
         sequence b's pages in order (page_table_width used entries at most); its length is
         kv_lens[b] (or kv_indptr[b+1]-kv_indptr[b] when kv_lens is NULL);
       page indices (FlashInfer): page_table = kv_indices, page_indptr (batch+1) the offsets of each
         sequence's pages in it, last_page_len[b] the rows of its last page (1..page_size).
     Pages may come in any order and be shared between sequences. A bad page id or list is found on
     the device: never read, the sequence's output NaN, MLAGEN_DEVERR_PAGE_TABLE in the error word. */
  int32_t page_size;            /* 0: contiguous rows at kv_indptr; else a power of two 1..256 */
  int32_t page_table_width;     /* block table: entries a row may use (max pages a sequence) */
  int64_t page_table_stride;    /* block table: entries between two rows (>= width) */
  int64_t page_table_len;       /* entries page_table holds (bounds the indices form's offsets) */
  const int32_t* page_table;    /* device int32: the block table, or FlashInfer's kv_indices */
  const int32_t* kv_lens;       /* block table: device int32 [batch] lengths; NULL: from kv_indptr */
  const int32_t* page_indptr;   /* indices form: device int32 [batch+1]; NULL: block-table form */
  const int32_t* last_page_len; /* indices form: device int32 [batch] */
  /* ---- log-sum-exp output: lse[t][h] = ln sum_j exp(sm_scale * q[t][h] . k_j) (natural log of the
     scaled scores, FlashAttention / FlashMLA convention; -inf for an empty sequence, NaN when flagged) */
  float* lse;                   /* NULL: not written; else device float32 [total_q, num_heads] */
  int64_t lse_stride_token;     /* elements between two tokens' rows (>= num_heads; heads contiguous) */
} mlagen_problem;

typedef struct {
  const char* name;   /* the kernel's spec name, e.g. mla_decode_sm90a_b32_kv8192_s8_qbf16_kvfp8e4m3fn */
  int32_t generic;    /* 1 when the runtime-shaped kernel serves the request */
  int32_t splits;     /* KV splits it runs with */
  int32_t block_n;    /* KV tokens per tile */
  int32_t stages;     /* pipeline depth */
  int32_t batch, kv_len, q_dtype, kv_dtype; /* the kernel's key (0 = any) */
  int32_t page_size;  /* specialized: the page size it reads (0 contiguous); generic: 0 (any, at run time) */
  int32_t role;       /* 0 specialized, 1 the generic kernel, 2 a tuning candidate (by name only), 3 a generic
                         rows-body kernel (taken instead of 1 when num_heads x q_len is a multiple of its
                         block_m, 64 or 32; the larger first) */
  int32_t num_heads, q_len; /* specialized: the query rows it serves; generic: 16, 1 (any, at run time) */
} mlagen_kernel_info;

/* Validate and choose a kernel; no device work, usable without a GPU. */
MLAGEN_API mlagen_status mlagen_select(const mlagen_problem* p, mlagen_kernel_info* chosen);
/* Bytes of device workspace the chosen kernel needs (0 on invalid input). */
MLAGEN_API size_t mlagen_workspace_bytes(const mlagen_problem* p);
/* Validate, choose, launch on `stream` (cudaStream_t / hipStream_t; NULL = the device's default
 * stream). Asynchronous: no host-device synchronization. */
MLAGEN_API mlagen_status mlagen_decode(const mlagen_problem* p, mlagen_kernel_info* ran /* may be NULL */,
                                       void* stream);

/* A plan: a problem validated once, its kernel chosen and its workspace sized. The problem's
 * pointers at plan time only say which inputs the calls will pass (non-NULL = given; their values
 * are not kept); each mlagen_run passes that call's pointers. A plan is immutable: any number of
 * threads may run it at once, each with its own workspace. */
typedef struct mlagen_plan_s mlagen_plan_t;
typedef struct {
  const void* q;
  const float* q_scale;
  const void* kv;
  const void* kv_scale;
  const int32_t* qo_indptr;
  const int32_t* kv_indptr;
  const int32_t* page_table;
  const int32_t* kv_lens;
  const int32_t* page_indptr;
  const int32_t* last_page_len;
  void* out;
  float* lse;
  void* workspace;              /* >= the plan's workspace bytes, 256-byte aligned, zeroed once */
} mlagen_args;
MLAGEN_API mlagen_status mlagen_plan(const mlagen_problem* p, mlagen_plan_t** plan);
MLAGEN_API mlagen_status mlagen_plan_info(const mlagen_plan_t* plan, mlagen_kernel_info* info, size_t* workspace_bytes);
/* Checks the call's pointers against the plan (presence, alignment) and launches on `stream`. */
MLAGEN_API mlagen_status mlagen_run(const mlagen_plan_t* plan, const mlagen_args* args, void* stream);
MLAGEN_API void mlagen_plan_destroy(mlagen_plan_t* plan);
/* Read and clear the device-side error word in a workspace (synchronizes the stream). */
MLAGEN_API mlagen_status mlagen_take_device_errors(void* workspace, void* stream, uint32_t* errors);

MLAGEN_API const char* mlagen_last_error(void);
MLAGEN_API const char* mlagen_status_name(mlagen_status s);
MLAGEN_API int32_t mlagen_num_kernels(void);
MLAGEN_API mlagen_status mlagen_kernel_at(int32_t i, mlagen_kernel_info* info);
MLAGEN_API const char* mlagen_fingerprint(void);  /* hash of specs + templates + generator */
MLAGEN_API const char* mlagen_build_archs(void);  /* e.g. "sm90a" */
/* Checks that the current device is one this library has code for (and loads its code there). */
MLAGEN_API mlagen_status mlagen_check_device(void);

/* ---- code objects. The kernels are GPU code objects (an sm_90a cubin; a gfx950 / gfx942 hsaco, code
   object v5) embedded in this library, loaded per device on first use through the GPU runtime the
   process already has: the CUDA driver (libcuda.so.1) or the HIP runtime (libamdhip64.so.*, e.g.
   torch's own copy), found among the loaded objects or else by name, its module API resolved once.
   The library links no GPU runtime. Each object holds one generated kernel's entry points. */
typedef struct {
  const char* name;   /* the kernel's spec name (mlagen_kernel_info.name) */
  const void* data;   /* the object's bytes (an ELF file), inside this library */
  size_t size;
} mlagen_code_object;
MLAGEN_API int32_t mlagen_num_code_objects(void);
MLAGEN_API mlagen_status mlagen_code_object_at(int32_t i, mlagen_code_object* out);
/* Every entry point the library may launch, with the arguments the host packs for it (by value, in
   order; offsets follow each argument's alignment): what each code object's own metadata must declare. */
typedef struct {
  const char* name;        /* the entry's symbol, e.g. <kernel>_combine */
  int32_t code_object;     /* index for mlagen_code_object_at */
  int32_t num_args;
  int32_t arg_bytes[2];
  int32_t arg_align[2];
  int32_t threads;         /* block size it is launched with (the combine: at most; it takes
                              128 threads a group of 8 splits, up to 4 groups) */
  int32_t smem_bytes;      /* dynamic shared memory it is launched with */
} mlagen_entry_point;
MLAGEN_API int32_t mlagen_num_entry_points(void);
MLAGEN_API mlagen_status mlagen_entry_point_at(int32_t i, mlagen_entry_point* out);
/* Loads every code object on `device` (-1: the current one) now instead of at each kernel's first
   launch, looking up each entry point: a GPU or runtime that cannot take them fails here. */
MLAGEN_API mlagen_status mlagen_load_kernels(int32_t device);
/* The GPU runtime library the loader resolved (its path), or "" before the first GPU call. */
MLAGEN_API const char* mlagen_gpu_runtime(void);

/* How a split decode's partials are merged, process-wide (read at each launch):
   MLAGEN_MERGE_COMBINE (the default): a combine kernel after the decode, launched as its dependent
     grid (it starts during the decode's tail): the least device time.
   MLAGEN_MERGE_IN_LAUNCH: where the kernel can (the sm90a 16-row bodies) and its whole grid, with
     as many merger blocks as split blocks, is resident at once, the decode is launched cooperatively
     and its merger blocks merge each row group's partials once its splits have arrived: one launch a
     call instead of two, so less host time a call (about one launch's; docs/perf.md has the device
     time). The combine kernel elsewhere.
   mlagen_set_split_merge refuses any other value (MLAGEN_ERR_INVALID, naming it). */
typedef enum { MLAGEN_MERGE_COMBINE = 0, MLAGEN_MERGE_IN_LAUNCH = 1 } mlagen_split_merge;
MLAGEN_API mlagen_status mlagen_set_split_merge(int32_t mode);
MLAGEN_API int32_t mlagen_get_split_merge(void);

#ifdef __cplusplus
}
#endif
#endif
