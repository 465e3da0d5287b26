#!/usr/bin/env bash
# test_spine_cache.sh — the cached spine through shoald (issues 9, 15):
#   the first `run hf://t/tiny` quantizes the spine tensor by tensor
#   straight into the file shoald hands out (PUT_BEGIN / PUT_COMMIT: no
#   temporary copy), then reads the stored pack into memory; the second
#   reads the cached pack (nothing quantized); both compute the same ids
#   and logits as the local run, in int8 and in int4; a pack whose table
#   is damaged on disk is caught by the load's hash (reported, built and
#   stored again, same logits); `shoal verify` finds and removes either, after
#   which the next run stores it again; `--spine-cache off` neither uses
#   nor stores it; a budget without room (ENOSPC at PUT_BEGIN) does not
#   fail the run.
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] && [ -x "$BIN/shoald" ] && [ -x "$BIN/shoal" ] || skip "shoal-engine/shoald not built"

spine_fixture

run_remote() {   # NAME HOME ARGS...  (int8; RUN_LOCAL=local4 compares with the int4 run)
    local name=$1 home=$2 ref=${RUN_LOCAL:-local}; shift 2
    timeout 120 "$E" run $M --home "$home" --tokens $P --max-tokens 6 --stats \
        --dump-logits "$T/l_$name" "$@" > "$T/o_$name" 2> "$T/e_$name" \
        || { cat "$T/e_$name"; fail "$name: run through shoald ($*)"; }
    cmp -s "$T/o_$ref" "$T/o_$name" \
        || fail "$name: ids '$(cat "$T/o_$name")' differ from the local run's '$(cat "$T/o_$ref")'"
    cmp -s "$T/l_$ref" "$T/l_$name" || fail "$name: logits differ from the local run"
}
spine_line() { grep '^stats: spine ' "$T/e_$1" | tail -n 1; }
derived_bytes() {   # HOME
    "$BIN/shoal" --home "$1" ls --json | /usr/bin/python3 -c \
        'import json,sys; print(sum(m["bytes_by_kind"]["derived"] for m in json.load(sys.stdin)["models"]))'
}

# ---- first run builds the pack into shoald's file, second reads it ----------------------
run_remote first "$H"
spine_line first | grep -q "quantized into a pack at load.*pack stored (written into shoald's file); read into memory" \
    || { cat "$T/e_first"; fail "first run did not build the pack into shoald's file and read it back"; }
ls /var/tmp | grep -q shoal-spine && fail "a temporary spine file was left in /var/tmp"
D=$(sed -n 's/.*stored spine-int8-p2-q2 (\([0-9]*\) bytes).*/\1/p' "$T/shoald.log" | head -n 1)
[ "${D:-0}" -gt 0 ] || fail "shoald did not log the stored pack"
# derived objects: the manifest shoald keeps (stored at OPEN) and the pack
DT=$(derived_bytes "$H")
[ "${DT:-0}" -ge "$D" ] || fail "shoal ls --json shows $DT derived bytes, less than the pack's $D"
echo "ok   first run: $(spine_line first); pack of $D bytes in the cache"

run_remote second "$H"
spine_line second | grep -q 'from the cached pack (nothing quantized).*read into memory' \
    || { cat "$T/e_second"; fail "second run did not read the cached pack"; }
cmp -s "$T/l_first" "$T/l_second" || fail "second run's logits differ from the first run's"
grep -q '^stats: major page faults: [0-9]* while loading, 0 while generating' "$T/e_second" \
    || { grep 'major' "$T/e_second"; fail "the resident spine faulted pages in while generating"; }
echo "ok   second run: $(spine_line second); ids and logits equal the first and the local run"

# ---- the int4 spine: its own pack, the same tokens as the local int4 run -------------------
RUN_LOCAL=local4 run_remote first4 "$H" --spine int4
spine_line first4 | grep -q "spine int4 quantized into a pack at load.*written into shoald's file" \
    || { cat "$T/e_first4"; fail "int4: the first run did not build its pack"; }
RUN_LOCAL=local4 run_remote second4 "$H" --spine int4
spine_line second4 | grep -q 'spine int4 from the cached pack' \
    || { cat "$T/e_second4"; fail "int4: the second run did not read the cached pack"; }
grep -q 'stored spine-int4-g32-p2-q2' "$T/shoald.log" || fail "no spine-int4-g32-p2-q2 in shoald's log"
D4=$(sed -n 's/.*stored spine-int4-g32-p2-q2 (\([0-9]*\) bytes).*/\1/p' "$T/shoald.log" | head -n 1)
echo "ok   int4: pack of $D4 bytes (int8: $D), built then read; tokens equal the local int4 run"

# ---- the protocol's refusals, from a raw client -----------------------------------------
# PUT of a name already stored: EEXIST; content not matching its hash:
# ECORRUPT (nothing stored); GET of an unknown derived name: ENOTFOUND; a
# PUT without its descriptor: EPROTO and the connection closes.
/usr/bin/python3 - "$H/shoald.sock" > "$T/raw.out" 2>&1 <<'PY' || { cat "$T/raw.out"; fail "raw PUT checks"; }
import array, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def msg(t, rid, body, flags=0):
    return b"SHL\x01" + struct.pack("<IHHIQ", len(body), t, flags, 0, rid) + body
def pstr(b):
    return struct.pack("<H", len(b)) + b
def recv():
    fds = array.array("i")
    data, anc, _, _ = s.recvmsg(24, socket.CMSG_SPACE(4))
    for lvl, typ, d in anc:
        fds.frombytes(d[:4])
    if not data:
        return None
    n, t, fl, _, rid = struct.unpack("<IHHIQ", data[4:24])
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    for fd in fds:
        os.close(fd)
    return t, rid, body
def err(body):
    return struct.unpack("<i", body[:4])[0]
s.sendall(msg(1, 0, struct.pack("<H", 1) + pstr(b"raw") + struct.pack("<I", os.getpid())))
assert recv()[0] == 66
s.sendall(msg(2, 1, pstr(b"hf://t/tiny")))
t, _, body = recv()
assert t == 67, t
handle = struct.unpack("<I", body[:4])[0]
fd = os.memfd_create("x")
os.write(fd, b"0123456789" * 100)
def put(rid, name, n, h, flags=1, withfd=True):
    m = msg(13, rid, struct.pack("<I", handle) + pstr(name) + struct.pack("<Q", n) + h, flags)
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if withfd else []
    s.sendmsg([m], anc)
    return recv()
t, rid, body = put(2, b"spine-int8-p2-q2", 1000, b"\0" * 16)
assert t == 65 and err(body) == -14, (t, body)
print("PUT existing name:", body[6:].decode())
t, rid, body = put(3, b"raw-test", 1000, b"\0" * 16)
assert t == 65 and err(body) == -16, (t, body)
print("PUT bad hash:", body[6:].decode())
t, rid, body = put(4, b"raw-test", 2000, b"\0" * 16)
assert t == 65 and err(body) == -3, (t, body)
print("PUT longer than its descriptor:", body[6:].decode())
s.sendall(msg(3, 5, struct.pack("<IBH", handle, 0, 1) + b"\x04" + pstr(b"raw-test")))
t, rid, body = recv()
assert t == 68 and struct.unpack("<i", body[2:6])[0] == -4, (t, body)
print("GET unknown derived name: ENOTFOUND")
t, rid, body = put(6, b"raw-test", 1000, b"\0" * 16, flags=0, withfd=False)
assert t == 65 and err(body) == -8, (t, body)
assert recv() is None
print("PUT without descriptor:", body[6:].decode(), "(closed)")
PY
grep -q 'stored raw-test' "$T/shoald.log" && fail "a PUT with a bad hash was stored"
echo "ok   raw client: $(tr '\n' ';' < "$T/raw.out" | head -c 300)"

# ---- off: neither used nor stored ---------------------------------------------------------
run_remote off "$H" --spine-cache off
spine_line off | grep -q 'quantized in memory in [0-9.]* ms$' \
    || { cat "$T/e_off"; fail "--spine-cache off: $(spine_line off)"; }
echo "ok   --spine-cache off quantizes and stores nothing"

# ---- a pack damaged on disk -----------------------------------------------------------------
blob=$(find "$H/blobs" -type f -size "${D}c" | head -n 1)
[ -n "$blob" ] || fail "no blob of $D bytes in $H/blobs"
# the table: the load's hash catches it before the parse (docs/engine.md "Checked reads"):
# reported, removed by shoald, built and stored again
printf '\x5a\x5a\x5a\x5a' | dd of="$blob" bs=1 seek=80 conv=notrunc status=none
run_remote damaged "$H"
grep -q "cached spine pack spine-int8-p2-q2 read back damaged" "$T/e_damaged" \
    || { cat "$T/e_damaged"; fail "the engine did not catch the damaged pack"; }
spine_line damaged | grep -q 'quantized into a pack at load.*pack stored' \
    || { cat "$T/e_damaged"; fail "the damaged pack was not built and stored again: $(spine_line damaged)"; }
run_remote reread "$H"
spine_line reread | grep -q 'from the cached pack' \
    || { cat "$T/e_reread"; fail "the re-stored pack is not read"; }
echo "ok   damaged table: caught by the load's hash, reported, stored again; the next run reads it"
# the data: `shoal verify` finds it too (and removes it) without an engine
blob=$(find "$H/blobs" -type f -size "${D}c" | head -n 1)
printf '\x5a\x5a\x5a\x5a' | dd of="$blob" bs=1 seek=$((D / 2)) conv=notrunc status=none
rc=0; "$BIN/shoal" --home "$H" verify > "$T/verify2.out" 2>&1 || rc=$?
[ $rc = 5 ] || { cat "$T/verify2.out"; fail "shoal verify did not report damaged pack data (exit $rc)"; }
run_remote restored2 "$H"
spine_line restored2 | grep -q 'pack stored' || { cat "$T/e_restored2"; fail "pack not stored again after verify"; }
echo "ok   damaged data: shoal verify removed it, the next run stored the pack again"

# ---- a budget with no room for the pack: ENOSPC, the run goes on -------------------------------
# the spine (pinned) fits; spine + pack does not
S=$("$BIN/shoal" --home "$H" ls --json | /usr/bin/python3 -c \
    'import json,sys; print(json.load(sys.stdin)["models"][0]["coverage"]["spine_bytes"])')
H2=$T/home2
mkdir -p "$H2"
bg shoald2 "$BIN/shoald" --home "$H2" --no-fsync --max-size $((S + D * 9 / 10)) --log "$T/shoald2.log"
wait_line "$T/shoald2.log" 'ready on' 20 || fail "shoald (small budget) did not start"
run_remote nospace "$H2"
grep -q 'could not store the spine pack' "$T/e_nospace" \
    || { cat "$T/e_nospace"; fail "ENOSPC for the PUT was not reported as a warning"; }
spine_line nospace | grep -q 'quantized into a pack at load in [0-9.]* ms; read into memory' \
    || { cat "$T/e_nospace"; fail "nospace: $(spine_line nospace)"; }
grep -q 'stored spine-int8' "$T/shoald2.log" && fail "a pack was stored over the budget"
echo "ok   budget without room: $(grep -o 'could not store[^;]*' "$T/e_nospace" | head -c 120); run succeeded"
