#!/usr/bin/env bash
# test_integrity_spine.sh — every spine byte the engine uses is checked
# against its XXH3-128 (issue 18; docs/engine.md "Checked reads"):
#   - the cached spine pack, damaged on disk, is caught as the load reads
#     it: the engine warns, REPORTs it, shoald removes it, the engine
#     builds and stores it again from the BF16 tensors, and the tokens and
#     logits equal the local run;
#   - the same for a damaged byte of a streamed layer (--ram forces a
#     streamed part): the load reads the streamed part once to finish the
#     pack's hash (and hash each streamed layer for the per-pass checks);
#     and damaged while `serve` runs: the request fails naming the layer,
#     the pack is reported and the next load builds it again;
#   - a BF16 tensor GET'd beside the pack (the embedding), a matrix with
#     --spine-cache off and the tokenizer's file, damaged on disk: reported,
#     shoald fetches it again from upstream, same logits (text).
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] && [ -x "$BIN/shoald" ] && [ -x "$BIN/shoal" ] || skip "shoal-engine/shoald not built"
PY=/usr/bin/python3

spine_fixture

run_remote() {   # NAME ARGS...  (RUN_LOCAL=local4: compare with the int4 run)
    local name=$1 ref=${RUN_LOCAL:-local}; shift
    timeout 120 "$E" run $M --home "$H" --tokens $P --max-tokens 6 --stats \
        --dump-logits "$T/l_$name" "$@" > "$T/o_$name" 2> "$T/e_$name" \
        || { cat "$T/e_$name"; fail "$name: run through shoald ($*)"; }
    cmp -s "$T/o_$ref" "$T/o_$name" \
        || fail "$name: ids '$(cat "$T/o_$name")' differ from the local run's '$(cat "$T/o_$ref")'"
    cmp -s "$T/l_$ref" "$T/l_$name" || fail "$name: logits differ from the local run"
}
spine_line() { grep '^stats: spine ' "$T/e_$1" | tail -n 1; }
damaged() { "$BIN/shoal" --home "$H" stats --json | $PY -c \
    'import json,sys; print(json.load(sys.stdin)["daemon"]["integrity"]["damaged_reported"])'; }
# flip one byte of the cached object of KIND whose names row is like
# PATTERN (a derived object: whose length is LEN), at offset AT of it (-:
# the middle); prints its length
flip() {   # KIND PATTERN LEN AT
    $PY - "$H" "$@" <<'EOF'
import os, sqlite3, sys
home, kind, pat, want, at = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
db = sqlite3.connect(os.path.join(home, "index.db"))
rows = db.execute("SELECT o.id, o.len FROM objects o WHERE o.kind = ?1 AND (EXISTS (SELECT 1 "
                  "FROM names n WHERE n.object_id = o.id AND (n.tensor LIKE ?2 OR n.file LIKE ?2))"
                  " OR (?1 = 3 AND o.len = ?3)) ORDER BY o.len DESC",
                  (kind, pat, int(want) if want != "-" else -1)).fetchall()
if not rows:
    sys.exit("no object of kind %d named like %s" % (kind, pat))
oid, ln = rows[0]
at = int(at) if at != "-" else ln // 2
with open(os.path.join(home, "blobs", "%016x" % oid), "r+b") as f:
    f.seek(at)
    b = f.read(1)
    f.seek(at)
    f.write(bytes([b[0] ^ 0x5a]))
print(ln)
EOF
}

# ---- the resident pack: built, read back checked, then damaged ------------------------------
run_remote first
spine_line first | grep -q 'pack stored' || { cat "$T/e_first"; fail "first run did not store the pack"; }
D=$(sed -n 's/.*stored spine-int8-p2-q2 (\([0-9]*\) bytes).*/\1/p' "$T/shoald.log" | head -n 1)
[ "${D:-0}" -gt 0 ] || fail "shoald did not log the stored pack"
run_remote second
spine_line second | grep -q 'from the cached pack' || { cat "$T/e_second"; fail "second run did not read the pack"; }
grep -q 'damaged' "$T/e_second" && { cat "$T/e_second"; fail "an undamaged pack was called damaged"; }

before=$(damaged)
flip 3 '%spine-int8%' "$D" $((D / 2)) > /dev/null || fail "flip the pack"
run_remote pack_damaged
grep -q 'cached spine pack spine-int8-p2-q2 read back damaged' "$T/e_pack_damaged" \
    || { cat "$T/e_pack_damaged"; fail "the engine did not warn of the damaged pack"; }
spine_line pack_damaged | grep -q 'quantized into a pack at load.*pack stored' \
    || { cat "$T/e_pack_damaged"; fail "the damaged pack was not built and stored again: $(spine_line pack_damaged)"; }
grep -q 'derived spine-int8-p2-q2: a client read bytes that do not match' "$T/shoald.log" \
    || fail "shoald did not log the reported pack"
[ "$(damaged)" -gt "$before" ] || fail "no damaged object counted by shoald"
run_remote pack_after
spine_line pack_after | grep -q 'from the cached pack' \
    || { cat "$T/e_pack_after"; fail "the rebuilt pack is not read by the next run"; }
grep -q 'damaged' "$T/e_pack_after" && { cat "$T/e_pack_after"; fail "the rebuilt pack reads back damaged"; }
echo "ok   resident pack ($D bytes) damaged: warned, reported, rebuilt and stored; logits equal the local run"

# ---- a streamed layer of the int4 pack -----------------------------------------------------
"$E" plan $M --home "$H" --states 1 --spine int4 --json > "$T/r4.json" || fail "plan $M"
field() { $PY -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): d=d[k]
print(d)' "$1" "$2"; }
rmid=$(( ($(field "$T/r4.json" min_ram.streamed_any) + $(field "$T/r4.json" min_ram.int4)) / 2 ))
RUN_LOCAL=local4 run_remote s_first --spine int4 --ram "$rmid"
grep -q '^plan: streamed' "$T/e_s_first" || { cat "$T/e_s_first"; fail "--ram $rmid did not stream"; }
RUN_LOCAL=local4 run_remote s_second --spine int4 --ram "$rmid"
grep -q 'damaged' "$T/e_s_second" && { cat "$T/e_s_second"; fail "an undamaged streamed pack was called damaged"; }
D4=$(sed -n 's/.*stored spine-int4-g32-p2-q2 (\([0-9]*\) bytes).*/\1/p' "$T/shoald.log" | head -n 1)
# the pack's layout ends with the last layer's matrices (lm_head first, then the
# layers in order): a byte near its end is in a streamed layer
AT=$(( D4 - 1000 ))
flip 3 '%spine-int4%' "$D4" $AT > /dev/null || fail "flip the streamed part"
RUN_LOCAL=local4 run_remote s_damaged --spine int4 --ram "$rmid"
grep -q 'cached spine pack spine-int4-g32-p2-q2 read back damaged' "$T/e_s_damaged" \
    || { cat "$T/e_s_damaged"; fail "the damaged streamed layer was not caught at load"; }
grep -q '^plan: streamed' "$T/e_s_damaged" || fail "the damaged run did not stream"
grep -q 'derived spine-int4-g32-p2-q2: a client read bytes' "$T/shoald.log" \
    || fail "shoald did not log the reported int4 pack"
[ "$(grep -c 'stored spine-int4-g32-p2-q2' "$T/shoald.log")" -ge 2 ] || fail "the int4 pack was not stored again"
RUN_LOCAL=local4 run_remote s_after --spine int4 --ram "$rmid"
grep -q 'damaged' "$T/e_s_after" && { cat "$T/e_s_after"; fail "the rebuilt int4 pack reads back damaged"; }
echo "ok   streamed layer damaged (byte $AT of $D4): caught at load, rebuilt; tokens equal the resident int4 run"

# ---- a streamed layer damaged while an engine runs ---------------------------------------
# every pass reads the layer again and checks it against the hash the load
# computed: the pass fails naming the layer (read twice, still wrong), the
# pack is reported; the next load builds it again
"$E" plan $M --home "$H" --states 2 --spine int4 --json > "$T/r4s.json" || fail "plan $M --states 2"
smid=$(( ($(field "$T/r4s.json" min_ram.streamed_any) + $(field "$T/r4s.json" min_ram.int4)) / 2 ))
bg serve "$E" serve $M --home "$H" --port 0 --model-name tiny --spine int4 --ram "$smid"
wait_line "$T/serve.log" '^listening on http' 60 || { cat "$T/serve.log"; fail "serve did not start"; }
URL=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/serve.log" | head -n 1)
ask() {   # OUT: HTTP status
    curl -s -o "$1" -w '%{http_code}' "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"tiny","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}'
}
[ "$(ask "$T/serve1.json")" = 200 ] || { cat "$T/serve1.json" "$T/serve.log"; fail "serve: first request"; }
grep -q '^plan: streamed' "$T/serve.log" || { cat "$T/serve.log"; fail "serve did not stream"; }
reported=$(grep -c 'derived spine-int4-g32-p2-q2: a client read bytes' "$T/shoald.log")
flip 3 '%spine-int4%' "$D4" $AT > /dev/null || fail "flip the streamed part under serve"
code=$(ask "$T/serve2.json")
[ "$code" != 200 ] || { cat "$T/serve2.json"; fail "serve answered from a damaged streamed layer"; }
grep -q 'layer [0-9]* of the streamed spine read back damaged' "$T/serve.log" "$T/serve2.json" \
    || { cat "$T/serve2.json" "$T/serve.log"; fail "the failure does not name the damaged layer"; }
for _ in $(seq 50); do
    [ "$(grep -c 'derived spine-int4-g32-p2-q2: a client read bytes' "$T/shoald.log")" -gt "$reported" ] && break
    sleep 0.1
done
[ "$(grep -c 'derived spine-int4-g32-p2-q2: a client read bytes' "$T/shoald.log")" -gt "$reported" ] \
    || fail "the damaged streamed layer was not reported to shoald"
kill -TERM "$PID_serve"; wait "$PID_serve" 2>/dev/null || true
RUN_LOCAL=local4 run_remote s_rebuilt --spine int4 --ram "$rmid"
[ "$(grep -c 'stored spine-int4-g32-p2-q2' "$T/shoald.log")" -ge 3 ] || fail "the int4 pack was not built again after serve"
echo "ok   streamed layer damaged under serve: HTTP $code, $(grep -o 'layer [0-9]* of the streamed spine read back damaged' "$T/serve.log" | head -n 1), reported; the next load rebuilt it"

# ---- a BF16 tensor beside the pack: the embedding ------------------------------------------
before=$(damaged)
flip 1 '%embed_tokens%' - - > /dev/null || fail "flip the embedding"
n0=$(wc -l < "$T/hub.jsonl")
run_remote t_damaged
grep -q 'tensor .*embed_tokens.* read back damaged' "$T/e_t_damaged" \
    || { cat "$T/e_t_damaged"; fail "the damaged embedding was not caught"; }
grep -q 'tensor .*embed_tokens.*: a client read bytes that do not match' "$T/shoald.log" \
    || fail "shoald did not log the reported tensor"
[ "$(wc -l < "$T/hub.jsonl")" -gt "$n0" ] || fail "the embedding was not fetched from upstream again"
[ "$(damaged)" -gt "$before" ] || fail "the damaged tensor was not counted"
echo "ok   BF16 embedding damaged: reported, fetched again from upstream, logits equal the local run"

# ---- a small file: the tokenizer's, GET'd whole ---------------------------------------------
timeout 120 "$E" run "$T/m" --prompt "hello there" --max-tokens 5 > "$T/p_local" 2> /dev/null \
    || fail "local --prompt"
timeout 120 "$E" run $M --home "$H" --prompt "hello there" --max-tokens 5 > "$T/p_ok" 2> "$T/e_p_ok" \
    || { cat "$T/e_p_ok"; fail "--prompt through shoald"; }
flip 2 '%tiktoken.model' - - > /dev/null || fail "flip the tokenizer"
timeout 120 "$E" run $M --home "$H" --prompt "hello there" --max-tokens 5 > "$T/p_damaged" \
    2> "$T/e_p_damaged" || { cat "$T/e_p_damaged"; fail "--prompt with a damaged tokenizer file"; }
grep -q 'file tiktoken.model read back damaged' "$T/e_p_damaged" \
    || { cat "$T/e_p_damaged"; fail "the damaged tokenizer file was not caught"; }
grep -q 'file tiktoken.model: a client read bytes that do not match' "$T/shoald.log" \
    || fail "shoald did not log the reported file"
cmp -s "$T/p_local" "$T/p_damaged" || fail "the text differs from the local run's after the re-fetch"
echo "ok   tokenizer file damaged: reported, fetched again, the local run's text"

# ---- --spine-cache off: every matrix is a BF16 GET, checked -------------------------------
flip 1 '%layers.1.%proj%' - - > /dev/null || fail "flip a matrix"
run_remote off_damaged --spine-cache off
grep -q 'tensor .* read back damaged' "$T/e_off_damaged" \
    || { cat "$T/e_off_damaged"; fail "--spine-cache off: the damaged matrix was not caught"; }
echo "ok   --spine-cache off: a damaged BF16 matrix caught, fetched again, logits equal the local run"

kill -TERM "$PID_shoald"
rc=0; wait "$PID_shoald" || rc=$?
[ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
echo "ok   integrity of the spine: pack, streamed layers and BF16 tensors checked as read"
