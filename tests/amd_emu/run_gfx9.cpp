// Runs the real AMD kernel source (mla_decode_gfx9.cuh + the shared combine kernel) on the
// CPU through emu_hip.h and compares with a float64 attention on the same inputs.
// Built and run by tests/test_amd_emulation.py for gfx950 (-D__gfx950__) and gfx942.
// Prints one line a case; exit status 1 if any case is off.
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "mlagen/device/mla_decode_gfx9.cuh"

namespace mlagen::device {
alignas(16) uint8_t smem[1 << 17];  // the block's LDS: blocks run one at a time
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

static uint16_t to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// Shape: DynamicShape (lengths from kv_indptr) or a StaticShape<batch, kv_len, splits>.
// corrupt: shift one kv_indptr entry so the kernel's device-side check must flag it (NaN rows).
template <class Shape>
static bool run_case(const char* name, const std::vector<int>& lens, int splits, uint32_t seed, bool corrupt = false) {
  const int batch = static_cast<int>(lens.size());
  std::vector<int32_t> kv_indptr(batch + 1, 0), qo_indptr(batch + 1);
  for (int b = 0; b < batch; ++b) kv_indptr[b + 1] = kv_indptr[b] + lens[b];
  for (int b = 0; b <= batch; ++b) qo_indptr[b] = b;
  const int total = kv_indptr[batch];
  if (corrupt) kv_indptr[1] += 3;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> q(static_cast<size_t>(batch) * kHeads * kQkDim);
  for (auto& v : q) v = to_bf16(normal(rng));
  std::vector<uint8_t> kv(static_cast<size_t>(std::max(total, 1)) * kQkDim);
  for (auto& v : kv) {
    uint8_t c;
    do c = static_cast<uint8_t>(rng() & 0xff);
#if defined(__gfx950__)
    while ((c & 0x7f) == 0x7f || (c & 0x78) == 0x78);  // no NaN; |value| <= 240 keeps S sane
#else
    while (c == 0x80 || (c & 0x78) == 0x78);  // fnuz NaN is 0x80
#endif
    v = c;
  }
  const float kv_scale = 0.02f, sm_scale = 1.f / 24.f;
  std::vector<uint16_t> out(static_cast<size_t>(batch) * kHeads * kVDim, 0xffff);  // poison (NaN)
  std::vector<float2> part_ml(static_cast<size_t>(batch) * splits * kHeads);
  std::vector<float> part_o(static_cast<size_t>(batch) * splits * kHeads * kVDim, NAN);
  uint32_t errors = 0;

  Params p{};
  p.q = q.data(); p.q_stride_token = kHeads * kQkDim; p.q_stride_head = kQkDim;
  p.kv = kv.data(); p.kv_stride_token = kQkDim; p.kv_scale = &kv_scale;
  p.qo_indptr = qo_indptr.data(); p.kv_indptr = kv_indptr.data();
  p.out = out.data(); p.out_stride_token = kHeads * kVDim; p.out_stride_head = kVDim;
  p.part_ml = part_ml.data(); p.part_o = part_o.data(); p.errors = &errors;
  p.batch = batch; p.splits = splits; p.total_q = batch; p.total_kv = total; p.sm_scale = sm_scale;

  using T = Tiling<32, 2>;
  launch(mla_decode_kernel<T, Shape>, splits, batch, T::kThreads, p);
  if (splits > 1) launch(mla_combine_kernel<Shape>, batch * kHeads, 1, 128, p);
  if (corrupt) {  // sequences 0 and 1 are flagged: NaN there, the error word set, the rest exact
    bool nan01 = true;
    for (int b = 0; b < 2; ++b)
      for (int e = 0; e < kHeads * kVDim; ++e)
        nan01 &= std::isnan(from_bf16(out[static_cast<size_t>(b) * kHeads * kVDim + e]));
    const bool ok = nan01 && (errors & 1u);
    std::printf("%-28s batch=%d splits=%d flagged=%u nan_rows=%d %s\n", name, batch, splits, errors, nan01,
                ok ? "ok" : "FAIL");
    return ok;
  }

  double num = 0, den = 0;
  bool finite = true, zeros_ok = true;
  for (int b = 0; b < batch; ++b) {
    const int n = lens[b];
    for (int h = 0; h < kHeads; ++h) {
      std::vector<double> s(n), o(kVDim, 0.0);
      double mx = -INFINITY, l = 0;
      for (int t = 0; t < n; ++t) {
        double acc = 0;
        for (int d = 0; d < kQkDim; ++d)
          acc += static_cast<double>(from_bf16(q[(static_cast<size_t>(b) * kHeads + h) * kQkDim + d])) *
                 emu_fp8_decode(kv[static_cast<size_t>(kv_indptr[b] + t) * kQkDim + d]) * kv_scale;
        s[t] = acc * sm_scale;
        mx = std::max(mx, s[t]);
      }
      for (int t = 0; t < n; ++t) {
        const double w = std::exp(s[t] - mx);
        l += w;
        for (int d = 0; d < kVDim; ++d)
          o[d] += w * emu_fp8_decode(kv[static_cast<size_t>(kv_indptr[b] + t) * kQkDim + d]) * kv_scale;
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
  const bool ok = finite && zeros_ok && errors == 0 && rel < 4e-3;  // tests/tolerances.py: same_inputs
  std::printf("%-28s batch=%d splits=%d rel_l2=%.3e finite=%d zeros_ok=%d errors=%u %s\n", name, batch, splits, rel,
              finite, zeros_ok, errors, ok ? "ok" : "FAIL");
  return ok;
}

int main() {
  bool ok = true;
  ok &= run_case<DynamicShape>("one-split", {64, 37}, 1, 1);
  ok &= run_case<DynamicShape>("splits+tail+empty", {100, 0, 33, 257}, 3, 2);
  ok &= run_case<DynamicShape>("more-splits-than-tiles", {40}, 5, 3);
  ok &= run_case<StaticShape<3, 96, 2>>("static-shape", {96, 96, 96}, 2, 4);
  ok &= run_case<StaticShape<3, 96, 2>>("static-shape-bad-indptr", {96, 96, 96}, 2, 5, /*corrupt=*/true);
  return ok ? 0 : 1;
}
