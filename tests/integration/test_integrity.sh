#!/usr/bin/env bash
# A lying upstream (docs/daemon.md "Integrity"): a CDN that flips bytes in
# range answers — one byte, every byte, or a byte that changes from answer
# to answer under the same etag — is caught by shoald's automatic whole-file
# check once each file is complete: the file's objects are quarantined and
# fetched again, so after a liar that turns honest (corrupt_count) the cache
# holds every file verified, serves the right bytes, and `shoal stats` counts
# bytes verified against the upstream hash vs trusted on transfer.  A liar
# that never stops: each file is re-fetched INTEGRITY_RETRIES times, then
# refused (a warm of it exits 5 naming the file, a GET fails ECORRUPT),
# `shoal verify --deep` exits 5 naming it, and no wrong byte is left cached.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoal" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoal/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 9 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
H=$T/home
export HF_ENDPOINT=$HUB
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log" --parallel 4
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
faults() { curl -fsS -X POST "$HUB/_mock/faults?$1" > /dev/null || fail "POST /_mock/faults?$1"; }
stats() { "$BIN/shoal" --home "$H" stats --json > "$T/stats.json" || fail "shoal stats --json"; }
# Wait (bounded) until no check is queued or running and no warm job runs.
settle() {
    for _ in $(seq 600); do
        stats
        /usr/bin/python3 -c '
import json, sys
j = json.load(open(sys.argv[1])); g = j["daemon"]["integrity"]
sys.exit(0 if g["files_queued"] == 0 and not g["checking"] and j["daemon"]["jobs_running"] == 0 else 1)' \
            "$T/stats.json" && return 0
        sleep 0.1
    done
    fail "the checks did not settle: $(cat "$T/stats.json")"
}
# 18 experts of three layers and a spine tensor, compared with the model directory.
KEYS=$(for l in 1 4 7; do for e in 0 13 63 20 40 50; do printf '%s:%s ' $l $e; done; done)
KEYS="$KEYS t:model.norm.weight f:config.json"

# ---- a liar that turns honest: caught, quarantined, fetched again ------------------
n=0
for mode in one all drift; do
    n=$((n + 1))
    R=t/lie$n
    rm -rf "$T/m$n"; "$BIN/mkmodel" --preset tiny --seed $((20 + n)) --out "$T/m$n" --quiet || fail "mkmodel $n"
    curl -fsS -X POST "$HUB/_mock/repo?repo=$R&main=$T/m$n" > /dev/null || fail "add repo $R"
    faults "clear=1"
    "$BIN/shoalc" --home "$H" get hf://$R f:config.json > /dev/null || fail "$mode: OPEN"
    # the next 12 CDN answers are corrupted, whatever they carry
    log0=$(wc -l < "$T/hub.jsonl")
    faults "rate_corrupt=1&corrupt_mode=$mode&corrupt_count=12"
    "$BIN/shoal" --home "$H" warm hf://$R --wait > "$T/warm.$mode" 2>&1 || { cat "$T/warm.$mode"; fail "$mode: warm"; }
    settle
    "$BIN/shoal" --home "$H" verify --deep hf://$R --json > "$T/verify.$mode" \
        || { cat "$T/verify.$mode"; fail "$mode: verify --deep after the re-fetch"; }
    tail -n +$((log0 + 1)) "$T/hub.jsonl" > "$T/hub.$mode.jsonl"
    /usr/bin/python3 - "$T/verify.$mode" "$T/stats.json" "$T/hub.$mode.jsonl" "$mode" <<'EOF' || fail "$mode: figures"
import json, sys
v = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2])); mode = sys.argv[4]
d = v["deep"]
assert d["files"] == 7 and d["complete"] == 7 and d["ok"] == 7 and d["bad"] == 0 and d["quarantined"] == 0, d
corrupted = sum(1 for l in open(sys.argv[3]) if "corrupt_" + mode in l)
assert corrupted == 12, ("hubmock corrupted", corrupted)
g = s["daemon"]["integrity"]
assert g["files_bad"] >= 1 and g["quarantined_bytes"] > 0 and g["refetch_jobs"] >= 1, g
i = s["integrity"]
assert i["mismatches"] >= 1 and i["bad_files"] == 0, i
print("ok   %s: %d answers corrupted, %d files quarantined and fetched again; %d bytes verified, %d trusted"
      % (mode, corrupted, g["files_bad"], i["verified_bytes"], i["trusted_bytes"]))
EOF
    "$BIN/shoalc" --home "$H" get hf://$R $KEYS --check "$T/m$n" > "$T/get.$mode" || fail "$mode: GET"
    grep -q ' checked 20 mismatched 0' "$T/get.$mode" || fail "$mode: wrong bytes served: $(tail -1 "$T/get.$mode")"
done

# Every cached upstream byte is now verified against an upstream hash; none trusted.
stats
/usr/bin/python3 -c '
import json, sys
i = json.load(open(sys.argv[1]))["integrity"]
assert i["trusted_bytes"] == 0 and i["verified_bytes"] > 3 * 12000000, i
print("ok   stats: %d bytes verified against an upstream hash, %d trusted on transfer, %d mismatches"
      % (i["verified_bytes"], i["trusted_bytes"], i["mismatches"]))' "$T/stats.json" || fail "stats: $(cat "$T/stats.json")"
"$BIN/shoal" --home "$H" stats > "$T/stats.txt" || fail "shoal stats"
grep -q 'verified against upstream hash' "$T/stats.txt" || { cat "$T/stats.txt"; fail "shoal stats does not show verified bytes"; }

# ---- a liar that never stops: re-fetched, then refused; nothing wrong kept --------------
faults "clear=1"
"$BIN/shoalc" --home "$H" get hf://t/tiny f:config.json > /dev/null || fail "liar: OPEN"
faults "rate_corrupt=1&corrupt_mode=all"
"$BIN/shoal" --home "$H" warm hf://t/tiny --wait > "$T/warm.liar" 2>&1
settle
rc=0; "$BIN/shoal" --home "$H" verify --deep hf://t/tiny > "$T/verify.liar" || rc=$?
[ "$rc" = 5 ] || { cat "$T/verify.liar"; fail "verify --deep exited $rc, not 5, after a liar"; }
grep -q 'bad file: model-0000[123]-of-000003.safetensors (quarantined)' "$T/verify.liar" \
    || { cat "$T/verify.liar"; fail "verify --deep does not name the quarantined file"; }
# Nothing wrong is served: the refused files' objects fail (ECORRUPT), the
# rest (config.json, verified before the liar began) are the right bytes.
rc=0; "$BIN/shoalc" --home "$H" get hf://t/tiny $KEYS --check "$T/m" > "$T/get.liar" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$T/get.liar"; fail "GET of refused objects exited $rc, not 1 (item errors)"; }
grep -q 'error ECORRUPT' "$T/get.liar" || { cat "$T/get.liar"; fail "refused objects do not fail with ECORRUPT"; }
grep -q ' mismatched 0' "$T/get.liar" || { cat "$T/get.liar"; fail "a wrong byte was served: $(tail -1 "$T/get.liar")"; }
grep -q 'model-0000[123]-of-000003.safetensors: upstream sent bytes that do not hash to its etag 3 times: its objects are refused' "$T/shoald.log" \
    || fail "shoald's refusal does not name the file"
# A warm of the refused files fetches nothing: it fails with exit 5 (integrity), naming the file.
rc=0; "$BIN/shoal" --home "$H" warm hf://t/tiny --wait > "$T/warm.liar2" 2>&1 || rc=$?
[ "$rc" = 5 ] || { cat "$T/warm.liar2"; fail "a warm of refused files exited $rc, not 5"; }
grep -q 'upstream sent bytes of model-0000[123]-of-000003.safetensors that do not hash to its etag' "$T/warm.liar2" \
    || { cat "$T/warm.liar2"; fail "the failed warm does not name the file"; }
"$BIN/shoal" --home "$H" verify --deep hf://t/tiny --json > "$T/verify.liar.json" || true
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["deep"]
assert d["bad"] == 0, d   # no complete file holds bytes that fail their hash
print("ok   liar: %d files quarantined and refused, %d complete files all match" % (d["quarantined"], d["ok"]))' \
    "$T/verify.liar.json" || fail "verify: $(cat "$T/verify.liar.json")"

kill -TERM "$PID_shoald"
rc=0; wait "$PID_shoald" || rc=$?
[ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null || fail "sanitizer report"
echo "ok   integrity: lying upstreams caught"
