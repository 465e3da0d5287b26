#!/usr/bin/env bash
# test: serial  (the pinger's answer-time bound wants the machine to itself)
# Serving objects of the Hugging Face cache in place (docs/fetcher.md, "The
# Hugging Face cache"; daemon/peer.c):
#   - a GET of 48 keys of one 256 MiB object of a verified HF cache blob: a
#     worker reads and hashes it once (the other keys join), the bytes and
#     the XXH3-128 sent are right, a pinger's STATS are answered meanwhile
#     (the loop never hashes); a second GET is answered from the memo
#     without reading;
#   - `shoal warm --dry-run` of a model whose files are all in the HF cache:
#     0 to fetch, the HF cache figure, not refused under a budget smaller
#     than the model; the warm fetches nothing;
#   - a blob rewritten after OPEN (bytes and mtime changed; or the mtime set
#     back by hand) is never served: its objects come from the Hub (right
#     bytes, the engine's output equal to a local run), the file is
#     dropped, the others still read in place;
#   - an object an engine REPORTs damaged drops its blob the same way;
#   - HOME/hfcache-verified.txt is pruned: lines of removed or changed
#     blobs leave it, and it keeps at most 4,096 lines (the newest).
source "$(dirname "$0")/lib.sh"
for b in shoald shoalc shoal hubmock mkmodel shoal-engine; do
    [ -x "$BIN/$b" ] || skip "$b not built"
done
LIMIT_MS=1000
[ -n "${SHOAL_ASAN:-}" ] && LIMIT_MS=2500
BIG=$((256 << 20))
NKEYS=48

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
# t/big: another tiny (no etag shared with t/tiny) and a 256 MiB
# tokenizer.json (an optional small file: one object)
"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/big" --quiet || fail "mkmodel big"
head -c $BIG /dev/urandom > "$T/big/tokenizer.json"
start_hubmock --repo t/tiny="$T/m" --repo t/big="$T/big" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
commit() { curl -s "$HUB/_mock/repo?repo=$1" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["refs"]["main"])'; }
HFC=$T/hf/hub
/usr/bin/python3 "$ROOT/tests/integration/hfcache_layout.py" "$T/m" "$HFC" t/tiny "$(commit t/tiny)" > "$T/tiny.etags" || fail "layout tiny"
/usr/bin/python3 "$ROOT/tests/integration/hfcache_layout.py" "$T/big" "$HFC" t/big "$(commit t/big)" > "$T/big.etags" || fail "layout big"
export HF_HUB_CACHE=$HFC
summary() { grep '^hits ' "$1"; }
stats() { "$BIN/shoalc" --home "$H" stats > "$T/stats.json" || fail "STATS"; }
hf() {   # hf FIELD: daemon.hfcache.FIELD of the last stats
    /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["daemon"]["hfcache"][sys.argv[2]])' "$T/stats.json" "$1"
}

# ---- warm --dry-run: everything in the HF cache, nothing to fetch, fits any budget ------
H=$T/homed
start_daemon --max-size 4M
"$BIN/shoal" --home "$H" warm hf://t/tiny --dry-run > "$T/plan.out" 2>&1 || { cat "$T/plan.out"; fail "warm --dry-run (all in the HF cache, budget 4 MiB) was refused"; }
grep -qE '^  to fetch +0 objects +0 B' "$T/plan.out" || { cat "$T/plan.out"; fail "the plan lists HF cache objects as to fetch"; }
sel=$(sed -n 's/^  selected  *\([0-9,]*\) objects.*/\1/p' "$T/plan.out" | tr -d ,)
hfc=$(sed -n 's/^  in the Hugging Face cache  *\([0-9,]*\) objects.*read in place.*/\1/p' "$T/plan.out" | tr -d ,)
[ -n "$sel" ] && [ "$sel" -gt 600 ] && [ "$hfc" = "$sel" ] || { cat "$T/plan.out"; fail "plan: $sel selected, $hfc in the HF cache"; }
: > "$T/hub.jsonl"
"$BIN/shoal" --home "$H" warm hf://t/tiny --wait > "$T/warm.out" 2>&1 || { cat "$T/warm.out"; fail "warm (all in the HF cache)"; }
/usr/bin/python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert all(x["method"] == "HEAD" for x in r), r[:3]' "$T/hub.jsonl" || fail "a warm of HF cache objects fetched bytes"
stats   # the job's plan kept with it says the same
/usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["daemon"]["jobs"][0]["plan"]
assert p["hfcache_objects"] == int(sys.argv[2]) and p["fetch_objects"] == 0, p' "$T/stats.json" "$hfc" \
    || fail "the job's plan does not count the HF cache objects: $(cat "$T/stats.json")"
stop_daemon
echo "ok   warm --dry-run: $hfc objects in the HF cache, 0 to fetch, not refused under a 4 MiB budget; the warm fetched nothing"

# ---- GET: hashed once on a worker, the loop answers a pinger meanwhile -----------------------
H=$T/home
start_daemon
C="$BIN/shoalc --home $H"
$C open hf://t/big > "$T/open.out" 2>&1 || { cat "$T/open.out"; fail "OPEN t/big"; }
grep -q 'files are read in place from the Hugging Face cache' "$LOG" || fail "t/big is not read from the HF cache"
bg ping $C ping --interval 20
wait_line "$T/ping.log" '^ping ready' 10 || fail "pinger did not start"
KEYS=$(for i in $(seq $NKEYS); do printf 'f:tokenizer.json '; done)
t0=$(date +%s%N)
$C get hf://t/big $KEYS -q > "$T/get1.out" || { cat "$T/get1.out"; fail "GET of a 256 MiB HF cache object"; }
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
sleep 0.2
kill -TERM "$PID_ping"; wait "$PID_ping" || fail "pinger: $(cat "$T/ping.log")"
line=$(grep '^pings ' "$T/ping.log") || fail "the pinger printed nothing"
max=$(echo "$line" | awk '{print $8}')
summary "$T/get1.out" | grep -q "^hits $NKEYS .*errors 0 " \
    || fail "GET of the HF cache object: $(summary "$T/get1.out")"
awk -v m="$max" -v l="$LIMIT_MS" 'BEGIN { exit !(m <= l) }' \
    || fail "a STATS answer took $max ms while a peer object was hashed (bound $LIMIT_MS): $line"
stats
[ "$(hf hashed_bytes)" = $BIG ] && [ "$(hf hash_jobs)" = 1 ] && [ "$(hf joins)" = $((NKEYS - 1)) ] \
    || fail "$NKEYS keys of one object: hashed $(hf hashed_bytes) bytes in $(hf hash_jobs) jobs, $(hf joins) joins"
echo "ok   $NKEYS keys of a 256 MiB HF cache object: one hash on a worker, $ms ms; pinger during it: $line"
$C get hf://t/big f:tokenizer.json f:config.json t:model.embed_tokens.weight --check "$T/big" -q > "$T/get2.out" || fail "second GET"
$C get hf://t/big f:tokenizer.json f:config.json t:model.embed_tokens.weight --check "$T/big" -q > "$T/get3.out" || fail "third GET"
summary "$T/get2.out" | grep -q '^hits 3 .*checked 3 mismatched 0' || fail "GET hashed on a worker: $(summary "$T/get2.out")"
summary "$T/get3.out" | grep -q '^hits 3 .*checked 3 mismatched 0' || fail "GET from the memo: $(summary "$T/get3.out")"
stats
# the second GET hashed only the two small objects (on a worker); the third read
# nothing; every item's bytes and XXH3-128 are the model's (--check)
[ "$(hf hashed_bytes)" -lt $((BIG + (2 << 20))) ] && [ "$(hf hash_jobs)" = 3 ] && [ "$(hf memo_hits)" = 4 ] \
    || fail "later GETs read again: hashed $(hf hashed_bytes) bytes in $(hf hash_jobs) jobs, $(hf memo_hits) from the memo"
verified=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["daemon"]["integrity"]["peer_verified_bytes"])' "$T/stats.json")
[ "$verified" -ge $((BIG * (NKEYS + 2))) ] || fail "peer bytes served, verified: $verified"
"$BIN/shoal" --home "$H" stats > "$T/stats.txt" || fail "shoal stats"
grep -qE '^  served from the HF cache +[0-9.]+ [KMG]iB +\(blobs hashed to their etag\)' "$T/stats.txt" \
    || { cat "$T/stats.txt"; fail "shoal stats does not show the bytes served from the HF cache"; }
echo "ok   later GETs answered from the memo ($(hf memo_entries) hashes, $(hf memo_bytes) bytes), no byte read again"

# ---- a blob rewritten after OPEN is not served ------------------------------------------------
K1="1:0 1:5 1:9"   # in model-00001-of-000003.safetensors
$C get hf://t/tiny 1:0 t:model.embed_tokens.weight --check "$T/m" > "$T/t1.out" || fail "GET t/tiny"
summary "$T/t1.out" | grep -q '^hits 2 .*mismatched 0' || fail "t/tiny from the HF cache: $(summary "$T/t1.out")"
E1=$(awk '$1 == "model-00001-of-000003.safetensors" {print $2}' "$T/tiny.etags")
B1=$HFC/models--t--tiny/blobs/$E1
/usr/bin/python3 - "$B1" <<'PY' || fail "rewriting the blob"
import os, struct, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0] + 8
    f.seek(n)
    data = f.read()
    f.seek(n)
    f.write(bytes((b + 1) & 255 for b in data))
st = os.stat(p)
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
PY
: > "$T/hub.jsonl"
$C get hf://t/tiny $K1 t:model.embed_tokens.weight --check "$T/m" > "$T/t2.out" || { cat "$T/t2.out"; fail "GET after the blob changed"; }
summary "$T/t2.out" | grep -q '^hits 1 misses 3 .*errors 0 .*checked 4 mismatched 0' \
    || { cat "$T/t2.out"; fail "a changed blob: $(summary "$T/t2.out")"; }
grep -q "model-00001-of-000003.safetensors: it changed since it was verified" "$LOG" || fail "shoald does not say the blob changed"
grep -q '"port":"cdn"' "$T/hub.jsonl" || fail "the changed blob's objects were not fetched from the Hub"
stats
[ "$(hf files_dropped)" = 1 ] || fail "files dropped: $(hf files_dropped)"
P=7,100,300,5,9,42,11,12,13,700,1
"$BIN/shoal-engine" run "$T/m" --tokens $P --max-tokens 4 > "$T/o_local" || fail "local run"
"$BIN/shoal-engine" run hf://t/tiny --home "$H" --tokens $P --max-tokens 4 > "$T/o_peer" 2> "$T/e_peer" \
    || { cat "$T/e_peer"; fail "engine after the blob changed"; }
cmp -s "$T/o_local" "$T/o_peer" || fail "engine output after the HF cache blob changed differs from the local run"
echo "ok   a blob rewritten after OPEN: not served; its objects fetched from the Hub (right bytes, engine = local run)"
# the same with the mtime set back by hand: the ctime still moves
E2=$(awk '$1 == "model-00002-of-000003.safetensors" {print $2}' "$T/tiny.etags")
B2=$HFC/models--t--tiny/blobs/$E2
sleep 1.1   # the ctime is compared in seconds
/usr/bin/python3 - "$B2" <<'PY' || fail "rewriting the blob"
import os, struct, sys
p = sys.argv[1]
st = os.stat(p)
with open(p, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0] + 8
    f.seek(n)
    data = f.read()
    f.seek(n)
    f.write(bytes((b + 1) & 255 for b in data))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
assert os.stat(p).st_mtime_ns == st.st_mtime_ns and os.stat(p).st_size == st.st_size
PY
$C get hf://t/tiny 5:0 6:2 --check "$T/m" > "$T/t4.out" || { cat "$T/t4.out"; fail "GET after the blob changed (mtime kept)"; }
summary "$T/t4.out" | grep -q '^hits 0 misses 2 .*errors 0 .*checked 2 mismatched 0' \
    || { cat "$T/t4.out"; fail "a blob changed with its mtime set back: $(summary "$T/t4.out")"; }
stats
[ "$(hf files_dropped)" = 2 ] || fail "files dropped: $(hf files_dropped)"
echo "ok   a blob rewritten with its mtime set back: not served either (the ctime moved)"
# what no stat shows (a bit flipped on disk), the engine's checked read does:
# an object it REPORTs damaged drops the blob it was read from
$C get hf://t/big 2:1 --check "$T/big" > "$T/r1.out" || fail "GET t/big 2:1"
grep -q '2:1 hit' "$T/r1.out" || fail "t/big 2:1 is not read in place: $(cat "$T/r1.out")"
/usr/bin/python3 "$ROOT/tests/integration/hfcache_report.py" "$H/shoald.sock" hf://t/big 2 1 > "$T/report.out" 2>&1 \
    || fail "REPORT damaged: $(cat "$T/report.out")"
$C get hf://t/big 2:1 2:2 --check "$T/big" > "$T/r2.out" || fail "GET after REPORT damaged"
summary "$T/r2.out" | grep -q '^hits 0 misses 2 .*mismatched 0' || fail "after REPORT damaged: $(summary "$T/r2.out")"
grep -q "do not match their checksum; no longer read in place" "$LOG" || fail "shoald does not say why it dropped the blob"
stats
[ "$(hf files_dropped)" = 3 ] || fail "files dropped: $(hf files_dropped)"
echo "ok   an object REPORTed damaged: its blob no longer read in place, fetched from the Hub"

# ---- the memo is pruned, and bounded ----------------------------------------------------------
stop_daemon
MEMO=$H/hfcache-verified.txt
[ "$(wc -l < "$MEMO")" = 15 ] || fail "memo: $(wc -l < "$MEMO") lines for the 15 blobs verified"
EB=$(awk '$1 == "tokenizer.json" {print $2}' "$T/big.etags")
grep -q "^$EB " "$MEMO" || fail "the memo does not hold the big blob"
rm "$HFC/models--t--big/blobs/$EB" "$HFC/models--t--big/snapshots/$(commit t/big)/tokenizer.json"
# 4,100 older lines of blobs that exist (the bound keeps the newest 4,096)
/usr/bin/python3 - "$T/fake" "$MEMO" <<'PY' || fail "fake memo lines"
import hashlib, os, sys
d, memo = sys.argv[1:]
os.makedirs(d)
lines = []
for i in range(4100):
    e = hashlib.sha1(b"%d" % i).hexdigest()
    p = os.path.join(d, e)
    open(p, "wb").write(b"x")
    st = os.stat(p)
    lines.append("%s %d %d.%09d %d c%d %s\n" % (e, st.st_size, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9, st.st_ino, int(st.st_ctime), p))
old = open(memo).read()
open(memo, "w").write("".join(lines) + old)
PY
start_daemon
$C get hf://t/tiny 1:0 2:3 --check "$T/m" > "$T/t3.out" || fail "GET after restart"
summary "$T/t3.out" | grep -q 'mismatched 0' || fail "after restart: $(summary "$T/t3.out")"
grep -q 'lines dropped' "$LOG" || fail "the memo was not pruned"
n=$(wc -l < "$MEMO")
[ "$n" = 4096 ] || fail "memo: $n lines, bound 4096"
! grep -q "^$EB " "$MEMO" || fail "the memo keeps the line of a removed blob"
! grep -q "^$E1 .*/models--t--tiny/" "$MEMO" || fail "the memo keeps the line of a changed blob"
! grep -q "^$E2 .*/models--t--tiny/" "$MEMO" || fail "the memo keeps the line of a blob changed with its mtime set back"
! grep -q "^$(/usr/bin/python3 -c 'import hashlib; print(hashlib.sha1(b"0").hexdigest())') " "$MEMO" \
    || fail "the memo keeps its oldest line past the bound"
live=$(grep -c " $HFC/" "$MEMO")
[ "$live" = 12 ] || fail "memo: $live lines of the HF cache's blobs, 12 still verified"
stop_daemon
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null || fail "sanitizer reports in a log"
echo "ok   memo pruned: removed and changed blobs dropped, 4,096 lines kept (the newest); 12 live blobs remembered"
echo "ok"
