#!/usr/bin/env python3
"""One decode step kernel by kernel, from an Nsight Compute CSV log
(`ncu --csv --metrics gpu__time_duration.sum --print-units base` over `kimirt bench model`):
the kernels from the last-but-one EmbeddingKernel launch to the last one, each with its time in
µs and grid, then their count and sum. scripts/gpu_check.sh prof48 prints it.

Usage: python3 scripts/ncu_step.py LOG.csv
"""
import csv
import sys

lines = open(sys.argv[1]).read().splitlines()
start = [i for i, line in enumerate(lines) if line.startswith('"ID"')]
if not start:
    sys.exit(f"{sys.argv[1]}: no Nsight Compute CSV header (\"ID\", ...) found")
rows = list(csv.reader(lines[start[0]:]))
hdr = rows[0]
rows = [r for r in rows[1:] if len(r) == len(hdr)]
iname, ival, igrid = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Grid Size")


def short(name):
    name = name.split("(")[0].replace("void ", "")
    return name.replace("(anonymous namespace)::", "").replace("unnamed>::", "")


seq = [(short(r[iname]), float(r[ival].replace(",", "")) / 1e3, r[igrid]) for r in rows]
emb = [i for i, s in enumerate(seq) if "Embedding" in s[0]]
if len(emb) < 2:
    sys.exit(f"{sys.argv[1]}: fewer than two decode steps (EmbeddingKernel launches) profiled")
a, b = emb[-2], emb[-1]
total = 0.0
for name, us, grid in seq[a:b]:
    total += us
    print(f"{us:8.1f} {grid:>14} {name[:60]}")
print("step kernels", b - a, "sum us", round(total, 1))
