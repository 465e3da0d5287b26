. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# bench/k3/lib.sh — sourced by bench/k3/*.sh (make bench-k3; docs/performance.md,
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# "The 64 GB regime, measured").  Shared setup for benchmarks of a full-width
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# K3 with few layers served by the synthesized Hub:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_setup NAME        checks the binaries, makes $T (a temp dir on the disk
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        the cache lives on, removed at exit with every cache),
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        sets $MODEL_SPEC, $LAYERS, $K3_CACHE_MAX
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_hub               tools/hubmock --synth org/k3l$LAYERS=k3,layers=$LAYERS
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        (real hidden size, heads, vocabulary, 896 experts a
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        layer, top-16); sets HF_ENDPOINT; $HPID
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_shoald            shoald on $T/home with the cache budget $K3_CACHE_MAX;
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        $DPID
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_plan_json ARGS... `shoal-engine plan` of the synthesized model's config
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        (headers-only mkmodel: no weight on disk) as JSON
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_cgroup NAME BYTES a memory cgroup limited to BYTES: v1
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        (/sys/fs/cgroup/memory/<ours>/NAME, memory.limit_in_bytes)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        or v2 (memory.max); sets $CG and $CG_V (1|2), or
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        returns 1 when none can be made (the run then falls
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        back to --ram, and says so)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_cgroup_oom        the cgroup's OOM kills so far (v1 oom_control's
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        oom_kill, v2 memory.events' oom_kill)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_cgroup_peak       the cgroup's peak usage in bytes
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_drop_cache DIR    drop the page cache of every file under DIR
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        (posix_fadvise DONTNEED: only our files, not the
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        machine's whole cache)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#   k3_disk_rate FILE    O_DIRECT read rate of FILE in bytes/s: 2 GiB at most
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        in 4 MiB reads on 8 threads, as the expert source
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        reads (one thread measured 0.71 GB/s here, the
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#                        engine's reads 1.2-1.5 GB/s)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
#
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# Knobs (environment): K3_LAYERS (default 8), K3_CACHE_MAX (default 40G: the
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# shoald budget; the BF16 spine of 8 layers is ~14 GB, the packs 6.3 + 4.0 GB,
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# each decode token up to 16 x 7 x 17.5 MB = 2 GB of experts), K3_TOKENS
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# (decode tokens, default 3), K3_PROMPT (prompt ids, default 1000,2000).
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# Nothing here needs the network.
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
K3_PY=/usr/bin/python3
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_setup() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    cd "$(dirname "$0")/../.."
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    BIN=${BIN:-bin}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    K3_NAME=$1
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    LAYERS=${K3_LAYERS:-8}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    K3_CACHE_MAX=${K3_CACHE_MAX:-40G}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    for b in shoal-engine shoald hubmock mkmodel; do
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        [ -x "$BIN/$b" ] || { echo "$K3_NAME: $BIN/$b not built (make)"; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    done
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    T=$(mktemp -d "${K3_TMP:-/var/tmp}/shoal-bench-k3.XXXXXX")
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    HPID= DPID= CG=
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    trap k3_cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    trap 'exit 130' INT TERM
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    MODEL_SPEC=hf://org/k3l$LAYERS
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    mkdir -p "$T/home" bench/out
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_cleanup() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    [ -n "$DPID" ] && kill "$DPID" 2>/dev/null
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    [ -n "$HPID" ] && kill "$HPID" 2>/dev/null
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    wait 2>/dev/null
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    if [ -n "$CG" ] && [ -d "$CG" ]; then
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        rmdir "$CG" 2>/dev/null
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    rm -rf "$T"
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_hub() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    bench_hub_start "$K3_NAME" 1200 --synth "org/k3l$LAYERS=k3,layers=$LAYERS" \
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        --synth-cache "$T/etags.txt"
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_shoald() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    "$BIN/shoald" --home "$T/home" --no-fsync --max-size "$K3_CACHE_MAX" --keep-spine \
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        --log "$T/shoald.log" &
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    DPID=$!
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    for _ in $(seq 300); do grep -q 'ready on' "$T/shoald.log" 2>/dev/null && break; sleep 0.1; done
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    grep -q 'ready on' "$T/shoald.log" || { echo "$K3_NAME: shoald did not start"; cat "$T/shoald.log"; exit 1; }
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_plan_json() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    [ -d "$T/cfg" ] || "$BIN/mkmodel" --preset k3 --layers "$LAYERS" --headers-only --quiet \
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        --out "$T/cfg" || exit 1
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    "$BIN/shoal-engine" plan "$T/cfg" --json "$@"
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_cgroup() {  # NAME BYTES
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    local name=$1 bytes=$2 mine
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    CG=
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    mine=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    if [ -d /sys/fs/cgroup/memory ] && mkdir "/sys/fs/cgroup/memory${mine%/}/$name" 2>/dev/null; then
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        CG=/sys/fs/cgroup/memory${mine%/}/$name
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        CG_V=1
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        echo "$bytes" > "$CG/memory.limit_in_bytes" 2>/dev/null && return 0
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        rmdir "$CG"; CG=
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    mine=$(sed -n 's/^0:://p' /proc/self/cgroup)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    if [ -f /sys/fs/cgroup/cgroup.controllers ] && mkdir "/sys/fs/cgroup${mine%/}/$name" 2>/dev/null; then
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        CG=/sys/fs/cgroup${mine%/}/$name
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        CG_V=2
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        echo "$bytes" > "$CG/memory.max" 2>/dev/null && return 0
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        rmdir "$CG"; CG=
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    return 1
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_cgroup_oom() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    [ -n "$CG" ] || { echo 0; return; }
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    if [ "$CG_V" = 1 ]; then
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        sed -n 's/^oom_kill \([0-9]*\)$/\1/p' "$CG/memory.oom_control" | grep . || echo 0
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    else
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        sed -n 's/^oom_kill \([0-9]*\)$/\1/p' "$CG/memory.events" | grep . || echo 0
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_cgroup_peak() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    [ -n "$CG" ] || { echo 0; return; }
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    if [ "$CG_V" = 1 ]; then cat "$CG/memory.max_usage_in_bytes"
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    else cat "$CG/memory.peak" 2>/dev/null || echo 0; fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_cgroup_reset_peak() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    [ -n "$CG" ] || return 0
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    if [ "$CG_V" = 1 ]; then echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null; fi
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    return 0
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_drop_cache() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    $K3_PY - "$1" <<'PY'
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
import os, sys
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
for root, _, files in os.walk(sys.argv[1]):
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    for f in files:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        p = os.path.join(root, f)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        try:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            fd = os.open(p, os.O_RDONLY)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        except OSError:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            continue
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        try:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            os.fsync(fd)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        except OSError:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            pass
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        os.close(fd)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
PY
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start

. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
k3_disk_rate() {
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    $K3_PY - "$1" <<'PY'
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
import mmap, os, sys, threading, time
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
part = 4 << 20                  # the expert source's O_DIRECT parts
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
size = min(os.fstat(fd).st_size // part * part, 1 << 30)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
def rate(nth, base):
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  nxt, lock, total = [0], threading.Lock(), [0]
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  def run():
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    buf = mmap.mmap(-1, part)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
    while True:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        with lock:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            off = nxt[0]
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            nxt[0] += part
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        if off >= size:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            return
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        n = os.preadv(fd, [buf], base + off)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
        with lock:
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
            total[0] += max(n, 0)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  t0 = time.perf_counter()
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  th = [threading.Thread(target=run) for _ in range(nth)]
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  for t in th: t.start()
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  for t in th: t.join()
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
  return total[0] / (time.perf_counter() - t0)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
# the best of 8, 16 and 32 readers, each over its own GiB (the disk's queue depth decides)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
full = os.fstat(fd).st_size // part * part
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
print(int(max(rate(n, (i * size) % max(full - size, 1) // part * part)
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
              for i, n in enumerate((8, 16, 32)))))
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
PY
. "$(dirname "${BASH_SOURCE[0]}")/../lib/hub.sh"   # bench_hub_start
}
