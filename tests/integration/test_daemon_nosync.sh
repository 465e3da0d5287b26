#!/usr/bin/env bash
# shoald's loop never waits on an fsync of an object or a job file
# (docs/daemon.md, "What never waits"): with fsyncs on, shoald under
# strace -f warms a model (each object committed after its last byte;
# spine tensors longer than the 64 KiB checkpoint this test sets, so
# checkpoints happen too; the job's file saved as it goes); every fsync and
# fdatasync of a file under tmp/, blobs/ or jobs/ must come from another
# thread than the loop's (the main thread: its tid is the pid), and the
# objects served must be the model's bytes.  (SQLite's own syncs of
# index.db are not counted: WAL commits do not sync, and its checkpoints
# run on a worker.)
source "$(dirname "$0")/lib.sh"
command -v strace > /dev/null || skip "strace not installed"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m"
export HF_ENDPOINT=$HUB
H=$T/home
LOG=$T/shoald.log
SHOAL_CHECKPOINT_BYTES=64K bg shoald strace -f -y -qq -o "$T/strace" -e trace=fsync,fdatasync \
    "$BIN/shoald" --home "$H" --log "$LOG"
wait_line "$LOG" 'ready on' 30 || fail "shoald did not start under strace"
pid=$(sed -n 's/.*shoald\[\([0-9]*\)\].*ready on.*/\1/p' "$LOG" | head -n 1)
[ -n "$pid" ] || { cat "$LOG"; fail "no pid in the log's ready line"; }

"$BIN/shoal" --home "$H" warm hf://t/tiny --wait > "$T/warm.out" 2>&1 || { cat "$T/warm.out"; fail "warm"; }
KEYS="1:0 1:5 4:17 7:63 t:model.embed_tokens.weight t:model.norm.weight f:config.json"
"$BIN/shoalc" --home "$H" get hf://t/tiny $KEYS --check "$T/m" > "$T/get.out" || { cat "$T/get.out"; fail "GET"; }
grep -q 'mismatched 0' "$T/get.out" || fail "wrong bytes: $(tail -1 "$T/get.out")"
kill -TERM "$pid"; wait "$PID_shoald" 2>/dev/null   # strace ends with it

re="(fsync|fdatasync)\\([0-9]+<$H/(tmp|blobs|jobs)"
n_all=$(grep -cE "$re" "$T/strace" || true)
n_ckpt=$(grep -cE "fdatasync\\([0-9]+<$H/tmp/" "$T/strace" || true)
n_loop=$(grep -cE "^$pid +$re" "$T/strace" || true)
[ "${n_all:-0}" -ge 600 ] || { head "$T/strace"; fail "only ${n_all:-0} object syncs traced"; }
[ "${n_ckpt:-0}" -ge 1 ] || fail "no checkpoint fdatasync traced (SHOAL_CHECKPOINT_BYTES ignored?)"
[ "${n_loop:-0}" = 0 ] || { grep -E "^$pid +$re" "$T/strace" | head; \
                           fail "$n_loop of $n_all syncs ran on the loop's thread"; }
echo "ok   $n_all syncs of objects and job files ($n_ckpt checkpoints), none on the loop's thread"
