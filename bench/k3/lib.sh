# bench/k3/lib.sh — sourced by bench/k3/*.sh (make bench-k3; docs/performance.md,
# "The 64 GB regime, measured").  Shared setup for benchmarks of a full-width
# K3 with few layers served by the synthesized Hub:
#
#   k3_setup NAME        checks the binaries, makes $T (a temp dir on the disk
#                        the cache lives on, removed at exit with every cache),
#                        sets $MODEL_SPEC, $LAYERS, $K3_CACHE_MAX
#   k3_hub               tools/hubmock --synth org/k3l$LAYERS=k3,layers=$LAYERS
#                        (real hidden size, heads, vocabulary, 896 experts a
#                        layer, top-16); sets HF_ENDPOINT; $HPID
#   k3_shoald            shoald on $T/home with the cache budget $K3_CACHE_MAX;
#                        $DPID
#   k3_plan_json ARGS... `shoal-engine plan` of the synthesized model's config
#                        (headers-only mkmodel: no weight on disk) as JSON
#   k3_cgroup NAME BYTES a memory cgroup limited to BYTES: v1
#                        (/sys/fs/cgroup/memory/<ours>/NAME, memory.limit_in_bytes)
#                        or v2 (memory.max); sets $CG and $CG_V (1|2), or
#                        returns 1 when none can be made (the run then falls
#                        back to --ram, and says so)
#   k3_cgroup_oom        the cgroup's OOM kills so far (v1 oom_control's
#                        oom_kill, v2 memory.events' oom_kill)
#   k3_cgroup_peak       the cgroup's peak usage in bytes
#   k3_drop_cache DIR    drop the page cache of every file under DIR
#                        (posix_fadvise DONTNEED: only our files, not the
#                        machine's whole cache)
#   k3_disk_rate FILE    O_DIRECT read rate of FILE in bytes/s: 2 GiB at most
#                        in 4 MiB reads on 8 threads, as the expert source
#                        reads (one thread measured 0.71 GB/s here, the
#                        engine's reads 1.2-1.5 GB/s)
#
# Knobs (environment): K3_LAYERS (default 8), K3_CACHE_MAX (default 40G: the
# shoald budget; the BF16 spine of 8 layers is ~14 GB, the packs 6.3 + 4.0 GB,
# each decode token up to 16 x 7 x 17.5 MB = 2 GB of experts), K3_TOKENS
# (decode tokens, default 3), K3_PROMPT (prompt ids, default 1000,2000).
# Nothing here needs the network.
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
K3_PY=/usr/bin/python3

k3_setup() {
    cd "$(dirname "$0")/../.."
    BIN=${BIN:-bin}
    K3_NAME=$1
    LAYERS=${K3_LAYERS:-8}
    K3_CACHE_MAX=${K3_CACHE_MAX:-40G}
    for b in shoal-engine shoald hubmock mkmodel; do
        [ -x "$BIN/$b" ] || { echo "$K3_NAME: $BIN/$b not built (make)"; exit 1; }
    done
    T=$(mktemp -d "${K3_TMP:-/var/tmp}/shoal-bench-k3.XXXXXX")
    HPID= DPID= CG=
    trap k3_cleanup EXIT
    trap 'exit 130' INT TERM
    MODEL_SPEC=hf://org/k3l$LAYERS
    mkdir -p "$T/home" bench/out
}

k3_cleanup() {
    [ -n "$DPID" ] && kill "$DPID" 2>/dev/null
    [ -n "$HPID" ] && kill "$HPID" 2>/dev/null
    wait 2>/dev/null
    if [ -n "$CG" ] && [ -d "$CG" ]; then
        rmdir "$CG" 2>/dev/null
    fi
    rm -rf "$T"
}

k3_hub() {
    bench_hub_start "$K3_NAME" 1200 --synth "org/k3l$LAYERS=k3,layers=$LAYERS" \
        --synth-cache "$T/etags.txt"
}

k3_shoald() {
    "$BIN/shoald" --home "$T/home" --no-fsync --max-size "$K3_CACHE_MAX" --keep-spine \
        --log "$T/shoald.log" &
    DPID=$!
    for _ in $(seq 300); do grep -q 'ready on' "$T/shoald.log" 2>/dev/null && break; sleep 0.1; done
    grep -q 'ready on' "$T/shoald.log" || { echo "$K3_NAME: shoald did not start"; cat "$T/shoald.log"; exit 1; }
}

k3_plan_json() {
    [ -d "$T/cfg" ] || "$BIN/mkmodel" --preset k3 --layers "$LAYERS" --headers-only --quiet \
        --out "$T/cfg" || exit 1
    "$BIN/shoal-engine" plan "$T/cfg" --json "$@"
}

k3_cgroup() {  # NAME BYTES
    local name=$1 bytes=$2 mine
    CG=
    mine=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
    if [ -d /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory${mine%/}/$name" 2>/dev/null; then
        CG=/sys/fs/cgroup/memory${mine%/}/$name
        CG_V=1
        echo "$bytes" > "$CG/memory.limit_in_bytes" 2>/dev/null && return 0
        rmdir "$CG"; CG=
    fi
    mine=$(sed -n 's/^0:://p' /proc/self/cgroup)
    if [ -f /sys/fs/cgroup/cgroup.controllers ] && mkdir "/sys/fs/cgroup${mine%/}/$name" 2>/dev/null; then
        CG=/sys/fs/cgroup${mine%/}/$name
        CG_V=2
        echo "$bytes" > "$CG/memory.max" 2>/dev/null && return 0
        rmdir "$CG"; CG=
    fi
    return 1
}

k3_cgroup_oom() {
    [ -n "$CG" ] || { echo 0; return; }
    if [ "$CG_V" = 1 ]; then
        sed -n 's/^oom_kill \([0-9]*\)$/\1/p' "$CG/memory.oom_control" | grep . || echo 0
    else
        sed -n 's/^oom_kill \([0-9]*\)$/\1/p' "$CG/memory.events" | grep . || echo 0
    fi
}

k3_cgroup_peak() {
    [ -n "$CG" ] || { echo 0; return; }
    if [ "$CG_V" = 1 ]; then cat "$CG/memory.max_usage_in_bytes"
    else cat "$CG/memory.peak" 2>/dev/null || echo 0; fi
}

k3_cgroup_reset_peak() {
    [ -n "$CG" ] || return 0
    if [ "$CG_V" = 1 ]; then echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null; fi
    return 0
}

k3_drop_cache() {
    $K3_PY - "$1" <<'PY'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(root, f)
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}

k3_disk_rate() {
    $K3_PY - "$1" <<'PY'
import mmap, os, sys, threading, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
part = 4 << 20                  # the expert source's O_DIRECT parts
size = min(os.fstat(fd).st_size // part * part, 1 << 30)
def rate(nth, base):
  nxt, lock, total = [0], threading.Lock(), [0]
  def run():
    buf = mmap.mmap(-1, part)
    while True:
        with lock:
            off = nxt[0]
            nxt[0] += part
        if off >= size:
            return
        n = os.preadv(fd, [buf], base + off)
        with lock:
            total[0] += max(n, 0)
  t0 = time.perf_counter()
  th = [threading.Thread(target=run) for _ in range(nth)]
  for t in th: t.start()
  for t in th: t.join()
  return total[0] / (time.perf_counter() - t0)
# the best of 8, 16 and 32 readers, each over its own GiB (the disk's queue depth decides)
full = os.fstat(fd).st_size // part * part
print(int(max(rate(n, (i * size) % max(full - size, 1) // part * part)
              for i, n in enumerate((8, 16, 32)))))
PY
}
