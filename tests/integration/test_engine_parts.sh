#!/usr/bin/env bash
# test_engine_parts.sh — the shoald expert source reads each expert in parts
# (engine/source/expert_source_shoald.c, docs/performance.md "Parallel reads").
# tiny's experts are ~13 KB, so `--read-part 4096` reads each in four parts
# (the last one short) and 8192 in two of unequal size: for every page-cache
# policy the ids and logits must equal the local run's.  `direct` is where a
# part stitched at the wrong place would change the bytes: O_DIRECT into
# the engine's buffer on ext4 here, and the plain-read fallback with
# shoald's home on a tmpfs (/dev/shm), where O_DIRECT is refused.  And the
# expert buffer pool: a prefill chunk's experts stream through at most 32.
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] && [ -x "$BIN/shoald" ] || skip "shoal-engine/shoald not built"

"$BIN/mkmodel" --preset tiny --seed 11 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m"
export HF_ENDPOINT=$HUB
M=hf://t/tiny
P=7,100,300,5,9,42,11,12,13,700,1

"$E" run "$T/m" --tokens $P --max-tokens 6 --dump-logits "$T/l_local" > "$T/o_local" \
    || fail "local run"

run_parts() {   # HOME NAME ARGS...
    local home=$1 name=$2; shift 2
    timeout 120 "$E" run $M --home "$home" --tokens $P --max-tokens 6 --stats --expert-ram 0 \
        --dump-logits "$T/l_$name" "$@" > "$T/o_$name" 2> "$T/e_$name" \
        || { cat "$T/e_$name"; fail "$name run through shoald ($*)"; }
    cmp -s "$T/o_local" "$T/o_$name" \
        || fail "$name: ids '$(cat "$T/o_$name")' differ from the local run's '$(cat "$T/o_local")'"
    cmp -s "$T/l_local" "$T/l_$name" || fail "$name: logits differ from the local run's"
}
disk() { sed -n "s/.* disk \([0-9]*\).*/\1/p" "$T/e_$1" | head -n 1; }

H=$T/home
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
run_parts "$H" cold --read-part 4096 --page-cache direct
for pc in keep dontneed direct; do
    run_parts "$H" "${pc}_4k" --read-part 4096 --page-cache $pc
    run_parts "$H" "${pc}_8k" --read-part 8K --page-cache $pc
done
[ "$(disk direct_4k)" -gt 0 ] || { cat "$T/e_direct_4k"; fail "the warm run read no expert from disk"; }
echo "ok   parts of 4 KiB and 8 KiB, keep/dontneed/direct: ids and logits equal the local run" \
     "($(cat "$T/o_local"); $(disk direct_4k) experts from disk)"

# the pool: a 16-token chunk routes up to 64 distinct experts per layer
# (top 4 of 64); with no RAM tier they stream through at most 32 buffers
# (PLAN_EXPERT_POOL, what the memory plan counts) instead of being held at once
P16=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
"$E" run "$T/m" --tokens $P16 --max-tokens 3 > "$T/o_local16" 2>/dev/null || fail "local 16-token run"
for pc in direct keep; do
    timeout 120 "$E" run $M --home "$H" --tokens $P16 --max-tokens 3 --stats --expert-ram 0 \
        --chunk 16 --page-cache $pc > "$T/o_pool_$pc" 2> "$T/e_pool_$pc" \
        || { cat "$T/e_pool_$pc"; fail "pool run ($pc)"; }
    cmp -s "$T/o_local16" "$T/o_pool_$pc" || fail "pool run ($pc): ids differ from the local run"
    held=$(sed -n 's/^stats: expert buffers outside the RAM tier: at most \([0-9]*\) held (the pool: 32)$/\1/p' "$T/e_pool_$pc")
    loads=$(sed -n 's/^stats: prefill loaded \([0-9]*\) distinct experts.*/\1/p' "$T/e_pool_$pc")
    [ -n "$held" ] && [ "$held" -le 32 ] && [ "$held" -gt 0 ] \
        || { cat "$T/e_pool_$pc"; fail "pool ($pc): held '$held' buffers, the pool is 32"; }
    echo "ok   pool ($pc): prefill loaded $loads experts through at most $held buffers of 32"
done

# the parts really are separate reads: O_DIRECT preads of one 4096-byte block
# each (a whole ~13 KB expert in one read matches none; with the default
# part size this run has no 4096-byte reads) when strace can trace here (an
# ASan build's leak check cannot run under ptrace)
if command -v strace > /dev/null && strace -f -o /dev/null true 2> /dev/null; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    timeout 120 strace -ff -e trace=pread64 -o "$T/strace" "$E" run $M --home "$H" \
        --tokens $P --max-tokens 2 --expert-ram 0 --read-part 4096 --page-cache direct \
        > "$T/o_strace" 2> "$T/e_strace" || { cat "$T/e_strace"; fail "run under strace"; }
    # -ff: a file per thread, so no call is split into unfinished/resumed lines
    blocks=$(cat "$T"/strace.* | grep -c 'pread64(.*, 4096, [0-9]*) = 4096')
    [ "$blocks" -ge 8 ] || { cat "$T"/strace.* | tail -n 20; fail "no 4096-byte part reads under strace"; }
    echo "ok   strace: $blocks O_DIRECT part reads of 4096 bytes"
else
    echo "ok   (strace unavailable: part reads not counted)"
fi

# ---- the tmpfs fallback (no O_DIRECT): plain reads of each part ---------------------
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
    H2=$(mktemp -d /dev/shm/shoal-parts.XXXXXX)
    trap '_cleanup; rm -rf "$H2"' EXIT
    bg shoald2 "$BIN/shoald" --home "$H2" --no-fsync --log "$T/shoald2.log"
    wait_line "$T/shoald2.log" 'ready on' 20 || fail "shoald on /dev/shm did not start"
    run_parts "$H2" shm_cold --read-part 4096 --page-cache direct
    run_parts "$H2" shm_warm --read-part 12K --page-cache direct
    [ "$(disk shm_warm)" -gt 0 ] || { cat "$T/e_shm_warm"; fail "tmpfs: no expert from disk"; }
    echo "ok   tmpfs home (no O_DIRECT): parts of 4 KiB and 12 KiB equal the local run"
else
    echo "ok   (no writable /dev/shm: tmpfs fallback not run)"
fi
