# two consumers over one ring (_wg2 tuning candidates) against the specialized kernels,
# contiguous / page 64 / page 1, interleaved in one process, flushed (bench.Timer)
import os, sys, statistics, json
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
import bench as B
import _common as C
C.ensure_mlagen_importable()
import mlagen as mg
dev = torch.device("cuda")
timer = B.Timer(torch, dev, 512 << 20)
G = "mla_decode_sm90a_bany_kvany_sany_qbf16_kvfp8e4m3fn_bn64"
out = []
for batch, kv_len in [(32, 8192), (64, 8192), (256, 8192)]:
    x64 = B.paged_inputs(torch, batch, kv_len, 64, 7, dev)
    x1 = B.paged_inputs(torch, batch, kv_len, 1, 8, dev)
    cols, names = {}, {}
    def contig(**kw):
        return lambda: mg.decode(x64["q"], x64["contig"]["fp8"], x64["qo_indptr"], x64["kv_indptr"], x64["config"], kv_format="fp8", **kw)
    def paged(x, pg, **kw):
        return lambda: mg.decode(x["q"], x["cache"]["fp8"], x["qo_indptr"], None, x["config"], kv_format="fp8", page_table=x["table"], page_size=pg, kv_lens=x["kv_lens"], **kw)
    cols["spec contig"] = contig()
    cols["spec pg64"] = paged(x64, 64)
    cols["spec pg1"] = paged(x1, 1)
    for st in ("_st5", "", "_st3"):
        k = f"{G}{st}_wg2"
        tag = f"wg2{st or '_st4'}"
        cols[f"{tag} contig"] = contig(kernel=k)
        if st != "_st3":
            cols[f"{tag} pg64"] = paged(x64, 64, kernel=k)
        cols[f"{tag} pg1"] = paged(x1, 1, kernel=k)
    if batch == 256:
        cols["wg2_st5 pg1 s2"] = paged(x1, 1, kernel=f"{G}_st5_wg2", splits=2)
        cols["wg2_st5 contig s2"] = contig(kernel=f"{G}_st5_wg2", splits=2)
    ref = {}
    for c, fn in cols.items():
        o = fn(); torch.cuda.synchronize(); names[c] = f'{mg.last_kernel()["name"]} s{mg.last_kernel()["splits"]}'
        r = ref.setdefault("pg1" in c, o.float())
        err = ((o.float() - r).norm() / r.norm()).item()
        assert err < 1e-2, (c, err)
        print(f"  {batch}x{kv_len} {c}: ok ({names[c]}, err {err:.1e})", flush=True)
    mg.check_device_errors()
    times = {c: [] for c in cols}
    for _ in range(5):
        for fn in cols.values(): fn()
    for _ in range(40):
        for c, fn in cols.items(): times[c].append(timer.once(fn))
    med = {c: round(statistics.median(t), 1) for c, t in times.items()}
    mean = {c: round(statistics.mean(t), 1) for c, t in times.items()}
    print(f"{batch}x{kv_len} " + "  ".join(f"{c} {v}" for c, v in med.items()), flush=True)
    out.append(dict(shape=f"{batch}x{kv_len}", median_us=med, mean_us=mean, kernels=names))
    del x64, x1, cols
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "wg2_probe.json"), "w"), indent=1)
