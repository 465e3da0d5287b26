#!/usr/bin/env bash
# shoald's home, budget and leftovers (issue 18 items 4 and 5, and `shoal gc`
# when shoald dies mid-request), with the real binaries:
#   - a home left 0755 with 0644 files becomes 0700 / 0600 at start; one
#     writable by others, or owned by another user, is refused naming why;
#   - a lock held by a process whose pid is not the one written, or a lock
#     file of another user: the error names that, not a running shoald;
#   - a default budget of 0 (a 30 MB filesystem) and a budget below the
#     pinned objects cached are start-up errors with the figures;
#   - a PUT killed with shoald leaves a partial in tmp/; the next start
#     removes it;
#   - `shoal gc` against a shoald that answers HELLO and then dies exits 1
#     saying so (3 is for a shoald never reached).
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] && [ -x "$BIN/shoal" ] || skip "binaries not built"
PY=/usr/bin/python3

"$BIN/mkmodel" --preset tiny --seed 4 --out "$T/m" --quiet || fail "mkmodel"
H=$T/home
C="$BIN/shoalc --home $H"

refused() {   # refused WHAT REGEX [ARGS...]: shoald must not start, saying REGEX
    local what=$1 re=$2 rc=0
    shift 2
    timeout 20 "$BIN/shoald" --home "$H" --no-fsync "$@" > "$T/refused.out" 2>&1 || rc=$?
    [ $rc != 0 ] || fail "$what: shoald started"
    refused_rc=$rc
    grep -qE "$re" "$T/refused.out" || { cat "$T/refused.out"; fail "$what: the error does not say /$re/"; }
    echo "ok   $what refused (exit $rc): $(cut -c1-160 "$T/refused.out" | head -n 1)"
}

# ---- permissions -----------------------------------------------------------------------
start_daemon
$C get "$T/m" 1:0 1:1 f:config.json --check "$T/m" > /dev/null || fail "GET"
stop_daemon
chmod 755 "$H" "$H/blobs" "$H/tmp"
find "$H" -type f -exec chmod 644 {} +
start_daemon
[ "$(stat -c %a "$H")" = 700 ] || fail "home is $(stat -c %a "$H"), not 700"
[ "$(stat -c %a "$H/index.db")" = 600 ] || fail "index.db is $(stat -c %a "$H/index.db")"
open=$(find "$H" \( -type f -perm /077 \) -o \( -type d -perm /077 \) | head -n 3)
[ -z "$open" ] || fail "still readable by others: $open"
$C get "$T/m" 1:0 --check "$T/m" > /dev/null || fail "GET after the home was made private"
stop_daemon
echo "ok   a 0755 home with 0644 files made 0700 / 0600"

chmod 777 "$H"
refused "a home writable by others" 'writable by others.*chmod 700'
[ "$refused_rc" = 1 ] || fail "a home writable by others exited $refused_rc, not 1"
chmod 700 "$H"

# a lock held by something that is not the pid written in it
$PY - "$H/lock" > "$T/locker.out" 2>&1 <<'EOF' &
import fcntl, sys, time
f = open(sys.argv[1], "r+")
f.seek(0); f.truncate(); f.write("999999\n"); f.flush()
fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(30)
EOF
locker=$!
wait_line "$T/locker.out" '^locked' 10 || fail "the locker did not start"
refused "a lock held by another process" 'fuser -v .*lock'
grep -q 'another shoald is running' "$T/refused.out" && fail "blamed a running shoald"
kill "$locker"; wait "$locker" 2>/dev/null

if [ "$(id -u)" = 0 ]; then
    chown 65534 "$H/lock"
    refused "a lock file of another user" 'lock .* belongs to uid 65534'
    chown 0 "$H/lock"
    mkdir "$T/theirs" && chown 65534 "$T/theirs"
    timeout 20 "$BIN/shoald" --home "$T/theirs" --no-fsync > "$T/refused.out" 2>&1 \
        && fail "a home of another user was accepted"
    grep -q 'belongs to uid 65534, not to you' "$T/refused.out" || { cat "$T/refused.out"; fail "other owner: unclear"; }
    echo "ok   a home and a lock of another user refused"
else
    echo "skip the other-user cases: not root"
fi

# ---- budget ----------------------------------------------------------------------------
refused "a budget below the pinned objects" 'below the .* pinned objects' --max-size 1K
[ -f "$H/shoald.conf" ] && grep -q '1K' "$H/shoald.conf" && fail "the refused budget was saved"
mkdir -p "$T/small"
if mount -t tmpfs -o size=30m tmpfs "$T/small" 2> /dev/null; then
    rc=0
    timeout 20 "$BIN/shoald" --home "$T/small/h" --no-fsync > "$T/zero.out" 2>&1 || rc=$?
    umount "$T/small"
    [ $rc = 8 ] || { cat "$T/zero.out"; fail "a budget of 0 exited $rc, not 8"; }
    grep -q 'the default budget is 0: .* free' "$T/zero.out" || { cat "$T/zero.out"; fail "budget 0: unclear"; }
    echo "ok   a default budget of 0 refused: $(cut -c1-140 "$T/zero.out")"
else
    echo "skip the 30 MB filesystem: cannot mount a tmpfs here"
fi

# ---- a killed PUT's partial ------------------------------------------------------------
start_daemon
truncate -s 2G "$T/big"
for try in 1 2 3; do   # the PUT's partial must exist when shoald is killed
    $C put "$T/m" pack-big$try "$T/big" > "$T/put.out" 2>&1 &
    put=$!
    for _ in $(seq 100); do
        [ -n "$(ls -A "$H/tmp")" ] && break
        kill -0 $put 2> /dev/null || break
        sleep 0.1
    done
    [ -n "$(ls -A "$H/tmp")" ] && break
    wait $put
done
[ -n "$(ls -A "$H/tmp")" ] || { cat "$T/put.out"; fail "three PUTs left nothing in tmp/ to test with"; }
kill -KILL "$PID_shoald"
wait "$PID_shoald" 2>/dev/null
wait $put 2>/dev/null
[ -n "$(ls -A "$H/tmp")" ] || fail "tmp/ empty right after SIGKILL"
start_daemon
[ -z "$(ls -A "$H/tmp")" ] || fail "tmp/ still holds $(ls "$H/tmp") after the restart"
grep -q 'repair removed [1-9][0-9]* tmp' "$LOG" || fail "the removal is not counted in the log"
stop_daemon
echo "ok   a killed PUT's partial removed at the next start"

# ---- shoal gc when shoald dies mid-request ---------------------------------------------
G=$T/fake
mkdir -m 700 "$G"
$PY - "$G/shoald.sock" > "$T/fake.out" 2>&1 <<'EOF' &
import os, socket, struct, sys
MAGIC = b"SHL\x01"
def frame(t, body, rid, flags=2):
    return MAGIC + struct.pack("<IHHIQ", len(body), t, flags, 0, rid) + body
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1]); srv.listen(1)
print("listening", flush=True)
c, _ = srv.accept()
data = b""
while len(data) < 24 or len(data) < 24 + struct.unpack_from("<I", data, 4)[0]:
    data += c.recv(4096)
rid = struct.unpack_from("<Q", data, 16)[0]
asked = struct.unpack_from("<H", data, 24)[0]   # speak the client's version
ver = b"fake"
c.sendall(frame(66, struct.pack("<H", asked) + struct.pack("<H", len(ver)) + ver
                + struct.pack("<QI", 1, 1 << 20), rid))
c.recv(4096)      # the GC request: die without an answer
c.close()
EOF
fake=$!
wait_line "$T/fake.out" '^listening' 10 || fail "the fake shoald did not start"
rc=0
timeout 20 "$BIN/shoal" --home "$G" gc > "$T/gc.out" 2>&1 || rc=$?
wait $fake 2>/dev/null
[ $rc = 1 ] || { cat "$T/gc.out"; fail "shoal gc exited $rc when shoald died mid-request (want 1)"; }
grep -q 'went away during the GC' "$T/gc.out" || { cat "$T/gc.out"; fail "gc: unclear message"; }
echo "ok   shoal gc: shoald died mid-request: exit 1, $(head -n 1 "$T/gc.out" | cut -c1-120)"
echo "cache bounds: ok"
