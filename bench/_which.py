import sys, subprocess
code = r'''
import sys, torch
sys.path.insert(0, "bench"); import _common as C; C.ensure_mlagen_importable(); import mlagen
b, l, fmt, qd = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
inp = C.make_inputs(b, l, 1, torch.device("cuda"), keep_bf16=True)
if fmt == "mxfp4":
    from mlagen import quant; inp["kv_data"]["mxfp4"] = quant.quantize_mxfp4(inp["kv_bf16"])
out = mlagen.decode(inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"], kv_format=fmt, q_dtype=qd)
ref = C.reference_as_seen(inp, fmt, qd); torch.cuda.synchronize()
print(f"{b}x{l} {fmt} q{qd} {mlagen.last_kernel() if hasattr(mlagen,'last_kernel') else ''} rel {((out.float()-ref).norm()/ref.norm()).item():.2e}")
'''
for case in sys.argv[1:]:
    b, l, f, q = case.split(":")
    r = subprocess.run([sys.executable, "-c", code, b, l, f, q], capture_output=True, text=True)
    print(case, "rc", r.returncode, (r.stdout + r.stderr).strip().splitlines()[-1][:200] if (r.stdout + r.stderr).strip() else "")
