"""python -m codegen {generate,list,check} [--shapes 48x2048,...] [--shapes-file F] [--arch A] [--bundle FMT] [--out DIR]"""
from __future__ import annotations

import argparse
import sys

from . import catalog, facts, generate
from .spec import SpecError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    ap.add_argument("command", choices=("generate", "list", "check"))
    ap.add_argument("--shapes", default="", help="extra BATCHxKV_LEN shapes, comma separated")
    ap.add_argument("--shapes-file", default=None, help="file with extra shapes, one a line")
    ap.add_argument("--arch", default=",".join(catalog.DEFAULT_ARCHS),
                    help="comma-separated archs (default all; narrowing generate/check drops the other archs' files)")
    ap.add_argument("--filter", default="", help="keep only kernels whose name contains this")
    ap.add_argument("--bundle", default="", metavar="KV_FORMAT",
                    help="only what a leaderboard bundle of this kv format (" + " | ".join(facts.KV_BINDINGS) + ") dispatches to, "
                         "for the one --arch: its eight shape kernels and its generic kernel (bf16 q)")
    ap.add_argument("--out", default=generate.GENERATED, help="output folder (default generated/)")
    ap.add_argument("--check", action="store_true", help="with generate: fail if the output is stale")
    a = ap.parse_args(argv)
    try:
        shapes = catalog.parse_shapes(a.shapes)
        if a.shapes_file:
            with open(a.shapes_file) as f:
                shapes += catalog.parse_shapes(f.read())
        archs = [x for x in a.arch.split(",") if x]
        if a.bundle:
            if len(archs) != 1 or shapes:
                raise SpecError("--bundle: expected exactly one --arch and no --shapes (a bundle carries one "
                                "arch's leaderboard kernels)")
            specs = catalog.bundle_catalog(archs[0], a.bundle)
        else:
            specs = catalog.build_catalog(shapes, archs=archs)
    except (SpecError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.filter:
        specs = [s for s in specs if a.filter in s.name or s.generic]
    if a.command == "list":
        for s in specs:
            print(s.name)
        print(f"# {len(specs)} kernels, fingerprint {generate.fingerprint(specs)}", file=sys.stderr)
        return 0
    if a.command == "check" or a.check:
        problems = generate.check(specs, a.out)
        for p in problems:
            print(f"stale: {p}", file=sys.stderr)
        if problems:
            print("generated/ is stale: run `make generate` (python -m codegen generate) and commit it",
                  file=sys.stderr)
            return 1
        print(f"generated/ is up to date ({len(specs)} kernels, fingerprint {generate.fingerprint(specs)})")
        return 0
    touched = generate.write(specs, a.out)
    for t in touched:
        print(f"wrote {t}")
    print(f"{len(specs)} kernels, {len(touched)} files changed, fingerprint {generate.fingerprint(specs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
