// The table route of the mxfp4 dequantization (sm90_ops.cuh e2m1x8_to_bf16_scaled) against
// the fp32 route (formats.cuh mxfp4x8_to_bf16), bit for bit: every 16-bit pattern of packed
// E2M1 codes in both halves of the word, for scale bytes across the table route's range.
// Built and run by tests/gpu/test_units.py; prints "mismatches: N", exits 1 when N > 0.
#include <cstdio>
#include "mlagen/device/formats.cuh"
using namespace mlagen::device;

__global__ void compare(unsigned* bad) {
  const unsigned idx = blockIdx.x * blockDim.x + threadIdx.x;  // 2^17 words
  const unsigned w = (idx & 0xffffu) * 0x10001u ^ (idx >> 16) * 0x9e3779b9u;
  const unsigned scales[] = {2, 3, 50, 100, 120, 126, 127, 128, 130, 200, 251, 252};
  for (unsigned b : scales) {
    uint32_t table[4], ref[4];
    e2m1x8_to_bf16_scaled(w, b, table);
    mxfp4x8_to_bf16(w, e8m0_to_float(b), ref);
    for (int i = 0; i < 4; ++i)
      if (table[i] != ref[i]) atomicAdd(bad, 1u);
  }
}

int main() {
  unsigned* d = nullptr;
  if (cudaMalloc(&d, sizeof(unsigned)) != cudaSuccess) return 2;
  cudaMemset(d, 0, sizeof(unsigned));
  compare<<<512, 256>>>(d);
  unsigned h = 0;
  if (cudaMemcpy(&h, d, sizeof(unsigned), cudaMemcpyDeviceToHost) != cudaSuccess) return 2;
  std::printf("mismatches: %u (of %u words x 12 scales x 4 bf16x2)\n", h, 512u * 256u);
  return h != 0;
}
