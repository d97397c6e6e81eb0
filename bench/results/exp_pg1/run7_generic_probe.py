# the generic (runtime-shaped) fp8 kernel against the specialized ones, contiguous / page 64 / page 1
import os, sys, statistics, json
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
import bench as B
import _common as C
C.ensure_mlagen_importable()
import mlagen as mg
dev = torch.device("cuda")
timer = B.Timer(torch, dev, 512 << 20)
out = []
for batch, kv_len in [(32, 8192), (64, 8192), (256, 8192), (48, 3000)]:
    x64 = B.paged_inputs(torch, batch, kv_len - kv_len % 64, 64, 7, dev)
    x1 = B.paged_inputs(torch, batch, kv_len - kv_len % 64, 1, 8, dev)
    cols, names = {}, {}
    for gen in (False, True):
        t = "generic" if gen else "spec"
        cols[f"{t} contig"] = lambda gen=gen: mg.decode(x64["q"], x64["contig"]["fp8"], x64["qo_indptr"], x64["kv_indptr"], x64["config"], kv_format="fp8", force_generic=gen)
        for pg, x in ((64, x64), (1, x1)):
            cols[f"{t} page {pg}"] = lambda gen=gen, pg=pg, x=x: mg.decode(x["q"], x["cache"]["fp8"], x["qo_indptr"], None, x["config"], kv_format="fp8", page_table=x["table"], page_size=pg, kv_lens=x["kv_lens"], force_generic=gen)
    for c, fn in cols.items():
        fn(); torch.cuda.synchronize(); names[c] = mg.last_kernel()["name"]
    times = {c: [] for c in cols}
    for _ in range(5):
        for fn in cols.values(): fn()
    for _ in range(40):
        for c, fn in cols.items(): times[c].append(timer.once(fn))
    med = {c: round(statistics.median(t), 1) for c, t in times.items()}
    print(f"{batch}x{kv_len} " + "  ".join(f"{c} {v}" for c, v in med.items()), flush=True)
    out.append(dict(shape=f"{batch}x{kv_len}", median_us=med, kernels=names))
    del x64, x1, cols
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "generic.json"), "w"), indent=1)
