#!/usr/bin/env python3
"""FLA's fused_recurrent_kda at the shapes of bench/kda_decode_bench.cu, on the same GPU in the
same run, merged into that bench's JSON as speedup_vs_fla per point.

FLA's decode kernel is called as a serving engine calls it (vLLM's KDA decode path): one token
per sequence, FP32 states in a pool addressed by ssm_state_indices and updated in place, the
decay gate, the q/k l2norm and sigmoid(beta) inside the kernel (K3: lower bound -5). It does less
than ours: no short conv and no gated RMSNorm (those are separate kernels beside it), so the
comparison flatters FLA slightly.

Timing mirrors the C++ bench: "eager" is triton.testing.do_bench's median (one Python call per
launch, so at batch 1 it measures launch overhead); "graph" captures G launches over distinct
layers' state pools in one CUDA graph and divides a replay's median time by G. Layer pools are
as many as the C++ bench used (>= 3x L2), read from its JSON.

Usage: kda_decode_fla.py --ours ours.json --out merged.json
"""
import argparse
import json
import statistics

import torch
import triton
from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd


def time_point(B, H, K, layers, graph_launches, lower_bound=-5.0):
    dev = torch.device("cuda")
    torch.manual_seed(1000 * B + H)
    f32 = dict(device=dev, dtype=torch.float32)
    q = torch.randn(B, 1, H, K, **f32)
    k = torch.randn(B, 1, H, K, **f32)
    v = torch.randn(B, 1, H, K, **f32)
    g = 2.0 * torch.randn(B, 1, H, K, **f32)
    beta = torch.randn(B, 1, H, **f32)
    a_log = 0.5 * torch.randn(H, **f32)
    dt_bias = 0.5 * torch.randn(H * K, **f32)
    slots = torch.randperm(B, device=dev, dtype=torch.int64).to(torch.int32)
    out = torch.empty(B, 1, H, K, **f32)
    pools = [0.1 * torch.randn(B, H, K, K, **f32) for _ in range(layers)]

    def call(i):
        fused_recurrent_kda_fwd(
            q=q, k=k, v=v, g=g, beta=beta, A_log=a_log, dt_bias=dt_bias,
            initial_state=pools[i % layers], scale=K ** -0.5, output_final_state=False,
            inplace_final_state=True, ssm_state_indices=slots,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            lower_bound=lower_bound, out=out)

    for i in range(2 * layers):
        call(i)
    torch.cuda.synchronize()
    counter = [0]

    def rotating():
        call(counter[0])
        counter[0] += 1

    us_eager = 1e3 * triton.testing.do_bench(rotating, warmup=25, rep=200, return_mode="median")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(graph_launches):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    us_graph = 1e3 * statistics.median(times) / graph_launches
    if not torch.isfinite(out).all():
        raise SystemExit(f"FLA output not finite at B={B} H={H}")
    del pools, graph
    torch.cuda.empty_cache()
    return us_eager, us_graph


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", required=True, help="kda_decode_bench --json output")
    ap.add_argument("--out", required=True, help="merged JSON to write")
    args = ap.parse_args()
    with open(args.ours) as f:
        report = json.load(f)
    peak = report["peak_tbps"]
    report["fla"] = {"op": "fla.ops.kda.fused_recurrent.fused_recurrent_kda_fwd",
                     "options": "ssm_state_indices, inplace_final_state, gate/l2norm/beta-sigmoid in kernel",
                     "does_not_include": "short conv, gated RMSNorm"}
    rows = []
    for p in report["points"]:
        fla_eager, fla_graph = time_point(p["batch"], p["heads"], p["head_dim"], p["layers"], p["graph_launches"])
        p["fla_us_eager"] = round(fla_eager, 3)
        p["fla_us_graph"] = round(fla_graph, 3)
        p["speedup_vs_fla"] = round(fla_graph / p["us_graph"], 3)
        p["speedup_vs_fla_eager"] = round(fla_eager / p["us_eager"], 3)
        for v in p.get("variants", []):
            v["speedup_vs_fla"] = round(fla_graph / v["us_graph"], 3)
        rows.append(p)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"KDA decode on {report['device']} (graph = per-layer time inside a CUDA graph; "
          f"TB/s = ours, bytes incl. state r+w, of {peak} TB/s)")
    print(f"{'shape':<20} {'ours_us':>8} {'fla_us':>8} {'speedup':>8} {'ours_eager':>10} {'fla_eager':>10} "
          f"{'TB/s':>7} {'of_peak':>7}")
    for p in rows:
        shape = f"B={p['batch']} H={p['heads']} K={p['head_dim']}"
        print(f"{shape:<20} {p['us_graph']:>8.2f} {p['fla_us_graph']:>8.2f} {p['speedup_vs_fla']:>8.2f} "
              f"{p['us_eager']:>10.2f} {p['fla_us_eager']:>10.2f} {p['tbps_graph']:>7.3f} {p['frac_peak_graph']:>7.3f}")
    print(f"production variant: {report.get('production', '?')}; fastest variant in a graph per shape:")
    for p in rows:
        if p.get("variants"):
            best = min(p["variants"], key=lambda v: v["us_graph"])
            print(f"  B={p['batch']} H={p['heads']}: {best['name']} {best['us_graph']:.2f} us, "
                  f"{best['state_tbps_graph']:.3f} TB/s state, {best['speedup_vs_fla']:.2f}x FLA")


if __name__ == "__main__":
    main()
