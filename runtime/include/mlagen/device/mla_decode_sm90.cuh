// MLA decode attention on NVIDIA sm_90a: the kernels' entry blocks, the 16-row body's tiling
// type and its split merge inside the launch.
//
// Per sequence b: its query rows (q_len tokens x num_heads heads, shapes.cuh QueryRows)
// attend over the sequence's KV rows (one shared 576-dim latent row per token; K = all 576
// dims, V = the first 512), causal among the query tokens:
//     out[row] = softmax(q[row] K^T * sm_scale) V      (512 a row)
// Work split: grid (splits x row groups, batch); block (s, b) streams its share of the sequence's
// tokens in tiles of 64 through a ring of stages in shared memory, each tile read from global
// memory once for both products. Two bodies, the KV format a policy of each (formats.cuh):
//   16 rows a block   decode_wgmma (mla_decode_sm90_wgmma.cuh): one warpgroup, wgmma with the
//                     tile's tokens as M; fp8 and mxfp4 KV through e4m3 (WgE4m3Kv), bf16 as
//                     stored (WgBf16Kv, mla_decode_sm90_wgmma_bf16.cuh). Tiling below.
//   32 / 64 rows      decode_rows (mla_decode_sm90_rows.cuh): three warp-specialized warpgroups
//                     and bulk tensor copies, a tile read once for all the rows; RowsTiling.
// With one split a block writes the bf16 output; otherwise an unnormalized partial (O, running
// max m, running sum l) that the combine kernel (mla_common.cuh) or the in-launch merge below
// merges.
#pragma once
#include "mlagen/device/formats.cuh"
#include "mlagen/device/mla_decode_sm90_wgmma.cuh"
#include "mlagen/device/mla_decode_sm90_rows.cuh"

#if defined(MLAGEN_NVIDIA)
#include "facts.inc"  // generated (codegen/facts.py): MLAGEN_MAX_SPLITS, the in-launch merge's staging bound
namespace mlagen::device {

// A 16-row kernel (codegen's Tiling<body, block_n, stages, kv, q>): the warpgroup body, its tiles of
// 64 tokens in kStages stages, and the layout its format policy lays the block's shared memory out
// by (Wg: WgTileLayout). The generator names the body; the tiling states what it takes.
template <Body kBody_, int kBlockN_, int kStages_, KvFormat kKv_, QFormat kQ_>
struct Tiling {
  static constexpr Body kBody = kBody_;  // named by the generator (codegen/spec.py KernelSpec.body)
  static_assert(kBody == Body::kSm90Wgmma, "the NVIDIA 16-row body is the warpgroup one (the rows body: RowsTiling)");
  using Wg = WgTileLayout<kStages_, kKv_>;
  static_assert(kBlockN_ == Wg::kBlockN, "the warpgroup body walks KV in tiles of 64 (codegen/spec.py WARPGROUP_BLOCK_N)");
  static constexpr int kBlockN = kBlockN_, kStages = kStages_;
  static constexpr KvFormat kKv = kKv_;
  static constexpr QFormat kQ = kQ_;
  template <QFormat Q>
  using WithQ = Tiling<kBody_, kBlockN_, kStages_, kKv_, Q>;  // the same kernel for another q route
  static constexpr bool kWide = false;
  static constexpr float kVUnit = 1.f;  // partial O is in KV units (the combine applies the KV scale)
  static constexpr int kThreads = Wg::kThreads;
  static constexpr int kSmemBytes = Wg::kSmemBytes;
  static constexpr int kMinBlocksPerSm = kSmemBytes <= 110 * 1024 ? 2 : 1;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over sm_90's 227 KB a block: fewer stages");
};

// The split merge inside the decode launch (Params::merge_in_launch; LaunchInfo merge_in_launch).
// The host sets it only for a grid it launches cooperatively, every block resident at once, with
// twice the decode's rows of blocks: blocks y < batch decode (block_coord), and each block of the
// rows after them is a merger, (slice, row group) of sequence y - batch, that waits for its row
// group's splits and merges a 1/S slice of the group's 16 rows x 512 dims (every split's partial
// of those dims, as the combine kernel does a row). The mergers come after every decode block in
// the grid's order, so the block scheduler places the decode blocks first. A decode block arrives
// on its group's counter once its partials are written and is done: no split waits for a sibling
// (a design where the split blocks merged themselves waited for the slowest split). The
// count reaches 2S only after every merger of the group has seen S, and that last departure sets
// it back to 0 for the next launch on the workspace (one stream at a time).
// The slice's partials (S x 2048 / S float4, whatever S: 32 KB) and the row group's S x 16 (m, l)
// are staged in the merger's shared memory by cp.async in one go: one L2 round trip, not one a
// split group and piece (a loop of loads merged as they came was latency-bound).
// Ordering (as a cooperative grid barrier does it): the decode block's partial writes, the
// barrier, thread 0's release arrival (cumulative); the merger's relaxed polls of the count, its
// acquire fence, the barrier, its copies (.cg: past L1). Inlined: a call took Params by value onto a
// 288-byte stack, whose every field the merge then read back through L1 (3-5 us more).
constexpr int kMergeCols = kVDim / 4;                   // float4 pieces a row
constexpr int kMergePieces = kGroupRows * kMergeCols;   // a row group's
constexpr int kMergeSmemBytes = (kMergePieces + MLAGEN_MAX_SPLITS) * 16 + MLAGEN_MAX_SPLITS * kGroupRows * 8;

// The counter of block (b, group)'s splits in the workspace.
template <class Shape>
MLAGEN_DEVICE uint32_t* merge_counter(const Params& p, int b, int group) {
  return p.split_counters + static_cast<int64_t>(b) * Shape::row_groups(p) + group;
}

// A decode block's arrival: its partials are written (every thread's, ordered by the barrier).
template <class Shape>
MLAGEN_DEVICE void split_arrive(const Params& p) {
  const BlockCoord bc = block_coord<Shape>(p);
  __syncthreads();  // every thread's partial writes issued
  if (threadIdx.x == 0) red_release_gpu_add(merge_counter<Shape>(p, bc.b, bc.group), 1u);
}

// A merger block: y - batch is its sequence, x = slice x row groups + group (block_coord's order).
template <class T, class Shape>
MLAGEN_DEVICE void merge_block(const Params& p, uint8_t* smem) {
  static_assert(T::kSmemBytes >= kMergeSmemBytes + 128, "the in-launch merge stages a slice in the body's shared memory");
  const int splits = Shape::splits(p), groups = Shape::row_groups(p);
  const int m = static_cast<int>(blockIdx.x);
  const BlockCoord bc{static_cast<int>(blockIdx.y - gridDim.y / 2), m / groups, m % groups};  // .split: the slice
  uint32_t* const counter = merge_counter<Shape>(p, bc.b, bc.group);
  if (threadIdx.x == 0) {
    while (load_relaxed_gpu(counter) < static_cast<uint32_t>(splits)) continue;  // one thread a merger polls
    fence_acq_rel_gpu();  // acquire: the splits' partials, released before their arrivals
  }
  __syncthreads();
  const QueryTokens qt = Shape::query(p, bc.b);
  const QueryRows qr = query_rows<Shape>(p, BlockCoord{bc.b, 0, bc.group}, qt.row, qt.n, 0);  // split 0's rows
  const int64_t stride = static_cast<int64_t>(groups) * kGroupRows;                          // part rows a split
  const int begin = bc.split * kMergePieces / splits, n = (bc.split + 1) * kMergePieces / splits - begin;
  float4* const o_s = reinterpret_cast<float4*>(smem);                      // [split][n] this slice's pieces
  float2* const ml_s = reinterpret_cast<float2*>(smem + (kMergePieces + MLAGEN_MAX_SPLITS) * 16);  // [split][16 rows]
  for (int i = threadIdx.x; i < splits * n; i += T::kThreads) {
    const int sp = i / n, piece = begin + i % n;
    const int64_t row = qr.part(piece / kMergeCols) + sp * stride;
    cp_async_16_full(smem_addr(o_s + i), p.part_o + row * kVDim + 4 * (piece % kMergeCols));
  }
  for (int i = threadIdx.x; i < splits * (kGroupRows / 2); i += T::kThreads) {  // 16 bytes: two rows' (m, l)
    const int sp = i / (kGroupRows / 2), r = 2 * (i % (kGroupRows / 2));
    cp_async_16_full(smem_addr(ml_s + sp * kGroupRows + r), p.part_ml + qr.part(r) + sp * stride);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(counter, 1u) == 2u * splits - 1u) atomicExch(counter, 0u);  // staged: depart
  const float o_scale = merge_o_scale<T>(p);
  for (int k = threadIdx.x; k < n; k += T::kThreads) {
    const int j = (begin + k) / kMergeCols, dim = 4 * ((begin + k) % kMergeCols);
    if (!qr.owns(j)) continue;  // a padding row
    SplitMerge mg;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp = 0; sp < splits; ++sp) mg.add(ml_s[sp * kGroupRows + j], o_s[sp * n + k], acc);  // no tokens: weight 0
    const float a4[4] = {acc.x, acc.y, acc.z, acc.w};
    store_merged(p, mg, o_scale, qr.token(j), qr.head(j), dim, a4, dim == 0);
  }
}

// A decode block (entry.cuh: a code object's `<name>` entry, __launch_bounds__(kThreads,
// kMinBlocksPerSm)). Split, it leaves its partials to the combine kernel or to its row group's
// mergers in the same launch (merge_block).
template <class T, class Shape>
MLAGEN_DEVICE void mla_decode_block(const Params& p) {
  extern __shared__ __align__(128) uint8_t smem[];
  static_assert(!RowsBody<T>::value, "the rows body is mla_decode_rows_block (it takes the KV tensor maps too)");
  static_assert(T::kBody == Body::kSm90Wgmma, "the 16-row NVIDIA body");
  const bool in_launch = Shape::splits(p) > 1 && p.merge_in_launch;
  if (in_launch && blockIdx.y >= gridDim.y / 2) {
    merge_block<T, Shape>(p, smem);
    return;
  }
  decode_wgmma<T, Shape>(p, smem);
  if (in_launch) split_arrive<Shape>(p);
}

// The rows body's block: the KV tensor maps stay in parameter space (the entry's
// __grid_constant__ argument), where the bulk tensor copy reads them.
template <class T, class Shape>
MLAGEN_DEVICE void mla_decode_rows_block(const Params& p, const KvMaps& maps) {
  extern __shared__ __align__(128) uint8_t smem[];
  decode_rows<T, Shape>(p, maps, smem);
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
