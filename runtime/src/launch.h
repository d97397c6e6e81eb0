// The generated kernels' launcher (launch.cpp): the same for every kernel and both vendors.
#pragma once
#include "gpu.h"

namespace mlagen {
// Launches `obj`'s kernel, the plan's registry entry `e`, for a validated problem (its workspace in
// pr->workspace) on `stream`, on `device`, which the caller made current (gpu::DeviceScope).
mlagen_status launch_kernel(const CodeObject& obj, const KernelEntry& e, const mlagen_problem* pr, int32_t splits,
                            void* stream, int device);
// The process's split-merge mode (mlagen.h mlagen_split_merge), read at each launch.
void set_split_merge(int32_t mode);
int32_t split_merge();
}  // namespace mlagen
