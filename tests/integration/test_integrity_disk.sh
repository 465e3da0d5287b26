#!/usr/bin/env bash
# A bit flipped in a cached blob on disk (docs/engine.md "Checked reads"):
# the engine's readers hash every expert as they read it against the
# index's XXH3-128, so a damaged expert is not computed on: the engine
# reports it (REPORT "damaged"), shoald removes it, the engine asks again
# and the re-fetched bytes give the same ids and logits as the local run —
# with mapped reads and with O_DIRECT reads.
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] && [ -x "$BIN/shoald" ] && [ -x "$BIN/shoal" ] || skip "shoal-engine/shoald not built"

tiny_hub
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"

"$E" run "$T/m" --tokens $P --max-tokens 6 --dump-logits "$T/l_local" > "$T/o_local" || fail "local run"
run_shoald() {   # NAME ARGS...
    local name=$1; shift
    timeout 120 "$E" run $M --home "$H" --tokens $P --max-tokens 6 --stats --expert-ram 0 \
        --dump-logits "$T/l_$name" "$@" > "$T/o_$name" 2> "$T/e_$name"
}
same() {
    cmp -s "$T/o_local" "$T/o_$1" || fail "$1: ids '$(cat "$T/o_$1")' differ from local '$(cat "$T/o_local")'"
    cmp -s "$T/l_local" "$T/l_$1" || fail "$1: logits differ from the local run"
}
run_shoald cold || { cat "$T/e_cold"; fail "cold run"; }
same cold

# Flip one bit in the middle of every cached expert blob of layers 0-7.
flip() {
    /usr/bin/python3 - "$H" <<'EOF'
import os, sqlite3, sys
home = sys.argv[1]
db = sqlite3.connect(os.path.join(home, "index.db"))
n = 0
for oid, ln in db.execute("SELECT id, len FROM objects WHERE kind = 0"):
    p = os.path.join(home, "blobs", "%016x" % oid)
    with open(p, "r+b") as f:
        f.seek(ln // 2)
        b = f.read(1)
        f.seek(ln // 2)
        f.write(bytes([b[0] ^ 0x10]))
    n += 1
print(n)
EOF
}
damaged() { "$BIN/shoal" --home "$H" stats --json | /usr/bin/python3 -c \
    'import json,sys; print(json.load(sys.stdin)["daemon"]["integrity"]["damaged_reported"])'; }

for pc in keep direct; do
    before=$(damaged)
    n=$(flip) || fail "flip"
    [ "$n" -gt 0 ] || fail "no expert blob to damage"
    run_shoald flip_$pc --page-cache $pc || { cat "$T/e_flip_$pc"; fail "$pc: the run on damaged blobs failed"; }
    same flip_$pc
    after=$(damaged)
    [ "$after" -gt "$before" ] || fail "$pc: no damaged expert was reported to shoald ($before -> $after)"
    grep -q 'a client read bytes that do not match the object.s checksum' "$T/shoald.log" \
        || fail "$pc: shoald did not log the damaged object"
    echo "ok   $pc: $n expert blobs damaged; $((after - before)) reported, removed and fetched again; ids and logits equal the local run"
    # what the run did not read stays damaged: the object checksums find it
    rc=0; "$BIN/shoal" --home "$H" verify > "$T/verify.$pc" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || { cat "$T/verify.$pc"; fail "$pc: verify exited $rc"; }
done

# After verify dropped what was still damaged, a clean run, all from the cache.
"$BIN/shoal" --home "$H" verify > /dev/null 2>&1 || true   # drop what is still damaged
run_shoald clean || { cat "$T/e_clean"; fail "run after verify"; }
same clean

kill -TERM "$PID_shoald"
rc=0; wait "$PID_shoald" || rc=$?
[ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null || fail "sanitizer report"
echo "ok   integrity on disk: damaged experts caught by the engine's checked reads"
