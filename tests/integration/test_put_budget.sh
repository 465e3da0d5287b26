#!/usr/bin/env bash
# test_put_budget.sh — a PUT being written is charged to the budget from
# PUT_BEGIN to its commit or abort (issue 18; docs/daemon.md, "Budget"):
# the engine PUTs its spine pack (37-58 GB at K3 size) into a file shoald
# hands out, and a warm running meanwhile must not fill the room it needs.
# With the real binaries (hubmock, shoald --max-size 14M, put_client.py
# holding a PUT_BEGIN of 4 MiB open, shoal warm):
#   - while the PUT is open STATS shows its 4 MiB reserved; a warm of the
#     whole 13 MB model is refused by its plan (it counts the PUT), and with
#     --fit it runs; throughout, what the cache holds on disk (blobs/ and
#     tmp/, in blocks) and what STATS charges (used + reserved) stay within
#     the budget;
#   - the PUT then commits (nothing had to give way for it) and the cache
#     is still within the budget; an aborted PUT leaves tmp/ empty;
#   - a PUT larger than the budget, and one larger than what eviction could
#     free (pinned objects stay), are refused at PUT_BEGIN (ENOSPC) with the
#     numbers, and change nothing;
#   - on a 64 MB tmpfs (when one can be mounted) a 32 MiB PUT's file does
#     not shrink the budget when it is recomputed from the free space.
source "$(dirname "$0")/lib.sh"
for b in shoald shoal mkmodel hubmock; do [ -x "$BIN/$b" ] || skip "$b not built"; done
PY=/usr/bin/python3
PUTC=$ROOT/tests/integration/put_client.py
$PY -c 'import ctypes; ctypes.CDLL("libxxhash.so.0")' 2> /dev/null || skip "no libxxhash.so.0"
BUDGET=$((14 << 20))

"$BIN/mkmodel" --preset tiny --seed 9 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m"
export HF_ENDPOINT=$HUB
H=$T/home M=hf://t/tiny
start_daemon --max-size 14M --parallel 2
SOCK=$H/shoald.sock
S() { "$BIN/shoal" --home "$H" "$@"; }
disk() {   # disk KEY: STATS's disk.KEY
    S stats --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["disk"][sys.argv[1]])' "$1"
}
held() {   # bytes in blocks of the files under blobs/ and tmp/
    find "$H/blobs" "$H/tmp" -type f -printf '%b\n' 2> /dev/null | awk '{ s += $1 } END { print s * 512 }'
}

# ---- a PUT held open beside a warm -------------------------------------------------------
mkfifo "$T/put.in"
$PY "$PUTC" "$SOCK" "$M" pack-a $((4 << 20)) < "$T/put.in" > "$T/put.out" 2>&1 &
putc=$!
exec 7> "$T/put.in"
wait_line "$T/put.out" '^ready ' 30 || fail "PUT_BEGIN: $(cat "$T/put.out")"
r=$(disk reserved)
[ "$r" -ge $((4 << 20)) ] || fail "an open PUT of 4 MiB reserves $r bytes"
S warm "$M" > "$T/warm0" 2>&1; rc=$?
[ $rc = 8 ] || fail "a warm of 13 MB beside a 4 MiB PUT under 14 MiB: exit $rc, $(cat "$T/warm0")"
# sample what is held while the warm runs
(
    for _ in $(seq 1200); do   # a minute at most
        [ -d "$T" ] && [ ! -f "$T/warm.done" ] || break
        h=$(held); u=$(disk used); r=$(disk reserved)
        echo "$h $((u + r))"
        sleep 0.05
    done
) > "$T/samples" &
sampler=$!
S warm "$M" --fit --wait > "$T/warm1" 2>&1 || fail "warm --fit beside the PUT: $(cat "$T/warm1")"
touch "$T/warm.done"; wait $sampler
n=$(wc -l < "$T/samples")
most=$(awk -v b=$BUDGET '{ if ($1 > m) m = $1; if ($2 > c) c = $2 } END { print m, c }' "$T/samples")
awk -v b=$BUDGET '$1 > b || $2 > b { bad = 1 } END { exit bad }' "$T/samples" \
    || fail "over the budget during the warm (held, charged): $(awk -v b=$BUDGET '$1 > b || $2 > b' "$T/samples" | head -n 3)"
[ "$(held)" -le $BUDGET ] || fail "the cache holds $(held) bytes after the warm, budget $BUDGET"
echo "ok   warm --fit beside an open 4 MiB PUT: $n samples, at most ${most% *} bytes on disk and ${most#* } charged (budget $BUDGET)"

echo commit >&7
wait $putc || fail "put_client: $(cat "$T/put.out")"
grep -q '^committed$' "$T/put.out" || fail "the held PUT did not commit: $(cat "$T/put.out")"
exec 7>&-
u=$(disk used); r=$(disk reserved); h=$(held)
[ "$r" = 0 ] || fail "$r bytes still reserved after the commit"
[ "$h" -le $BUDGET ] && [ "$u" -le $BUDGET ] || fail "after the commit: $h bytes on disk, $u used, budget $BUDGET"
echo "ok   the PUT committed after the warm: $u bytes used, $h on disk"

# an aborted PUT gives its reservation back and leaves nothing
mkfifo "$T/put2.in"
$PY "$PUTC" "$SOCK" "$M" pack-b $((1 << 20)) < "$T/put2.in" > "$T/put2.out" 2>&1 &
putc=$!
exec 7> "$T/put2.in"
wait_line "$T/put2.out" '^ready ' 30 || fail "PUT_BEGIN pack-b: $(cat "$T/put2.out")"
echo abort >&7
wait $putc; exec 7>&-
grep -q '^aborted$' "$T/put2.out" || fail "abort: $(cat "$T/put2.out")"
[ "$(disk reserved)" = 0 ] || fail "an aborted PUT left $(disk reserved) bytes reserved"
[ -z "$(ls -A "$H/tmp")" ] || fail "an aborted PUT left $(ls "$H/tmp") in tmp/"

# ---- PUTs that cannot fit ------------------------------------------------------------------
u0=$(disk used)
$PY "$PUTC" "$SOCK" "$M" pack-huge $((20 << 20)) < /dev/null > "$T/huge.out" 2>&1 || fail "put_client: $(cat "$T/huge.out")"
grep -q '^refused -[0-9]* .*PUT_BEGIN pack-huge (20.0 MiB).*budget' "$T/huge.out" \
    || fail "a PUT past the budget: $(cat "$T/huge.out")"
pinned=$(disk pinned)
big=$((BUDGET - pinned + (1 << 20)))   # fits the budget, not beside the pinned objects
$PY "$PUTC" "$SOCK" "$M" pack-big $big < /dev/null > "$T/big.out" 2>&1 || fail "put_client: $(cat "$T/big.out")"
grep -q '^refused -[0-9]* .*PUT_BEGIN pack-big .*evictable' "$T/big.out" \
    || fail "a PUT past what eviction can free: $(cat "$T/big.out")"
[ "$(disk used)" = "$u0" ] && [ "$(disk reserved)" = 0 ] || fail "a refused PUT changed the cache"
[ -z "$(ls -A "$H/tmp")" ] || fail "a refused PUT left $(ls "$H/tmp") in tmp/"
grep -q 'PUT_BEGIN pack-big' "$LOG" || fail "the refusal is not logged"
echo "ok   refused at PUT_BEGIN: $(sed 's/^refused -[0-9]* //' "$T/huge.out")"
echo "ok   refused at PUT_BEGIN: $(sed 's/^refused -[0-9]* //' "$T/big.out")"
stop_daemon

# ---- a PUT's file filling a small disk does not shrink the budget ---------------------------
# The budget follows the disk (recomputed every 10 s from free space + what
# the cache holds): the blocks of a PUT being written are the cache's, and
# its reservation charges them already.  A 64 MB tmpfs, --max-size 40M, a
# PUT of 32 MiB written and held open past a recomputation: the budget
# stays 40 MiB (counted as free space lost it fell to 32 MiB).
mkdir -p "$T/small"
if mount -t tmpfs -o size=64m tmpfs "$T/small" 2> /dev/null; then
    _small_cleanup() {
        local p
        for p in "${_pids[@]}"; do kill -KILL "$p" 2> /dev/null; done
        sleep 0.3
        umount "$T/small" 2> /dev/null
        _cleanup
    }
    trap _small_cleanup EXIT
    H=$T/small/h
    start_daemon --max-size 40M
    SOCK=$H/shoald.sock
    b0=$(disk budget)
    mkfifo "$T/put3.in"
    $PY "$PUTC" "$SOCK" "$M" pack-c $((32 << 20)) < "$T/put3.in" > "$T/put3.out" 2>&1 &
    putc=$!
    exec 7> "$T/put3.in"
    wait_line "$T/put3.out" '^ready ' 30 || fail "PUT_BEGIN of 32 MiB on the tmpfs: $(cat "$T/put3.out")"
    sleep 11   # past a recomputation
    b1=$(disk budget)
    echo commit >&7
    wait $putc; exec 7>&-
    grep -q '^committed$' "$T/put3.out" || fail "the 32 MiB PUT did not commit: $(cat "$T/put3.out")"
    b2=$(disk budget)
    stop_daemon
    umount "$T/small" || fail "umount"
    trap _cleanup EXIT
    [ "$b0" = $((40 << 20)) ] && [ "$b1" = "$b0" ] && [ "$b2" = "$b0" ] \
        || fail "budget $b0 at start, $b1 while a 32 MiB PUT filled the 64 MB disk, $b2 after its commit"
    echo "ok   a 32 MiB PUT filling a 64 MB tmpfs: the budget stays $b1 bytes through a recomputation"
else
    echo "skip the small filesystem: cannot mount a tmpfs here"
fi
echo "put budget: ok"
