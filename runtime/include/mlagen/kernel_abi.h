// The kernels' argument layout, shared by the device code and the host's argument packer
// (runtime/src/launch.cpp): plain C++ types only, so that the host part of the library compiles
// without a GPU toolkit. Each generated code object also exports its LaunchInfo (below), which
// the build reads out of the object (tools/embed.py) and checks against this header.
#pragma once
#include <cstddef>
#include <cstdint>

// device compilers (and the AMD emulator): their vector types
#if defined(__CUDACC__) || defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)
#define MLAGEN_ABI_DEVICE_TYPES 1
#include "mlagen/platform.h"
#endif

namespace mlagen::device {

#if defined(MLAGEN_ABI_DEVICE_TYPES)
using MlPair = float2;
#else
struct alignas(8) MlPair {
  float x, y;
};
#endif

// Kernel parameters, passed by value. q / out strides are in elements, kv strides in bytes.
struct Params {
  const void* q;            // [total_q, num_heads, 576]: bf16, or fp8 (the arch's flavour) with q_scale
  int64_t q_stride_token, q_stride_head;
  const float* q_scale;     // fp8 q given quantized: one float32 on the device (dequant = q * scale)
  float* q_amax;            // fp8 q quantized here from bf16 q: per-block |q| maxima of the `<name>_amax` entry
  int32_t q_amax_parts;     //   (that many; 0 = not quantizing here)
  const uint8_t* kv;        // [total_kv, row]: fp8 576 B, bf16 1152 B or mxfp4 288 B a row
  int64_t kv_stride_bytes;
  const float* kv_scale;    // fp8 KV: one float32 on the device; null for bf16 / mxfp4
  const uint8_t* kv_scales; // mxfp4 KV: E8M0 [total_kv, >= 18], 16-byte aligned base; else null
  int64_t kv_scales_stride; // bytes between the scale rows of two tokens (18..32)
  const int32_t* qo_indptr;
  const int32_t* kv_indptr;
  uint16_t* out;            // bf16 [total_q, num_heads, 512]
  int64_t out_stride_token, out_stride_head;
  float* part_o;            // [batch, splits, row_groups, 16, 512] unnormalized split outputs
  MlPair* part_ml;         // [batch, splits, row_groups, 16] (running max, running sum)
  uint32_t* errors;         // device error word (MLAGEN_DEVERR_*)
  uint32_t* split_counters; // [batch, row_groups] split arrivals (kernels that merge their own splits, in launch or
                            //   last block): zero between calls
  float* lse;               // null, or float32 [total_q, num_heads] at lse_stride_token: ln sum_j exp(sm_scale q.k_j)
  int64_t lse_stride_token;
  // Paged KV (kv_rows.cuh): null page_table = contiguous rows at kv_indptr. Otherwise kv holds
  // num_pages pages of 2^page_shift rows, and sequence b's page list is either row b of a block
  // table (page_table + b * page_table_stride, page_table_width entries; lengths kv_lens[b], or
  // kv_indptr differences when kv_lens is null) or, with page_indptr, FlashInfer's form
  // (page_table[page_indptr[b] .. page_indptr[b+1]), last page holding last_page_len[b] rows).
  const int32_t* page_table;
  int64_t page_table_stride;
  int64_t page_table_len;   // entries of page_table (the indices form's bound)
  int32_t page_table_width; // block-table form: entries a sequence may use
  int32_t page_shift;       // log2 page size (0..8)
  int64_t num_pages;
  const int32_t* kv_lens;
  const int32_t* page_indptr;
  const int32_t* last_page_len;
  int32_t batch, splits;
  int32_t num_heads;        // 8..128
  int32_t q_len;            // query tokens a sequence (the generic kernel: at most, 1..4)
  int32_t row_groups;       // blocks of 16 query rows a sequence: ceil(q_len * num_heads / 16)
  int64_t total_q, total_kv;
  float sm_scale;
  int32_t merge_in_launch;  // 1: the grid was launched cooperatively with a merger block for each split
                            //   block, in rows after theirs (grid y doubled), which merge the partials (LaunchInfo
                            //   merge_in_launch; split_counters); no combine kernel follows
};

// The sm90a rows body's second kernel argument: the KV rows as two 2D tensor maps of bytes
// ([total_kv rows, the format's row bytes: fp8 576, bf16 1152], the rows' stride), each a
// CUtensorMap (cuda.h: 128 bytes, 128-byte aligned, opaque), encoded on the host per KV tensor:
// `main` boxes of 64 rows x 128 bytes with the 128-byte swizzle (one atom of the tile's nope dims),
// `rope` boxes of 32 rows x the rope bytes of a row (fp8: 64 bytes, the 64-byte swizzle; bf16: 128
// bytes, the 128-byte swizzle): the tile's own layout (mla_decode_sm90_rows.cuh RowsKv::Tile).
struct alignas(128) TensorMapBytes {  // CUDA 13: 128-byte aligned (12.x: 64)
  uint64_t opaque[16];
};
struct KvMapsAbi {
  TensorMapBytes main, rope;
  static constexpr int kMainBoxRows = 64, kMainBoxBytes = 128, kRopeBoxRows = 32, kRopeBoxBytes = 64;
  static constexpr int kRowBytesBf16 = 1152, kRopeBoxBytesBf16 = 128;  // a bf16 row; its rope box
  static constexpr int kRowBytesFp8 = 576;
  // The rows the bulk tensor copy reads as stored (fp8, bf16). A format the rows body expands on the
  // way in (mxfp4: its O threads read the packed rows into registers) takes no maps: zeros.
  static constexpr bool mapped(int row_bytes) { return row_bytes == kRowBytesFp8 || row_bytes == kRowBytesBf16; }
};

// What the host needs to launch one generated kernel, exported by its code object as the
// constant `<kernel name>_launch` (templates/kernel.hip.j2) and read from the object at build
// time (tools/embed.py), so the numbers are the device compiler's own. The code object's entry
// points are `<name>` (the decode), `<name>_q8` (the decode that quantizes a bf16 q to fp8 itself:
// fp8-q kernels), `<name>_amax` (that q's per-tensor maximum, launched before it) and
// `<name>_combine` (the split merge, unless the decode merges its own splits).
struct LaunchInfo {
  uint32_t magic;           // kLaunchInfoMagic
  int32_t version;          // kLaunchInfoVersion
  int32_t threads, smem_bytes;        // the decode's block and dynamic shared memory
  int32_t q8_threads, q8_smem_bytes;  // <name>_q8's (0: no such entry: a bf16-q kernel)
  int32_t rows_per_block;   // query rows a decode block owns (16, or 32 / 64: the rows body)
  int32_t fused_combine;    // 1: the decode merges its own splits (no <name>_combine)
  int32_t rows_body;        // 1: the decode takes KvMapsAbi as its second argument (sm90a)
  int32_t params_bytes;     // sizeof(Params) as the device compiler laid it out
  int32_t maps_bytes;       // sizeof(KvMapsAbi) likewise (0: no maps argument)
  int32_t combine_threads;  // <name>_combine's largest block (one block a query row: kCombineThreads)
  int32_t amax_threads;     // <name>_amax's block
  int32_t merge_in_launch;  // 1: the decode merges its splits in its launch (merger blocks) when launched cooperatively
                            //   (Params::merge_in_launch); its <name>_combine runs otherwise
};
constexpr uint32_t kLaunchInfoMagic = 0x4c414c4du;  // "MLAL"
constexpr int32_t kLaunchInfoVersion = 2;
constexpr int kAmaxThreads = 256;
// The combine: one block a query row, 128 threads x 4 dims a split group; G groups (1..4) share the
// row's splits (group g merges splits g, g + G, ..., kCombineSplitsInFlight of them in flight a
// round) and the block merges the groups' states at the end: a row of 32 splits is one L2 round
// trip, not four (a row is a chain of them). combine_groups: the most a row's splits use; the host
// launches fewer where the grid would not be resident at once (launch.cpp).
constexpr int kCombineGroupThreads = 128, kCombineMaxGroups = 4, kCombineSplitsInFlight = 8;
constexpr int kCombineThreads = kCombineGroupThreads * kCombineMaxGroups;  // the largest block (launch bounds)
constexpr int combine_groups(int splits) {
  const int g = (splits + kCombineSplitsInFlight - 1) / kCombineSplitsInFlight;
  return g < 1 ? 1 : g > kCombineMaxGroups ? kCombineMaxGroups : g;
}
// The fp8-q pre-pass: its blocks at most, and the workspace byte offset of their maxima (inside
// the workspace's reserved first 1 KB: mlagen/internal.h WorkspaceLayout).
constexpr int kQAmaxParts = 240;
constexpr int kQAmaxOffset = 64;

// The layout both sides must agree on (x86-64 hosts, amdgcn and nvptx devices: LP64, natural
// alignment); a change of Params changes these numbers on purpose.
static_assert(sizeof(Params) == 288, "Params changed: update kernel_abi.h's pinned size (host and device pack it)");
static_assert(alignof(Params) == 8, "Params: 8-byte aligned");
static_assert(sizeof(KvMapsAbi) == 256 && alignof(KvMapsAbi) == 128, "KvMapsAbi: two CUtensorMaps");
static_assert(sizeof(LaunchInfo) == 56, "LaunchInfo: 14 32-bit fields");

}  // namespace mlagen::device
