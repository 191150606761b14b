"""scripts/kernel_trace_summary.py on a trace written here with known times.

Two graph replays are kept of three (the first is dropped), each a chain of three kernels on
stream 7 and one prefetch on stream 9: an embedding (0-2 us), a norm started 3 us after it
(idle 3 us), a GEMM started 1 us before the norm ended (lead 1 us); ns in the CSV, us out.
Each kernel is charged end(i) - end(i-1), so the charges sum to the replay's wall time.
"""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADER = "start_ns,end_ns,stream,graph_id,correlation_id,blocks,threads_per_block,registers,dynamic_shared_bytes,name\n"


def write_trace(path):
    rows = []
    for replay in range(3):
        t = replay * 100_000
        corr = 50 + replay
        chain = [
            (t + 0, t + 2_000, "void kimirt::cuda::(anonymous namespace)::EmbeddingKernel(int const*; long)"),
            (t + 5_000, t + 9_000, "void kimirt::cuda::(anonymous namespace)::RmsNormHeldKernel<false; 12>(float const*)"),
            (t + 8_000, t + 30_000, "void kimirt::cuda::(anonymous namespace)::DecodeGemmKernel<1; true>(unsigned short const*)"),
        ]
        for start, end, name in chain:
            rows.append(f"{start},{end},7,4,{corr},528,128,128,0,{name}\n")
        rows.append(f"{t + 1_000},{t + 6_000},9,4,{corr},16,32,32,0,PrefetchL2Kernel(int)\n")
    # A kernel launched outside any graph: not part of a replay.
    rows.append("400000,401000,7,0,99,1,256,32,0,ArgmaxKernel(float const*)\n")
    path.write_text(HEADER + "".join(rows))


def test_charges_leads_and_idle_time(tmp_path):
    trace, out = tmp_path / "trace.csv", tmp_path / "summary.json"
    write_trace(trace)
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_trace_summary.py"), str(trace), "--json", str(out)],
                         capture_output=True, text=True, check=True)
    assert "graph 4: 2 replays" in res.stdout
    [graph] = json.loads(out.read_text())
    assert graph["graph"] == 4 and graph["replays"] == 2 and graph["kernels"] == 4
    assert graph["wall_us_median"] == 30.0
    assert graph["idle_us_median"] == 3.0
    by_name = {k["name"]: k for k in graph["kernels_by_charge"]}
    assert set(by_name) == {"EmbeddingKernel", "RmsNormHeldKernel<false, 12>", "DecodeGemmKernel<1, true>"}
    assert all(k["calls"] == 1 for k in graph["kernels_by_charge"])
    assert by_name["EmbeddingKernel"]["charged_us"] == 2.0
    assert by_name["RmsNormHeldKernel<false, 12>"]["charged_us"] == 7.0  # 9 - 2: its 3 us wait included
    assert by_name["DecodeGemmKernel<1, true>"]["charged_us"] == 21.0
    assert by_name["DecodeGemmKernel<1, true>"]["lead_us"] == 1.0
    assert sum(k["charged_us"] for k in graph["kernels_by_charge"]) == graph["wall_us_median"]
    # The side stream's kernel is counted apart, not charged.
    assert "beside the chain: 1 kernels, 5.0 us" in res.stdout


def test_a_trace_without_graph_kernels_is_an_error(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(HEADER + "0,1000,7,0,1,1,32,32,0,AddKernel(float*)\n")
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "kernel_trace_summary.py"), str(trace)],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "no kernels launched from a CUDA graph" in res.stderr
