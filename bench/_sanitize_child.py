#!/usr/bin/env python3
"""The program bench/sanitize.py runs under compute-sanitizer (also runnable on its own).

Calls mlagen.decode once per shape (uniform lengths, the specialized kernels) and once on
a batch of random per-sequence lengths through the generic kernel (config without
kv_seq_len; a zero-length sequence in the middle and at the end, lengths 1 and 37, which
are not multiples of 32), synchronizes, and checks that every output is finite (rows of
zero-length sequences must be finite too; they are expected to be 0 and reported if not).
With --ref it also checks the relative L2 error against the float32 reference (slow under
a sanitizer). The last line of stdout is `CHILD_RESULT <json>`.
Exit status: 0 all good, 3 a check failed, 2 an exception.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _common as C  # noqa: E402


def run_case(torch, mlagen, inp: dict, args, kv_format: str = "fp8", q_dtype: str = "bf16") -> dict:
    res = dict(batch=inp["batch"], kv_len=inp["kv_len"], uniform=inp["uniform"], kv_format=kv_format,
               q_dtype=q_dtype)
    if not inp["uniform"]:
        res["lengths"] = inp["lengths"]
    out = mlagen.decode(inp["q"], inp["kv_data"], inp["qo_indptr"], inp["kv_indptr"], inp["config"],
                        kv_format=kv_format, q_dtype=q_dtype)
    torch.cuda.synchronize()
    info = mlagen.last_kernel() or {}
    res["kernel"] = info.get("name")
    res["generic"] = info.get("generic")
    mlagen.check_device_errors()  # raises on device-flagged input errors
    lengths = torch.tensor(inp["lengths"], device=out.device)
    finite_rows = torch.isfinite(out.float()).flatten(1).all(dim=1)  # (batch,)
    nonempty = lengths > 0
    bad_rows = (~finite_rows).nonzero().flatten().tolist()
    res["nonfinite_rows"] = bad_rows
    res["ok"] = not bad_rows
    if bool((~nonempty).any()):
        empty_max = float(out[~nonempty].float().abs().nan_to_num(nan=float("inf")).max())
        res["zero_length_rows_max_abs"] = empty_max
        res["zero_length_rows_zero"] = empty_max == 0.0
    if args.ref and kv_format == "fp8" and q_dtype == "bf16":
        ref = C.reference_fp8(inp)
        err = C.rel_l2(out, ref)
        res["rel_err"] = err if err != float("inf") else None
        if not err < args.tol:
            res["ok"] = False
            res["ref_failed"] = True
    return res


def paged_case(torch, mlagen, lengths, page, seed, device, kv_format, q_dtype) -> dict:
    """A block table over a cache of exactly the pages the sequences use (random order; unused
    table entries hold an invalid id, which must never be read): every non-empty row finite; then
    one page id past the cache makes only its sequence NaN (and is flagged), with no access
    outside the cache."""
    import math
    g = torch.Generator(device=device).manual_seed(seed)
    need = [math.ceil(n / page) for n in lengths]
    num_pages = sum(need)
    cache = torch.randn((num_pages * page, 1, 576), generator=g, device=device).to(torch.bfloat16)
    perm = torch.randperm(num_pages, generator=g, device=device).tolist()
    table = torch.full((len(lengths), max(need)), num_pages + 100, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
        at += n
    table = table.to(device)
    fp8, scale = C.quantize_fp8(cache)
    kv_data = {"bf16": cache, "fp8": (fp8, scale)}
    if kv_format == "mxfp4":
        from mlagen import quant
        kv_data["mxfp4"] = quant.quantize_mxfp4(cache)
    q = torch.randn((len(lengths), 16, 576), generator=g, device=device).to(torch.bfloat16)
    qo = torch.arange(len(lengths) + 1, dtype=torch.int32, device=device)
    kv_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    config = C.make_config(len(lengths), None)

    def call():
        out = mlagen.decode(q, kv_data, qo, None, config, kv_format=kv_format, q_dtype=q_dtype, page_table=table,
                            page_size=page, kv_lens=kv_lens)
        torch.cuda.synchronize()
        return out

    res = dict(case=f"paged{page}", kv_format=kv_format, q_dtype=q_dtype, lengths=lengths)
    out = call()
    res["kernel"] = (mlagen.last_kernel() or {}).get("name")
    mlagen.check_device_errors()
    live = torch.tensor([n > 0 for n in lengths], device=device)
    finite = torch.isfinite(out.float()).flatten(1).all(dim=1)
    res["nonfinite_rows"] = (~finite & live).nonzero().flatten().tolist()
    victim = max(range(len(lengths)), key=lambda b: lengths[b])
    table[victim, 0] = num_pages  # one past the cache
    out = call()
    finite = torch.isfinite(out.float()).flatten(1).all(dim=1)
    flagged = False
    try:
        mlagen.check_device_errors()
    except mlagen.MlagenError:
        flagged = True
    others = [b for b in range(len(lengths)) if b != victim and lengths[b] > 0]
    res["bad_page_flagged"] = flagged and bool(torch.isnan(out[victim].float()).all()) and bool(finite[others].all())
    res["ok"] = not res["nonfinite_rows"] and res["bad_page_flagged"]
    return res


def rows_case(torch, mlagen, heads, q_lens, lengths, seed, device, kv_format, q_dtype, splits=0, page=0) -> dict:
    """heads x query tokens a sequence (causal among them), q / out / LSE and the KV exactly as
    large as the problem (8 heads: padding rows of a block must never be read or written past
    them); with `page` a block table over exactly the pages used. Every row that sees a key
    finite, the others zeros."""
    import math
    g = torch.Generator(device=device).manual_seed(seed)
    total_q, total_kv = sum(q_lens), sum(lengths)
    kv = torch.randn((total_kv, 1, 576), generator=g, device=device).to(torch.bfloat16)
    q = torch.randn((total_q, heads, 576), generator=g, device=device).to(torch.bfloat16)
    qo = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32, device=device)
    kvp = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=device)
    kw = dict(q_len=max(q_lens), return_lse=True, splits=splits, force_generic=splits > 0)
    if page:  # the rows of sequence b at pages in random order
        need = [math.ceil(n / page) for n in lengths]
        cache = torch.randn((sum(need) * page, 1, 576), generator=g, device=device).to(torch.bfloat16)
        perm = torch.randperm(sum(need), generator=g, device=device).tolist()
        table = torch.full((len(lengths), max(need)), sum(need) + 100, dtype=torch.int32)
        at = 0
        for b, n in enumerate(need):
            table[b, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
            at += n
        kv = cache
        kw.update(page_table=table.to(device), page_size=page, kv_lens=torch.tensor(lengths, dtype=torch.int32,
                                                                                    device=device))
        kvp = None
    fp8, scale = C.quantize_fp8(kv)
    kv_data = {"bf16": kv, "fp8": (fp8, scale)}
    if kv_format == "mxfp4":
        from mlagen import quant
        kv_data["mxfp4"] = quant.quantize_mxfp4(kv)
    uniform = len(set(lengths)) == 1 and len(set(q_lens)) == 1 and not page and not splits
    rows = heads * max(q_lens)
    if kv_format == "fp8" and not uniform and rows % 32 == 0 and (not page or page >= 64):
        # the generic rows body, by name: the runtime gives problems this small the 16-row kernel
        # (codegen/spec.py ROWS_BODY_MIN_WORK), and these cases exist to check the rows body
        block_m = 64 if rows % 64 == 0 else 32
        kw["kernel"] = next(k["name"] for k in mlagen.kernels() if k["role"] == "generic_rows"
                            and k["q_dtype"] == q_dtype and k["kv_dtype"] == "fp8e4m3fn"
                            and k["name"].endswith(f"_bm{block_m}"))
    config = C.make_config(len(lengths), lengths[0] if uniform else None)  # uniform: a specialized kernel may run
    config.update(num_heads=heads, q_seq_len=max(q_lens))
    out, lse = mlagen.decode(q, kv_data, qo, kvp, config, kv_format=kv_format, q_dtype=q_dtype, **kw)
    torch.cuda.synchronize()
    mlagen.check_device_errors()
    sees = []  # per token row: whether it sees a key (token i of n: the first len - n + 1 + i)
    for n, L in zip(q_lens, lengths):
        sees += [L - n + 1 + i > 0 for i in range(n)]
    sees = torch.tensor(sees, device=device)
    finite = torch.isfinite(out.float()).flatten(1).all(dim=1) & torch.isfinite(lse).all(dim=1)
    zeros = (out.float() == 0).flatten(1).all(dim=1) & (lse == -math.inf).all(dim=1)
    res = dict(case=f"rows_h{heads}_q{max(q_lens)}" + (f"_pg{page}" if page else "") + (f"_s{splits}" if splits else ""),
               kv_format=kv_format, q_dtype=q_dtype, lengths=lengths, q_lens=q_lens,
               kernel=(mlagen.last_kernel() or {}).get("name"))
    res["nonfinite_rows"] = (~finite & sees).nonzero().flatten().tolist()
    res["unseen_not_zero"] = (~zeros & ~sees).nonzero().flatten().tolist()
    res["ok"] = not res["nonfinite_rows"] and not res["unseen_not_zero"]
    return res


ROWS_CASES = [  # (heads, q lengths, kv lengths, splits, page)
    (8, [1, 1, 1], [700, 3, 129], 0, 0),
    (128, [2, 2], [1000, 65], 0, 0),
    (16, [4, 1, 3], [3, 640, 257], 3, 0),
    (32, [3, 3], [500, 2], 2, 16),
    (64, [1, 4], [64, 1025], 0, 1),
    # uniform: the specialized rows-body kernels of these shapes (b2_kv1000 h128, b3_kv1000 ql4), short last tiles
    (128, [1, 1], [1000, 1000], 0, 0),
    (16, [4, 4, 4], [1000, 1000, 1000], 0, 0),
    # the 32-row rows body (block_m 32): b3_kv1000 ql2, short last tiles
    (16, [2, 2, 2], [1000, 1000, 1000], 0, 0),
    # the generic 32-row body: 8 heads x 4 tokens, lengths shorter than a tile and than q_len
    (8, [4, 4, 4], [700, 3, 129], 0, 0),
    # the generic rows bodies on pages of 64 (bulk tensor copies through the block table)
    (128, [2, 2], [700, 130], 0, 64),
    (32, [1, 1, 1], [300, 64, 5], 2, 64),
]


def run_listed(summary: dict, name: str, fmt: str, q_dtype: str, keys: tuple, call) -> None:
    """One case: call() gives its result (an exception is a failed case, with the traceback
    printed); kept in summary["cases"] and printed as one [child] line with the result's keys."""
    try:
        res = call()
    except Exception as e:  # noqa: BLE001
        res = dict(case=name, ok=False, error=f"{type(e).__name__}: {e}", kv_format=fmt, q_dtype=q_dtype)
        traceback.print_exc()
    summary["cases"].append(res)
    print(f"[child] {res.get('case', name)} {fmt}/q{q_dtype}: {'ok' if res.get('ok') else 'FAIL'} "
          f"kernel={res.get('kernel')} nonfinite_rows={res.get('nonfinite_rows')} "
          + " ".join(f"{k}={res.get(k)}" for k in keys) + f" {res.get('error') or ''}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=None,
                   help="uniform BATCHxKV_LEN list (default: the eight benchmark shapes); 'none' for none")
    p.add_argument("--no-nonuniform", action="store_true", help="skip the non-uniform-length case")
    p.add_argument("--paged", default="1,16,64", help="page sizes of the paged cases ('' for none): the non-uniform "
                   "lengths over a block table, pages in random order, plus one page id past the cache")
    p.add_argument("--no-rows", action="store_true", help="skip the query-rows cases (ROWS_CASES: 8..128 heads, "
                   "1..4 causal query tokens, splits, pages)")
    p.add_argument("--nonuniform-batch", type=int, default=10, help="sequences in the non-uniform case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ref", action="store_true", help="also check against the float32 reference")
    p.add_argument("--tol", type=float, default=2e-2)
    p.add_argument("--formats", default="fp8", help="KV formats to run each case with: fp8,bf16,mxfp4, "
                   "each optionally :fp8 for an fp8 q quantized on the device "
                   "(mxfp4 with unpadded scale rows, exactly total_kv x 18 bytes: no slack to hide a stray read)")
    args = p.parse_args(argv)

    shapes = [] if (args.shapes or "").lower() == "none" else C.parse_shapes(args.shapes)
    summary = dict(cases=[], ok=True, error=None)
    status = 0
    try:
        import torch
        C.ensure_mlagen_importable()
        import mlagen
        device = torch.device("cuda", torch.cuda.current_device())
        summary["fingerprint"] = mlagen.fingerprint()
        cases = [(b, l, None) for b, l in shapes]
        if not args.no_nonuniform:
            lengths = C.nonuniform_lengths(args.nonuniform_batch, seed=args.seed)
            cases.append((len(lengths), None, lengths))
        for i, (b, l, lengths) in enumerate(cases):
            name = C.shape_name(b, l) if lengths is None else f"nonuniform{b}"
            formats = [tuple((f.split(":") + ["bf16"])[:2]) for f in args.formats.split(",") if f]
            inp = C.make_inputs(b, l, seed=args.seed + 100 + i, device=device, lengths=lengths,
                                keep_bf16=any(f in ("bf16", "mxfp4") for f, _ in formats))
            if any(f == "mxfp4" for f, _ in formats):
                from mlagen import quant
                inp["kv_data"]["mxfp4"] = quant.quantize_mxfp4(inp["kv_data"]["bf16"])
            for fmt, q_dtype in formats:
                run_listed(summary, name, fmt, q_dtype, ("rel_err",),
                           lambda: dict(run_case(torch, mlagen, inp, args, fmt, q_dtype), case=name))
            del inp
            torch.cuda.empty_cache()
        formats = [tuple((f.split(":") + ["bf16"])[:2]) for f in args.formats.split(",") if f]
        for page in [int(x) for x in args.paged.split(",") if x]:
            lengths = C.nonuniform_lengths(args.nonuniform_batch, seed=args.seed + page)
            for fmt, q_dtype in formats:
                run_listed(summary, f"paged{page}", fmt, q_dtype, ("bad_page_flagged",),
                           lambda: paged_case(torch, mlagen, lengths, page, args.seed + 7 * page, device, fmt, q_dtype))
                torch.cuda.empty_cache()
        for i, (heads, q_lens, lengths, splits, page) in enumerate([] if args.no_rows else ROWS_CASES):
            for fmt, q_dtype in formats:
                run_listed(summary, f"rows{i}", fmt, q_dtype, ("unseen_not_zero",),
                           lambda: rows_case(torch, mlagen, heads, q_lens, lengths, args.seed + 31 * i, device, fmt,
                                             q_dtype, splits, page))
                torch.cuda.empty_cache()
        torch.cuda.synchronize()
        summary["ok"] = all(c.get("ok") for c in summary["cases"])
        status = 0 if summary["ok"] else 3
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        summary["ok"] = False
        summary["error"] = f"{type(e).__name__}: {e}"
        status = 2
    print("CHILD_RESULT " + json.dumps(C.json_clean(summary)), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
