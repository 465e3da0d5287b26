#!/usr/bin/env bash
# shoald basics with real processes (hubmock + shoald + shoalc):
#   a cold GET is a miss, a later one a hit, bytes identical to the shard;
#   socket mode 0600; a second daemon on the same home is refused; a stale
#   socket is replaced; malformed frames get ERROR and a close while others
#   are served; a client leaving mid-batch loses its prefetches only;
#   SIGHUP reopens the log; SIGTERM exits 0; --detach writes a pid file.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
H=$T/home
M=hf://t/tiny
export HF_ENDPOINT=$HUB

summary() { grep '^hits ' "$1"; }
field() { summary "$1" | awk -v k="$2" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }

# ---- a miss, then a hit, bytes checked -------------------------------------------
start_daemon --parallel 4
[ "$(stat -c %a "$H/shoald.sock")" = 600 ] || fail "socket mode is $(stat -c %a "$H/shoald.sock"), not 600"
KEYS="1:0 1:63 4:17 7:5 t:model.embed_tokens.weight f:config.json"
"$BIN/shoalc" --home "$H" get $M $KEYS --check "$T/m" > "$T/get1" || { cat "$T/get1"; fail "first GET"; }
[ "$(field "$T/get1" misses)" = 6 ] && [ "$(field "$T/get1" checked)" = 6 ] \
    || fail "first GET should be 6 misses, all checked: $(summary "$T/get1")"
"$BIN/shoalc" --home "$H" get $M $KEYS --check "$T/m" > "$T/get2" || fail "second GET"
[ "$(field "$T/get2" hits)" = 6 ] && [ "$(field "$T/get2" mismatched)" = 0 ] \
    || fail "second GET should be 6 hits: $(summary "$T/get2")"
# An unknown expert is an error for that key only.
"$BIN/shoalc" --home "$H" get $M 1:0 1:999 > "$T/get3" && fail "a missing expert should fail"
grep -q '1:999 error ENOTFOUND' "$T/get3" && grep -q '1:0 hit' "$T/get3" \
    || { cat "$T/get3"; fail "per-key error"; }

# An unknown repo or directory: OPEN fails with a message naming it.
"$BIN/shoalc" --home "$H" get hf://t/nope 1:0 > "$T/nope" 2>&1 && fail "OPEN of a missing repo"
grep -q 't/nope' "$T/nope" || fail "OPEN error does not name the repo: $(cat "$T/nope")"
"$BIN/shoalc" --home "$H" get "$T/no-such-dir" 1:0 > "$T/nodir" 2>&1 && fail "OPEN of a missing dir"
grep -q 'no-such-dir' "$T/nodir" || fail "OPEN error does not name the dir: $(cat "$T/nodir")"

# ---- a second daemon is refused ----------------------------------------------------
if "$BIN/shoald" --home "$H" --no-fsync > "$T/second.out" 2>&1; then
    fail "a second shoald on the same home started"
fi
grep -qi 'another shoald' "$T/second.out" || { cat "$T/second.out"; fail "second daemon: unclear message"; }

# ---- malformed frames: ERROR and close; the daemon serves on ------------------------
/usr/bin/python3 - "$H/shoald.sock" > "$T/fuzz.out" 2>&1 <<'EOF' || { cat "$T/fuzz.out"; fail "malformed frames"; }
import socket, struct, sys
path = sys.argv[1]
MAGIC = b"SHL\x01"
def frame(t, body=b"", rid=0, flags=0, magic=MAGIC, length=None, reserved=0):
    n = len(body) if length is None else length
    return magic + struct.pack("<IHHIQ", n, t, flags, reserved, rid) + body
def hello():
    name = b"pytest"
    return frame(1, struct.pack("<H", 1) + struct.pack("<H", len(name)) + name + struct.pack("<I", 1))
def talk(data, expect_code):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    s.sendall(data)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    # find the ERROR frame (type 65) and its code
    pos = 0
    while pos + 24 <= len(got):
        n, t = struct.unpack_from("<IH", got, pos + 4)
        if t == 65:
            code = struct.unpack_from("<i", got, pos + 24)[0]
            assert code == expect_code, (data[:40], code, expect_code)
            return
        pos += 24 + n
    raise AssertionError("no ERROR reply for %r" % data[:40])
EPROTO, ETOOBIG, EUNSUPPORTED = -8, -11, -17
talk(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 40, EPROTO)                    # bad magic
talk(frame(1, length=(1 << 20) + 1), ETOOBIG)                          # oversized
talk(hello() + frame(200, rid=5), EPROTO)                              # unknown type
talk(frame(7, struct.pack("<H", 2) + b"{}", rid=3), EPROTO)            # STATS before HELLO
talk(hello() + frame(3, b"\x01\x00", rid=9), EPROTO)                   # truncated GET
talk(hello() + frame(12, struct.pack("<I", 1) + b"junk", rid=4), EPROTO)   # trailing bytes
talk(hello() + frame(7, struct.pack("<H", 2) + b"{}", rid=0), EPROTO)  # request id 0
talk(hello() + frame(64, rid=4), EPROTO)                               # a reply type
talk(hello() + frame(7, struct.pack("<H", 2) + b"{}", rid=3, reserved=7), EPROTO)
v5 = frame(1, struct.pack("<H", 5) + struct.pack("<H", 1) + b"x" + struct.pack("<I", 1))
talk(v5, EUNSUPPORTED)                                                 # a version it does not speak (4 is)
print("malformed frames: all refused")
EOF
"$BIN/shoalc" --home "$H" get $M 1:0 --check "$T/m" > "$T/get4" || fail "daemon stopped serving after malformed frames"
grep -c 'closing the connection' "$LOG" | grep -qE '^([1-9][0-9]+|[5-9])$' \
    || fail "the daemon did not log the refused connections"

# ---- a client leaving mid-batch: its prefetches go, others' transfers stay -----------
curl -fsS -X POST "$HUB/_mock/faults?rate_stall=1&stall_secs=1&stall_at=before" > /dev/null
before=$(grep -c '"port":"cdn"' "$T/hub.jsonl" || true)
ALL=$(for l in 2 3; do for e in $(seq 0 63); do printf '%s:%s ' $l $e; done; done)
"$BIN/shoalc" --home "$H" get $M $ALL --prefetch --disconnect-after 1 > "$T/leave" 2>&1 || true
sleep 3
after=$(grep -c '"port":"cdn"' "$T/hub.jsonl" || true)
started=$((after - before))
# 128 prefetches asked; at most parallel + headroom can have started.
[ "$started" -le 12 ] || fail "$started transfers ran for a client that left (prefetches not dropped)"
# CANCEL of a prefetch GET: its keys not yet answered come back ECANCELED,
# every key is answered exactly once, and the connection goes on.
L4=$(for e in $(seq 0 63); do printf '4:%s ' $e; done)
"$BIN/shoalc" --home "$H" get $M $L4 --prefetch --cancel > "$T/cancel" 2>&1
n_items=$(grep -c '^item ' "$T/cancel")
n_cancel=$(grep -c 'error ECANCELED' "$T/cancel")
[ "$n_items" = 64 ] && [ "$n_cancel" -ge 48 ] || fail "CANCEL: $n_items items, $n_cancel cancelled"
curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
"$BIN/shoalc" --home "$H" get $M $ALL --check "$T/m" --quiet > "$T/get5" || fail "GET after a client left"
[ "$(field "$T/get5" checked)" = 128 ] && [ "$(field "$T/get5" errors)" = 0 ] || fail "after leave: $(summary "$T/get5")"

# ---- STATS adds up; SIGHUP reopens the log ---------------------------------------------
"$BIN/shoalc" --home "$H" stats > "$T/stats.json" || fail "STATS"
/usr/bin/python3 - "$T/stats.json" <<'EOF' || fail "STATS document"
import json, sys
s = json.load(open(sys.argv[1]))
d = s["tiers"]["disk"]
assert d["hits"] + d["misses"] + d["joins"] >= 6 + 6 + 2 + 1 + 128, d
assert s["disk"]["used"] > 0 and s["disk"]["objects"] > 0
assert s["schema"] == "shoal.stats" and s["source"] == "daemon", s["schema"]
assert s["bytes"]["served"] > 0 and s["bytes"]["fetched"] > 0
assert any(m["repo"] == "t/tiny" for m in s["models"]), s["models"]
assert any(l["layer"] == 2 for l in s["layers"]), s["layers"]
assert len(s["sessions"]) >= 3
dm = s["daemon"]
assert dm["clients"] == 1 and dm["pid"] > 0 and dm["scheduler"]["parallel"] == 4, dm
# misses of the client that left were dropped before any transfer
assert 0 < dm["upstream"]["completed"] <= d["misses"], (dm["upstream"], d)
EOF
# REPORT adds the engine's RAM tier; a bad REPORT is an error, not a disconnect.
"$BIN/shoalc" --home "$H" report '{"tier":"ram","hits":5,"misses":2,"bytes":1000}' || fail "REPORT"
"$BIN/shoalc" --home "$H" report '{"tier":"gpu","hits":1}' 2> "$T/badreport" && fail "a bad REPORT was accepted"
grep -q 'tier' "$T/badreport" || fail "bad REPORT: $(cat "$T/badreport")"
"$BIN/shoalc" --home "$H" stats > "$T/stats2.json" || fail "STATS after REPORT"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["tiers"]["ram"]
assert r["hits"] == 5 and r["misses"] == 2 and r["bytes_out"] == 1000, r' "$T/stats2.json" || fail "RAM tier"

# WARM top N by heat: the hottest experts asked for above.
"$BIN/shoalc" --home "$H" warm $M top:3 --wait > "$T/top" || fail "WARM top: $(cat "$T/top")"
grep -q 'objects 3/3 ' "$T/top" || fail "WARM top: $(cat "$T/top")"

# GC down to 100 KiB evicts unpinned objects; what was evicted is a miss again.
"$BIN/shoalc" --home "$H" gc 100K > "$T/gc.json" || fail "GC"
/usr/bin/python3 -c '
import json, sys
g = json.load(open(sys.argv[1]))
assert g["schema"] == "shoal.gc" and g["freed"] > 0 and g["objects_evicted"] > 0, g' "$T/gc.json" \
    || fail "GC: $(cat "$T/gc.json")"
"$BIN/shoalc" --home "$H" get $M 2:0 2:1 2:2 --check "$T/m" > "$T/get6" || fail "GET after GC"
grep -q '^hits 0 misses 3 ' "$T/get6" || fail "after GC: $(tail -1 "$T/get6")"

mv "$LOG" "$LOG.rotated"
kill -HUP "$PID_shoald"
wait_line "$LOG" 'log reopened' 10 || fail "SIGHUP did not reopen the log"
stop_daemon

# ---- a stale socket (daemon killed) is replaced ------------------------------------------
start_daemon
kill -KILL "$PID_shoald"; wait "$PID_shoald" 2>/dev/null
[ -S "$H/shoald.sock" ] || fail "expected a stale socket after SIGKILL"
start_daemon
grep -q 'replacing stale socket' "$LOG" || fail "stale socket not detected"
"$BIN/shoalc" --home "$H" get $M 1:0 > /dev/null || fail "GET after a stale socket"
stop_daemon
[ ! -e "$H/shoald.sock" ] || fail "socket left behind after SIGTERM"

# ---- --detach with a pid file; a helpful message when nothing runs -----------------------
"$BIN/shoald" --home "$H" --no-fsync --detach || fail "--detach"
pid=$(cat "$H/shoald.pid") || fail "no pid file"
_pids+=("$pid")
"$BIN/shoalc" --home "$H" stats > /dev/null || fail "detached daemon does not answer"
kill -TERM "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "detached daemon ignored SIGTERM"
[ ! -e "$H/shoald.pid" ] || fail "pid file left behind"
"$BIN/shoalc" --home "$H" stats > "$T/none.out" 2>&1 && fail "stats with no daemon succeeded"
grep -q 'start it with' "$T/none.out" || { cat "$T/none.out"; fail "no hint to start shoald"; }
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null \
    || fail "sanitizer reports in the daemon's log"
echo "ok"
