#!/usr/bin/env bash
# The Hub mirror (contrib/nginx, docs/mirror.md): a real nginx, rendered
# from the shipped config for loopback, in front of a gated hubmock serving
# the k3 slice (17,547,264-byte experts at arbitrary offsets).
#
# - shoald A warms through the mirror: no byte is fetched from the CDN twice
#   and the whole model is fetched exactly once (hubmock's log); the bytes
#   pulled against the bytes needed are printed for a manifest, three lone
#   experts and the whole warm (the figures in docs/mirror.md).
# - shoald B, a second home, warms the same: 0 CDN data requests (only the
#   1-byte signature checks, one per file), its cache verifies (every
#   object's XXH3; --deep: the whole files it holds against their etags).
# - Gating: no token -> 401, a wrong one -> 403, also for cached small
#   files; a cached CDN path with a forged, missing or expired signature ->
#   403; no Authorization ever reaches the CDN; no open proxy.
# - The official @huggingface/hub npm client downloads through the mirror.
# - main moves to a copy with one changed shard and one changed small file:
#   those are fetched again, the unchanged shards are not.
source "$(dirname "$0")/lib.sh"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || skip "nginx is not installed (make deps installs it)"
"$NGINX" -V 2>&1 | grep -q -- --with-http_slice_module || skip "this nginx lacks the slice module"
for b in shoald shoalc shoal hubmock mkmodel; do [ -x "$BIN/$b" ] || fail "$BIN/$b not built"; done
command -v node >/dev/null || skip "node is not installed"
[ -d "$ROOT/tests/node/node_modules/@huggingface/hub" ] || skip "the @huggingface/hub npm client is missing (make deps)"

TOKEN=hf_mirrortest   # huggingface.js wants the hf_ prefix
EXPERT=17547264
"$BIN/mkmodel" --quiet --preset slice --experts 8 --layers 2 --out "$T/m" || fail "mkmodel"
start_hubmock --repo t/k3s="$T/m" --token "$TOKEN" --small-redirect --log "$T/hub.jsonl"
M=hf://t/k3s
HUBPORT=${HUB##*:}
CDNPORT=${CDN##*:}

# ---- the mirror: the shipped config, rendered for loopback ------------------
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
MIRROR=http://127.0.0.1:$PORT
user=()
[ "$(id -u)" = 0 ] && user=(RUN_USER=root)   # workers must reach $T (mode 0700)
"$ROOT/contrib/nginx/render.sh" --standalone "$T/ngx" LISTEN="127.0.0.1:$PORT" HUB_URL="$HUB" \
    CDN_SCHEME=http CDN_HOSTS="127.0.0.1:$CDNPORT" CACHE_DIR="$T/ngx/cache" CACHE_SIZE=4g \
    RESOLVER=127.0.0.1 WORKERS=2 "${user[@]}" 2> "$T/render.log" || fail "render.sh: $(cat "$T/render.log")"
"$NGINX" -t -q -p "$T/ngx" -c "$T/ngx/nginx.conf" || fail "nginx -t refused the rendered config"
bg nginx "$NGINX" -p "$T/ngx" -c "$T/ngx/nginx.conf"
for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$MIRROR/api/models/t/k3s" -H "Authorization: Bearer $TOKEN")
    [ "$code" = 200 ] && break
    kill -0 "$PID_nginx" 2>/dev/null || fail "nginx exited: $(cat "$T/nginx.log" "$T/ngx/error.log" 2>/dev/null)"
    sleep 0.1
done
[ "$code" = 200 ] || fail "the mirror did not answer the Hub's API ($code)"

# hubmock's log from line $1 on: CDN data requests (the checks are the
# 1-byte "bytes=0-0" GETs) and whether any byte of a file came twice.
cdn_stats() {
    python3 - "$T/hub.jsonl" "${1:-1}" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]).readlines()[int(sys.argv[2]) - 1:]]
cdn = [r for r in rows if r["port"] == "cdn"]
checks = [r for r in cdn if r["range"] == "bytes=0-0"]
data = [r for r in cdn if r["range"] != "bytes=0-0"]
spans, twice = {}, 0
for r in data:
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", r["range"] or "")
    assert m and r["status"] == 206, r
    spans.setdefault(r["path"].split("?")[0], []).append((int(m[1]), int(m[1]) + r["bytes"]))
for s in spans.values():
    end = 0
    for a, e in sorted(s):
        twice += max(0, min(e, end) - a)
        end = max(end, e)
print(json.dumps({"data": len(data), "bytes": sum(r["bytes"] for r in data), "checks": len(checks),
                  "twice": twice, "auth": sum(r["auth"] for r in cdn),
                  "paths": sorted(spans), "hub_auth": sum(r["auth"] for r in rows if r["port"] == "hub")}))
EOF
}
jget() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
mark() { echo $(( $(wc -l < "$T/hub.jsonl") + 1 )); }

export HF_ENDPOINT=$MIRROR HF_TOKEN=$TOKEN
start_shoald() {   # start_shoald NAME: shoald on $T/NAME, through the mirror
    bg "shoald_$1" "$BIN/shoald" --home "$T/$1" --no-fsync --log "$T/shoald_$1.out" --parallel 8
    wait_line "$T/shoald_$1.out" 'ready on' 20 || fail "shoald $1 did not start"
}
# LFS files: on the CDN (hubmock: *.safetensors and tiktoken.model always).
lfs=("$T"/m/*.safetensors "$T/m/tiktoken.model")
lfs_total=$(stat -c %s "${lfs[@]}" | awk '{s += $1} END {print s}')

# ---- A: the manifest, three lone experts, then everything -------------------
start_shoald a
n0=$(mark)
"$BIN/shoalc" --home "$T/a" get $M f:config.json --quiet > "$T/a0" || fail "A: open: $(cat "$T/a0")"
s_manifest=$(cdn_stats "$n0")
n1=$(mark)
"$BIN/shoalc" --home "$T/a" get $M 1:0 1:3 1:6 --check "$T/m" --quiet > "$T/a1" || fail "A: experts"
grep -q '^hits 0 misses 3 .* checked 3' "$T/a1" || fail "A: three experts: $(cat "$T/a1")"
s_lone=$(cdn_stats "$n1")
"$BIN/shoal" --home "$T/a" warm $M --wait > "$T/a2" 2>&1 || fail "A: warm: $(tail -3 "$T/a2")"
s_a=$(cdn_stats "$n0")
[ "$(jget "$s_a" twice)" = 0 ] || fail "A: some bytes came from the CDN twice: $s_a"
[ "$(jget "$s_a" bytes)" = "$lfs_total" ] \
    || fail "A: the CDN sent $(jget "$s_a" bytes) bytes for $lfs_total bytes of LFS files: $s_a"
[ "$(jget "$s_a" auth)" = 0 ] || fail "an Authorization header reached the CDN: $s_a"
[ "$(jget "$s_a" hub_auth)" -gt 0 ] || fail "the token never reached the Hub: $s_a"

# ---- B: a second home, the same warm, served by nginx -----------------------
start_shoald b
n2=$(mark)
"$BIN/shoal" --home "$T/b" warm $M --wait > "$T/b1" 2>&1 || fail "B: warm: $(tail -3 "$T/b1")"
s_b=$(cdn_stats "$n2")
[ "$(jget "$s_b" data)" = 0 ] || fail "B: $(jget "$s_b" data) CDN data requests (want 0): $s_b"
[ "$(jget "$s_b" checks)" -le ${#lfs[@]} ] || fail "B: more than one signature check per file: $s_b"
"$BIN/shoal" --home "$T/b" verify --deep --json > "$T/b.verify" || fail "B: verify: $(cat "$T/b.verify")"
python3 -c '
import json, sys
v = json.load(open(sys.argv[1])); d = v["deep"]
assert v["schema"] == "shoal.verify" and v["bad"] == 0 and v["missing"] == 0 and v["checked"] > 0, v
assert d["bad"] == 0 and d["ok"] == d["complete"] >= 4, d' "$T/b.verify" \
    || fail "B: verify: $(cat "$T/b.verify")"
"$BIN/shoalc" --home "$T/b" get $M 1:0 1:1 1:2 1:3 1:4 1:5 1:6 1:7 t:language_model.lm_head.weight \
    t:language_model.model.layers.0.mlp.up_proj.weight --check "$T/m" --quiet > "$T/b2" || fail "B: GET"
grep -q '^hits 10 misses 0 .* checked 10 mismatched 0' "$T/b2" || fail "B: $(cat "$T/b2")"

# ---- gating, signatures, no open proxy ---------------------------------------
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
R=$MIRROR/t/k3s/resolve/main
[ "$(code -I "$R/config.json")" = 401 ] || fail "no token: want 401"
curl -sI "$R/config.json" | grep -qi '^X-Error-Code: GatedRepo' || fail "no token: X-Error-Code missing"
[ "$(code -I "$R/config.json" -H 'Authorization: Bearer wrong')" = 403 ] || fail "wrong token: want 403"
small=$(curl -sI "$R/config.json" -H "Authorization: Bearer $TOKEN" | sed -n 's/^Location: *//Ip' | tr -d '\r')
case $small in /api/resolve-cache/*) ;; *) fail "small file: no 307 to resolve-cache ($small)" ;; esac
curl -s -D "$T/h.small" -o "$T/small" "$MIRROR$small" -H "Authorization: Bearer $TOKEN"
grep -qi '^X-Mirror-Cache: HIT' "$T/h.small" || fail "small file not from the mirror's cache: $(cat "$T/h.small")"
cmp -s "$T/small" "$T/m/config.json" || fail "small file: wrong bytes"
[ "$(code "$MIRROR$small")" = 401 ] || fail "a cached small file without a token: want 401"
[ "$(code "$MIRROR$small" -H 'Authorization: Bearer wrong')" = 403 ] || fail "cached small file, wrong token: want 403"
[ "$(code -I "$R/model-00003-of-000003.safetensors")" = 401 ] || fail "LFS resolve without token: want 401"
loc=$(curl -sI "$R/model-00003-of-000003.safetensors" -H "Authorization: Bearer $TOKEN" \
      | sed -n 's/^Location: *//Ip' | tr -d '\r')
case $loc in "$MIRROR/_cdn/127.0.0.1:$CDNPORT/xet-bridge-us/"*"?Expires="*) ;;
    *) fail "the 302 was not rewritten to the mirror: $loc" ;; esac
n3=$(mark)
rg=(-H 'Range: bytes=1000-1999')
[ "$(code "${rg[@]}" "$loc")" = 206 ] || fail "signed URL: want 206"
[ "$(code "${rg[@]}" "${loc%%\?*}")" = 403 ] || fail "cached path without a signature: want 403"
bad=${loc%?}0; [ "$bad" != "$loc" ] || bad=${loc%?}1
[ "$(code "${rg[@]}" "$bad")" = 403 ] || fail "cached path with a forged signature: want 403"
[ "$(code -X POST "${rg[@]}" "$loc")" = 403 ] || fail "POST to a CDN path: want 403"
s_g=$(cdn_stats "$n3")
[ "$(jget "$s_g" data)" = 0 ] || fail "cached bytes went upstream again: $s_g"
curl -fsS -X POST "$HUB/_mock/faults?cdn_ttl=1" > /dev/null || fail "faults"
old=$(curl -sI "$R/model-00003-of-000003.safetensors" -H "Authorization: Bearer $TOKEN" \
      | sed -n 's/^Location: *//Ip' | tr -d '\r')
curl -fsS -X POST "$HUB/_mock/faults?cdn_ttl=3600" > /dev/null || fail "faults"
sleep 2.1
[ "$(code "${rg[@]}" "$old")" = 403 ] || fail "an expired signed URL: want 403"
for p in "/_cdn/example.com/x" "/_cdn/127.0.0.1:$HUBPORT/api/models/t/k3s" \
         "/_cdn/127.0.0.1:$CDNPORT/../_mock/faults" "/_cdn/127.0.0.1:$CDNPORT/.x/y"; do
    [ "$(code "$MIRROR$p")" = 404 ] || fail "$p: the mirror must refuse it (404)"
done

# ---- the official npm client --------------------------------------------------
n4=$(mark)
node "$ROOT/tests/clients/hf_download.js" --hub "$MIRROR" --repo t/k3s --token "$TOKEN" \
    config.json model-00003-of-000003.safetensors > "$T/js" 2> "$T/js.err" || fail "hf_download.js: $(cat "$T/js.err")"
for f in config.json model-00003-of-000003.safetensors; do
    want=$(sha256sum "$T/m/$f" | cut -d' ' -f1)
    grep -q "\"path\":\"$f\".*\"sha256\":\"$want\"" "$T/js" || fail "npm client, $f: $(cat "$T/js")"
done
grep -q '"url":"/_cdn/127.0.0.1:'"$CDNPORT"'/' "$T/js" || fail "npm client did not use the mirror's CDN path: $(cat "$T/js")"
s_js=$(cdn_stats "$n4")
[ "$(jget "$s_js" data)" = 0 ] || fail "npm client: bytes went upstream again: $s_js"
node "$ROOT/tests/clients/hf_download.js" --hub "$MIRROR" --repo t/k3s --expect-error 401 config.json \
    > /dev/null 2> "$T/js.err" || fail "npm client without a token: $(cat "$T/js.err")"

# ---- a new commit: what changed is fetched again, nothing else ---------------
mkdir "$T/m2"
cp -l "$T"/m/* "$T/m2/"
S2=model-00002-of-000003.safetensors
rm "$T/m2/$S2" "$T/m2/tokenizer_config.json"
cp "$T/m/$S2" "$T/m2/$S2"
printf '\xa5\x5a' | dd of="$T/m2/$S2" bs=1 seek=$((309519224 + 1000)) conv=notrunc status=none   # expert 1:2
{ cat "$T/m/tokenizer_config.json"; echo; } > "$T/m2/tokenizer_config.json"
curl -fsS -X POST "$HUB/_mock/repo?repo=t/k3s&main=$T/m2" > /dev/null || fail "move main"
n5=$(mark)
start_shoald c
"$BIN/shoalc" --home "$T/c" get $M 1:2 1:5 f:tokenizer_config.json t:language_model.lm_head.weight \
    --check "$T/m2" --quiet > "$T/c1" || fail "C: GET: $(cat "$T/c1")"
grep -q '^hits 0 misses 4 .* checked 4 mismatched 0' "$T/c1" || fail "C: $(cat "$T/c1")"
s_c=$(cdn_stats "$n5")
new_sha=$(sha256sum "$T/m2/$S2" | cut -d' ' -f1)
python3 - "$s_c" "$new_sha" <<'EOF' || fail "after the move: $s_c"
import json, sys
s = json.loads(sys.argv[1])
assert s["twice"] == 0 and s["data"] > 0, s
assert all(p.endswith("/" + sys.argv[2]) for p in s["paths"]), "only the changed shard may be fetched"
EOF
new_commit=$(curl -fsS "$HUB/_mock/repo?repo=t/k3s" | python3 -c 'import json, sys; print(json.load(sys.stdin)["refs"]["main"])')
grep -q "\"GET\",\"path\":\"/api/resolve-cache/models/t/k3s/$new_commit/tokenizer_config.json" "$T/hub.jsonl" \
    || fail "the changed small file was not fetched again"

# ---- figures ---------------------------------------------------------------
mb() { awk -v b="$1" 'BEGIN {printf "%.1f MB", b / 1e6}'; }
echo "manifest (3 shard headers): pulled $(mb "$(jget "$s_manifest" bytes)") in $(jget "$s_manifest" data) requests"
echo "3 lone experts ($(mb $((3 * EXPERT)))): pulled $(mb "$(jget "$s_lone" bytes)") in $(jget "$s_lone" data) requests"
echo "A, whole warm: pulled $(mb "$(jget "$s_a" bytes)") for $(mb "$lfs_total") of LFS files, $(jget "$s_a" data) requests, $(jget "$s_a" checks) checks"
echo "B, whole warm: $(jget "$s_b" data) CDN data requests, $(jget "$s_b" checks) checks"
echo "after the move: pulled $(mb "$(jget "$s_c" bytes)") of the changed shard in $(jget "$s_c" data) requests"

for n in a b c; do
    pid=PID_shoald_$n
    kill -TERM "${!pid}"
    rc=0; wait "${!pid}" || rc=$?
    [ "$rc" = 0 ] || fail "shoald $n exited $rc on SIGTERM"
done
kill -QUIT "$PID_nginx"; wait "$PID_nginx" 2>/dev/null
! grep -q '\[\(emerg\|alert\|crit\)\]' "$T/ngx/error.log" || fail "nginx: $(grep '\[\(emerg\|alert\|crit\)\]' "$T/ngx/error.log")"
echo "ok"
