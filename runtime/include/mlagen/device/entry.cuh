// What a generated kernel file (templates/kernel.hip.j2) instantiates: the bodies, the launch
// bounds of its entry points, and its LaunchInfo (kernel_abi.h), the facts the host launches
// it by. The file holds device code only; the host's launcher is runtime/src/launch.cpp.
#pragma once
#include "mlagen/kernel_abi.h"
#include "mlagen/device/mla_decode_sm90.cuh"  // NVIDIA: the warpgroup and rows bodies
#include "mlagen/device/mla_decode_gfx9.cuh"  // AMD: MFMA bodies (+ mla_decode_gfx950_fp8.cuh)

// A decode entry's launch bounds: its block, and on NVIDIA the blocks an SM it is built for.
#if defined(MLAGEN_NVIDIA)
#define MLAGEN_DECODE_BOUNDS(T) __launch_bounds__(T::kThreads, T::kMinBlocksPerSm)
#else
#define MLAGEN_DECODE_BOUNDS(T) __launch_bounds__(T::kThreads)
#endif

namespace mlagen::device {

// The tiling that quantizes a bf16 q to fp8 itself (an fp8-q kernel's `<name>_q8`); T for others.
template <class T, bool = T::kQ == QFormat::kFp8>
struct QuantizingQ {
  using type = T;
};
template <class T>
struct QuantizingQ<T, true> {
  using type = typename T::template WithQ<QFormat::kFp8FromBf16>;
};

template <class T>
constexpr LaunchInfo launch_info() {
  using TQ = typename QuantizingQ<T>::type;
  constexpr bool q8 = T::kQ == QFormat::kFp8;
  LaunchInfo i{};
  i.magic = kLaunchInfoMagic;
  i.version = kLaunchInfoVersion;
  i.threads = T::kThreads;
  i.smem_bytes = T::kSmemBytes;
  i.q8_threads = q8 ? TQ::kThreads : 0;
  i.q8_smem_bytes = q8 ? TQ::kSmemBytes : 0;
  i.rows_per_block = RowsBody<T>::kRowsPerBlock;
  i.fused_combine = FusedCombine<T>::value ? 1 : 0;
  i.rows_body = RowsBody<T>::value ? 1 : 0;
  i.params_bytes = static_cast<int32_t>(sizeof(Params));
  i.maps_bytes = RowsBody<T>::value ? static_cast<int32_t>(sizeof(KvMapsAbi)) : 0;
  i.combine_threads = kCombineThreads;
  i.amax_threads = kAmaxThreads;
  i.merge_in_launch = MergesInLaunch<T>::value ? 1 : 0;
  return i;
}

}  // namespace mlagen::device
