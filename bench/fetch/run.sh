#!/usr/bin/env bash
# bench/fetch: shoal-fetch against hubmock on loopback, each figure a ratio
# to a baseline measured in the same run.
#   1. slice experts into the cache vs curl fetching the same ranges over
#      one kept-alive connection into files           (target >= 0.9)
#   2. hubmock capping each connection at 50 MB/s, 8 parallel transfers:
#      aggregate rate vs 8 x 50 MB/s                   (target >= 0.85)
#   3. CPU seconds (user+sys) per GB fetched, vs curl's (reported)
#   4. the same cap, 3 expert-sized objects alone (a decode layer's few new
#      experts): shoal-fetch with 8 connections (objects split into parts)
#      vs curl fetching the same 3 ranges with --parallel-max 8, one
#      connection per range (nothing split); >= 1 beats 3 single-connection
#      transfers, the bound is 8 x 50 / (3 x 50) = 2.67
# Appends JSON lines to $SHOAL_BENCH_OUT (default bench/out/results.jsonl).
# BENCH_FETCH_EXPERTS (default 8) sets the slice size: 8 -> 24 experts, 421 MB.
set -eu
cd "$(dirname "$0")/../.."
. bench/lib/hub.sh
BIN=${BIN:-bin}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
mkdir -p "$(dirname "$OUT")"
for b in shoal-fetch hubmock mkmodel hubget; do
    [ -x "$BIN/$b" ] || { echo "bench/fetch: $BIN/$b not built (make)"; exit 1; }
done
command -v curl >/dev/null || { echo "bench/fetch: curl not installed"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-fetch.XXXXXX")
HPID=
trap '[ -n "$HPID" ] && kill "$HPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

"$BIN/mkmodel" --quiet --preset slice --experts "${BENCH_FETCH_EXPERTS:-8}" --out "$T/model"
bench_hubmock bench/fetch "$T/model"

/usr/bin/python3 - "$T" "$HUB" "$BIN" "$OUT" <<'PYEOF'
import json, os, resource, struct, subprocess, sys, time
T, HUB, BIN, OUT = sys.argv[1:5]
model = os.path.join(T, "model")

def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def run(cmd, **kw):
    c0, t0 = cpu_children(), time.monotonic()
    p = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, **kw)
    return time.monotonic() - t0, cpu_children() - c0, p.stdout.decode()

def record(name, value, unit, baseline, base_value, better, target=None):
    ratio = value / base_value if base_value else None
    line = {"name": name, "value": value, "unit": unit, "baseline": baseline,
            "baseline_value": base_value, "ratio": ratio, "better": better, "target": target}
    with open(OUT, "a") as f:
        f.write(json.dumps(line) + "\n")
    print("%-34s %10.4g %-5s vs %s %.4g  ratio %.3f%s" % (
        name, value, unit, baseline, base_value, ratio or 0,
        "" if target is None else "  (target %s %.2f)" % (">=" if better == "higher" else "<=", target)))

# Expert spans from the shard headers (w1.weight_packed .. w3.weight_scale).
idx = json.load(open(os.path.join(model, "model.safetensors.index.json")))["weight_map"]
spans = {}
for shard in sorted(set(idx.values())):
    raw = open(os.path.join(model, shard), "rb").read(8)
    n = struct.unpack("<Q", raw)[0]
    with open(os.path.join(model, shard), "rb") as f:
        f.seek(8)
        h = json.loads(f.read(n))
    for name, t in h.items():
        if ".experts." in name and name.endswith("w1.weight_packed"):
            key = name.rsplit(".w1.weight_packed", 1)[0]
            b = 8 + n + t["data_offsets"][0]
            e = 8 + n + h[key + ".w3.weight_scale"]["data_offsets"][1]
            spans[key] = (shard, b, e)
total = sum(e - b for _, b, e in spans.values())
print("bench/fetch: %d experts, %.1f MB" % (len(spans), total / 1e6))

# Baseline: curl, one connection kept alive, the same ranges into files.
loc = {}
for shard in set(s for s, _, _ in spans.values()):
    info = subprocess.run([os.path.join(BIN, "hubget"), "hf://org/slice", shard, "--info"],
                          check=True, stdout=subprocess.PIPE).stdout.decode()
    loc[shard] = [l.split(None, 1)[1] for l in info.splitlines() if l.startswith("location")][0]
cmd = ["curl", "-sS", "--fail"]
os.makedirs(os.path.join(T, "curl"))
for i, (shard, b, e) in enumerate(sorted(spans.values())):
    if i:
        cmd.append("--next")
    cmd += ["-sS", "-r", "%d-%d" % (b, e - 1), loc[shard], "-o", os.path.join(T, "curl", str(i))]

def ours(home, extra, experts="all", want=None):
    # the manifest first (not timed), then the experts alone
    subprocess.run([os.path.join(BIN, "shoal-fetch"), "--home", home, "hf://org/slice",
                    "--manifest", "--no-fsync"], check=True, stdout=subprocess.DEVNULL)
    secs, cpu, out = run([os.path.join(BIN, "shoal-fetch"), "--home", home, "hf://org/slice",
                          "--experts", experts, "--no-fsync", "--json"] + extra)
    j = json.loads(out)
    assert j["bytes_fetched"] == (total if want is None else want), j
    return secs, cpu

best_curl = best_ours = best_one = None
for rep in range(2):   # best of two: the machine is shared
    cs, ccpu, _ = run(cmd)
    subprocess.run(["rm", "-rf", os.path.join(T, "curl")]); os.makedirs(os.path.join(T, "curl"))
    os_, ocpu = ours(os.path.join(T, "home%d" % rep), [])
    subprocess.run(["rm", "-rf", os.path.join(T, "home%d" % rep)])
    o1, _ = ours(os.path.join(T, "one%d" % rep), ["--parallel", "1", "--coalesce", "1"])
    subprocess.run(["rm", "-rf", os.path.join(T, "one%d" % rep)])
    if best_curl is None or cs < best_curl[0]: best_curl = (cs, ccpu)
    if best_ours is None or os_ < best_ours[0]: best_ours = (os_, ocpu)
    if best_one is None or o1 < best_one: best_one = o1
record("fetch.experts_loopback_gbps", total / best_ours[0] / 1e9, "GB/s",
       "curl one connection", total / best_curl[0] / 1e9, "higher", 0.9)
# The same with one transfer, one range per request: what a connection does.
record("fetch.experts_loopback_1conn_gbps", total / best_one / 1e9, "GB/s",
       "curl one connection", total / best_curl[0] / 1e9, "higher")
record("fetch.cpu_s_per_gb", best_ours[1] / (total / 1e9), "s/GB",
       "curl one connection", best_curl[1] / (total / 1e9), "lower")

# Capped: 50 MB/s per connection, 8 parallel transfers, one expert each.
subprocess.run(["curl", "-sS", "-f", "-X", "POST", HUB + "/_mock/faults?bw=50MB", "-o", os.devnull], check=True)
cs, ccpu = ours(os.path.join(T, "capped"), ["--parallel", "8", "--coalesce", "1"])
record("fetch.capped_8x50MBps_mbps", total / cs / 1e6, "MB/s", "8 x 50 MB/s cap", 400.0, "higher", 0.85)

# Split: 3 experts alone on 8 connections at the same cap, vs curl's 3
# parallel ranges (what one request per object gets).
three = sorted(spans.items(), key=lambda kv: (kv[1][0], kv[1][1]))[:3]
tb = sum(e - b for _, (_, b, e) in three)
sel = ",".join("%s:%s" % (k.split(".layers.")[1].split(".")[0], k.rsplit(".", 1)[1])
               for k, _ in three)
pcmd = ["curl", "-sS", "--no-progress-meter", "--fail", "--parallel", "--parallel-immediate",
        "--parallel-max", "8"]
os.makedirs(os.path.join(T, "curl3"))
for i, (_, (shard, b, e)) in enumerate(three):
    pcmd += ["-r", "%d-%d" % (b, e - 1), loc[shard], "-o", os.path.join(T, "curl3", str(i))]
best_c3 = best_o3 = None
for rep in range(2):
    c3, _, _ = run(pcmd)
    o3, _ = ours(os.path.join(T, "three%d" % rep), ["--parallel", "8"], sel, tb)
    subprocess.run(["rm", "-rf", os.path.join(T, "three%d" % rep)])
    best_c3 = c3 if best_c3 is None or c3 < best_c3 else best_c3
    best_o3 = o3 if best_o3 is None or o3 < best_o3 else best_o3
record("fetch.split_3experts_capped_mbps", tb / best_o3 / 1e6, "MB/s",
       "curl 3 ranges --parallel-max 8 (one connection each)", tb / best_c3 / 1e6, "higher", 1.0)
PYEOF
