#!/usr/bin/env bash
# bench/k3/decode.sh — the 64 GB regime, here (issue 15 item 6; make bench-k3;
# docs/performance.md "The 64 GB regime, measured").
#
# A full-width K3 with $K3_LAYERS (8) layers — hidden 7168, 96 heads, the
# 163,840 vocabulary, 896 experts a layer, top-16; mkmodel's reduced k3
# pattern K K K M K K M M — served by the synthesized Hub through shoald, each
# engine run inside a memory cgroup whose limit gives the int8 spine the
# share of memory K3's int8 spine (58.0 GB) has of a 64 GiB machine.  Both
# spine modes (--spine int4, --spine int8), each run twice: run 1 with
# shoald's cache as the earlier runs left it (the first int4 run fetches the
# BF16 spine and the experts from the Hub, each mode's first run builds its
# pack), run 2 after dropping the page cache of shoald's files.
#
# Per decode token: seconds; bytes the engine read from disk (/proc/PID/io
# read_bytes) and the ratio of all bytes read after the load to the expert
# bytes the source read because the RAM tier did not hold them (target
# <= 1.05: nothing of the spine re-read); major page faults (/proc/PID/stat
# majflt: the spine is anonymous memory, so any is a page of a mapping);
# seconds against max(compute, disk bound) (compute: the token's time not
# waiting for experts; disk bound: its bytes at the O_DIRECT rate measured
# on the cache's disk; target <= 1.25).  Where the plan streams part of the
# spine (--spine int8 at this limit) its bytes are reported beside the
# ratio: they are the plan's choice, not a re-read of the resident part.
# The plan each run made, its exit
# status and the cgroup's OOM kills (must be 0) and peak.  Figures on
# stdout, all of it in bench/out/k3.json.
set -u
. "$(dirname "$0")/lib.sh"
k3_setup bench/k3
TOKENS=${K3_TOKENS:-3}
PROMPT=${K3_PROMPT:-1000,2000}
OUTJ=${K3_OUT:-bench/out/k3.json}

# the ratio: K3's int8 spine to 64 GiB, from the full config's plan
"$BIN/mkmodel" --preset k3 --headers-only --quiet --out "$T/full" || exit 1
"$BIN/shoal-engine" plan "$T/full" --spine int8 --ram 128G --json > "$T/full-plan.json" || exit 1
k3_plan_json --spine int8 --ram 128G > "$T/small-plan.json" || exit 1
LIMIT=$($K3_PY - "$T/full-plan.json" "$T/small-plan.json" <<'PY'
import json, sys
full = json.load(open(sys.argv[1]))["spine"]["bytes"]
small = json.load(open(sys.argv[2]))["spine"]["bytes"]
print(int(small * (64 << 30) / full))
PY
)
echo "bench/k3: the ${LAYERS}-layer model's int8 spine gets the share K3's has of 64 GiB:" \
     "a limit of $LIMIT bytes"

k3_hub
k3_shoald
CGNAME=shoal-bench-k3-$$
if k3_cgroup "$CGNAME" "$LIMIT"; then
    echo "bench/k3: memory cgroup v$CG_V $CG = $LIMIT bytes"
    LIMITED_BY="cgroup v$CG_V"
else
    echo "bench/k3: no memory cgroup can be made here: --ram $LIMIT stands for it"
    LIMITED_BY=--ram
fi

RUNS=()
for mode in int4 int8; do
    for run in 1 2; do
        [ "$run" = 2 ] && k3_drop_cache "$T/home"
        k3_cgroup_reset_peak
        oom0=$(k3_cgroup_oom)
        rate=$( [ -f "$T/disk_rate" ] && cat "$T/disk_rate" || echo 0)
        $K3_PY - "$T/run-$mode-$run.json" "$rate" "${CG:-}" "$LIMIT" -- \
            "$BIN/shoal-engine" run "$MODEL_SPEC" --home "$T/home" --tokens "$PROMPT" \
            --max-tokens $((TOKENS + 1)) --spine "$mode" --stats --json \
            $( [ -z "${CG:-}" ] && echo "--ram $LIMIT") <<'PY'
import json, os, re, subprocess, sys, time
out, rate, cg, limit = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
cmd = sys.argv[sys.argv.index("--") + 1:]
if cg:
    cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg] + cmd
t0 = time.monotonic()
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(out + ".err", "w"))
samples = []
def sample():
    try:
        rb = int(re.search(r"read_bytes: (\d+)", open("/proc/%d/io" % p.pid).read()).group(1))
        st = open("/proc/%d/stat" % p.pid).read()
        mf = int(st[st.rindex(")") + 2:].split()[9])
        samples.append((time.monotonic() - t0, rb, mf))
    except (OSError, AttributeError, ValueError):
        pass
import threading
stdout = []
th = threading.Thread(target=lambda: stdout.append(p.stdout.read()))
th.start()
while p.poll() is None:
    sample()
    time.sleep(0.02)
th.join()
rc = p.returncode
err = open(out + ".err").read()
res = {"exit": rc, "argv": cmd, "limit": limit}
try:
    j = json.loads(stdout[0].decode().strip().splitlines()[-1])
except (ValueError, IndexError):
    j = None
if j is None:
    res["error"] = err.strip().splitlines()[-1] if err.strip() else "no output"
    plan = [l for l in err.splitlines() if l.startswith("plan:")]
    res["plan_text"] = plan
    json.dump(res, open(out, "w"))
    sys.exit(0)
tm = j["timings"]
res["tokens"] = j["tokens"]
res["plan"] = j.get("plan")
res["plan_text"] = [l for l in err.splitlines() if l.startswith("plan:")]
res["load_s"], res["prefill_s"] = tm["load_ms"] / 1e3, tm["prefill_ms"] / 1e3
m = re.search(r"per-token compute/waiting ms: (.*)", err)
cw = [tuple(map(float, x.split("/"))) for x in m.group(1).split()] if m else []
m = re.search(r"stats: reads: ([0-9.]+) MiB", err)
expert_read = float(m.group(1)) * 1048576 if m else 0.0
res["expert_bytes_read"] = expert_read
m = re.search(r"stats: streamed spine: .*?, (\d+) layer reads \((\d+) not read ahead\), ([0-9.]+) MiB, ([0-9.]+) ms waited", err)
res["spine_streamed_bytes"] = float(m.group(3)) * 1048576 if m else 0.0
res["spine_stream_wait_s"] = float(m.group(4)) / 1e3 if m else 0.0
def at(t, k):   # read_bytes (k=1) or majflt (k=2) at t, interpolated
    prev = (0.0, 0, 0)
    for s in samples:
        if s[0] >= t:
            if s[0] == prev[0]:
                return s[k]
            return prev[k] + (s[k] - prev[k]) * (t - prev[0]) / (s[0] - prev[0])
        prev = s
    return samples[-1][k] if samples else 0
# the process's own clock starts a few ms after t0; the load ends at load_ms
t_load = tm["load_ms"] / 1e3
t = t_load + tm["prefill_ms"] / 1e3
per = []
for i, ms in enumerate(tm["per_token_ms"]):
    a, b = t, t + ms / 1e3
    rb = at(b, 1) - at(a, 1)
    mf = at(b, 2) - at(a, 2)
    comp = (cw[i][0] / 1e3) if i < len(cw) else ms / 1e3
    disk = rb / rate if rate > 0 else 0.0
    per.append({"s": ms / 1e3, "read_bytes": int(rb), "majflt": round(mf),
                "compute_s": comp, "disk_bound_s": disk,
                "vs_bound": (ms / 1e3) / max(comp, disk) if max(comp, disk) > 0 else None})
    t = b
res["per_token"] = per
after = (samples[-1][1] if samples else 0) - at(t_load, 1)
res["read_after_load"] = int(after)
res["read_ratio"] = after / expert_read if expert_read > 0 else None
res["majflt_run"] = j.get("stats", {}).get("majflt_run")
res["samples"] = len(samples)
json.dump(res, open(out, "w"))
PY
        oom1=$(k3_cgroup_oom)
        peak=$(k3_cgroup_peak)
        $K3_PY - "$T/run-$mode-$run.json" "$mode" "$run" "$((oom1 - oom0))" "$peak" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r.update(mode=sys.argv[2], run=int(sys.argv[3]), oom_kills=int(sys.argv[4]), cgroup_peak=int(sys.argv[5]))
json.dump(r, open(sys.argv[1], "w"))
PY
        RUNS+=("$T/run-$mode-$run.json")
        # the disk's O_DIRECT rate, once the first pack is on it
        if [ ! -f "$T/disk_rate" ]; then
            big=$(find "$T/home" -type f -size +1G -printf '%s %p\n' 2>/dev/null | sort -n | tail -n 1 | cut -d' ' -f2)
            [ -n "$big" ] && k3_drop_cache "$T/home" && k3_disk_rate "$big" > "$T/disk_rate"
            echo "bench/k3: O_DIRECT read rate of the cache's disk: $(cat "$T/disk_rate" 2>/dev/null) bytes/s"
            # the first run is re-scored against the rate now known
            $K3_PY - "$T/run-$mode-$run.json" "$(cat "$T/disk_rate" 2>/dev/null || echo 0)" <<'PY'
import json, sys
r, rate = json.load(open(sys.argv[1])), float(sys.argv[2])
for t in r.get("per_token", []):
    t["disk_bound_s"] = t["read_bytes"] / rate if rate > 0 else 0.0
    b = max(t["compute_s"], t["disk_bound_s"])
    t["vs_bound"] = t["s"] / b if b > 0 else None
json.dump(r, open(sys.argv[1], "w"))
PY
        fi
    done
done

$K3_PY - "$OUTJ" "$LIMIT" "$LIMITED_BY" "$(cat "$T/disk_rate" 2>/dev/null || echo 0)" "$LAYERS" \
    "$T/full-plan.json" "${RUNS[@]}" <<'PY'
import json, sys
out, limit, by, rate, layers, fullp = sys.argv[1:7]
runs = [json.load(open(f)) for f in sys.argv[7:]]
full = json.load(open(fullp))["spine"]["bytes"]
doc = {"model": "k3, %s layers (hubmock --synth), 896 experts, top-16" % layers,
       "limit": int(limit), "limited_by": by, "k3_int8_spine": full,
       "ratio_int8_spine_to_ram": full / (64 << 30), "disk_rate": float(rate), "runs": runs}
json.dump(doc, open(out, "w"), indent=1)
print("bench/k3: limit %.2f GiB (%s), O_DIRECT disk %.2f GB/s" % (int(limit) / 2**30, by, float(rate) / 1e9))
for r in runs:
    head = "bench/k3: --spine %s run %d:" % (r["mode"], r["run"])
    if "per_token" not in r:
        print(head, "exit %s, oom kills %d: %s" % (r["exit"], r["oom_kills"], r.get("error")))
        for l in r.get("plan_text", []):
            print("   ", l)
        continue
    pl = r["plan"]
    print(head, "plan %s %s, resident %.2f GiB, streamed %.2f GiB, RAM tier %.2f GiB, context %d;"
          % (pl["verdict"], pl["spine"]["mode"], pl["spine"]["resident"] / 2**30,
             pl["spine"]["streamed"] / 2**30, pl["ram_tier"] / 2**30, pl["context"]),
          "load %.1f s, prefill %.1f s, exit %d, oom kills %d, cgroup peak %.2f GiB"
          % (r["load_s"], r["prefill_s"], r["exit"], r["oom_kills"], r["cgroup_peak"] / 2**30))
    for i, t in enumerate(r["per_token"]):
        print("    token %d: %.2f s, read %.1f MiB, %d major faults, compute %.2f s, disk bound %.2f s,"
              " %.2f x max(compute, disk)" % (i + 1, t["s"], t["read_bytes"] / 2**20, t["majflt"],
              t["compute_s"], t["disk_bound_s"], t["vs_bound"] or 0))
    rr = r.get("read_ratio")
    print("    read after load %.1f MiB / expert bytes missed %.1f MiB = %s (target <= 1.05)%s"
          % (r["read_after_load"] / 2**20, r["expert_bytes_read"] / 2**20,
             "%.3f" % rr if rr is not None else "n/a",
             "; the streamed spine read %.1f MiB of it (the plan's choice), waited %.2f s"
             % (r["spine_streamed_bytes"] / 2**20, r["spine_stream_wait_s"])
             if r.get("spine_streamed_bytes") else ""))
print("bench/k3: wrote", out)
PY
