#!/usr/bin/env bash
# Runs on a GPU machine like scripts/gpu_check.sh (carrying .carry): Nsight Compute times each
# kernel of about three decode forwards of the built-in model, and the summary splits a decode
# step into kernels per forward and their GPU time; the rest of the step's wall time is launch
# and host work. Usage: bash scripts/gpu_profile_decode.sh
set -uo pipefail
out="${OUT:-/tmp/kimirt-out}"; mkdir -p "$out"
root=/tmp/kimirt-gpu; rm -rf "$root"; mkdir -p "$root"; tar -C "$root" -xJf .carry/gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$root/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/kimirt-cache
"$root/kimirt" bench model --device cuda --batch-sizes 1 --prompt-len 256 --decode-tokens 16 2>&1 | tail -2
timeout 240 ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-skip 3300 --launch-count 600 \
  "$root/kimirt" bench model --device cuda --batch-sizes 1 --prompt-len 256 --decode-tokens 16 > "$out/ncu.csv" 2>"$out/ncu.err"
echo "ncu exit $?"; wc -l "$out/ncu.csv"; tail -3 "$out/ncu.err"
python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
iname = hdr.index("Kernel Name"); ival = hdr.index("Metric Value"); iid = hdr.index("ID")
tot = collections.Counter(); cnt = collections.Counter()
for r in rows:
    v = float(r[ival].replace(",", ""))
    name = r[iname].split("(")[0][:60]
    tot[name] += v; cnt[name] += 1
allns = sum(tot.values())
fw = max(1, cnt.get("EmbeddingKernel", 0) or sum(v for k, v in cnt.items() if "Embedding" in k))
print("kernels", len(rows), "forwards", fw, "kernels/forward", len(rows) / fw, "GPU us/forward", allns / 1e3 / fw)
for k, v in tot.most_common(15): print(f"{v/1e3:10.1f} us {cnt[k]:5d}x {k}")
PY
