#!/usr/bin/env bash
# bench/loop: shoald's event loop while it does slow work (DESIGN decision
# 12, issue 14).  A pinger (`shoalc ping`: STATS every 50 ms on its own
# connection) records how long each answer takes while shoald
#   a. opens the synthesized full-size K3 (96 shards, 497,220 tensors) for
#      the first time, hubmock answering every request after 20 ms;
#   b. stores a multi-GB derived object, PUT_BEGIN/PUT_COMMIT (the client
#      writes into the daemon's file, the daemon hashes it) and PUT (the
#      daemon copies the client's file, then hashes it);
#   c. verifies (--deep) a cache of thousands of objects: the same cache
#      (K3's 95 headers and manifest, the two packs) and a synthesized
#      tiny-k3 of 32 layers x 128 experts, warmed (~4,800 objects).
# Each phase's p99 and max answer times are figures against the bounds the
# issue states (p99 <= 100 ms, max <= 250 ms: ratio <= 1), beside the
# pinger's p99 with shoald idle, measured in the same run.  And the OPEN's
# time against its bound: 2 x (the requests it made x 20 ms / parallel)
# + the same OPEN with no latency (parse and build), also measured here.
# Both OPENs are the best of two first OPENs (fresh homes); the pinger's
# figures are the worse of its two runs.
#
# The pinger asks STATS of one small model ({"model": "t/pinger"}): it
# measures how long the loop keeps a client waiting, not the stats
# report's own cost, which grows with the cache (reported apart:
# loop.stats_full_ms, the full report with the cache of phase c).
#
# Appends JSON lines to $SHOAL_BENCH_OUT.  BENCH_LOOP_PUT_GB (default 3)
# sets the derived object's size; the run needs about 3x that on disk.
set -eu
cd "$(dirname "$0")/../.."
BIN=${BIN:-bin}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
mkdir -p "$(dirname "$OUT")"
for b in shoald shoalc hubmock mkmodel; do
    [ -x "$BIN/$b" ] || { echo "bench/loop: $BIN/$b not built (make)"; exit 1; }
done
"$BIN/hubmock" --help 2>&1 | grep -q -- '--synth' || { echo "bench/loop: hubmock has no --synth"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-loop.XXXXXX")
trap 'rm -rf "$T"' EXIT
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN

/usr/bin/python3 - "$T" "$BIN" "$OUT" "${BENCH_LOOP_PUT_GB:-3}" <<'PYEOF'
import json, os, re, signal, subprocess, sys, time, urllib.request
T, BIN, OUT, PUT_GB = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
PARALLEL, LATENCY = 8, 20
K3 = "hf://moonshotai/Kimi-K3"
QUERY = '{"model":"t/pinger"}'
procs = []

def start(name, cmd):
    log = open(os.path.join(T, name + ".log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    return p

def wait_line(name, regex, secs):
    path = os.path.join(T, name + ".log")
    end = time.monotonic() + secs
    while time.monotonic() < end:
        m = re.search(regex, open(path).read(), re.M)
        if m:
            return m
        time.sleep(0.05)
    sys.exit("bench/loop: no /%s/ in %s:\n%s" % (regex, path, open(path).read()[-2000:]))

def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

def record(name, value, unit, baseline, base_value, better, target=None):
    ratio = value / base_value if base_value else None
    line = {"name": name, "value": value, "unit": unit, "baseline": baseline,
            "baseline_value": base_value, "ratio": ratio, "better": better, "target": target}
    with open(OUT, "a") as f:
        f.write(json.dumps(line) + "\n")
    ok = "" if target is None or ratio is None else (
        " ok" if (ratio <= target if better == "lower" else ratio >= target) else " BELOW TARGET")
    print("%-30s %10.4g %-3s vs %s %.4g  ratio %.3f%s%s" % (
        name, value, unit, baseline, base_value, ratio or 0,
        "" if target is None else "  (target %s %.2f)" % ("<=" if better == "lower" else ">=",
                                                          target), ok))

def shoalc(home, *args, timeout=3600):
    r = subprocess.run([BIN + "/shoalc", "--home", home] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    out = r.stdout.decode()
    if r.returncode != 0:
        sys.exit("bench/loop: shoalc %s failed:\n%s" % (" ".join(args), out[-2000:]))
    return out

def daemon(home, name):
    os.makedirs(home, exist_ok=True)
    p = start(name, [BIN + "/shoald", "--home", home, "--no-fsync", "--parallel", str(PARALLEL),
                     "--log", os.path.join(T, name + ".log")])
    wait_line(name, r"ready on", 60)
    shoalc(home, "open", "hf://t/pinger")   # the pinger's small model
    return p

class Pinger:
    def __init__(self, home, name):
        self.name = "ping_" + name
        self.p = start(self.name, [BIN + "/shoalc", "--home", home, "ping", "--query", QUERY])
        wait_line(self.name, r"^ping ready", 20)
    def stop(self):
        stop(self.p)
        m = wait_line(self.name, r"^pings (\d+) p50_ms ([\d.]+) p99_ms ([\d.]+) max_ms ([\d.]+)", 10)
        return int(m.group(1)), float(m.group(3)), float(m.group(4))

def faults(query):
    urllib.request.urlopen(urllib.request.Request(HUB + "/_mock/faults?" + query, method="POST"),
                           timeout=10).read()

def hub_requests():
    return sum(1 for _ in open(os.path.join(T, "hub.jsonl")))

try:
    hub = start("hubmock", [BIN + "/hubmock", "--synth", "moonshotai/Kimi-K3=k3",
                            "--synth", "t/many=tiny,layers=32,experts=128",
                            "--synth", "t/pinger=tiny", "--log", os.path.join(T, "hub.jsonl")])
    m = wait_line("hubmock", r"^hub (http://[^ ]+) cdn", 3600)
    HUB = m.group(1)
    os.environ["HF_ENDPOINT"] = HUB

    # ---- the pinger idle, and the OPEN with no latency (the parse baseline) ----
    # Each OPEN is a first one (a fresh home); best of two, as the OPEN
    # with latency below: a shared machine's noise is larger than the
    # latency's share.
    t_parse = 1e9
    for i in range(2):
        ha = os.path.join(T, "home_a%d" % i)
        d = daemon(ha, "shoald_a%d" % i)
        if i == 0:
            pi = Pinger(ha, "idle")
            time.sleep(3)
            n_idle, p99_idle, max_idle = pi.stop()
        t0 = time.monotonic()
        shoalc(ha, "open", K3)
        t_parse = min(t_parse, time.monotonic() - t0)
        stop(d)

    # ---- a. the first OPEN of K3, 20 ms per request ----------------------------
    faults("latency=%d" % LATENCY)
    t_open, p99_open, max_open = 1e9, 0.0, 0.0
    for i in range(2):
        hb = os.path.join(T, "home_b%d" % i)
        d = daemon(hb, "shoald_b%d" % i)
        pg = Pinger(hb, "open%d" % i)
        r0 = hub_requests()
        t0 = time.monotonic()
        out = shoalc(hb, "--progress", "open", K3)
        t_open = min(t_open, time.monotonic() - t0)
        requests = hub_requests() - r0
        n, p99, mx = pg.stop()
        p99_open, max_open = max(p99_open, p99), max(max_open, mx)   # the worse pinger
        if i == 0:
            stop(d)
    faults("clear=1")
    m = re.search(r"(\d+) files (\d+) tensors (\d+) experts", out)
    print("OPEN of K3 with %d ms per request: %.2f s (best of 2), %d requests, %s files, %s tensors,"
          " %s experts; %d PROGRESS frames; no latency: %.2f s" % (LATENCY, t_open, requests, m.group(1),
          m.group(2), m.group(3), out.count("progress "), t_parse))
    bound = 2 * (requests * LATENCY / 1000.0 / PARALLEL) + t_parse
    record("loop.open_k3_latency20_s", t_open, "s",
           "2 x (%d requests x %d ms / %d) + OPEN without latency" % (requests, LATENCY, PARALLEL),
           bound, "lower", 1.0)
    record("loop.open_k3_sequential_s", t_open, "s",
           "the same requests one after another (x %d ms)" % LATENCY,
           requests * LATENCY / 1000.0 + t_parse, "lower", None)
    record("loop.ping_open_p99_ms", p99_open, "ms", "bound 100 ms (idle p99 %.2f ms)" % p99_idle,
           100.0, "lower", 1.0)
    record("loop.ping_open_max_ms", max_open, "ms", "bound 250 ms", 250.0, "lower", 1.0)

    # ---- b. PUT of a multi-GB derived object, both forms --------------------------
    size = int(PUT_GB * (1 << 30))
    pack = os.path.join(T, "pack")
    with open(pack, "wb") as f:
        f.truncate(size)
        step = 1 << 28
        for off in range(0, size, step):   # not all zeros: a block of noise every 256 MiB
            f.seek(off)
            f.write(os.urandom(1 << 20))
    pg = Pinger(hb, "put")
    # (--no-fsync: each PUT leaves GBs of dirty pages; without a sync the
    # next one's writes are throttled by the kernel's writeback)
    os.sync()
    t0 = time.monotonic()
    shoalc(hb, "--begin", "put", K3, "bench-pack-a", pack)
    t_begin = time.monotonic() - t0
    os.sync()
    t0 = time.monotonic()
    shoalc(hb, "put", K3, "bench-pack-b", pack)
    t_put = time.monotonic() - t0
    n_put, p99_put, max_put = pg.stop()
    os.unlink(pack)
    print("PUT_BEGIN/COMMIT of %.1f GB: %.2f s (%.2f GB/s); PUT: %.2f s (%.2f GB/s)"
          " (the client's whole call: hashing the file, writing or handing it, the daemon's"
          " hash)" % (
        size / 1e9, t_begin, size / 1e9 / t_begin, t_put, size / 1e9 / t_put))
    record("loop.ping_put_p99_ms", p99_put, "ms", "bound 100 ms (idle p99 %.2f ms)" % p99_idle,
           100.0, "lower", 1.0)
    record("loop.ping_put_max_ms", max_put, "ms", "bound 250 ms", 250.0, "lower", 1.0)

    # ---- c. VERIFY --deep of thousands of objects ------------------------------------
    hc = hb
    out = shoalc(hc, "warm", "hf://t/many", "all", "--wait")
    objects = int(re.search(r"objects (\d+)/", out).group(1))
    t0 = time.monotonic()
    shoalc(hc, "stats")
    t_stats = time.monotonic() - t0
    pg = Pinger(hc, "verify")
    t0 = time.monotonic()
    out = shoalc(hc, "verify")
    t_verify = time.monotonic() - t0
    n_ver, p99_ver, max_ver = pg.stop()
    v = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    print("VERIFY --deep: %d objects (%.1f GB) checked, %d files of %d complete and %d ok, %.2f s"
          % (v["checked"], v["bytes"] / 1e9, v["deep"]["complete"], v["deep"]["files"],
             v["deep"]["ok"], t_verify))
    record("loop.ping_verify_p99_ms", p99_ver, "ms", "bound 100 ms (idle p99 %.2f ms)" % p99_idle,
           100.0, "lower", 1.0)
    record("loop.ping_verify_max_ms", max_ver, "ms", "bound 250 ms", 250.0, "lower", 1.0)
    record("loop.stats_full_ms", t_stats * 1000.0, "ms",
           "the pinger's STATS of one small model, idle p99", p99_idle, "lower", None)
    print("(the full STATS report with %d objects cached took %.0f ms on the loop)" % (
        objects, t_stats * 1000.0))
    stop(d)
finally:
    for p in procs:
        stop(p)
PYEOF
