// The GPU side of the host library: the embedded code objects, and the one loader that loads
// them per device and launches their entry points through the runtime the process already has
// (the CUDA driver API, or HIP's module API: the vendor difference is the function names).
// Nothing here is linked against a GPU runtime: its entry points are resolved once, at the first
// GPU call (gpu.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "mlagen/internal.h"
#include "mlagen/kernel_abi.h"

namespace mlagen {

// One generated kernel's code object (code_objects.inc, written at build time by tools/embed.py
// from the objects the device compiler produced, with the LaunchInfo it read out of each).
// Its entry points are `name` + kEntrySuffix[k] for each bit k of `entries` (codegen/spec.py
// KernelSpec.entry_points; tools/embed.py checked each against the object's symbols).
constexpr int kEntryKinds = 4;
constexpr const char* kEntrySuffix[kEntryKinds] = {"", "_q8", "_amax", "_combine"};
enum EntryKind { kDecode = 0, kDecodeQ8 = 1, kAmax = 2, kCombine = 3 };  // bit k of CodeObject::entries, kEntrySuffix[k]
// An entry point's block and dynamic shared memory, from its object's LaunchInfo.
struct EntryShape {
  unsigned threads, smem;
};
inline EntryShape entry_shape(const device::LaunchInfo& i, int kind) {
  switch (kind) {
    case kDecode: return {static_cast<unsigned>(i.threads), static_cast<unsigned>(i.smem_bytes)};
    case kDecodeQ8: return {static_cast<unsigned>(i.q8_threads), static_cast<unsigned>(i.q8_smem_bytes)};
    case kAmax: return {static_cast<unsigned>(i.amax_threads), 0};
    default: return {static_cast<unsigned>(i.combine_threads), 0};
  }
}
struct CodeObject {
  const char* name;
  const unsigned char* begin;
  const unsigned char* end;
  int32_t entries;  // bit k: it has the EntryKind k entry
  device::LaunchInfo info;
};
const CodeObject* code_objects(size_t* count);
const CodeObject* find_code_object(const char* name);  // nullptr when the build has none of that name

namespace gpu {

// A code object's entry points on one device (null where the object has no such entry).
struct Functions {
  void* decode;
  void* q8;
  void* amax;
  void* combine;
  // The most blocks a decode grid that merges its splits in its launch may have (NVIDIA, for an
  // object whose decode can: LaunchInfo merge_in_launch; else 0): one an SM, and all resident at
  // once (the smaller of the SMs and blocks an SM x SMs). Such a grid, its split blocks and as many
  // mergers, is launched cooperatively (launch.cpp). More, and blocks share SMs: on the H200 the
  // decode blocks then ran 1.3-2 us longer (32x1024, 128 split blocks; docs/perf.md).
  int64_t in_launch_blocks;
  // 128-thread blocks of the combine entry the device holds at once (blocks an SM x SMs; NVIDIA;
  // 0 on AMD, where the combine runs one split group a row): how many split groups a combine grid
  // may take and still be resident at once (launch.cpp).
  int64_t combine_units;
};

struct Launch {
  void* fn;
  unsigned grid_x, grid_y, block, smem;
  void* stream;
  void** args;
  bool dependent;    // NVIDIA: may start while the previous grid in the stream runs (it waits on the device)
  bool cooperative;  // NVIDIA: every block resident at once, or the launch fails (blocks wait for each other)
};

// Makes `device` (>= 0) current for the scope and gives the caller's back; -1 keeps the current one
// (on NVIDIA: the primary context of device 0 when the thread has none, as the CUDA runtime does).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  mlagen_status status() const { return status_; }
  int device() const { return device_; }

 private:
  mlagen_status status_ = MLAGEN_OK;
  int device_ = -1;
  void* saved_ = nullptr;  // NVIDIA: the caller's context
  int saved_device_ = -1;  // AMD: the caller's device
  bool restore_ = false;
};

// The entry points of `obj` on `device` (the current one, made so by a DeviceScope): loaded on
// the first call for that device, then read without a lock.
mlagen_status functions(const CodeObject& obj, int device, const Functions** out);
mlagen_status launch(const Launch& l, const char* what);
// The sm90a rows body's KV tensor maps (kernel_abi.h KvMapsAbi).
// row_bytes: the KV format's bytes a row (fp8 576, bf16 1152: kernel_abi.h KvMapsAbi).
mlagen_status encode_kv_maps(const void* kv, int64_t rows, int64_t stride_bytes, int32_t row_bytes,
                             device::KvMapsAbi* maps);
// Reads a device word into *out after the stream's work, then zeroes it (in stream order).
mlagen_status take_word(void* device_word, void* stream, uint32_t* out);
mlagen_status check_current_device();
const char* runtime_path();

}  // namespace gpu
}  // namespace mlagen
