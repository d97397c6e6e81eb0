// The loader: resolves the GPU runtime's module API once, loads the embedded code objects per
// device, launches their entry points. One code path for both vendors; `Api` holds the few
// functions it needs under vendor-neutral names, and only resolve_api() and the thin wrappers
// below know which vendor's function each one is.
#include "gpu.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#if defined(MLAGEN_BUILD_SM90A)
#define MLAGEN_VENDOR_NVIDIA 1
#include <cuda.h>  // the driver API's types and enums only: every function comes through cuGetProcAddress
#elif defined(MLAGEN_BUILD_GFX950) || defined(MLAGEN_BUILD_GFX942)
#define MLAGEN_VENDOR_AMD 1
#else
#error "gpu.cpp: MLAGEN_BUILD_<ARCH> names the build's arch (sm90a, gfx950 or gfx942)"
#endif

namespace mlagen::gpu {
namespace {

#if defined(MLAGEN_VENDOR_AMD)
// HIP's module API as the HIP runtime exports it (hip_runtime_api.h, unchanged from ROCm 5 to 7):
// handles are pointers, hipError_t an int (hipSuccess 0), hipMemcpyDeviceToHost 2. Declared here
// so that the host library compiles without ROCm's headers.
using hipError_t = int;
using hipModule_t = void*;
using hipFunction_t = void*;
using hipStream_t = void*;
constexpr hipError_t hipSuccess = 0;
constexpr int hipMemcpyDeviceToHost = 2;
using Result = hipError_t;
constexpr Result kOk = hipSuccess;
#else
using Result = CUresult;
constexpr Result kOk = CUDA_SUCCESS;
#endif

// What the loader calls, resolved once.
struct Api {
  bool resolved = false;
  char error[768] = "";
  char path[512] = "";
#if defined(MLAGEN_VENDOR_AMD)
  hipError_t (*GetDevice)(int*);
  hipError_t (*SetDevice)(int);
  hipError_t (*GetDeviceCount)(int*);
  hipError_t (*ModuleLoadData)(hipModule_t*, const void*);
  hipError_t (*ModuleGetFunction)(hipFunction_t*, hipModule_t, const char*);
  hipError_t (*ModuleLaunchKernel)(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, hipStream_t, void**, void**);
  hipError_t (*MemcpyAsync)(void*, const void*, size_t, int, hipStream_t);
  hipError_t (*MemsetAsync)(void*, int, size_t, hipStream_t);
  hipError_t (*StreamSynchronize)(hipStream_t);
  const char* (*GetErrorString)(hipError_t);
#else
  CUresult (*Init)(unsigned);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetDevice)(CUdevice*);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**);
  CUresult (*LaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*MemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*MemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*TensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
#endif
};

Api g_api;
std::once_flag g_api_once;

#if defined(MLAGEN_VENDOR_AMD)
constexpr const char* kRuntimeStem = "libamdhip64.so";  // ROCm 7: libamdhip64.so.7; torch's wheel: libamdhip64.so
constexpr const char* kRuntimeNames[] = {"libamdhip64.so.7", "libamdhip64.so", "libamdhip64.so.6"};
constexpr const char* kRuntimeEnv = "MLAGEN_HIP_RUNTIME";
#else
constexpr const char* kRuntimeStem = "libcuda.so";
constexpr const char* kRuntimeNames[] = {"libcuda.so.1", "libcuda.so"};
constexpr const char* kRuntimeEnv = "MLAGEN_CUDA_DRIVER";
#endif

// The process's already-loaded copy of the runtime (torch's, say), whatever its version suffix.
int find_loaded(dl_phdr_info* info, size_t, void* out) {
  const char* path = info->dlpi_name;
  if (!path || !*path) return 0;
  const char* base = std::strrchr(path, '/');
  base = base ? base + 1 : path;
  if (std::strncmp(base, kRuntimeStem, std::strlen(kRuntimeStem))) return 0;
  std::snprintf(static_cast<char*>(out), 512, "%s", path);
  return 1;
}

void* open_runtime(Api& a) {
  char loaded[512] = "";
  dl_iterate_phdr(find_loaded, loaded);
  if (*loaded) {
    if (void* h = dlopen(loaded, RTLD_NOW | RTLD_NOLOAD)) {
      std::snprintf(a.path, sizeof(a.path), "%s", loaded);
      return h;
    }
  }
  const char* env = std::getenv(kRuntimeEnv);
  if (env && *env) {
    void* h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::snprintf(a.error, sizeof(a.error), "%s=%s: cannot load it: %s", kRuntimeEnv, env, dlerror());
      return nullptr;
    }
    std::snprintf(a.path, sizeof(a.path), "%s", env);
    return h;
  }
  std::string tried;
  for (const char* name : kRuntimeNames) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
      std::snprintf(a.path, sizeof(a.path), "%s", name);
      return h;
    }
    tried += tried.empty() ? name : std::string(", ") + name;
  }
  std::snprintf(a.error, sizeof(a.error),
                "no GPU runtime: no %s* is loaded in this process and none of %s could be loaded (%s names one)",
                kRuntimeStem, tried.c_str(), kRuntimeEnv);
  return nullptr;
}

template <class F>
bool take(Api& a, void* handle, F& fn, const char* name) {
#if defined(MLAGEN_VENDOR_AMD)
  void* p = dlsym(handle, name);
#else
  (void)handle;
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  static GetProc get_proc = reinterpret_cast<GetProc>(dlsym(handle, "cuGetProcAddress_v2"));
  void* p = nullptr;
  CUdriverProcAddressQueryResult found{};
  if (!get_proc || get_proc(name, &p, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) != CUDA_SUCCESS ||
      found != CU_GET_PROC_ADDRESS_SUCCESS)
    p = nullptr;
#endif
  if (!p) {
    std::snprintf(a.error, sizeof(a.error), "%s: the GPU runtime at %s has no %s%s", name, a.path, name,
#if defined(MLAGEN_VENDOR_AMD)
                  " (mlagen needs HIP's module API)"
#else
                  get_proc ? " (through cuGetProcAddress, CUDA 12.0 API)" : " (no cuGetProcAddress_v2: a driver older than CUDA 12)"
#endif
    );
    return false;
  }
  fn = reinterpret_cast<F>(p);
  return true;
}

void resolve_api() {
  Api& a = g_api;
  void* h = open_runtime(a);
  if (!h) return;
#define MLAGEN_TAKE(field, name) \
  if (!take(a, h, a.field, name)) return
#if defined(MLAGEN_VENDOR_AMD)
  MLAGEN_TAKE(GetDevice, "hipGetDevice");
  MLAGEN_TAKE(SetDevice, "hipSetDevice");
  MLAGEN_TAKE(GetDeviceCount, "hipGetDeviceCount");
  MLAGEN_TAKE(ModuleLoadData, "hipModuleLoadData");
  MLAGEN_TAKE(ModuleGetFunction, "hipModuleGetFunction");
  MLAGEN_TAKE(ModuleLaunchKernel, "hipModuleLaunchKernel");
  MLAGEN_TAKE(MemcpyAsync, "hipMemcpyAsync");
  MLAGEN_TAKE(MemsetAsync, "hipMemsetAsync");
  MLAGEN_TAKE(StreamSynchronize, "hipStreamSynchronize");
  MLAGEN_TAKE(GetErrorString, "hipGetErrorString");
#else
  MLAGEN_TAKE(Init, "cuInit");
  MLAGEN_TAKE(CtxGetCurrent, "cuCtxGetCurrent");
  MLAGEN_TAKE(CtxSetCurrent, "cuCtxSetCurrent");
  MLAGEN_TAKE(CtxGetDevice, "cuCtxGetDevice");
  MLAGEN_TAKE(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  MLAGEN_TAKE(DeviceGet, "cuDeviceGet");
  MLAGEN_TAKE(DeviceGetCount, "cuDeviceGetCount");
  MLAGEN_TAKE(DeviceGetAttribute, "cuDeviceGetAttribute");
  MLAGEN_TAKE(ModuleLoadData, "cuModuleLoadData");
  MLAGEN_TAKE(ModuleGetFunction, "cuModuleGetFunction");
  MLAGEN_TAKE(FuncSetAttribute, "cuFuncSetAttribute");
  MLAGEN_TAKE(OccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  MLAGEN_TAKE(LaunchKernel, "cuLaunchKernel");
  MLAGEN_TAKE(LaunchKernelEx, "cuLaunchKernelEx");
  MLAGEN_TAKE(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
  MLAGEN_TAKE(MemsetD32Async, "cuMemsetD32Async");
  MLAGEN_TAKE(StreamSynchronize, "cuStreamSynchronize");
  MLAGEN_TAKE(GetErrorString, "cuGetErrorString");
  MLAGEN_TAKE(TensorMapEncodeTiled, "cuTensorMapEncodeTiled");
  const CUresult r = a.Init(0);
  if (r != CUDA_SUCCESS) {
    std::snprintf(a.error, sizeof(a.error), "cuInit: CUresult %d (no usable NVIDIA GPU or driver)", static_cast<int>(r));
    return;
  }
#endif
#undef MLAGEN_TAKE
  a.resolved = true;
}

mlagen_status api(const Api** out) {
  std::call_once(g_api_once, resolve_api);
  if (!g_api.resolved) return fail(MLAGEN_ERR_DEVICE, "%s", g_api.error);
  *out = &g_api;
  return MLAGEN_OK;
}

const char* error_string(Result r) {
  const char* s = nullptr;
#if defined(MLAGEN_VENDOR_AMD)
  if (g_api.GetErrorString) s = g_api.GetErrorString(r);
#else
  if (g_api.GetErrorString) g_api.GetErrorString(r, &s);
#endif
  return s ? s : "unknown error";
}

mlagen_status check(Result r, const char* what) {
  if (r == kOk) return MLAGEN_OK;
  return fail(MLAGEN_ERR_DEVICE, "%s: %s (error %d)", what, error_string(r), static_cast<int>(r));
}

// ---- loaded code objects: one slot per (device, object), filled once under a lock ----------
constexpr int kMaxDevices = 64;
std::atomic<Functions*>* g_slots[kMaxDevices];  // [device] -> array over the code objects
std::mutex g_load_mutex;

#if defined(MLAGEN_VENDOR_NVIDIA)
CUcontext g_primary[kMaxDevices];  // retained once, never released (the CUDA runtime shares them)
#endif

mlagen_status load(const CodeObject& obj, Functions* f) {
  const Api* a = nullptr;
  mlagen_status st = api(&a);
  if (st != MLAGEN_OK) return st;
  char what[320];
#if defined(MLAGEN_VENDOR_AMD)
  hipModule_t module = nullptr;
#else
  CUmodule module = nullptr;
#endif
  std::snprintf(what, sizeof(what), "loading code object %s (%zu bytes, " MLAGEN_BUILD_ARCH ")", obj.name,
                static_cast<size_t>(obj.end - obj.begin));
  st = check(a->ModuleLoadData(&module, obj.begin), what);
  if (st != MLAGEN_OK) return st;
  void** slots[] = {&f->decode, &f->q8, &f->amax, &f->combine};
  for (int i = 0; i < kEntryKinds; ++i) {
    *slots[i] = nullptr;
    if (!(obj.entries & (1 << i))) continue;
    char name[256];
    std::snprintf(name, sizeof(name), "%s%s", obj.name, kEntrySuffix[i]);
    std::snprintf(what, sizeof(what), "kernel %s in its code object", name);
#if defined(MLAGEN_VENDOR_AMD)
    hipFunction_t fn = nullptr;
#else
    CUfunction fn = nullptr;
#endif
    st = check(a->ModuleGetFunction(&fn, module, name), what);
    if (st != MLAGEN_OK) return st;
#if defined(MLAGEN_VENDOR_NVIDIA)
    // dynamic shared memory over the 48 KB default is a per-function opt-in
    const int smem = static_cast<int>(entry_shape(obj.info, i).smem);
    if (smem > 48 * 1024) {
      std::snprintf(what, sizeof(what), "%s: MAX_DYNAMIC_SHARED_SIZE_BYTES=%d", name, smem);
      st = check(a->FuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem), what);
      if (st != MLAGEN_OK) return st;
    }
#endif
    // AMD: a block's LDS (up to 160 KB on gfx950, 64 KB on gfx942) needs no opt-in.
    *slots[i] = reinterpret_cast<void*>(fn);
  }
  f->in_launch_blocks = 0;
  f->combine_units = 0;
#if defined(MLAGEN_VENDOR_NVIDIA)
  if ((obj.info.merge_in_launch && f->decode) || f->combine) {
    int sms = 0;
    CUdevice dev = 0;
    st = check(a->CtxGetDevice(&dev), "cuCtxGetDevice");
    if (st == MLAGEN_OK)
      st = check(a->DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "SM count");
    if (st != MLAGEN_OK) return st;
    // blocks of fn (threads, smem) the device holds at once: blocks an SM x SMs
    auto resident = [&](void* fn, int threads, size_t smem, const char* entry, int64_t* out) {
      int per_sm = 0;
      std::snprintf(what, sizeof(what), "%s%s: blocks resident an SM", obj.name, entry);
      const mlagen_status r =
          check(a->OccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, static_cast<CUfunction>(fn), threads, smem), what);
      *out = static_cast<int64_t>(per_sm) * sms;
      return r;
    };
    if (obj.info.merge_in_launch && f->decode) {
      const EntryShape shape = entry_shape(obj.info, kDecode);
      st = resident(f->decode, static_cast<int>(shape.threads), shape.smem, "", &f->in_launch_blocks);
      if (st != MLAGEN_OK) return st;
      f->in_launch_blocks = std::min<int64_t>(f->in_launch_blocks, sms);
    }
    if (f->combine) {
      st = resident(f->combine, device::kCombineGroupThreads, 0, "_combine", &f->combine_units);
      if (st != MLAGEN_OK) return st;
    }
  }
#endif
  return MLAGEN_OK;
}

}  // namespace

mlagen_status functions(const CodeObject& obj, int device, const Functions** out) {
  size_t count = 0;
  const CodeObject* all = code_objects(&count);
  const size_t index = static_cast<size_t>(&obj - all);
  if (device < 0 || device >= kMaxDevices)
    return fail(MLAGEN_ERR_DEVICE, "device=%d: expected 0..%d (devices this loader keeps code for)", device, kMaxDevices - 1);
  std::atomic<Functions*>* slots = __atomic_load_n(&g_slots[device], __ATOMIC_ACQUIRE);
  if (slots) {
    if (Functions* f = slots[index].load(std::memory_order_acquire)) {
      *out = f;
      return MLAGEN_OK;
    }
  }
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (!g_slots[device]) {
    auto* fresh = new std::atomic<Functions*>[count]();
    __atomic_store_n(&g_slots[device], fresh, __ATOMIC_RELEASE);
  }
  slots = g_slots[device];
  if (Functions* f = slots[index].load(std::memory_order_acquire)) {
    *out = f;
    return MLAGEN_OK;
  }
  auto* f = new Functions{};
  const mlagen_status st = load(obj, f);
  if (st != MLAGEN_OK) {
    delete f;
    return st;
  }
  slots[index].store(f, std::memory_order_release);
  *out = f;
  return MLAGEN_OK;
}

DeviceScope::DeviceScope(int device) {
  const Api* a = nullptr;
  status_ = api(&a);
  if (status_ != MLAGEN_OK) return;
#if defined(MLAGEN_VENDOR_AMD)
  int caller = -1;
  status_ = check(a->GetDevice(&caller), "hipGetDevice");
  if (status_ != MLAGEN_OK) return;
  device_ = caller;
  if (device < 0 || device == caller) return;
  int count = 0;  // (setting a device that does not exist can succeed and fail the launch after it)
  status_ = check(a->GetDeviceCount(&count), "hipGetDeviceCount");
  if (status_ != MLAGEN_OK) return;
  if (device >= count) {
    status_ = fail(MLAGEN_ERR_DEVICE, "device=%d: cannot make it current: this process sees %d device(s)", device, count);
    return;
  }
  status_ = check(a->SetDevice(device), "hipSetDevice");
  if (status_ != MLAGEN_OK) return;
  saved_device_ = caller;
  device_ = device;
  restore_ = true;
#else
  CUcontext current = nullptr;
  status_ = check(a->CtxGetCurrent(&current), "cuCtxGetCurrent");
  if (status_ != MLAGEN_OK) return;
  CUdevice dev = -1;
  if (current) {
    status_ = check(a->CtxGetDevice(&dev), "cuCtxGetDevice");
    if (status_ != MLAGEN_OK) return;
  }
  const int want = device >= 0 ? device : (current ? static_cast<int>(dev) : 0);
  device_ = want;
  if (current && want == static_cast<int>(dev)) return;
  int count = 0;
  status_ = check(a->DeviceGetCount(&count), "cuDeviceGetCount");
  if (status_ != MLAGEN_OK) return;
  if (want >= count || want >= kMaxDevices) {
    status_ = fail(MLAGEN_ERR_DEVICE, "device=%d: cannot make it current: this process sees %d device(s)", want, count);
    return;
  }
  CUcontext primary = __atomic_load_n(&g_primary[want], __ATOMIC_ACQUIRE);
  if (!primary) {
    CUdevice handle = 0;
    status_ = check(a->DeviceGet(&handle, want), "cuDeviceGet");
    if (status_ != MLAGEN_OK) return;
    status_ = check(a->DevicePrimaryCtxRetain(&primary, handle), "cuDevicePrimaryCtxRetain");
    if (status_ != MLAGEN_OK) return;
    CUcontext expected = nullptr;  // another thread may have retained it too: keep one
    if (!__atomic_compare_exchange_n(&g_primary[want], &expected, primary, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      primary = expected;
  }
  status_ = check(a->CtxSetCurrent(primary), "cuCtxSetCurrent");
  if (status_ != MLAGEN_OK) return;
  saved_ = current;
  restore_ = current != nullptr;  // a thread without a context keeps the primary one, as the CUDA runtime would
#endif
}

DeviceScope::~DeviceScope() {
  if (!restore_) return;  // best effort below: the launch result is what matters
#if defined(MLAGEN_VENDOR_AMD)
  (void)g_api.SetDevice(saved_device_);
#else
  (void)g_api.CtxSetCurrent(static_cast<CUcontext>(saved_));
#endif
}

mlagen_status launch(const Launch& l, const char* what) {
  const Api* a = &g_api;  // resolved: a DeviceScope or functions() came first
#if defined(MLAGEN_VENDOR_AMD)
  if (l.cooperative)  // in_launch_blocks is 0 on AMD: launch.cpp never asks
    return fail(MLAGEN_ERR_UNSUPPORTED, "%s: a cooperative launch (not built for HIP)", what);
  return check(a->ModuleLaunchKernel(static_cast<hipFunction_t>(l.fn), l.grid_x, l.grid_y, 1, l.block, 1, 1, l.smem,
                                     l.stream, l.args, nullptr),
               what);
#else
  const auto fn = static_cast<CUfunction>(l.fn);
  const auto stream = static_cast<CUstream>(l.stream);
  if (!l.dependent && !l.cooperative)
    return check(a->LaunchKernel(fn, l.grid_x, l.grid_y, 1, l.block, 1, 1, l.smem, stream, l.args, nullptr), what);
  // Programmatic dependent launch: the grid starts while the previous one in the stream still
  // runs and waits on the device (griddepcontrol.wait) for its results: the launch gap is hidden.
  // Cooperative: the driver launches the grid only if all of it is resident at once.
  CUlaunchAttribute attr[1] = {};
  if (l.cooperative) {
    attr[0].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr[0].value.cooperative = 1;
  } else {
    attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr[0].value.programmaticStreamSerializationAllowed = 1;
  }
  CUlaunchConfig cfg{};
  cfg.gridDimX = l.grid_x;
  cfg.gridDimY = l.grid_y;
  cfg.gridDimZ = 1;
  cfg.blockDimX = l.block;
  cfg.blockDimY = 1;
  cfg.blockDimZ = 1;
  cfg.sharedMemBytes = l.smem;
  cfg.hStream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return check(a->LaunchKernelEx(&cfg, fn, l.args, nullptr), what);
#endif
}

mlagen_status encode_kv_maps(const void* kv, int64_t rows, int64_t stride_bytes, int32_t row_bytes,
                             device::KvMapsAbi* maps) {
#if defined(MLAGEN_VENDOR_NVIDIA)
  const Api* a = nullptr;
  const mlagen_status st = api(&a);
  if (st != MLAGEN_OK) return st;
  using M = device::KvMapsAbi;
  if (!M::mapped(row_bytes))
    return fail(MLAGEN_ERR_UNSUPPORTED, "KV tensor maps: rows of %d bytes (expected %d or %d)", row_bytes, M::kRowBytesFp8,
                M::kRowBytesBf16);
  const bool bf16 = row_bytes == M::kRowBytesBf16;  // else fp8 rows
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};
  const cuuint32_t unit[2] = {1, 1};
  const cuuint32_t main_box[2] = {M::kMainBoxBytes, M::kMainBoxRows};
  const cuuint32_t rope_box[2] = {static_cast<cuuint32_t>(bf16 ? M::kRopeBoxBytesBf16 : M::kRopeBoxBytes), M::kRopeBoxRows};
  void* base = const_cast<void*>(kv);
  CUresult r = a->TensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(&maps->main), CU_TENSOR_MAP_DATA_TYPE_UINT8, 2,
                                       base, dims, strides, main_box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS)
    r = a->TensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(&maps->rope), CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, base,
                                dims, strides, rope_box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                bf16 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fail(MLAGEN_ERR_DEVICE, "cuTensorMapEncodeTiled (KV %p, %lld rows, stride %lld bytes): %s", kv,
                static_cast<long long>(rows), static_cast<long long>(stride_bytes), error_string(r));
  return MLAGEN_OK;
#else
  (void)kv, (void)rows, (void)stride_bytes, (void)row_bytes, (void)maps;
  return fail(MLAGEN_ERR_UNSUPPORTED, "KV tensor maps: sm90a only (this library is " MLAGEN_BUILD_ARCH ")");
#endif
}

mlagen_status take_word(void* device_word, void* stream, uint32_t* out) {
  const Api* a = nullptr;
  mlagen_status st = api(&a);
  if (st != MLAGEN_OK) return st;
  uint32_t host = 0;
#if defined(MLAGEN_VENDOR_AMD)
  st = check(a->MemcpyAsync(&host, device_word, sizeof(host), hipMemcpyDeviceToHost, stream), "reading the device error word");
  if (st == MLAGEN_OK) st = check(a->StreamSynchronize(stream), "reading the device error word");
  if (st == MLAGEN_OK) st = check(a->MemsetAsync(device_word, 0, sizeof(host), stream), "clearing the device error word");
#else
  DeviceScope scope(-1);  // a thread without a context gets the primary one (the CUDA runtime's default)
  if (scope.status() != MLAGEN_OK) return scope.status();
  const auto s = static_cast<CUstream>(stream);
  const auto ptr = reinterpret_cast<CUdeviceptr>(device_word);
  st = check(a->MemcpyDtoHAsync(&host, ptr, sizeof(host), s), "reading the device error word");
  if (st == MLAGEN_OK) st = check(a->StreamSynchronize(s), "reading the device error word");
  if (st == MLAGEN_OK) st = check(a->MemsetD32Async(ptr, 0, 1, s), "clearing the device error word");
#endif
  if (st == MLAGEN_OK) *out = host;
  return st;
}

mlagen_status check_current_device() {
  DeviceScope scope(-1);
  if (scope.status() != MLAGEN_OK) return fail(MLAGEN_ERR_DEVICE, "no usable GPU: %s", std::string(mlagen_last_error()).c_str());
#if defined(MLAGEN_VENDOR_NVIDIA)
  const Api* a = &g_api;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  mlagen_status st = check(a->DeviceGet(&dev, scope.device()), "cuDeviceGet");
  if (st == MLAGEN_OK)
    st = check(a->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute");
  if (st == MLAGEN_OK)
    st = check(a->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute");
  if (st != MLAGEN_OK) return fail(MLAGEN_ERR_DEVICE, "no usable GPU: %s", std::string(mlagen_last_error()).c_str());
  // sm_90a code runs on compute capability 9.0 only (arch-specific features)
  if (!(major == 9 && minor == 0))
    return fail(MLAGEN_ERR_DEVICE, "this GPU is sm%d%d (device %d); this mlagen library was built for " MLAGEN_BUILD_ARCH
                " only: rebuild with ARCH=<your arch>", major, minor, scope.device());
#endif
  // The proof that counts on either vendor: the runtime takes this build's code for this GPU.
  size_t count = 0;
  const CodeObject* all = code_objects(&count);
  const Functions* f = nullptr;
  if (count && functions(all[0], scope.device(), &f) != MLAGEN_OK)
    return fail(MLAGEN_ERR_DEVICE, "this GPU (device %d) does not run this mlagen library's " MLAGEN_BUILD_ARCH
                " code (rebuild with ARCH=<your arch>): %s", scope.device(), std::string(mlagen_last_error()).c_str());
  return MLAGEN_OK;
}

const char* runtime_path() { return g_api.path; }

}  // namespace mlagen::gpu
