#!/usr/bin/env bash
# test_server.sh — `shoal-engine serve` on tiny-k3: the official openai
# client (tests/clients/openai_server.js, openai_fields.js,
# openai_conversation.js) and curl for what a client library hides:
# malformed JSON, a huge body, an unknown field, the API key (flag, file,
# environment; never in ps nor the log), the model id, /tokenize and
# /detokenize, /metrics parsed by promtool, the queue full (429 +
# Retry-After) and --queue 0, clients that go away mid-stream and while
# queued, SIGINT under a running stream (its last chunk and [DONE]), clean
# shutdown on SIGTERM.
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
node "$ROOT/tests/clients/openai_fields.js" --base "$U/v1" --model tiny-k3 --key sekrit \
    || fail "openai client: fields and sampling"
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
check [ "$(status POST "$U/tokenize" -d '{"prompt":"x"}')" = 401 ] "/tokenize needs the key"
grep -q 'visible to every user in ps' "$T/main.log" || fail "--api-key did not warn about ps"
tr '\0' ' ' <"/proc/$PID_main/cmdline" | grep -q sekrit && fail "the key is visible in ps"
grep -q sekrit "$T/main.log" && fail "the key is in the log"

# ---- /tokenize, /detokenize --------------------------------------------------------
check [ "$(status POST "$U/tokenize" "${AUTH[@]}" -d '{"model":"tiny-k3","prompt":"Hello world"}')" = 200 ] "/tokenize"
toks=$(/usr/bin/python3 -c "import json; d=json.load(open('$T/body')); assert d['count']==len(d['tokens']) and d['max_model_len']==4096; print(json.dumps(d['tokens']))") \
    || fail "/tokenize body: $(cat "$T/body")"
check [ "$(status POST "$U/detokenize" "${AUTH[@]}" -d "{\"tokens\":$toks}")" = 200 ] "/detokenize"
grep -q '"prompt":"Hello world"' "$T/body" || fail "/detokenize round trip: $(cat "$T/body")"
check [ "$(status POST "$U/tokenize" "${AUTH[@]}" -d '{"messages":[{"role":"user","content":"Hi"}]}')" = 200 ] "/tokenize messages"
n=$(/usr/bin/python3 -c "import json; print(json.load(open('$T/body'))['count'])")
c=$(curl -s "$U/v1/chat/completions" "${AUTH[@]}" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}' \
    | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['usage']['prompt_tokens'])")
[ "$n" = "$c" ] || fail "/tokenize counts $n chat prompt tokens, the chat request $c"
check [ "$(status POST "$U/detokenize" "${AUTH[@]}" -d '{"tokens":[1,99999]}')" = 400 ] "/detokenize bad id"
check [ "$(status POST "$U/tokenize" "${AUTH[@]}" -d '{"prompt":"x","model":"nope"}')" = 404 ] "/tokenize unknown model"
echo "ok   /tokenize and /detokenize: $toks"

# ---- /metrics ------------------------------------------------------------------------
curl -s -D "$T/mhead" "$U/metrics" >"$T/metrics"
grep -qi '^Content-Type: text/plain; version=0.0.4' "$T/mhead" || fail "/metrics content type"
# Prometheus' own parser and linter (Debian's prometheus package, scripts/deps.sh)
command -v promtool >/dev/null || fail "promtool is missing: make deps installs it"
promtool check metrics <"$T/metrics" || fail "promtool: /metrics does not parse or lint"
echo "ok   promtool parses /metrics ($(grep -c '^shoal_engine_' "$T/metrics") samples)"
for m in 'http_requests_total{endpoint="/v1/chat/completions",code="200"}' completion_tokens_total \
         'expert_fetches_total{tier="local"}' ram_tier_hits_total queue_waiting time_per_output_token_seconds_count; do
    grep -qF "shoal_engine_$m " "$T/metrics" || fail "/metrics lacks shoal_engine_$m"
done
grep -q '^shoal_engine_completion_tokens_total [1-9]' "$T/metrics" || fail "no completion tokens counted"

# ---- the API key from a file and from the environment -------------------------------------
printf 'k3yfile\n' >"$T/key"; chmod 600 "$T/key"
start_server keyf --api-key-file "$T/key"
check [ "$(status GET "$URL_keyf/v1/models" -H 'Authorization: Bearer k3yfile')" = 200 ] "--api-key-file"
check [ "$(status GET "$URL_keyf/v1/models" -H 'Authorization: Bearer sekrit')" = 401 ] "--api-key-file: another key"
SHOAL_API_KEY=envk3y start_server keye
check [ "$(status GET "$URL_keye/v1/models" -H 'Authorization: Bearer envk3y')" = 200 ] "SHOAL_API_KEY"
check [ "$(status GET "$URL_keye/v1/models")" = 401 ] "SHOAL_API_KEY: no key"
grep -q envk3y "$T/keye.log" && fail "the key from the environment is in the log"
kill -TERM "$PID_keyf" "$PID_keye"; wait "$PID_keyf" "$PID_keye"

# ---- the model id ---------------------------------------------------------------------
mkdir -p "$T/hub/models--acme--tiny-k3/snapshots"
ln -s "$T/tiny" "$T/hub/models--acme--tiny-k3/snapshots/0123abcd"
bg snap "$BIN/shoal-engine" serve "$T/hub/models--acme--tiny-k3/snapshots/0123abcd" --port 0 --threads 1
wait_line "$T/snap.log" '^listening on http://' 30 || fail "server snap did not start"
S=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/snap.log" | head -n 1)
grep -q '"id":"acme/tiny-k3"' <(curl -s "$S/v1/models") || fail "the HF cache snapshot's id: $(curl -s "$S/v1/models")"
for m in acme/tiny-k3 tiny-k3 hf://acme/tiny-k3@main; do
    check [ "$(status POST "$S/v1/completions" -d "{\"model\":\"$m\",\"prompt\":\"Hi\",\"max_tokens\":1}")" = 200 ] "model $m"
done
check [ "$(status POST "$S/v1/completions" -d '{"model":"other/tiny-k3","prompt":"Hi","max_tokens":1}')" = 404 ] "another org's model"
kill -TERM "$PID_snap"; wait "$PID_snap"
echo "ok   model ids: acme/tiny-k3 from the snapshot path, named with or without its org"

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
# (3800: the chat prompt's ~230 tokens and max_tokens must fit the 4096 context)
curl -s -N --max-time 0.5 "$Q/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"go"}],"max_tokens":3800,"stream":true,"ignore_eos":true}' >/dev/null
wait_health "$Q" requests.cancelled 3 5
# The same for a whole (non-streamed) reply: nothing is written until the
# end, so only the socket watch can notice the client left.
curl -s --max-time 0.5 "$Q/v1/completions" -d '{"prompt":"Hi","max_tokens":4000,"ignore_eos":true}' >/dev/null
wait_health "$Q" requests.cancelled 4 5
wait_health "$Q" queue.running 0 5
check [ "$(status POST "$Q/v1/completions" -d '{"prompt":"Hi","max_tokens":3}')" = 200 ] "served after cancellations"

# ---- run --chat on a terminal: markers, escaped control characters ----------------------
# (`script` gives the command a terminal; greedy tiny-k3 seed 3 answers "hi there"
# with a U+0015 in its reasoning, and with thinking off a U+0019 in its answer)
if command -v script >/dev/null; then
    RUN="$BIN/shoal-engine run $T/tiny --prompt 'hi there' --chat --max-tokens 40 --threads 1"
    script -qec "$RUN" /dev/null >"$T/tty.out" 2>&1 || fail "run --chat under a terminal"
    grep -q 'thinking' "$T/tty.out" || fail "no thinking marker on a terminal: $(cat -v "$T/tty.out")"
    grep -q $'\e\[2m' "$T/tty.out" || fail "the reasoning is not dim on a terminal"
    grep -qF '\x15' "$T/tty.out" || fail "the control character is not shown escaped: $(cat -v "$T/tty.out")"
    LC_ALL=C grep -q $'\x15' "$T/tty.out" && fail "a raw control character reached the terminal"
    NO_COLOR=1 script -qec "$RUN" /dev/null >"$T/tty2.out" 2>&1 || fail "run --chat, NO_COLOR"
    grep -q 'thinking' "$T/tty2.out" || fail "NO_COLOR dropped the marker"
    grep -q $'\e\[' "$T/tty2.out" && fail "NO_COLOR: escape sequences on the terminal"
    script -qec "$RUN --no-think" /dev/null >"$T/tty3.out" 2>&1 || fail "run --chat --no-think under a terminal"
    grep -qF '\x' "$T/tty3.out" || fail "the answer's control character is not escaped: $(cat -v "$T/tty3.out")"
    # not a terminal: the model's bytes, no marker, stdout the answer alone
    eval "$RUN" >"$T/pipe.out" 2>"$T/pipe.err" || fail "run --chat into a pipe"
    LC_ALL=C grep -q $'\x15' "$T/pipe.err" || fail "piped reasoning lost its bytes"
    grep -q 'thinking' "$T/pipe.err" "$T/pipe.out" && fail "a marker in piped output"
    echo "ok   run --chat: marked and escaped on a terminal (NO_COLOR honoured), raw into a pipe"
else
    echo "note: no script(1): the terminal output of run --chat is not checked"
fi

# ---- --queue 0: no waiting room, one running ------------------------------------------
start_server q0 --queue 0
check [ "$(status POST "$URL_q0/v1/completions" -d '{"prompt":"Hi","max_tokens":2}')" = 200 ] "--queue 0 idle -> 200"
curl -s -N "$URL_q0/v1/completions" -d "$long" >/dev/null &
pq=$!
wait_health "$URL_q0" queue.running 1
code=$(curl -s -D "$T/q0.head" -o "$T/q0.out" -w '%{http_code}' "$URL_q0/v1/completions" -d '{"prompt":"Hi","max_tokens":2}')
check [ "$code" = 429 ] "--queue 0 busy -> 429 (got $code)"
kill "$pq"; wait "$pq" 2>/dev/null
# the server sees the client gone at its next write: until then --queue 0 is still full
wait_health "$URL_q0" queue.running 0 5

# ---- SIGINT under a running stream: its last chunk and [DONE] ----------------------------
curl -s -N "$URL_q0/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"go"}],"max_tokens":3800,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"reasoning_effort":"none"}' \
    >"$T/int.out" &
pi=$!
wait_health "$URL_q0" queue.running 1
sleep 0.3
kill -INT "$PID_q0"
wait "$pi"; crc=$?
[ $crc -eq 0 ] || fail "the stream cut by SIGINT: curl exit $crc (18: no final chunk)"
grep -q '"finish_reason":"length"' "$T/int.out" || fail "the stream cut by SIGINT has no finish_reason"
grep -q '"choices":\[\],"usage":{' "$T/int.out" || fail "the stream cut by SIGINT has no usage chunk"
tail -n 2 "$T/int.out" | grep -q '^data: \[DONE\]' || fail "the stream cut by SIGINT has no [DONE]"
wait "$PID_q0"; rc=$?
[ $rc -eq 0 ] || { tail "$T/q0.log"; fail "server exit status $rc after SIGINT"; }
echo "ok   SIGINT: the running stream got finish_reason, usage and [DONE]; exit 0"

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
