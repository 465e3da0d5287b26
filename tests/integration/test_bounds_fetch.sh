#!/usr/bin/env bash
# A lying or slow upstream (issue 18 items 6 and the smaller fixes), real
# binaries against hubmock:
#   - a CDN that drips one byte every 50 ms (each byte progress): below
#     --low-speed 10K/2 it is a stall, retried on a fresh connection, each
#     attempt logged; once the drip stops the GET completes with the right
#     bytes;
#   - a 1 MiB response header: the error says the header is too large,
#     not libcurl's "Out of memory".
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] && [ -x "$BIN/hubmock" ] || skip "binaries not built"

"$BIN/mkmodel" --preset tiny --seed 9 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m"
H=$T/home
M=hf://t/tiny
export HF_ENDPOINT=$HUB
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log" --low-speed 10K/2
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
"$BIN/shoalc" --home "$H" get $M f:config.json > /dev/null || fail "warm-up GET"

# ---- drip ------------------------------------------------------------------------------
curl -fsS -X POST "$HUB/_mock/faults?drip_secs=0.05" > /dev/null || fail "cannot set drip"
"$BIN/shoalc" --home "$H" get $M 1:3 --check "$T/m" > "$T/drip.out" 2>&1 &
client=$!
wait_line "$T/shoald.log" 'below the low-speed limit.*retry 2' 30 \
    || fail "a dripping CDN was not stopped twice by the low-speed limit"
curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
wait $client || { cat "$T/drip.out"; fail "the GET did not complete once the drip stopped"; }
grep -q '1:3 miss .* ok' "$T/drip.out" || { cat "$T/drip.out"; fail "drip: wrong result"; }
grep 'below the low-speed limit' "$T/shoald.log" | head -n 2 | cut -c1-200

# ---- a header too large ----------------------------------------------------------------
"$BIN/mkmodel" --preset tiny --seed 10 --out "$T/m2" --quiet || fail "mkmodel 2"
curl -fsS -X POST "$HUB/_mock/faults?huge_header=1MiB" > /dev/null || fail "cannot set huge_header"
"$BIN/shoal-fetch" --home "$T/home2" "$M" > "$T/huge.out" 2>&1 && fail "a 1 MiB header was accepted"
grep -q 'header is too large' "$T/huge.out" || { cat "$T/huge.out"; fail "huge header: unclear message"; }
grep -v 'libcurl says' "$T/huge.out" | grep -qi 'out of memory' && fail "still reported as out of memory"
curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
echo "fetch bounds: ok"
