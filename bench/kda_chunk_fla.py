#!/usr/bin/env python3
"""FLA's chunk_kda at the cases of bench/kda_chunk_bench.cu, on the same GPU in the same run,
merged into that bench's JSON as fla_ms and speedup_vs_fla per point.

FLA is called as a serving engine calls it for K3 prefill (vLLM / SGLang): q, k, v in BF16, the
decay g precomputed from the bounded K3 gate (lower bound -5, safe_gate=True), beta as raw logits
(sigmoid in the kernel), l2norm of q and k in the kernel, FP32 initial states per sequence and the
final states returned, varlen through cu_seqlens. Ours takes F32 inputs (the engine's activations)
and computes the same function; neither includes the gate's own kernel.

Timing: triton.testing.do_bench's median (warm), like the C++ bench's median of CUDA events.

Usage: kda_chunk_fla.py --ours ours.json --out merged.json
"""
import argparse
import json

import torch
import triton
from fla.ops.kda import chunk_kda


def time_case(heads, lens, K=128, lower_bound=-5.0):
    dev = torch.device("cuda")
    torch.manual_seed(sum(lens) + heads)
    T, N, H = sum(lens), len(lens), heads
    bf16 = dict(device=dev, dtype=torch.bfloat16)
    f32 = dict(device=dev, dtype=torch.float32)
    q = torch.rand(1, T, H, K, **bf16) * 2 - 1
    k = torch.rand(1, T, H, K, **bf16) * 2 - 1
    v = torch.rand(1, T, H, K, **bf16) * 2 - 1
    beta = torch.rand(1, T, H, **f32) * 2 - 1
    a = torch.exp(0.5 * torch.randn(H, **f32)).view(1, 1, H, 1)
    f = 2 * torch.rand(1, T, H, K, **f32) - 1 + 0.5 * torch.randn(H, K, **f32)
    g = lower_bound * torch.sigmoid(a * f)  # K3 gate (spec §5.3), in [lb, 0)
    h0 = 0.1 * torch.randn(N, H, K, K, **f32)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device=dev, dtype=torch.int64)

    def call():
        return chunk_kda(q=q, k=k, v=v, g=g, beta=beta_in[0], scale=K ** -0.5, initial_state=h0,
                         output_final_state=True, use_qk_l2norm_in_kernel=True,
                         use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=lower_bound,
                         cu_seqlens=cu if N > 1 else None)

    beta_in = [beta]
    with torch.inference_mode():
        try:
            o, _ = call()
        except Exception as e:  # an FLA version that wants beta in q's dtype
            print(f"chunk_kda with FP32 beta logits failed ({e}); retrying with BF16 beta")
            beta_in[0] = beta.to(torch.bfloat16)
            o, _ = call()
        torch.cuda.synchronize()
        if not torch.isfinite(o).all():
            raise SystemExit(f"FLA output not finite at H={H} lens={lens}")
        ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
    del q, k, v, beta, beta_in, g, h0, o
    torch.cuda.empty_cache()
    return ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", required=True, help="kda_chunk_bench --json output")
    ap.add_argument("--out", required=True, help="merged JSON to write")
    ap.add_argument("--cases", default="", help="comma-separated case names to time (default: all); "
                    "T8192_H96 first keeps the issue's case inside a short device call")
    args = ap.parse_args()
    with open(args.ours) as f:
        report = json.load(f)
    report["fla"] = {"op": "fla.ops.kda.chunk_kda",
                     "options": "BF16 q/k/v, precomputed K3 gate (safe_gate, lower_bound -5), beta sigmoid and "
                                "q/k l2norm in kernel, FP32 initial/final states, cu_seqlens for batches"}
    wanted = [c for c in args.cases.split(",") if c]
    unknown = set(wanted) - {p["case"] for p in report["points"]}
    if unknown:
        raise SystemExit(f"--cases: not in {args.ours}: {', '.join(sorted(unknown))}")
    if wanted:
        report["points"] = [p for p in report["points"] if p["case"] in wanted]
        report["points"].sort(key=lambda p: wanted.index(p["case"]))
    fla_ms = {}
    for p in report["points"]:
        key = (p["heads"], tuple(p["lens"]))
        if key not in fla_ms:
            # Each case as it is timed: Triton's first compile and autotuning take minutes, and a
            # device call cut short should still show what it measured.
            fla_ms[key] = time_case(p["heads"], list(p["lens"]))
            print(f"FLA chunk_kda {p['case']}: {fla_ms[key]:.3f} ms", flush=True)
        p["fla_ms"] = round(fla_ms[key], 4)
        p["speedup_vs_fla"] = round(fla_ms[key] / p["ms"], 3)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"Chunked KDA prefill on {report['device']}: ours (F32 in; bf16 = chunk-parallel, BF16 operands; "
          f"f32 = fused, 3-part operands; bf16_vbN = bf16 at value block N) vs FLA chunk_kda (BF16 in); "
          f"issue 14 target: bf16 speedup >= 1.5 at T8192_H96")
    print(f"{'case':<20} {'mode':>10} {'vb':>4} {'ours_ms':>8} {'fla_ms':>8} {'speedup':>8} {'TFLOP/s':>8}")
    for p in report["points"]:
        print(f"{p['case']:<20} {p['mode']:>10} {p['value_block']:>4} {p['ms']:>8.3f} {p['fla_ms']:>8.3f} "
              f"{p['speedup_vs_fla']:>8.2f} {p['tflops']:>8.2f}")


if __name__ == "__main__":
    main()
