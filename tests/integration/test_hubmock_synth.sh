#!/usr/bin/env bash
# test_hubmock_synth.sh — hubmock's synthesized repos (--synth): byte for
# byte what mkmodel writes (tiny, slice, a full-width K3 variant), etags that
# are the sha256 of exactly the bytes served, the etag cache, the full K3
# layout served from no disk (96 shard headers, 497,220 tensors, the index),
# the committed K3 etag table still true, the bad= breakages, and the
# faults latency, hub_stall, corrupt (one/all/drift), drip and huge_header
# on synthesized and disk repos.
source "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl CLI not installed"
for b in hubmock mkmodel stinfo; do [ -x "$BIN/$b" ] || fail "$BIN/$b not built"; done
PY=/usr/bin/python3
RANGES="$ROOT/tests/integration/hubmock_ranges.py"

# The full K3 (etags from the committed table) and a full-width 2-layer
# variant (its layer 0, globals and vision shards are K3's: found in the
# table by header; the rest, 0.9 GB, hashed now) in a second hubmock,
# started first so its hashing overlaps the checks on the small models.
bg hubmock_k3 "$BIN/hubmock" --synth org/k3=k3 --synth org/wide=k3,layers=2,experts=2 \
    --synth-cache "$T/etags-k3.txt" --log-level info

check "$BIN/mkmodel" --quiet --out "$T/tiny" "mkmodel tiny"
check "$BIN/mkmodel" --quiet --preset slice --experts 2 --out "$T/slice" "mkmodel slice"
check "$BIN/mkmodel" --quiet --preset k3 --layers 2 --experts 2 --headers-only --out "$T/wide" \
    "mkmodel k3 --layers 2 --experts 2 --headers-only"
start_hubmock --synth org/tiny=tiny --synth org/slice=slice,experts=2 --repo org/disk="$T/tiny" \
    --synth org/badh=tiny,bad=header --synth org/bads=tiny,bad=sha \
    --synth-cache "$T/etags.txt" --log "$T/req.log" --log-level info

hdr() { tr -d '\r' <"$1" | awk -v n="$(echo "$2" | tr A-Z a-z)" \
    'BEGIN{FS=": "} /^HTTP\//{delete h} {k=tolower($1); sub(/^[^:]*: /,""); h[k]=$0} END{print h[n]}'; }
loc() { curl -sS -I "$HUB/$1/resolve/main/$2" | tr -d '\r' | sed -n 's/^Location: //p'; }
faults() { curl -sS -f -X POST "$HUB/_mock/faults?$1" -o /dev/null || fail "POST /_mock/faults?$1"; }
secs() { curl -sS -w '%{time_total}' "$@"; }     # give -o
ge() { $PY -c "import sys; sys.exit(0 if float('$1') >= float('$2') else 1)"; }
truth() { dd if="$1" bs=1 skip="$2" count="$3" status=none; }
ST=model-00002-of-000003.safetensors

# ---- the same repo as the directory mkmodel writes --------------------------------
curl -sS "$HUB/api/models/org/tiny" -o "$T/tiny.json"
curl -sS "$HUB/api/models/org/disk" -o "$T/disk.json"
$PY - "$T/tiny.json" "$T/disk.json" "$T/tiny" <<'EOF' || fail "/api/models of a synthesized repo"
import json, os, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
files = {f: os.path.getsize(os.path.join(sys.argv[3], f)) for f in os.listdir(sys.argv[3])}
assert {s["rfilename"]: s["size"] for s in a["siblings"]} == files, a["siblings"]
assert a["sha"] == b["sha"], "same bytes, same commit as the disk repo"
EOF
check $PY "$RANGES" "$HUB" org/tiny "$T/tiny" "tiny: ranges equal mkmodel's files"
check $PY "$RANGES" "$HUB" org/slice "$T/slice" --seed 2 "slice: ranges equal mkmodel's files"
for f in "$T"/tiny/* "$T"/slice/model-*.safetensors; do
    r=$(basename "$(dirname "$f")") n=$(basename "$f")
    curl -sS -I "$HUB/org/$r/resolve/main/$n" -D "$T/h" -o /dev/null
    case $n in
    *.safetensors|tiktoken.model)
        check [ "$(hdr "$T/h" X-Linked-Etag)" = "\"$(sha256sum <"$f" | cut -d' ' -f1)\"" ] "$r/$n: X-Linked-Etag is the sha256"
        grep -q "$(sha256sum <"$f" | cut -d' ' -f1)" "$T/etags.txt" || fail "$r/$n: not in the etag cache" ;;
    *)
        want=$($PY -c 'import hashlib,sys;d=open(sys.argv[1],"rb").read();print(hashlib.sha1(b"blob %d\0"%len(d)+d).hexdigest())' "$f")
        check [ "$(hdr "$T/h" ETag)" = "\"$want\"" ] "$r/$n: ETag is the git blob sha1" ;;
    esac
done
# 30 files; tiny's are shared by badh and bads but for badh's cut shard.
grep -q ' 0 etags known (committed table or cache), 17 to hash' "$T/hubmock.log" \
    || fail "first start: $(grep 'etags known' "$T/hubmock.log")"
# A second start finds every etag in the cache file.
bg hubmock2 "$BIN/hubmock" --synth org/slice=slice,experts=2 --synth-cache "$T/etags.txt" --log-level info
wait_line "$T/hubmock2.log" '^hub http' 20 || fail "second hubmock"
grep -q '9 etags known (committed table or cache), 0 to hash' "$T/hubmock2.log" \
    || fail "the second start hashed again: $(cat "$T/hubmock2.log")"
kill -TERM "$PID_hubmock2"

# ---- breakages: bad=header, bad=sha -------------------------------------------------
S1=model-00001-of-000003.safetensors
curl -sS -I "$HUB/org/badh/resolve/main/$S1" -D "$T/h" -o /dev/null
curl -sS -L "$HUB/org/badh/resolve/main/$S1" -o "$T/badh.st"
check [ "$(hdr "$T/h" X-Linked-Size)" = "$(stat -c %s "$T/badh.st")" ] "bad=header: X-Linked-Size is the cut size"
check [ "$(hdr "$T/h" X-Linked-Etag)" = "\"$(sha256sum <"$T/badh.st" | cut -d' ' -f1)\"" ] "bad=header: etag of the bytes served"
head -c "$(stat -c %s "$T/badh.st")" "$T/tiny/$S1" | cmp -s - "$T/badh.st" || fail "bad=header: a prefix of the real shard"
"$BIN/stinfo" "$T/badh.st" >/dev/null 2>"$T/err" && fail "stinfo accepted a header claiming more bytes than the file"
grep -q "past the end" "$T/err" || fail "bad=header error: $(cat "$T/err")"
curl -sS -I "$HUB/org/bads/resolve/main/$S1" -D "$T/h" -o /dev/null
E=$(hdr "$T/h" X-Linked-Etag)
[[ $E =~ ^\"[0-9a-f]{64}\"$ ]] || fail "bad=sha: '$E' does not look like a sha256"
curl -sS -L "$HUB/org/bads/resolve/main/$S1" -o "$T/bads.st"
check cmp -s "$T/bads.st" "$T/tiny/$S1" "bad=sha: the bytes are the real shard"
[ "$E" != "\"$(sha256sum <"$T/bads.st" | cut -d' ' -f1)\"" ] || fail "bad=sha: the etag matches"

# ---- faults, on a synthesized repo and on a disk repo --------------------------------------
for repo in tiny disk; do
    L=$(loc "org/$repo" "$ST")
    [ -n "$L" ] || fail "$repo: no CDN location"
    faults "clear=1&rate_corrupt=1&corrupt_mode=one"
    n=$(curl -sS -r 1000-1999 "$L" | cmp -l - <(truth "$T/tiny/$ST" 1000 1000) | wc -l)
    check [ "$n" = 1 ] "$repo: corrupt_mode=one changes one byte (got $n)"
    faults "corrupt_mode=all"
    n=$(curl -sS -r 1000-1999 "$L" | cmp -l - <(truth "$T/tiny/$ST" 1000 1000) | wc -l)
    check [ "$n" = 1000 ] "$repo: corrupt_mode=all changes every byte (got $n)"
    faults "corrupt_mode=drift"
    curl -sS -r 1000-1999 "$L" -o "$T/d1"
    curl -sS -r 1000-1999 "$L" -o "$T/d2"
    cmp -s "$T/d1" "$T/d2" && fail "$repo: drift gave the same bytes twice"
    cmp -s "$T/d1" <(truth "$T/tiny/$ST" 1000 1000) && fail "$repo: drift gave the true bytes"
    faults "clear=1&latency=300"
    ge "$(secs -o /dev/null "$HUB/org/$repo/resolve/main/config.json")" 0.28 || fail "$repo: latency on the hub port"
    ge "$(secs -o /dev/null -r 0-9 "$L")" 0.28 || fail "$repo: latency on the CDN port"
    faults "clear=1&hub_stall=0.5"
    ge "$(secs -o /dev/null "$HUB/org/$repo/resolve/main/config.json")" 0.48 || fail "$repo: hub_stall"
    ge 0.3 "$(secs -o /dev/null -r 0-9 "$L")" || fail "$repo: hub_stall must spare the CDN"
    faults "clear=1&drip_secs=0.2"
    t=$(secs -r 0-4 "$L" -o "$T/drip")
    ge "$t" 0.9 || fail "$repo: 5 bytes dripped in ${t}s"
    check cmp -s "$T/drip" <(head -c 5 "$T/tiny/$ST") "$repo: dripped bytes are right"
    curl -sS -m 1 -r 0-99 "$L" -o "$T/drip" 2>/dev/null
    n=$(stat -c %s "$T/drip")
    [ "$n" -ge 2 ] && [ "$n" -le 6 ] || fail "$repo: drip sends a byte every 0.2 s (got $n in 1 s)"
    faults "clear=1&huge_header=1MiB"
    curl -sS "$HUB/org/$repo/resolve/main/config.json" -o /dev/null 2>/dev/null \
        && fail "$repo: curl took a 1 MiB response header"
    $PY - "${HUB#http://}" "/org/$repo/resolve/main/config.json" <<'EOF' || fail "$repo: huge_header"
import socket, sys
host, port = sys.argv[1].split(":")
s = socket.create_connection((host, int(port)))
s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % sys.argv[2].encode())
data = b""
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    data += b
head = data.split(b"\r\n\r\n", 1)[0]
line = [l for l in head.split(b"\r\n") if l.startswith(b"X-Hubmock-Padding: ")]
assert line and len(line[0]) == len(b"X-Hubmock-Padding: ") + (1 << 20), len(head)
EOF
    faults "clear=1"
done
$PY - "$T/req.log" <<'EOF' || fail "request log: fault names"
import json, sys
seen = set()
for l in open(sys.argv[1]):
    f = json.loads(l)["fault"]
    seen |= set(f.split("+")) if f else set()
want = {"corrupt_one", "corrupt_all", "corrupt_drift", "latency", "hub_stall", "drip", "huge_header"}
assert want <= seen, want - seen
EOF

# ---- the full-width variant: headers, small files, one whole shard ------------------------------------
wait_line "$T/hubmock_k3.log" '^hub http' 120 || fail "hubmock with the full K3 did not start"
HUB=$(sed -n 's/^hub \(http:[^ ]*\) cdn .*/\1/p' "$T/hubmock_k3.log")
check $PY "$RANGES" "$HUB" org/wide "$T/wide" --headers-only "wide: headers and small files equal mkmodel's"
W2=model-00002-of-000005.safetensors
cmp <(curl -sS -r 12345- "$(loc org/wide $W2)") \
    <("$BIN/mkmodel" --preset k3 --layers 2 --experts 2 --stdout $W2 | tail -c +12346) \
    || fail "wide: $W2 from byte 12345 differs from mkmodel --stdout"

# ---- the full K3 from no disk ------------------------------------------------------------------
grep -q '104 etags known (committed table or cache), 5 to hash' "$T/hubmock_k3.log" \
    || fail "the committed table did not give K3's etags: $(grep etags "$T/hubmock_k3.log")"
$PY - "$HUB" <<'EOF' || fail "full K3 through hubmock"
import http.client, json, re, struct, sys, urllib.parse
hub = urllib.parse.urlsplit(sys.argv[1]).netloc
pools = {}
def conn(netloc):
    if netloc not in pools:
        pools[netloc] = http.client.HTTPConnection(netloc, timeout=120)
    return pools[netloc]
def req(method, url, rng=None):
    u = urllib.parse.urlsplit(url)
    c = conn(u.netloc or hub)
    c.request(method, u.path + ("?" + u.query if u.query else ""), headers={"Range": rng} if rng else {})
    r = c.getresponse()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
st, _, body = req("GET", "/api/models/org/k3")
sib = {s["rfilename"]: s["size"] for s in json.loads(body)["siblings"]}
shards = sorted(f for f in sib if f.endswith(".safetensors"))
assert shards == ["model-%05d-of-000096.safetensors" % i for i in range(1, 97)], shards[:3]
assert 1.560e12 < sum(sib.values()) < 1.561e12, sum(sib.values())
n = lang = vision = spine_bf16 = 0
spans = []
heads = []
for s in shards:
    st, h, _ = req("HEAD", "/org/k3/resolve/main/" + s)
    assert st == 302 and int(h["x-linked-size"]) == sib[s]
    loc = h["location"]
    st, _, first = req("GET", loc, "bytes=0-7")
    N = struct.unpack("<Q", first)[0]
    st, _, text = req("GET", loc, "bytes=8-%d" % (7 + N))
    assert st == 206 and len(text) == N
    heads.append(8 + N)
    hdr = json.loads(text)
    hdr.pop("__metadata__")
    ex = {}
    for k, v in hdr.items():
        n += 1
        b, e = v["data_offsets"]
        m = re.match(r"language_model\.model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.", k)
        if m:
            lo, hi = ex.get(m.groups(), (1 << 62, 0))
            ex[m.groups()] = (min(lo, b), max(hi, e))
        elif k.startswith("language_model."):
            lang += 1
            spine_bf16 += (e - b) if v["dtype"] == "BF16" else 0
        else:
            vision += 1
            assert s >= "model-00095", (k, s)
    spans += [hi - lo for lo, hi in ex.values()]
assert n == 497220, n
assert (lang, vision) == (2460, 168), (lang, vision)
assert len(spans) == 82432 and set(spans) == {17547264}, (len(spans), set(spans))
assert 113.4e9 < spine_bf16 < 113.6e9, spine_bf16           # k3.md §8: 113.5 GB
moe = heads[1:93]
assert 780e3 < sum(heads) / 96 < 800e3, sum(heads) / 96     # ~789 KB a shard
st, h, _ = req("HEAD", "/org/k3/resolve/main/model.safetensors.index.json")
st, _, idx = req("GET", h["location"])
assert 59.5e6 < len(idx) < 60.1e6 and len(idx) == sib["model.safetensors.index.json"], len(idx)
wm = json.loads(idx)["weight_map"]
assert len(wm) == 497220 and wm["language_model.lm_head.weight"] == "model-00094-of-000096.safetensors"
print("k3: %d tensors, %d experts of 17,547,264 B, spine BF16 %.2f GB, index %d B, headers %.0f KB avg"
      % (n, len(spans), spine_bf16 / 1e9, len(idx), sum(heads) / 96e3))
EOF
curl -sS -I "$HUB/org/k3/resolve/main/tiktoken.model" -D "$T/h" -o /dev/null
curl -sS -L "$HUB/org/k3/resolve/main/tiktoken.model" -o "$T/tiktoken.model"
check [ "$(hdr "$T/h" X-Linked-Etag)" = "\"$(sha256sum <"$T/tiktoken.model" | cut -d' ' -f1)\"" ] \
    "k3 tiktoken.model: X-Linked-Etag is its sha256"
check [ "$(wc -l <"$T/tiktoken.model")" = 163584 ] "k3 tiktoken.model has K3's 163,584 ranks"
# The committed table, checked by another sha256 (openssl's command, not
# synth's digest code) over a whole real shard: the globals (4.7 GB).
G=model-00094-of-000096.safetensors
curl -sS -I "$HUB/org/k3/resolve/main/$G" -D "$T/h" -o /dev/null
want=$("$BIN/mkmodel" --preset k3 --stdout $G | openssl dgst -sha256 -r | cut -d' ' -f1)
check [ "$(hdr "$T/h" X-Linked-Etag)" = "\"$want\"" ] \
    "synth/k3_etags.inc is stale for $G: regenerate it (docs/mkmodel.md)"

kill -TERM "$PID_hubmock_k3"
wait "$PID_hubmock_k3"
check [ $? -eq 0 ] "hubmock (full K3) exits 0 on SIGTERM"
kill -TERM "$PID_hubmock"
wait "$PID_hubmock"
check [ $? -eq 0 ] "hubmock exits 0 on SIGTERM"
echo "test_hubmock_synth: ok"
