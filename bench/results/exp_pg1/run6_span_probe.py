# fp8 page-1 decode: does its cost grow with the span of memory the rows are scattered over?
# The same problem (batch x kv_len, pages of 1 in random order), rows drawn without reuse from a
# cache of `span` rows (the problem's own rows: span = batch * kv_len; or 8x / 32x more, the
# rest unused); beside it the contiguous decode of the same rows. Interleaved, flushed, medians.
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
for batch, kv_len, spans in [(32, 8192, (1, 8, 32)), (64, 8192, (1, 4, 16)), (256, 8192, (1, 4))]:
    n = batch * kv_len
    cols = {}
    g = torch.Generator(device=dev).manual_seed(5)
    q = torch.randn((batch, 16, 576), generator=g, device=dev).to(torch.bfloat16)
    cfg = C.make_config(batch, kv_len)
    qo = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    kvi = torch.arange(0, (batch + 1) * kv_len, kv_len, dtype=torch.int32, device=dev)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device=dev)
    keep = []
    for sp in spans:
        rows_total = n * sp
        cache = torch.randn((rows_total, 1, 576), generator=g, device=dev).to(torch.bfloat16)
        fp8, scale = C.quantize_fp8(cache)
        del cache
        ids = torch.randperm(rows_total, generator=g, device=dev)[:n].to(torch.int32)
        table = ids.view(batch, kv_len).contiguous()
        contig = (fp8[ids.long()], scale)
        cols[f"contig_x{sp}"] = lambda contig=contig: mg.decode(q, contig, qo, kvi, cfg, kv_format="fp8")
        cols[f"page1_span_x{sp}"] = lambda fp8=fp8, scale=scale, table=table: mg.decode(
            q, (fp8, scale), qo, None, cfg, kv_format="fp8", page_table=table, page_size=1, kv_lens=lens)
        keep.append((fp8, table, contig))
    ref = cols["contig_x1"]().float()
    for c, fn in cols.items():
        e = (fn().float() - ref).norm() / ref.norm() if c.endswith("x1") else None
        if e is not None:
            assert e < 2e-2, (c, float(e))  # (other tiling and splits than the contiguous kernel: not bit-identical)
    times = {c: [] for c in cols}
    for _ in range(5):
        for fn in cols.values():
            fn()
    for _ in range(40):
        for c, fn in cols.items():
            times[c].append(timer.once(fn))
    med = {c: round(statistics.median(t), 1) for c, t in times.items()}
    line = f"{batch}x{kv_len} " + "  ".join(f"{c} {v}" for c, v in med.items())
    print(line, flush=True)
    out.append(dict(shape=f"{batch}x{kv_len}", median_us=med, span_gb={f"x{sp}": round(n * sp * 576 / 1e9, 2) for sp in spans}))
    del keep, cols
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "span.json"), "w"), indent=1)
