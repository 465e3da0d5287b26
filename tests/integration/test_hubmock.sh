#!/usr/bin/env bash
# hubmock against the curl CLI: the Hub's answers, redirects, ranges, errors,
# signed-URL expiry, refs and revision moves, the request log, SIGTERM.
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl CLI not installed"
[ -x "$BIN/hubmock" ] || fail "$BIN/hubmock not built"

# ---- a small model directory, and a second version of it -----------------
M1=$T/m1 M2=$T/m2
mkdir -p "$M1/sub" "$M2"
head -c 3000000 /dev/urandom >"$M1/model-00001-of-000001.safetensors"
head -c 1500000 /dev/urandom >"$M1/data.bin"          # LFS by size (threshold 1M)
printf '{"model_type":"kimi_k3","v":1}\n' >"$M1/config.json"
printf 'hello hub\n' >"$M1/sub/x y.txt"
cp "$M1/model-00001-of-000001.safetensors" "$M1/data.bin" "$M2/"
printf '{"model_type":"kimi_k3","v":2}\n' >"$M2/config.json"
ST=model-00001-of-000001.safetensors
SIZE=3000000
SHA=$(sha256sum "$M1/$ST" | cut -d' ' -f1)
GITSHA=$(git hash-object "$M1/config.json" 2>/dev/null \
         || /usr/bin/python3 -c 'import hashlib,sys;d=open(sys.argv[1],"rb").read();print(hashlib.sha1(b"blob %d\0"%len(d)+d).hexdigest())' "$M1/config.json")

start_hubmock --repo org/m="$M1" --repo "org/m@refs/pr/1=$M2" --repo org/m@v1="$M1" \
    --lfs-threshold 1M --log "$T/req.log"

# hdr FILE NAME: a header's value from a curl -D dump (last response, no CR)
hdr() { tr -d '\r' <"$1" | awk -v n="$(echo "$2" | tr A-Z a-z)" \
    'BEGIN{FS=": "} /^HTTP\//{delete h} {k=tolower($1); sub(/^[^:]*: /,""); h[k]=$0} END{print h[n]}'; }
status() { tr -d '\r' <"$1" | awk '/^HTTP\//{s=$2} END{print s}'; }

# ---- LFS: HEAD -> 302 to the CDN with the linked headers ------------------
curl -sS -I "$HUB/org/m/resolve/main/$ST" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 302 ] "LFS HEAD is a 302"
LOC=$(hdr "$T/h" Location)
COMMIT=$(hdr "$T/h" X-Repo-Commit)
case $LOC in "$CDN"/xet-bridge-us/*/"$SHA"\?Expires=*\&Signature=*) ;; *) fail "Location '$LOC' is not a signed CDN URL";; esac
[[ $COMMIT =~ ^[0-9a-f]{40}$ ]] || fail "X-Repo-Commit '$COMMIT'"
check [ "$(hdr "$T/h" X-Linked-Etag)" = "\"$SHA\"" ] "X-Linked-Etag is the quoted sha256"
check [ "$(hdr "$T/h" X-Linked-Size)" = "$SIZE" ] "X-Linked-Size"
[[ $(hdr "$T/h" ETag) =~ ^\"[0-9a-f]{40}\"$ ]] || fail "LFS ETag '$(hdr "$T/h" ETag)'"
CL=$(hdr "$T/h" Content-Length)
curl -sS "$HUB/org/m/resolve/main/$ST" -D "$T/h2" -o "$T/body"    # GET, not followed
check [ "$(status "$T/h2")" = 302 ] "LFS GET is a 302 too"
check [ "$(stat -c %s "$T/body")" = "$CL" ] "302 Content-Length ($CL) is the redirect body size"
curl -sS -I "$HUB/org/m/resolve/main/data.bin" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 302 ] "a file over --lfs-threshold is LFS"

# ---- small files: 200 with the git blob sha1 -------------------------------
curl -sS "$HUB/org/m/resolve/main/config.json" -D "$T/h" -o "$T/body"
check [ "$(status "$T/h")" = 200 ] "small file GET is 200"
check cmp -s "$T/body" "$M1/config.json" "small file bytes"
check [ "$(hdr "$T/h" ETag)" = "\"$GITSHA\"" ] "small file ETag is the git blob sha1"
check [ "$(hdr "$T/h" X-Repo-Commit)" = "$COMMIT" ] "small file X-Repo-Commit"
check [ "$(hdr "$T/h" Content-Length)" = "$(stat -c %s "$M1/config.json")" ] "small Content-Length"
N=$(curl -sS -I "$HUB/org/m/resolve/main/config.json" -D "$T/h" -o /dev/null -w '%{size_download}')
check [ "$(status "$T/h")" = 200 ] "small file HEAD is 200"
check [ "$(hdr "$T/h" Content-Length)" = "$(stat -c %s "$M1/config.json")" ] "HEAD Content-Length"
check [ "$N" = 0 ] "HEAD has no body"
# raw socket: a HEAD answer ends at the blank line, even with Content-Length
/usr/bin/python3 - "${HUB#http://}" <<'EOF' || fail "HEAD sends no body bytes on the wire"
import socket, sys
host, port = sys.argv[1].split(":")
s = socket.create_connection((host, int(port)))
s.sendall(b"HEAD /org/m/resolve/main/config.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
head, sep, rest = data.partition(b"\r\n\r\n")
assert sep and rest == b"" and b"Content-Length: 31" in head, data
EOF
curl -sS "$HUB/org/m/resolve/main/sub/x%20y.txt" -o "$T/body"
check cmp -s "$T/body" "$M1/sub/x y.txt" "percent-encoded file path"

# ---- the CDN: ranges ---------------------------------------------------------
curl -sS -r 100-1099 "$LOC" -D "$T/h" -o "$T/body"
check [ "$(status "$T/h")" = 206 ] "range a-b is 206"
check [ "$(hdr "$T/h" Content-Range)" = "bytes 100-1099/$SIZE" ] "Content-Range a-b"
check [ "$(hdr "$T/h" Accept-Ranges)" = bytes ] "Accept-Ranges"
check [ "$(hdr "$T/h" Content-Length)" = 1000 ] "206 Content-Length"
dd if="$M1/$ST" bs=100 skip=1 count=10 status=none >"$T/want"
check cmp -s "$T/body" "$T/want" "range a-b bytes"
curl -sS -r 2999990- "$LOC" -D "$T/h" -o "$T/body"
check [ "$(hdr "$T/h" Content-Range)" = "bytes 2999990-2999999/$SIZE" ] "range a-"
check [ "$(stat -c %s "$T/body")" = 10 ] "range a- length"
curl -sS -H 'Range: bytes=-7' "$LOC" -D "$T/h" -o "$T/body"
check [ "$(hdr "$T/h" Content-Range)" = "bytes 2999993-2999999/$SIZE" ] "suffix range -n"
tail -c 7 "$M1/$ST" >"$T/want"
check cmp -s "$T/body" "$T/want" "suffix range bytes"
curl -sS -r "$SIZE-" "$LOC" -D "$T/h" -o "$T/body"
check [ "$(status "$T/h")" = 416 ] "range past the end is 416"
check [ "$(hdr "$T/h" Content-Range)" = "bytes */$SIZE" ] "416 Content-Range bytes */TOTAL"
curl -sS "$LOC" -D "$T/h" -o "$T/body"
check [ "$(status "$T/h")" = 200 ] "no Range is 200"
check cmp -s "$T/body" "$M1/$ST" "whole file through the CDN"
N=$(curl -sS -I "$LOC" -D "$T/h" -o /dev/null -w '%{size_download}')
check [ "$(hdr "$T/h" Content-Length)" = "$SIZE" ] "CDN HEAD Content-Length"
check [ "$N" = 0 ] "CDN HEAD has no body"

# ---- signed URLs: bad signature, expiry ---------------------------------------
BAD=${LOC%Signature=*}Signature=0000000000000000000000000000000000000000000000000000000000000000
check [ "$(curl -s -o /dev/null -w '%{http_code}' "$BAD")" = 403 ] "bad signature is 403"
curl -sS -X POST "$HUB/_mock/faults?cdn_ttl=1" -o /dev/null
SHORT=$(curl -sS -I "$HUB/org/m/resolve/main/$ST" -D - -o /dev/null | tr -d '\r' | sed -n 's/^Location: //p')
check [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-0 "$SHORT")" = 206 ] "fresh short-lived URL works"
sleep 2.2
check [ "$(curl -s -o "$T/body" -w '%{http_code}' -r 0-0 "$SHORT")" = 403 ] "expired URL is 403"
grep -q 'Request has expired' "$T/body" || fail "403 body says the request has expired"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -r 0-0 "$LOC")" = 206 ] "the 1-hour URL still works"
curl -sS -X POST "$HUB/_mock/faults?cdn_ttl=3600" -o /dev/null

# ---- errors ------------------------------------------------------------------
curl -sS -I "$HUB/org/nope/resolve/main/config.json" -D "$T/h" -o /dev/null
check [ "$(status "$T/h")" = 404 ] "missing repo is 404"
check [ "$(hdr "$T/h" X-Error-Code)" = RepoNotFound ] "RepoNotFound"
curl -sS -I "$HUB/org/m/resolve/nope/config.json" -D "$T/h" -o /dev/null
check [ "$(hdr "$T/h" X-Error-Code)" = RevisionNotFound ] "RevisionNotFound"
check [ "$(status "$T/h")" = 404 ] "missing revision is 404"
curl -sS -I "$HUB/org/m/resolve/main/nope.json" -D "$T/h" -o /dev/null
check [ "$(hdr "$T/h" X-Error-Code)" = EntryNotFound ] "EntryNotFound"
check [ "$(hdr "$T/h" X-Repo-Commit)" = "$COMMIT" ] "EntryNotFound carries X-Repo-Commit"
[ -n "$(hdr "$T/h" X-Error-Message)" ] || fail "X-Error-Message"

# ---- refs, commits, the model API ----------------------------------------------
C2=$(curl -sS -I "$HUB/org/m/resolve/refs%2Fpr%2F1/config.json" -D - -o /dev/null | tr -d '\r' | sed -n 's/^X-Repo-Commit: //p')
[[ $C2 =~ ^[0-9a-f]{40}$ ]] && [ "$C2" != "$COMMIT" ] || fail "refs/pr/1 resolves to its own commit ($C2)"
check [ "$(curl -sS "$HUB/org/m/resolve/refs%2Fpr%2F1/config.json")" = '{"model_type":"kimi_k3","v":2}' ] "refs/pr/1 bytes"
check [ "$(curl -sS "$HUB/org/m/resolve/v1/config.json")" = '{"model_type":"kimi_k3","v":1}' ] "branch v1"
check [ "$(curl -sS "$HUB/org/m/resolve/$C2/config.json")" = '{"model_type":"kimi_k3","v":2}' ] "by commit"
curl -sS "$HUB/api/models/org/m/revision/main" -o "$T/info.json"
/usr/bin/python3 - "$T/info.json" "$COMMIT" <<'EOF' || fail "model info API"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sha"] == sys.argv[2], j
names = sorted(s["rfilename"] for s in j["siblings"])
assert names == ["config.json", "data.bin", "model-00001-of-000001.safetensors", "sub/x y.txt"], names
EOF

# ---- moving main: old commits keep their bytes ------------------------------------
curl -sS -X POST "$HUB/_mock/repo?repo=org/m&main=$M2" -o "$T/move.json"
grep -q "\"main\":\"$C2\"" "$T/move.json" || fail "move answer: $(cat "$T/move.json")"
check [ "$(curl -sS "$HUB/org/m/resolve/main/config.json")" = '{"model_type":"kimi_k3","v":2}' ] "main moved"
check [ "$(curl -sS "$HUB/org/m/resolve/$COMMIT/config.json")" = '{"model_type":"kimi_k3","v":1}' ] "old commit keeps old bytes"
check [ "$(curl -sS "$HUB/org/m/resolve/v1/config.json")" = '{"model_type":"kimi_k3","v":1}' ] "other branch unchanged"
check [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$HUB/_mock/repo?repo=org/m&main=$T/none")" = 400 ] "move to a missing dir is refused"

# ---- the request log ----------------------------------------------------------------
/usr/bin/python3 - "$T/req.log" "$SIZE" <<'EOF' || fail "request log"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
size = int(sys.argv[2])
for l in lines:
    assert set(l) == {"port", "method", "path", "range", "status", "bytes", "auth", "fault"}, l
assert not any(l["path"].startswith("/_mock/") for l in lines), "control requests are not logged"
r = [l for l in lines if l["port"] == "cdn" and l["range"] == "bytes=100-1099"]
assert r and r[0]["status"] == 206 and r[0]["bytes"] == 1000 and r[0]["auth"] is False, r
w = [l for l in lines if l["port"] == "cdn" and l["method"] == "GET" and l["range"] is None and l["status"] == 200]
assert w and w[0]["bytes"] == size, w
h = [l for l in lines if l["method"] == "HEAD" and l["port"] == "hub" and l["status"] == 302]
assert h and h[0]["bytes"] == 0 and h[0]["range"] is None, h
e = [l for l in lines if l["status"] == 416]
assert e and e[0]["range"] == "bytes=%d-" % size, e
assert all(l["fault"] is None for l in lines)
EOF

# ---- SIGTERM exits 0 ----------------------------------------------------------------
kill -TERM "$PID_hubmock"
wait "$PID_hubmock"
rc=$?
check [ $rc -eq 0 ] "hubmock exits 0 on SIGTERM (got $rc)"
echo "test_hubmock: ok"
