#!/usr/bin/env bash
# test_server_shoald.sh — `shoal-engine serve hf://…` through shoald:
#   - the port opens before the model is bound: /health 503 "loading" with
#     the phase, /v1/* 503 with Retry-After, then 200 (a stalling hub makes
#     the load slow enough to see);
#   - the model id is the repo name, named with or without the org;
#   - shoald killed (SIGKILL) under a running stream: the stream gets its
#     error event and a clean end, /health turns 503 "reconnecting",
#     requests get 503 with Retry-After, /metrics says so; shoald restarted
#     on the same home: the server reconnects by itself and answers the same
#     greedy text as before;
#   - the same with SIGTERM while idle (the idle ping notices).
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] && [ -x "$BIN/shoald" ] && [ -x "$BIN/hubmock" ] || skip "binaries not built"
command -v curl >/dev/null || skip "curl is not installed"

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
# every CDN answer stalls 1 s: the spine's cold fetch takes seconds
start_hubmock --repo t/tiny="$T/m" --rate-stall 1 --stall-secs 1
export HF_ENDPOINT=$HUB
H=$T/home
mkdir -p "$H"

start_shoald() {   # NAME
    bg "$1" "$BIN/shoald" --home "$H" --no-fsync --log "$T/$1.log"
    wait_line "$T/$1.log" 'ready on' 20 || fail "shoald $1 did not start"
}
code() {   # METHOD URL [curl args] -> status; body in $T/body, headers in $T/head
    local m=$1 u=$2; shift 2
    curl -s -D "$T/head" -o "$T/body" -w '%{http_code}' -X "$m" "$u" "$@"
}
field() {  # field DOTTED.PATH < json
    /usr/bin/python3 -c "import json,sys
d=json.load(sys.stdin)
for k in sys.argv[1].split('.'): d=d[int(k)] if isinstance(d, list) else d[k]
print(d)" "$1"
}
wait_health() {   # wait_health DOTTED.PATH VALUE SECS
    local i v
    for i in $(seq $(($3 * 10))); do
        v=$(curl -s "$U/health" | field "$1" 2>/dev/null)
        [ "$v" = "$2" ] && return 0
        sleep 0.1
    done
    fail "$1 did not become $2 within $3 s (it is '$v'): $(curl -s "$U/health")"
}

start_shoald shoald1
# --expert-ram 0: every expert comes from shoald, so a dead daemon is felt
bg serve "$E" serve hf://t/tiny --home "$H" --port 0 --threads 1 --expert-ram 0
wait_line "$T/serve.log" 'port open on http://' 20 || fail "the port did not open"
U=$(sed -n 's/.*port open on \(http:[^;]*\);.*/\1/p' "$T/serve.log" | head -n 1)

# ---- loading --------------------------------------------------------------------------
saw=0
for _ in $(seq 200); do
    grep -q '^listening on' "$T/serve.log" && break
    c=$(code GET "$U/health")
    if [ "$c" = 503 ] && [ "$(field status <"$T/body")" = loading ]; then
        saw=$((saw + 1))
        phase=$(field loading.phase <"$T/body")
        # seen enough: let the rest of the load run at full speed
        [ "$saw" = 5 ] && curl -s -X POST "$HUB/_mock/faults?clear=1" >/dev/null
        c=$(code GET "$U/v1/models")
        if [ "$c" = 503 ]; then
            grep -qi '^Retry-After: [0-9]' "$T/head" || fail "503 while loading lacks Retry-After"
            grep -q '"code":"model_loading"' "$T/body" || fail "loading 503: $(cat "$T/body")"
        fi
    fi
    sleep 0.1
done
wait_line "$T/serve.log" '^listening on http' 60 || fail "serve hf:// did not become ready"
[ "$saw" -ge 5 ] || fail "never saw /health 503 loading ($saw times)"
echo "ok   loading: /health 503 loading $saw times (phase '$phase'), /v1/* 503 + Retry-After"
check [ "$(code GET "$U/health")" = 200 ] "/health 200 once ready"
check [ "$(field shoald.state <"$T/body")" = ok ] "shoald state ok"

# ---- the model id ------------------------------------------------------------------------
check [ "$(code GET "$U/v1/models")" = 200 ] "/v1/models"
check [ "$(field data.0.id <"$T/body")" = t/tiny ] "the id is the repo name"
req() {   # req MODEL -> status; body in $T/body
    code POST "$U/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$1\",\"prompt\":\"Hello there\",\"max_tokens\":8}"
}
check [ "$(req t/tiny)" = 200 ] "model t/tiny"
ref=$(field choices.0.text <"$T/body")
check [ "$(req tiny)" = 200 ] "model named without its org"
check [ "$(req hf://t/tiny@main)" = 200 ] "model named hf://t/tiny@main"
check [ "$(req other/tiny)" = 404 ] "another org's tiny is not this model"
echo "ok   model id t/tiny; greedy reference: $(printf %q "$ref")"

text_of() { field choices.0.text <"$T/body"; }

# ---- SIGKILL under a running stream --------------------------------------------------------
curl -s -N "$U/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Hello","max_tokens":3000,"ignore_eos":true,"stream":true}' >"$T/stream.out" &
cpid=$!
wait_health queue.running 1 10
sleep 0.3
kill -KILL "$PID_shoald1"
wait "$cpid"; crc=$?
[ $crc -eq 0 ] || fail "the stream did not end cleanly (curl exit $crc)"
grep -q '^data: {"error"' "$T/stream.out" || { tail -c 600 "$T/stream.out"; fail "no error event in the stream"; }
grep -q 'shoald' "$T/stream.out" || fail "the error event does not name shoald: $(grep error "$T/stream.out")"
tail -n 2 "$T/stream.out" | grep -q '^data: \[DONE\]' || fail "the stream did not end with [DONE]"
echo "ok   SIGKILL: the stream got '$(grep -o '"message":"[^"]*' "$T/stream.out" | head -c 120)…' and ended"
wait_health status reconnecting 10
check [ "$(code GET "$U/health")" = 503 ] "/health 503 while shoald is gone"
c=$(req t/tiny)
[ "$c" = 503 ] || fail "a request while shoald is gone: $c, wanted 503 ($(cat "$T/body"))"
grep -q '"code":"backend_unavailable"' "$T/body" || fail "503 body: $(cat "$T/body")"
grep -qi '^Retry-After: [0-9]' "$T/head" || fail "503 without Retry-After"
curl -s "$U/metrics" >"$T/metrics"
grep -q '^shoal_engine_shoald_state{state="reconnecting"} 1' "$T/metrics" \
    || fail "metrics: $(grep shoald_state "$T/metrics")"
check [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/tokenize" -d '{"prompt":"hi"}')" = 200 ] \
    "/tokenize needs no daemon"

start_shoald shoald2
wait_health status ok 20
check [ "$(curl -s "$U/health" | field shoald.reconnects)" = 1 ] "one reconnection counted"
check [ "$(req t/tiny)" = 200 ] "served again after the restart"
[ "$(text_of)" = "$ref" ] || fail "after reconnecting: $(printf %q "$(text_of)"), before: $(printf %q "$ref")"
echo "ok   restarted shoald: reconnected, the same greedy text"

# ---- SIGTERM while idle ----------------------------------------------------------------------
kill -TERM "$PID_shoald2"; wait "$PID_shoald2" 2>/dev/null
t0=$(date +%s%N)
wait_health status reconnecting 10
echo "ok   SIGTERM: /health said reconnecting after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
sleep 11
check [ "$(curl -s "$U/health" | field status)" = down ] "down after 10 s away"
start_shoald shoald3
wait_health status ok 20
check [ "$(req tiny)" = 200 ] "served after the second restart"
[ "$(text_of)" = "$ref" ] || fail "after the second restart: $(printf %q "$(text_of)")"
grep -q 'reconnected to shoald' "$T/serve.log" || fail "no reconnection logged"
echo "ok   SIGTERM + restart: down, then ok; $(grep -c 'reconnecting to shoald' "$T/serve.log") failed attempts logged"

kill -TERM "$PID_serve"; wait "$PID_serve"; rc=$?
[ $rc -eq 0 ] || { tail "$T/serve.log"; fail "serve exit status $rc"; }
echo "server shoald tests passed"
