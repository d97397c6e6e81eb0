"""make tune: measure split counts x tile candidates per catalog shape on the GPU, the
leaderboard's way, and write codegen/tuning.json (which the generator reads).

Every candidate runs through the generic kernels (default tiles + the tuning candidates
built into the library, see codegen/catalog.py TUNING_TILES) with the split count forced,
so nothing is rebuilt while tuning; each KV format is tuned on its own inputs (checked
against float32 attention on the values it computes with) and gets its own table entry
(q<q>_kv<kv>). After it: `make` regenerates the specialized kernels with the winners.
`python bench/tune.py [--shapes 4x1024,...] [--formats bf16:mxfp4,...] [--reps 20] [--dry-run]`
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # codegen
sys.path.insert(0, HERE)  # first: `bench` is bench/bench.py, not the folder
import _common as C  # noqa: E402
from bench import Timer  # noqa: E402

C.ensure_mlagen_importable()

from codegen import catalog  # noqa: E402
from codegen.spec import KernelSpec  # noqa: E402

SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


KV_FORMAT_OF = {"fp8e4m3fn": "fp8", "bf16": "bf16", "mxfp4": "mxfp4"}


def format_inputs(inp: dict, kv_dtype: str, q_dtype: str):
    """(the decode kwargs for this (q, kv) pair, the float32 reference on the values it sees)."""
    fmt = KV_FORMAT_OF[kv_dtype]
    return dict(kv_format=fmt, q_dtype=q_dtype), C.reference_as_seen(inp, fmt, q_dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", default=None, help="BATCHxKV_LEN list (default: the catalog's shapes)")
    ap.add_argument("--formats", default=None,
                    help="QDTYPE:KVDTYPE list, e.g. bf16:fp8e4m3fn,bf16:mxfp4 (default: the bf16-q pairs the "
                         "sm90a catalog specializes; fp8-q kernels take the bf16-q entry of their KV format)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=catalog.TUNING_FILE)
    ap.add_argument("--log", default=None, help="also write every measurement here (JSON)")
    ap.add_argument("--dry-run", action="store_true", help="measure and print, do not write the table")
    a = ap.parse_args(argv)
    import torch
    import mlagen
    dev = torch.device("cuda")
    timer = Timer(torch, dev, 512 << 20)
    specs = catalog.build_catalog()
    shapes = C.parse_shapes(a.shapes, default=sorted({(s.batch, s.kv_len) for s in specs if not s.generic}))
    pairs = ([tuple(f.split(":")) for f in a.formats.split(",") if f] if a.formats
             else [p for p in catalog.DEFAULT_DTYPES["sm90a"] if p[0] == "bf16"])
    generics = [KernelSpec.parse(k["name"]) for k in mlagen.kernels() if k["generic"]]
    table = catalog.load_tuning(a.out)
    log = {}
    for q_dtype, kv_dtype in pairs:
        # the q format changes no tiling (catalog.params_for): fp8-q pairs reuse the bf16-q table
        cands = [g for g in generics if (g.q_dtype, g.kv_dtype) == (q_dtype, kv_dtype)]
        if not cands:
            print(f"q{q_dtype}_kv{kv_dtype}: no generic kernel in this library, skipped")
            continue
        key = f"q{q_dtype}_kv{kv_dtype}"
        for batch, kv_len in shapes:
            inp = C.make_inputs(batch, kv_len, 7, dev, keep_bf16=True)
            kw, ref = format_inputs(inp, kv_dtype, q_dtype)
            results = []
            for g in cands:
                tiles = -(-kv_len // g.block_n)
                for splits in SPLITS:
                    if splits > tiles:
                        continue
                    fn = functools.partial(mlagen.decode, inp["q"], inp["kv_data"], inp["qo_indptr"],
                                           inp["kv_indptr"], inp["config"], kernel=g.name, splits=splits, **kw)
                    out = fn()
                    err = C.rel_l2(out, ref)
                    if not err < 2e-2:
                        print(f"  {g.name} splits={splits}: WRONG (rel_l2 {err:.2e}), skipped")
                        continue
                    for _ in range(3):
                        timer.once(fn)
                    med = statistics.median(timer.once(fn) for _ in range(a.reps))
                    results.append((med, g.block_n, g.stages, splits))
            results.sort()
            best = results[0]
            heur = catalog.heuristic_params("sm90a", batch, kv_len, kv_dtype)
            default = next((r for r in results if (r[1], r[2], r[3]) == (heur["block_n"], heur["stages"],
                                                                          heur["splits"])), None)
            print(f"{key} {batch}x{kv_len}: best {best[0]:.1f} us (block_n={best[1]} stages={best[2]} splits={best[3]})"
                  + (f"; heuristic {default[0]:.1f} us" if default else "")
                  + "; next: " + ", ".join(f"{r[0]:.1f}(bn{r[1]} st{r[2]} s{r[3]})" for r in results[1:4]))
            table.setdefault("sm90a", {}).setdefault(key, {})[f"{batch}x{kv_len}"] = dict(
                splits=best[3], block_n=best[1], stages=best[2], median_us=round(best[0], 2))
            log.setdefault(key, {})[f"{batch}x{kv_len}"] = [dict(us=round(r[0], 2), block_n=r[1], stages=r[2],
                                                                 splits=r[3]) for r in results]
            del inp, ref
    if a.log:
        with open(a.log, "w") as f:
            json.dump(log, f, indent=1, sort_keys=True)
    if not a.dry_run:
        with open(a.out, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {a.out}; run `make` to regenerate and rebuild with it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
