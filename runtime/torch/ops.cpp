// torch.ops.mlagen.decode / decode_lse, registered from C++ over mlagen's C ABI (mlagen/mlagen.h).
//
// A separate shared object (libmlagen_torch.so), built against the torch it runs with; the fat
// library (libmlagen.so) knows nothing of torch. This one opens libmlagen.so at its first call (the
// path the Python binding gives it through mlagen_torch_set_library, else MLAGEN_LIBRARY, else the
// libmlagen.so beside this file) and calls it through the C ABI only:
//   - the first call of a layout (every tensor's dtype, device, sizes and strides, and the scalar
//     arguments: the plan-cache key) maps the tensors onto an mlagen_problem, checking what only
//     the binding can see (dtypes against the format, devices, the KV tensor's shape), and makes
//     the library's plan (mlagen_plan: the library's validation, the kernel choice, the workspace
//     size), kept for the process's life;
//   - every call: the key, the output, the plan's scratch for torch's current queue on the
//     device, mlagen_run with the call's pointers.
// Scratch is per plan and per launch queue (the raw handle), made zeroed on first use, so callers
// on different queues never share it; a queue's first use inside a CUDA graph capture gets scratch
// of its own (zeroed by a captured memset, so by each replay), kept apart from the eager calls'.
// The meta kernels give the outputs' shapes to FakeTensor / torch.compile. Errors are RuntimeErrors
// whose text starts with the status name (MLAGEN_ERR_INVALID: ...), naming the field.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "facts.inc"  // generated: MLAGEN_QK_DIM, MLAGEN_V_DIM, MLAGEN_MAX_Q_LEN, MLAGEN_NUM_HEADS_LIST, the KV formats
#include "mlagen/mlagen.h"

#ifndef MLAGEN_TORCH_BUILT_WITH
#error "MLAGEN_TORCH_BUILT_WITH must name the torch version this object is built against (CMake sets it)"
#endif

#define MLAGEN_TORCH_API extern "C" __attribute__((visibility("default")))

// The torch this object was built against, found by the Python binding in the file's bytes before
// it loads the object (runtime/python/mlagen/ops.py): a mismatch is not loaded.
MLAGEN_TORCH_API const char mlagen_torch_built_with[] = "mlagen-torch-built-with:" MLAGEN_TORCH_BUILT_WITH ";";

namespace {

// ---- errors -----------------------------------------------------------------------------------

// mlagen_status_name's table, kept here: raise() also reports that the library itself did not load.
const char* status_name(mlagen_status s) {
  switch (s) {
    case MLAGEN_OK: return "MLAGEN_OK";
    case MLAGEN_ERR_INVALID: return "MLAGEN_ERR_INVALID";
    case MLAGEN_ERR_UNSUPPORTED: return "MLAGEN_ERR_UNSUPPORTED";
    case MLAGEN_ERR_WORKSPACE: return "MLAGEN_ERR_WORKSPACE";
    case MLAGEN_ERR_DEVICE: return "MLAGEN_ERR_DEVICE";
    case MLAGEN_ERR_INPUT_DATA: return "MLAGEN_ERR_INPUT_DATA";
  }
  return "MLAGEN_ERR_UNKNOWN";
}

[[noreturn]] void raise(mlagen_status s, const std::string& msg) {
  TORCH_CHECK(false, status_name(s), ": ", msg);
  __builtin_unreachable();
}
[[noreturn]] void invalid(const std::string& msg) { raise(MLAGEN_ERR_INVALID, msg); }

// Python's spelling of what a message shows (the binding's messages read the same from either path).
std::string tup(at::IntArrayRef v) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << (v.size() == 1 ? ",)" : ")");
  return s.str();
}

std::string dt(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::ScalarType::Float8_e4m3fn: return "torch.float8_e4m3fn";
    case at::ScalarType::Float8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case at::ScalarType::Float8_e5m2: return "torch.float8_e5m2";
    case at::ScalarType::Float8_e8m0fnu: return "torch.float8_e8m0fnu";
    case at::ScalarType::Float4_e2m1fn_x2: return "torch.float4_e2m1fn_x2";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// ---- the library, opened once ---------------------------------------------------------------------

struct Api {
  decltype(&mlagen_plan) plan;
  decltype(&mlagen_plan_info) plan_info;
  decltype(&mlagen_run) run;
  decltype(&mlagen_last_error) last_error;
  decltype(&mlagen_check_device) check_device;
  decltype(&mlagen_take_device_errors) take_device_errors;
};

std::mutex g_api_mutex;
std::string g_library_path;  // set by the binding; else MLAGEN_LIBRARY, else beside this object
std::atomic<const Api*> g_api{nullptr};

std::string default_library_path() {
  if (const char* env = std::getenv("MLAGEN_LIBRARY"); env && *env) return env;
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&default_library_path), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/libmlagen.so";
  }
  return "libmlagen.so";
}

const Api& api() {
  if (const Api* a = g_api.load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> lock(g_api_mutex);
  if (const Api* a = g_api.load(std::memory_order_acquire)) return *a;
  const std::string path = g_library_path.empty() ? default_library_path() : g_library_path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) raise(MLAGEN_ERR_DEVICE, "mlagen library not loaded from " + path + ": " + dlerror());
  auto* a = new Api{};
  auto sym = [&](const char* name) {
    void* f = dlsym(h, name);
    if (!f) raise(MLAGEN_ERR_DEVICE, path + " has no " + name + " (a library older than this operator)");
    return f;
  };
  a->plan = reinterpret_cast<decltype(a->plan)>(sym("mlagen_plan"));
  a->plan_info = reinterpret_cast<decltype(a->plan_info)>(sym("mlagen_plan_info"));
  a->run = reinterpret_cast<decltype(a->run)>(sym("mlagen_run"));
  a->last_error = reinterpret_cast<decltype(a->last_error)>(sym("mlagen_last_error"));
  a->check_device = reinterpret_cast<decltype(a->check_device)>(sym("mlagen_check_device"));
  a->take_device_errors = reinterpret_cast<decltype(a->take_device_errors)>(sym("mlagen_take_device_errors"));
  g_api.store(a, std::memory_order_release);
  return *a;
}

void check(mlagen_status s) {
  if (s != MLAGEN_OK) raise(s, api().last_error());
}

// Whether the queue is being captured into a CUDA graph (the driver's answer; false where it has none).
bool capturing(void* queue) {
  using Fn = int (*)(void*, int*);
  static Fn fn = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h ? reinterpret_cast<Fn>(dlsym(h, "cuStreamIsCapturing")) : nullptr;
  }();
  int status = 0;
  return fn && fn(queue, &status) == 0 && status == 1;  // CU_STREAM_CAPTURE_STATUS_ACTIVE
}

// ---- the arguments --------------------------------------------------------------------------------

enum Slot { kQ, kKv, kKvScale, kQo, kKvIndptr, kQScale, kPageTable, kKvLens, kKvIndices, kLastPage, kSlots };
constexpr const char* kSlotName[kSlots] = {"q",       "kv",         "kv_scale", "qo_indptr",  "kv_indptr",
                                           "q_scale", "page_table", "kv_lens",  "kv_indices", "kv_last_page_len"};

struct Call {
  const at::Tensor* t[kSlots];  // null: not given
  int32_t kv_format, q_fp8;     // kv_format's index in kMlagenKvBindings (facts.inc); q_dtype "fp8"
  int64_t kv_seq_len, q_len, page_size;
  double sm_scale;
  bool lse;
};

int32_t kv_format_of(c10::string_view f) {
  for (size_t i = 0; i < std::size(kMlagenKvBindings); ++i)
    if (f == kMlagenKvBindings[i]) return static_cast<int32_t>(i);
  invalid("kv_format='" + std::string(f.data(), f.size()) + "': expected one of " MLAGEN_KV_BINDINGS_TEXT);
}

constexpr const char* kQDtypes[] = {"bf16", "fp8"};  // q_dtype: its index is Call::q_fp8

int32_t q_fp8_of(c10::string_view q) {
  if (q == kQDtypes[0]) return 0;
  if (q == kQDtypes[1]) return 1;
  invalid("q_dtype='" + std::string(q.data(), q.size()) + "': expected 'bf16' or 'fp8'");
}

// The plan-cache key: every given tensor's metadata and the scalar arguments, laid out without
// padding so that the bytes compare and hash.
struct TensorMeta {
  int8_t given, dtype, dim, device_type;
  int16_t device_index, pad0;
  int32_t pad1;
  int64_t sizes[4], strides[4];
};
struct Key {
  TensorMeta t[kSlots];
  int64_t kv_seq_len, q_len, page_size;
  double sm_scale;
  int32_t kv_format, q_fp8, lse, pad;
};
static_assert(sizeof(TensorMeta) == 8 + 8 + 64 && sizeof(Key) == kSlots * sizeof(TensorMeta) + 48,
              "the key must hold no padding");

void key_of(const Call& c, Key* k) {
  std::memset(k, 0, sizeof(Key));
  for (int i = 0; i < kSlots; ++i) {
    const at::Tensor* t = c.t[i];
    if (!t) continue;
    TensorMeta& m = k->t[i];
    m.given = 1;
    m.dtype = static_cast<int8_t>(t->scalar_type());
    const int64_t dim = t->dim();
    m.dim = static_cast<int8_t>(dim > 4 ? 5 : dim);  // more than 4: refused by the mapping, never cached
    m.device_type = static_cast<int8_t>(t->device().type());
    m.device_index = t->device().index();
    const auto sizes = t->sizes();
    const auto strides = t->strides();
    for (int64_t d = 0; d < dim && d < 4; ++d) m.sizes[d] = sizes[d], m.strides[d] = strides[d];
  }
  k->kv_seq_len = c.kv_seq_len;
  k->q_len = c.q_len;
  k->page_size = c.page_size;
  k->sm_scale = c.sm_scale;
  k->kv_format = c.kv_format;
  k->q_fp8 = c.q_fp8;
  k->lse = c.lse;
}

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t words[sizeof(Key) / 8];
    std::memcpy(words, &k, sizeof(Key));
    uint64_t h = 1469598103934665603ull;
    for (uint64_t w : words) h = (h ^ w) * 1099511628211ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};
struct KeyEq {
  bool operator()(const Key& a, const Key& b) const { return !std::memcmp(&a, &b, sizeof(Key)); }
};

// ---- the mapping: tensors onto an mlagen_problem (the binding's checks; the library checks the rest)

bool is_fp8(at::ScalarType t) {
  return t == at::ScalarType::Float8_e4m3fn || t == at::ScalarType::Float8_e4m3fnuz;
}

std::string int32_want(int64_t numel, int dims, const char* what) {
  std::string want = numel >= 0 ? tup({numel}) : (dims == 1 ? "a 1-d tensor" : "(batch, max_pages)");
  if (what) want += std::string(" (") + what + ")";
  return want;
}

void check_int32(const char* name, const at::Tensor& t, int64_t numel = -1, int dims = 1, const char* what = nullptr) {
  if (t.scalar_type() != at::kInt || t.dim() != dims || t.stride(-1) != 1 || (numel >= 0 && t.numel() != numel))
    invalid(std::string(name) + ": " + dt(t.scalar_type()) + " shape " + tup(t.sizes()) + " strides " +
            tup(t.strides()) + ": expected int32 " + int32_want(numel, dims, what) + " with contiguous last dim");
}

// (rows, row stride) of the KV tensor: (rows, 1, row) or (rows, row), dims contiguous; with pages
// also (num_pages, page_size, row) or (num_pages, page_size, 1, row), the rows of all pages at one stride.
std::pair<int64_t, int64_t> kv_rows(const at::Tensor& kv, int64_t row, int32_t format, int64_t page_size) {
  const auto s = kv.sizes();
  const auto st = kv.strides();
  const int64_t d = kv.dim();
  if (d >= 2 && d <= 4 && s[d - 1] == row && st[d - 1] == 1) {
    if (d == 2 || (d == 3 && s[1] == 1)) return {s[0], st[0]};
    if (page_size > 0 && s[1] == page_size && (d == 3 || s[2] == 1) && (s[0] == 1 || st[0] == page_size * st[1]))
      return {s[0] * page_size, st[1]};
  }
  std::string want = "(total_kv, 1, " + std::to_string(row) + ")";
  if (page_size > 0)
    want += " or (num_pages, page_size=" + std::to_string(page_size) + ", [1,] " + std::to_string(row) + ")";
  const char* name = kMlagenKvBindings[format];
  invalid("kv: shape " + tup(s) + " strides " + tup(st) + ": expected " + want + " with contiguous dims (" + name + ")");
}

// Fills `p` from the call (placeholder out / lse pointers: each run passes its own). indices_form:
// kv_indptr holds page offsets (FlashInfer's form), passed as page_indptr.
void make_problem(const Call& c, mlagen_problem* p, bool* indices_form) {
  const at::Tensor& q = *c.t[kQ];
  const at::Tensor& kv = *c.t[kKv];
  const at::Tensor* kv_scale = c.t[kKvScale];
  const at::Tensor& qo = *c.t[kQo];
  const at::Tensor* kvp = c.t[kKvIndptr];
  const at::Tensor* q_scale = c.t[kQScale];
  const at::Tensor* table = c.t[kPageTable];
  const at::Tensor* kv_lens = c.t[kKvLens];
  const at::Tensor* indices = c.t[kKvIndices];
  const at::Tensor* last_page = c.t[kLastPage];
  if (!q.is_cuda()) invalid("q: on " + q.device().str() + ", expected a CUDA tensor");
  for (int i = 1; i < kSlots; ++i)
    if (c.t[i] && c.t[i]->device() != q.device())
      invalid(std::string(kSlotName[i]) + ": on " + c.t[i]->device().str() + ", expected " + q.device().str() +
              " (the device of q)");
  // q against q_dtype: bf16; or fp8, given quantized (with q_scale) or bf16 quantized on the device
  const at::ScalarType qt = q.scalar_type();
  int32_t q_from_bf16 = 0;
  if (!c.q_fp8) {
    if (qt != at::kBFloat16) invalid("q: dtype " + dt(qt) + ": expected torch.bfloat16 for q_dtype='bf16'");
  } else if (qt == at::kBFloat16) {
    if (q_scale) invalid("q_scale: given with a bf16 q; pass an fp8 q with its scale, or neither");
    q_from_bf16 = 1;
  } else if (!is_fp8(qt)) {
    invalid("q: dtype " + dt(qt) + ": expected bf16 (quantized here) or fp8 for q_dtype='fp8'");
  } else if (!q_scale || q_scale->scalar_type() != at::kFloat || q_scale->numel() != 1) {
    invalid("q_scale: expected one float32 on q's device (fp8 q: dequant = q * q_scale)");
  }
  if (q.dim() != 3 || q.stride(2) != 1)
    invalid("q: shape " + tup(q.sizes()) + " strides " + tup(q.strides()) + ": expected (total_q, num_heads, " +
            std::to_string(MLAGEN_QK_DIM) + ") with contiguous dims");
  // kv against kv_format: the format of that name whose data dtype kv has (the fp8 flavours share a name)
  const char* const binding = kMlagenKvBindings[c.kv_format];
  const std::string kt = dt(kv.scalar_type());
  const MlagenKvFormat* fmt = nullptr;
  std::string want;
  for (const MlagenKvFormat& f : kMlagenKvFormats) {
    if (std::strcmp(f.binding, binding)) continue;
    for (const char* t : f.torch_dtypes) {
      if (!t) break;
      if (kt == std::string("torch.") + t) fmt = &f;
      want += (want.empty() ? "torch." : " or torch.") + std::string(t);
    }
  }
  if (!fmt) invalid("kv: dtype " + kt + ": expected " + want + " for kv_format='" + binding + "'");
  auto scale_text = [&] {
    return kv_scale ? "(" + dt(kv_scale->scalar_type()) + ", " + std::to_string(kv_scale->numel()) + ")" : "None";
  };
  if (fmt->scale == 1 && (!kv_scale || kv_scale->scalar_type() != at::kFloat || kv_scale->numel() != 1))
    invalid("kv_scale: " + scale_text() + ": expected one float32 (the per-tensor " + binding + " scale)");
  const int64_t scale_blocks = fmt->scale == 2 ? MLAGEN_QK_DIM / fmt->scale_block : 0;
  if (fmt->scale == 2) {  // E8M0 rows
    bool dtype_ok = false;
    for (const char* t : kMlagenScaleRowDtypes)
      dtype_ok |= kv_scale && dt(kv_scale->scalar_type()) == std::string("torch.") + t;
    if (!dtype_ok || kv_scale->dim() != 2 || kv_scale->stride(1) != 1)
      invalid("kv_scale: expected the E8M0 scale rows, uint8 (total_kv, >= " + std::to_string(scale_blocks) +
              ") with contiguous blocks; got " +
              (kv_scale ? "(" + dt(kv_scale->scalar_type()) + ", " + tup(kv_scale->sizes()) + ")" : std::string("None")));
  }
  const int32_t kv_dtype = fmt->code;
  const int64_t page_size = c.page_size;
  if (page_size == 0 && (table || kv_lens || indices || last_page))
    invalid("page_table / kv_lens / kv_indices / kv_last_page_len: given without page_size; expected page_size = the "
            "cache's page size");
  if (page_size != 0 && !table == !indices)
    invalid("page_table / kv_indices: expected exactly one (a block table, or FlashInfer's kv_indices with kv_indptr "
            "in pages and kv_last_page_len)");
  const int64_t row = fmt->row_bytes / fmt->stride_unit;  // in kv's elements
  const auto [rows, kv_stride] = kv_rows(kv, row, c.kv_format, page_size > 0 ? page_size : 0);
  int64_t scale_stride = 0;
  if (fmt->scale == 2) {
    if (kv_scale->size(0) < rows || kv_scale->size(1) < scale_blocks)
      invalid("kv_scale: shape " + tup(kv_scale->sizes()) + ": expected at least (" + std::to_string(rows) + ", " +
              std::to_string(scale_blocks) + ") (one E8M0 scale per " + std::to_string(fmt->scale_block) +
              " dims of every token)");
    scale_stride = kv_scale->stride(0);
  }
  // sizes: batch from qo_indptr, q_len given or total_q / batch
  check_int32("qo_indptr", qo, -1, 1, "batch+1");
  const int64_t batch = qo.numel() - 1, total_q = q.size(0);
  int64_t q_len = c.q_len;
  if (q_len == 0 && batch >= 1) {
    if (total_q % batch)
      invalid("q_len: 0 with total_q=" + std::to_string(total_q) + " not a multiple of batch=" + std::to_string(batch) +
              ": expected q_len = the most query tokens a sequence (1.." + std::to_string(MLAGEN_MAX_Q_LEN) + ")");
    q_len = total_q / batch;
  }
  const bool paged = page_size != 0;
  if (kvp)
    check_int32("kv_indptr", *kvp, batch + 1, 1, "batch+1");
  else if (!(paged && kv_lens))
    invalid("kv_indptr: None: expected int32 (batch+1,) (or, with a block table, kv_lens)");
  int64_t kv_len = c.kv_seq_len;
  if (kv_len > 0 && !paged && rows != batch * kv_len) kv_len = 0;  // lengths differ: read from kv_indptr
  std::memset(p, 0, sizeof(*p));
  *indices_form = false;
  if (paged) {
    p->page_size = static_cast<int32_t>(page_size);
    if (table) {
      check_int32("page_table", *table, -1, 2);
      if (table->size(0) < batch)
        invalid("page_table: shape " + tup(table->sizes()) + ": expected (batch=" + std::to_string(batch) + ", max_pages)");
      if (last_page) invalid("kv_last_page_len: given with page_table; it belongs to the kv_indices form");
      if (kv_lens) check_int32("kv_lens", *kv_lens, batch, 1, "batch");
      p->page_table = static_cast<const int32_t*>(table->data_ptr());
      p->page_table_width = static_cast<int32_t>(table->size(1));
      p->page_table_stride = table->size(0) > 1 ? table->stride(0) : table->size(1);
      p->page_table_len = (batch - 1) * (batch > 1 ? table->stride(0) : 0) + table->size(1);
      p->kv_lens = kv_lens ? static_cast<const int32_t*>(kv_lens->data_ptr()) : nullptr;
    } else {
      check_int32("kv_indices", *indices);
      if (!kvp) invalid("kv_indptr: None: with kv_indices it holds each sequence's page offsets (batch+1,)");
      if (!last_page) invalid("kv_last_page_len: None: expected int32 (batch,) with kv_indices");
      check_int32("kv_last_page_len", *last_page, batch, 1, "batch");
      if (kv_lens) invalid("kv_lens: given with kv_indices; expected None (lengths come from the pages)");
      p->page_table = static_cast<const int32_t*>(indices->data_ptr());
      p->page_table_len = std::max<int64_t>(1, indices->numel());
      p->page_indptr = static_cast<const int32_t*>(kvp->data_ptr());
      p->last_page_len = static_cast<const int32_t*>(last_page->data_ptr());
      *indices_form = true;
    }
  }
  const int64_t heads = q.size(1);
  if (c.lse) {
    p->lse = reinterpret_cast<float*>(uintptr_t{0x100});  // presence only: each call passes its own
    p->lse_stride_token = heads;
  }
  p->abi_version = MLAGEN_ABI_VERSION;
  p->batch = static_cast<int32_t>(std::clamp<int64_t>(batch, INT32_MIN, INT32_MAX));
  p->num_heads = static_cast<int32_t>(std::clamp<int64_t>(heads, INT32_MIN, INT32_MAX));
  p->num_kv_heads = 1;
  p->q_len = static_cast<int32_t>(std::clamp<int64_t>(q_len, INT32_MIN, INT32_MAX));
  p->qk_dim = static_cast<int32_t>(q.size(2));
  p->v_dim = MLAGEN_V_DIM;
  p->kv_len = static_cast<int32_t>(std::clamp<int64_t>(kv_len, INT32_MIN, INT32_MAX));
  p->total_q = total_q;
  p->total_kv = rows;
  p->q_dtype = c.q_fp8 ? MLAGEN_DTYPE_FP8 : MLAGEN_DTYPE_BF16;
  p->kv_dtype = kv_dtype;
  p->sm_scale = static_cast<float>(c.sm_scale);
  p->q = q.data_ptr();
  p->q_stride_token = q.stride(0);
  p->q_stride_head = q.stride(1);
  p->kv = kv.data_ptr();
  p->kv_stride_token = kv_stride;
  p->kv_scale = kv_scale ? kv_scale->data_ptr() : nullptr;
  p->qo_indptr = static_cast<const int32_t*>(qo.data_ptr());
  p->kv_indptr = kvp && !*indices_form ? static_cast<const int32_t*>(kvp->data_ptr()) : nullptr;
  p->out = reinterpret_cast<void*>(uintptr_t{0x100});  // presence only
  p->out_stride_token = heads * MLAGEN_V_DIM;
  p->out_stride_head = MLAGEN_V_DIM;
  p->kv_scale_stride = scale_stride;
  p->q_scale = q_scale ? static_cast<const float*>(q_scale->data_ptr()) : nullptr;
  p->q_from_bf16 = q_from_bf16;
  p->device = q.device().index();
}

// ---- plans ----------------------------------------------------------------------------------------

struct Scratch {
  void* queue;
  at::Tensor eager, captured;  // captured: made inside a graph capture on this queue (zeroed by its replays)
};

struct Plan {
  mlagen_plan_t* handle = nullptr;
  int64_t workspace_bytes = 0, total_q = 0, heads = 0;
  int device = 0;
  bool lse = false, indices_form = false;
  std::mutex mutex;
  std::vector<Scratch> scratch;

  // This plan's scratch for launches on `queue` (made zeroed on first use there).
  void* workspace(void* queue, const at::TensorOptions& options) {
    std::lock_guard<std::mutex> lock(mutex);
    Scratch* s = nullptr;
    for (Scratch& x : scratch)
      if (x.queue == queue) s = &x;
    if (!s) s = &scratch.emplace_back(Scratch{queue, {}, {}});
    const bool in_capture = s->captured.defined() || !s->eager.defined() ? capturing(queue) : false;
    at::Tensor& ws = in_capture ? s->captured : s->eager;
    if (!ws.defined()) ws = at::zeros({workspace_bytes}, options.dtype(at::kByte));
    return ws.data_ptr();
  }
};

std::mutex g_plans_mutex;
// The plans live as long as the process and are never destroyed: their scratch tensors must not be
// freed by static destruction at exit, after torch's allocator and the driver may be gone.
auto& g_plans = *new std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash, KeyEq>();
std::atomic<Plan*> g_last{nullptr};
std::atomic<uint64_t> g_checked_devices{0};
thread_local Key tl_key;
thread_local Plan* tl_plan = nullptr;

// The device's GPU is one the library has code for (once a device; made current for the check).
void check_device_once(int device) {
  if (device < 0 || device >= 64) return;
  const uint64_t bit = uint64_t{1} << device;
  if (g_checked_devices.load(std::memory_order_acquire) & bit) return;
  const c10::DeviceIndex previous = c10::cuda::current_device();
  if (previous != device) c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  const mlagen_status st = api().check_device();
  if (previous != device) c10::cuda::set_device(previous);
  check(st);
  g_checked_devices.fetch_or(bit, std::memory_order_acq_rel);
}

Plan* plan_for(const Call& c) {
  Key k;
  key_of(c, &k);
  if (tl_plan && KeyEq()(k, tl_key)) return tl_plan;
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  auto it = g_plans.find(k);
  if (it == g_plans.end()) {
    mlagen_problem p;
    auto plan = std::make_unique<Plan>();
    make_problem(c, &p, &plan->indices_form);
    const Api& a = api();
    check_device_once(p.device);
    check(a.plan(&p, &plan->handle));
    size_t bytes = 0;
    check(a.plan_info(plan->handle, nullptr, &bytes));
    plan->workspace_bytes = std::max<int64_t>(static_cast<int64_t>(bytes), 1024);
    plan->total_q = p.total_q;
    plan->heads = p.num_heads;
    plan->device = p.device;
    plan->lse = c.lse;
    it = g_plans.emplace(k, std::move(plan)).first;
  }
  tl_key = k;
  tl_plan = it->second.get();
  return tl_plan;
}

const void* ptr(const at::Tensor* t) { return t ? t->data_ptr() : nullptr; }

// A new output on the plan's device: straight from the caching allocator when that device is the
// current one (what at::empty does there, past its dispatch), else through at::empty.
at::Tensor new_output(at::IntArrayRef sizes, at::ScalarType dtype, int device) {
  if (c10::cuda::current_device() == device)
    return at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::CUDA),
                                     c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype, std::nullopt);
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

std::tuple<at::Tensor, at::Tensor> run(const Call& c) {
  Plan* plan = plan_for(c);
  const at::Tensor& q = *c.t[kQ];
  void* queue = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(plan->device)).stream();
  const at::TensorOptions options = q.options();
  mlagen_args a{};
  a.workspace = plan->workspace(queue, options);
  at::Tensor out = new_output({plan->total_q, plan->heads, MLAGEN_V_DIM}, at::kBFloat16, plan->device);
  at::Tensor lse;
  if (plan->lse) lse = new_output({plan->total_q, plan->heads}, at::kFloat, plan->device);
  a.q = q.data_ptr();
  a.q_scale = static_cast<const float*>(ptr(c.t[kQScale]));
  a.kv = c.t[kKv]->data_ptr();
  a.kv_scale = ptr(c.t[kKvScale]);
  a.qo_indptr = static_cast<const int32_t*>(c.t[kQo]->data_ptr());
  const auto* kvp = static_cast<const int32_t*>(ptr(c.t[kKvIndptr]));
  if (plan->indices_form) {
    a.page_table = static_cast<const int32_t*>(ptr(c.t[kKvIndices]));
    a.page_indptr = kvp;
    a.last_page_len = static_cast<const int32_t*>(ptr(c.t[kLastPage]));
  } else {
    a.kv_indptr = kvp;
    a.page_table = static_cast<const int32_t*>(ptr(c.t[kPageTable]));
    a.kv_lens = static_cast<const int32_t*>(ptr(c.t[kKvLens]));
  }
  a.out = out.data_ptr();
  a.lse = plan->lse ? lse.data_ptr<float>() : nullptr;
  check(api().run(plan->handle, &a, queue));
  g_last.store(plan, std::memory_order_relaxed);
  return {out, lse};
}

// The call's scalar arguments (the operators' and the per-call entry's).
void set_scalars(Call* c, c10::string_view kv_format, c10::string_view q_dtype, int64_t kv_seq_len, double sm_scale,
                 int64_t q_len, int64_t page_size, bool lse) {
  c->kv_format = kv_format_of(kv_format);
  c->q_fp8 = q_fp8_of(q_dtype);
  c->kv_seq_len = kv_seq_len;
  c->q_len = q_len;
  c->page_size = page_size;
  c->sm_scale = sm_scale;
  c->lse = lse;
}

Call make_call(const at::Tensor& q, const at::Tensor& kv, const std::optional<at::Tensor>& kv_scale,
               const at::Tensor& qo_indptr, const std::optional<at::Tensor>& kv_indptr, c10::string_view kv_format,
               c10::string_view q_dtype, int64_t kv_seq_len, double sm_scale, const std::optional<at::Tensor>& q_scale,
               int64_t q_len, const std::optional<at::Tensor>& page_table, const std::optional<at::Tensor>& kv_lens,
               int64_t page_size, const std::optional<at::Tensor>& kv_indices,
               const std::optional<at::Tensor>& kv_last_page_len, bool lse) {
  auto opt = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->defined() ? &*t : nullptr; };
  Call c{};
  c.t[kQ] = &q;
  c.t[kKv] = &kv;
  c.t[kKvScale] = opt(kv_scale);
  c.t[kQo] = &qo_indptr;
  c.t[kKvIndptr] = opt(kv_indptr);
  c.t[kQScale] = opt(q_scale);
  c.t[kPageTable] = opt(page_table);
  c.t[kKvLens] = opt(kv_lens);
  c.t[kKvIndices] = opt(kv_indices);
  c.t[kLastPage] = opt(kv_last_page_len);
  set_scalars(&c, kv_format, q_dtype, kv_seq_len, sm_scale, q_len, page_size, lse);
  return c;
}

#define MLAGEN_OP_PARAMS                                                                                          \
  const at::Tensor &q, const at::Tensor &kv, const std::optional<at::Tensor>&kv_scale, const at::Tensor &qo_indptr, \
      const std::optional<at::Tensor>&kv_indptr, c10::string_view kv_format, c10::string_view q_dtype,               \
      c10::SymInt kv_seq_len, double sm_scale, const std::optional<at::Tensor>&q_scale, c10::SymInt q_len,           \
      const std::optional<at::Tensor>&page_table, const std::optional<at::Tensor>&kv_lens, c10::SymInt page_size,     \
      const std::optional<at::Tensor>&kv_indices, const std::optional<at::Tensor>&kv_last_page_len
#define MLAGEN_OP_ARGS(lse)                                                                                      \
  make_call(q, kv, kv_scale, qo_indptr, kv_indptr, kv_format, q_dtype, kv_seq_len.expect_int(), sm_scale, q_scale, \
            q_len.expect_int(), page_table, kv_lens, page_size.expect_int(), kv_indices, kv_last_page_len, lse)

at::Tensor decode_cuda(MLAGEN_OP_PARAMS) { return std::get<0>(run(MLAGEN_OP_ARGS(false))); }
std::tuple<at::Tensor, at::Tensor> decode_lse_cuda(MLAGEN_OP_PARAMS) { return run(MLAGEN_OP_ARGS(true)); }

// The outputs' shapes (FakeTensor, torch.compile, opcheck): q (total_q, num_heads, 576) -> out
// (total_q, num_heads, 512) bf16 and lse (total_q, num_heads) float32. Sizes may be symbolic.
void check_meta_q(const at::Tensor& q) {
  static constexpr int64_t kHeads[] = {MLAGEN_NUM_HEADS_LIST};
  bool heads_ok = true;
  if (q.dim() == 3) {
    if (auto h = q.sym_size(1).maybe_as_int()) heads_ok = std::find(std::begin(kHeads), std::end(kHeads), *h) != std::end(kHeads);
  }
  TORCH_CHECK(q.dim() == 3 && heads_ok, "MLAGEN_ERR_INVALID: q: shape ", q.sym_sizes(), ": expected (total_q, num_heads ",
              MLAGEN_NUM_HEADS_TEXT, ", ", MLAGEN_QK_DIM, ")");
}

at::Tensor decode_meta(MLAGEN_OP_PARAMS) {
  check_meta_q(q);
  return at::empty_symint({q.sym_size(0), q.sym_size(1), MLAGEN_V_DIM}, q.options().dtype(at::kBFloat16));
}

std::tuple<at::Tensor, at::Tensor> decode_lse_meta(MLAGEN_OP_PARAMS) {
  check_meta_q(q);
  return {at::empty_symint({q.sym_size(0), q.sym_size(1), MLAGEN_V_DIM}, q.options().dtype(at::kBFloat16)),
          at::empty_symint({q.sym_size(0), q.sym_size(1)}, q.options().dtype(at::kFloat))};
}

}  // namespace

// ---- the binding's side door (ctypes; no torch types) -----------------------------------------------

// The library this operator calls (the binding's library_path()); before the first call only.
MLAGEN_TORCH_API void mlagen_torch_set_library(const char* path) {
  std::lock_guard<std::mutex> lock(g_api_mutex);
  g_library_path = path ? path : "";
}

// The plan of the most recent call (an mlagen_plan_t* for mlagen_plan_info; plans live as long as
// the process), or NULL; `plan` replaces it (the binding's own calls: NULL).
MLAGEN_TORCH_API const void* mlagen_torch_last_plan(void) {
  const Plan* p = g_last.load(std::memory_order_relaxed);
  return p ? p->handle : nullptr;  // the library's plan, not this object's wrapper around it
}
MLAGEN_TORCH_API void mlagen_torch_forget_last(void) { g_last.store(nullptr, std::memory_order_relaxed); }
MLAGEN_TORCH_API int64_t mlagen_torch_num_plans(void) {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  return static_cast<int64_t>(g_plans.size());
}

// Reads and clears the device-side error word of every plan's scratch on `device` (synchronizing
// each queue); returns the first failing status, its message copied into `message`.
MLAGEN_TORCH_API int mlagen_torch_take_device_errors(int device, char* message, size_t capacity) {
  if (message && capacity) message[0] = 0;
  if (!g_api.load(std::memory_order_acquire)) return MLAGEN_OK;  // no call yet: nothing to read
  const Api& a = api();
  std::vector<std::pair<void*, void*>> words;  // (workspace, queue)
  {
    std::lock_guard<std::mutex> lock(g_plans_mutex);
    for (auto& [key, plan] : g_plans) {
      if (plan->device != device) continue;
      std::lock_guard<std::mutex> plan_lock(plan->mutex);
      for (const Scratch& s : plan->scratch)
        for (const at::Tensor* ws : {&s.eager, &s.captured})
          if (ws->defined()) words.emplace_back(ws->data_ptr(), s.queue);
    }
  }
  const c10::DeviceIndex previous = c10::cuda::current_device();
  if (previous != device) c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  int first = MLAGEN_OK;
  std::string first_message;
  for (const auto& [ws, queue] : words) {
    uint32_t errors = 0;
    const mlagen_status st = a.take_device_errors(ws, queue, &errors);
    if (st != MLAGEN_OK && first == MLAGEN_OK) first = st, first_message = a.last_error();
  }
  if (previous != device) c10::cuda::set_device(previous);
  if (message && capacity) std::snprintf(message, capacity, "%s", first_message.c_str());
  return first;
}

// The schemas the Python registration (runtime/python/mlagen/ops.py) infers: either can serve.
#define MLAGEN_OP_SCHEMA_PARAMS                                                                                   \
  "(Tensor q, Tensor kv, Tensor? kv_scale, Tensor qo_indptr, Tensor? kv_indptr, str kv_format, str q_dtype, "     \
  "SymInt kv_seq_len, float sm_scale, Tensor? q_scale=None, SymInt q_len=0, Tensor? page_table=None, "            \
  "Tensor? kv_lens=None, SymInt page_size=0, Tensor? kv_indices=None, Tensor? kv_last_page_len=None)"

TORCH_LIBRARY(mlagen, m) {
  m.def("decode" MLAGEN_OP_SCHEMA_PARAMS " -> Tensor");
  m.def("decode_lse" MLAGEN_OP_SCHEMA_PARAMS " -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mlagen, CUDA, m) {
  m.impl("decode", &decode_cuda);
  m.impl("decode_lse", &decode_lse_cuda);
}

TORCH_LIBRARY_IMPL(mlagen, Meta, m) {
  m.impl("decode", &decode_meta);
  m.impl("decode_lse", &decode_lse_meta);
}

// ---- the binding's per-call entry (CPython) -------------------------------------------------------
// mlagen.decode's common case and the serving decoder call the CUDA path above through this one
// CPython function: torch.ops' argument parsing against the schema and the dispatcher cost more host
// time than the whole launch (bench/host.py). It takes the operator's arguments positionally, then the
// LSE flag, and answers NotImplemented (the caller then calls torch.ops.mlagen.*) wherever the
// dispatcher has a part to play: a tensor subclass (FakeTensor, FunctionalTensor), a dispatch mode,
// RecordFunction callbacks (the profiler), a tensor that requires grad.
#if MLAGEN_TORCH_PYTHON
#include <Python.h>
#include <ATen/record_function.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

constexpr Py_ssize_t kFastArgs = 17;  // the operator's 16, then the LSE flag

// A tensor argument: true with *t set (nullptr for None where optional); false: not a plain tensor.
bool fast_tensor(PyObject* o, const at::Tensor** t, bool optional) {
  if (o == Py_None && optional) {
    *t = nullptr;
    return true;
  }
  if (!THPVariable_CheckExact(o)) return false;
  *t = &THPVariable_Unpack(o);
  return !(*t)->requires_grad();
}

bool fast_int(PyObject* o, int64_t* v) {
  if (!PyLong_CheckExact(o)) return false;
  *v = PyLong_AsLongLong(o);
  return !(*v == -1 && PyErr_Occurred());
}

bool fast_text(PyObject* o, c10::string_view* v) {
  if (!PyUnicode_CheckExact(o)) return false;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(o, &n);
  if (!s) return false;
  *v = c10::string_view(s, static_cast<size_t>(n));
  return true;
}

// Runs a parsed call (the GIL released, as the operators run: another thread may call meanwhile) and
// wraps its output (and LSE); NotImplemented off CUDA (the dispatcher's error).
PyObject* run_wrapped(const Call& c) {
  if (c.t[kQ]->device().type() != c10::DeviceType::CUDA) Py_RETURN_NOTIMPLEMENTED;
  std::tuple<at::Tensor, at::Tensor> res;
  {
    pybind11::gil_scoped_release no_gil;
    res = run(c);
  }
  PyObject* out = THPVariable_Wrap(std::move(std::get<0>(res)));
  if (!c.lse || !out) return out;
  PyObject* l = THPVariable_Wrap(std::move(std::get<1>(res)));
  if (!l) {
    Py_DECREF(out);
    return nullptr;
  }
  PyObject* pair = PyTuple_Pack(2, out, l);
  Py_DECREF(out);
  Py_DECREF(l);
  return pair;
}

PyObject* fast_decode(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != kFastArgs) {
    PyErr_Format(PyExc_TypeError, "mlagen fast decode: %zd arguments, expected %zd", n, kFastArgs);
    return nullptr;
  }
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::hasCallbacks()) Py_RETURN_NOTIMPLEMENTED;
  Call c{};
  c10::string_view kv_format, q_dtype;
  int64_t kv_seq_len = 0, q_len = 0, page_size = 0;
  double sm_scale = PyFloat_AsDouble(args[8]);
  if (sm_scale == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  const bool ok = fast_tensor(args[0], &c.t[kQ], false) && fast_tensor(args[1], &c.t[kKv], false) &&
                  fast_tensor(args[2], &c.t[kKvScale], true) && fast_tensor(args[3], &c.t[kQo], false) &&
                  fast_tensor(args[4], &c.t[kKvIndptr], true) && fast_text(args[5], &kv_format) &&
                  fast_text(args[6], &q_dtype) && fast_int(args[7], &kv_seq_len) &&
                  fast_tensor(args[9], &c.t[kQScale], true) && fast_int(args[10], &q_len) &&
                  fast_tensor(args[11], &c.t[kPageTable], true) && fast_tensor(args[12], &c.t[kKvLens], true) &&
                  fast_int(args[13], &page_size) && fast_tensor(args[14], &c.t[kKvIndices], true) &&
                  fast_tensor(args[15], &c.t[kLastPage], true);
  if (!ok) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;  // the operator's own parsing names what is wrong
  }
  const bool lse = PyObject_IsTrue(args[16]) == 1;
  set_scalars(&c, kv_format, q_dtype, kv_seq_len, sm_scale, q_len, page_size, lse);
  return run_wrapped(c);
  END_HANDLE_TH_ERRORS
}

// ---- the leaderboard's call, config included ------------------------------------------------------
// decode()'s plain case and the leaderboard entry: (q, kv_data, qo_indptr, kv_indptr, config,
// kv_format, q_dtype), and decode()'s paged call with (page_table, kv_lens, page_size, kv_indices,
// kv_last_page_len) after them; kv_data the leaderboard's dict or one entry of it, config read through the
// fields the binding parsed from an equal config last (remember_config). The Python layers between a
// caller and fast_decode (the entry's unpacking, the config's cache, the shape checks against it)
// cost ~2 us of host time a call on the H200's host, half a launch (docs/perf.md, the serving
// matrix's host bullet). NotImplemented
// wherever the binding has something to say: a config it has not parsed, an entry of another form, a
// format or q dtype it names an error for, a shape that disagrees with the config (its message names
// the key), and wherever fast_decode answers it.
struct ConfigFields {
  int64_t batch, heads, kv_len, q_len;  // -1: not in the config (kv_len 0: lengths differ)
  double sm_scale;
};
PyObject* g_config = nullptr;  // a copy of the config g_fields are of (the GIL guards both)
ConfigFields g_fields{};

// (config copy, batch | None, heads | None, kv_len, sm_scale, q_len | None): the binding's parse.
PyObject* remember_config(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (n != 6 || !PyDict_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "mlagen remember_config: (dict, batch, heads, kv_len, sm_scale, q_len)");
    return nullptr;
  }
  auto opt_int = [](PyObject* o) { return o == Py_None ? int64_t{-1} : static_cast<int64_t>(PyLong_AsLongLong(o)); };
  ConfigFields f{opt_int(args[1]), opt_int(args[2]), opt_int(args[3]), opt_int(args[5]), PyFloat_AsDouble(args[4])};
  if (PyErr_Occurred()) return nullptr;
  Py_INCREF(args[0]);
  Py_XSETREF(g_config, args[0]);
  g_fields = f;
  Py_RETURN_NONE;
}

bool known(c10::string_view v, const char* const* names, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (v == names[i]) return true;
  return false;
}

PyObject* fast_call(PyObject*, PyObject* const* args, Py_ssize_t n) {
  HANDLE_TH_ERRORS
  if (n != 7 && n != 12) {
    PyErr_Format(PyExc_TypeError, "mlagen fast call: %zd arguments, expected 7 (or 12: then the page arguments "
                 "page_table, kv_lens, page_size, kv_indices, kv_last_page_len)", n);
    return nullptr;
  }
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::hasCallbacks()) Py_RETURN_NOTIMPLEMENTED;
  PyObject* const config = args[4];
  if (!g_config || !PyDict_CheckExact(config)) Py_RETURN_NOTIMPLEMENTED;
  if (config != g_config) {
    const int same = PyObject_RichCompareBool(config, g_config, Py_EQ);
    if (same != 1) {
      PyErr_Clear();
      Py_RETURN_NOTIMPLEMENTED;
    }
  }
  c10::string_view kv_format, q_dtype;
  if (!fast_text(args[5], &kv_format) || !fast_text(args[6], &q_dtype) ||
      !known(kv_format, kMlagenKvBindings, std::size(kMlagenKvBindings)) || !known(q_dtype, kQDtypes, std::size(kQDtypes))) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  PyObject* entry = args[1];
  if (PyDict_CheckExact(entry)) {
    entry = PyDict_GetItemWithError(entry, args[5]);  // borrowed
    if (!entry) {
      PyErr_Clear();
      Py_RETURN_NOTIMPLEMENTED;
    }
  }
  Call c{};
  bool ok = false;
  if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2) {
    ok = fast_tensor(PyTuple_GET_ITEM(entry, 0), &c.t[kKv], false) &&
         fast_tensor(PyTuple_GET_ITEM(entry, 1), &c.t[kKvScale], true);
  } else {
    bool unscaled = false;  // a format without a scale may be its tensor alone
    for (const MlagenKvFormat& f : kMlagenKvFormats) unscaled |= kv_format == f.binding && f.scale == 0;
    ok = unscaled && fast_tensor(entry, &c.t[kKv], false);
  }
  ok = ok && fast_tensor(args[0], &c.t[kQ], false) && fast_tensor(args[2], &c.t[kQo], false) &&
       fast_tensor(args[3], &c.t[kKvIndptr], true);
  int64_t page_size = 0;
  if (n == 12)
    ok = ok && fast_tensor(args[7], &c.t[kPageTable], true) && fast_tensor(args[8], &c.t[kKvLens], true) &&
         fast_int(args[9], &page_size) && fast_tensor(args[10], &c.t[kKvIndices], true) &&
         fast_tensor(args[11], &c.t[kLastPage], true);
  if (!ok) PyErr_Clear();
  const ConfigFields& f = g_fields;
  if (!ok || (f.batch >= 0 && c.t[kQo]->numel() != f.batch + 1) ||
      (f.heads >= 0 && c.t[kQ]->dim() == 3 && c.t[kQ]->size(1) != f.heads))
    Py_RETURN_NOTIMPLEMENTED;  // the binding's checks name it
  set_scalars(&c, kv_format, q_dtype, f.kv_len, f.sm_scale, f.q_len >= 0 ? f.q_len : 0, page_size, false);
  // the KV tensors are the dict's: held while the call runs without the GIL (another thread may
  // change the dict meanwhile)
  struct Hold {
    PyObject* o;
    ~Hold() { Py_DECREF(o); }
  } hold{(Py_INCREF(entry), entry)};
  try {
    return run_wrapped(c);
  } catch (const std::exception&) {
    Py_RETURN_NOTIMPLEMENTED;  // the binding's path raises it again, its message naming the config's key
  }
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_fast_def = {"decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_decode)),
                          METH_FASTCALL, "mlagen's per-call decode entry (ops.cpp)"};
PyMethodDef g_call_def = {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fast_call)),
                          METH_FASTCALL, "mlagen's per-call entry for the leaderboard's call, config included (ops.cpp)"};
PyMethodDef g_remember_def = {"remember_config",
                              reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(remember_config)),
                              METH_FASTCALL, "the fields the binding parsed from a config, for the per-call entry"};

}  // namespace

// The per-call entry as a Python callable (a new reference; call with the GIL held: ctypes.PyDLL).
MLAGEN_TORCH_API PyObject* mlagen_torch_fast_entry(void) { return PyCFunction_New(&g_fast_def, nullptr); }
// (the leaderboard call's entry, the config setter) as Python callables, likewise.
MLAGEN_TORCH_API PyObject* mlagen_torch_call_entries(void) {
  PyObject* call = PyCFunction_New(&g_call_def, nullptr);
  PyObject* remember = PyCFunction_New(&g_remember_def, nullptr);
  PyObject* pair = call && remember ? PyTuple_Pack(2, call, remember) : nullptr;
  Py_XDECREF(call);
  Py_XDECREF(remember);
  return pair;
}
#endif
