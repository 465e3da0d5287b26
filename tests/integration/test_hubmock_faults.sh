#!/usr/bin/env bash
# hubmock's injected faults, set at start and changed at run time through
# /_mock/faults: 429 (+ Retry-After, RateLimit), 503, reset after K bytes,
# truncation, a 200 that ignores Range, stalls, the bandwidth cap, the seeded
# share of faulted requests, and how the request log records them.
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl CLI not installed"
[ -x "$BIN/hubmock" ] || fail "$BIN/hubmock not built"

M=$T/m
mkdir -p "$M"
head -c 4194304 /dev/urandom >"$M/model-00001-of-000001.safetensors"
printf '{"v":1}\n' >"$M/config.json"
ST=model-00001-of-000001.safetensors
start_hubmock --repo org/m="$M" --log "$T/req.log" --seed 7 --rate-503 0 --stall-secs 1

status() { tr -d '\r' <"$1" | awk '/^HTTP\//{s=$2} END{print s}'; }
hdr() { tr -d '\r' <"$1" | awk -v n="$(echo "$2" | tr A-Z a-z)" \
    'BEGIN{FS=": "} /^HTTP\//{delete h} {k=tolower($1); sub(/^[^:]*: /,""); h[k]=$0} END{print h[n]}'; }
faults() { curl -sS -f -X POST "$HUB/_mock/faults?$1" -o "$T/faults.json" || fail "POST /_mock/faults?$1"; }
loc() { curl -sS -I "$HUB/org/m/resolve/main/$ST" | tr -d '\r' | sed -n 's/^Location: //p'; }
now() { date +%s.%N; }
elapsed() { /usr/bin/python3 -c "import time; print(time.time() - $1)"; }
ge() { /usr/bin/python3 -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)"; }

LOC=$(loc)
[ -n "$LOC" ] || fail "no CDN location"

# ---- control endpoint: read, change, refuse nonsense -----------------------------
curl -sS "$HUB/_mock/faults" -o "$T/f.json"
/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["rate_429"]==0 and j["stall_secs"]==1 and j["cdn_ttl"]==3600 and j["seed"]==7, j' "$T/f.json" \
    || fail "GET /_mock/faults: $(cat "$T/f.json")"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$HUB/_mock/faults?rate_429=2")" = 400 ] "rate > 1 refused"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$HUB/_mock/faults?bogus=1")" = 400 ] "unknown key refused"

# ---- 429 with Retry-After and RateLimit, on both ports -------------------------------
faults "rate_429=1&retry_after=3"
grep -q '"rate_429":1' "$T/faults.json" || fail "POST answers the new settings"
curl -sS -I "$HUB/org/m/resolve/main/config.json" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 429 ] "hub 429"
check [ "$(hdr "$T/h" Retry-After)" = 3 ] "Retry-After: 3"
check [ "$(hdr "$T/h" RateLimit)" = '"resolvers";r=0;t=3' ] "RateLimit header"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-9 "$LOC")" = 429 ] "CDN 429"
faults "rate_429=0&rate_503=1&status_on=hub"
check [ "$(curl -s -o /dev/null -w '%{http_code}' "$HUB/org/m/resolve/main/config.json")" = 503 ] "hub 503"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-9 "$LOC")" = 206 ] "status_on=hub spares the CDN"
faults "status_on=cdn"
check [ "$(curl -s -o /dev/null -w '%{http_code}' "$HUB/org/m/resolve/main/config.json")" = 200 ] "status_on=cdn spares the hub"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-9 "$LOC")" = 503 ] "CDN 503"
faults "clear=1"

# ---- a seeded share: about half, and the same sequence again after reseeding ------------
seq_of() { local i s=""; for i in $(seq 24); do s+=$(curl -s -o /dev/null -w '%{http_code} ' "$HUB/org/m/resolve/main/config.json"); done; echo "$s"; }
faults "rate_503=0.5&seed=42"
A=$(seq_of)
faults "seed=42"
B=$(seq_of)
check [ "$A" = "$B" ] "same seed, same faulted requests ($A / $B)"
n=$(echo "$A" | tr ' ' '\n' | grep -c 503)
[ "$n" -ge 4 ] && [ "$n" -le 20 ] || fail "rate 0.5 faulted $n of 24"
faults "clear=1"

# ---- reset after K bytes ---------------------------------------------------------------------
faults "rate_reset=1&reset_after=100000"
curl -sS "$LOC" -o "$T/body" 2>"$T/err"
rc=$?
[ $rc -eq 56 ] || [ $rc -eq 18 ] || fail "reset: curl exit $rc ($(cat "$T/err"))"
[ "$(stat -c %s "$T/body")" -le 100000 ] || fail "reset: more than K bytes arrived"
faults "clear=1"

# ---- truncation: a clean close before Content-Length -----------------------------------------
faults "rate_truncate=1&truncate_after=50000"
curl -sS -r 0-199999 "$LOC" -D "$T/h" -o "$T/body" 2>"$T/err"
rc=$?
check [ $rc -eq 18 ] "truncate: curl sees a partial file (exit $rc)"
check [ "$(hdr "$T/h" Content-Length)" = 200000 ] "truncate: Content-Length still promises 200000"
check [ "$(stat -c %s "$T/body")" = 50000 ] "truncate: exactly 50000 bytes"
faults "truncate_after=0"   # 0: half the body
curl -sS "$LOC" -o "$T/body" 2>/dev/null
check [ "$(stat -c %s "$T/body")" = 2097152 ] "truncate_after=0 sends half"
faults "clear=1"

# ---- 200 ignoring the Range ---------------------------------------------------------------------
faults "rate_ignore_range=1"
curl -sS -r 10-19 "$LOC" -D "$T/h" -o "$T/body"
check [ "$(status "$T/h")" = 200 ] "ignored Range gives 200"
check cmp -s "$T/body" "$M/$ST" "ignored Range sends the whole file"
faults "clear=1"

# ---- stalls: before the answer, and mid-body ---------------------------------------------------
faults "rate_stall=1&stall_secs=1&stall_at=before"
t0=$(now); curl -sS -r 0-9 "$LOC" -o "$T/body"; dt=$(elapsed "$t0")
ge "$dt" 0.9 || fail "stall before: only ${dt}s"
check [ "$(stat -c %s "$T/body")" = 10 ] "stall before: body complete"
faults "stall_at=mid"
t0=$(now); curl -sS -r 0-999999 "$LOC" -o "$T/body"; dt=$(elapsed "$t0")
ge "$dt" 0.9 || fail "stall mid: only ${dt}s"
dd if="$M/$ST" bs=1000000 count=1 status=none | cmp -s - "$T/body" || fail "stall mid: bytes differ"
faults "clear=1"

# ---- bandwidth cap ---------------------------------------------------------------------------------
t0=$(now); curl -sS -r 0-2097151 "$LOC" -o /dev/null; fast=$(elapsed "$t0")
faults "bw=2MiB"
t0=$(now); curl -sS -r 0-2097151 "$LOC" -o "$T/body"; slow=$(elapsed "$t0")
ge "$slow" 0.7 || fail "2 MiB at 2 MiB/s took only ${slow}s"
ge 3.0 "$slow" || fail "2 MiB at 2 MiB/s took ${slow}s"
ge 0.5 "$fast" || fail "uncapped 2 MiB took ${fast}s"
check [ "$(stat -c %s "$T/body")" = 2097152 ] "capped body complete"
echo "bandwidth: uncapped ${fast}s, capped at 2 MiB/s ${slow}s"
faults "clear=1"

# ---- the log records faults and real byte counts ------------------------------------------------
/usr/bin/python3 - "$T/req.log" <<'EOF' || fail "request log faults"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
def one(fault, **kw):
    m = [l for l in L if l["fault"] == fault and all(l[k] == v for k, v in kw.items())]
    assert m, (fault, kw)
    return m[0]
one("429", port="hub", status=429)
one("429", port="cdn", status=429)
one("503", port="hub", status=503)
one("503", port="cdn", status=503)
assert one("reset", status=200)["bytes"] == 100000
assert one("truncate", status=206, range="bytes=0-199999")["bytes"] == 50000
assert one("ignore_range", status=200, range="bytes=10-19")["bytes"] == 4194304
one("stall", status=206)
one("stall_mid", status=206)
assert one("bw", status=206)["bytes"] == 2097152
assert all(not l["path"].startswith("/_mock") for l in L)
EOF
kill -TERM "$PID_hubmock"
wait "$PID_hubmock"
rc=$?
check [ $rc -eq 0 ] "hubmock exits 0 on SIGTERM after the faults (got $rc; see $T/hubmock.log)"
echo "test_hubmock_faults: ok"
