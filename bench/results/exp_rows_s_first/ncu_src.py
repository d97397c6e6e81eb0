import csv, sys, re
f = sys.argv[1]
lines = open(f).read().splitlines()
rows = list(csv.reader(lines[1:]))
hdr = rows[0]; rows = rows[1:]
ix = {h: i for i, h in enumerate(hdr)}
S = ix["Warp Stall Sampling (All Samples)"]; E = ix["Instructions Executed"]
stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
ins = []
for r in rows:
    try: s = int(r[S] or 0); e = int(r[E] or 0)
    except ValueError: continue
    ins.append(dict(src=r[ix["Source"]].strip(), s=s, e=e, st={c: int(r[ix[c]] or 0) for c in stall_cols}))
total = sum(i["s"] for i in ins)
marks = [k for k, i in enumerate(ins) if "SETMAXREG" in i["src"] or "SETMAXNREG" in i["src"]]
print("total samples", total, "instructions", len(ins), "setmaxreg at", marks, [ins[k]["src"] for k in marks])
# regions: split at the marks
bounds = [0] + marks + [len(ins)]
for a, b in zip(bounds, bounds[1:]):
    seg = ins[a:b]; ss = sum(i["s"] for i in seg)
    agg = {}
    for i in seg:
        for c, v in i["st"].items(): agg[c] = agg.get(c, 0) + v
    top = sorted(agg.items(), key=lambda kv: -kv[1])[:6]
    print(f"region {a}-{b} ({seg[0]['src'][:30] if seg else ''}): {ss} samples {100*ss/total:.1f}%  ", ", ".join(f"{c[6:]}={100*v/total:.1f}%" for c, v in top))
N = int(sys.argv[2]) if len(sys.argv) > 2 else 40
print("top instructions:")
for k, i in sorted(enumerate(ins), key=lambda kv: -kv[1]["s"])[:N]:
    top = sorted(i["st"].items(), key=lambda kv: -kv[1])[:2]
    print(f"{k:5d} {100*i['s']/total:5.1f}% exec={i['e']:8d} {i['src'][:60]:60} " + " ".join(f"{c[6:]}={v}" for c, v in top))
if len(sys.argv) > 3:
    a, b = map(int, sys.argv[3].split("-"))
    tot = sum(i["s"] for i in ins[a:b])
    acc = 0
    for k in range(a, b):
        i = ins[k]; acc += i["s"]
        if i["s"] >= int(sys.argv[4]) or any(w in i["src"] for w in ("BAR", "SYNCS", "DEPBAR", "MUFU.EX2", "STSM", "LDGSTS", "WARPSYNC", "BRA")):
            top = sorted(i["st"].items(), key=lambda kv: -kv[1])[:2]
            print(f"{k:5d} {i['s']:5d} cum={100*acc/tot:5.1f}% exec={i['e']:7d} {i['src'][:58]:58} " + " ".join(f"{c[6:]}={v}" for c, v in top))
