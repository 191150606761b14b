#!/usr/bin/env python3
"""Where a CUDA graph replay's time goes, from bench/kernel_trace.cpp's CSV.

Usage: kernel_trace_summary.py TRACE.csv [--top N] [--json OUT]

A decode step is one replay of a captured graph (one graph a batch bucket). The kernels of a
replay's main stream form a chain: under programmatic dependent launch a kernel may *start*
while the one before it runs (its blocks resident, its weight loads out, then waiting), but it
*ends* after it. So the replay's wall time is the sum over the chain of end(i) - end(i-1), and
that difference is what each kernel costs the step ("charged" below); end(i-1) - start(i) is how
early it started ("lead": what PDL overlapped), and when negative, time the chain ran nothing
("idle": launch latency, a dependency that is not programmatic). Kernels on other streams (the L2 prefetches
beside the chain) are counted apart. Per graph: the replays' median wall time, then per kernel
name the calls a replay and the charged time summed over them (median over replays).
"""
import argparse
import collections
import csv
import json
import re
import statistics
import sys


def short_name(name):
    """The kernel's name with its template arguments, without namespaces and parameters."""
    name = name.replace(";", ",").replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*$", "", name)  # the parameter list
    name = re.sub(r"^void ", "", name).replace("kimirt::cuda::", "").replace("kimirt::", "")
    return name.strip()[:90]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    args = ap.parse_args()

    replays = collections.defaultdict(list)  # (graph, correlation) -> rows
    with open(args.trace) as f:
        for r in csv.DictReader(f):
            if r["graph_id"] == "0":
                continue  # launched outside a graph
            replays[(int(r["graph_id"]), int(r["correlation_id"]))].append(
                dict(start=int(r["start_ns"]), end=int(r["end_ns"]), stream=int(r["stream"]),
                     blocks=int(r["blocks"]), name=short_name(r["name"])))
    if not replays:
        sys.exit(f"{args.trace}: no kernels launched from a CUDA graph")

    by_graph = collections.defaultdict(list)
    for (graph, _), rows in replays.items():
        by_graph[graph].append(rows)
    report = []
    for graph, reps in sorted(by_graph.items()):
        if len(reps) < 3:
            continue  # captured but barely replayed (a warm-up)
        reps = reps[1:]  # the first replay may still load code and fill caches
        walls, charged, lead, side, gaps = [], collections.defaultdict(list), collections.defaultdict(list), [], []
        for rows in reps:
            main_stream = collections.Counter(r["stream"] for r in rows).most_common(1)[0][0]
            chain = sorted((r for r in rows if r["stream"] == main_stream), key=lambda r: r["end"])
            others = [r for r in rows if r["stream"] != main_stream]
            begin = min(r["start"] for r in rows)
            walls.append((max(r["end"] for r in rows) - begin) / 1e3)
            per = collections.defaultdict(float)
            per_lead = collections.defaultdict(float)
            prev_end = begin
            gap = 0.0
            for r in chain:
                per[r["name"]] += (r["end"] - max(prev_end, begin)) / 1e3
                per_lead[r["name"]] += max(0, prev_end - r["start"]) / 1e3
                gap += max(0, r["start"] - prev_end) / 1e3
                prev_end = r["end"]
            gaps.append(gap)
            for name, v in per.items():
                charged[name].append(v)
                lead[name].append(per_lead[name])
            side.append((len(others), sum(r["end"] - r["start"] for r in others) / 1e3))
        main_stream = collections.Counter(r["stream"] for r in reps[0]).most_common(1)[0][0]
        calls = collections.Counter(r["name"] for r in reps[0] if r["stream"] == main_stream)  # the same each replay
        wall = statistics.median(walls)
        table = sorted(((statistics.median(v), name) for name, v in charged.items()), reverse=True)
        kernels = len(next(iter(reps)))
        print(f"=== graph {graph}: {len(reps)} replays, {kernels} kernels a replay, wall median {wall:.1f} us "
              f"(min {min(walls):.1f}, max {max(walls):.1f}); beside the chain: {side[0][0]} kernels, "
              f"{statistics.median(s for _, s in side):.1f} us of their own time; the chain idle "
              f"{statistics.median(gaps):.1f} us (a kernel starting after the one before it ended)")
        print(f"{'charged us':>11} {'share':>6} {'calls':>5} {'us a call':>9} {'lead us':>8}  kernel")
        rows_out = []
        for v, name in table[: args.top]:
            n = calls[name] or 1
            print(f"{v:11.1f} {v / wall:6.1%} {n:5d} {v / n:9.2f} {statistics.median(lead[name]):8.1f}  {name}")
            rows_out.append(dict(name=name, charged_us=v, calls=n, lead_us=statistics.median(lead[name])))
        rest = sum(v for v, _ in table[args.top:])
        if rest:
            print(f"{rest:11.1f} {rest / wall:6.1%}        (the other {len(table) - args.top} kernels)")
        report.append(dict(graph=graph, replays=len(reps), kernels=kernels, wall_us_median=wall,
                           idle_us_median=statistics.median(gaps), kernels_by_charge=rows_out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
