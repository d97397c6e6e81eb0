"""One shape's decode under a profiler: `ncu ... python bench/ncu_probe.py 256x8192 [kernel]`
runs the fp8 call three times on fresh random inputs (the profiler picks which launch);
`kernel` names a generic kernel of the build (mlagen_kernel_at lists them)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

C.ensure_mlagen_importable()
import torch  # noqa: E402
import mlagen  # noqa: E402


def main():
    batch, kv_len = C.parse_shapes(sys.argv[1] if len(sys.argv) > 1 else "256x8192")[0]
    dev = torch.device("cuda")
    inp = C.make_inputs(batch, kv_len, 1, dev, keep_bf16=False)
    for _ in range(3):
        out = mlagen.decode(inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"],
                            kernel=sys.argv[2] if len(sys.argv) > 2 else None)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()


if __name__ == "__main__":
    main()
