"""Does an L2 eviction policy on the streamed bytes lower the floor of the leaderboard timing?

The leaderboard's flush (`zero_()` of a large buffer) leaves the L2 full of dirty lines; a
timed call that streams new bytes first writes those back (docs/perf.md v6: 6-8 us on a
151 MB read). Triton's `eviction_policy` is an L1 priority, so floor.py could not test the L2
one. This compiles (torch.utils.cpp_extension.load_inline) a 16-byte streaming reader in
three variants and times each the leaderboard's way, from a CUDA graph:
  cg           ld.global.cg.v4
  l2_first     ld.global.L2::cache_hint.v4 with createpolicy.fractional.L2::evict_first 1.0
  l1na_l2first the same with .L1::no_allocate
and, as the diagnostic floor.py also takes, the cg variant after a flush that leaves the L2
clean. `python bench/floor_l2.py [--shapes 4x8192,32x8192] [--out FILE]`"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from bench import Timer  # noqa: E402
from floor import CleanFlushTimer, graph_of  # noqa: E402

SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
template <int kPol>
__global__ void __launch_bounds__(256) stream_read(const int4* __restrict__ x, long long n16, int* out) {
  constexpr int kUnroll = 8;
  unsigned long long pol = 0;
  if (kPol > 0) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  const long long i0 = (long long)blockIdx.x * blockDim.x * kUnroll + threadIdx.x;
  int4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const long long j = i0 + (long long)u * blockDim.x;
    v[u] = make_int4(0, 0, 0, 0);
    if (j < n16) {
      const int4* p = x + j;
      if (kPol == 0) {
        v[u] = __ldcg(p);
      } else if (kPol == 1) {
        asm volatile("ld.global.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p), "l"(pol));
      } else {
        asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p), "l"(pol));
      }
    }
  }
  int acc = 0;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) out[blockIdx.x * 8 + threadIdx.x / 32] = acc;  // a slot a warp (no atomics)
}
void stream_read_bytes(torch::Tensor x, torch::Tensor out, int64_t pol) {
  const long long n16 = x.numel() * x.element_size() / 16;
  const int blocks = (int)((n16 + 256 * 8 - 1) / (256 * 8));
  auto s = at::cuda::getCurrentCUDAStream();
  const int4* p = reinterpret_cast<const int4*>(x.data_ptr());
  if (pol == 0) stream_read<0><<<blocks, 256, 0, s>>>(p, n16, out.data_ptr<int>());
  else if (pol == 1) stream_read<1><<<blocks, 256, 0, s>>>(p, n16, out.data_ptr<int>());
  else stream_read<2><<<blocks, 256, 0, s>>>(p, n16, out.data_ptr<int>());
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4x1024,4x8192,32x1024,32x8192,64x1024,64x8192,256x1024,256x8192")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch
    from torch.utils.cpp_extension import load_inline
    ext = load_inline("mlagen_floor_l2", cpp_sources="void stream_read_bytes(torch::Tensor x, torch::Tensor out, int64_t pol);",
                      cuda_sources=SRC, functions=["stream_read_bytes"], extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"],
                      verbose=False)
    dev = torch.device("cuda")
    timer, clean = Timer(torch, dev, 512 << 20), CleanFlushTimer(torch, dev, 512 << 20)

    def med(t, fn):
        for _ in range(5):
            t.once(fn)
        return round(statistics.median(t.once(fn) for _ in range(a.reps)), 2)
    res = {"commit": os.environ.get("MLAGEN_COMMIT"), "rows": []}
    for b, l in C.parse_shapes(a.shapes):
        n = b * l * C.QK_DIM // 4
        x = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device=dev)
        expect = int(x.view(-1, 4).sum(dtype=torch.int64).item()) & 0xffffffff
        out = torch.zeros(-(-n // (4 * 256 * 8)) * 8, dtype=torch.int32, device=dev)  # a slot a warp
        row = {"shape": C.shape_name(b, l), "bytes": n * 4}
        for name, pol in (("cg", 0), ("l2_first", 1), ("l1na_l2first", 2)):
            out.fill_(0x5a5a5a5a)  # poison: every slot must be written by this launch
            ext.stream_read_bytes(x, out, pol)
            torch.cuda.synchronize()
            got = int(out.sum(dtype=torch.int64).item()) & 0xffffffff
            if got != expect:
                raise SystemExit(f"{name} on {row['shape']}: sum {got:#x} != {expect:#x}")
            replay = graph_of(torch, lambda pol=pol: ext.stream_read_bytes(x, out, pol))
            row[name] = med(timer, replay)
            if pol == 0:
                row["cg_clean_flush"] = med(clean, replay)
        res["rows"].append(row)
        print(row, flush=True)
        del x
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
