// Runs the real AMD kernel source (mla_decode_gfx9.cuh + the shared combine kernel) on the
// CPU through emu_hip.h and compares with a float64 attention on the same (dequantized)
// inputs, for every KV format the gfx9 kernel implements: fp8 (the arch's flavour, per-tensor
// scale), bf16 and mxfp4 (E2M1 + E8M0 scales, row strides 18 and 24), with bf16 or fp8 q.
// KV rows contiguous or paged (block table or FlashInfer's page indptr form, pages in random
// order, a page shared by two sequences); every case checks the LSE too, and flagged sequences
// (bad indptr, a page id outside the cache) must come out NaN, alone, with the error bit.
// Query rows: 16 heads x 1 token, and (run_rows_format) 8 / 32 / 128 heads and 1..4 query tokens
// a sequence, causal among them (the reference applies the rule: token t of n sees the first
// kv_len - n + 1 + t rows; none: output 0, LSE -inf).
// Then (run_q8_format) a bf16 q that the kernel quantizes to fp8 (the _amax entry first, as
// runtime/src/launch.cpp does), and (run_bad_qo_format) a qo_indptr that disagrees with several query tokens.
// Usage: emu [format substring] [base|rows|qo|q8]. Built and run by tests/cpu/test_amd_emulation.py
// for gfx950 (-D__gfx950__) and gfx942 (-D__gfx942__: formats.cuh's e4m3fnuz range for a q
// quantized here).
// The KV tensor and the mxfp4 scale tensor end at a PROT_NONE page: a kernel that reads
// past either (the scale window's last, partial chunk included, or a bad page) crashes the run.
// Prints one line a case; exit status 1 if any case is off.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

// q_amax_kernel (formats.cuh) reduces its waves' maxima through a function-scope __shared__
// array, the combine (mla_common.cuh, which formats.cuh includes) its split groups' states. emu_hip.h defines __shared__ as nothing (the decode kernels' LDS is `smem` or
// namespace-scope statics), which would make that array one per thread; formats.cuh is
// therefore included first with __shared__ = static: one array for the block's threads
// (blocks run one at a time). No other __shared__ in the headers formats.cuh pulls in.
#undef __shared__
#define __shared__ static
#include "mlagen/device/formats.cuh"
#undef __shared__
#define __shared__
#include "mlagen/device/mla_decode_gfx9.cuh"

namespace mlagen::device {
alignas(64) uint8_t smem[160 * 1024];  // the block's LDS (gfx950's 160 KB): blocks run one at a time
}
using namespace mlagen::device;

// Runs the grid's blocks one at a time, (y, x) in order, x fastest, on one std::thread per
// GPU thread of a block, created once a launch (not once a block: the emulator's time on a
// 2-core CI box is mostly thread creation and barrier wake-ups). Between two blocks every
// thread meets at `between`, whose completion step gives the next block fresh barriers and
// __syncthreads_or words and poisons the LDS: nothing may read LDS it did not write.
// reverse: the blocks run last to first (a GPU runs them in any order: a block that writes
// rows another block owns shows when it runs after that block).
template <class Kernel>
void launch(Kernel kernel, int gx, int gy, int threads, const Params& p, bool reverse = false) {
  const int nblocks = gx * gy;
  if (nblocks <= 0) return;
  EmuBlock blk;
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<std::barrier<>>> wave_bars(threads / 64);
  auto next_block = [&]() noexcept {
    bar = std::make_unique<std::barrier<>>(threads);
    blk.bar = bar.get();
    for (size_t w = 0; w < wave_bars.size(); ++w) {
      wave_bars[w] = std::make_unique<std::barrier<>>(64);
      blk.wave[w].bar = wave_bars[w].get();
    }
    blk.any[0] = blk.any[1] = blk.any[2] = 0u;
    std::memset(smem, 0xa5, sizeof(smem));
  };
  next_block();
  emu_block = &blk;
  std::barrier between(threads, next_block);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      threadIdx.x = t;
      emu_lane = t % 64;
      emu_wave = t / 64;
      gridDim.x = gx, gridDim.y = gy, gridDim.z = 1;
      blockDim.x = threads, blockDim.y = blockDim.z = 1;
      for (int k0 = 0; k0 < nblocks; ++k0) {
        const int k = reverse ? nblocks - 1 - k0 : k0;
        blockIdx.x = k % gx;
        blockIdx.y = k / gx;
        emu_or_calls = 0;  // the block's __syncthreads_or calls (see emu_hip.h)
        kernel(p);
        between.arrive_and_wait();
      }
    });
  for (auto& t : ts) t.join();
}

// `bytes` that end exactly where a PROT_NONE page begins, so that reading one byte past them
// faults. The start is 16-byte aligned when `bytes` is a multiple of 16 (the KV rows); the
// mxfp4 scale tensor is sized exactly, whatever its alignment (the CPU does not care, and
// only then does a read of the window's last chunk past the tile's last scale byte fault).
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    len_ = (bytes + page - 1) / page * page + page;
    base_ = static_cast<uint8_t*>(mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base_ == MAP_FAILED || mprotect(base_ + len_ - page, page, PROT_NONE) != 0) std::abort();
    data_ = base_ + len_ - page - bytes;
  }
  ~GuardedBuffer() { munmap(base_, len_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* base_;
  uint8_t* data_;
  size_t len_;
};

static uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// The emulated arch's fp8 flavour: is the code a NaN (never generated), its largest value.
static bool fp8_is_nan(uint32_t c) {
#if defined(__gfx950__)
  return (c & 0x7f) == 0x7f;
#else
  return c == 0x80;
#endif
}
#if defined(__gfx950__)
constexpr float kHostFp8Max = 448.f;
#else
constexpr float kHostFp8Max = 240.f;
#endif

// Nearest fp8 code of x (per-tensor quantization as the leaderboard does it, q = x / scale).
static uint8_t fp8_encode(float x) {
  int best = 0;
  float err = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if (fp8_is_nan(c)) continue;
    const float e = std::fabs(emu_fp8_decode(c) - x);
    if (e < err) err = e, best = c;
  }
  return static_cast<uint8_t>(best);
}

// x (|x| <= kHostFp8Max) rounded to the arch's e4m3 grid, ties to the even code (= round to
// nearest even: a code's low bit is its mantissa's), as a float: the conversion of a bf16 q
// that the library quantizes (formats.cuh round_fp8; torch's .to(float8)).
static float fp8_round_rne(float x) {
  float best = 0.f, err = INFINITY;
  for (int c = 0; c < 128; ++c) {  // magnitudes
    if (fp8_is_nan(c)) continue;
    const float v = emu_fp8_decode(c), e = std::fabs(v - std::fabs(x));
    if (e < err || (e == err && (c & 1) == 0)) err = e, best = v;
  }
  return std::copysign(best, x);
}

static double e2m1(uint32_t nib) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
}

struct Format {
  const char* name;
  KvFormat kv;
  QFormat q;
  int scale_stride;  // mxfp4: bytes between two tokens' scale rows (18 = unpadded)
};

// One case: sequence lengths, splits and where the KV rows live.
struct Case {
  const char* name;
  std::vector<int> lens;
  int splits;
  uint32_t seed;
  bool corrupt = false;  // shift one kv_indptr entry: the kernel's device-side check must flag it (NaN rows)
  float q_mul = 1.f;     // q drawn times this (3e5: |q| past f16's 65504, which a bf16 q holds)
  int row_pad = 0;       // bytes between KV rows beyond the row itself (a strided KV view)
  int page = 0;          // 0: contiguous rows at kv_indptr; else pages of this many rows, in random order
  enum Form { kTableLens, kTableIndptr, kFlashInfer } form = kTableLens;  // paged: how the page lists come
  int bad_page_seq = -1;  // paged: this sequence's middle page id is num_pages (outside the cache)
  int heads = 16;           // query heads (8..128); the block owns 16 query rows (shapes.cuh QueryRows)
  std::vector<int> qlens;   // query tokens of each sequence (empty: 1 each); causal among them
  int q_len = 0;            // Params::q_len: the most a sequence has (0: the largest of qlens)
  // qo_indptr entries (index, value) set after it is built from qlens: what the kernel is told
  // then disagrees with where the rows are (qlens); the kernel must flag it (shapes.cuh read_query)
  std::vector<std::pair<int, int32_t>> qo_set;
  bool reverse = false;     // every grid's blocks run last to first
};

// Where logical token t of sequence b lives (row[b][t] of the cache; -1 = the bad page) and the
// page lists the kernel reads. Paged: every page of a sequence is a distinct random page of the
// cache, except that sequence 1's first page is sequence 0's (prefix sharing), and the cache
// holds 3 pages no sequence uses. Block-table entries past a sequence's pages hold garbage.
struct KvLayout {
  int64_t num_rows = 0;
  std::vector<std::vector<int64_t>> row;
  std::vector<int32_t> table, page_indptr, last_page_len, kv_lens;
  int64_t table_stride = 0, num_pages = 0;
  int width = 0, shift = 0;
};
static KvLayout make_layout(const Case& c, const std::vector<int32_t>& kv_indptr, std::mt19937& rng) {
  const int batch = static_cast<int>(c.lens.size());
  KvLayout L;
  L.row.resize(batch);
  if (c.page == 0) {
    L.num_rows = kv_indptr[batch];
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < c.lens[b]; ++t) L.row[b].push_back(kv_indptr[b] + t);
    return L;
  }
  const int P = c.page;
  while ((1 << L.shift) < P) ++L.shift;
  std::vector<int> npages(batch);
  int distinct = 0;
  for (int b = 0; b < batch; ++b) npages[b] = (c.lens[b] + P - 1) / P, distinct += npages[b];
  const bool share = batch >= 2 && npages[0] > 0 && npages[1] > 0;
  distinct -= share;
  L.num_pages = distinct + 3;
  L.num_rows = L.num_pages * P;
  std::vector<int32_t> perm(L.num_pages);
  for (int k = 0; k < L.num_pages; ++k) perm[k] = k;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> pages(batch);
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int k = 0; k < npages[b]; ++k) pages[b].push_back(b == 1 && k == 0 && share ? pages[0][0] : perm[next++]);
  if (c.bad_page_seq >= 0) pages[c.bad_page_seq][npages[c.bad_page_seq] / 2] = static_cast<int32_t>(L.num_pages);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < c.lens[b]; ++t) {
      const int32_t pg = pages[b][t / P];
      L.row[b].push_back(pg < L.num_pages ? static_cast<int64_t>(pg) * P + t % P : -1);
    }
    L.kv_lens.push_back(c.lens[b]);
    L.width = std::max(L.width, npages[b] + 1);
  }
  if (c.form == Case::kFlashInfer) {
    L.page_indptr.push_back(0);
    for (int b = 0; b < batch; ++b) {
      L.table.insert(L.table.end(), pages[b].begin(), pages[b].end());
      L.page_indptr.push_back(static_cast<int32_t>(L.table.size()));
      L.last_page_len.push_back(npages[b] ? c.lens[b] - (npages[b] - 1) * P : 0);
    }
  } else {
    L.table_stride = L.width + 2;
    L.table.assign(static_cast<size_t>(batch) * L.table_stride, -12345);  // garbage past each list
    for (int b = 0; b < batch; ++b) std::copy(pages[b].begin(), pages[b].end(), L.table.begin() + b * L.table_stride);
  }
  return L;
}

// Shape: DynamicShape (lengths from kv_indptr or the page lists, query tokens from qo_indptr) or
// a StaticShape<batch, kv_len, splits, page, heads, q_len>. Query rows are (token, head) pairs
// of c.heads heads, c.qlens[b] tokens a sequence, causal: token t of n sees the first
// kv_len - n + 1 + t KV rows (none: output 0, LSE -inf). Every case also asks for the LSE (at a
// padded row stride, the padding checked untouched) and checks it against ln sum_t exp(s_t) in
// float64. QF = kFp8FromBf16: the q is bf16 and the kernel quantizes it (runtime/src/launch.cpp.s sequence:
// q_amax_kernel's per-block maxima, then the fp8-q kernel's kFp8FromBf16 instantiation); the
// reference takes q quantized by the library's recipe (formats.cuh q_setup, quant.py).
// A qo_indptr that disagrees (c.qo_set, or qlens outside 1..q_len on the generic kernel): the
// flagged sequence's rows as shapes.cuh read_query says (the static shape: its own rows
// b * q_len ..; the generic kernel: row qo_indptr[b] when its range is not empty and starts
// inside total_q, else none) must be NaN, every other row of its range untouched, and every
// other sequence right.
template <KvFormat KF, QFormat QF, class Shape>
static bool run_case(const Format& fmt, const Case& c) {
  const std::vector<int>& lens = c.lens;
  const int batch = static_cast<int>(lens.size()), splits = c.splits, H = c.heads;
  std::vector<int> qlens = c.qlens.empty() ? std::vector<int>(batch, 1) : c.qlens;
  const int q_len = c.q_len ? c.q_len : *std::max_element(qlens.begin(), qlens.end());
  const int groups = (H * q_len + kGroupRows - 1) / kGroupRows;  // blocks of 16 query rows a sequence
  std::vector<int32_t> kv_indptr(batch + 1, 0), qo_indptr(batch + 1, 0);
  for (int b = 0; b < batch; ++b) kv_indptr[b + 1] = kv_indptr[b] + lens[b];
  for (int b = 0; b < batch; ++b) qo_indptr[b + 1] = qo_indptr[b] + qlens[b];
  const int total_q = qo_indptr[batch];  // token rows of q / out
  const std::vector<int32_t> qo_rows = qo_indptr;  // where each sequence's token rows are
  for (const auto& [at, v] : c.qo_set) qo_indptr[at] = v;  // what the kernel is told
  std::mt19937 rng(c.seed);
  const KvLayout L = make_layout(c, kv_indptr, rng);
  const int64_t total = L.num_rows;  // rows of the cache
  if (c.corrupt) kv_indptr[1] += 3;
  std::normal_distribution<float> normal;

  // q: bf16, or fp8 codes with a per-tensor scale; qd = the values the kernel sees (for a bf16 q
  // quantized by the kernel: the library's recipe, in bf16 arithmetic as quant.quantize_fp8
  // does it: scale = bf16(amax / fp8_max), q8 = fp8(clamp(bf16(q / scale), +-fp8_max)))
  const size_t nq = static_cast<size_t>(total_q) * H * kQkDim;
  std::vector<uint16_t> q_bf16(nq);
  std::vector<uint8_t> q_fp8(nq);
  std::vector<double> qd(nq);
  float q_scale = 1.f;
  {
    std::vector<float> x(nq);
    float amax = 0.f;
    for (auto& v : x) v = c.q_mul * normal(rng), amax = std::max(amax, std::fabs(v));
    if constexpr (QF == QFormat::kFp8FromBf16)  // the largest |q| in the last token row: the last pre-pass block's
      x[nq - 1] = -1.25f * amax;
    q_scale = amax / kHostFp8Max;
    for (size_t e = 0; e < nq; ++e) {
      if constexpr (QF == QFormat::kFp8) {
        q_fp8[e] = fp8_encode(x[e] / q_scale);
        qd[e] = static_cast<double>(emu_fp8_decode(q_fp8[e])) * q_scale;
      } else {
        q_bf16[e] = to_bf16(x[e]);
        qd[e] = from_bf16(q_bf16[e]);
      }
    }
    if constexpr (QF == QFormat::kFp8FromBf16) {
      float bmax = 0.f;
      for (size_t e = 0; e < nq; ++e) bmax = std::max(bmax, std::fabs(from_bf16(q_bf16[e])));
      q_scale = from_bf16(to_bf16(std::max(bmax, 1e-12f) / kHostFp8Max));
      for (size_t e = 0; e < nq; ++e) {
        const float y = std::fmin(std::fmax(from_bf16(to_bf16(from_bf16(q_bf16[e]) / q_scale)), -kHostFp8Max), kHostFp8Max);
        qd[e] = static_cast<double>(fp8_round_rne(y)) * q_scale;
      }
    }
  }

  // KV rows and, for mxfp4, the scale rows; kvd = the dequantized [total][576] values
  const int kRowBytes = KvTraits<KF>::kRowDataBytes + c.row_pad;
  GuardedBuffer kv(static_cast<size_t>(total) * kRowBytes);
  const int sstride = fmt.scale_stride;
  // mxfp4 scales: a (total, 18) view with row stride sstride; its last row ends after 18 bytes
  GuardedBuffer scales(KF == KvFormat::kMxfp4 && total > 0 ? static_cast<size_t>(total - 1) * sstride + kMxBlocks : 0);
  std::vector<double> kvd(static_cast<size_t>(total) * kQkDim);
  const float kv_scale = 0.02f;
  for (int64_t t = 0; t < total; ++t) {
    uint8_t* row = kv.data() + static_cast<size_t>(t) * kRowBytes;
    double* out = &kvd[static_cast<size_t>(t) * kQkDim];
    if constexpr (KF == KvFormat::kFp8) {
      for (int d = 0; d < kQkDim; ++d) {
        uint8_t code;
        do code = static_cast<uint8_t>(rng() & 0xff);
        while (fp8_is_nan(code) || (code & 0x78) == 0x78);  // |value| <= 240 keeps S sane
        row[d] = code;
        out[d] = static_cast<double>(emu_fp8_decode(code)) * kv_scale;
      }
    } else if constexpr (KF == KvFormat::kBf16) {
      for (int d = 0; d < kQkDim; ++d) {
        const uint16_t h = to_bf16(normal(rng));
        std::memcpy(row + 2 * d, &h, 2);
        out[d] = from_bf16(h);
      }
    } else {
      uint8_t* srow = scales.data() + static_cast<size_t>(t) * sstride;
      for (int k = 0; k < (t + 1 < total ? sstride : kMxBlocks); ++k)  // 18 scales 2^-7 .. 2^3, then padding (NaN: unused)
        srow[k] = k < kMxBlocks ? static_cast<uint8_t>(120 + rng() % 11) : 255;
      for (int k = 0; k < kMxRowBytes; ++k) row[k] = static_cast<uint8_t>(rng() & 0xff);
      for (int d = 0; d < kQkDim; ++d)
        out[d] = e2m1((row[d / 2] >> (4 * (d & 1))) & 15) * std::ldexp(1.0, srow[d / kMxBlock] - 127);
    }
  }

  std::vector<uint16_t> out(static_cast<size_t>(total_q) * H * kVDim, 0xffff);  // poison (NaN)
  const size_t part_rows = static_cast<size_t>(batch) * splits * groups * kGroupRows;  // [batch, splits, groups, 16]
  std::vector<float2> part_ml(part_rows);
  std::vector<float> part_o(part_rows * kVDim, NAN);
  const int kLseStride = H + 3;  // padded: the 3 floats after each token's H must stay untouched
  constexpr float kLsePoison = 12345.f;
  std::vector<float> lse(static_cast<size_t>(total_q) * kLseStride, kLsePoison);
  uint32_t errors = 0;
  const float sm_scale = 1.f / 24.f;

  Params p{};
  p.q = QF == QFormat::kFp8 ? static_cast<const void*>(q_fp8.data()) : static_cast<const void*>(q_bf16.data());
  p.q_stride_token = static_cast<int64_t>(H) * kQkDim; p.q_stride_head = kQkDim;
  p.q_scale = QF == QFormat::kFp8 ? &q_scale : nullptr;
  // kFp8FromBf16: the pre-pass maxima (the workspace's 240 floats; those past q_amax_parts NaN:
  // a reader of one would make every output NaN), as runtime/src/launch.cpp make_params sets them
  std::vector<float> q_amax(kQAmaxParts, NAN);
  p.q_amax = QF == QFormat::kFp8FromBf16 ? q_amax.data() : nullptr;
  p.q_amax_parts = QF == QFormat::kFp8FromBf16 ? std::min(total_q, kQAmaxParts) : 0;
  p.kv = kv.data(); p.kv_stride_bytes = kRowBytes;
  p.kv_scale = KF == KvFormat::kFp8 ? &kv_scale : nullptr;
  p.kv_scales = KF == KvFormat::kMxfp4 ? scales.data() : nullptr;
  p.kv_scales_stride = KF == KvFormat::kMxfp4 ? sstride : 0;
  p.qo_indptr = qo_indptr.data(); p.kv_indptr = kv_indptr.data();
  p.out = out.data(); p.out_stride_token = static_cast<int64_t>(H) * kVDim; p.out_stride_head = kVDim;
  p.part_ml = part_ml.data(); p.part_o = part_o.data(); p.errors = &errors;
  p.lse = lse.data(); p.lse_stride_token = kLseStride;
  if (c.page) {
    p.page_table = L.table.data(); p.page_table_len = static_cast<int64_t>(L.table.size());
    p.page_table_stride = L.table_stride; p.page_table_width = L.width;
    p.page_shift = L.shift; p.num_pages = L.num_pages;
    p.kv_lens = c.form == Case::kTableLens ? L.kv_lens.data() : nullptr;
    if (c.form == Case::kFlashInfer) p.page_indptr = L.page_indptr.data(), p.last_page_len = L.last_page_len.data();
  }
  p.batch = batch; p.splits = splits; p.total_q = total_q; p.total_kv = total; p.sm_scale = sm_scale;
  p.num_heads = H; p.q_len = q_len; p.row_groups = groups;

  std::vector<uint32_t> counters(static_cast<size_t>(batch) * groups, 0u);  // [batch, groups], zeroed once as the workspace is
  p.split_counters = counters.data();
  constexpr QFormat QG = QF == QFormat::kFp8FromBf16 ? QFormat::kFp8 : QF;  // the generated kernel's q format
#if defined(__gfx950__)
  using TG = std::conditional_t<KF == KvFormat::kFp8, NativeFp8Tiling<KF, QG>, Tiling<32, 2, KF, QG>>;
#else
  using TG = Tiling<32, 2, KF, QG>;
#endif
  using T = typename TG::template WithQ<QF>;  // the fp8-q kernel's _q8 entry: its kFp8FromBf16 instantiation
  if constexpr (QF == QFormat::kFp8FromBf16) launch(q_amax_block<256>, p.q_amax_parts, 1, 256, p, c.reverse);
  launch(mla_decode_block<T, Shape>, splits * groups, batch, T::kThreads, p, c.reverse);  // launch.cpp's grid
  if (splits > 1 && !FusedCombine<TG>::value)
    launch(mla_combine_block<TG, Shape>, batch * groups * kGroupRows, 1, kCombineGroupThreads * combine_groups(splits), p, c.reverse);
  bool counters_reset = true;  // the merging block leaves every counter at 0 for the next call
  for (uint32_t v : counters) counters_reset &= v == 0u;
  constexpr bool kNativeFp8 = T::kBody == Body::kGfx950Fp8;
  // the pre-pass: part i holds max |q| over token rows i, i + parts, ...; the rest untouched
  bool amax_ok = true;
  if constexpr (QF == QFormat::kFp8FromBf16) {
    for (int i = 0; i < kQAmaxParts; ++i) {
      if (i >= p.q_amax_parts) {
        amax_ok &= std::isnan(q_amax[i]);
        continue;
      }
      float m = 0.f;
      for (int64_t r = i; r < total_q; r += p.q_amax_parts)
        for (int64_t e = r * H * kQkDim; e < (r + 1) * H * kQkDim; ++e) m = std::max(m, std::fabs(from_bf16(q_bf16[e])));
      amax_ok &= q_amax[i] == m;
    }
  }

  // Flagged sequences (the error word's bit; NaN output and LSE): 0 and 1 for a corrupted
  // kv_indptr (the static shape checks every entry against b * kv_len), the bad page's one, a
  // qo_indptr that disagrees (shapes.cuh read_query). The rows a flagged sequence makes NaN: its
  // own, or for the generic kernel's bad qo_indptr the first row of its range when the range is
  // not empty and starts inside total_q (else none); a row of a sequence that is not flagged
  // must stay right whatever a flagged one does, the others (a flagged sequence's rows it does
  // not name) untouched.
  std::vector<bool> flagged(batch, false);
  uint32_t want_errors = 0;
  enum : uint8_t { kUntouched, kRef, kNan };
  std::vector<uint8_t> want(total_q, kUntouched);
  std::vector<std::pair<int64_t, int>> nan_rows(batch);  // (first token row, tokens)
  for (int b = 0; b < batch; ++b) {
    if (c.corrupt && b < 2) flagged[b] = true, want_errors |= kDevErrKvIndptr;
    if (b == c.bad_page_seq) flagged[b] = true, want_errors |= kDevErrPageTable;
    nan_rows[b] = {qo_rows[b], qlens[b]};
    const int32_t qb = qo_indptr[b], qe = qo_indptr[b + 1], n = qe - qb;
    const bool bad_qo = Shape::kGeneric ? n < 1 || n > q_len || qb < 0 || qe > total_q
                                        : qb != b * q_len || n != q_len;
    if (!bad_qo) continue;
    flagged[b] = true, want_errors |= kDevErrQoIndptr;
    const bool own_row = n >= 1 && qb >= 0 && qb < total_q;  // the generic kernel: its range's first row
    nan_rows[b] = Shape::kGeneric ? std::pair<int64_t, int>{qb, own_row ? 1 : 0}
                                  : std::pair<int64_t, int>{static_cast<int64_t>(b) * q_len, q_len};
  }
  for (int b = 0; b < batch; ++b)
    if (!flagged[b])
      for (int t = 0; t < qlens[b]; ++t) want[qo_rows[b] + t] = kRef;
  for (int b = 0; b < batch; ++b)
    if (flagged[b])
      for (int t = 0; t < nan_rows[b].second; ++t)
        if (want[nan_rows[b].first + t] != kRef) want[nan_rows[b].first + t] = kNan;

  double num = 0, den = 0, lse_err = 0;
  bool finite = true, zeros_ok = true, nan_ok = true, lse_ok = true, untouched_ok = true;
  int nan_tokens = 0;  // token rows that must come out NaN
  for (int64_t tok = 0; tok < total_q; ++tok) {
    for (int e = H; e < kLseStride; ++e) lse_ok &= lse[tok * kLseStride + e] == kLsePoison;
    nan_tokens += want[tok] == kNan;
    for (int h = 0; h < H && want[tok] != kRef; ++h) {
      const size_t row = static_cast<size_t>(tok) * H + h;
      const float got_lse = lse[tok * kLseStride + h];
      for (int d = 0; d < kVDim; ++d) {
        const uint16_t got = out[row * kVDim + d];
        if (want[tok] == kNan) nan_ok &= std::isnan(from_bf16(got));
        else untouched_ok &= got == 0xffff;
      }
      if (want[tok] == kNan) nan_ok &= std::isnan(got_lse);
      else untouched_ok &= got_lse == kLsePoison;
    }
  }
  int rows_seeing_none = 0;  // (token, head) rows whose causal window is empty
  std::string off_rows;  // token rows of a sequence not flagged that are not finite (in the line when any)
  for (int b = 0; b < batch; ++b) {
    if (flagged[b]) continue;
    const int n_q = qlens[b];
    for (int tq = 0; tq < n_q; ++tq) {
      const int64_t tok = qo_rows[b] + tq;
      const int n = std::max(0, std::min(lens[b], lens[b] - n_q + 1 + tq));  // keys this token sees
      bool tok_finite = true;
      for (int h = 0; h < H; ++h) {
        const size_t row = static_cast<size_t>(tok) * H + h;
        const float got_lse = lse[tok * kLseStride + h];
        rows_seeing_none += n == 0;
        tok_finite &= std::isfinite(got_lse) || (n == 0 && got_lse == -INFINITY);
        for (int d = 0; d < kVDim; ++d) tok_finite &= std::isfinite(from_bf16(out[row * kVDim + d]));
        const double* qrow = &qd[row * kQkDim];
        std::vector<double> q8;  // the native kernel's per-row e4m3 q (bf16 q): its recipe, exactly
        if (kNativeFp8 && QF == QFormat::kBf16) {
          double amax = 0;
          for (int d = 0; d < kQkDim; ++d) amax = std::max(amax, std::fabs(qrow[d]));
          const float inv = amax > 0 ? 448.f / static_cast<float>(amax) : 1.f;
          const double scale = amax > 0 ? static_cast<float>(amax) / 448.f : 1.0;
          for (int d = 0; d < kQkDim; ++d)
            q8.push_back(emu_fp8_decode(emu_fp8_encode_rne(std::fmin(std::fmax(static_cast<float>(qrow[d]) * inv, -448.f), 448.f))) * scale);
          qrow = q8.data();
        }
        std::vector<double> s(n), o(kVDim, 0.0);
        double mx = -INFINITY, l = 0;
        for (int t = 0; t < n; ++t) {
          const double* krow = &kvd[static_cast<size_t>(L.row[b][t]) * kQkDim];
          double acc = 0;
          for (int d = 0; d < kQkDim; ++d) acc += qrow[d] * krow[d];
          s[t] = acc * sm_scale;
          mx = std::max(mx, s[t]);
        }
        for (int t = 0; t < n; ++t) {
          const double* vrow = &kvd[static_cast<size_t>(L.row[b][t]) * kQkDim];
          const double w = std::exp(s[t] - mx);
          l += w;
          for (int d = 0; d < kVDim; ++d) o[d] += w * vrow[d];
        }
        for (int d = 0; d < kVDim; ++d) {
          const double ref = n ? o[d] / l : 0.0;
          const float got = from_bf16(out[row * kVDim + d]);
          if (!std::isfinite(got)) finite = false;
          if (n == 0 && got != 0.f) zeros_ok = false;
          num += (got - ref) * (got - ref);
          den += ref * ref;
        }
        // LSE: -inf for a row that sees no key; else ln sum exp(s_t) = mx + ln l, to about float32
        // rounding (S is an fp32 sum of exact products of the kernel's own operands, l an fp32 sum
        // of v_exp_f32 values: 2e-7 relative seen; P's rounding to f16 / bf16 / e4m3 feeds only O)
        if (n == 0) {
          lse_ok &= got_lse == -INFINITY;
        } else {
          const double ref_lse = mx + std::log(l), err = std::fabs(got_lse - ref_lse);
          lse_err = std::max(lse_err, std::isnan(err) ? INFINITY : err / std::max(1.0, std::fabs(ref_lse)));
        }
      }
      if (!tok_finite) off_rows += (off_rows.empty() ? " non-finite-token-rows=" : ",") + std::to_string(tok);
    }
  }
  lse_ok &= lse_err < 1e-5;
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  // tests/tolerances.py: same_inputs (fp8 path: P in f16; wide path: P in bf16, 2^-9); the
  // native fp8 path rounds P to e4m3 (3 mantissa bits): same_inputs_p_fp8
  const double bound = kNativeFp8 ? 3e-2 : 4e-3;
  const bool ok = finite && zeros_ok && nan_ok && untouched_ok && lse_ok && amax_ok && errors == want_errors &&
                  counters_reset && rel < bound;
  std::printf("%-18s %-24s batch=%d splits=%d heads=%d q_len=%d groups=%d rel_l2=%.3e lse_err=%.1e finite=%d "
              "zeros_ok=%d(%d rows) nan_rows_ok=%d(%d tokens) untouched=%d errors=%u counters=%d%s%s%s%s %s\n",
              fmt.name, c.name, batch, splits, H, q_len, groups, rel, lse_err, finite, zeros_ok, rows_seeing_none, nan_ok,
              nan_tokens, untouched_ok, errors, counters_reset, kNativeFp8 ? " native-fp8" : "",
              QF == QFormat::kFp8FromBf16 ? " q-amax-ok=" : "", QF == QFormat::kFp8FromBf16 ? (amax_ok ? "1" : "0") : "",
              off_rows.c_str(), ok ? "ok" : "FAIL");
  return ok;
}

// The same kinds of case for every format: contiguous rows, then paged KV (page sizes 1, 16, 32,
// 64: rows scattered one by one, pages shorter than a tile, a page exactly a tile, pages longer
// than a tile; lengths not a multiple of the page; sequences 0 and 1 sharing a page; empty
// sequences; block table with lengths or with a token indptr, and FlashInfer's form), a page id
// outside the cache (split and one-split epilogues), and a compile-time page size.
template <KvFormat KF, QFormat QF>
static bool run_format(const Format& fmt, uint32_t seed) {
  using D = DynamicShape;
  bool ok = true;
  ok &= run_case<KF, QF, D>(fmt, {.name = "one-split", .lens = {64, 37}, .splits = 1, .seed = seed + 1});
  ok &= run_case<KF, QF, D>(fmt, {.name = "splits+tail+empty", .lens = {100, 0, 33, 257}, .splits = 3,
                                  .seed = seed + 2});
  ok &= run_case<KF, QF, D>(fmt, {.name = "more-splits-than-tiles", .lens = {40}, .splits = 5, .seed = seed + 3});
  ok &= run_case<KF, QF, StaticShape<3, 96, 2>>(fmt, {.name = "static-shape", .lens = {96, 96, 96}, .splits = 2,
                                                      .seed = seed + 4});
  ok &= run_case<KF, QF, StaticShape<3, 96, 2>>(fmt, {.name = "static-shape-bad-indptr", .lens = {96, 96, 96},
                                                      .splits = 2, .seed = seed + 5, .corrupt = true});
  if constexpr (QF == QFormat::kBf16)  // a bf16 q beyond f16's range (the fp8 path converts q to f16)
    ok &= run_case<KF, QF, D>(fmt, {.name = "q-beyond-f16", .lens = {100, 33}, .splits = 2, .seed = seed + 6,
                                    .q_mul = 3e5f});
  if constexpr (KF == KvFormat::kFp8)  // a strided KV view (rows 64 bytes apart beyond the row) and many splits
    ok &= run_case<KF, QF, D>(fmt, {.name = "strided-kv-8-splits", .lens = {1000, 300}, .splits = 8, .seed = seed + 7,
                                    .row_pad = 64});
  // 19 splits: the combine's three split groups of one row (7, 6, 6 splits), groups without tokens
  // where a sequence is shorter than its splits' tiles
  ok &= run_case<KF, QF, D>(fmt, {.name = "combine-split-groups", .lens = {1100, 0, 150}, .splits = 19, .seed = seed + 21});
  ok &= run_case<KF, QF, D>(fmt, {.name = "paged-p1", .lens = {37, 0, 70}, .splits = 2, .seed = seed + 8, .page = 1});
  ok &= run_case<KF, QF, D>(fmt, {.name = "paged-p16-indptr", .lens = {100, 45, 0, 33}, .splits = 3, .seed = seed + 9,
                                  .page = 16, .form = Case::kTableIndptr});
  ok &= run_case<KF, QF, D>(fmt, {.name = "paged-p64", .lens = {200, 64, 5}, .splits = 2, .seed = seed + 10,
                                  .page = 64});
  ok &= run_case<KF, QF, D>(fmt, {.name = "paged-p32-flashinfer", .lens = {100, 40, 0, 64}, .splits = 2,
                                  .seed = seed + 11, .row_pad = KF == KvFormat::kFp8 ? 64 : 0, .page = 32,
                                  .form = Case::kFlashInfer, .bad_page_seq = 3});
  ok &= run_case<KF, QF, D>(fmt, {.name = "paged-p16-bad-page-id", .lens = {100, 70, 33}, .splits = 3,
                                  .seed = seed + 12, .page = 16, .bad_page_seq = 1});
  // one bad row (page 1), one split: only some threads of one block meet it (block_any_bad)
  ok &= run_case<KF, QF, D>(fmt, {.name = "paged-p1-bad-page-1split", .lens = {64, 200, 5}, .splits = 1,
                                  .seed = seed + 14, .page = 1, .bad_page_seq = 1});
  ok &= run_case<KF, QF, StaticShape<3, 96, 2, 16>>(fmt, {.name = "static-paged-p16", .lens = {96, 96, 96}, .splits = 2,
                                                          .seed = seed + 13, .page = 16});
  return ok;
}

// Query rows other than 16 heads x 1 token (shapes.cuh QueryRows; a block owns 16 rows, row r =
// token r / heads, head r % heads): 8 heads (rows 8..15 of the block padding), 32 and 128 heads
// (2 and 8 row groups), 2 and 4 query tokens (causal: token t of n sees the first
// kv_len - n + 1 + t rows), tokens that see no key at all (kv_len < n: output 0, LSE -inf), splits
// in which some rows see no key (the last split holds 1 token), row groups past a shorter
// sequence's rows (non-uniform query lengths: nothing written), paged KV, and the compile-time
// shapes of heads / q_len. Small kv lengths: the emulator runs a thread per GPU thread.
template <KvFormat KF, QFormat QF>
static bool run_rows_format(const Format& fmt, uint32_t seed) {
  using D = DynamicShape;
  bool ok = true;
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h8", .lens = {50, 33}, .splits = 1, .seed = seed + 101, .heads = 8});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h8-q2-splits", .lens = {65, 0, 5}, .splits = 3, .seed = seed + 102,
                                  .heads = 8, .qlens = {2, 2, 2}});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h32-splits", .lens = {45, 64}, .splits = 2, .seed = seed + 103,
                                  .heads = 32});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h128", .lens = {40}, .splits = 1, .seed = seed + 104, .heads = 128});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h128-splits", .lens = {70}, .splits = 3, .seed = seed + 105,
                                  .heads = 128});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h32-q4-none", .lens = {3, 36}, .splits = 1, .seed = seed + 106,
                                  .heads = 32, .qlens = {4, 4}});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-h8-q4-splits", .lens = {66, 2}, .splits = 3, .seed = seed + 107,
                                  .heads = 8, .qlens = {4, 4}});
  // non-uniform query lengths (the generic kernel: 1..q_len a sequence); sequence 2: 1 KV row, 2 tokens
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-qo-1,3,2-splits", .lens = {40, 65, 1}, .splits = 2, .seed = seed + 108,
                                  .qlens = {1, 3, 2}, .q_len = 3});
  ok &= run_case<KF, QF, D>(fmt, {.name = "rows-q2-paged-p16", .lens = {40, 20}, .splits = 2, .seed = seed + 109,
                                  .page = 16, .qlens = {2, 2}});
  ok &= run_case<KF, QF, StaticShape<2, 65, 3, 0, 16, 2>>(fmt, {.name = "rows-static-q2-splits", .lens = {65, 65},
                                                                .splits = 3, .seed = seed + 110, .qlens = {2, 2}});
  ok &= run_case<KF, QF, StaticShape<1, 40, 1, 0, 16, 4>>(fmt, {.name = "rows-static-q4", .lens = {40}, .splits = 1,
                                                                .seed = seed + 111, .qlens = {4}});
  ok &= run_case<KF, QF, StaticShape<1, 45, 2, 0, 32, 1>>(fmt, {.name = "rows-static-h32-splits", .lens = {45},
                                                                .splits = 2, .seed = seed + 112, .heads = 32});
  return ok;
}

// The fp8 q that the library quantizes from a bf16 q (QFormat::kFp8FromBf16: q_amax_kernel's
// per-block maxima, then the per-tensor recipe in the decode's q_setup) with query rows: 32
// heads x 2 tokens (4 row groups, 4 pre-pass blocks) and 128 heads x 1 token (8 row groups, 2
// pre-pass blocks), both split, for each KV format of an fp8-q kernel. The tensor's largest |q|
// is planted in the last token row, so the decode's reduction must take every block's maximum.
template <KvFormat KF>
static bool run_q8_format(const Format& fmt, uint32_t seed) {
  constexpr QFormat Q = QFormat::kFp8FromBf16;
  using D = DynamicShape;
  bool ok = true;
  ok &= run_case<KF, Q, D>(fmt, {.name = "q8-h32-q2-splits", .lens = {45, 70}, .splits = 2, .seed = seed + 201,
                                 .heads = 32, .qlens = {2, 2}});
  ok &= run_case<KF, Q, D>(fmt, {.name = "q8-h128-splits", .lens = {66, 33}, .splits = 2, .seed = seed + 202,
                                 .heads = 128});
  return ok;
}

// A qo_indptr that disagrees with the query rows, q_len 2 (shapes.cuh read_query): on the
// generic kernel a sequence of 3 tokens (> q_len) or of 0, in the middle (its blocks run after
// the next sequence's: reversed grid) or last (qo_indptr[b] = total_q); on a static shape a
// sequence's entries off b * q_len (the end: 3 tokens; the beginning, split). The flagged
// sequence alone: error bit 2, the rows it names NaN (a sequence of 0 tokens none: its range's
// first row is the next sequence's, or past total_q), every other sequence right.
template <KvFormat KF, QFormat QF>
static bool run_bad_qo_format(const Format& fmt, uint32_t seed) {
  using D = DynamicShape;
  bool ok = true;
  ok &= run_case<KF, QF, D>(fmt, {.name = "qo-3-tokens>q_len", .lens = {40, 65, 33}, .splits = 2, .seed = seed + 301,
                                  .qlens = {2, 3, 1}, .q_len = 2});
  ok &= run_case<KF, QF, D>(fmt, {.name = "qo-0-tokens-reversed", .lens = {40, 50, 33}, .splits = 1,
                                  .seed = seed + 302, .qlens = {2, 0, 2}, .q_len = 2, .reverse = true});
  ok &= run_case<KF, QF, D>(fmt, {.name = "qo-0-tokens-last", .lens = {40, 33}, .splits = 2, .seed = seed + 303,
                                  .qlens = {2, 0}, .q_len = 2});
  ok &= run_case<KF, QF, StaticShape<2, 65, 1, 0, 16, 2>>(fmt, {.name = "qo-static-q2-bad-end", .lens = {65, 65},
                                                                .splits = 1, .seed = seed + 304, .qlens = {2, 2},
                                                                .qo_set = {{2, 5}}});
  ok &= run_case<KF, QF, StaticShape<2, 65, 3, 0, 16, 2>>(fmt, {.name = "qo-static-q2-splits-bad-begin",
                                                                .lens = {65, 65}, .splits = 3, .seed = seed + 305,
                                                                .qlens = {2, 2}, .qo_set = {{0, 1}}});
  return ok;
}

template <KvFormat KF, QFormat QF, bool kRun>
static bool run_bad_qo_if(const Format& fmt, uint32_t seed) {
  if constexpr (kRun) return run_bad_qo_format<KF, QF>(fmt, seed);
  return true;
}

int main(int argc, char** argv) {
  // optional argument: run only the formats whose name contains it (e.g. "mxfp4")
  const char* only = argc > 1 ? argv[1] : "";
  auto want = [&](const Format& f) { return std::strstr(f.name, only) != nullptr; };
  bool ok = true;
  const Format fp8_bf16{"kvfp8/qbf16", KvFormat::kFp8, QFormat::kBf16, 0};
  const Format fp8_fp8{"kvfp8/qfp8", KvFormat::kFp8, QFormat::kFp8, 0};
  const Format bf16_bf16{"kvbf16/qbf16", KvFormat::kBf16, QFormat::kBf16, 0};
  const Format bf16_fp8{"kvbf16/qfp8", KvFormat::kBf16, QFormat::kFp8, 0};
  const Format mx18{"kvmxfp4s18/qbf16", KvFormat::kMxfp4, QFormat::kBf16, 18};
  const Format mx24{"kvmxfp4s24/qfp8", KvFormat::kMxfp4, QFormat::kFp8, 24};
  // a bf16 q that the kernel quantizes (the fp8-q kernels' kFp8FromBf16 route)
  const Format fp8_q8{"kvfp8/qfp8<-bf16", KvFormat::kFp8, QFormat::kFp8FromBf16, 0};
  const Format bf16_q8{"kvbf16/qfp8<-bf16", KvFormat::kBf16, QFormat::kFp8FromBf16, 0};
  const Format mx24_q8{"kvmxfp4s24/qfp8<-bf16", KvFormat::kMxfp4, QFormat::kFp8FromBf16, 24};
  // a second optional argument: run only one part: "base" (run_format), "rows" (run_rows_format),
  // "qo" (run_bad_qo_format) or "q8" (run_q8_format)
  const char* part = argc > 2 ? argv[2] : "";
  auto in = [&](const char* name) { return !*part || std::strcmp(part, name) == 0; };
  auto run = [&](auto fn_base, auto fn_rows, auto fn_qo, const Format& f, uint32_t seed) {
    if (!want(f)) return;
    if (in("base")) ok &= fn_base(f, seed);
    if (in("rows")) ok &= fn_rows(f, seed);
    if (in("qo")) ok &= fn_qo(f, seed);
  };
  // the bad-qo_indptr cases for one format a KV format (QO): the flag and its NaN rows go through
  // each body's epilogue and the combine, whatever the q
#define MLAGEN_EMU_PARTS(KF, QF, QO) run_format<KF, QF>, run_rows_format<KF, QF>, run_bad_qo_if<KF, QF, QO>
  run(MLAGEN_EMU_PARTS(KvFormat::kFp8, QFormat::kBf16, true), fp8_bf16, 0);
  run(MLAGEN_EMU_PARTS(KvFormat::kFp8, QFormat::kFp8, false), fp8_fp8, 10);
  run(MLAGEN_EMU_PARTS(KvFormat::kBf16, QFormat::kBf16, false), bf16_bf16, 20);
  run(MLAGEN_EMU_PARTS(KvFormat::kBf16, QFormat::kFp8, true), bf16_fp8, 30);
  run(MLAGEN_EMU_PARTS(KvFormat::kMxfp4, QFormat::kBf16, false), mx18, 40);
  run(MLAGEN_EMU_PARTS(KvFormat::kMxfp4, QFormat::kFp8, true), mx24, 50);
#undef MLAGEN_EMU_PARTS
  if (in("q8")) {
    if (want(fp8_q8)) ok &= run_q8_format<KvFormat::kFp8>(fp8_q8, 60);
    if (want(bf16_q8)) ok &= run_q8_format<KvFormat::kBf16>(bf16_q8, 70);
    if (want(mx24_q8)) ok &= run_q8_format<KvFormat::kMxfp4>(mx24_q8, 80);
  }
  return ok ? 0 : 1;
}
