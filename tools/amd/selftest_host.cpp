// Host half of the gfx950 link self-test (tools/amd/link_gfx950.sh): plain C++, no HIP, calling
// the launch wrapper that tools/amd/selftest.hip defines, so that the shared library has to
// resolve a symbol across the host object and the HIP object.
#include <cstdint>

typedef struct ihipStream_t* hipStream_t;
extern "C" int mlagen_selftest_launch(const uint16_t* a, const uint16_t* b, const long* a8, const long* b8,
                                      float* out, float* rowmax, int blocks, hipStream_t stream);

extern "C" int mlagen_selftest_host_entry(int blocks) {
  if (blocks <= 0) return -1;
  return mlagen_selftest_launch(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, blocks, nullptr);
}
