#!/usr/bin/env bash
# bin/hubget (fetcher/hub.c) against hubmock: resolve, ranges through the
# 302, whole files, the token kept off the CDN, typed error messages, refusal
# of bad answers (200 to a Range, truncation, reset, stall), revision pinning.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/hubget" ] || fail "$BIN/hubget not built"
[ -x "$BIN/hubmock" ] || fail "$BIN/hubmock not built"
command -v curl >/dev/null || skip "curl CLI not installed"

M1=$T/m1 M2=$T/m2
mkdir -p "$M1" "$M2"
ST=model-00001-of-000001.safetensors
head -c 5000000 /dev/urandom >"$M1/$ST"
printf '{"v":1}\n' >"$M1/config.json"
cp "$M1/$ST" "$M2/"
printf '{"v":2}\n' >"$M2/config.json"
SHA=$(sha256sum "$M1/$ST" | cut -d' ' -f1)
TOKEN=hf_test_token_123
start_hubmock --repo org/m="$M1" --repo "org/m@refs/pr/1=$M2" --token "$TOKEN" --log "$T/req.log"

export HF_TOKEN=$TOKEN
unset HUGGING_FACE_HUB_TOKEN HF_TOKEN_PATH HF_HUB_DISABLE_IMPLICIT_TOKEN
export HF_HOME=$T/hfhome
G() { "$BIN/hubget" --endpoint "$HUB" "$@"; }
faults() { curl -sS -f -X POST "$HUB/_mock/faults?$1" -o /dev/null || fail "POST /_mock/faults?$1"; }
expect_fail() {   # expect_fail REGEX what -- hubget args...
    local re=$1 what=$2; shift 3
    if G "$@" >"$T/out" 2>"$T/err"; then fail "$what: hubget succeeded"; fi
    echo "$what -> $(cat "$T/err")"
    grep -qE "$re" "$T/err" || fail "$what: message '$(cat "$T/err")' lacks /$re/"
}

# ---- --info: what resolve found ----------------------------------------------------
G hf://org/m "$ST" --info >"$T/info" || fail "hubget --info: $(cat "$T/info")"
grep -qx "etag     $SHA" "$T/info" || fail "etag is the sha256: $(cat "$T/info")"
grep -qx "size     5000000" "$T/info" || fail "size"
grep -qx "lfs      yes" "$T/info" || fail "lfs"
grep -qE "^location $CDN/xet-bridge-us/" "$T/info" || fail "location is the CDN"
C1=$(sed -n 's/^commit   //p' "$T/info")
[[ $C1 =~ ^[0-9a-f]{40}$ ]] || fail "commit '$C1'"
G hf://org/m config.json --info >"$T/info2"
grep -qx "lfs      no" "$T/info2" || fail "config.json is not LFS"
grep -qE "^location $HUB/org/m/resolve/$C1/config.json$" "$T/info2" || fail "small file location pinned to the commit: $(cat "$T/info2")"

# ---- bytes: ranges through the redirect, whole files ------------------------------------
for r in 0-0 0-99 12345-1234566 4999000-4999999; do
    a=${r%-*} b=${r#*-}
    G hf://org/m "$ST" --range "$r" -o "$T/part" || fail "range $r"
    dd if="$M1/$ST" bs=1M iflag=skip_bytes,count_bytes skip="$a" count=$((b - a + 1)) status=none >"$T/want"
    cmp -s "$T/part" "$T/want" || fail "range $r differs from the file"
done
G hf://org/m "$ST" --range 4999990- >"$T/part" || fail "open range"
tail -c 10 "$M1/$ST" | cmp -s - "$T/part" || fail "open range bytes"
G hf://org/m "$ST" -o "$T/whole" && cmp -s "$T/whole" "$M1/$ST" || fail "whole LFS file"
G hf://org/m config.json >"$T/cfg" && cmp -s "$T/cfg" "$M1/config.json" || fail "whole small file"
expect_fail 'outside the file' "range past the end" -- hf://org/m "$ST" --range 4999999-5000000

# ---- the token goes to the hub, never to the CDN ------------------------------------------
/usr/bin/python3 - "$T/req.log" <<'EOF' || fail "token seen on the CDN"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
cdn = [l for l in L if l["port"] == "cdn"]
hub = [l for l in L if l["port"] == "hub"]
assert len(cdn) >= 6 and all(not l["auth"] for l in cdn), cdn
assert hub and all(l["auth"] for l in hub), hub
EOF

# ---- typed errors with what to do ------------------------------------------------------------
expect_fail 'repository org/nope not found' "RepoNotFound" -- hf://org/nope config.json
expect_fail "revision 'v9' not found in org/m" "RevisionNotFound" -- hf://org/m@v9 config.json
expect_fail "file 'nope.json' not found in org/m at revision 'main', commit $C1" "EntryNotFound" -- hf://org/m nope.json
HF_TOKEN= expect_fail 'gated \(HTTP 401\).*set HF_TOKEN.*accepted the licence' "gated, no token" -- hf://org/m config.json
HF_TOKEN=wrong expect_fail 'gated \(HTTP 403\)' "gated, wrong token" -- hf://org/m config.json
mkdir -p "$HF_HOME"; printf '%s\n' "$TOKEN" >"$HF_HOME/token"
HF_TOKEN= G hf://org/m config.json --info >/dev/null || fail "token from \$HF_HOME/token"
expect_fail 'org/name' "bad spec" -- hf://justname config.json

# ---- revisions: refs/pr/1 (encoded), pinning to a commit across a move --------------------------
G "hf://org/m@refs/pr/1" config.json >"$T/cfg" && cmp -s "$T/cfg" "$M2/config.json" || fail "refs/pr/1"
curl -sS -f -X POST "$HUB/_mock/repo?repo=org/m&main=$M2" -o /dev/null || fail "move main"
G hf://org/m config.json >"$T/cfg" && cmp -s "$T/cfg" "$M2/config.json" || fail "main moved"
G "hf://org/m@$C1" config.json >"$T/cfg" && cmp -s "$T/cfg" "$M1/config.json" || fail "pinned commit keeps old bytes"

# ---- bad answers are refused and nothing is kept ------------------------------------------------
faults "rate_ignore_range=1"
expect_fail 'ignored the Range' "200 to a Range" -- hf://org/m "$ST" --range 0-99 -o "$T/bad"
[ ! -e "$T/bad" ] || fail "a refused range left $T/bad"
faults "clear=1&rate_truncate=1&truncate_after=1000"
expect_fail 'body ended after 1000 of 100000|got 1000 of 100000' "truncated body" -- hf://org/m "$ST" --range 0-99999 -o "$T/bad"
[ ! -e "$T/bad" ] || fail "a truncated range left $T/bad"
faults "clear=1&rate_reset=1&reset_after=20000"
expect_fail 'reset|Recv failure|body ended' "reset mid-body" -- hf://org/m "$ST" --range 0-99999 -o "$T/bad"
faults "clear=1&rate_429=1&retry_after=4"
expect_fail 'HTTP 429.*retry after 4 s' "429" -- hf://org/m config.json --info
faults "clear=1&rate_503=1&status_on=cdn"
expect_fail 'HTTP 503' "503 from the CDN" -- hf://org/m "$ST" --range 0-9
faults "clear=1&rate_stall=1&stall_secs=4&stall_at=mid"
t0=$(date +%s)
expect_fail 'no progress' "stall" -- hf://org/m "$ST" --range 0-999999 --stall-timeout 1
[ $(( $(date +%s) - t0 )) -le 3 ] || fail "stall was not cut by --stall-timeout 1"
faults "clear=1"
G hf://org/m "$ST" --range 0-99 -o "$T/ok" || fail "works again after clearing faults"
kill -TERM "$PID_hubmock"
wait "$PID_hubmock"
rc=$?
check [ $rc -eq 0 ] "hubmock exits 0 on SIGTERM after the faults (got $rc; see $T/hubmock.log)"
echo "test_hubget: ok"
