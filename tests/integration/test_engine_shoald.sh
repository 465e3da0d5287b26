#!/usr/bin/env bash
# test_engine_shoald.sh — shoal-engine through a running shoald:
#   `run hf://t/tiny` (hubmock + shoald, cold then warm cache) generates the
#   same ids and logits as the local-directory run; the tiers are right
#   (cold: network, warm: disk); no daemon gives the "start shoald"
#   message; a shoald killed mid-run gives a clear error, not a hang;
#   `run hf://... --prompt --chat` streams text through shoald (also with
#   --timeout).
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] && [ -x "$BIN/shoald" ] || skip "shoal-engine/shoald not built"

tiny_hub

# ---- no daemon: the client's message -----------------------------------------------
mkdir -p "$H"
timeout 20 "$E" run $M --home "$H" --tokens $P --max-tokens 2 > "$T/nod.out" 2> "$T/nod.err" \
    && fail "run without shoald succeeded"
grep -q 'shoald' "$T/nod.err" && grep -q -- "--home $H" "$T/nod.err" \
    || { cat "$T/nod.err"; fail "no-daemon message does not say how to start shoald"; }
echo "ok   no daemon: $(head -c 160 "$T/nod.err")"

bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"

# ---- same tokens as the local directory, cold then warm ----------------------------
"$E" run "$T/m" --tokens $P --max-tokens 6 --dump-logits "$T/l_local" > "$T/o_local" \
    || fail "local run"
# cold: every expert a miss; then the warm cache with each RAM tier, page-cache
# policy and prefetch setting: all must compute the same logits
run_shoald() {   # NAME ARGS...
    local name=$1; shift
    timeout 120 "$E" run $M --home "$H" --tokens $P --max-tokens 6 --stats \
        --dump-logits "$T/l_$name" "$@" > "$T/o_$name" 2> "$T/e_$name" \
        || { cat "$T/e_$name"; fail "$name run through shoald ($*)"; }
    cmp -s "$T/o_local" "$T/o_$name" \
        || fail "$name: ids through shoald '$(cat "$T/o_$name")' differ from local '$(cat "$T/o_local")'"
    cmp -s "$T/l_local" "$T/l_$name" || fail "$name: logits through shoald differ from the local run"
}
tier() { sed -n "s/.* $2 \([0-9]*\).*/\1/p" "$T/e_$1" | head -n 1; }
run_shoald cold --expert-ram 0
run_shoald warm --expert-ram 0 --page-cache keep
run_shoald ram --expert-ram 64M --page-cache direct
run_shoald noprefetch --expert-ram 64M --prefetch off
run_shoald dontneed --page-cache dontneed
[ "$(tier cold network)" -gt 0 ] || { cat "$T/e_cold"; fail "cold run fetched no expert from the network"; }
[ "$(tier warm disk)" -gt 0 ] && [ "$(tier warm network)" = 0 ] && [ "$(tier warm ram)" = 0 ] \
    || { cat "$T/e_warm"; fail "warm run without RAM tier should take every expert from disk"; }
[ "$(tier ram ram)" -gt 0 ] || { cat "$T/e_ram"; fail "--expert-ram 64M: no RAM hit"; }
grep -q 'guessed' "$T/e_ram" && grep -q 'recall per MoE layer' "$T/e_ram" \
    || { cat "$T/e_ram"; fail "--stats lacks prefetch and recall"; }
grep -q 'prefetch: 0 experts guessed' "$T/e_noprefetch" \
    || { cat "$T/e_noprefetch"; fail "--prefetch off still guessed"; }
echo "ok   ids and logits equal the local run: $(cat "$T/o_warm"); cold network $(tier cold network), warm disk $(tier warm disk), RAM tier hits $(tier ram ram)"

# the daemon saw the engine: its session and the model's hits
"$BIN/shoal" --home "$H" stats > "$T/stats" 2>&1 || { cat "$T/stats"; fail "shoal stats"; }
grep -q 't/tiny' "$T/stats" || { cat "$T/stats"; fail "shoal stats does not list t/tiny"; }
ramhits=$(awk '/^engine RAM/ {gsub(",", "", $3); print $3}' "$T/stats")
[ "${ramhits:-0}" -gt 0 ] || { cat "$T/stats"; fail "shoal stats shows no engine RAM hits (REPORT)"; }
echo "ok   shoal stats shows the engine's RAM tier: $ramhits hits"

# ---- text prompt with chat rendering, streamed through shoald ----------------------
timeout 120 "$E" run "$T/m" --prompt "hello there" --chat --max-tokens 5 > "$T/p_local" 2>&1 \
    || { cat "$T/p_local"; fail "local --prompt"; }
timeout 120 "$E" run $M --home "$H" --prompt "hello there" --chat --max-tokens 5 > "$T/p_remote" 2>&1 \
    || { cat "$T/p_remote"; fail "--prompt through shoald"; }
# the plan each printed on stderr differs (experts through shoald have buffers): not the text
grep -v '^plan: ' "$T/p_local" > "$T/p_local.txt"
grep -v '^plan: ' "$T/p_remote" > "$T/p_remote.txt"
cmp -s "$T/p_local.txt" "$T/p_remote.txt" || { diff "$T/p_local.txt" "$T/p_remote.txt"; fail "--prompt output differs"; }
echo "ok   --prompt --chat through shoald equals the local run"
# --timeout is the shared table's: run --prompt takes it (both spellings)
for t in "--timeout 1000" "--timeout=1000"; do
    timeout 120 "$E" run $M --home "$H" --prompt "hello there" --chat --max-tokens 5 $t \
        > "$T/p_timeout" 2>&1 || { cat "$T/p_timeout"; fail "run --prompt $t"; }
    grep -v '^plan: ' "$T/p_timeout" | cmp -s - "$T/p_remote.txt" || fail "run --prompt $t: other text"
done
echo "ok   run --prompt --timeout 1000 (and --timeout=1000) through shoald, the same text"

# ---- the OpenAI server on hf:// through shoald --------------------------------------
bg serve "$E" serve $M --home "$H" --port 0 --model-name tiny
wait_line "$T/serve.log" '^listening on http' 60 || fail "serve hf:// did not start"
URL=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/serve.log" | head -n 1)
curl -sf "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}' \
    > "$T/serve.json" || { cat "$T/serve.log"; fail "chat completion from serve hf://"; }
grep -q '"completion_tokens":4' "$T/serve.json" || { cat "$T/serve.json"; fail "serve hf:// usage"; }
kill -TERM "$PID_serve"; wait "$PID_serve" 2>/dev/null || fail "serve did not exit cleanly"
echo "ok   serve hf://... answers a chat completion through shoald"

# ---- shoald killed mid-run: an error naming shoald, no hang ------------------------
# A fresh home with only the spine warmed, then hubmock capped at 16 KiB/s
# per connection: every expert is a slow miss, so the kill lands while the
# engine waits for experts.
kill -TERM "$PID_shoald"; wait "$PID_shoald" 2>/dev/null
H2=$T/home2
bg shoald2 "$BIN/shoald" --home "$H2" --no-fsync --log "$T/shoald2.log"
wait_line "$T/shoald2.log" 'ready on' 20 || fail "shoald did not start"
"$BIN/shoal" --home "$H2" warm $M --spine --wait > "$T/warm.out" 2>&1 || { cat "$T/warm.out"; fail "warm --spine"; }
curl -sf -X POST "$HUB/_mock/faults?bw=16KiB" > /dev/null || fail "cannot cap hubmock"
n0=$(wc -l < "$T/hub.jsonl")
start=$(date +%s)
timeout 60 "$E" run $M --home "$H2" --tokens $P --max-tokens 40 > "$T/k.out" 2> "$T/k.err" &
epid=$!
for i in $(seq 200); do      # the spine is cached: new hub requests are experts
    [ "$(wc -l < "$T/hub.jsonl")" -gt "$n0" ] && break
    sleep 0.1
done
sleep 0.5
kill -0 $epid 2>/dev/null || { cat "$T/k.err"; fail "the run ended before shoald was killed"; }
kill -KILL "$PID_shoald2"
rc=0; wait $epid || rc=$?
took=$(( $(date +%s) - start ))
[ $rc != 0 ] || fail "the engine succeeded although shoald was killed"
[ $rc != 124 ] || fail "the engine hung after shoald was killed"
grep -q 'shoald closed the connection' "$T/k.err" && grep -q 'experts' "$T/k.err" \
    || { cat "$T/k.err"; fail "the error does not say shoald went away while fetching experts"; }
echo "ok   shoald killed: exit $rc after ${took}s: $(tail -n 1 "$T/k.err" | head -c 240)"
