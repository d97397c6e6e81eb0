"""One shape's decode under a profiler: `ncu ... python bench/ncu_probe.py 256x8192 [kernel]`
runs the call three times on fresh random inputs (the profiler picks which launch);
`kernel` names a generic kernel of the build (mlagen_kernel_at lists them). The KV format
is fp8, or NCU_FORMAT (mxfp4 / bf16) from the environment."""
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
    fmt = os.environ.get("NCU_FORMAT", "fp8")
    inp = C.make_inputs(batch, kv_len, 1, dev, keep_bf16=fmt != "fp8")
    if fmt == "mxfp4":
        from mlagen import quant
        inp["kv_data"]["mxfp4"] = quant.quantize_mxfp4(inp["kv_data"]["bf16"])
    for _ in range(3):
        out = mlagen.decode(inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"],
                            kernel=sys.argv[2] if len(sys.argv) > 2 else None, kv_format=fmt)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()


if __name__ == "__main__":
    main()
