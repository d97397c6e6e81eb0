// Runs the real AMD kernel source (mla_decode_gfx9.cuh + the shared combine kernel) on the
// CPU through emu_hip.h and compares with a float64 attention on the same (dequantized)
// inputs, for every KV format the gfx9 kernel implements: fp8 (the arch's flavour, per-tensor
// scale), bf16 and mxfp4 (E2M1 + E8M0 scales, row strides 18 and 24), with bf16 or fp8 q.
// Built and run by tests/test_amd_emulation.py for gfx950 (-D__gfx950__) and gfx942.
// The KV tensor and the mxfp4 scale tensor end at a PROT_NONE page: a kernel that reads
// past either (the scale window's last, partial chunk included) crashes the run.
// Prints one line a case; exit status 1 if any case is off.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

#include "mlagen/device/mla_decode_gfx9.cuh"

namespace mlagen::device {
alignas(64) uint8_t smem[160 * 1024];  // the block's LDS (gfx950's 160 KB): blocks run one at a time
}
using namespace mlagen::device;

template <class Kernel>
void launch(Kernel kernel, int gx, int gy, int threads, const Params& p) {
  for (int by = 0; by < gy; ++by)
    for (int bx = 0; bx < gx; ++bx) {
      std::barrier<> bar(threads);
      EmuBlock blk;
      blk.bar = &bar;
      std::vector<std::unique_ptr<std::barrier<>>> wave_bars;
      for (int w = 0; w < threads / 64; ++w) {
        wave_bars.push_back(std::make_unique<std::barrier<>>(64));
        blk.wave[w].bar = wave_bars.back().get();
      }
      emu_block = &blk;
      std::memset(smem, 0xa5, sizeof(smem));  // poison: nothing may read LDS it did not write
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx.x = t;
          blockIdx.x = bx;
          blockIdx.y = by;
          emu_lane = t % 64;
          emu_wave = t / 64;
          kernel(p);
        });
      for (auto& t : ts) t.join();
    }
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

// Shape: DynamicShape (lengths from kv_indptr) or a StaticShape<batch, kv_len, splits>.
// corrupt: shift one kv_indptr entry so the kernel's device-side check must flag it (NaN rows).
template <KvFormat KF, QFormat QF, class Shape>
// q_mul: q drawn times this (3e5: |q| past f16's 65504, which a bf16 q holds).
// row_pad: bytes between KV rows beyond the row itself (a strided KV view).
static bool run_case(const Format& fmt, const char* name, const std::vector<int>& lens, int splits, uint32_t seed,
                     bool corrupt = false, float q_mul = 1.f, int row_pad = 0) {
  const int batch = static_cast<int>(lens.size());
  std::vector<int32_t> kv_indptr(batch + 1, 0), qo_indptr(batch + 1);
  for (int b = 0; b < batch; ++b) kv_indptr[b + 1] = kv_indptr[b] + lens[b];
  for (int b = 0; b <= batch; ++b) qo_indptr[b] = b;
  const int total = kv_indptr[batch];
  if (corrupt) kv_indptr[1] += 3;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;

  // q: bf16, or fp8 codes with a per-tensor scale; qd = the values the kernel sees
  const size_t nq = static_cast<size_t>(batch) * kHeads * kQkDim;
  std::vector<uint16_t> q_bf16(nq);
  std::vector<uint8_t> q_fp8(nq);
  std::vector<double> qd(nq);
  float q_scale = 1.f;
  {
    std::vector<float> x(nq);
    float amax = 0.f;
    for (auto& v : x) v = q_mul * normal(rng), amax = std::max(amax, std::fabs(v));
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
  }

  // KV rows and, for mxfp4, the scale rows; kvd = the dequantized [total][576] values
  const int kRowBytes = KvTraits<KF>::kRowDataBytes + row_pad;
  GuardedBuffer kv(static_cast<size_t>(total) * kRowBytes);
  const int sstride = fmt.scale_stride;
  // mxfp4 scales: a (total, 18) view with row stride sstride; its last row ends after 18 bytes
  GuardedBuffer scales(KF == KvFormat::kMxfp4 && total > 0 ? static_cast<size_t>(total - 1) * sstride + kMxBlocks : 0);
  std::vector<double> kvd(static_cast<size_t>(total) * kQkDim);
  const float kv_scale = 0.02f;
  for (int t = 0; t < total; ++t) {
    uint8_t* row = kv.data() + static_cast<size_t>(t) * kRowBytes;
    double* out = &kvd[static_cast<size_t>(t) * kQkDim];
    if constexpr (KF == KvFormat::kFp8) {
      for (int d = 0; d < kQkDim; ++d) {
        uint8_t c;
        do c = static_cast<uint8_t>(rng() & 0xff);
        while (fp8_is_nan(c) || (c & 0x78) == 0x78);  // |value| <= 240 keeps S sane
        row[d] = c;
        out[d] = static_cast<double>(emu_fp8_decode(c)) * kv_scale;
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

  std::vector<uint16_t> out(static_cast<size_t>(batch) * kHeads * kVDim, 0xffff);  // poison (NaN)
  std::vector<float2> part_ml(static_cast<size_t>(batch) * splits * kHeads);
  std::vector<float> part_o(static_cast<size_t>(batch) * splits * kHeads * kVDim, NAN);
  uint32_t errors = 0;
  const float sm_scale = 1.f / 24.f;

  Params p{};
  p.q = QF == QFormat::kFp8 ? static_cast<const void*>(q_fp8.data()) : static_cast<const void*>(q_bf16.data());
  p.q_stride_token = kHeads * kQkDim; p.q_stride_head = kQkDim;
  p.q_scale = QF == QFormat::kFp8 ? &q_scale : nullptr;
  p.kv = kv.data(); p.kv_stride_bytes = kRowBytes;
  p.kv_scale = KF == KvFormat::kFp8 ? &kv_scale : nullptr;
  p.kv_scales = KF == KvFormat::kMxfp4 ? scales.data() : nullptr;
  p.kv_scales_stride = KF == KvFormat::kMxfp4 ? sstride : 0;
  p.qo_indptr = qo_indptr.data(); p.kv_indptr = kv_indptr.data();
  p.out = out.data(); p.out_stride_token = kHeads * kVDim; p.out_stride_head = kVDim;
  p.part_ml = part_ml.data(); p.part_o = part_o.data(); p.errors = &errors;
  p.batch = batch; p.splits = splits; p.total_q = batch; p.total_kv = total; p.sm_scale = sm_scale;

  std::vector<uint32_t> counters(batch, 0u);  // zeroed once, as the workspace is
  p.split_counters = counters.data();
#if defined(__gfx950__)
  using T = std::conditional_t<KF == KvFormat::kFp8, NativeFp8Tiling<KF, QF>, Tiling<32, 2, KF, QF>>;
#else
  using T = Tiling<32, 2, KF, QF>;
#endif
  launch(mla_decode_kernel<T, Shape>, splits, batch, T::kThreads, p);
  if (splits > 1 && !FusedCombine<T>::value) launch(mla_combine_kernel<T, Shape>, batch * kHeads, 1, 128, p);
  bool counters_reset = true;  // the merging block leaves every counter at 0 for the next call
  for (uint32_t c : counters) counters_reset &= c == 0u;
  constexpr bool kNativeFp8 = T::kNative;
  if (corrupt) {  // sequences 0 and 1 are flagged: NaN there, the error word set
    bool nan01 = true;
    for (int b = 0; b < 2; ++b)
      for (int e = 0; e < kHeads * kVDim; ++e)
        nan01 &= std::isnan(from_bf16(out[static_cast<size_t>(b) * kHeads * kVDim + e]));
    const bool ok = nan01 && (errors & 1u) && counters_reset;
    std::printf("%-18s %-24s batch=%d splits=%d flagged=%u nan_rows=%d %s\n", fmt.name, name, batch, splits, errors,
                nan01, ok ? "ok" : "FAIL");
    return ok;
  }

  double num = 0, den = 0;
  bool finite = true, zeros_ok = true;
  for (int b = 0; b < batch; ++b) {
    const int n = lens[b];
    for (int h = 0; h < kHeads; ++h) {
      const double* qrow = &qd[(static_cast<size_t>(b) * kHeads + h) * kQkDim];
      std::vector<double> q8;  // the native kernel's per-head e4m3 q (bf16 q): its recipe, exactly
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
        const double* krow = &kvd[static_cast<size_t>(kv_indptr[b] + t) * kQkDim];
        double acc = 0;
        for (int d = 0; d < kQkDim; ++d) acc += qrow[d] * krow[d];
        s[t] = acc * sm_scale;
        mx = std::max(mx, s[t]);
      }
      for (int t = 0; t < n; ++t) {
        const double* vrow = &kvd[static_cast<size_t>(kv_indptr[b] + t) * kQkDim];
        const double w = std::exp(s[t] - mx);
        l += w;
        for (int d = 0; d < kVDim; ++d) o[d] += w * vrow[d];
      }
      for (int d = 0; d < kVDim; ++d) {
        const double ref = n ? o[d] / l : 0.0;
        const float got = from_bf16(out[(static_cast<size_t>(b) * kHeads + h) * kVDim + d]);
        if (!std::isfinite(got)) finite = false;
        if (n == 0 && got != 0.f) zeros_ok = false;
        num += (got - ref) * (got - ref);
        den += ref * ref;
      }
    }
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  // tests/tolerances.py: same_inputs (fp8 path: P in f16; wide path: P in bf16, 2^-9); the
  // native fp8 path rounds P to e4m3 (3 mantissa bits): same_inputs_p_fp8
  const double bound = kNativeFp8 ? 3e-2 : 4e-3;
  const bool ok = finite && zeros_ok && errors == 0 && counters_reset && rel < bound;
  std::printf("%-18s %-24s batch=%d splits=%d rel_l2=%.3e finite=%d zeros_ok=%d errors=%u counters=%d%s %s\n",
              fmt.name, name, batch, splits, rel, finite, zeros_ok, errors, counters_reset,
              kNativeFp8 ? " native-fp8" : "", ok ? "ok" : "FAIL");
  return ok;
}

// The same five kinds of case for one format.
template <KvFormat KF, QFormat QF>
static bool run_format(const Format& fmt, uint32_t seed) {
  bool ok = true;
  ok &= run_case<KF, QF, DynamicShape>(fmt, "one-split", {64, 37}, 1, seed + 1);
  ok &= run_case<KF, QF, DynamicShape>(fmt, "splits+tail+empty", {100, 0, 33, 257}, 3, seed + 2);
  ok &= run_case<KF, QF, DynamicShape>(fmt, "more-splits-than-tiles", {40}, 5, seed + 3);
  ok &= run_case<KF, QF, StaticShape<3, 96, 2>>(fmt, "static-shape", {96, 96, 96}, 2, seed + 4);
  ok &= run_case<KF, QF, StaticShape<3, 96, 2>>(fmt, "static-shape-bad-indptr", {96, 96, 96}, 2, seed + 5,
                                                /*corrupt=*/true);
  if constexpr (QF == QFormat::kBf16)  // a bf16 q beyond f16's range (the fp8 path converts q to f16)
    ok &= run_case<KF, QF, DynamicShape>(fmt, "q-beyond-f16", {100, 33}, 2, seed + 6, false, 3e5f);
  if constexpr (KF == KvFormat::kFp8)  // a strided KV view (rows 64 bytes apart beyond the row) and many splits
    ok &= run_case<KF, QF, DynamicShape>(fmt, "strided-kv-8-splits", {1000, 300}, 8, seed + 7, false, 1.f, 64);
  return ok;
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
  if (want(fp8_bf16)) ok &= run_format<KvFormat::kFp8, QFormat::kBf16>(fp8_bf16, 0);
  if (want(fp8_fp8)) ok &= run_format<KvFormat::kFp8, QFormat::kFp8>(fp8_fp8, 10);
  if (want(bf16_bf16)) ok &= run_format<KvFormat::kBf16, QFormat::kBf16>(bf16_bf16, 20);
  if (want(bf16_fp8)) ok &= run_format<KvFormat::kBf16, QFormat::kFp8>(bf16_fp8, 30);
  if (want(mx18)) ok &= run_format<KvFormat::kMxfp4, QFormat::kBf16>(mx18, 40);
  if (want(mx24)) ok &= run_format<KvFormat::kMxfp4, QFormat::kFp8>(mx24, 50);
  return ok ? 0 : 1;
}
