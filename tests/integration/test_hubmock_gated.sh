#!/usr/bin/env bash
# hubmock with --token (gated repo: 401 / 403 / 200) and --small-redirect
# (small files answer a relative 307 to /api/resolve-cache/...), checked with
# curl and with bin/hubget, which must follow the 307 and keep its query.
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl CLI not installed"
[ -x "$BIN/hubmock" ] && [ -x "$BIN/hubget" ] || fail "hubmock/hubget not built"

M=$T/m
mkdir -p "$M/sub"
head -c 2000000 /dev/urandom >"$M/model-00001-of-000001.safetensors"
printf '{"v":1}\n' >"$M/config.json"
printf 'nested\n' >"$M/sub/a b.txt"
TOKEN=s3cret
start_hubmock --repo org/g="$M" --token "$TOKEN" --small-redirect --log "$T/req.log"

status() { tr -d '\r' <"$1" | awk '/^HTTP\//{s=$2} END{print s}'; }
hdr() { tr -d '\r' <"$1" | awk -v n="$(echo "$2" | tr A-Z a-z)" \
    'BEGIN{FS=": "} /^HTTP\//{delete h} {k=tolower($1); sub(/^[^:]*: /,""); h[k]=$0} END{print h[n]}'; }
AUTH="Authorization: Bearer $TOKEN"

# ---- the gate ---------------------------------------------------------------------
curl -sS -I "$HUB/org/g/resolve/main/config.json" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 401 ] "no token: 401"
check [ "$(hdr "$T/h" X-Error-Code)" = GatedRepo ] "no token: GatedRepo"
hdr "$T/h" X-Error-Message | grep -q 'Access to model org/g is restricted' || fail "401 message"
curl -sS -I -H "Authorization: Bearer nope" "$HUB/org/g/resolve/main/config.json" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 403 ] "wrong token: 403"
check [ "$(hdr "$T/h" X-Error-Code)" = GatedRepo ] "wrong token: GatedRepo"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -H "$AUTH" "$HUB/api/models/org/g/revision/main")" = 200 ] "token: model info"
check [ "$(curl -s -o /dev/null -w '%{http_code}' "$HUB/api/models/org/g/revision/main")" = 401 ] "no token: model info 401"

# ---- small files: relative 307 to resolve-cache, which answers 200 ------------------------
curl -sS -I -H "$AUTH" "$HUB/org/g/resolve/main/sub/a%20b.txt" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 307 ] "small file: 307"
LOC=$(hdr "$T/h" Location)
COMMIT=$(hdr "$T/h" X-Repo-Commit)
case $LOC in "/api/resolve-cache/models/org/g/$COMMIT/sub/a%20b.txt?etag=%22"*"%22") ;; *) fail "307 Location '$LOC'";; esac
curl -sS -H "$AUTH" "$HUB$LOC" -D "$T/h" -o "$T/body"
check [ "$(status "$T/h")" = 200 ] "resolve-cache: 200"
check cmp -s "$T/body" "$M/sub/a b.txt" "resolve-cache bytes"
check [ "$(hdr "$T/h" X-Repo-Commit)" = "$COMMIT" ] "resolve-cache X-Repo-Commit"
E=$(hdr "$T/h" ETag)
case $LOC in *"etag=%22${E//\"/}%22") ;; *) fail "the 307's etag query matches the ETag";; esac
check [ "$(curl -s -o /dev/null -w '%{http_code}' -L "$HUB/org/g/resolve/main/config.json")" = 401 ] "the cache route is gated too"
# LFS files still 302 to the CDN, and the CDN needs no token
L2=$(curl -sS -I -H "$AUTH" "$HUB/org/g/resolve/main/model-00001-of-000001.safetensors" | tr -d '\r' | sed -n 's/^Location: //p')
case $L2 in "$CDN"/*) ;; *) fail "LFS Location '$L2'";; esac
check [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-9 "$L2")" = 206 ] "the CDN needs no token"

# ---- hubget follows the relative 307 and keeps the token on the hub only ----------------------
export HF_TOKEN=$TOKEN
"$BIN/hubget" --endpoint "$HUB" hf://org/g "sub/a b.txt" --info >"$T/info" || fail "hubget --info via 307"
grep -q "^location $HUB/api/resolve-cache/models/org/g/$COMMIT/sub/a%20b.txt?etag=" "$T/info" || fail "location is the resolve-cache URL: $(cat "$T/info")"
grep -qx "size     7" "$T/info" || fail "size from the 200's Content-Length"
"$BIN/hubget" --endpoint "$HUB" hf://org/g "sub/a b.txt" >"$T/body" || fail "hubget via 307"
check cmp -s "$T/body" "$M/sub/a b.txt" "hubget bytes via 307"
"$BIN/hubget" --endpoint "$HUB" hf://org/g model-00001-of-000001.safetensors --range 100-199 >"$T/body" || fail "hubget LFS range"
dd if="$M/model-00001-of-000001.safetensors" bs=100 skip=1 count=1 status=none | cmp -s - "$T/body" || fail "LFS range bytes"
/usr/bin/python3 - "$T/req.log" <<'PY' || fail "log: the token on the hub only"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
cdn = [l for l in L if l["port"] == "cdn"]
assert len(cdn) >= 2 and all(l["auth"] is False for l in cdn), cdn
rc = [l for l in L if l["path"].startswith("/api/resolve-cache/") and l["status"] == 200]
assert rc and all(l["auth"] for l in rc), rc
PY

# ---- SIGINT also exits 0 ------------------------------------------------------------------------
kill -INT "$PID_hubmock"
wait "$PID_hubmock"
rc=$?
check [ $rc -eq 0 ] "hubmock exits 0 on SIGINT (got $rc)"
echo "test_hubmock_gated: ok"
