#!/usr/bin/env bash
# test_server.sh — `shoal-engine serve` on tiny-k3: the official openai
# client (tests/clients/openai_server.js, openai_conversation.js) and curl
# for what a client library hides: malformed JSON, a huge body, an unknown
# field, the API key, the queue full (429 + Retry-After), clients that go
# away mid-stream and while queued, clean shutdown on SIGTERM.
source "$(dirname "$0")/lib.sh"

command -v curl >/dev/null || skip "curl is not installed"
command -v node >/dev/null || skip "node is not installed"
[ -d "$ROOT/tests/node/node_modules/openai" ] || skip "the openai npm client is missing (make deps)"
[ -x "$BIN/shoal-engine" ] || fail "no $BIN/shoal-engine"

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/tiny" >"$T/mkmodel.log" 2>&1 || fail "mkmodel failed"

# start_server NAME ARGS...: sets URL_<NAME> and PID_<NAME>.
start_server() {
    local name=$1; shift
    bg "$name" "$BIN/shoal-engine" serve "$T/tiny" --port 0 --model-name tiny-k3 --threads 1 "$@"
    wait_line "$T/$name.log" '^listening on http://' 30 || fail "server $name did not start"
    eval "URL_$name=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/$name.log" | head -n 1)"
}

# status METHOD URL [curl args...] -> prints the HTTP status
status() {
    local m=$1 u=$2; shift 2
    curl -s -o "$T/body" -w '%{http_code}' -X "$m" "$u" "$@"
}

health_field() {   # health_field URL jq-like dotted path, via python
    curl -s "$1/health" | /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin)
for k in sys.argv[1].split('.'): d=d[k]
print(d)" "$2"
}

wait_health() {    # wait_health URL PATH VALUE [SECS]
    local i
    for i in $(seq $((${4:-10} * 10))); do
        [ "$(health_field "$1" "$2")" = "$3" ] && return 0
        sleep 0.1
    done
    fail "$2 did not become $3 (it is $(health_field "$1" "$2"))"
}

start_server main --api-key sekrit
U=$URL_main
AUTH=(-H "Authorization: Bearer sekrit" -H "Content-Type: application/json")

# ---- the official client ----------------------------------------------------------
node "$ROOT/tests/clients/openai_server.js" --base "$U/v1" --model tiny-k3 --key sekrit \
    || fail "openai client checks"
node "$ROOT/tests/clients/openai_conversation.js" --base "$U/v1" --model tiny-k3 --key sekrit \
    >"$T/conv.log" 2>&1 || { cat "$T/conv.log"; fail "three-turn conversation"; }
cat "$T/conv.log"
grep -q '^turn3_computed' "$T/conv.log" || fail "conversation summary missing"
node "$ROOT/tests/clients/openai_conversation.js" --base "$U/v1" --model tiny-k3 --key sekrit --think 0 \
    >"$T/conv0.log" 2>&1 || { cat "$T/conv0.log"; fail "three-turn conversation, thinking off"; }
cat "$T/conv0.log"

# ---- curl: errors ------------------------------------------------------------------
check [ "$(status POST "$U/v1/chat/completions" "${AUTH[@]}" -d '{"messages": [')" = 400 ] "malformed JSON -> 400"
grep -q '"type":"invalid_request_error"' "$T/body" || fail "malformed JSON body is not OpenAI-shaped: $(cat "$T/body")"
check [ "$(status POST "$U/v1/chat/completions" "${AUTH[@]}" -d '[1,2]')" = 400 ] "non-object body -> 400"
check [ "$(status POST "$U/v1/chat/completions" "${AUTH[@]}" \
    -d '{"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":2}}')" = 400 ] "unknown field -> 400"
grep -q '"param":"logit_bias"' "$T/body" || fail "unknown field not named: $(cat "$T/body")"
check [ "$(status POST "$U/v1/chat/completions" "${AUTH[@]}" \
    -d '{"messages":[{"role":"user","content":"x","name":"bob"}]}')" = 400 ] "unknown message field -> 400"
grep -q 'messages\[0\].name' "$T/body" || fail "message field not named: $(cat "$T/body")"
/usr/bin/python3 -c "import sys; sys.stdout.write('{\"prompt\": \"' + 'a' * (5 << 20) + '\"}')" >"$T/huge.json"
check [ "$(status POST "$U/v1/completions" "${AUTH[@]}" --data-binary @"$T/huge.json")" = 413 ] "huge body -> 413"
check [ "$(status GET "$U/v1/nothing" "${AUTH[@]}")" = 404 ] "unknown path -> 404"
check [ "$(status GET "$U/v1/chat/completions" "${AUTH[@]}")" = 405 ] "GET on a POST endpoint -> 405"

# ---- curl: the API key -------------------------------------------------------------
check [ "$(status GET "$U/v1/models")" = 401 ] "no key -> 401"
grep -q '"code":"invalid_api_key"' "$T/body" || fail "401 body: $(cat "$T/body")"
check [ "$(status GET "$U/v1/models" -H 'Authorization: Bearer sekri')" = 401 ] "short key -> 401"
check [ "$(status GET "$U/v1/models" -H 'Authorization: Bearer sekrit2')" = 401 ] "long key -> 401"
check [ "$(status GET "$U/v1/models" -H 'Authorization: sekrit')" = 401 ] "no Bearer -> 401"
check [ "$(status GET "$U/v1/models" "${AUTH[@]}")" = 200 ] "right key -> 200"
check [ "$(status GET "$U/health")" = 200 ] "/health needs no key"

# ---- queue full, clients gone -------------------------------------------------------
start_server q --queue 1
Q=$URL_q
# ignore_eos: greedy tiny-k3 ends "Hello" after 444 tokens, which a fast
# machine reaches before the client leaves
long='{"prompt":"Hello","max_tokens":4000,"stream":true,"ignore_eos":true}'
curl -s -N "$Q/v1/completions" -d "$long" >"$T/a.out" &
pa=$!
wait_health "$Q" queue.running 1
curl -s -o "$T/b.out" "$Q/v1/completions" -d '{"prompt":"Hi","max_tokens":4}' &
pb=$!
wait_health "$Q" queue.waiting 1
code=$(curl -s -D "$T/c.head" -o "$T/c.out" -w '%{http_code}' "$Q/v1/completions" -d '{"prompt":"Hi","max_tokens":4}')
check [ "$code" = 429 ] "third request with --queue 1 -> 429 (got $code)"
grep -qi '^Retry-After: [0-9]' "$T/c.head" || fail "429 without Retry-After"
grep -q '"code":"queue_full"' "$T/c.out" || fail "429 body: $(cat "$T/c.out")"
check [ "$(health_field "$Q" requests.rejected_busy)" = 1 ] "rejected_busy counted"

# The queued client leaves: its job is cancelled while it waits.
kill "$pb"; wait "$pb" 2>/dev/null
wait_health "$Q" queue.waiting 0 5
# The streaming client leaves mid-stream: its generation stops.
sleep 0.3
kill "$pa"; wait "$pa" 2>/dev/null
grep -q '^data: {' "$T/a.out" || fail "the long request streamed nothing"
wait_health "$Q" queue.running 0 5
wait_health "$Q" requests.cancelled 2 5
n=$(health_field "$Q" generation.last_completion_tokens)
[ "$n" -lt 4000 ] || fail "the generation of a gone client ran to the end ($n tokens)"
echo "cancelled after $n of 4000 tokens"

# A client with a time limit (curl --max-time) mid-stream, then the server is free.
curl -s -N --max-time 0.5 "$Q/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"go"}],"max_tokens":4000,"stream":true,"ignore_eos":true}' >/dev/null
wait_health "$Q" requests.cancelled 3 5
# The same for a whole (non-streamed) reply: nothing is written until the
# end, so only the socket watch can notice the client left.
curl -s --max-time 0.5 "$Q/v1/completions" -d '{"prompt":"Hi","max_tokens":4000,"ignore_eos":true}' >/dev/null
wait_health "$Q" requests.cancelled 4 5
wait_health "$Q" queue.running 0 5
check [ "$(status POST "$Q/v1/completions" -d '{"prompt":"Hi","max_tokens":3}')" = 200 ] "served after cancellations"

# ---- clean shutdown -------------------------------------------------------------------
curl -s -N "$Q/v1/completions" -d "$long" >/dev/null &
wait_health "$Q" queue.running 1
kill -TERM "$PID_q"
for _ in $(seq 50); do kill -0 "$PID_q" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID_q" 2>/dev/null && fail "server still running 5 s after SIGTERM"
wait "$PID_q"; rc=$?
[ $rc -eq 0 ] || { tail "$T/q.log"; fail "server exit status $rc after SIGTERM"; }
kill -TERM "$PID_main"; wait "$PID_main"; rc=$?
[ $rc -eq 0 ] || { tail "$T/main.log"; fail "main server exit status $rc after SIGTERM"; }
echo "server tests passed"
