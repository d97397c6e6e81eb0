// Column reductions over the sm90 warpgroup bodies' accumulator tiles. S^T (and O^T) of a
// 64-token tile put tokens on M and the 16 query rows on N: warp w holds tokens 16 w + g and
// 16 w + g + 8 (g = lane / 4) of the columns head[k] = 8 (k / 2) + 2 t + k % 2 (t = lane % 4,
// slot k = 0..3). A column's max or sum over the tile's tokens takes the warp's 8 row lanes
// (shuffles across g), then its 4 warps (shared memory: `red`, [4][kGroupRows] floats, one barrier).
// The 16-row warpgroup body uses them (mla_decode_sm90_wgmma.cuh decode_wgmma, every KV format; the
// rows body its column map, wg_column), and what that body's format policies share (WgRefill).
#pragma once
#include "mlagen/device/mla_common.cuh"

#if defined(MLAGEN_NVIDIA)
namespace mlagen::device {

constexpr int kWgWarps = 4;

// Where decode_wgmma's tile loop refills the ring (a format policy's kRefill), tile it + kAhead
// into the slot a tile frees: right after the loop's barrier (kOnLanded: the slot of tile it - 1),
// while the tensor cores run S (kDuringScores: the same slot), or once O is done with tile it's
// own slot, behind a barrier (kAfterO).
enum class WgRefill { kOnLanded, kDuringScores, kAfterO };

// The N column (query row) of a thread's accumulator slot k: slot k of lane (g, t) holds columns
// 8 (k / 2) + 2 t + k % 2 of an m64nN wgmma accumulator (k < N / 4; the 16-row bodies use k < 4).
MLAGEN_DEVICE constexpr int wg_column(int k, int t) { return 8 * (k / 2) + 2 * t + k % 2; }

// v[k] becomes op over the values of column head[k] that every thread of the block holding the
// column brings (its own in): the warp's 8 row lanes by shuffles, then the 4 warps through `red`
// behind one barrier. Every thread of the block calls it; red is free again at the next barrier.
template <class Op>
MLAGEN_DEVICE void wg_column_reduce(float (&v)[4], const int (&head)[4], float* red, int w, int g, Op op) {
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int o2 = 4; o2 < 32; o2 *= 2) v[k] = op(v[k], __shfl_xor(v[k], o2));
  if (g == 0)
#pragma unroll
    for (int k = 0; k < 4; ++k) red[w * kGroupRows + head[k]] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float acc = red[head[k]];
#pragma unroll
    for (int ww = 1; ww < kWgWarps; ++ww) acc = op(acc, red[ww * kGroupRows + head[k]]);
    v[k] = acc;
  }
}

// tm[k]: the max of column head[k] over the tile, from x[r][k] (the thread's tokens g + 8 r).
MLAGEN_DEVICE void wg_column_max(const float (&x)[2][4], const int (&head)[4], float* red, int w, int g,
                                 float (&tm)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) tm[k] = fmaxf(x[0][k], x[1][k]);
  wg_column_reduce(tm, head, red, w, g, [](float a, float b) { return fmaxf(a, b); });
}

// v[k] becomes the sum of column head[k]'s partials (the thread's own partial in, the column's
// total out).
MLAGEN_DEVICE void wg_column_sum(float (&v)[4], const int (&head)[4], float* red, int w, int g) {
  wg_column_reduce(v, head, red, w, g, [](float a, float b) { return a + b; });
}

}  // namespace mlagen::device
#endif  // MLAGEN_NVIDIA
