"""Where the package's launches go: torch's current stream on the tensors' device.

This is the one module of the binding that touches a stream API. The leaderboard bundle
(tools/bundle.py) carries every other module of the binding and replaces this one with its
own, whose handle() is None: the device's default stream (NULL), where the evaluation records
its CUDA events. The submission server refuses any file that names streams at all, so the rest
of the binding never does (tests/cpu/test_bundle.py checks the sources).
"""
from __future__ import annotations


def handle(device_index: int) -> int:
    """The raw cudaStream_t / hipStream_t of torch's current stream on `device_index`."""
    global handle
    import torch
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fast is not None:
        handle = fast  # rebind: later calls go straight to torch's accessor
        return fast(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def capturing(device_index: int) -> bool:
    """Whether torch's current stream on `device_index` is capturing a CUDA graph (work issued
    now only runs when the graph is replayed)."""
    import torch
    with torch.cuda.device(device_index):
        return torch.cuda.is_current_stream_capturing()
